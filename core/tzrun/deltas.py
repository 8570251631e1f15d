"""Incremental embedding dumps: the files the ``embedding_deltas`` stage writes, and applying
them to a base (a checkpoint's tables) to get the tables at a later step.

Layout, under the stage's directory (``model_dir/embedding_deltas`` by default)::

    step-S/rank-R.pt      what rank R holds of the rows changed since the previous dump:
                          torch.save of plain data (loads with weights_only=True):
                          {"tables": {FQN: [{"ids": int64[n], "col_offset": int, "rows": [n, w]}]},
                           "full": {FQN: [num_rows, dim]}}   (tables kept whole: data-parallel)
    step-S/manifest.json  step, previous (the dump before it, 0 for the start of training),
                          world size, every table's FQN and shape, every file's size and SHA-256
    step-S/COMPLETE       written last; a dump without it is never applied

A table is named by its key in the model's state dict (``model.deep_ebc.embedding_bags.cat_0_emb.weight``);
its entry in a checkpoint is ``"model." + FQN``. Dump S holds every row changed in steps
``(previous, S]``, so tables at step B plus the dumps after B (the first with ``previous <= B``,
each next one continuing the last) are the tables at the last dump's step, bit for bit.

Torch only: a serving process applies deltas without TorchRec or tzrec-run's training stack.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from tzrun.errors import CheckpointError
from tzrun.io.files import write_atomic
from tzrun.io.storage import as_path, remove_tree

__all__ = ["MANIFEST", "MARKER", "DeltaDumps", "dump_dir", "write_part", "publish_dump", "list_dumps", "read_dump",
           "apply_deltas", "checkpoint_tables", "remove_dumps_after"]

MANIFEST = "manifest.json"
MARKER = "COMPLETE"
_STEP = re.compile(r"^step-(\d+)$")


def dump_dir(root: str | Path, step: int) -> Path:
    """The directory of the dump of ``step`` under ``root``."""
    return as_path(root) / f"step-{step}"


def write_part(path: Path, rank: int, tables: Mapping[str, Sequence[Mapping[str, Any]]], full: Mapping[str, Any]) -> None:
    """Write rank ``rank``'s part of a dump into ``path`` (a dump's directory)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({"tables": {k: list(v) for k, v in tables.items()}, "full": dict(full)}, buffer)
    path.mkdir(parents=True, exist_ok=True)
    write_atomic(path / f"rank-{rank}.pt", buffer.getvalue())


def publish_dump(path: Path, step: int, previous: int, world_size: int, shapes: Mapping[str, Sequence[int]]) -> None:
    """Write the manifest, then the marker, of the dump at ``path`` (once every rank wrote its part)."""
    files = []
    for rank in range(world_size):
        data = (path / f"rank-{rank}.pt").read_bytes()
        files.append({"path": f"rank-{rank}.pt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = json.dumps({"step": step, "previous": previous, "world_size": world_size,
                           "tables": {k: list(v) for k, v in shapes.items()}, "files": files}, indent=2).encode()
    write_atomic(path / MANIFEST, manifest)
    write_atomic(path / MARKER, json.dumps({"step": step, "manifest_sha256": hashlib.sha256(manifest).hexdigest()}).encode())


def list_dumps(root: str | Path) -> list[tuple[int, Path]]:
    """The complete dumps under ``root``, oldest first."""
    root = as_path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), child) for child in root.iterdir() if (m := _STEP.match(child.name))]
    return sorted((step, path) for step, path in found if (path / MARKER).exists())


def remove_dumps_after(root: str | Path, step: int) -> list[Path]:
    """Delete the dumps of steps after ``step``, complete or not (a run resumed from the
    checkpoint of ``step`` writes them again); returns what was removed."""
    root = as_path(root)
    removed = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP.match(child.name)
            if match and int(match.group(1)) > step:
                remove_tree(child)
                removed.append(child)
    return removed


def read_dump(path: str | Path) -> dict[str, Any]:
    """One complete dump: its manifest, with ``"parts"`` (each rank's part) added.

    Raises:
        CheckpointError: when it is incomplete, or a file does not match the manifest.
    """
    import io

    import torch

    path = as_path(path)
    if not (path / MARKER).exists():
        raise CheckpointError(f"{path}: not a complete embedding dump (no {MARKER}); it is never applied")
    raw = (path / MANIFEST).read_bytes()
    marker = json.loads((path / MARKER).read_text())
    if marker.get("manifest_sha256") != hashlib.sha256(raw).hexdigest():
        raise CheckpointError(f"{path / MANIFEST}: does not match {MARKER}: the dump is damaged")
    manifest = json.loads(raw)
    parts = []
    for entry in manifest["files"]:
        data = (path / entry["path"]).read_bytes()
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CheckpointError(f"{path / entry['path']}: does not match {MANIFEST}: the dump is damaged")
        parts.append(torch.load(io.BytesIO(data), weights_only=True))
    return {**manifest, "parts": parts}


