"""Incremental embedding dumps: the files the ``embedding_deltas`` stage writes, and applying
them to a base (a checkpoint's tables) to get the tables at a later step.

Layout, under the stage's directory (``model_dir/embedding_deltas`` by default)::

    step-S/rank-R.pt      what rank R holds of the rows changed since the previous dump:
                          torch.save of plain data (loads with weights_only=True):
                          {"tables": {FQN: [{"ids": int64[n], "col_offset": int, "rows": [n, w]}]},
                           "full": {FQN: [num_rows, dim]},   (tables kept whole: data-parallel)
                           "maps": {MAP: [{"rows": int64[n], "raw_ids": int64[n]}]}}   (zch maps; /2 only)
    step-S/manifest.json  format ("tzrun-deltas/1", or "tzrun-deltas/2" when it holds zch maps), run_id (the run
                          that wrote it: its model dir's run id), step, previous (the dump before it, 0 for the start of
                          training), world size, every table's FQN and shape, (/2) each zch map's table,
                          every file's size and SHA-256
    step-S/COMPLETE       written last; a dump without it is never applied

A table is named by its key in the model's state dict (``model.deep_ebc.embedding_bags.cat_0_emb.weight``);
its entry in a checkpoint is ``"model." + FQN``. Dump S holds every row changed in steps
``(previous, S]``, so tables at step B plus the dumps after B (the first with ``previous <= B``,
each next one continuing the last) are the tables at the last dump's step, bit for bit. A
``zch`` table's id-to-row map travels with its rows (:mod:`tzrun_serving.delta_maps`): the rows
whose id changed are changed rows, and the dump holds the raw id each of its rows holds now.

A dump is data, checked before any of it is applied (:func:`read_dump`, :func:`check_dump`): its
files exactly those of its ranks, each loaded with ``weights_only=True``; ids inside their table;
rows finite, of the shape their ids and the table call for. It applies only to checkpoints of
the run that wrote it (its ``run_id``); the hashes prove integrity against accidents, not who
wrote it.

Torch only: a serving process applies deltas without TorchRec or tzrec-run's training stack.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from tzrun import as_path, write_atomic
from tzrun.checkpoints import open_checkpoint
from tzrun.errors import CheckpointError
from tzrun.outputs import remove_tree
from tzrun_serving import delta_maps

__all__ = ["FORMAT", "FORMATS", "MANIFEST", "MARKER", "DeltaDumps", "dump_dir", "write_part", "publish_dump", "list_dumps",
           "is_dump_dir", "read_dump", "check_dump", "check_deltas_dir", "apply_deltas", "checkpoint_tables", "checkpoint_run_id",
           "remove_dumps_after", "retire_dumps"]

#: The newest ``format`` of the manifests this version writes (a dump without zch maps is
#: written as ``tzrun-deltas/1``, which older readers read too).
FORMAT = "tzrun-deltas/2"
#: The formats this version reads.
FORMATS = ("tzrun-deltas/1", FORMAT)
MANIFEST = "manifest.json"
MARKER = "COMPLETE"
_STEP = re.compile(r"^step-(\d+)$")
_RANK = re.compile(r"^rank-(\d+)\.pt$")
_TEMPORARY = re.compile(r"^\.(manifest\.json|COMPLETE|rank-\d+\.pt)\.tmp$")  # write_atomic's
_DAMAGED = "the dump is damaged"


def dump_dir(root: str | Path, step: int) -> Path:
    """The directory of the dump of ``step`` under ``root``."""
    return as_path(root) / f"step-{step}"


def write_part(path: Path, rank: int, tables: Mapping[str, Sequence[Mapping[str, Any]]], full: Mapping[str, Any],
               maps: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
    """Write rank ``rank``'s part of a dump into ``path`` (a dump's directory); ``maps``: the
    changed entries of each zch map (None for a model without zch tables)."""
    import io

    import torch

    buffer = io.BytesIO()
    part: dict[str, Any] = {"tables": {k: list(v) for k, v in tables.items()}, "full": dict(full)}
    if maps is not None:
        part["maps"] = {k: list(v) for k, v in maps.items()}
    torch.save(part, buffer)
    path.mkdir(parents=True, exist_ok=True)
    write_atomic(path / f"rank-{rank}.pt", buffer.getvalue())


def publish_dump(path: Path, step: int, previous: int, world_size: int, shapes: Mapping[str, Sequence[int]], *,
                 run_id: str, maps: Mapping[str, str] | None = None) -> None:
    """Write the manifest, then the marker, of the dump at ``path`` (once every rank wrote its
    part); ``run_id``: the run writing it (:attr:`tzrun.RunContext.run_id`); ``maps``: each zch
    map's table (a ``tzrun-deltas/2`` dump; None writes ``tzrun-deltas/1``)."""
    files = []
    for rank in range(world_size):
        data = (path / f"rank-{rank}.pt").read_bytes()
        files.append({"path": f"rank-{rank}.pt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    content: dict[str, Any] = {"format": FORMATS[0] if maps is None else FORMAT, "run_id": run_id, "step": step,
                               "previous": previous, "world_size": world_size,
                               "tables": {k: list(v) for k, v in shapes.items()}, "files": files}
    if maps is not None:
        content["maps"] = {name: {"table": table, "rows": int(shapes[table][0])} for name, table in maps.items()}
    manifest = json.dumps(content, indent=2).encode()
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


def is_dump_dir(path: str | Path) -> bool:
    """Whether ``path`` is a dump's directory, complete or partly written: named ``step-N`` and
    holding a dump's files (manifest, marker, ``rank-R.pt``, their temporary files) and nothing else."""
    path = as_path(path)
    if not _STEP.match(path.name) or not path.is_dir():
        return False
    names = [child.name for child in path.iterdir()]
    return bool(names) and all(n in (MANIFEST, MARKER) or _RANK.match(n) or _TEMPORARY.match(n) for n in names)


def retire_dumps(root: str | Path) -> tuple[list[tuple[Path, str]], list[Path]]:
    """Remove every dump under ``root``: what a run starting at step 0 finds there is an earlier
    run's (a ``dir`` shared between runs) or an earlier attempt's. Only directories
    :func:`is_dump_dir` recognizes are removed, nothing else.

    Returns:
        ``(removed, left)``: each removed dump with the run id its manifest names (``""`` when
        none can be read), and the ``step-N`` entries left because they hold other files.
    """
    root = as_path(root)
    removed: list[tuple[Path, str]] = []
    left: list[Path] = []
    if not root.is_dir():
        return removed, left
    for child in sorted(root.iterdir()):
        if not _STEP.match(child.name):
            continue
        if not is_dump_dir(child):
            left.append(child)
            continue
        removed.append((child, _run_id_of(child)))
        remove_tree(child)
    return removed, left


def _run_id_of(path: Path) -> str:
    try:
        run_id = json.loads((path / MANIFEST).read_bytes()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return ""
    return run_id if isinstance(run_id, str) else ""


def _json(path: Path, raw: bytes) -> Any:
    if not raw.strip():
        raise CheckpointError(f"{path}: empty: {_DAMAGED} (written by an interrupted copy?)")
    try:
        return json.loads(raw)
    except ValueError as error:
        raise CheckpointError(f"{path}: malformed JSON ({error}): {_DAMAGED}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_dump(path: str | Path) -> dict[str, Any]:
    """One complete dump: its manifest, with ``"parts"`` (each rank's part) added. Checks that
    it is whole and well formed; :func:`check_dump` checks its values against a base.

    Raises:
        CheckpointError: when it is incomplete, its marker or manifest is empty, malformed or
            missing, it is another format or names no run, its files are not exactly those of
            its ranks, a file is missing, does not match the manifest or does not hold a part.
    """
    import io

    import torch

    path = as_path(path)
    if not (path / MARKER).exists():
        raise CheckpointError(f"{path}: not a complete embedding dump (no {MARKER}); it is never applied")
    marker = _json(path / MARKER, (path / MARKER).read_bytes())
    if not isinstance(marker, dict) or not isinstance(marker.get("manifest_sha256"), str):
        raise CheckpointError(f"{path / MARKER}: malformed (expected {{\"step\": S, \"manifest_sha256\": HEX}}): {_DAMAGED}")
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"{path / MANIFEST}: missing ({MARKER} names it): {_DAMAGED}")
    raw = (path / MANIFEST).read_bytes()
    if marker["manifest_sha256"] != hashlib.sha256(raw).hexdigest():
        raise CheckpointError(f"{path / MANIFEST}: does not match {MARKER}: {_DAMAGED}")
    manifest = _json(path / MANIFEST, raw)
    _check_manifest(path, manifest)
    parts = []
    for entry in sorted(manifest["files"], key=lambda e: int(e["path"].removeprefix("rank-").removesuffix(".pt"))):
        file = path / entry["path"]
        if not file.is_file():
            raise CheckpointError(f"{file}: missing ({MANIFEST} lists it): {_DAMAGED}")
        data = file.read_bytes()
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CheckpointError(f"{file}: does not match {MANIFEST}: {_DAMAGED}")
        try:
            part = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as error:  # a pickle weights_only refuses, or not a torch file at all
            why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CheckpointError(f"{file}: cannot be read as a dump's part ({why[:200]}): a dump holds tensors and "
                                  "plain values only") from None
        _check_part(file, part)
        parts.append(part)
    return {**manifest, "parts": parts}


def _check_manifest(path: Path, manifest: Any) -> None:
    where = path / MANIFEST
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where}: malformed (not a JSON object): {_DAMAGED}")
    if manifest.get("format") not in FORMATS and "format" in manifest:
        raise CheckpointError(f"{where}: format {manifest['format']!r}, but this tzrec-run reads "
                              f"{' and '.join(map(repr, FORMATS))}")
    run_id = manifest.get("run_id")
    if "format" not in manifest or not isinstance(run_id, str) or not run_id:
        raise CheckpointError(f"{where}: names no run_id (written before dumps recorded their run): cannot tell which "
                              "run's checkpoints it applies to (dumps of this version name their run)")
    step: Any = manifest.get("step")
    previous: Any = manifest.get("previous")
    world_size: Any = manifest.get("world_size")
    named = _STEP.match(path.name)
    if not _is_int(step) or (named and step != int(named.group(1))):
        raise CheckpointError(f"{where}: step {step!r}, but the directory is {path.name}: {_DAMAGED}")
    if not _is_int(previous) or not 0 <= previous < step:
        raise CheckpointError(f"{where}: previous {previous!r} is not a step in [0, {step}): {_DAMAGED}")
    if not _is_int(world_size) or world_size < 1:
        raise CheckpointError(f"{where}: world_size {world_size!r} is not a positive integer: {_DAMAGED}")
    tables = manifest.get("tables")
    if not isinstance(tables, dict) or not all(
            isinstance(s, list) and len(s) == 2 and all(_is_int(n) and n >= 0 for n in s) for s in tables.values()):
        raise CheckpointError(f"{where}: \"tables\" is not {{FQN: [rows, columns]}}: {_DAMAGED}")
    files = manifest.get("files")
    if not isinstance(files, list) or not all(
            isinstance(e, dict) and isinstance(e.get("path"), str) and _is_int(e.get("size"))
            and isinstance(e.get("sha256"), str) for e in files):
        raise CheckpointError(f"{where}: \"files\" is not a list of {{path, size, sha256}}: {_DAMAGED}")
    if manifest["format"] == FORMAT:
        delta_maps.check_map_manifest(where, manifest, _DAMAGED)
    elif "maps" in manifest:
        raise CheckpointError(f"{where}: {FORMATS[0]} holds no \"maps\" ({FORMAT} does): {_DAMAGED}")
    listed = sorted(e["path"] for e in files)
    expected = sorted(f"rank-{r}.pt" for r in range(world_size))
    if listed != expected:
        raise CheckpointError(f"{where}: lists {', '.join(listed) or 'no file'}, but a dump of world size {world_size} "
                              f"has exactly rank-0.pt .. rank-{world_size - 1}.pt: {_DAMAGED}")


def _check_part(file: Path, part: Any) -> None:
    import torch

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{file}: {what}: not a dump's part "
                               f"({{\"tables\": {{FQN: [pieces]}}, \"full\": {{FQN: tensor}}}})")

    if not isinstance(part, dict) or not isinstance(part.get("tables"), dict) or not isinstance(part.get("full"), dict):
        raise fail("not a dict with \"tables\" and \"full\"")
    for name, pieces in part["tables"].items():
        if not isinstance(pieces, list):
            raise fail(f"table {name!r} is not a list of pieces")
        for i, piece in enumerate(pieces):
            if not (isinstance(piece, dict) and isinstance(piece.get("ids"), torch.Tensor)
                    and isinstance(piece.get("rows"), torch.Tensor) and _is_int(piece.get("col_offset"))):
                raise fail(f"table {name!r}, piece {i} is not {{\"ids\": tensor, \"col_offset\": int, \"rows\": tensor}}")
    for name, whole in part["full"].items():
        if not isinstance(whole, torch.Tensor):
            raise fail(f"full table {name!r} is not a tensor")
    delta_maps.check_map_part(fail, part)


