"""Fine-tuning: start a run from another run's weights (``tzrec-run train --init-from CKPT``).

The model's parameters and buffers are loaded from a complete checkpoint, through
``torch.distributed.checkpoint`` (so the source may have been written by another number of
ranks). Names are those of the model itself (``deep.0.weight``,
``deep_ebc.embedding_bags.cat_0_emb.weight``), as ``tzrec-run ckpt inspect`` and
``tzrec-run check --params`` show them. A map file renames: each line is ``NEW_NAME OLD_NAME``
(whitespace-separated, ``#`` starts a comment), TorchEasyRec's ``fine_tune_ckpt_param_map``
format.

Strict by default: a parameter of the model that the checkpoint lacks (missing), or a
checkpoint parameter the model does not use (unexpected), is an error, unless the user allows it
by name (``--init-allow-missing 'final.*'``; shell-style patterns). Shapes must match. The
optimizer state is loaded too with ``--init-optimizer`` (only without renames). The report of
what was loaded, renamed, missing and unexpected is logged and written to
``model_dir/init_report.json``.

A ``zch`` table (docs/zch.md) loads its rows only together with its id-to-row map, from a
``zch`` table of the checkpoint: the fine-tuned run then looks up the same row for the same id.
Rows without a map (a ``hash_bucket_size`` run's) are refused for a ``zch`` table, and a ``zch``
table's rows for a table without ``zch``, each with one problem naming the table and how to
start it fresh instead. On fewer ranks than wrote the checkpoint the maps load by position
(every id keeps its row); on more, each table is split by raw id as ``--resume`` splits it
(:class:`~tzrun.runner.zch_reshard.ZchGrowth`, given this module's name matching).
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import attrs

from tzrun.errors import CheckpointError, TzrunError
from tzrun.io.storage import as_path
from tzrun.runner.zch_layout import ZchStateTable, moved_plain_name, zch_state_tables

__all__ = ["InitFrom", "InitReport", "read_name_map", "init_from_checkpoint"]

_PREFIX = "model.model."  # DCP key of a model entry: "model." (the saved dict) + "model." (TrainModel)


@attrs.frozen
class InitFrom:
    """What ``--init-from`` asks for.

    Attributes:
        checkpoint: a checkpoint directory (``.../checkpoints/step-N``) or a model dir (its
            latest complete checkpoint).
        name_map: the map file (``NEW_NAME OLD_NAME`` per line), or None.
        load_optimizer: also load the optimizer state.
        allow_missing: patterns of model names that may be absent from the checkpoint.
        allow_unexpected: patterns of checkpoint names the model may leave unused.
    """

    checkpoint: str
    name_map: str | None = None
    load_optimizer: bool = False
    allow_missing: tuple[str, ...] = ()
    allow_unexpected: tuple[str, ...] = ()


@attrs.frozen
class InitReport:
    """What :func:`init_from_checkpoint` did.

    Attributes:
        checkpoint: the checkpoint it read.
        loaded: model names loaded under their own name.
        renamed: ``{model name: checkpoint name}`` loaded through the map.
        missing: model names the checkpoint did not have (allowed; they keep their initial values).
        unexpected: checkpoint names the model did not use (allowed).
        optimizer: whether the optimizer state was loaded.
    """

    checkpoint: str
    loaded: tuple[str, ...]
    renamed: dict[str, str]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    optimizer: bool

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "loaded": list(self.loaded), "renamed": dict(self.renamed),
                "missing": list(self.missing), "unexpected": list(self.unexpected), "optimizer": self.optimizer}

    def summary(self) -> str:
        def names(items: Sequence[str]) -> str:
            shown = ", ".join(items[:8])
            return shown + (f", ... ({len(items)} in all)" if len(items) > 8 else "")

        lines = [f"initialized from {self.checkpoint}: {len(self.loaded) + len(self.renamed)} tensor(s) loaded"]
        if self.renamed:
            lines.append("  renamed: " + names([f"{k} <- {v}" for k, v in self.renamed.items()]))
        if self.missing:
            lines.append("  missing (kept their initial values): " + names(list(self.missing)))
        if self.unexpected:
            lines.append("  unexpected (not used): " + names(list(self.unexpected)))
        lines.append("  optimizer state: " + ("loaded" if self.optimizer else "not loaded (fresh)"))
        return "\n".join(lines)


def read_name_map(path: str | Path) -> dict[str, str]:
    """``{new name: old name}`` from a map file.

    Raises:
        TzrunError: for an unreadable file, a line without two names, or a name mapped twice.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TzrunError(f"{path}: cannot read the name map: {exc.strerror}") from None
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TzrunError(f"{path}:{number}: expected 'NEW_NAME OLD_NAME', got {line!r}")
        if parts[0] in out:
            raise TzrunError(f"{path}:{number}: '{parts[0]}' is mapped twice")
        out[parts[0]] = parts[1]
    return out


