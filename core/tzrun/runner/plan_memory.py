"""What a sharding plan costs each rank: the bytes of each table's shards, split by tier
(``hbm``, ``ddr``) and part (``tables``, ``optimizer``, ``buffers``, ``managed``, ``dense``),
the dense part's estimate, and what TorchRec's planner keeps back (see :mod:`tzrun.runner.plan`).
``managed`` is a ``zch`` table's managed state (:mod:`tzrun.runner.zch_memory`), on the compute
device beside each row-wise shard; TorchRec's planner does not count it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import attrs
import torch

from tzrun.config.schema import RunConfig
from tzrun.kernel.registry import Registries
from tzrun.runner.manifest import BLOCK_SIZE, MAX_HASH_THREADS
from tzrun.runner.dense_parts import assign_parts
from tzrun.runner.host_memory import GIB, staging_limit
from tzrun.runner.model import dense_parameter_names
from tzrun.runner.zch_memory import ManagedState, managed_bytes

__all__ = [
    "TIERS",
    "PARTS",
    "TablePlan",
    "RankMemory",
    "DenseEstimate",
    "HostPeak",
    "RUNTIME_PER_RANK",
    "estimate_dense",
    "host_peak",
    "table_plan",
    "rank_memory",
    "reserved_memory",
]

TIERS = ("hbm", "ddr")
PARTS = ("tables", "optimizer", "buffers", "managed", "dense")


@attrs.frozen
class TablePlan:
    """Where one table goes.

    Attributes:
        module: the embedding collection's path in the model.
        table: the table's name.
        rows, dim: its shape.
        features: the id features that read it.
        sharding_type, compute_kernel: the planner's choice.
        ranks: the rank of each shard.
        shards: one dict per shard: ``rank``, ``offsets``, ``sizes``, ``hbm``, ``ddr`` (bytes).
        weights, optimizer: bytes of rows and of sparse optimizer state, all shards together.
        managed: bytes of a ``zch`` table's managed state, all slices together (0 for another
            table); each shard's ``managed`` says its slice's.
    """

    module: str
    table: str
    rows: int
    dim: int
    features: tuple[str, ...]
    sharding_type: str
    compute_kernel: str
    ranks: tuple[int, ...]
    shards: tuple[Mapping[str, Any], ...]
    weights: int
    optimizer: int
    managed: int = 0


@attrs.frozen
class RankMemory:
    """One rank's memory by tier (``hbm``, ``ddr``) and part (``tables``, ``optimizer``,
    ``buffers``, ``managed``, ``dense``), in bytes, and each tier's capacity."""

    rank: int
    hbm: Mapping[str, int]
    ddr: Mapping[str, int]
    hbm_cap: int
    ddr_cap: int

    def total(self, tier: str) -> int:
        """Bytes used in ``tier``."""
        return sum(getattr(self, tier).values())


@attrs.frozen
class DenseEstimate:
    """The dense part of the model, the same on every rank (bytes).

    Attributes:
        parameters: how many dense parameter elements.
        weights: parameters and buffers.
        gradients: one gradient per parameter.
        optimizer: the dense optimizers' state.
        ema: the EMA copy of the weights (0 without ``ema``).
        how: how ``optimizer`` was found.
    """

    parameters: int
    weights: int
    gradients: int
    optimizer: int
    ema: int
    how: str

    @property
    def total(self) -> int:
        """All of it."""
        return self.weights + self.gradients + self.optimizer + self.ema


def estimate_dense(cfg: RunConfig, registries: Registries, model: torch.nn.Module) -> DenseEstimate:
    """The dense part's memory on each rank: parameters and buffers outside the embedding
    collections, a gradient per parameter, the state of the configured dense optimizers
    (``train.dense_optimizer`` and its parts), measured by one step of each on meta-device
    copies of its parameters with zero gradients, and an EMA copy when ``ema`` is set."""
    inner = model.model
    names = dense_parameter_names(inner)
    fields = cfg.train.dense_optimizer.fields
    params = dict(inner.named_parameters())
    embedding = {id(p) for m in inner.modules() if hasattr(m, "embedding_bag_configs") or hasattr(m, "embedding_configs")
                 for p in m.buffers()}
    weights = sum(_bytes(params[n]) for n in names)
    weights += sum(_bytes(b) for b in inner.buffers() if id(b) not in embedding)
    gradients = sum(_bytes(params[n]) for n in names if params[n].requires_grad)
    optimizer, guessed = 0, []
    for key, group in assign_parts(names, fields.parts).items():
        if not group:
            continue
        if key == "dense":
            component, where = cfg.train.dense_optimizer, "train.dense_optimizer"
        else:
            index = int(key[len("dense.parts["):-1])
            component, where = fields.parts[index], f"train.dense_optimizer.parts[{index}]"
        copies = [torch.nn.Parameter(torch.empty_like(params[n], device="meta")) for n in group]
        try:
            built = registries["dense_optimizer"].get(component.type, f"{where}.type").build(component.config, copies)
            for p in copies:
                p.grad = torch.zeros_like(p)
            built.step()
            optimizer += sum(_bytes(t) for state in built.state.values() for t in state.values()
                             if torch.is_tensor(t) and t.dim() > 0)
        except Exception:  # noqa: BLE001 - an optimizer whose step needs real values
            optimizer += 2 * sum(_bytes(p) for p in copies)
            guessed.append(f"{where} ({component.type})")
    how = "one step of each dense optimizer on meta copies of its parameters"
    if guessed:
        how += f"; {', '.join(guessed)} could not step on the meta device: counted as 2x its parameters (Adam's state)"
    ema = weights if fields.ema is not None else 0
    return DenseEstimate(sum(params[n].numel() for n in names), weights, gradients, optimizer, ema, how)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _weights_tier(device: str, kernel: str) -> str:
    return "ddr" if device == "cpu" or kernel in ("fused_uvm", "fused_uvm_caching") else "hbm"


