"""Checkpoints: ``model_dir/checkpoints/step-N/``, written through torch.distributed.checkpoint.

Layout of one checkpoint::

    step-N/state/          everything the run needs to continue, written by ONE DCP save
                           (.metadata, __<rank>_<i>.distcp): the sharded model and optimizer
                           state, and under their own keys the loop position (``loop``), every
                           LR schedule (``schedules``), the update path (``update``: fp16 loss
                           scaler, EMA of the dense weights), the train metrics, the stages'
                           states, and each rank's own ``rank.<R>`` (RNG states, train-metric
                           windows)
    step-N/meta.json       a readable record for tools that do not import torch: step, epoch,
                           world size, data position, plan, plugin set, learning rates, config
    step-N/manifest.json   every file above: relative path, size, SHA-256 of each 64 MiB block (see :mod:`.manifest`)
    step-N/COMPLETE        written last, by rank 0, after every rank finished; records the
                           manifest's SHA-256. Without it the directory is not a checkpoint and
                           is never loaded

The manifest is kept for what DCP does not check: DCP reads each item by offset and length and
has no checksum, so a flipped byte in a ``.distcp`` file loads silently and a truncated one
fails with an unrelated error. With the manifest, a damaged file is named before the load returns.

A directory without ``COMPLETE`` left by an interrupted save is removed before the same step is
written again. Loading checks every file against the manifest first (sizes always, hashes unless
``TZRUN_CHECKPOINT_VERIFY=size``) and names the damaged file and an earlier checkpoint.

A model dir may be on an object store or a distributed file system (``s3://``, ``gs://``,
``abfs://``, ``hdfs://``; see :mod:`tzrun.io.storage`): DCP then writes and reads through its
fsspec storage (``FsspecWriter``/``FsspecReader``), and nothing here relies on renaming a
directory: a checkpoint is complete when its marker exists, and the marker is one object
written last, by one PUT, which is atomic on every such store.

A checkpoint is data: loading reads DCP's ``.metadata`` through an unpickler that admits only
DCP's own metadata classes and every other value with ``torch.load(weights_only=True)``
(:mod:`.dcp_storage`, :mod:`.dcp_metadata`); an entry that is not a sharded tensor holds only
what :func:`~tzrun.runner.checkpoint_blobs.unsaveable` admits. The manifest and the marker prove
integrity against damage and half writes, not authenticity: whoever can write the directory can
rewrite them (``tzrec-run help checkpoint-trust``).

Torch is imported only by the functions that save or load state, so listing and inspecting
checkpoints stays fast.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

from tzrun.errors import CheckpointError, IncompleteCheckpointError
from tzrun.io.files import write_atomic
from tzrun.runner.checkpoint_blobs import named_state
from tzrun.runner.dcp_integrity import HashedFiles
from tzrun.runner.dcp_storage import load_state, save_planner, storage_writer
from tzrun.runner.manifest import (
    MANIFEST,
    MARKER,
    FileEntry,
    ManifestStatus,
    check_checkpoint,
    describe_files,
    listed_files,
    manifest_bytes,
    marker_bytes,
    marker_state,
    read_entries,
    verify_hashes_by_default,
)
from tzrun.runner.run_marker import is_run_dir
from tzrun.io.storage import as_path, is_remote, redact_url, remove_tree

__all__ = [
    "MARKER",
    "MANIFEST",
    "checkpoint_dir",
    "checkpoint_step",
    "is_complete",
    "list_checkpoints",
    "latest_checkpoint",
    "previous_checkpoint",
    "read_meta",
    "sharding_summary",
    "save_checkpoint",
    "begin_checkpoint",
    "finish_checkpoint",
    "mark_complete",
    "verify_checkpoint",
    "load_checkpoint",
    "verified_reads",
    "init_lazy_states",
    "remove_incomplete_checkpoints",
]

_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dir(model_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return as_path(model_dir) / "checkpoints" / f"step-{step}"


def checkpoint_step(path: Path) -> int | None:
    """The step of a ``step-N`` directory, or None for another name."""
    match = _STEP_DIR.match(as_path(path).name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a checkpoint whose save finished: its marker records the manifest's
    digest. An empty, unreadable or otherwise damaged marker is not complete."""
    return marker_state(as_path(path))[0] != "incomplete"


