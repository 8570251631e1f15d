"""``tzrec-run ckpt ls`` and ``ckpt inspect``: what the checkpoints of a model dir hold, read
from their ``meta.json`` and ``manifest.json`` (``ls`` imports no torch), and for ``inspect``
from DCP's ``state/.metadata``, read the one safe way loading reads it
(:func:`tzrun.runner.dcp_storage.storage_reader`): a crafted one is refused, never unpickled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from tzrun.errors import CheckpointError
from tzrun.runner.checkpoint import checkpoint_step, is_complete, read_meta
from tzrun.runner.manifest import MARKER, check_checkpoint
from tzrun.runner.retention import read_best
from tzrun.io.storage import as_path, filesystem

__all__ = ["CheckpointListing", "list_checkpoint_dirs", "trained_epoch", "format_listing", "describe_checkpoint", "format_description"]


@attrs.frozen
class CheckpointListing:
    """One line of ``tzrec-run ckpt ls``.

    Attributes:
        name: the directory name (``step-N``).
        step, world_size: from ``meta.json`` (None when it cannot be read).
        epoch: the epoch (0-based, as the train log and ``metrics.jsonl`` number them) of the
            checkpoint's last trained step (None when ``meta.json`` cannot be read).
        complete: whether the completion marker is there.
        best: whether ``best.json`` names this checkpoint.
        size: bytes of every file in the directory.
    """

    name: str
    step: int
    epoch: int | None
    world_size: int | None
    complete: bool
    best: bool
    size: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        return attrs.asdict(self)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _meta_or_none(path: Path) -> dict[str, Any] | None:
    try:
        return read_meta(path)
    except (OSError, ValueError):
        return None


def _best_step(model_dir: Path) -> int | None:
    try:
        best = read_best(model_dir)
    except (OSError, CheckpointError):  # a damaged best.json: the listing shows no best
        return None
    return checkpoint_step(Path(best.checkpoint)) if best is not None else None


def _files(root: Path) -> dict[str, tuple[str, int]]:
    """Everything under ``root`` by relative path: ``(type, size)``, from one listing (one
    recursive request, paged, on an object store; empty when ``root`` does not exist)."""
    fs, inner = filesystem(root)
    try:
        found = fs.find(inner, withdirs=True, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    base = inner.rstrip("/") + "/"
    return {path[len(base):]: (str(info.get("type")), int(info.get("size") or 0))
            for path, info in found.items() if path.startswith(base)}


def _read_meta(root: Path, name: str) -> dict[str, Any]:
    """A checkpoint's ``meta.json`` in one read (one GET on a store), or {} when it cannot be read."""
    fs, inner = filesystem(root)
    try:
        meta = json.loads(fs.cat_file(f"{inner.rstrip('/')}/{name}/meta.json"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def list_checkpoint_dirs(model_dir: Path) -> list[CheckpointListing]:
    """Every ``step-N`` directory under ``model_dir/checkpoints``, complete or not, oldest first:
    from one listing of ``checkpoints/``, then each checkpoint's ``meta.json`` and, where a
    completion marker is listed, its check (:func:`~tzrun.runner.checkpoint.is_complete`).

    Raises:
        CheckpointError: when ``model_dir`` does not exist.
    """
    model_dir = as_path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: no such model dir")
    root = model_dir / "checkpoints"
    best = _best_step(model_dir)
    dirs: dict[str, int] = {}
    files = _files(root)
    for relative, (kind, size) in files.items():
        name, _, rest = relative.partition("/")
        if checkpoint_step(Path(name)) is not None and (rest or kind == "directory"):
            dirs[name] = dirs.get(name, 0) + (size if kind != "directory" else 0)
    rows = []
    for name, size in dirs.items():
        meta = _read_meta(root, name)
        complete = f"{name}/{MARKER}" in files and is_complete(root / name)
        rows.append(CheckpointListing(name, checkpoint_step(Path(name)) or 0, trained_epoch(meta), meta.get("world_size"),
                                      complete, checkpoint_step(Path(name)) == best, size))
    return sorted(rows, key=lambda r: r.step)


def trained_epoch(meta: dict[str, Any]) -> int | None:
    """The epoch (0-based) of a checkpoint's last trained step, as the train log named it.

    ``meta.json`` records where training resumes: after the last step of epoch 0 that is
    epoch 1, step 0 of it. Listings show the epoch the checkpoint's steps were trained in.
    """
    epoch, data = meta.get("epoch"), meta.get("data")
    if not isinstance(epoch, int):
        return None
    if isinstance(data, dict) and data.get("step_in_epoch") == 0 and epoch > 0:
        return epoch - 1
    return epoch


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError


def format_listing(rows: list[CheckpointListing]) -> str:
    """The table ``tzrec-run ckpt ls`` prints: a header, then one line per checkpoint."""
    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    table = [("CHECKPOINT", "STEP", "EPOCH", "WORLD", "STATE", "SIZE", "")]
    for r in rows:
        table.append((r.name, str(r.step), cell(r.epoch), cell(r.world_size), "complete" if r.complete else "incomplete",
                      _human(r.size), "best" if r.best else ""))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def _sharding(meta: dict[str, Any]) -> dict[str, Any] | None:
    tables = meta.get("sharding")
    if tables is None:
        return None
    by_type: dict[str, int] = {}
    by_kernel: dict[str, int] = {}
    per_rank: dict[str, int] = {}
    for t in tables:
        by_type[t["sharding_type"]] = by_type.get(t["sharding_type"], 0) + 1
        by_kernel[t["compute_kernel"]] = by_kernel.get(t["compute_kernel"], 0) + 1
        for rank in t["ranks"]:
            per_rank[str(rank)] = per_rank.get(str(rank), 0) + 1
    return {"tables": len(tables), "sharding_types": by_type, "compute_kernels": by_kernel,
            "tables_per_rank": dict(sorted(per_rank.items(), key=lambda kv: int(kv[0]))), "detail": tables}


def _data_position(data: dict[str, Any] | None) -> dict[str, Any] | None:
    if data is None:
        return None
    consumed = sum(int(b) - int(a) for a, b in data.get("consumed_rows", []))
    return {"epoch": data.get("epoch"), "step_in_epoch": data.get("step_in_epoch"), "layout": data.get("layout"),
            "consumed_rows": consumed, "total_rows": data.get("total_rows")}


def describe_checkpoint(path: Path, *, hashes: bool = True) -> dict[str, Any]:
    """Everything ``tzrec-run ckpt inspect`` shows, as JSON: step, epoch, world size, sharding
    plan summary, learning rates, data position, plugin set, manifest status, best marker, and
    what ``state/`` holds (read from DCP's metadata when the manifest checks out).

    Raises:
        CheckpointError: when ``path`` is not a directory, or is a model dir (it has
            ``checkpoints/``) rather than one of its checkpoints, or its ``state/.metadata``
            would run code (refused, not unpickled).
    """
    path = as_path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    _refuse_model_dir(path)
    meta = _meta_or_none(path) or {}
    status = check_checkpoint(path, hashes=hashes)
    step = meta.get("step", checkpoint_step(path))
    best = None
    if path.parent.name == "checkpoints":
        try:
            recorded = read_best(path.parent.parent)
        except (OSError, CheckpointError):
            recorded = None
        if recorded is not None and recorded.step == step:
            best = attrs.asdict(recorded)
    return {
        "path": str(path),
        "step": step,
        "epoch": trained_epoch(meta),
        "world_size": meta.get("world_size"),
        "complete": is_complete(path),
        "manifest": status.to_json(),
        "best": best,
        "size": _size(path),
        "learning_rates": meta.get("learning_rates"),
        "data": _data_position(meta.get("data")),
        "sharding": _sharding(meta),
        "plugins": [{k: p.get(k) for k in ("name", "distribution", "version")} for p in meta.get("plugins", [])],
        "config_source": meta.get("config_source"),
        "contents": _contents(path) if status.state == "ok" else None,
    }


def _contents(path: Path) -> dict[str, Any]:
    """How many tensors and other values ``state/`` holds, by top-level entry, from DCP's
    metadata read safely."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from tzrun.runner.dcp_storage import storage_reader

    items = storage_reader(path / "state").read_metadata().state_dict_metadata
    entries = sorted({key.split(".")[0] if not key.startswith("rank.") else "rank.*" for key in items})
    tensors = sum(isinstance(item, TensorStorageMetadata) for item in items.values())
    return {"entries": entries, "tensors": tensors, "values": len(items) - tensors}


def _refuse_model_dir(path: Path) -> None:
    """A model dir given where a checkpoint is expected: say so, with its checkpoints."""
    if not (path / "checkpoints").is_dir() or is_complete(path):
        return
    rows = list_checkpoint_dirs(path)
    complete = [r for r in rows if r.complete]
    if not complete:
        held = "it has no complete checkpoint yet"
    else:
        names = ", ".join(r.name for r in complete[-5:])
        held = f"its complete checkpoints: {'..., ' if len(complete) > 5 else ''}{names}"
    example = path / "checkpoints" / (complete[-1].name if complete else "step-N")
    raise CheckpointError(
        f"{path}: is a model dir, not a checkpoint ({held}); "
        f"list them with `tzrec-run ckpt ls {path}`, or inspect one with `tzrec-run ckpt inspect {example}`"
    )


def _manifest_line(m: dict[str, Any]) -> str:
    state = m["state"]
    if state == "ok":
        how = "sizes and SHA-256" if m["hashed"] else "sizes only"
        return f"ok ({m['files']} files, {_human(m['size'])}; {how} checked)"
    if state == "incomplete":
        return f"not checked: incomplete ({m['problems'][0] if m['problems'] else 'no COMPLETE marker'})"
    return "DAMAGED\n" + "\n".join(f"  {p}" for p in m["problems"])


def format_description(d: dict[str, Any]) -> str:
    """The text ``tzrec-run ckpt inspect`` prints for :func:`describe_checkpoint`'s result."""
    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    lines = [
        f"checkpoint  {d['path']}" + ("  (best)" if d["best"] else ""),
        f"state       {'complete' if d['complete'] else 'incomplete'}, {_human(d['size'])}",
        f"manifest    {_manifest_line(d['manifest'])}",
        f"step        {cell(d['step'])}, epoch {cell(d['epoch'])}, world size {cell(d['world_size'])}",
    ]
    if d["best"]:
        b = d["best"]
        lines.append(f"best        {b['metric']} = {b['value']:.6g} ({b['mode']})")
    data = d["data"]
    if data is not None:
        layout = data.get("layout") or {}
        total = data["total_rows"] if isinstance(data["total_rows"], int) else 0
        lines.append(
            f"data        resumes in epoch {data['epoch']}, {data['step_in_epoch']} step(s) into it; {data['consumed_rows']:,} of "
            f"{total:,} rows of the epoch consumed; layout {cell(layout.get('world_size'))} rank(s) x "
            f"{cell(layout.get('num_workers'))} worker(s), batch {cell(layout.get('batch_size'))}"
        )
    if d["learning_rates"]:
        lines.append("lr          " + ", ".join(f"{k} {v:.6g}" for k, v in d["learning_rates"].items()))
    sharding = d["sharding"]
    if sharding is not None:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(sharding["sharding_types"].items()))
        kernels = ", ".join(f"{k} {n}" for k, n in sorted(sharding["compute_kernels"].items()))
        ranks = ", ".join(f"rank {r}: {n}" for r, n in sharding["tables_per_rank"].items())
        lines.append(f"sharding    {sharding['tables']} tables; {kinds}; kernels {kernels}; {ranks}")
    elif d["step"] is not None and d["complete"]:
        lines.append("sharding    not recorded (see meta.json \"plan\")")
    contents = d.get("contents")
    if contents is not None:
        lines.append(f"contents    {contents['tensors']} tensors, {contents['values']} values: "
                     + ", ".join(contents["entries"]))
    if d["plugins"]:
        lines.append("plugins     " + ", ".join(
            p["name"] + (f" ({p['distribution']} {p['version']})" if p["distribution"] else "") for p in d["plugins"]))
    return "\n".join(lines)
