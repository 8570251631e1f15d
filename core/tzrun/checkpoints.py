"""A read-only view of a checkpoint, for what leaves a run (exports, embedding delta dumps,
reports): the public face of ``model_dir/checkpoints/step-N``.

A plugin opens one with :func:`open_checkpoint` (a directory) or :func:`find_checkpoint` (what
``--checkpoint`` names: ``latest``, ``best``, ``step-N`` or a path) and reads what the run
recorded, checks it against its manifest, and loads tensors from it on one process, with no
process group. Nothing here writes to a checkpoint, and loading never unpickles: the view
uses the same safe reader as a resume (docs/checkpoints.md, "Trust")::

    view = tzrun.open_checkpoint(path)
    view.verify(state_while_reading=True)           # the manifest, or CheckpointError
    shapes = view.tensor_shapes()                   # {"model.<fqn>": (rows, dim), ...}
    state = {"model.<fqn>": torch.empty(shapes["model.<fqn>"])}
    view.load_state(state)                          # filled in place, state/ checked as it is read
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any, Mapping

import attrs

from tzrun.errors import CheckpointError
from tzrun.io.storage import as_path

__all__ = ["CheckpointView", "open_checkpoint", "find_checkpoint", "checkpoint_step"]

#: the DCP key of a model state key: ``"model."`` (the saved entry) + ``"model."`` (the user's
#: model inside the run's train model)
_MODEL_PREFIX = "model.model."


@attrs.frozen
class CheckpointView:
    """One checkpoint directory, read-only.

    Attributes:
        path: the checkpoint directory (local, or an object-store path).
        meta: its ``meta.json``: step, epoch, world size, run id, config, plugins, ...
    """

    path: Path
    meta: Mapping[str, Any]

    @property
    def step(self) -> int:
        """The training step it was saved at."""
        return int(self.meta["step"])

    @property
    def run_id(self) -> str:
        """The run that wrote it (its model dir's marker); empty for a checkpoint written
        before checkpoints recorded their run."""
        run_id = self.meta.get("run_id")
        return run_id if isinstance(run_id, str) else ""

    @property
    def world_size(self) -> int | None:
        """How many ranks wrote it."""
        size = self.meta.get("world_size")
        return int(size) if isinstance(size, int) else None

    @property
    def config(self) -> Mapping[str, Any]:
        """The config it was trained with (the TOML tables as read, overrides applied)."""
        config = self.meta.get("config")
        return config if isinstance(config, Mapping) else {}

    def marker_sha256(self) -> str:
        """SHA-256 of its completion marker, which records its manifest's hash: what an output
        made from it records to name exactly this checkpoint."""
        from tzrun.runner.manifest import MARKER

        return hashlib.sha256((as_path(self.path) / MARKER).read_bytes()).hexdigest()

    def verify(self, *, hashes: bool | None = None, collective: bool = False, state_while_reading: bool = False) -> None:
        """Check every file against the manifest (``hashes``: SHA-256 too; default as
        ``TZRUN_CHECKPOINT_VERIFY`` says). ``collective``: share the work with the ranks of the
        process group (every rank must call it); by default this process checks it alone.
        ``state_while_reading``: leave the SHA-256 of the files under ``state/`` to
        :meth:`load_state`, which checks each file as it reads it (one read instead of two:
        for a caller that loads next).

        Raises:
            IncompleteCheckpointError: when its save never finished.
            CheckpointError: when a file is missing, truncated or corrupted (naming it).
        """
        from tzrun.runner.checkpoint import verify_checkpoint

        verify_checkpoint(self.path, hashes=hashes, collective=collective, state_while_reading=state_while_reading)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Each tensor the checkpoint holds (``model.<fqn>``, ``optimizer...``) and its whole
        (unsharded) shape, from DCP's metadata, read safely."""
        return {key: tuple(entry.size) for key, entry in self._entries().items() if hasattr(entry, "size")}

    def tensor_dtypes(self) -> dict[str, Any]:
        """Each tensor's torch dtype (as :meth:`tensor_shapes` lists them)."""
        return {key: entry.properties.dtype for key, entry in self._entries().items() if hasattr(entry, "size")}

    def load_state(self, state: dict[str, Any]) -> None:
        """Fill ``state`` (DCP keys -> tensors of the right shapes, or ``Stateful`` objects) from
        the checkpoint on this process, with no process group: whole tensors, whatever number
        of ranks wrote it. Each file under ``state/`` it reads is checked against the manifest
        as it is read (size and SHA-256; sizes only with ``TZRUN_CHECKPOINT_VERIFY=size``).

        Raises:
            CheckpointError: for a key it does not hold, a damaged file (naming it), or a value
                that would run code.
        """
        from tzrun.runner.checkpoint import verified_reads
        from tzrun.runner.dcp_storage import load_state

        path = as_path(self.path)
        with warnings.catch_warnings():  # DCP notes that it loads on one process: that is the point here
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            load_state(path / "state", state, no_dist=True, **verified_reads(path))

    def load_value(self, key: str) -> dict[str, Any]:
        """The non-tensor state saved under ``key`` (``"update"``: the dense update's state,
        EMA averages included; ``"stages"``; ...), read with ``torch.load(weights_only=True)``."""
        from tzrun.runner.checkpoint_blobs import Blob

        value: dict[str, Any] = {}
        self.load_state({key: Blob(dict, value.update)})
        return value

    def config_differences(self, config: Mapping[str, Any]) -> list[str]:
        """The differences between ``config`` (TOML tables, as read) and the config this
        checkpoint was trained with, in the sections that decide its tensors (``[model]``,
        ``[features]``), one line each with its TOML path; empty when they match."""
        from tzrun.runner.records import config_differences

        return config_differences(self.config, config)

    def model_keys(self, model: Any, cfg: Any) -> dict[str, str]:
        """The DCP key under which this checkpoint holds each state key of ``model``, the user's
        model as its plugin builds it from the run's config ``cfg`` (unsharded):
        ``model.model.<key>``, or, for a table of an embedding collection the run swapped for
        its managed-collision stand-in (``zch``, docs/zch.md), the stand-in's key."""
        from tzrun.runner.zch_layout import swapped_keys

        return {k: _MODEL_PREFIX + v for k, v in swapped_keys(model, cfg).items()}

    def zch_remaps(self, model: Any, cfg: Any) -> dict[tuple[str, str], Any]:
        """``(collection, table) -> ZchRemap`` (an ``nn.Module``: raw ids -> rows, as the run
        looked them up) of each ``zch`` table of ``model`` (as :meth:`model_keys`), loaded
        from this checkpoint: its whole id-to-row map, whatever number of ranks wrote it.

        Raises:
            CheckpointError: when the checkpoint holds no map for one of them.
        """
        import torch

        from tzrun.runner.zch_layout import ZchRemap, managed_tables

        tables = managed_tables(model, cfg)
        shapes = self.tensor_shapes()
        missing = [t.table for t in tables if _MODEL_PREFIX + t.raw_ids_key not in shapes]
        if missing:
            raise CheckpointError(f"{self.path}: holds no id-to-row map of the zch table(s) {', '.join(missing)}: it "
                                  "was not written with this config's zch features; use the config it was trained with")
        state = {_MODEL_PREFIX + k: torch.empty(shapes[_MODEL_PREFIX + k], dtype=torch.int64)
                 for t in tables for k in (t.raw_ids_key, t.rows_key)}
        self.load_state(state)
        return {(t.collection, t.table): ZchRemap(state[_MODEL_PREFIX + t.raw_ids_key], state[_MODEL_PREFIX + t.rows_key],
                                                   self.world_size or 1) for t in tables}

    def _entries(self) -> Mapping[str, Any]:
        from tzrun.runner.dcp_metadata import read_metadata

        name = as_path(self.path) / "state" / ".metadata"
        with name.open("rb") as f:
            return read_metadata(f, str(name)).state_dict_metadata  # type: ignore[no-any-return]


def open_checkpoint(path: str | Path) -> CheckpointView:
    """The checkpoint directory at ``path`` (local or a URL).

    Raises:
        IncompleteCheckpointError: when its save never finished (no completion marker).
        CheckpointError: when its ``meta.json`` cannot be read.
    """
    from tzrun.errors import IncompleteCheckpointError
    from tzrun.runner.checkpoint import is_complete, read_meta

    path = as_path(path)
    if not is_complete(path):
        raise IncompleteCheckpointError(f"{path}: not a complete checkpoint (no completion marker)")
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path / 'meta.json'}: cannot be read ({error}): not a complete checkpoint") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise CheckpointError(f"{path / 'meta.json'}: names no step: not a checkpoint of tzrec-run")
    return CheckpointView(path, meta)


def find_checkpoint(model_dir: str | Path, which: str) -> CheckpointView:
    """The checkpoint that ``which`` names in ``model_dir``, as ``--checkpoint`` does:
    ``latest`` (the newest complete one), ``best`` (``best.json``), ``step-N``, or a path.

    Raises:
        CheckpointError: when there is no such checkpoint (with what to do instead).
        IncompleteCheckpointError: when the directory's save never finished.
    """
    from tzrun.runner.checkpoint_eval import resolve_checkpoint

    return open_checkpoint(resolve_checkpoint(as_path(model_dir), which))


def checkpoint_step(path: str | Path) -> int | None:
    """The step of a ``step-N`` directory name, or None for another name."""
    from tzrun.runner import checkpoint

    return checkpoint.checkpoint_step(as_path(path))