def check_dump(dump: Mapping[str, Any], base: Mapping[str, Any], path: str | Path) -> None:
    """Check the values of ``dump`` (read by :func:`read_dump` from ``path``) against the
    tables it is applied to, ``base`` (FQN -> 2-D tensor), before any of it is applied.

    Raises:
        CheckpointError: naming the file, table and what is wrong: a table not in the base or of
            another shape; ids not a 1-D integer tensor, repeated, or outside ``[0, rows)``; rows
            not a 2-D floating tensor of ``(len(ids), w)`` inside the table's columns; a whole
            table not of the table's shape; a NaN or infinite value.
    """
    path = as_path(path)
    shapes = dump["tables"]
    for name, shape in shapes.items():
        if name not in base:
            raise CheckpointError(f"{path}: table {name!r} is not in the base (tables: {', '.join(sorted(base))})")
        if list(base[name].shape) != list(shape):
            raise CheckpointError(f"{path / MANIFEST}: table {name!r} is {list(shape)}, but {list(base[name].shape)} in "
                                  "the base: the dump is of another model")
    for rank, part in enumerate(dump["parts"]):
        file = path / f"rank-{rank}.pt"
        for name, pieces in [*part["tables"].items(), *part["full"].items()]:
            if name not in shapes:
                raise CheckpointError(f"{file}: table {name!r} is not in {MANIFEST}: {_DAMAGED}")
        for name, pieces in part["tables"].items():
            for i, piece in enumerate(pieces):
                _check_piece(f"{file}: table {name!r}, piece {i}", piece, tuple(shapes[name]))
        for name, whole in part["full"].items():
            where = f"{file}: table {name!r} (whole)"
            if not whole.is_floating_point() or list(whole.shape) != list(shapes[name]):
                raise CheckpointError(f"{where}: a {whole.dtype} tensor of {list(whole.shape)}, but the table is "
                                      f"{list(shapes[name])} floating point")
            _check_finite(where, whole)
        delta_maps.check_map_pieces(file, part, dump.get("maps", {}))


