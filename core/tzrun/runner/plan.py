"""``tzrec-run plan``: TorchRec's sharding planner on the meta device, without data, process
group or accelerators, and what its plan costs each rank.

The planner, its topology, sharders and constraints come from
:func:`tzrun.runner.sharding.prepare_sharding`, the function training uses, so a plan shown here is
the plan a run with the same world size, devices and memory gets. The planner only calls
``planner.plan()`` (rank-local; training broadcasts rank 0's with ``collective_plan``).

Memory per rank (:mod:`tzrun.runner.plan_memory`), in each of device memory (HBM) and host memory (DDR):

* ``tables`` / ``optimizer``: the embedding rows each rank holds and their sparse optimizer
  state, sized as the planner sizes them (the state multiplier TorchRec derives from the
  optimizer applied in backward: 0 for SGD, 1/dim for row-wise Adagrad, 1 for Adagrad, 2 for Adam);
* ``buffers``: the rest of the planner's per-shard estimate: input and output buffers of the
  lookups and, with ``fused_uvm_caching``, the device cache;
* ``managed``: a ``zch`` table's managed state, per slice (:mod:`tzrun.runner.zch_memory`): the
  id-to-row map and the eviction policy's per-row values, and the window of ids seen since the
  last eviction; TorchRec's planner does not count it, so a plan can fit the planner and not
  the figures shown;
* ``dense``: the dense part, on every rank: the model's dense parameters and buffers, their
  gradients, the dense optimizers' state (measured by one step of each configured dense
  optimizer on meta-device copies of its parameters) and the EMA copy when configured.
  Activations are not counted (they depend on the model's code and the batch).

The planner itself keeps back, per rank, a share of device memory (15%), its own estimate of
the dense part (6x the dense parameters) and the input batches; ``reserved`` reports those.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import attrs
import torch

from tzrun.config.schema import RunConfig
from tzrun.config.sequences import id_features
from tzrun.errors import PlanError
from tzrun.runner.facts import RunFacts
from tzrun.runner.host_memory import HostMemory, format_size
from tzrun.runner.model import embedding_tables
from tzrun.runner.plan_advice import GIB, PlanFailure, diagnose, format_gib
from tzrun.runner.plan_memory import (
    PARTS,
    TIERS,
    DenseEstimate,
    HostPeak,
    RankMemory,
    TablePlan,
    estimate_dense,
    host_peak,
    rank_memory,
    reserved_memory,
    table_plan,
)
from tzrun.runner.sharding import prepare_sharding

__all__ = [
    "PlanRequest",
    "PlanFailure",
    "PlanReport",
    "format_plan",
    "format_failure",
    "format_peak",
    "peak_problem",
    "failure_line",
    "plan_config",
    "no_plan_error",
    "GIB",
]

@attrs.frozen
class PlanRequest:
    """The cluster to plan for.

    Attributes:
        world_size: ranks in all.
        local_world_size: ranks per host (default: ``world_size``, one host).
        device: ``"cuda"`` or ``"cpu"``: the kernels and memory the planner assumes.
        hbm_cap, ddr_cap: bytes of device and host memory per rank (default TorchRec's,
            32 GiB and 128 GiB).
        batch_size: rows per step per rank (default ``data.batch_size``).
    """

    world_size: int
    local_world_size: int | None = None
    device: str = "cuda"
    hbm_cap: int | None = None
    ddr_cap: int | None = None
    batch_size: int | None = None


@attrs.frozen
class PlanReport:
    """What :func:`plan_config` found.

    Attributes:
        request: the cluster, with defaults filled in.
        reserved: what the planner keeps back per rank before placing tables (bytes):
            ``share`` (its fraction), ``margin_hbm``, ``dense_hbm``, ``dense_ddr``,
            ``inputs_hbm``, ``inputs_ddr``, ``for_tables_hbm``, ``for_tables_ddr``.
        tables: each table's placement (empty when there is no plan).
        ranks: each rank's memory (empty when there is no plan).
        dense: the dense part's estimate.
        failure: why there is no plan (None when there is one).
        proposals: sharding proposals the planner evaluated.
        seconds: the planner's time.
        sharding_plan: TorchRec's ``ShardingPlan`` (None when there is none).
        peak: the fullest host's peak host memory, a checkpoint included (None when there is
            no plan).
    """

    request: PlanRequest
    reserved: Mapping[str, float]
    tables: tuple[TablePlan, ...]
    ranks: tuple[RankMemory, ...]
    dense: DenseEstimate
    failure: PlanFailure | None
    proposals: int
    seconds: float
    sharding_plan: Any = attrs.field(default=None, repr=False, eq=False)
    peak: HostPeak | None = None

    @property
    def fits(self) -> bool:
        """Whether the planner found a plan."""
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (bytes as integers)."""
        return {
            "fits": self.fits,
            "request": attrs.asdict(self.request),
            "reserved": dict(self.reserved),
            "dense": {**attrs.asdict(self.dense), "total": self.dense.total},
            "ranks": [{"rank": r.rank, "hbm": {**r.hbm, "total": r.total("hbm"), "cap": r.hbm_cap},
                       "ddr": {**r.ddr, "total": r.total("ddr"), "cap": r.ddr_cap}} for r in self.ranks],
            "tables": [{**attrs.asdict(t), "shards": [dict(s) for s in t.shards]} for t in self.tables],
            "failure": None if self.failure is None else attrs.asdict(self.failure),
            "peak_host_memory": None if self.peak is None else {**attrs.asdict(self.peak), "total": self.peak.total},
            "proposals": self.proposals,
            "seconds": round(self.seconds, 3),
        }


