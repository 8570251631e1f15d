"""``manifest.json`` of an export: what a serving system needs besides the programs.

Format (``"format": "tzrun-export/1"``)::

    {
      "format": "tzrun-export/1",
      "model": "deepfm",
      "checkpoint": {"path": ..., "step": 40, "marker_sha256": ..., "world_size": 2},
      "batch_dim": "dynamic",
      "features": {
        "dense":  [{"name", "column", "fill_value", "log1p", "mean", "std"}],
        "sparse": [{"name", "column", "table", "num_buckets" | "hash_bucket_size" | "vocab" | "boundaries" | "zch_size",
                    "separator", "weight_column", "pooling", "num_embeddings", "unpooled"}],
        "sequence": [{"name", "max_len", "keep", "query": [...], "features": [<as in sparse>],
                      "dense": [<as in dense>]}],
        "weighted": false
      },
      "programs": {"model": {"file": "model.pt2", "features": [...],
                             "inputs": [{"name", "dtype", "shape", "features"}],
                             "outputs": [{"name", "dtype", "kind", "label", "shape"}]}},
      "files": {"model.pt2": "<sha256>"}
    }

A program takes one dict of tensors (in the manifest's order):

* ``dense``: float32 ``[batch, D]``, the program's dense features (``features``) after their
  transforms, in that order (absent when it reads none);
* ``ids``: int64 ``[n]``, every id of the program's id features: feature after feature, and
  within a feature row after row (TorchRec's KeyedJaggedTensor layout);
* ``lengths``: int64 ``[F, batch]``, how many of them each row has, per feature;
* ``weights``: float32 ``[n]``, per-id weights (only in a run where some feature has a
  ``weight_column``: the weight, divided by the row's id count for a ``mean`` feature; 1 for a
  feature without weights).

A ``zch_size`` feature's ids are its 63-bit raw ids (a string hashed with FNV-1a 64, an
integer mixed with splitmix64, see :mod:`tzrun.data.ids`): the program maps them to rows with
the table's id-to-row map (docs/zch.md, Export).

``ids``/``lengths``/``weights`` hold the pooled id features only. The unpooled ones (each
feature of a ``sequence`` group the program reads, then its ``"unpooled": true`` sparse
features: a group's query) come as (only when the program reads some):

* ``sequence_lengths``: int64 ``[K, batch]``, ids per row, per unpooled key (``features``);
* ``sequence_ids/<key>``: int64 ``[n_key]``, that key's ids, row after row. A group's features
  are at most ``max_len`` ids of its column, as the group's ``keep`` says (``"last"``: a longer
  list keeps its last ``max_len``; ``"first"``: its first; ``"all"``: a longer list is a bad row;
  an export without ``keep`` is ``"last"``), transformed like a sparse feature's; the program
  does not truncate.
* ``sequence_dense/<group>``: float32 ``[batch, max_len, k]``, for a group the program reads
  with ``dense`` sequences (its ``[[features.sequence.dense]]``): row ``r`` holds, at position
  ``i`` and column ``j``, the ``i``-th kept value of ``dense[j]``'s column after its transform
  (as a dense feature's), aligned with the group's ids; zeros after a row's length (an export
  without ``dense`` has none).

``batch``, ``n`` and each ``n_key`` are dynamic. Outputs are float32: ``[batch]`` for a score, ``[batch, dim]``
for an embedding, as its ``shape`` says (``"batch"`` the batch dimension: ``["batch"]`` is one
value per row, whatever a batch's size); ``kind`` is ``probability``, ``logit``, ``embedding`` or
``value``, and ``label`` the label a loss trained it against (or null).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from tzrun.errors import CheckpointError

__all__ = ["FORMAT", "MANIFEST", "COMPLETE", "program_inputs", "sequence_keys", "dense_groups", "manifest_of", "read_manifest", "read_program",
           "output_kind"]

FORMAT = "tzrun-export/1"
MANIFEST = "manifest.json"
#: written last; without it the directory is not an export
COMPLETE = "COMPLETE"
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.pt2$")


def sequence_keys(specs: Any, features: Sequence[str]) -> list[str]:
    """The keys of ``batch.sequence`` that a program reading ``features`` (dense, sparse and
    sequence group names) feeds: its groups' features, then its unpooled sparse features."""
    wanted = set(features)
    keys = [f.name for g in specs.sequence_groups if g.name in wanted for f in g.features]
    return keys + [f.name for f in specs.unpooled if f.name in wanted]