def _check_piece(where: str, piece: Mapping[str, Any], shape: tuple[int, int]) -> None:
    import torch

    ids, rows, c0 = piece["ids"], piece["rows"], piece["col_offset"]
    num_rows, width = shape
    if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise CheckpointError(f"{where}: ids are a {ids.dtype} tensor of {list(ids.shape)}, not a 1-D integer tensor")
    if ids.numel():
        low, high = int(ids.min()), int(ids.max())
        if low < 0:
            raise CheckpointError(f"{where}: id {low} is negative (ids are rows in [0, {num_rows}))")
        if high >= num_rows:
            raise CheckpointError(f"{where}: id {high} is out of range: the table has {num_rows} rows")
        if torch.unique(ids).numel() != ids.numel():
            raise CheckpointError(f"{where}: repeats ids (each row is written once)")
    if not rows.is_floating_point() or rows.dim() != 2 or rows.shape[0] != ids.numel():
        raise CheckpointError(f"{where}: rows are a {rows.dtype} tensor of {list(rows.shape)}, but {ids.numel()} ids "
                              "need a 2-D floating tensor of that many rows (one row per id; nothing is broadcast)")
    if c0 < 0 or c0 + rows.shape[1] > width:
        raise CheckpointError(f"{where}: columns {c0}..{c0 + rows.shape[1]} (col_offset {c0}, rows "
                              f"{rows.shape[1]} wide) are outside the table's {width} columns")
    _check_finite(where, rows)


def _check_finite(where: str, values: Any) -> None:
    import torch

    bad = ~torch.isfinite(values)
    if bad.any():
        raise CheckpointError(f"{where}: holds {int(bad.sum())} NaN or infinite value(s): a dump of a run whose "
                              "weights diverged is never applied")


def check_deltas_dir(root: str | Path) -> Path:
    """``root`` as a path, once it is a directory holding at least one ``step-N`` entry.

    Raises:
        CheckpointError: when it is missing, not a directory, or holds no dump.
    """
    root = as_path(root)
    hint = "expected the embedding_deltas stage's dumps (model_dir/embedding_deltas, or the stage's dir)"
    if not root.exists():
        raise CheckpointError(f"{root}: no such directory: {hint}")
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a directory: {hint}")
    if not any(_STEP.match(child.name) for child in root.iterdir()):
        raise CheckpointError(f"{root}: holds no embedding dump (no step-N directory): {hint}")
    return root


def apply_deltas(base: Mapping[str, Any], root: str | Path, base_step: int, upto: int | None = None, *,
                 run_id: str | None = None) -> tuple[dict[str, Any], int]:
    """The tables at the last dump under ``root`` (or the last at or before ``upto``): ``base``
    (each table's FQN -> tensor at step ``base_step``; copied, not changed) with every dump after
    ``base_step`` applied in order, each checked first (:func:`read_dump`, :func:`check_dump`).

    Args:
        run_id: the run of the base (:func:`checkpoint_run_id`): every dump applied must be
            that run's. Without it, the dumps applied must still all be of one run.

    Returns:
        ``(tables, step)``: the tables and the step they are at (``base_step`` when no dump follows).

    Raises:
        CheckpointError: when ``root`` holds no dump, a dump is another run's, the dumps do not
            cover every step after ``base_step`` (a dump is missing, or the first one starts
            after it), or a dump is damaged or does not fit the base (see :func:`check_dump`).
    """
    root = check_deltas_dir(root)
    tables = {name: tensor.clone() for name, tensor in base.items()}
    maps: dict[str, tuple[Any, int]] = {}
    at = base_step
    chain: tuple[Path, str] | None = None  # the last dump applied and its run
    for step, path in list_dumps(root):
        if step <= base_step or (upto is not None and step > upto):
            continue
        dump = read_dump(path)
        if run_id is not None and dump["run_id"] != run_id:
            raise CheckpointError(
                f"{path}: written by run {dump['run_id']}, but the base checkpoint is of run {run_id}: a dump applies only "
                "to checkpoints of the run that wrote it (an earlier run's dumps in a shared dir, or of a run replaced by "
                f"train --overwrite); apply it to a checkpoint of run {dump['run_id']}, or use the dumps of run {run_id}")
        if chain is not None and dump["run_id"] != chain[1]:
            raise CheckpointError(f"{path}: written by run {dump['run_id']}, but {chain[0]} by run {chain[1]}: the dumps "
                                  "of two runs are never applied together")
        if dump["previous"] > at:
            raise CheckpointError(f"{path}: holds the rows changed after step {dump['previous']}, but the tables are at "
                                  f"step {at}: the dumps between are missing; start from a later base")
        check_dump(dump, tables, path)
        for part in dump["parts"]:
            _apply_part(tables, part)
        delta_maps.apply_dump_maps(maps, tables, dump, path)
        at, chain = step, (path, dump["run_id"])
    delta_maps.write_maps(maps, tables)
    return tables, at