def apply_deltas(base: Mapping[str, Any], root: str | Path, base_step: int, upto: int | None = None) -> tuple[dict[str, Any], int]:
    """The tables at the last dump under ``root`` (or the last at or before ``upto``): ``base``
    (each table's FQN -> tensor at step ``base_step``; copied, not changed) with every dump after
    ``base_step`` applied in order.

    Returns:
        ``(tables, step)``: the tables and the step they are at (``base_step`` when no dump follows).

    Raises:
        CheckpointError: when the dumps do not cover every step after ``base_step`` (a dump is
            missing, or the first one starts after it), a table is missing from ``base``, or a
            dump is damaged.
    """
    tables = {name: tensor.clone() for name, tensor in base.items()}
    at = base_step
    for step, path in list_dumps(root):
        if step <= base_step or (upto is not None and step > upto):
            continue
        dump = read_dump(path)
        if dump["previous"] > at:
            raise CheckpointError(f"{path}: holds the rows changed after step {dump['previous']}, but the tables are at "
                                  f"step {at}: the dumps between are missing; start from a later base")
        for part in dump["parts"]:
            _apply_part(tables, part, path)
        at = step
    return tables, at


def _apply_part(tables: dict[str, Any], part: Mapping[str, Any], path: Path) -> None:
    for name, pieces in part["tables"].items():
        if name not in tables:
            raise CheckpointError(f"{path}: table {name!r} is not in the base (tables: {', '.join(sorted(tables))})")
        table = tables[name]
        for piece in pieces:
            rows = piece["rows"]
            c0 = int(piece["col_offset"])
            table[piece["ids"], c0:c0 + rows.shape[1]] = rows.to(table.dtype)
    for name, whole in part["full"].items():
        if name not in tables:
            raise CheckpointError(f"{path}: table {name!r} is not in the base (tables: {', '.join(sorted(tables))})")
        tables[name].copy_(whole)


class DeltaDumps:
    """The dumps under one directory, as a stage writes them (public: ``tzrun.DeltaDumps``).

    Args:
        root: the directory (a path or URL; :func:`tzrun.under` makes one relative to the model dir).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = as_path(root)

    def dir(self, step: int) -> Path:
        """The directory of the dump of ``step``."""
        return dump_dir(self.root, step)

    def clear(self, step: int) -> None:
        """Remove what a crashed run left of the dump of ``step`` (before writing it again; one rank)."""
        remove_tree(self.dir(step))

    def write_part(self, step: int, rank: int, tables: Mapping[str, Sequence[Mapping[str, Any]]],
                   full: Mapping[str, Any]) -> None:
        """Write rank ``rank``'s rows of the dump of ``step`` (see the module docstring)."""
        write_part(self.dir(step), rank, tables, full)

    def publish(self, step: int, previous: int, world_size: int, shapes: Mapping[str, Sequence[int]]) -> None:
        """Write the manifest and, last, the marker of the dump of ``step`` (one rank, after every
        rank wrote its part)."""
        publish_dump(self.dir(step), step, previous, world_size, shapes)

    def remove_after(self, step: int) -> list[Path]:
        """Remove the dumps after ``step`` (see :func:`remove_dumps_after`)."""
        return remove_dumps_after(self.root, step)


def checkpoint_tables(checkpoint: str | Path, names: Sequence[str] | None = None) -> tuple[dict[str, Any], int]:
    """The embedding tables of a complete checkpoint, whole, on this process (no process
    group needed): FQN -> tensor, for ``names`` (default: every ``model.*embedding*.weight``
    entry). Returns them with the checkpoint's step.

    Raises:
        CheckpointError: when the checkpoint is incomplete or damaged, or lacks a table.
    """
    import torch

    from tzrun.runner.checkpoint import read_meta, verify_checkpoint
    from tzrun.runner.dcp_storage import read_metadata, load_state

    path = as_path(checkpoint)
    verify_checkpoint(path)
    with (path / "state" / ".metadata").open("rb") as f:
        metadata = read_metadata(f, str(path / "state" / ".metadata"))
    entries = metadata.state_dict_metadata
    if names is None:
        names = [k.removeprefix("model.") for k in entries
                 if k.startswith("model.") and k.endswith(".weight") and (".embedding_bags." in k or ".embeddings." in k)]
    missing = [n for n in names if f"model.{n}" not in entries]
    if missing:
        raise CheckpointError(f"{path}: holds no table {missing[0]!r}")
    state = {f"model.{n}": torch.empty(tuple(entries[f"model.{n}"].size), dtype=entries[f"model.{n}"].properties.dtype)
             for n in names}
    load_state(path / "state", state, no_dist=True)
    return {n: state[f"model.{n}"] for n in names}, int(read_meta(path)["step"])