def program_inputs(specs: Any, features: Sequence[str]) -> list[dict[str, Any]]:
    """The inputs of a program that reads ``features``, in the order it takes them."""
    wanted = set(features)
    dense = [f.name for f in specs.dense if f.name in wanted]
    sparse = [f.name for f in specs.pooled if f.name in wanted]
    inputs = []
    if dense:
        inputs.append({"name": "dense", "dtype": "float32", "shape": ["batch", len(dense)], "features": dense})
    inputs.append({"name": "ids", "dtype": "int64", "shape": ["ids"], "features": sparse})
    inputs.append({"name": "lengths", "dtype": "int64", "shape": [len(sparse), "batch"], "features": sparse})
    if any(t.weighted for t in specs.tables):
        inputs.append({"name": "weights", "dtype": "float32", "shape": ["ids"], "features": sparse})
    keys = sequence_keys(specs, features)
    if keys:
        inputs.append({"name": "sequence_lengths", "dtype": "int64", "shape": [len(keys), "batch"], "features": keys})
        inputs += [{"name": f"sequence_ids/{k}", "dtype": "int64", "shape": [f"ids/{k}"], "features": [k]} for k in keys]
    inputs += [{"name": f"sequence_dense/{g.name}", "dtype": "float32", "shape": ["batch", g.max_len, len(g.dense)],
                "features": [f.name for f in g.dense]} for g in dense_groups(specs, features)]
    return inputs


def dense_groups(specs: Any, features: Sequence[str]) -> list[Any]:
    """The sequence groups with dense sequences that a program reading ``features`` feeds."""
    wanted = set(features)
    return [g for g in specs.sequence_groups if g.name in wanted and g.dense]


def output_kind(name: str) -> str:
    """``"probability"`` for ``probs``/``probs/<task>``, ``"logit"`` for ``logits``/``logits/<task>``,
    ``"embedding"`` for ``*_embedding``, else ``"value"``."""
    head = name.split("/", 1)[0]
    if head == "probs":
        return "probability"
    if head == "logits":
        return "logit"
    return "embedding" if name.endswith("embedding") else "value"


