"""Checkpoints: ``model_dir/checkpoints/step-N/``, written through torch.distributed.checkpoint.

Layout of one checkpoint::

    step-N/state/          sharded model and optimizer state (DCP: .metadata, __<rank>_<i>.distcp)
    step-N/schedules.pt    every LR schedule's state_dict
    step-N/update.pt       the update path's state (fp16 loss scaler, EMA of dense weights)
    step-N/ranks/rank-R.pt each rank's own state: random number generators, train-metric windows
    step-N/meta.json       step, epoch, world size, plan, plugin set, stage states, resolved config
    step-N/COMPLETE        written last, by rank 0, after every rank finished; without it the
                           directory is not a checkpoint and is never loaded

A directory without ``COMPLETE`` left by an interrupted save is removed before the same step is
written again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist

__all__ = [
    "MARKER",
    "checkpoint_dir",
    "is_complete",
    "list_checkpoints",
    "latest_checkpoint",
    "save_checkpoint",
    "load_model_state",
    "load_training_state",
    "remove_incomplete_checkpoints",
]

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dir(model_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(model_dir) / "checkpoints" / f"step-{step}"


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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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

    Collective: every rank must call it. A complete checkpoint of the same step is left as it
    is (the final step may coincide with a periodic save).
    """
    path = checkpoint_dir(model_dir, step)
    if is_complete(path):
        return path
    if rank == 0:
        if path.exists():
            shutil.rmtree(path)  # an earlier save of this step that never completed
        path.mkdir(parents=True)
    dist.barrier()
    import torch.distributed.checkpoint as dcp

    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(path / "state"))
    if rank_state is not None:
        import io

        (path / "ranks").mkdir(exist_ok=True)
        buffer = io.BytesIO()
        torch.save(dict(rank_state), buffer)
        _write_atomic(path / "ranks" / f"rank-{rank}.pt", buffer.getvalue())
    if rank == 0:
        import io

        buffer = io.BytesIO()
        torch.save({k: s.state_dict() for k, s in schedulers.items()}, buffer)
        _write_atomic(path / "schedules.pt", buffer.getvalue())
        buffer = io.BytesIO()
        torch.save(dict(update or {}), buffer)
        _write_atomic(path / "update.pt", buffer.getvalue())
        _write_atomic(path / "meta.json", json.dumps(dict(meta), indent=2, default=str).encode())
    dist.barrier()
    if rank == 0:
        _write_atomic(path / MARKER, f"step {step}\n".encode())
    dist.barrier()
    return path


def load_model_state(path: Path, model: torch.nn.Module) -> None:
    """Load the model weights of a complete checkpoint into ``model`` (collective).

    Raises:
        FileNotFoundError: when ``path`` is not a complete checkpoint.
    """
    if not is_complete(path):
        raise FileNotFoundError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(Path(path) / "state"))
    model.load_state_dict(state["model"])


def _init_lazy_states(optimizer: Any) -> None:
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
    checkpoint's ``meta.json``.

    Raises:
        FileNotFoundError: when ``path`` is not a complete checkpoint.
        KeyError: when a schedule of the run has no saved state.
    """
    if not is_complete(path):
        raise FileNotFoundError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    _init_lazy_states(optimizer)
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
    return json.loads((path / "meta.json").read_text(encoding="utf-8"))