def list_checkpoints(model_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``model_dir``, oldest first."""
    root = as_path(model_dir) / "checkpoints"
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
    path = as_path(path)
    step = checkpoint_step(path)
    if step is None or path.parent.name != "checkpoints":
        return None
    older = [p for s, p in list_checkpoints(path.parent.parent) if s < step]
    return older[-1] if older else None


def remove_incomplete_checkpoints(model_dir: Path) -> list[Path]:
    """Delete checkpoint directories without the completion marker (an interrupted save);
    returns what was removed. A directory with a damaged marker is left for inspection (it is
    not listed, and a save of the same step replaces it), and so is everything in a model dir
    that tzrec-run did not mark as a run's (:mod:`~tzrun.runner.run_marker`). Call on one rank only."""
    root = as_path(model_dir) / "checkpoints"
    removed = []
    if root.is_dir() and is_run_dir(model_dir):
        for child in root.iterdir():
            # only a missing marker means an interrupted save; a damaged one is kept to inspect
            if _STEP_DIR.match(child.name) and not (child / MARKER).exists():
                remove_tree(child)
                removed.append(child)
    return removed


def read_meta(path: Path) -> dict[str, Any]:
    """A checkpoint's ``meta.json``."""
    return json.loads((as_path(path) / "meta.json").read_text(encoding="utf-8"))


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


def _group() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, or ``(0, 1)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _write_manifest(path: Path, step: int, hashed: HashedFiles, group: Any = None) -> bytes:
    """Write ``manifest.json`` on rank 0 (collective over ``group``; every file must be written).

    The ranks' ``hashed`` (what each rank's writer hashed as it wrote ``state/``) are gathered;
    a listed file none of them hashed (``.metadata``, renamed into place; ``meta.json``) is
    hashed from storage on rank 0: those are small. Returns the manifest on rank 0."""
    import torch.distributed as dist

    rank, world_size = _group()
    everyone: list[Any] = [dict(hashed)]
    if world_size > 1:
        everyone = [None] * world_size
        dist.all_gather_object(everyone, dict(hashed), group=group)
    if rank != 0:
        return b""
    written = {f"state/{name}": entry for part in everyone for name, entry in part.items()}
    entries = []
    for name in listed_files(path):
        size, blocks = written.get(name, (-1, ()))
        if size != (path / name).stat().st_size:
            entries += describe_files(path, [name])
        else:
            entries.append(FileEntry(name, size, blocks))
    content = manifest_bytes(step, entries)
    write_atomic(path / MANIFEST, content)
    return content


def mark_complete(path: Path, step: int, manifest: bytes) -> None:
    """Write the completion marker of the checkpoint at ``path`` (rank 0, last)."""
    write_atomic(path / MARKER, marker_bytes(step, manifest))


def begin_checkpoint(path: Path, rank: int) -> bool:
    """Make the empty directory of a checkpoint (rank 0, after removing what an interrupted save
    of the same step left), and meet the other ranks (collective). Returns False, doing
    nothing, when a complete checkpoint is there already (the final step may coincide with a
    periodic save)."""
    import torch.distributed as dist

    if is_complete(path):
        return False
    if rank == 0:
        if path.exists() and is_remote(path):  # an earlier save of this step that never completed
            remove_tree(path)
        elif path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
    dist.barrier()  # nobody writes into a directory rank 0 is still clearing
    return True


def finish_checkpoint(path: Path, step: int, *, meta: Mapping[str, Any], hashed: HashedFiles,
                      rank: int, group: Any = None) -> Path:
    """After every rank's DCP save returned: rank 0 writes ``meta.json``, the manifest (from
    the hashes the writers computed, gathered over ``group``) and, last, the completion marker."""
    if rank == 0:
        write_atomic(path / "meta.json", redact_url(json.dumps(dict(meta), indent=2, default=str)).encode())
    manifest = _write_manifest(path, step, hashed, group)
    if rank == 0:
        mark_complete(path, step, manifest)
    return path


def save_checkpoint(model_dir: Path, step: int, *, state: Mapping[str, Any], meta: Mapping[str, Any], rank: int) -> Path:
    """Write the checkpoint of ``step`` on every rank; returns its directory.

    Collective: every rank must call it, each with its own ``state`` (a dict of ``Stateful``
    objects and tensors: keys only one rank has are saved from that rank, keys every rank has
    are sharded or de-duplicated by DCP). Everything is written by **one**
    ``torch.distributed.checkpoint.save`` into ``state/``, each file hashed as it is written;
    then :func:`finish_checkpoint`. A complete checkpoint of the same step is left as it is.
    (:class:`~tzrun.runner.async_checkpoint.BackgroundSaves` writes the same behind training.)
    """
    import torch.distributed.checkpoint as dcp

    path = checkpoint_dir(model_dir, step)
    if not begin_checkpoint(path, rank):
        return path
    writer = storage_writer(path / "state")
    dcp.save(named_state(state, str), storage_writer=writer, planner=save_planner())  # returns on every rank once all wrote
    return finish_checkpoint(path, step, meta=meta, hashed=writer.hashed, rank=rank)


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


def verify_checkpoint(path: Path, *, hashes: bool | None = None, collective: bool = True,
                      state_while_reading: bool = False) -> ManifestStatus:
    """Check a checkpoint against its manifest, on every rank of the default process group
    (collective when there is one: each rank checks its share of the files, all ranks get the
    same outcome).

    Args:
        path: the checkpoint directory.
        hashes: check SHA-256 hashes too (default: yes, unless ``TZRUN_CHECKPOINT_VERIFY=size``).
        collective: share the work with the other ranks of the process group; False checks
            every file on this process alone (an export made by rank 0 during training).
        state_while_reading: leave the hashes of the files under ``state/`` to the load that
            follows (:func:`load_checkpoint` with ``verify_reads``, which checks each file as it
            reads it): their sizes are checked here, every other file's hash too.

    Returns:
        The status (``ok``).

    Raises:
        IncompleteCheckpointError: when ``path`` has no completion marker, or an empty,
            unreadable or damaged one.
        CheckpointError: when a file is missing, truncated or corrupted (names the file and
            the previous complete checkpoint).
    """
    import torch.distributed as dist

    path = as_path(path)
    if hashes is None:
        hashes = verify_hashes_by_default()
    state, reason = marker_state(path)
    if state == "incomplete":
        previous = previous_checkpoint(path) if path.exists() else None
        raise IncompleteCheckpointError(
            f"{path}: not a complete checkpoint ({reason}). {_earlier_hint(path, previous) if previous else ''}".rstrip()
        )
    rank, world_size = _group() if collective else (0, 1)
    status = check_checkpoint(path, hashes=hashes, share=(rank, world_size),
                              later=("state/",) if state_while_reading else ())
    if status.state == "unsupported":  # the same on every rank: each reads the same manifest
        raise CheckpointError(f"checkpoint {path}: {status.problems[0]}")
    problems = list(status.problems)
    if world_size > 1:
        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, problems)
        problems = sorted({p for part in everyone for p in part})
    if problems:
        raise CheckpointError(_damaged_message(path, problems))
    return status


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


