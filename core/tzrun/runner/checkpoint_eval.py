"""``tzrec-run evaluate``: evaluate a saved checkpoint on ``data.eval_input``.

The run is built from the config as for training (any world size: the checkpoint is resharded),
the checkpoint's model weights are loaded after its manifest is checked, and the result is
appended to ``model_dir/eval_results.jsonl`` with ``"checkpoint"`` and ``"command": "evaluate"``.

The checkpoint must have been written with the same ``[model]`` and ``[[features.*]]`` as the
config: those decide the parameters and what they mean. Every other section may differ (other
eval data, metrics, losses, batch sizes). Which weights are evaluated follows the config as in
training: the EMA averages when ``train.dense_optimizer.ema.use_for_eval``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs

from tzrun.errors import CheckpointError, ConfigError, ConfigProblem, IncompleteCheckpointError, RecordNotWrittenError
from tzrun.io.files import EVAL_RESULTS
from tzrun.interfaces import EvalResult
from tzrun.runner.checkpoint import (
    is_complete,
    latest_checkpoint,
    load_checkpoint,
    previous_checkpoint,
    read_meta,
    verify_checkpoint,
)
from tzrun.runner.checkpoint_blobs import Blob
from tzrun.runner.manifest import marker_state, verify_hashes_by_default
from tzrun.runner.evaluate import append_eval_result
from tzrun.runner.session import Session
from tzrun.io.write_errors import write_failure_message
from tzrun.runner.records import config_differences
from tzrun.runner.retention import BEST_FILE, read_best
from tzrun.runner.zch_reshard import ZchGrowth, grows_zch_slices
from tzrun.io.storage import as_path

__all__ = ["CheckpointEvaluation", "resolve_checkpoint", "restore_checkpoint", "evaluate_checkpoint"]

log = logging.getLogger("tzrun")

@attrs.frozen
class CheckpointEvaluation:
    """What :func:`evaluate_checkpoint` returns.

    Attributes:
        checkpoint: the checkpoint directory evaluated.
        result: the evaluation (``step`` is the checkpoint's step).
        ema: whether the EMA averages of the dense weights were evaluated.
    """

    checkpoint: Path
    result: EvalResult
    ema: bool


def resolve_checkpoint(model_dir: Path, which: str) -> Path:
    """The checkpoint ``--checkpoint`` names: ``latest``, ``best``, a path, or ``step-N`` in
    ``model_dir/checkpoints``.

    Raises:
        CheckpointError: when there is no such checkpoint (with what to do instead).
        IncompleteCheckpointError: when the directory's save never finished.
    """
    model_dir = as_path(model_dir)
    if which == "latest":
        path = latest_checkpoint(model_dir)
        if path is None:
            raise CheckpointError(f"{model_dir}: no complete checkpoint to evaluate (train first, or pass --checkpoint PATH)")
        return path
    if which == "best":
        best = read_best(model_dir)
        if best is None:
            raise CheckpointError(
                f"{model_dir}: no {BEST_FILE}: set eval.best_metric (and data.eval_input) when training to record the "
                "best checkpoint, or pass --checkpoint latest or a path"
            )
        path = best.path(model_dir)
        if not is_complete(path):
            raise CheckpointError(f"{model_dir / BEST_FILE} names {path}, which is no longer a complete checkpoint; "
                                  "pass --checkpoint latest or a path")
        return path
    path = as_path(which)
    if not path.exists() and (model_dir / "checkpoints" / which).exists():
        path = model_dir / "checkpoints" / which
    if not path.exists():
        raise CheckpointError(f"{which}: no such checkpoint (pass latest, best, a checkpoint directory, or step-N of {model_dir / 'checkpoints'})")
    if not is_complete(path):
        previous = previous_checkpoint(path)
        hint = f"; the previous complete one is {previous}" if previous else ""
        raise IncompleteCheckpointError(f"{path}: not a complete checkpoint ({marker_state(path)[1]}){hint}")
    return path


def evaluate_checkpoint(session: Session, which: str) -> CheckpointEvaluation:
    """Evaluate the checkpoint ``which`` names (collective: every rank of the job calls it;
    it starts ``session``, see :meth:`Session.start`); rank 0 appends the result to
    ``eval_results.jsonl``. The run's parts come from the session, as in training: every data
    option (the reader, ``data.on_bad_row``, batch sizes) means what it means there.

    Raises:
        ConfigError: without ``data.eval_input``.
        CheckpointError: for a missing, incomplete or damaged checkpoint, or one written with
            another ``[model]`` or ``[[features]]``.
    """
    cfg, raw = session.cfg, session.raw
    if cfg.data.eval_input is None:
        raise ConfigError(raw.source, [ConfigProblem("data.eval_input", "tzrec-run evaluate needs an eval input; set it (or --set data.eval_input=\"...\")")])
    path, meta, ema = restore_checkpoint(session, which)
    step, info = int(meta["step"]), session.info
    if info.rank == 0:
        log.info("evaluating %s (step %d) on %s over %d rank(s)%s", path, step, cfg.data.eval_input, info.world_size,
                 " with the EMA weights" if ema else "")
    result = session.evaluate(session.run_context(), step,
                              lambda r: _record(session.model_dir, CheckpointEvaluation(path, r, ema)))
    return CheckpointEvaluation(path, result, ema)


def restore_checkpoint(session: Session, which: str) -> tuple[Path, dict[str, Any], bool]:
    """Start ``session`` (collective) and load into its model the weights of the checkpoint
    ``which`` names, as ``evaluate`` does (any world size; the EMA averages when the config
    evaluates with them): what ``evaluate`` and ``predict --checkpoint`` share.

    Returns:
        ``(checkpoint directory, its meta.json, whether the EMA averages are used)``.

    Raises:
        CheckpointError: for a missing, incomplete or damaged checkpoint, or one written with
            another ``[model]`` or ``[[features]]``.
    """
    raw = session.raw
    session.start()
    path = resolve_checkpoint(session.model_dir, which)
    verify_checkpoint(path, state_while_reading=verify_hashes_by_default())  # state/'s hashes: as it is read
    meta = read_meta(path)
    differences = config_differences(meta.get("config", {}), raw.data)
    if differences:
        raise CheckpointError(
            f"{path} was written with another model or features than {raw.source}:\n"
            + "\n".join(f"  {d}" for d in differences)
            + "\nUse it with the config it was trained with (its config is in meta.json), or pass --set to match."
        )
    return path, meta, _load_weights(session, path, meta.get("world_size"))


def _record(model_dir: Path, done: CheckpointEvaluation) -> None:
    """Append ``done`` to ``eval_results.jsonl``.

    Raises:
        RecordNotWrittenError: when it cannot be written (full disk, read-only model dir),
            holding ``done`` so that the result is still shown.
    """
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        append_eval_result(model_dir, done.result, checkpoint=str(done.checkpoint), command="evaluate", ema=done.ema)
    except OSError as error:
        message = write_failure_message(error, model_dir, f"the result to {EVAL_RESULTS}", resume=False)
        raise RecordNotWrittenError(f"the evaluation above was not recorded: {message}", done) from None


def _load_weights(session: Session, path: Path, written_by: Any) -> bool:
    """Load the checkpoint's model weights and update path (EMA averages) into the session's
    model (its ``zch`` tables split by raw id when fewer ranks wrote it: :class:`ZchGrowth`);
    returns whether evaluation uses the EMA averages."""
    built, info = session.built, session.info
    saved_update: dict[str, Any] = {}
    growth = None
    if grows_zch_slices(built.model, written_by, info.world_size):
        growth = ZchGrowth(built.model, None, int(written_by), info.rank, info.world_size)
    model = growth.model_state() if growth is not None else built.model
    load_checkpoint(path, {"model": model, "update": Blob(dict, saved_update.update)}, verify=False,
                    verify_reads=verify_hashes_by_default())
    if growth is not None:
        growth.place(path, verify_reads=verify_hashes_by_default())
    ema = bool(built.update.ema_for_eval)
    if ema and not saved_update.get("ema"):
        raise CheckpointError(
            f"{path} holds no EMA averages, but the config evaluates with them (train.dense_optimizer.ema.use_for_eval); "
            "remove train.dense_optimizer.ema (or set use_for_eval = false) to evaluate its weights"
        )
    built.update.load_state_dict(saved_update)
    if not ema and saved_update.get("ema") and session.info.rank == 0:
        log.info("%s also holds EMA averages of the dense weights; set train.dense_optimizer.ema to evaluate them", path)
    return ema
