"""The Python face of an export: raw rows in, the model's outputs out.

:class:`Predictor` reads an export's manifest, turns raw columns into the program's inputs with
the core's own feature code (the same that made the training batches: hashing, vocabularies,
boundaries, dense fill/log1p/standardization, ``data.on_bad_row``), and runs the program that
``torch.export.load`` gives back. It is what ``tzrec-run predict --export`` uses and what a
Python serving process imports::

    from tzrun_serving import Predictor

    predictor = Predictor("runs/ctr/exports")       # follows its `latest`; or a version directory
    scores = predictor.predict({"int_0": [3.0, None], "cat_0": [17, 4], ...})
    scores["probs"]                                  # numpy float32, one per row, in order
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np
import pyarrow as pa

from tzrun import DenseFeature, EmbeddingTable, SequenceGroup, SparseFeature, as_path
from tzrun.errors import CheckpointError, TzrunError
from tzrun_serving.manifest import read_manifest, read_program

__all__ = ["Predictor", "Scored", "resolve_export"]

_ROW = "__tzrun_row__"  # the input row index, carried through the batch builder as a group key
LATEST = "latest"
_VERSION = re.compile(r"step-\d+")


@attrs.frozen
class Scored:
    """What :meth:`Predictor.score` returns.

    Attributes:
        outputs: each output of the program, one row per scored row (numpy float32).
        rows: the input row index of each scored row (int64; all rows unless some were bad).
        skipped: the rows left out under ``on_bad_row="skip"``, and why
            (:class:`tzrun.batching.SkippedRows`).
    """

    outputs: dict[str, np.ndarray]
    rows: np.ndarray
    skipped: Any


def resolve_export(path: str | Path) -> Path:
    """The export directory ``path`` names: a complete export, or a directory of versions
    whose ``latest`` file names one (see :mod:`tzrun_serving.publish`).

    Raises:
        CheckpointError: when ``latest`` names anything but a ``step-N`` version directly in ``path``.
    """
    path = as_path(path)
    pointer = path / LATEST
    if pointer.exists() and not (path / "manifest.json").exists():
        name = pointer.read_bytes()[:256].decode("utf-8", "replace").strip()
        if not _VERSION.fullmatch(name):
            raise CheckpointError(f"{pointer}: names {name!r}, not a version (step-N) of {path}: damaged or not written "
                                  "by tzrec-run; nothing was loaded")
        return path / name
    return path


class Predictor:
    """Scores raw rows with an export.

    Args:
        export_dir: a complete export (``tzrec-run export --out``), or a directory of versions
            with a ``latest`` pointer (the best-model exports of training); local or a URL.
        program: which program to run (``"model"``; a retrieval model's ``"user_tower"`` or
            ``"item_tower"``); default: the only one, or ``"model"``.
        on_bad_row: ``"error"`` (a bad value raises :class:`~tzrun.errors.DataError` naming the
            column) or ``"skip"`` (bad rows are left out and reported).

    Raises:
        TzrunError: when ``export_dir`` is not a complete export or has no such program.
    """

    def __init__(self, export_dir: str | Path, program: str | None = None, on_bad_row: str = "error") -> None:
        import torch

        self.path = resolve_export(export_dir)
        self.manifest = read_manifest(self.path)
        programs = self.manifest["programs"]
        if program is None:
            program = next(iter(programs)) if len(programs) == 1 else "model"
        if program not in programs:
            raise TzrunError(f"{self.path}: no program {program!r} (programs: {', '.join(programs)})")
        self.program = program
        self.spec = programs[program]
        self.inputs = [i["name"] for i in self.spec["inputs"]]
        self.outputs = [o["name"] for o in self.spec["outputs"]]
        data = read_program(self.path, self.manifest, program)
        try:
            self.exported = torch.export.load(io.BytesIO(data))
        except Exception as error:  # checked already: what is left is a program this torch cannot read
            first = " ".join(str(error).split())[:200]
            raise CheckpointError(f"{self.path / self.spec['file']}: torch {torch.__version__} cannot load this program "
                                  f"({type(error).__name__}: {first}); export it again with this version") from None
        self._module = self.exported.module()
        self._builder = _builder(self.manifest, self.spec["features"], on_bad_row)

    def per_row_outputs(self) -> list[str]:
        """The program's outputs of one value per row (shape ``["batch"]`` or ``["batch", 1]`` in
        the manifest; in a manifest without shapes, the probabilities and logits)."""
        def one_per_row(o: Mapping[str, Any]) -> bool:
            if "shape" in o:
                return o["shape"] in (["batch"], ["batch", 1])
            return o["kind"] in ("probability", "logit")

        return [o["name"] for o in self.spec["outputs"] if one_per_row(o)]

    def columns(self) -> list[str]:
        """The raw input columns the program's features read (weights included), in order."""
        f = self.manifest["features"]
        wanted = set(self.spec["features"])
        names = [x["column"] for x in f["dense"] if x["name"] in wanted]
        for s in f["sparse"]:
            if s["name"] in wanted:
                names.append(s["column"])
                if s.get("weight_column"):
                    names.append(s["weight_column"])
        names += [x["column"] for g in f.get("sequence", ()) if g["name"] in wanted
                  for x in (*g["features"], *g.get("dense", ()))]
        return list(dict.fromkeys(names))

    def encode(self, data: pa.Table | pa.RecordBatch | Mapping[str, Any], source: str = "<rows>") -> tuple[dict[str, Any], np.ndarray, Any]:
        """The program's inputs for ``data`` (raw columns by name): ``(inputs, rows, skipped)``,
        ``rows`` the input row index of each encoded row.

        Raises:
            DataError: for a missing column, a column of the wrong type, or (``on_bad_row =
                "error"``) a bad value, naming ``source`` and the column.
        """
        import torch

        table = data if isinstance(data, (pa.Table, pa.RecordBatch)) else pa.table(dict(data))
        table = pa.Table.from_batches([table]) if isinstance(table, pa.RecordBatch) else table
        table = table.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
        batch = self._builder(table, source)
        if batch.num_rows == 0:  # every row was bad: the builder's padding row is no row
            return {}, np.zeros(0, np.int64), batch.skipped
        rows = batch.groups[_ROW].numpy()
        sparse = batch.sparse
        keys = sparse.keys()
        inputs: dict[str, Any] = {}
        for name in self.inputs:
            if name == "dense":
                inputs[name] = batch.dense
            elif name == "ids":
                inputs[name] = sparse.values().to(torch.int64)
            elif name == "lengths":
                inputs[name] = sparse.lengths().to(torch.int64).view(len(keys), batch.num_rows)
            elif name == "weights":
                inputs[name] = sparse.weights().to(torch.float32)
        inputs.update(_sequence_inputs(batch.sequence, self.inputs))
        inputs.update({f"sequence_dense/{g}": v for g, v in batch.sequence_dense.items()
                       if f"sequence_dense/{g}" in self.inputs})
        return inputs, rows, batch.skipped

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run the program on encoded ``inputs`` (see :meth:`encode`)."""
        import torch

        with torch.no_grad():
            out = self._module({name: inputs[name] for name in self.inputs})
        return {name: out[name].numpy() for name in self.outputs}

    def score(self, data: pa.Table | pa.RecordBatch | Mapping[str, Any], source: str = "<rows>",
              batch_size: int = 65536) -> Scored:
        """Score ``data`` in batches of ``batch_size`` rows: the outputs of its good rows,
        their row indices and what was skipped."""
        from tzrun.batching import SkippedRows

        table = data if isinstance(data, (pa.Table, pa.RecordBatch)) else pa.table(dict(data))
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.outputs}
        rows: list[np.ndarray] = []
        skipped = SkippedRows()
        for start in range(0, table.num_rows, batch_size):
            inputs, kept, bad = self.encode(table.slice(start, batch_size), source)
            skipped.add(bad)
            if not inputs:
                continue
            rows.append(kept + start)
            for name, value in self.run(inputs).items():
                parts[name].append(value)
        outputs = {name: np.concatenate(v) if v else np.zeros((0,), np.float32) for name, v in parts.items()}
        return Scored(outputs, np.concatenate(rows) if rows else np.zeros(0, np.int64), skipped)

    def predict(self, data: pa.Table | pa.RecordBatch | Mapping[str, Any], batch_size: int = 65536) -> dict[str, np.ndarray]:
        """The outputs for every row of ``data``, in input order (float32; ``[rows]`` for a
        score, ``[rows, dim]`` for an embedding). Under ``on_bad_row="skip"`` a bad row's
        outputs are NaN (see :meth:`score` for which rows and why)."""
        table = data if isinstance(data, (pa.Table, pa.RecordBatch)) else pa.table(dict(data))
        scored = self.score(table, batch_size=batch_size)
        if len(scored.rows) == table.num_rows:
            return scored.outputs
        full = {}
        for name, value in scored.outputs.items():
            out = np.full((table.num_rows, *value.shape[1:]), np.nan, dtype=np.float32)
            out[scored.rows] = value
            full[name] = out
        return full


def _sequence_inputs(sequence: Any, names: list[str]) -> dict[str, Any]:
    """``sequence_lengths`` and each ``sequence_ids/<key>`` of ``names``, from ``batch.sequence``
    (its keys are the program's, in the manifest's order)."""
    import torch

    if "sequence_lengths" not in names:
        return {}
    keys = sequence.keys()
    jagged = sequence.to_dict()
    inputs = {"sequence_lengths": sequence.lengths().to(torch.int64).view(len(keys), sequence.stride())}
    inputs.update({f"sequence_ids/{k}": jagged[k].values().to(torch.int64) for k in keys})
    return inputs


def _sparse_spec(entry: Mapping[str, Any]) -> SparseFeature:
    """An id feature of the manifest as the core's spec."""
    fields = {k: v for k, v in entry.items() if k not in ("num_embeddings", "oov_id", "unpooled")}
    for key in ("vocab", "boundaries"):
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    return SparseFeature(**fields)


