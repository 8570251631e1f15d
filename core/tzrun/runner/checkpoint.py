"""Checkpoints: ``model_dir/checkpoints/step-N/``, written through torch.distributed.checkpoint.

Layout of one checkpoint::

    step-N/state/          sharded model and optimizer state (DCP: .metadata, __<rank>_<i>.distcp)
    step-N/schedules.pt    every LR schedule's state_dict
    step-N/update.pt       the update path's state (fp16 loss scaler, EMA of dense weights)
    step-N/ranks/rank-R.pt each rank's own state: random number generators, train-metric windows
    step-N/meta.json       step, epoch, world size, plan, plugin set, stage states, resolved config
    step-N/manifest.json   every file above: relative path, size, SHA-256 (see :mod:`.manifest`)
    step-N/COMPLETE        written last, by rank 0, after every rank finished; records the
                           manifest's SHA-256. Without it the directory is not a checkpoint and
                           is never loaded

A directory without ``COMPLETE`` left by an interrupted save is removed before the same step is
written again. Loading checks every file against the manifest first (sizes always, hashes unless
``TZRUN_CHECKPOINT_VERIFY=size``) and names the damaged file and an earlier checkpoint.

Torch is imported only by the functions that save or load state, so listing and inspecting
checkpoints stays fast.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from tzrun.errors import CheckpointError, IncompleteCheckpointError
from tzrun.runner.manifest import (
    MANIFEST,
    MARKER,
    ManifestStatus,
    check_checkpoint,
    describe_files,
    listed_files,
    manifest_bytes,
    marker_bytes,
    share_of,
    verify_hashes_by_default,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "MARKER",
    "MANIFEST",
    "checkpoint_dir",
    "checkpoint_step",
    "is_complete",
    "list_checkpoints",
    "write_atomic",
    "latest_checkpoint",
    "previous_checkpoint",
    "read_meta",
    "sharding_summary",
    "save_checkpoint",
    "verify_checkpoint",
    "load_model_state",
    "load_training_state",
    "init_lazy_states",
    "remove_incomplete_checkpoints",
]

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dir(model_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(model_dir) / "checkpoints" / f"step-{step}"


def checkpoint_step(path: Path) -> int | None:
    """The step of a ``step-N`` directory, or None for another name."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a checkpoint whose save finished."""
    return (Path(path) / MARKER).is_file()


def list_checkpoints(model_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``model_dir``, oldest first."""
    root = Path(model_dir) / "checkpoints"
    found = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and is_complete(child):
                found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(model_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(model_dir)
    return found[-1][1] if found else None


def previous_checkpoint(path: Path) -> Path | None:
    """The newest complete checkpoint older than ``path`` in the same model dir, or None."""
    path = Path(path)
    step = checkpoint_step(path)
    if step is None or path.parent.name != "checkpoints":
        return None
    older = [p for s, p in list_checkpoints(path.parent.parent) if s < step]
    return older[-1] if older else None


def remove_incomplete_checkpoints(model_dir: Path) -> list[Path]:
    """Delete checkpoint directories without the completion marker (an interrupted save);
    returns what was removed. Call on one rank only."""
    root = Path(model_dir) / "checkpoints"
    removed = []
    if root.is_dir():
        for child in root.iterdir():
            if _STEP_DIR.match(child.name) and not is_complete(child):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


def read_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json``."""
    return json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))