def _optimizer_multiplier(tensor: torch.Tensor) -> float:
    # the planner's own rule, so that tables + optimizer + buffers add up to its estimate
    from torchrec.distributed.planner.shard_estimators import _get_optimizer_multipler

    return float(_get_optimizer_multipler(getattr(tensor, "_optimizer_classes", [None])[0], tensor.shape))


def _managed_bytes(option: Any, shard: Any, managed: Mapping[str, ManagedState]) -> int:
    """The managed state of one shard's slice (0 unless ``option`` is a ``zch`` table), its
    window sized for the planner's ids a step (batch size x the features' pooling factors)."""
    return managed_bytes(managed, option.name, int(shard.size[0]), option.batch_size * sum(option.input_lengths))


def _shard_parts(option: Any, shard: Any, device: str, managed: Mapping[str, ManagedState]) -> dict[str, dict[str, int]]:
    """One shard's bytes by tier and part (without ``dense``)."""
    weights = math.prod(shard.size) * option.tensor.element_size()
    optimizer = math.ceil(weights * _optimizer_multiplier(option.tensor))
    home = _weights_tier(device, option.compute_kernel)
    state_tier = "ddr" if device == "cpu" else "hbm"
    parts = {}
    for tier in TIERS:
        used = getattr(shard.storage, tier)
        if tier == home:
            parts[tier] = {"tables": weights, "optimizer": optimizer, "buffers": max(used - weights - optimizer, 0)}
        else:
            parts[tier] = {"tables": 0, "optimizer": 0, "buffers": used}
        parts[tier]["managed"] = _managed_bytes(option, shard, managed) if tier == state_tier else 0
    return parts


def table_plan(option: Any, readers: Mapping[str, list[tuple[str, str, int]]], device: str,
               managed: Mapping[str, ManagedState] | None = None) -> TablePlan:
    """Where the planner put one table (``option``, a sharding option of its best plan) and its
    bytes; ``readers`` are the features reading each table (TOML path, name, dim); ``managed``
    the managed state of each ``zch`` table."""
    managed = managed or {}
    shards = []
    weights = optimizer = state = 0
    for shard in option.shards:
        parts = _shard_parts(option, shard, device, managed)
        home = parts[_weights_tier(device, option.compute_kernel)]
        weights, optimizer = weights + home["tables"], optimizer + home["optimizer"]
        slice_bytes = _managed_bytes(option, shard, managed)
        state += slice_bytes
        shards.append({"rank": shard.rank, "offsets": list(shard.offset), "sizes": list(shard.size),
                       "hbm": shard.storage.hbm, "ddr": shard.storage.ddr, "managed": slice_bytes})
    rows, dim = option.tensor.shape
    return TablePlan(
        option.path, option.name, int(rows), int(dim), tuple(r[1] for r in readers.get(option.name, [])),
        option.sharding_type, option.compute_kernel, tuple(s["rank"] for s in shards), tuple(shards), weights, optimizer,
        state,
    )


def rank_memory(
    best_plan: Sequence[Any], dense: DenseEstimate, world_size: int, device: str, hbm_cap: int | None, ddr_cap: int | None,
    managed: Mapping[str, ManagedState] | None = None,
) -> tuple[RankMemory, ...]:
    """Each rank's memory under the planner's best plan, the dense part on every rank."""
    use = {r: {tier: dict.fromkeys(PARTS, 0) for tier in TIERS} for r in range(world_size)}
    for option in best_plan:
        for shard in option.shards:
            for tier, parts in _shard_parts(option, shard, device, managed or {}).items():
                for part, value in parts.items():
                    use[shard.rank][tier][part] += value
    dense_tier = "ddr" if device == "cpu" else "hbm"
    for r in use:
        use[r][dense_tier]["dense"] = dense.total
    return tuple(RankMemory(r, use[r]["hbm"], use[r]["ddr"], hbm_cap or 0, ddr_cap or 0) for r in sorted(use))


