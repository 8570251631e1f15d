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
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any, Sequence

import attrs

from tzrun.errors import CheckpointError, TzrunError
from tzrun.io.storage import as_path

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


def init_from_checkpoint(init: InitFrom, *, model: Any, optimizer: Any, model_dir: Path, rank: int) -> InitReport:
    """Load weights (and optionally the optimizer state) of another run into a built model
    (collective: every rank calls it).

    Raises:
        CheckpointError: when the checkpoint is not complete, is damaged, or would run code.
        TzrunError: for missing or unexpected names that are not allowed, shape mismatches, or
            ``load_optimizer`` with renames.
    """
    from tzrun.runner.checkpoint import init_lazy_states, verify_checkpoint
    from tzrun.runner.dcp_storage import load_state, storage_reader

    source = _complete_checkpoint(init.checkpoint)
    verify_checkpoint(source)
    renames = read_name_map(init.name_map) if init.name_map else {}
    if renames and init.load_optimizer:
        raise TzrunError("--init-optimizer loads the optimizer state as saved; it cannot be combined with a name map")

    saved = storage_reader(source / "state").read_metadata().state_dict_metadata
    saved_model = {k[len(_PREFIX):]: meta for k, meta in saved.items() if k.startswith(_PREFIX)}
    current = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    targets, loaded, renamed, missing, problems = _match_names(current, saved_model, renames, init.allow_missing)
    unexpected = sorted(k for k in saved_model if k not in targets)
    not_allowed = [k for k in unexpected if not _allowed(k, init.allow_unexpected)]
    problems.extend(f"the checkpoint's '{k}' is not used by the model" for k in not_allowed)
    unknown_map = sorted(k for k in renames if k not in current)
    problems.extend(f"the name map renames '{k}', which the model does not have" for k in unknown_map)
    if problems:
        raise TzrunError(
            f"--init-from {source}: " + "; ".join(problems[:12]) + (f"; ... ({len(problems)} problems)" if len(problems) > 12 else "")
            + ". Map names with --init-map, or allow them with --init-allow-missing / --init-allow-unexpected "
            "(patterns such as 'final.*')"
        )
    load_state(source / "state", {"model": {"model." + k: v for k, v in targets.items()}})
    # the targets are the model's own state tensors (or shards of them): give them back to it
    model.load_state_dict({"model." + k: v for k, v in current.items()})
    if init.load_optimizer:
        init_lazy_states(optimizer)
        optimizer_state = {"optimizer": optimizer.state_dict()}
        load_state(source / "state", optimizer_state)
        optimizer.load_state_dict(optimizer_state["optimizer"])
    report = InitReport(str(source), tuple(loaded), renamed, tuple(missing), tuple(unexpected), init.load_optimizer)
    if rank == 0:
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "init_report.json").write_text(json.dumps(report.to_json(), indent=2))
    return report


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