def sharding_summary(plan: Any) -> list[dict[str, Any]]:
    """One JSON entry per sharded table of a TorchRec ``ShardingPlan``: module, table, sharding
    type, compute kernel and ranks (saved as ``meta.json["sharding"]``)."""
    out = []
    for module, tables in sorted(getattr(plan, "plan", {}).items()):
        for table, sharding in sorted(tables.items()):
            out.append({
                "module": module,
                "table": table,
                "sharding_type": str(sharding.sharding_type),
                "compute_kernel": str(sharding.compute_kernel),
                "ranks": list(sharding.ranks or []),
            })
    return out


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one
    (a temporary file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _torch_bytes(obj: Any) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _group() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, or ``(0, 1)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _write_manifest(path: Path, step: int) -> bytes:
    """Hash every file of the checkpoint, each rank its share, and write ``manifest.json`` on
    rank 0 (collective; every file must be written). Returns the manifest on rank 0."""
    import torch.distributed as dist

    rank, world_size = _group()
    files: list[Any] = [None]
    if rank == 0:
        files[0] = [(name, (path / name).stat().st_size) for name in listed_files(path)]
    if world_size > 1:
        dist.broadcast_object_list(files, src=0)
    names = [name for name, _ in files[0]]
    mine = describe_files(path, [names[i] for i in share_of([size for _, size in files[0]], rank, world_size)])
    everyone: list[Any] = [mine]
    if world_size > 1:
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
    if rank != 0:
        return b""
    content = manifest_bytes(step, [entry for part in everyone for entry in part])
    write_atomic(path / MANIFEST, content)
    return content


def save_checkpoint(
    model_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: Any,
    schedulers: Mapping[str, Any],
    meta: Mapping[str, Any],
    rank: int,
    update: Mapping[str, Any] | None = None,
    rank_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` on every rank; returns its directory.

    Collective: every rank must call it. After every rank has written its files, the ranks
    hash them (each its share) and rank 0 writes the manifest, then the completion marker. A
    complete checkpoint of the same step is left as it is (the final step may coincide with a
    periodic save).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = checkpoint_dir(model_dir, step)
    if is_complete(path):
        return path
    if rank == 0:
        if path.exists():
            shutil.rmtree(path)  # an earlier save of this step that never completed
        path.mkdir(parents=True)
    dist.barrier()
    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(path / "state"))
    if rank_state is not None:
        (path / "ranks").mkdir(exist_ok=True)
        write_atomic(path / "ranks" / f"rank-{rank}.pt", _torch_bytes(dict(rank_state)))
    if rank == 0:
        write_atomic(path / "schedules.pt", _torch_bytes({k: s.state_dict() for k, s in schedulers.items()}))
        write_atomic(path / "update.pt", _torch_bytes(dict(update or {})))
        write_atomic(path / "meta.json", json.dumps(dict(meta), indent=2, default=str).encode())
    dist.barrier()
    manifest = _write_manifest(path, step)
    from tzrun.runner import faults

    faults.during_save(step, rank)  # TZRUN_FAULT=kill-during-save@STEP:RANK (tests only)
    if rank == 0:
        write_atomic(path / MARKER, marker_bytes(step, manifest))
    dist.barrier()
    return path


def _damaged_message(path: Path, problems: list[str]) -> str:
    previous = previous_checkpoint(path)
    lines = [f"checkpoint {path} is damaged: {problems[0]}"]
    lines += [f"  also {p}" for p in problems[1:6]]
    if len(problems) > 6:
        lines.append(f"  and {len(problems) - 6} more damaged file(s)")
    lines.append(_earlier_hint(path, previous))
    return "\n".join(lines)


def _earlier_hint(path: Path, previous: Path | None) -> str:
    if previous is None:
        return "There is no earlier complete checkpoint next to it; train again (--overwrite), or restore it from a copy."
    return (f"Use an earlier checkpoint: {previous} is the previous complete one (tzrec-run evaluate "
            f"--checkpoint {previous}; to resume from it, move {path} out of {path.parent} and train with --resume).")


def verify_checkpoint(path: Path, *, hashes: bool | None = None) -> ManifestStatus:
    """Check a checkpoint against its manifest, on every rank of the default process group
    (collective when there is one: each rank checks its share of the files, all ranks get the
    same outcome).

    Args:
        path: the checkpoint directory.
        hashes: check SHA-256 hashes too (default: yes, unless ``TZRUN_CHECKPOINT_VERIFY=size``).

    Returns:
        The status (``ok``, or ``unverified`` for a checkpoint written before manifests).

    Raises:
        IncompleteCheckpointError: when ``path`` has no completion marker.
        CheckpointError: when a file is missing, truncated or corrupted; names the file and
            the previous complete checkpoint.
    """
    import torch.distributed as dist

    path = Path(path)
    if hashes is None:
        hashes = verify_hashes_by_default()
    if not is_complete(path):
        previous = previous_checkpoint(path) if path.exists() else None
        raise IncompleteCheckpointError(
            f"{path}: not a complete checkpoint (no {MARKER} marker: its save never finished, or it is not a "
            f"checkpoint directory). {_earlier_hint(path, previous) if previous else ''}".rstrip()
        )
    rank, world_size = _group()
    status = check_checkpoint(path, hashes=hashes, share=(rank, world_size))
    problems = list(status.problems)
    if world_size > 1:
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, problems)
        problems = sorted({p for part in everyone for p in part})
    if problems:
        raise CheckpointError(_damaged_message(path, problems))
    if status.state == "unverified" and rank == 0:
        log.warning("%s has no %s (written by an earlier tzrec-run): its files are not verified", path, MANIFEST)
    return status


def load_model_state(path: Path, model: torch.nn.Module, *, verify: bool = True) -> None:
    """Load the model weights of a complete checkpoint into ``model`` (collective).

    Args:
        path: the checkpoint directory.
        model: the built model (any world size: DCP reshards).
        verify: check the files against the manifest first (:func:`verify_checkpoint`).

    Raises:
        IncompleteCheckpointError: when ``path`` is not a complete checkpoint (also a
            ``FileNotFoundError``).
        CheckpointError: when a file is missing, truncated or corrupted.
    """
    import torch.distributed.checkpoint as dcp

    if verify:
        verify_checkpoint(path)
    elif not is_complete(path):
        raise IncompleteCheckpointError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(Path(path) / "state"))
    model.load_state_dict(state["model"])


def init_lazy_states(optimizer: Any) -> None:
    """Create the state of optimizers that make it lazily at their first step (Adam's moments,
    SGD's momentum), so that the checkpoint's values have tensors to load into: DCP loads only
    the keys the live state dict has. The dummy step's effect on the weights is overwritten by
    the weights loaded next."""
    children = [opt for _, opt in getattr(optimizer, "optimizers", [])] or [optimizer]
    for child in children:
        if not child.state and hasattr(child, "init_state"):
            child.init_state()
            child.zero_grad(set_to_none=True)


def load_training_state(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: Any,
    schedulers: Mapping[str, Any],
    update: Any | None = None,
) -> dict[str, Any]:
    """Load everything a checkpoint holds into a built run (collective): weights, every
    optimizer's state, each LR schedule's position and the update path's state. Returns the
    checkpoint's ``meta.json``. The files are checked against the manifest first.

    Raises:
        IncompleteCheckpointError: when ``path`` is not a complete checkpoint.
        CheckpointError: when a file is missing, truncated or corrupted.
        KeyError: when a schedule of the run has no saved state.
    """
    import torch
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    verify_checkpoint(path)
    init_lazy_states(optimizer)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    dcp.load(state, checkpoint_id=str(path / "state"))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    saved = torch.load(path / "schedules.pt", weights_only=False)
    for key, scheduler in schedulers.items():
        if key not in saved:
            raise KeyError(f"{path}: no saved state for the lr schedule of '{key}' (saved: {', '.join(saved)})")
        scheduler.load_state_dict(saved[key])
    if update is not None and (path / "update.pt").is_file():
        update.load_state_dict(torch.load(path / "update.pt", weights_only=False))
    return read_meta(path)