def _builder(manifest: Mapping[str, Any], features: list[str], on_bad_row: str) -> Any:
    """The core's batch builder for the manifest's features that a program reads (its
    sequence groups truncated to their ``max_len`` as their ``keep`` says, as in training)."""
    from tzrun.batching import batch_builder

    wanted = set(features)
    f = manifest["features"]
    dense = tuple(DenseFeature(**d) for d in f["dense"] if d["name"] in wanted)
    entries = [s for s in f["sparse"] if s["name"] in wanted]
    sparse = tuple(_sparse_spec(s) for s in entries)
    unpooled = tuple(s["name"] for s in entries if s.get("unpooled"))
    tables = tuple(EmbeddingTable(s.name, s.num_embeddings, 0, (s.name,), s.pooling, bool(f["weighted"]))
                   for s in sparse if s.name not in unpooled)
    groups = tuple(SequenceGroup(g["name"], g["max_len"], tuple(_sparse_spec(e) for e in g["features"]), tuple(g["query"]),
                                 g.get("keep", "last"), tuple(DenseFeature(**d) for d in g.get("dense", ())))
                   for g in f.get("sequence", ()) if g["name"] in wanted)
    sequence_tables = (EmbeddingTable("unpooled", 1, 0, unpooled),) if unpooled else ()
    return batch_builder(dense, sparse, tables, groups, sequence_tables, group_by=(_ROW,), on_bad_row=on_bad_row)
