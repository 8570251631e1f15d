"""Why TorchRec's planner found no plan, and what would help: the table that breaks it (found
from the planner's own per-shard memory estimates of every allowed sharding) and, for it,
row-wise sharding, UVM caching, a smaller width, less optimizer state, more ranks or memory."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import attrs

from tzrun.runner.host_memory import GIB

__all__ = ["PlanFailure", "diagnose", "format_gib", "GIB"]



def format_gib(n: float) -> str:
    """Bytes as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


@attrs.frozen
class PlanFailure:
    """Why there is no plan.

    Attributes:
        kind: ``"table"`` (one table fits on no rank in any allowed sharding), ``"total"``
            (each fits alone, not all together) or ``"planner"`` (TorchRec's reason only).
        table: the table that breaks the plan (the biggest such), when one can be named.
        message: what happened, with the numbers.
        advice: what would help, one line each.
        planner_message: TorchRec's own error.
    """

    kind: str
    table: str | None
    message: str
    advice: tuple[str, ...]
    planner_message: str



@attrs.frozen
class _Room:
    """What one rank has for tables in the tier the tables live in."""

    tier: str
    cap: int
    share: float
    fixed: int
    budget: int

    def need(self, option: Any) -> int:
        """The most one rank holds of ``option`` (a sharding of a table)."""
        return max(getattr(s.storage, self.tier) for s in option.shards)

    def total(self, option: Any) -> int:
        """All ranks together hold of ``option``."""
        return sum(getattr(s.storage, self.tier) for s in option.shards)

    def describe(self) -> str:
        return (f"a rank has {format_gib(self.budget)} for tables ({format_gib(self.cap)} less the planner's "
                f"{self.share:.0%} margin and {format_gib(self.fixed)} for the dense part and input batches)")


def diagnose(planner_message: str, recorder: Any, setup: Any, readers: Mapping[str, list[tuple[str, str, int]]],
             request: Any) -> "PlanFailure":
    """A :class:`PlanFailure` for a planner that raised ``planner_message``.

    The table named is the biggest one that fits on no rank in any sharding its constraints
    allow; when every table fits alone, the biggest table of a set that does not fit together;
    otherwise the table the planner's own error names, if any.
    """
    tier = "hbm" if request.device == "cuda" else "ddr"
    flag = "--hbm-gb" if tier == "hbm" else "--ddr-gb"
    share, fixed, budget = _budget(recorder, setup, tier)
    room = _Room(tier, request.hbm_cap if tier == "hbm" else request.ddr_cap, share, fixed, budget)
    if budget <= 0:
        message = (f"the planner's reservations leave no {tier.upper()} for tables: {share:.0%} of {format_gib(room.cap)} "
                   f"plus {format_gib(fixed)} for the dense part and input batches")
        advice = (f"more memory per rank ({flag})", f"a smaller batch (--batch-size; now {request.batch_size})")
        return PlanFailure("planner", None, message, advice, planner_message)
    options: dict[str, list[Any]] = {}
    for option in _enumerate(setup, setup.constraints):
        options.setdefault(option.name, []).append(option)
    limit = _storage(setup, tier, budget)
    alone = [n for n, opts in options.items() if not any(all(s.storage.fits_in(limit) for s in o.shards) for o in opts)]
    if alone:
        found = _fits_nowhere(alone, options, room, readers, request)
    else:
        found = _fits_not_together(options, room, readers, request, setup, planner_message)
    if isinstance(found, PlanFailure):
        return found
    kind, name, best, message, ranks, per_rank = found
    advice = _advice(name, best, setup, readers, request, tier, budget, room.need)
    memory = math.ceil((per_rank + fixed) / (1 - (share if tier == "hbm" else 0.0)) / GIB)
    advice.append(_more_memory_or_ranks(flag, memory, ranks, kind == "table" and "row_wise" not in (
        setup.constraints[name].sharding_types or [])))
    return PlanFailure(kind, name, message, tuple(advice), planner_message)


def _size(options: Mapping[str, list[Any]], name: str) -> int:
    return math.prod(options[name][0].tensor.shape)


