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
    step-N/manifest.json   every file above: relative path, size, SHA-256 (see :mod:`.manifest`)
    step-N/COMPLETE        written last, by rank 0, after every rank finished; records the
                           manifest's SHA-256. Without it the directory is not a checkpoint and
                           is never loaded

The manifest is kept for what DCP does not check: DCP reads each item by offset and length and
has no checksum, so a flipped byte in a ``.distcp`` file loads silently and a truncated one
fails with an unrelated error. With the manifest, a damaged file is named before torch reads it.

A directory without ``COMPLETE`` left by an interrupted save is removed before the same step is
written again. Loading checks every file against the manifest first (sizes always, hashes unless
``TZRUN_CHECKPOINT_VERIFY=size``) and names the damaged file and an earlier checkpoint.

A model dir may be on an object store or a distributed file system (``s3://``, ``gs://``,
``abfs://``, ``hdfs://``; see :mod:`tzrun.storage`): DCP then writes and reads through its
fsspec storage (``FsspecWriter``/``FsspecReader``), and nothing here relies on renaming a
directory: a checkpoint is complete when its marker exists, and the marker is one object
written last, by one PUT, which is atomic on every such store.

Torch is imported only by the functions that save or load state, so listing and inspecting
checkpoints stays fast.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tzrun.errors import CheckpointError, IncompleteCheckpointError
from tzrun.files import write_atomic
from tzrun.runner.dcp_storage import storage_reader, storage_writer
from tzrun.runner.manifest import (
    MANIFEST,
    MARKER,
    ManifestStatus,
    check_checkpoint,
    describe_files,
    ALLOW_UNVERIFIED_ENV,
    listed_files,
    manifest_bytes,
    marker_bytes,
    marker_state,
    share_of,
    unverified_allowed,
    verify_hashes_by_default,
)
from tzrun.runner.run_marker import is_run_dir
from tzrun.storage import as_path, is_remote, redact_url, remove_tree

if TYPE_CHECKING:
    import torch

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
    "Blob",
    "save_checkpoint",
    "mark_complete",
    "verify_checkpoint",
    "load_checkpoint",
    "load_planner",
    "load_model_state",
    "read_saved",
    "is_legacy",
    "read_legacy_entries",
    "init_lazy_states",
    "remove_incomplete_checkpoints",
]