def _apply_part(tables: dict[str, Any], part: Mapping[str, Any]) -> None:
    for name, pieces in part["tables"].items():
        table = tables[name]
        for piece in pieces:
            rows = piece["rows"]
            c0 = int(piece["col_offset"])
            table[piece["ids"].long(), c0:c0 + rows.shape[1]] = rows.to(table.dtype)
    for name, whole in part["full"].items():
        tables[name].copy_(whole)


class DeltaDumps:
    """The dumps under one directory, as the ``embedding_deltas`` stage writes them.

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
                   full: Mapping[str, Any], maps: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> None:
        """Write rank ``rank``'s rows of the dump of ``step`` (see the module docstring)."""
        write_part(self.dir(step), rank, tables, full, maps)

    def publish(self, step: int, previous: int, world_size: int, shapes: Mapping[str, Sequence[int]], *,
                run_id: str, maps: Mapping[str, str] | None = None) -> None:
        """Write the manifest and, last, the marker of the dump of ``step`` (one rank, after every
        rank wrote its part); ``run_id``: the run writing it (:attr:`tzrun.RunContext.run_id`),
        whose checkpoints alone it applies to."""
        publish_dump(self.dir(step), step, previous, world_size, shapes, run_id=run_id, maps=maps)

    def remove_after(self, step: int) -> list[Path]:
        """Remove the dumps after ``step`` (see :func:`remove_dumps_after`)."""
        return remove_dumps_after(self.root, step)

    def retire(self) -> tuple[list[tuple[Path, str]], list[Path]]:
        """Remove every dump, before a run starts at step 0 (see :func:`retire_dumps`)."""
        return retire_dumps(self.root)