def manifest_of(facts: Any, programs: Sequence[Any], checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest of an export of ``programs`` (:class:`~tzrun_serving.export.ServingProgram`)."""
    specs = facts.specs
    labels = {s.prediction: s.label for s in (*facts.metric_slots, *facts.loss_slots)}
    unpooled = {f.name for f in specs.unpooled}
    sparse = [{**_sparse_entry(f), "unpooled": f.name in unpooled} for f in specs.sparse]
    sequence = [{"name": g.name, "max_len": g.max_len, "keep": g.keep, "query": list(g.query),
                 "features": [_sparse_entry(f) for f in g.features], "dense": [attrs.asdict(f) for f in g.dense]}
                for g in specs.sequence_groups]
    return {
        "format": FORMAT,
        "model": facts.cfg.model.type,
        "checkpoint": dict(checkpoint),
        "batch_dim": "dynamic",
        "features": {
            "dense": [attrs.asdict(f) for f in specs.dense],
            "sparse": sparse,
            "sequence": sequence,
            "weighted": any(t.weighted for t in specs.tables),
            "hash": "FNV-1a 64 over UTF-8 bytes, modulo hash_bucket_size; integers modulo hash_bucket_size",
        },
        "programs": {
            p.name: {
                "file": f"{p.name}.pt2",
                "features": list(p.features),
                "inputs": program_inputs(specs, p.features),
                "outputs": [{"name": o, "dtype": "float32", "kind": output_kind(o), "label": labels.get(o),
                             **({"shape": list(dict(p.shapes)[o])} if p.shapes else {})} for o in p.outputs],
            }
            for p in programs
        },
    }


def _sparse_entry(f: Any) -> dict[str, Any]:
    """One id feature's transform, as the manifest lists it."""
    entry = {k: v for k, v in attrs.asdict(f).items() if v is not None}
    if "vocab" in entry:
        entry["vocab"] = list(entry["vocab"])
    if "boundaries" in entry:
        entry["boundaries"] = list(entry["boundaries"])
    entry["num_embeddings"] = f.num_embeddings
    entry["oov_id"] = 0 if f.vocab is not None else None
    return entry


def read_manifest(export_dir: Path) -> dict[str, Any]:
    """The manifest of a complete export, checked against its ``COMPLETE`` marker (which
    records the manifest's SHA-256), with every program file named as a plain file of the
    export that the manifest's ``files`` hashes.

    Raises:
        CheckpointError: when ``export_dir`` is not a complete export (no marker), its marker or
            manifest is damaged or of another format, or a program names a file outside it.
    """
    marker = _marker(export_dir)
    try:
        raw = (export_dir / MANIFEST).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise CheckpointError(f"{export_dir / MANIFEST}: missing, though {COMPLETE} is there: the export is damaged; "
                              "export it again (tzrec-run export)") from None
    if hashlib.sha256(raw).hexdigest() != marker["manifest_sha256"]:
        raise CheckpointError(f"{export_dir / MANIFEST}: does not match the SHA-256 that {COMPLETE} records (edited, "
                              "truncated or damaged); export it again (tzrec-run export)")
    try:
        manifest = json.loads(raw)
    except ValueError as error:
        raise CheckpointError(f"{export_dir / MANIFEST}: not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise CheckpointError(f"{export_dir / MANIFEST}: format {found!r}, expected {FORMAT!r}")
    files, programs = manifest.get("files"), manifest.get("programs")
    if not isinstance(files, dict) or not isinstance(programs, dict) or not programs:
        raise CheckpointError(f"{export_dir / MANIFEST}: lists no programs or no file hashes; export it again")
    for name, program in programs.items():
        file = program.get("file") if isinstance(program, dict) else None
        if not isinstance(file, str) or not _FILE.match(file) or file not in files:
            raise CheckpointError(f"{export_dir / MANIFEST}: program {name!r} names the file {file!r}, which is not a "
                                  "hashed .pt2 file of this export; export it again")
    return manifest


def _marker(export_dir: Path) -> dict[str, Any]:
    """The export's ``COMPLETE`` marker: ``{"format", "manifest_sha256"}``."""
    try:
        text = (export_dir / COMPLETE).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise CheckpointError(f"{export_dir}: not a complete export (no {COMPLETE} marker); export again, or use "
                              "another version") from None
    except UnicodeDecodeError:
        text = ""
    try:
        marker = json.loads(text)
    except ValueError:
        marker = None
    digest = marker.get("manifest_sha256") if isinstance(marker, dict) else None
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest) or marker.get("format") != FORMAT:
        raise CheckpointError(f"{export_dir / COMPLETE}: {'empty' if not text.strip() else 'not the marker of an export'} "
                              f"(expected {FORMAT!r} and the manifest's SHA-256); the export is damaged or is not one: "
                              "export it again (tzrec-run export)")
    return dict(marker)


def read_program(export_dir: Path, manifest: Mapping[str, Any], program: str) -> bytes:
    """The bytes of ``program``'s ``.pt2`` file, once they match the manifest's SHA-256 and the
    archive holds nothing that loading could unpickle or run (:func:`~tzrun_serving.archive.check_archive`).
    Load them with ``torch.export.load(io.BytesIO(data))``: nothing is read twice.

    Raises:
        CheckpointError: naming the file and what is wrong.
    """
    from tzrun_serving.archive import ArchiveRefused, check_archive

    file = manifest["programs"][program]["file"]
    path = export_dir / file
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise CheckpointError(f"{path}: missing, though {MANIFEST} lists it: the export is damaged; export it again") from None
    if hashlib.sha256(data).hexdigest() != manifest["files"][file]:
        raise CheckpointError(f"{path}: does not match its SHA-256 in {MANIFEST} (truncated, damaged or replaced); "
                              "export it again (tzrec-run export)")
    try:
        check_archive(data)
    except ArchiveRefused as error:
        raise CheckpointError(f"{path}: refused, nothing in it was loaded: {error}. Only load exports that "
                              "tzrec-run export wrote (tzrec-run help serving: what an export may hold)") from None
    return bytes(data)