log = logging.getLogger(__name__)
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
    digest, or (a checkpoint written before manifests) ``step N`` with no ``manifest.json``.
    An empty, unreadable or otherwise damaged marker is not complete."""
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


class Blob:
    """A ``Stateful`` for state that is not tensors to shard (loop position, schedules, stage
    states, RNG states): DCP stores what ``get()`` returns as one pickled value under the key
    it is given, and hands it to ``put`` on load.

    Args:
        get: returns the state to save.
        put: receives the saved state on load.
    """

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None]) -> None:
        self.get = get
        self.put = put

    def state_dict(self) -> dict[str, Any]:
        import io

        import torch

        buffer = io.BytesIO()
        torch.save(self.get(), buffer)
        return {"pickle": buffer.getvalue()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        import io

        import torch

        self.put(torch.load(io.BytesIO(state["pickle"]), weights_only=False))


def load_planner() -> Any:
    """DCP's default load planner, without its guess at checkpoints written before torch 2.4.

    Loading part of a checkpoint (evaluation loads the model and the update path, not the
    optimizers) leaves keys of the checkpoint unloaded; DCP's planner then re-flattens the
    request the pre-2.4 way, which keeps a :class:`Blob`'s dict whole, and on 2 ranks reported
    "Missing key in checkpoint state_dict: update" for a key the checkpoint holds. tzrec-run's
    checkpoints are all written by torch >= 2.13.
    """
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan

    class CurrentFormatLoadPlanner(DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            assert self.metadata is not None
            return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

    return CurrentFormatLoadPlanner()


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


def mark_complete(path: Path, step: int, manifest: bytes) -> None:
    """Write the completion marker of the checkpoint at ``path`` (rank 0, last)."""
    write_atomic(path / MARKER, marker_bytes(step, manifest))


def save_checkpoint(model_dir: Path, step: int, *, state: Mapping[str, Any], meta: Mapping[str, Any], rank: int) -> Path:
    """Write the checkpoint of ``step`` on every rank; returns its directory.

    Collective: every rank must call it, each with its own ``state`` (a dict of ``Stateful``
    objects and tensors: keys only one rank has are saved from that rank, keys every rank has
    are sharded or de-duplicated by DCP). Everything is written by **one**
    ``torch.distributed.checkpoint.save`` into ``state/``; then rank 0 writes ``meta.json``, the
    ranks hash the files (each its share), rank 0 writes the manifest and, last, the completion
    marker. A complete checkpoint of the same step is left as it is (the final step may
    coincide with a periodic save).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    path = checkpoint_dir(model_dir, step)
    if is_complete(path):
        return path
    if rank == 0:
        if path.exists() and is_remote(path):  # an earlier save of this step that never completed
            remove_tree(path)
        elif path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
    dist.barrier()  # nobody writes into a directory rank 0 is still clearing
    dcp.save(dict(state), storage_writer=storage_writer(path / "state"))  # returns on every rank once all wrote
    if rank == 0:
        write_atomic(path / "meta.json", redact_url(json.dumps(dict(meta), indent=2, default=str)).encode())
    manifest = _write_manifest(path, step)
    if rank == 0:
        mark_complete(path, step, manifest)
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
        The status (``ok``, or ``unverified`` for a checkpoint written before manifests, which
        loads only with ``TZRUN_ALLOW_UNVERIFIED_CHECKPOINTS=1``).

    Raises:
        IncompleteCheckpointError: when ``path`` has no completion marker, or an empty,
            unreadable or damaged one.
        CheckpointError: when a file is missing, truncated or corrupted (names the file and
            the previous complete checkpoint), or for a checkpoint without a manifest and no opt-in.
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
    if state == "unverified" and not unverified_allowed():
        raise CheckpointError(
            f"{path}: written before checkpoint manifests (its {MARKER} has no manifest digest and there is no "
            f"{MANIFEST}), so its files cannot be verified; set {ALLOW_UNVERIFIED_ENV}=1 to load it anyway"
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
        log.warning("%s has no %s (written by an earlier tzrec-run): its files are not verified (%s=1)", path,
                    MANIFEST, ALLOW_UNVERIFIED_ENV)
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
    dcp.load(state, storage_reader=storage_reader(as_path(path) / "state"))
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


def load_checkpoint(path: Path, state: Mapping[str, Any], *, verify: bool = True) -> dict[str, Any]:
    """Load a complete checkpoint into ``state`` (the same kind of dict :func:`save_checkpoint`
    took; collective when there is a process group). Optimizers that create their state lazily
    get it first (:func:`init_lazy_states`). Returns the checkpoint's ``meta.json``.

    Args:
        path: the checkpoint directory.
        state: what to load: every key must be in the checkpoint (DCP reshards tensors to
            this run's layout). A checkpoint written by tzrec-run 0.1.0 (:func:`is_legacy`)
            holds only ``model`` and ``optimizer`` in ``state/``; the other keys of ``state``
            (:class:`Blob` entries) get what it kept in its own files (:func:`read_legacy_entries`).
        verify: check the files against the manifest first (:func:`verify_checkpoint`).

    Raises:
        IncompleteCheckpointError: when ``path`` is not a complete checkpoint.
        CheckpointError: when a file is missing, truncated or corrupted, or a key of ``state``
            is not in it.
    """
    import torch.distributed.checkpoint as dcp

    path = as_path(path)
    if verify:
        verify_checkpoint(path)
    elif not is_complete(path):
        raise IncompleteCheckpointError(f"{path}: not a complete checkpoint (no {MARKER} marker)")
    legacy: dict[str, Any] = {}
    if is_legacy(path):
        rank = _group()[0]
        entries = read_legacy_entries(path, rank, f"rank.{rank}" in state, keys=set(state))
        legacy = {key: (state[key], value) for key, value in entries.items()}
        state = {k: v for k, v in state.items() if k in ("model", "optimizer")}
    if "optimizer" in state:
        init_lazy_states(state["optimizer"])
    try:
        dcp.load(dict(state), storage_reader=storage_reader(path / "state"), planner=load_planner())
    except Exception as error:  # DCP reports a key it lacks as "Missing key in checkpoint state_dict"
        if "Missing key" not in str(error):
            raise
        raise CheckpointError(f"{path}: does not hold everything this run loads (written by another kind of run "
                              f"or an older tzrec-run): {str(error).strip().splitlines()[-1]}") from error
    for blob, value in legacy.values():
        blob.put(value)
    return read_meta(path)


def is_legacy(path: Path) -> bool:
    """Whether the checkpoint was written by tzrec-run 0.1.0, which kept the schedules, the
    update path and each rank's state in files beside ``state/`` (``state/`` held the model
    and the optimizers only)."""
    return (as_path(path) / "schedules.pt").is_file()


def read_legacy_entries(path: Path, rank: int, same_world_size: bool, keys: set[str] | None = None) -> dict[str, Any]:
    """The entries a current checkpoint keeps in ``state/`` (``loop``, ``schedules``,
    ``update``, ``train_metrics``, ``stages``, and ``rank.<R>`` when the world size is the
    same), read from a 0.1.0 checkpoint's own files (its manifest verified them); only
    ``keys`` when given (a file is read only when its entry is asked for)."""
    path = as_path(path)
    meta = read_meta(path)
    rank_file = path / "ranks" / f"rank-{rank}.pt"
    read: dict[str, Callable[[], Any]] = {
        "loop": lambda: {"step": meta["step"], "epoch": meta.get("epoch", 0), "data": meta.get("data")},
        "schedules": lambda: _torch_load(path / "schedules.pt"),
        "update": lambda: _torch_load(path / "update.pt") if (path / "update.pt").is_file() else {},
        "train_metrics": lambda: meta.get("train_metrics", {}),
        "stages": lambda: meta.get("stages", {}),
    }
    if same_world_size and rank_file.is_file():
        read[f"rank.{rank}"] = lambda: _torch_load(rank_file)
    return {key: get() for key, get in read.items() if keys is None or key in keys}


def _torch_load(path: Path) -> Any:
    import io

    import torch

    return torch.load(io.BytesIO(path.read_bytes()) if is_remote(path) else path, weights_only=False)


def read_saved(path: Path, key: str) -> Any:
    """What a checkpoint saved under ``key`` through a :class:`Blob` (``loop``, ``schedules``,
    ``update``, ``train_metrics``, ``stages``, ``rank.<R>``), read in this process alone
    (no process group, no model): for tools and tests."""
    import torch.distributed.checkpoint as dcp

    found: list[Any] = []
    with warnings.catch_warnings():  # "torch.distributed is disabled ...": loading in one process is the intent
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({key: Blob(lambda: None, found.append)}, storage_reader=storage_reader(as_path(path) / "state"),
                 no_dist=True, planner=load_planner())
    return found[0]