def _allowed(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def init_from_checkpoint(init: InitFrom, *, model: Any, optimizer: Any, model_dir: Path, rank: int,
                         world_size: int = 1) -> InitReport:
    """Load weights (and optionally the optimizer state) of another run into a built model
    (collective: every rank calls it) of ``world_size`` ranks.

    Raises:
        CheckpointError: when the checkpoint is not complete, is damaged, or would run code.
        TzrunError: for missing or unexpected names that are not allowed, shape mismatches,
            ``load_optimizer`` with renames, or a ``zch`` table's rows loaded without its map
            (or into a table without ``zch``).
    """
    from tzrun.runner.checkpoint import verify_checkpoint
    from tzrun.runner.dcp_storage import storage_reader
    from tzrun.runner.manifest import verify_hashes_by_default

    source = _complete_checkpoint(init.checkpoint)
    verify_checkpoint(source, state_while_reading=verify_hashes_by_default())  # state/: as _load reads it
    renames = read_name_map(init.name_map) if init.name_map else {}
    if renames and init.load_optimizer:
        raise TzrunError("--init-optimizer loads the optimizer state as saved; it cannot be combined with a name map")

    saved = storage_reader(source / "state").read_metadata().state_dict_metadata
    saved_model = {k[len(_PREFIX):]: meta for k, meta in saved.items() if k.startswith(_PREFIX)}
    current = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    moved = _moved_plain_tables(current, saved_model, renames)
    if moved and init.load_optimizer:
        raise TzrunError(f"--init-from {source}: its run had zch on other features, so its plain tables' optimizer "
                         f"state is saved under other names ('{next(iter(moved.values()))}'); leave out --init-optimizer")
    zch_problems, covered_here, covered_there = _zch_problems(list(current), list(saved_model), {**moved, **renames}, init)
    targets, loaded, renamed, missing, problems = _match_names(
        {k: v for k, v in current.items() if k not in covered_here}, saved_model, {**moved, **renames}, init.allow_missing)
    unexpected = sorted(k for k in saved_model if k not in targets)
    not_allowed = [k for k in unexpected if not _allowed(k, init.allow_unexpected) and k not in covered_there]
    problems.extend(f"the checkpoint's '{k}' is not used by the model" for k in not_allowed)
    unknown_map = sorted(k for k in renames if k not in current)
    problems.extend(f"the name map renames '{k}', which the model does not have" for k in unknown_map)
    if zch_problems and not problems:
        raise TzrunError(f"--init-from {source}: " + "; ".join(zch_problems))
    problems[:0] = zch_problems
    if problems:
        raise TzrunError(
            f"--init-from {source}: " + "; ".join(problems[:12]) + (f"; ... ({len(problems)} problems)" if len(problems) > 12 else "")
            + ". Map names with --init-map, or allow them with --init-allow-missing / --init-allow-unexpected "
            "(patterns such as 'final.*')"
        )
    _load(source, targets, {**{n: n for n in loaded}, **renamed}, current, model=model,
          optimizer=optimizer if init.load_optimizer else None, rank=rank, world_size=world_size)
    report = InitReport(str(source), tuple(loaded), renamed, tuple(missing), tuple(unexpected), init.load_optimizer)
    if rank == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "init_report.json").write_text(json.dumps(report.to_json(), indent=2))
    return report


def _load(source: Path, targets: dict[str, Any], names: Mapping[str, str], current: Mapping[str, Any], *, model: Any,
          optimizer: Any, rank: int, world_size: int) -> None:
    """Load ``targets`` (the model's state tensors, of ``current``, by checkpoint name;
    ``names``: model name -> checkpoint name) and the ``optimizer``'s state (None: it starts
    fresh). From a checkpoint written by fewer ranks, the ``zch`` tables among them (with their
    optimizer rows) are then split by raw id (:class:`~tzrun.runner.zch_reshard.ZchGrowth`)."""
    from tzrun.runner.checkpoint import init_lazy_states, read_meta, verified_reads
    from tzrun.runner.dcp_storage import load_state
    from tzrun.runner.manifest import verify_hashes_by_default
    from tzrun.runner.zch_reshard import ZchGrowth, grows_zch_slices

    if optimizer is not None:
        init_lazy_states(optimizer)  # before ZchGrowth lists the optimizer's states
    written_by: Any = read_meta(source).get("world_size")
    growth = None
    if grows_zch_slices(model, written_by, world_size):
        growth = ZchGrowth(model, optimizer, int(written_by), rank, world_size,
                           sources={"model." + k: "model." + v for k, v in names.items()})
    placed = {names[k.removeprefix("model.")] for k in growth.model_keys()} if growth is not None else set()
    checked = verify_hashes_by_default()  # each read of state/ checked against the manifest
    reads = verified_reads(source, checked)
    load_state(source / "state", {"model": {"model." + k: v for k, v in targets.items() if k not in placed}}, **reads)
    # the targets are the model's own state tensors (or shards of them): give them back to it
    model.load_state_dict({"model." + k: v for k, v in current.items()})
    if optimizer is not None:
        optimizer_state = {"optimizer": optimizer.state_dict()}
        load_state(source / "state", optimizer_state, **reads)
        optimizer.load_state_dict(optimizer_state["optimizer"])
    if growth is not None:
        growth.place(source, verify_reads=checked)


def _complete_checkpoint(checkpoint: str) -> Path:
    """The checkpoint ``--init-from`` names: a complete checkpoint, or a model dir's latest one.

    Raises:
        CheckpointError: when it is neither.
    """
    from tzrun.runner.checkpoint import is_complete, latest_checkpoint

    source = as_path(checkpoint)
    if is_complete(source):
        return source
    latest = latest_checkpoint(source)
    if latest is None:
        raise CheckpointError(f"--init-from {source}: not a complete checkpoint, nor a model dir with one")
    return latest


def _match_names(current: dict[str, Any], saved_model: dict[str, Any], renames: dict[str, str],
                 allow_missing: Sequence[str]) -> tuple[dict[str, Any], list[str], dict[str, str], list[str], list[str]]:
    """Match the model's state names to the checkpoint's (through ``renames``): ``(targets by
    saved name, loaded, renamed, missing, problems)``."""
    problems: list[str] = []
    loaded, renamed, missing = [], {}, []
    targets: dict[str, Any] = {}
    for name, tensor in current.items():
        old = renames.get(name, name)
        if old not in saved_model:
            if _allowed(name, allow_missing):
                missing.append(name)
            else:
                problems.append(f"'{name}' is not in the checkpoint" + (f" (mapped from '{old}')" if old != name else ""))
            continue
        size = getattr(saved_model[old], "size", None)
        shape = tuple(tensor.size()) if hasattr(tensor, "size") else None
        if size is not None and shape is not None and tuple(size) != shape:
            problems.append(f"'{name}' has shape {list(shape)} here and {list(size)} in the checkpoint ('{old}')")
            continue
        if old in targets:
            first = next(n for n in current if renames.get(n, n) == old)
            problems.append(f"the checkpoint's '{old}' would be loaded into both '{first}' and '{name}'")
            continue
        targets[old] = tensor
        if old == name:
            loaded.append(name)
        else:
            renamed[name] = old
    return targets, loaded, renamed, missing, problems


def _moved_plain_tables(current: Mapping[str, Any], saved: Mapping[str, Any], renames: Mapping[str, str]) -> dict[str, str]:
    """``{model name: checkpoint name}`` of the plain tables that sit on the other side of the
    ``zch`` swap in the checkpoint (a collection that holds a ``zch`` table in one run and none
    in the other keeps its plain tables under ``plain.``): loaded as if renamed."""
    out = {}
    for name in current:
        other = moved_plain_name(name)
        if other is not None and other in saved and name not in renames and name not in saved:
            out[name] = other
    return out


def _zch_problems(here: list[str], there: list[str], renames: dict[str, str],
                  init: InitFrom) -> tuple[list[str], set[str], set[str]]:
    """What ``--init-from`` refuses about ``zch`` tables, one problem per table: a ``zch``
    table of the model (state names ``here``) loads its rows, its raw ids and their rows'
    numbers from one ``zch`` table of the checkpoint (``there``), or none of them (allowed
    missing: it starts fresh); a ``zch`` table of the checkpoint loads into a ``zch`` table only.
    Returns the problems and the names of the model and of the checkpoint they cover (not
    reported again as missing or unexpected)."""
    saved = set(there)
    source = {n: renames.get(n, n) for n in here if renames.get(n, n) in saved}
    ours, theirs = zch_state_tables(here), zch_state_tables(there)
    problems: list[str] = []
    covered_here: set[str] = set()
    covered_there: set[str] = set()
    for table in ours:
        problem = _our_table_problem(table, here, there, source, theirs, init)
        if problem is not None:
            problems.append(problem)
            covered_here.update(n for n in here if table.holds(n))
            covered_there.update(_names_of(table.table, there))
    mine = {n for n in here if any(t.holds(n) for t in ours)}
    for table in theirs:
        into = [n for n, old in source.items() if old == table.weight and n not in mine]
        dropped = not any(table.holds(old) for old in source.values()) and not all(
            _allowed(n, init.allow_unexpected) for n in there if table.holds(n))
        plain = [n for n in _names_of(table.table, here) if n not in mine]
        if into or (dropped and plain):
            problems.append(f"table '{table.table}' has zch in the checkpoint and not here: its rows belong to the ids "
                            f"of its id-to-row map, which a table without zch does not look up; give its feature the "
                            f"zch block it had, or {_fresh(table.table, there)}")
            covered_here.update(into + plain)
            covered_there.update(n for n in there if table.holds(n))
    return problems, covered_here, covered_there


def _our_table_problem(table: ZchStateTable, here: list[str], there: list[str], source: Mapping[str, str],
                       theirs: list[ZchStateTable], init: InitFrom) -> str | None:
    """Why the model's ``zch`` ``table`` cannot load as ``source`` (model name -> checkpoint
    name) says, or None: its rows and map from one zch table of the checkpoint, or fresh."""
    core = [table.weight, table.map_prefix + "_mch_sorted_raw_ids", table.map_prefix + "_mch_remapped_ids_mapping"]
    origin = next((t for t in theirs if source.get(table.weight) == t.weight), None)
    if not any(n in source for n in core):
        if all(_allowed(n, init.allow_missing) for n in here if table.holds(n)):
            return None  # started fresh, as asked
        if not _names_of(table.table, there):
            return f"table '{table.table}' (zch) is not in the checkpoint: {_fresh(table.table, there)}"
        return (f"table '{table.table}' has zch here, and the checkpoint holds no id-to-row map for it (its run looked "
                f"the table up by hash_bucket_size, num_buckets or a vocabulary: its rows are not any id's): "
                f"{_fresh(table.table, there)}, or init from a run with zch on it")
    if origin is None and table.weight in source:
        return (f"table '{table.table}' has zch here, and its rows would load from the checkpoint's "
                f"'{source[table.weight]}', which has no id-to-row map: drop that line of the name map and "
                f"{_fresh(table.table, there)}")
    if origin is None or not all(origin.holds(source.get(n, "")) for n in core):
        return (f"table '{table.table}': its rows and its id-to-row map load together, from one zch table of the "
                f"checkpoint (here the rows from '{source.get(table.weight, 'nowhere')}' and the map from elsewhere "
                f"or nowhere); map or allow them alike")
    return None


def _names_of(table: str, names: Sequence[str]) -> list[str]:
    """The state names of ``names`` that belong to a table named ``table`` (``*.<table>.*``)."""
    return [n for n in names if fnmatch.fnmatchcase(n, f"*.{table}.*")]


def _fresh(table: str, there: Sequence[str]) -> str:
    """How to start ``table`` fresh: allow its names missing (and the checkpoint's unexpected)."""
    pattern = f"*.{table}.*"
    return f"start the table fresh with --init-allow-missing '{pattern}'" + (
        f" --init-allow-unexpected '{pattern}'" if _names_of(table, there) else "")