def _state_entries(path: Path) -> dict[str, FileEntry]:
    """The manifest's entry of each file under ``state/``, by name (the manifest verified)."""
    entries = read_entries((path / MANIFEST).read_bytes())
    return {e.path[len("state/"):]: e for e in entries if e.path.startswith("state/")}


def verified_reads(path: Path, hashes: bool | None = None) -> dict[str, Any]:
    """The arguments of :func:`~tzrun.runner.dcp_storage.load_state` that check each file of
    the checkpoint ``path``'s ``state/`` against its manifest as it is read (size and the SHA-256
    of each block, on threads beside DCP's copy: one read of the file instead of a verification and a load),
    a damaged one named as :func:`verify_checkpoint` names it. Every load of a checkpoint's
    state goes through them: a resume, ``evaluate``, ``--init-from``, an export, a delta dump.
    Empty (DCP's own reader, no check) when ``hashes`` is False; ``hashes`` None: as
    ``TZRUN_CHECKPOINT_VERIFY`` says."""
    if not (verify_hashes_by_default() if hashes is None else hashes):
        return {}
    return {"expected": _state_entries(path),
            "damaged": lambda name, why: CheckpointError(_damaged_message(path, [f"state/{name}: {why}"]))}


def load_checkpoint(path: Path, state: Mapping[str, Any], *, verify: bool = True,
                    verify_reads: bool | None = None) -> dict[str, Any]:
    """Load a complete checkpoint into ``state`` (the same kind of dict :func:`save_checkpoint`
    took; collective when there is a process group). Optimizers that create their state lazily
    get it first (:func:`init_lazy_states`). Returns the checkpoint's ``meta.json``.

    Args:
        path: the checkpoint directory.
        state: what to load: every key must be in the checkpoint (DCP reshards tensors to
            this run's layout).
        verify: check the files against the manifest first (:func:`verify_checkpoint`): sizes,
            and the hashes of the files outside ``state/``.
        verify_reads: check each file under ``state/`` against the manifest's block hashes as it is
            read, while DCP takes the values out of it (one read instead of two). Default: ``verify`` and
            not ``TZRUN_CHECKPOINT_VERIFY=size``; a caller that ran :func:`verify_checkpoint`
            with ``state_while_reading`` passes ``verify=False, verify_reads=True``.

    Raises:
        IncompleteCheckpointError: when ``path`` is not a complete checkpoint.
        CheckpointError: when a file is missing, truncated or corrupted, a key of ``state``
            is not in it, or a file or entry would run code (it is refused, and names it).
    """
    from torch.distributed.checkpoint.api import CheckpointException

    path = as_path(path)
    if verify_reads is None:
        verify_reads = verify and verify_hashes_by_default()
    if verify:
        verify_checkpoint(path, state_while_reading=verify_reads)
    elif not is_complete(path):
        raise IncompleteCheckpointError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    if "optimizer" in state:
        init_lazy_states(state["optimizer"])
    try:
        load_state(path / "state", named_state(state, lambda key: f"{path / 'state'} entry '{key}'"),
                   **verified_reads(path, verify_reads))
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as error:  # DCP: "Missing key in checkpoint state_dict: <key>"
        if "Missing key" not in str(error):
            raise
        raise CheckpointError(f"{path}: does not hold everything this run loads (written by another kind of run "
                              f"or an older tzrec-run): {str(error).strip().splitlines()[-1]}") from error
    return read_meta(path)