def plan_config(facts: RunFacts, request: PlanRequest, host: HostMemory | None = None) -> PlanReport:
    """Run TorchRec's planner for ``request``'s cluster on the model built on the meta device,
    from a run's facts (its config, components and features: ``session.facts``; no process
    group needed).

    Args:
        facts: the run's facts.
        request: the cluster.
        host: this host's memory, to refuse tables it cannot hold (a CPU run here); None
            checks nothing.

    Returns:
        The plan and its memory per rank; or, when no plan fits, :attr:`PlanReport.failure`
        naming the table that breaks it and what would help.

    Raises:
        ConfigError: as training would (see :func:`tzrun.runner.sharding.prepare_sharding`).
        PlanError: when ``host`` cannot hold the tables.
    """
    from torchrec.distributed.planner.types import PlannerError

    cfg, registries = facts.cfg, facts.registries
    if request.local_world_size is None:
        request = attrs.evolve(request, local_world_size=request.world_size)
    if request.batch_size is None:
        request = attrs.evolve(request, batch_size=cfg.data.batch_size)
    recorder = _recorder()
    setup = prepare_sharding(
        facts, world_size=request.world_size, local_world_size=request.local_world_size,
        device=torch.device(request.device), batch_size=request.batch_size,
        hbm_cap=request.hbm_cap, ddr_cap=request.ddr_cap, stats=[recorder], host=host,
    )
    caps = setup.topology.devices[0].storage
    request = attrs.evolve(request, hbm_cap=caps.hbm, ddr_cap=caps.ddr)
    dense = estimate_dense(cfg, registries, setup.model)
    readers = _readers(cfg, setup.embedding_modules)
    start = time.perf_counter()
    failure, sharding_plan = None, None
    try:
        sharding_plan = setup.planner.plan(setup.model, setup.sharders)
    except PlannerError as error:
        failure = diagnose(str(error), recorder, setup, readers, request)
    seconds = time.perf_counter() - start
    reserved = reserved_memory(recorder.storage_reservation, request.device, request.hbm_cap)
    tables: tuple[TablePlan, ...] = ()
    ranks: tuple[RankMemory, ...] = ()
    peak = None
    if failure is None:
        tables = tuple(table_plan(option, readers, request.device, setup.managed) for option in recorder.best_plan)
        ranks = rank_memory(recorder.best_plan, dense, request.world_size, request.device, request.hbm_cap, request.ddr_cap,
                            setup.managed)
        peak = host_peak(cfg, ranks, tables, dense, request.local_world_size, request.device,
                         None if host is None else host.available)
    return PlanReport(request, reserved, tables, ranks, dense, failure, recorder.num_proposals, seconds, sharding_plan, peak)


def _recorder() -> Any:
    """A TorchRec planner ``Stats`` that keeps what the planner reports instead of logging it."""
    from torchrec.distributed.planner.types import Stats

    class PlanRecorder(Stats):
        def __init__(self) -> None:
            self.best_plan: list[Any] = []
            self.storage_reservation: Any = None
            self.num_proposals = 0

        def log(self, sharding_plan: Any, topology: Any, batch_size: int, storage_reservation: Any,
                num_proposals: int, num_plans: int, run_time: float, best_plan: list[Any], constraints: Any = None,
                sharders: Any = None, enumerator: Any = None, debug: bool = False, debug_stats: Any = None) -> None:
            self.best_plan = list(best_plan)
            self.storage_reservation = storage_reservation
            self.num_proposals = num_proposals

    return PlanRecorder()


def _readers(cfg: RunConfig, modules: Sequence[Any]) -> dict[str, list[tuple[str, str, int]]]:
    """``table -> [(the feature's TOML path, its name, its embedding_dim)]`` of the features
    reading it (sequences included)."""

    index = {name: (path, f.embedding_dim) for name, (path, f) in id_features(cfg.features).items()}
    return {table.name: [(index[n][0], n, index[n][1]) for n in table.feature_names if n in index]
            for module in modules for table, _ in embedding_tables(module)}


def _ranks_text(ranks: Sequence[int]) -> str:
    ordered = sorted(set(ranks))
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def _topology_text(request: PlanRequest) -> str:
    local = request.local_world_size or request.world_size
    hosts = request.world_size // local
    memory = (f"{request.hbm_cap / GIB:g} GiB HBM and {request.ddr_cap / GIB:g} GiB DDR" if request.device == "cuda"
              else f"{request.ddr_cap / GIB:g} GiB DDR")
    return (f"{request.world_size} ranks ({local} per host, {hosts} host{'s' if hosts != 1 else ''}), {request.device}, "
            f"{memory} per rank, batch {request.batch_size} per rank")


def format_plan(report: PlanReport, source: str) -> str:
    """The plan as ``tzrec-run plan`` prints it: the planner's budget, memory per rank, the
    sharding of each table and the dense part (a plan that fits; see :func:`format_failure`)."""
    request, reserved, dense = report.request, report.reserved, report.dense
    lines = [f"{source}: sharding plan for {_topology_text(request)}"]
    tier = "hbm" if request.device == "cuda" else "ddr"
    keep = (f"{reserved['share']:.0%} of HBM ({format_gib(reserved['margin_hbm'])}), " if tier == "hbm" else "")
    lines.append(
        f"TorchRec's planner: {len(report.tables)} tables, {report.proposals} proposals in {report.seconds:.1f} s; it keeps back "
        f"per rank {keep}{format_size(reserved[f'dense_{tier}'])} for the dense part (6x its parameters) and "
        f"{format_size(reserved[f'inputs_{tier}'])} for input batches, leaving {format_gib(reserved.get(f'for_tables_{tier}', 0))} "
        f"of {tier.upper()} for tables"
    )
    tiers = [t for t in TIERS if (t == tier or any(r.total(t) for r in report.ranks))]
    parts = [p for p in PARTS if p != "managed" or any(getattr(r, t)[p] for r in report.ranks for t in TIERS)]
    header = "memory per rank, GiB".ljust(22) + " | ".join(
        f"{t.upper()}: " + " ".join(f"{p:>9}" for p in (*parts, "total", "cap")) for t in tiers)
    lines += ["", header]
    for r in report.ranks:
        cells = [" " * 5 + " ".join(f"{getattr(r, t)[p] / GIB:9.2f}" for p in parts)
                 + f" {r.total(t) / GIB:9.2f} {getattr(r, f'{t}_cap') / GIB:9.2f}" for t in tiers]
        lines.append(f"rank {r.rank}".ljust(22) + " | ".join(cells))
    sums = [" " * 5 + " ".join(f"{sum(getattr(r, t)[p] for r in report.ranks) / GIB:9.2f}" for p in parts)
            + f" {sum(r.total(t) for r in report.ranks) / GIB:9.2f} {sum(getattr(r, f'{t}_cap') for r in report.ranks) / GIB:9.2f}"
            for t in tiers]
    lines.append("all ranks".ljust(22) + " | ".join(sums))
    fullest = max(report.ranks, key=lambda r: r.total(tier))
    lines.append(f"most used: rank {fullest.rank}, {format_gib(fullest.total(tier))} of {format_gib(getattr(fullest, f'{tier}_cap'))} "
                 f"{tier.upper()} ({fullest.total(tier) / max(getattr(fullest, f'{tier}_cap'), 1):.0%})")
    width = max([len(t.table) for t in report.tables] + [5])
    lines += ["", f"{'table'.ljust(width)}  {'rows x dim':>18}  {'sharding':<17} {'kernel':<17} {'ranks':<7} rows+optimizer"]
    for t in report.tables:
        state = f" + zch managed state {format_size(t.managed)} ({format_size(t.shards[0]['managed'])} a slice)" if t.managed else ""
        lines.append(f"{t.table.ljust(width)}  {f'{t.rows:,} x {t.dim}':>18}  {t.sharding_type:<17} {t.compute_kernel:<17} "
                     f"{_ranks_text(t.ranks):<7} {format_size(t.weights + t.optimizer)}{state}")
    weights = sum(t.weights for t in report.tables)
    optimizer = sum(t.optimizer for t in report.tables)
    managed = sum(t.managed for t in report.tables)
    lines.append(f"{len(report.tables)} tables: {sum(t.rows for t in report.tables):,} rows, {format_gib(weights)} of rows and "
                 f"{format_gib(optimizer)} of sparse optimizer state"
                 + (f", {format_gib(managed)} of zch managed state" if managed else ""))
    lines += ["", f"dense part, on every rank: {dense.parameters:,} parameters; weights {format_size(dense.weights)}, gradients "
                  f"{format_size(dense.gradients)}, optimizer state {format_size(dense.optimizer)} ({dense.how}), EMA {format_size(dense.ema)}: "
                  f"{format_size(dense.total)}; activations not counted"]
    if report.peak is not None:
        lines += ["", format_peak(report.peak)]
    return "\n".join(lines)


