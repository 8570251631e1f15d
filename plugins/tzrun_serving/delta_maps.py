"""The id-to-row maps of ``zch`` tables in embedding delta dumps (format ``tzrun-deltas/2``):
what a dump holds of them, its checks, and applying them to a checkpoint's map.

A ``zch`` table's map (docs/zch.md) is saved as two tensors of the whole table, slice after
slice (one slice per rank that wrote it): ``<map>._mch_sorted_raw_ids`` (each slice's raw ids,
sorted, ``2**63 - 1`` in a slot that holds no id) and ``<map>._mch_remapped_ids_mapping`` (the
row each holds). A dump names each map by ``<map>``, the key of its managed-collision module in
the model's state dict, and holds, for the rows whose id changed since the previous dump (an
id admitted, an evicted row given to another id) and the rows looked up, the raw id each row
holds now::

    manifest: "maps": {MAP: {"table": TABLE_FQN, "rows": int}}
    rank-R.pt: "maps": {MAP: [{"rows": int64[n], "raw_ids": int64[n]}]}

Applying writes those entries into ``raw id by row`` (one raw id per row) and sorts each slice
again, as TorchRec keeps it (stable: the rows holding no id stay in row order), so a base plus
its dumps is the later checkpoint's map tensor for tensor. Torch only, like
:mod:`tzrun_serving.deltas`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from tzrun.errors import CheckpointError

__all__ = ["RAW_IDS", "ROWS", "EMPTY", "map_keys", "is_map_key", "ids_by_row", "sorted_map", "check_map_manifest",
           "check_map_part", "check_map_pieces", "apply_map_piece", "check_applied_map", "apply_dump_maps", "write_maps"]

RAW_IDS = "._mch_sorted_raw_ids"
ROWS = "._mch_remapped_ids_mapping"
#: the raw id of a slot that holds no id (TorchRec's)
EMPTY = 2**63 - 1


def map_keys(name: str) -> tuple[str, str]:
    """The two tensors of map ``name``: its sorted raw ids and the row each holds."""
    return name + RAW_IDS, name + ROWS


def is_map_key(key: str) -> bool:
    """Whether ``key`` (a checkpoint or state-dict key) is one of a ``zch`` map's two tensors."""
    return key.endswith(RAW_IDS) or key.endswith(ROWS)


def ids_by_row(raw_ids: Any, rows: Any) -> Any:
    """The raw id each row holds (``EMPTY`` where none), from a map's two tensors."""
    import torch

    out = torch.full((rows.numel(),), EMPTY, dtype=torch.int64)
    out[rows.long()] = raw_ids.long()
    return out


def sorted_map(by_row: Any, slices: int) -> tuple[Any, Any]:
    """A map's two tensors from the raw id of each row, ``slices`` slices of equal rows, each
    sorted by raw id (stable: the rows holding no id in row order)."""
    import torch

    size = by_row.numel() // slices
    raw, rows = [], []
    for k in range(slices):
        part = by_row[k * size:(k + 1) * size]
        order = torch.argsort(part, stable=True)
        raw.append(part[order])
        rows.append(order + k * size)
    return torch.cat(raw), torch.cat(rows)


def check_map_manifest(where: Path, manifest: Mapping[str, Any], damaged: str) -> None:
    """A ``tzrun-deltas/2`` manifest's ``maps``: each names a table of the dump, of as many rows."""
    maps = manifest.get("maps")
    tables = manifest["tables"]
    if not isinstance(maps, dict):
        raise CheckpointError(f"{where}: \"maps\" is not {{MAP: {{table, rows}}}}: {damaged}")
    for name, entry in maps.items():
        if not (isinstance(entry, dict) and entry.get("table") in tables and isinstance(entry.get("rows"), int)
                and entry["rows"] == tables[entry["table"]][0]):
            raise CheckpointError(f"{where}: map {name!r} does not name a table of the dump and its rows: {damaged}")


def check_map_part(fail: Any, part: Mapping[str, Any]) -> None:
    """The ``maps`` of a dump's part (absent in ``tzrun-deltas/1``): lists of ``{rows, raw_ids}``;
    ``fail(what)`` makes the error."""
    import torch

    maps = part.get("maps", {})
    if not isinstance(maps, dict):
        raise fail("\"maps\" is not a dict")
    for name, pieces in maps.items():
        if not isinstance(pieces, list) or not all(
                isinstance(p, dict) and isinstance(p.get("rows"), torch.Tensor) and isinstance(p.get("raw_ids"), torch.Tensor)
                for p in pieces):
            raise fail(f"map {name!r} is not a list of {{\"rows\": tensor, \"raw_ids\": tensor}}")