def reserved_memory(reservation: Any, device: str, hbm_cap: int | None) -> dict[str, float]:
    """What TorchRec's storage reservation kept back per rank (its attributes, read as the
    planner's own error message reads them)."""
    out: dict[str, float] = {"share": float(getattr(reservation, "_percentage", 0.0) or 0.0)}
    out["margin_hbm"] = int((hbm_cap or 0) * out["share"]) if device == "cuda" else 0
    for key, attr in (("dense", "_dense_storage"), ("inputs", "_kjt_storage")):
        storage = getattr(reservation, attr, None)
        out[f"{key}_hbm"] = int(storage.hbm) if storage is not None else 0
        out[f"{key}_ddr"] = int(storage.ddr) if storage is not None else 0
    reserved = getattr(reservation, "last_reserved_topology", None)
    if reserved is not None:
        out["for_tables_hbm"] = int(reserved.devices[0].storage.hbm)
        out["for_tables_ddr"] = int(reserved.devices[0].storage.ddr)
    return out


@attrs.frozen
class HostPeak:
    """The most host memory the fullest host's ranks hold at once, a checkpoint included
    (bytes, its ranks together).

    Attributes:
        ranks: the host's ranks.
        held: what they hold in host memory while training: each rank's DDR (tables, sparse
            optimizer state, buffers, zch managed state; on CPU the dense part as well).
        checkpoint: what a checkpoint adds at its peak (see ``checkpoint_how``).
        runtime: torch, TorchRec and FBGEMM loaded, once per rank (:data:`RUNTIME_PER_RANK`).
        checkpoint_how: how the checkpoint is written, in words.
    """

    ranks: int
    held: int
    checkpoint: int
    runtime: int
    checkpoint_how: str

    @property
    def total(self) -> int:
        """All of it."""
        return self.held + self.checkpoint + self.runtime


#: what a rank holds before its model: torch, TorchRec, FBGEMM, torchmetrics and pyarrow loaded
#: (a ``tzrec-run check`` process, which has them loaded, held 0.49 GiB resident on CPU); a
#: constant, not the planning process's own memory, which may hold anything (a test runner's)
RUNTIME_PER_RANK = 512 << 20


def host_peak(cfg: RunConfig, ranks: Sequence[RankMemory], tables: Sequence[TablePlan], dense: DenseEstimate,
              local_world_size: int, device: str, available: int | None, runtime: int = RUNTIME_PER_RANK) -> HostPeak:
    """The peak host memory of the fullest host under a plan (``ranks``, ``tables``), with
    ``runtime`` bytes per rank and the host's ``available`` memory (None: unknown).

    A synchronous save writes from the live tables, and a load holds a 64 MiB block of the
    file it reads (:data:`~tzrun.runner.manifest.BLOCK_SIZE`) for each thread hashing it
    (at most :data:`~tzrun.runner.manifest.MAX_HASH_THREADS`) and one being copied; on a GPU the save copies one
    tensor at a time to host memory (the largest shard's rows are counted). With ``train.async_checkpoint`` each rank
    copies its whole state to host memory (tables, both optimizers' state, the dense weights and
    EMA), unless the copy exceeds ``train.async_checkpoint_budget_gb`` (unset: the memory left
    beside the rest), when the save is synchronous after all
    (:class:`~tzrun.runner.async_checkpoint.BackgroundSaves`)."""
    hosts: dict[int, list[RankMemory]] = {}
    for r in ranks:
        hosts.setdefault(r.rank // local_world_size, []).append(r)
    members = max(hosts.values(), key=lambda rs: sum(r.total("ddr") for r in rs))
    held = sum(r.total("ddr") for r in members)
    largest_shard = {r.rank: 0 for r in members}  # a GPU rank's save copies one tensor at a time to host memory
    for table in tables:
        element = table.weights / max(table.rows * table.dim, 1)  # bytes per value
        for shard in table.shards:
            if shard["rank"] in largest_shard:
                largest_shard[shard["rank"]] = max(largest_shard[shard["rank"]], int(math.prod(shard["sizes"]) * element))
    synchronous = sum((MAX_HASH_THREADS + 1) * BLOCK_SIZE + (largest_shard[r.rank] if device == "cuda" else 0) for r in members)
    state = dense.weights + dense.optimizer + dense.ema
    copy = len(members) * max(sum(getattr(r, t)[p] for t in TIERS for p in ("tables", "optimizer", "managed")) + state
                              for r in members)
    train = cfg.train
    room = staging_limit(train.async_checkpoint_budget_gb,
                         None if available is None else available - held - runtime * len(members))
    if train.async_checkpoint and (room is None or copy <= room):  # a resume's load still holds its blocks
        return HostPeak(len(members), held, max(copy, synchronous), runtime * len(members),
                        "a copy of each rank's state, written behind training")
    how = "written synchronously from the live tables" + (", a shard at a time through host memory" if device == "cuda" else "")
    if train.async_checkpoint:
        over = (f"train.async_checkpoint_budget_gb = {train.async_checkpoint_budget_gb:g}"
                if train.async_checkpoint_budget_gb is not None
                else "the memory left beside the rest")
        how += f": the copy behind training, {copy / GIB:.2f} GiB, would exceed {over}"
    return HostPeak(len(members), held, synchronous, runtime * len(members), how)
