"""Whether the embedding tables of a run on CPU fit this host's memory.

On CPU, TorchRec's planner assumes 128 GiB of host memory per rank whatever the host has, so a
table too big for the host is planned as fitting and the ranks allocate until the kernel kills
them. Before planning, ``tzrec-run train`` and ``check`` on CPU add up what the tables hold on
this host (rows x dim x element size, plus the sparse optimizer state as the planner sizes it and a
``zch`` table's managed state, :mod:`tzrun.runner.zch_memory`;
a data-parallel table once per rank, a sharded one once across the job, of which this host
holds its ranks' share) and refuse a run that needs more than the host's *available* memory
(``MemAvailable`` of ``/proc/meminfo``, lowered to what a cgroup's ``memory.max`` leaves):
memory that is already in use by other processes cannot hold the tables either, and the rest
of the run (the dense part, batches, torch itself) needs some beyond them, so the check is a
lower bound: a run it lets through may still need more.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from tzrun.runner.model import embedding_tables
from tzrun.runner.zch_memory import ManagedState, managed_bytes

__all__ = ["GIB", "HostMemory", "host_memory", "table_bytes", "host_memory_problem", "format_size", "staging_limit"]


GIB = 1024**3


@attrs.frozen
class HostMemory:
    """This host's memory in bytes: ``total`` (physical, or the cgroup's limit when lower) and
    ``available`` (what can be allocated without swapping or taking it from others)."""

    total: int
    available: int


def _meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return fields


def _cgroup_left(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int] | None:
    """``(limit, limit - usage)`` of this process's cgroup (v2), or None without a limit."""
    try:
        limit, usage = (root / "memory.max").read_text().strip(), (root / "memory.current").read_text().strip()
    except OSError:
        return None
    if not limit.isdigit() or not usage.isdigit():
        return None  # "max": no limit
    return int(limit), max(int(limit) - int(usage), 0)


def host_memory() -> HostMemory | None:
    """This host's memory, or None where it cannot be read (then nothing is refused)."""
    info = _meminfo()
    total, available = info.get("MemTotal"), info.get("MemAvailable")
    if total is None or available is None:
        try:
            pages, free, size = (os.sysconf(n) for n in ("SC_PHYS_PAGES", "SC_AVPHYS_PAGES", "SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
        total, available = pages * size, free * size
    cgroup = _cgroup_left()
    if cgroup is not None:
        total, available = min(total, cgroup[0]), min(available, cgroup[1])
    return HostMemory(total, available)


def _optimizer_multiplier(weight: Any) -> float:
    """The planner's own rule: the sparse optimizer's state as a multiple of the table's bytes."""
    from torchrec.distributed.planner.shard_estimators import _get_optimizer_multipler

    return float(_get_optimizer_multipler(getattr(weight, "_optimizer_classes", [None])[0], weight.shape))


def table_bytes(modules: Sequence[Any], updates: Mapping[str, Any], world_size: int, *,
                managed: Mapping[str, ManagedState] | None = None, batch_size: int = 0) -> tuple[int, str, int]:
    """What the job's tables hold, all ranks together, and its biggest table.

    Args:
        modules: the model's embedding collections (on the meta device, each table's sparse
            optimizer applied in backward).
        updates: each table's :class:`~tzrun.runner.sharding.TableUpdate` (a data-parallel
            table is held whole by every rank).
        world_size: ranks in all.
        managed: the managed state of each ``zch`` table (:mod:`tzrun.runner.zch_memory`): one
            slice per rank, counted with its table.
        batch_size: rows per step per rank, to size a ``zch`` slice's window (one id per
            feature and row, the planner's default pooling factor).

    Returns:
        ``(bytes, biggest table's name, its bytes)``, optimizer state and managed state included.
    """
    managed = managed or {}
    total, biggest, biggest_bytes = 0, "", 0
    for module in modules:
        for table, weight in embedding_tables(module):
            update = updates.get(table.name)
            data_parallel = update is not None and update.data_parallel
            weights = weight.numel() * weight.element_size()
            size = math.ceil(weights * (1 + (0.0 if data_parallel else _optimizer_multiplier(weight))))
            size += world_size * managed_bytes(managed, table.name, weight.shape[0] // world_size,
                                               batch_size * len(table.feature_names))
            if size > biggest_bytes:
                biggest, biggest_bytes = table.name, size
            total += size * (world_size if data_parallel else 1)
    return total, biggest, biggest_bytes


def _gb(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def format_size(n: float) -> str:
    """Bytes in the unit that shows them best (``"1.50 GiB"``, ``"264.03 KiB"``)."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def host_memory_problem(modules: Sequence[Any], updates: Mapping[str, Any], world_size: int, local_world_size: int,
                        memory: HostMemory | None, *, managed: Mapping[str, ManagedState] | None = None,
                        batch_size: int = 0) -> str | None:
    """Why the job's tables do not fit this host (one line), or None when they do (or its
    memory is unknown): this host's ``local_world_size`` ranks hold their share of the tables
    (``managed``, ``batch_size``: see :func:`table_bytes`)."""
    if memory is None:
        return None
    total, biggest, biggest_bytes = table_bytes(modules, updates, world_size, managed=managed, batch_size=batch_size)
    need = math.ceil(total * local_world_size / world_size)
    if need <= memory.available:
        return None
    ranks = f"its {local_world_size} CPU ranks" if local_world_size > 1 else "its CPU rank"
    held = "the embedding tables, their sparse optimizer state and the zch tables' managed state" if managed else \
        "the embedding tables and their sparse optimizer state"
    return (f"{held} need {_gb(need)} on this host ({ranks}; the biggest "
            f"is {biggest}, {_gb(biggest_bytes)}), which has {_gb(memory.total)} of memory, {_gb(memory.available)} "
            "of it available: the run would be killed for memory. Use fewer rows (num_buckets, hash_bucket_size), a "
            "smaller embedding_dim, a sparse optimizer with less state, more hosts, or a GPU")


def staging_limit(budget_gb: float | None, room: int | None) -> int | None:
    """The most bytes a save behind training may copy the state into on a host:
    ``train.async_checkpoint_budget_gb`` when set, else ``room`` (the memory left for it; None:
    unknown, no limit). The save (:class:`~tzrun.runner.async_checkpoint.BackgroundSaves`) and
    the plan's peak (:func:`~tzrun.runner.plan_memory.host_peak`) both decide by it."""
    return int(budget_gb * GIB) if budget_gb is not None else room