def _fits_nowhere(alone: list[str], options: Mapping[str, list[Any]], room: _Room,
                  readers: Mapping[str, list[tuple[str, str, int]]], request: Any) -> tuple[str, str, Any, str, int, int]:
    """``(kind, table, its cheapest sharding, message, ranks, per rank)`` when tables fit on no
    rank alone: the biggest of them is named."""
    name = max(alone, key=lambda n: _size(options, n))
    best = min(options[name], key=room.need)
    others = sorted((a for a in alone if a != name), key=lambda n: _size(options, n), reverse=True)
    message = (f"table '{name}' ({_shape(best)}{_read_by(name, readers)}) fits on no rank: in the cheapest sharding "
               f"its constraints allow ({best.sharding_type}, {best.compute_kernel}) one rank needs {format_gib(room.need(best))} "
               f"of {room.tier.upper()} for it; {room.describe()}")
    if others:
        message += f"; {len(others)} more table(s) fit on no rank either: {', '.join(others[:5])}" + (", ..." if len(others) > 5 else "")
    ranks = max(request.world_size + 1, math.ceil(room.total(best) / room.budget))
    return "table", name, best, message, ranks, room.need(best)


def _fits_not_together(options: Mapping[str, list[Any]], room: _Room, readers: Mapping[str, list[tuple[str, str, int]]],
                       request: Any, setup: Any, planner_message: str) -> tuple[str, str, Any, str, int, int] | PlanFailure:
    """As :func:`_fits_nowhere` when every table fits alone: their total is too much for the
    ranks, or else the planner's own error names the table (a :class:`PlanFailure` when it
    names none)."""
    n, tier, budget = request.world_size, room.tier, room.budget
    needed = sum(min(room.total(o) for o in opts) for opts in options.values())
    name = max(options, key=lambda t: _size(options, t))
    best = min(options[name], key=room.need)
    if needed > budget * n:
        message = (f"the tables need at least {format_gib(needed)} of {tier.upper()} together (each in its cheapest allowed "
                   f"sharding), the {n} ranks have {format_gib(budget * n)} for tables ({format_gib(budget)} each); the biggest is "
                   f"'{name}' ({_shape(best)}{_read_by(name, readers)}, {format_gib(room.total(best))})")
        cached = _all_cached(setup) if request.device == "cuda" else 0
        if cached:
            message += (f". With \"fused_uvm_caching\" allowed for every table (train.global_embedding_constraints"
                        f".compute_kernels = [\"fused\", \"fused_uvm_caching\"]) they would need at least "
                        f"{format_gib(cached)} of HBM together ({'fits' if cached <= budget * n else 'still too much'})")
        return "total", name, best, message, max(n + 1, math.ceil(needed / budget)), math.ceil(needed / n)
    last = planner_message.strip().splitlines()[-1].strip()
    named = re.search(r"of table (\S+?)[,.]?\s", planner_message)
    name = named.group(1) if named and named.group(1) in options else None
    message = f"TorchRec found no plan within the constraints although the tables' memory fits in all: {last}"
    if name is None:
        return PlanFailure("planner", None, message, ("remove embedding_constraints that narrow the choice",
                                                      f"more ranks (--world-size, now {n})"), planner_message)
    best = min(options[name], key=room.need)
    return "planner", name, best, message, n + 1, room.need(best)


def _more_memory_or_ranks(flag: str, memory: int, ranks: int, memory_only: bool) -> str:
    """The last piece of advice: how much memory per rank, or how many ranks, would do."""
    more = f"more memory: {flag} {memory} or more"
    return more if memory_only else f"{more}; or more ranks: --world-size {ranks} or more"


def _budget(recorder: Any, setup: Any, tier: str) -> tuple[float, int, int]:
    """``(margin share, fixed reservation, bytes left for tables)`` per rank in ``tier``."""
    reservation = recorder.storage_reservation or getattr(setup.planner, "_storage_reservation", None)
    share = float(getattr(reservation, "_percentage", 0.0) or 0.0)
    fixed = sum(getattr(getattr(reservation, attr, None), tier, 0) or 0 for attr in ("_dense_storage", "_kjt_storage"))
    cap = getattr(setup.topology.devices[0].storage, tier)
    margin = share if tier == "hbm" else 0.0
    return share, int(fixed), int((1 - margin) * cap) - int(fixed)


def _storage(setup: Any, tier: str, budget: int) -> Any:
    from torchrec.distributed.planner.types import Storage

    caps = setup.topology.devices[0].storage
    return Storage(hbm=budget if tier == "hbm" else caps.hbm, ddr=budget if tier == "ddr" else caps.ddr, ssd=caps.ssd)