def checkpoint_tables(checkpoint: str | Path, names: Sequence[str] | None = None) -> tuple[dict[str, Any], int]:
    """The embedding tables of a complete checkpoint, whole, on this process (no process
    group needed): FQN -> tensor, for ``names`` (default: every ``model.*embedding*.weight``
    entry, and each zch table's map: its ``._mch_sorted_raw_ids`` and
    ``._mch_remapped_ids_mapping``). Returns them with the checkpoint's step.

    Raises:
        CheckpointError: when the checkpoint is incomplete or damaged, or lacks a table.
    """
    import torch

    view = open_checkpoint(checkpoint)
    view.verify(state_while_reading=True)  # state/ is checked as load_state reads it
    shapes, dtypes = view.tensor_shapes(), view.tensor_dtypes()
    if names is None:
        names = [k.removeprefix("model.") for k in shapes if k.startswith("model.") and (
            (k.endswith(".weight") and (".embedding_bags." in k or ".embeddings." in k)) or delta_maps.is_map_key(k))]
    missing = [n for n in names if f"model.{n}" not in shapes]
    if missing:
        raise CheckpointError(f"{view.path}: holds no table {missing[0]!r}")
    state = {f"model.{n}": torch.empty(shapes[f"model.{n}"], dtype=dtypes[f"model.{n}"]) for n in names}
    view.load_state(state)
    return {n: state[f"model.{n}"] for n in names}, view.step


def checkpoint_run_id(checkpoint: str | Path) -> str:
    """The run that wrote a checkpoint (its ``meta.json``'s ``run_id``): the dumps of that run
    alone apply to it.

    Raises:
        CheckpointError: when its ``meta.json`` names none (written before checkpoints recorded
            their run) or cannot be read.
    """
    path = as_path(checkpoint)
    try:
        meta = json.loads((path / "meta.json").read_bytes())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path / 'meta.json'}: cannot be read ({error}): not a complete checkpoint") from None
    run_id = meta.get("run_id") if isinstance(meta, dict) else None
    if not isinstance(run_id, str) or not run_id:
        raise CheckpointError(f"{path}: its meta.json names no run_id (written before checkpoints recorded their run): "
                              "cannot tell which run's dumps apply to it; use a checkpoint written by this version")
    return run_id