def format_peak(peak: HostPeak) -> str:
    """The peak host memory on one line: its parts, and what is not counted."""
    ranks = f"{peak.ranks} ranks" if peak.ranks > 1 else "1 rank"
    return (f"peak host memory, the fullest host ({ranks}): about {format_gib(peak.total)}: tables, optimizer state, "
            f"buffers and dense part {format_size(peak.held)}; checkpoint {format_size(peak.checkpoint)} "
            f"({peak.checkpoint_how}); torch and TorchRec loaded {format_size(peak.runtime)}; activations, batches in "
            "flight and data workers not counted")


def peak_problem(peak: HostPeak, memory: HostMemory, source: str) -> str | None:
    """Why a run of this plan would not fit this host's memory (one line), or None."""
    if peak.total <= memory.available:
        return None
    return (f"{source}: {format_peak(peak)}; this host has {format_gib(memory.total)} of memory, "
            f"{format_gib(memory.available)} of it available: the run would be killed for memory. Use fewer rows "
            "(num_buckets, hash_bucket_size), a smaller embedding_dim, a sparse optimizer with less state, fewer ranks "
            "per host (--nproc-per-node), train.async_checkpoint off or a train.async_checkpoint_budget_gb, or more hosts")


def format_failure(report: PlanReport, source: str) -> str:
    """Why ``report`` has no plan, the table that breaks it and what would help."""
    failure = report.failure
    assert failure is not None
    lines = [f"{source}: no sharding plan fits {_topology_text(report.request)}", f"  {failure.message}"]
    if failure.advice:
        lines.append("what would help" + (f" '{failure.table}'" if failure.table else "") + ":")
        lines += [f"  - {a}" for a in failure.advice]
    lines.append("TorchRec: " + failure.planner_message.strip().splitlines()[0].strip())
    return "\n".join(lines)


def failure_line(report: PlanReport, source: str) -> str:
    """:func:`format_failure` on one line, for a run or ``check`` (whose batch is
    ``data.batch_size``; the other flags named are ``tzrec-run plan``'s, to try other clusters)."""
    failure = report.failure
    assert failure is not None
    line = f"{source}: no sharding plan fits {_topology_text(report.request)}: {failure.message}"
    if failure.advice:
        advice = "; ".join(a.replace("(--batch-size;", "(data.batch_size;") for a in failure.advice)
        line += "; what would help" + (f" '{failure.table}'" if failure.table else "") + f": {advice}"
        if "--" in advice:
            line += " (--flags: tzrec-run plan's, to plan for another cluster)"
    return line + " (TorchRec: " + failure.planner_message.strip().splitlines()[0].strip() + ")"


def no_plan_error(facts: RunFacts, request: PlanRequest, source: str) -> PlanError:
    """The one-line error of a job TorchRec's planner found no plan for: the planner is run again
    on the meta device for ``request`` (the job's ranks, devices and memory) to name the table
    that breaks it and what would help, as ``tzrec-run plan`` does."""
    report = plan_config(facts, request)
    if report.failure is None:  # planned here, not there: TorchRec's reason is all there is
        return PlanError(f"{source}: no sharding plan fits {_topology_text(report.request)}; "
                         "tzrec-run plan with the job's --world-size and --device shows why")
    return PlanError(failure_line(report, source))