def _enumerate(setup: Any, constraints: Mapping[str, Any]) -> list[Any]:
    """Every sharding option the constraints allow, with the planner's memory estimates."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator

    enumerator = EmbeddingEnumerator(topology=setup.topology, batch_size=setup.batch_size, constraints=dict(constraints))
    return enumerator.enumerate(setup.model, setup.sharders)


def _with(setup: Any, name: str, **changes: Any) -> list[Any]:
    """The options of table ``name`` alone when its constraints change as ``changes`` say."""
    import dataclasses

    constraints = dict(setup.constraints)
    constraints[name] = dataclasses.replace(constraints[name], **changes)
    try:
        return [o for o in _enumerate(setup, constraints) if o.name == name]
    except RuntimeError:  # no kernel for this device
        return []


def _all_cached(setup: Any) -> int:
    """Least HBM all tables need together when each may also use ``fused_uvm_caching``."""
    import dataclasses

    constraints = {name: dataclasses.replace(c, compute_kernels=sorted(set(c.compute_kernels or []) | {"fused_uvm_caching"}))
                   for name, c in setup.constraints.items() if "data_parallel" not in (c.sharding_types or [])}
    best: dict[str, int] = {}
    for option in _enumerate(setup, {**setup.constraints, **constraints}):
        hbm = sum(s.storage.hbm for s in option.shards)
        best[option.name] = min(best.get(option.name, hbm), hbm)
    return sum(best.values())


def _shape(option: Any) -> str:
    rows, dim = option.tensor.shape
    return f"{rows:,} x {dim}"


def _read_by(name: str, readers: Mapping[str, list[tuple[str, str, int]]]) -> str:
    users = readers.get(name, [])
    return f", read by {', '.join(u[1] for u in users)}" if users else ""


def _advice(name: str, best: Any, setup: Any, readers: Mapping[str, list[tuple[str, str, int]]], request: Any, tier: str,
            budget: int, need: Any) -> list[str]:
    allowed = setup.constraints[name]
    users = readers.get(name, [])
    where = (f"{users[0][0]}.embedding_constraints (or train.global_embedding_constraints for every table)"
             if users else "train.global_embedding_constraints")
    n = request.world_size
    out = []
    if "row_wise" not in (allowed.sharding_types or []):
        rw = _with(setup, name, sharding_types=["row_wise"])
        if rw:
            per = need(min(rw, key=need))
            verdict = "fits" if per <= budget else f"still over the {format_gib(budget)} a rank has"
            out.append(f"row-wise sharding: add \"row_wise\" to sharding_types in {where}: {n} shards of {format_gib(per)} ({verdict})")
    else:
        rw = [o for o in _enumerate(setup, setup.constraints) if o.name == name and o.sharding_type == "row_wise"]
        if rw:
            out.append(f"row-wise sharding is allowed: it splits '{name}' {n} ways, {format_gib(need(rw[0]))} per rank")
    if request.device == "cuda" and "fused_uvm_caching" not in (allowed.compute_kernels or []):
        uvm = _with(setup, name, compute_kernels=["fused_uvm_caching"],
                    sharding_types=sorted(set(allowed.sharding_types or []) | {"row_wise"}))
        if uvm:
            option = min(uvm, key=lambda o: max(s.storage.hbm for s in o.shards))
            hbm = max(s.storage.hbm for s in option.shards)
            ddr = max(s.storage.ddr for s in option.shards)
            out.append(f"UVM caching: add \"fused_uvm_caching\" to compute_kernels in {where}: rows and optimizer state in "
                       f"host memory ({format_gib(ddr)} per rank, {option.sharding_type}), a device cache of the hot rows "
                       f"({format_gib(hbm)} of HBM per rank)")
    rows, dim = best.tensor.shape
    if dim >= 8:
        same = [u for u in users if u[2] == dim]
        target = f"{same[0][0]}.embedding_dim" if same else "the model option that sets its width"
        out.append(f"a smaller width: {dim // 2} instead of {dim} ({target}) halves its rows; "
                   f"so do fewer rows (num_buckets, hash_bucket_size)")
    multiplier = _multiplier(best.tensor)
    if multiplier >= 1:
        path = setup.updates[name].path if name in setup.updates else "train.sparse_optimizer"
        out.append(f"less optimizer state: {path} keeps {multiplier:g}x the rows; rowwise_adagrad keeps one float per row")
    return out


def _multiplier(tensor: Any) -> float:
    from torchrec.distributed.planner.shard_estimators import _get_optimizer_multipler

    return float(_get_optimizer_multipler(getattr(tensor, "_optimizer_classes", [None])[0], tensor.shape))