def check_map_pieces(file: Path, part: Mapping[str, Any], maps: Mapping[str, Any]) -> None:
    """Each map piece of a part: a map of the manifest; rows 1-D integers in ``[0, rows)``, none
    repeated; one raw id per row, each in ``[0, 2**63 - 1]``.

    Raises:
        CheckpointError: naming the file, the map and what is wrong.
    """
    import torch

    for name, pieces in part.get("maps", {}).items():
        if name not in maps:
            raise CheckpointError(f"{file}: map {name!r} is not in the manifest's \"maps\"")
        for i, piece in enumerate(pieces):
            where, rows, raw = f"{file}: map {name!r}, piece {i}", piece["rows"], piece["raw_ids"]
            for what, tensor in (("rows", rows), ("raw_ids", raw)):
                if tensor.dim() != 1 or tensor.dtype != torch.int64:
                    raise CheckpointError(f"{where}: {what} are a {tensor.dtype} tensor of {list(tensor.shape)}, not 1-D int64")
            if raw.numel() != rows.numel():
                raise CheckpointError(f"{where}: {raw.numel()} raw ids for {rows.numel()} rows (one raw id per row)")
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= maps[name]["rows"]):
                raise CheckpointError(f"{where}: a row outside [0, {maps[name]['rows']})")
            if torch.unique(rows).numel() != rows.numel():
                raise CheckpointError(f"{where}: repeats rows (each row's id is written once)")
            if raw.numel() and int(raw.min()) < 0:
                raise CheckpointError(f"{where}: raw id {int(raw.min())} is negative")


def apply_map_piece(by_row: Any, piece: Mapping[str, Any]) -> None:
    """Write one piece's raw ids into ``by_row`` (the raw id of each row), in place."""
    by_row[piece["rows"].long()] = piece["raw_ids"].long()


def check_applied_map(where: Path, name: str, by_row: Any, slices: int) -> None:
    """A map after a dump: no raw id held by two rows, each held by a row of the slice that
    manages it (``raw_id // ceil((2**63 - 1) / slices)``), and each slice's last row (its miss
    row) holding none.

    Raises:
        CheckpointError: naming the dump and the map.
    """
    import torch

    size = by_row.numel() // slices
    held = by_row != EMPTY
    ids, rows = by_row[held], torch.nonzero(held).flatten()
    block = (EMPTY + slices - 1) // slices
    if torch.unique(ids).numel() != ids.numel():
        raise CheckpointError(f"{where}: map {name!r}: a raw id would be held by two rows: the dump does not fit the base")
    if bool((torch.div(ids, block, rounding_mode="floor") != torch.div(rows, size, rounding_mode="floor")).any()):
        raise CheckpointError(f"{where}: map {name!r}: a raw id would be held by a row of another slice than the one "
                              f"that manages it ({slices} slices): the dump does not fit the base")
    if bool(held[size - 1::size].any()):
        raise CheckpointError(f"{where}: map {name!r}: a slice's miss row (its last) would hold an id: the dump does not "
                              "fit the base")


def apply_dump_maps(maps: dict[str, tuple[Any, int]], tables: Mapping[str, Any], dump: Mapping[str, Any], path: Path) -> None:
    """Apply a dump's zch map entries to ``maps`` (each map's raw id by row, and its slices),
    starting each from the base's map (``tables``' two tensors of it) the first time.

    Raises:
        CheckpointError: when the base has no such map, or the map after the dump is not one.
    """
    for name in dump.get("maps", {}):
        if name not in maps:
            raw, rows = map_keys(name)
            if raw not in tables or rows not in tables:
                raise CheckpointError(f"{path}: zch map {name!r} is not in the base (its {raw} and {rows}): read the "
                                      "base with checkpoint_tables(), which reads the maps too")
            maps[name] = (ids_by_row(tables[raw], tables[rows]), dump["world_size"])
        by_row = maps[name][0]
        for part in dump["parts"]:
            for piece in part.get("maps", {}).get(name, []):
                apply_map_piece(by_row, piece)
        check_applied_map(path, name, by_row, dump["world_size"])
        maps[name] = (by_row, dump["world_size"])


def write_maps(maps: Mapping[str, tuple[Any, int]], tables: dict[str, Any]) -> None:
    """Write each map of :func:`apply_dump_maps` back into ``tables`` as its two tensors."""
    for name, (by_row, slices) in maps.items():
        tables[name + RAW_IDS], tables[name + ROWS] = sorted_map(by_row, slices)
