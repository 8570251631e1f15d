"""``manifest.json`` of an export: what a serving system needs besides the programs.

Format (``"format": "tzrun-export/1"``)::

    {
      "format": "tzrun-export/1",
      "model": "deepfm",
      "checkpoint": {"path": ..., "step": 40, "marker_sha256": ..., "world_size": 2},
      "batch_dim": "dynamic",
      "features": {
        "dense":  [{"name", "column", "fill_value", "log1p", "mean", "std"}],
        "sparse": [{"name", "column", "table", "num_buckets" | "hash_bucket_size" | "vocab" | "boundaries",
                    "separator", "weight_column", "pooling", "num_embeddings"}],
        "weighted": false
      },
      "programs": {"model": {"file": "model.pt2", "inputs": [{"name", "dtype", "shape", "feature", "kind"}],
                             "outputs": [{"name", "dtype", "shape", "kind", "label"}]}},
      "files": {"model.pt2": "<sha256>"}
    }

An input is a dense feature's ``[batch]`` float32 column (named as the feature), or an id
feature's ``<name>.ids`` (int64 ``[n]``, the row's ids one row after another), ``<name>.lengths``
(int64 ``[batch]``, ids per row) and, in a weighted run, ``<name>.weights`` (float32 ``[n]``).
Programs take one dict of them, in the manifest's order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from tzrun.errors import TzrunError

__all__ = ["FORMAT", "MANIFEST", "COMPLETE", "input_names", "manifest_of", "read_manifest", "output_kind"]

FORMAT = "tzrun-export/1"
MANIFEST = "manifest.json"
#: written last; without it the directory is not an export
COMPLETE = "COMPLETE"


def input_names(specs: Any, features: Sequence[str]) -> list[str]:
    """The inputs of a program that reads ``features``, in order: dense features first (in
    ``features.dense`` order), then each id feature's ``ids``, ``lengths`` (and ``weights``)."""
    wanted = set(features)
    weighted = any(t.weighted for t in specs.tables)
    names = [f.name for f in specs.dense if f.name in wanted]
    for f in specs.sparse:
        if f.name in wanted:
            names += [f"{f.name}.ids", f"{f.name}.lengths"] + ([f"{f.name}.weights"] if weighted else [])
    return names


def output_kind(name: str) -> str:
    """``"probability"`` for ``probs``/``probs/<task>``, ``"logit"`` for ``logits``/``logits/<task>``,
    ``"embedding"`` for ``*_embedding``, else ``"value"``."""
    head = name.split("/", 1)[0]
    if head == "probs":
        return "probability"
    if head == "logits":
        return "logit"
    return "embedding" if name.endswith("embedding") else "value"


def _input(name: str, specs: Any) -> dict[str, Any]:
    dense = {f.name for f in specs.dense}
    if name in dense:
        return {"name": name, "dtype": "float32", "shape": ["batch"], "feature": name, "kind": "dense"}
    feature, _, part = name.rpartition(".")
    dtype = "float32" if part == "weights" else "int64"
    shape = ["batch"] if part == "lengths" else [f"ids({feature})"]
    return {"name": name, "dtype": dtype, "shape": shape, "feature": feature, "kind": part}


def manifest_of(facts: Any, programs: Sequence[Any], checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest of an export of ``programs`` (:class:`~tzrun.serving.export.ServingProgram`)."""
    specs = facts.specs
    labels = {s.prediction: s.label for s in facts.loss_slots}
    sparse = []
    for f in specs.sparse:
        entry = {k: v for k, v in attrs.asdict(f).items() if v is not None}
        if "vocab" in entry:
            entry["vocab"] = list(entry["vocab"])
        if "boundaries" in entry:
            entry["boundaries"] = list(entry["boundaries"])
        entry["num_embeddings"] = f.num_embeddings
        entry["oov_id"] = 0 if f.vocab is not None else None
        sparse.append(entry)
    return {
        "format": FORMAT,
        "model": facts.cfg.model.type,
        "checkpoint": dict(checkpoint),
        "batch_dim": "dynamic",
        "features": {
            "dense": [attrs.asdict(f) for f in specs.dense],
            "sparse": sparse,
            "weighted": any(t.weighted for t in specs.tables),
            "hash": "FNV-1a 64 over UTF-8 bytes, modulo hash_bucket_size; integers modulo hash_bucket_size",
        },
        "programs": {
            p.name: {
                "file": f"{p.name}.pt2",
                "features": list(p.features),
                "inputs": [_input(n, specs) for n in input_names(specs, p.features)],
                "outputs": [{"name": o, "dtype": "float32", "kind": output_kind(o), "label": labels.get(o)}
                            for o in p.outputs],
            }
            for p in programs
        },
    }


def read_manifest(export_dir: Path) -> dict[str, Any]:
    """The manifest of a complete export.

    Raises:
        TzrunError: when ``export_dir`` is not a complete export (no marker) or its manifest is
            of another format.
    """
    if not (export_dir / COMPLETE).exists():
        raise TzrunError(f"{export_dir}: not a complete export (no {COMPLETE} marker); export again, or use "
                         "another version")
    manifest = json.loads((export_dir / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise TzrunError(f"{export_dir / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest
