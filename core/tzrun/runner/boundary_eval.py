"""A checkpoint boundary's evaluation, which follows its checkpoint (and so may be re-run on resume).

At a boundary the trainer writes the checkpoint first, then evaluates, then records the best
checkpoint and asks the stages whether to stop. An evaluation that fails (bad eval data, a
metric) on any number of ranks therefore leaves the boundary's checkpoint complete on disk. The
checkpoint's loop state says ``"evaluate_on_resume": true``: its evaluation's result, and what
the stages concluded from it (early stopping's patience, say), are not part of it. A run resumed
from it evaluates that boundary again before training on (evaluation is deterministic), so that
``eval_results.jsonl``, ``best.json`` and the stages' decisions are those of an uninterrupted run;
it costs one evaluation per resume.

The core, not each stage, makes sure that every plugin hears each step's evaluation once. When the
interrupted run recorded that evaluation (so it had told the plugins), the evaluation run again
goes to the plugins whose state the checkpoint restored (their state is from before it: for them
it is the first time) and not to the others, which heard it already (:func:`told_already`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Mapping

import attrs
import torch

from tzrun.io.files import EVAL_RESULTS, read_jsonl
from tzrun.runner.evaluate import trim_eval_results
from tzrun.io.storage import as_path

__all__ = ["PENDING_KEY", "ResumedBoundary", "resume_evaluation", "evaluation_pending", "trim_for_resume", "told_already"]

#: The loop-state key of a checkpoint written at a boundary, before that boundary's evaluation.
PENDING_KEY = "evaluate_on_resume"


@attrs.frozen
class ResumedBoundary:
    """What a run resumed from the checkpoint of a boundary does about its evaluation.

    Attributes:
        pending: evaluate the boundary's step again before training on.
        told: the interrupted run had recorded that evaluation, and so told the plugins of it.
    """

    pending: bool = False
    told: bool = False


def resume_evaluation(loop: Mapping[str, Any], model_dir: Path, step: int, *, has_eval: bool, nothing_left: bool,
                      rank: int, world_size: int) -> ResumedBoundary:
    """On resume from the checkpoint of ``step``: decide whether its boundary is evaluated
    again (:func:`evaluation_pending`) and whether the interrupted run had told the plugins of
    that evaluation, then drop from ``eval_results.jsonl`` what the resumed run records again
    (:func:`trim_for_resume`, rank 0). Collective with several ranks.

    Args:
        loop, model_dir, step, has_eval, nothing_left, world_size: as :func:`evaluation_pending`.
        rank: this rank.
    """
    pending = evaluation_pending(loop, model_dir, step, has_eval=has_eval, nothing_left=nothing_left,
                                 world_size=world_size)
    told = pending and _recorded(model_dir, step)
    if pending and world_size > 1:
        decision: list[Any] = [told]
        torch.distributed.broadcast_object_list(decision, src=0)
        told = bool(decision[0])
    if rank == 0:
        trim_for_resume(model_dir, step, pending=pending)
    return ResumedBoundary(pending, told)


def told_already(pm: Any, restored: Collection[str], state_key: Any) -> list[object]:
    """The plugins not to tell again of the resumed boundary's evaluation, when the interrupted
    run had told them (:attr:`ResumedBoundary.told`): those evaluation hooks that keep no state
    in the checkpoint. A plugin whose state the checkpoint restored is back at before that
    evaluation, and is told it (the first time, as far as its state goes).

    Args:
        pm: the run's plugin manager.
        restored: the keys of the plugin and stage states the checkpoint restored.
        state_key: the key a plugin's state is saved under, from its plugin name.
    """
    plugins = {impl.plugin for hook in (pm.hook.tzrun_before_eval, pm.hook.tzrun_after_eval)
               for impl in hook.get_hookimpls()}
    return [plugin for plugin in plugins if state_key(pm.get_name(plugin) or "") not in restored]


def evaluation_pending(loop: Mapping[str, Any], model_dir: Path, step: int, *, has_eval: bool,
                       nothing_left: bool, world_size: int) -> bool:
    """Whether a run resumed from the checkpoint of ``step`` (whose loop state is ``loop``)
    re-runs that boundary's evaluation first. Not for a checkpoint without the flag (a signal
    stop mid-segment, step 0, or one older than the flag), nor without an eval input. A
    finished run resumed again (``nothing_left``) whose last evaluation is already in
    ``eval_results.jsonl`` does not re-run it: its result would change nothing. Rank 0 decides
    (it reads the file); every rank gets its answer (one collective with several ranks).

    Args:
        loop: the checkpoint's loop state.
        model_dir: the run's model directory.
        step: the checkpoint's step.
        has_eval: whether the config has an eval input.
        nothing_left: whether the run has no step left to train.
        world_size: the number of ranks.

    Returns:
        Whether to evaluate ``step`` again before training on.
    """
    pending = bool(loop.get(PENDING_KEY, False)) and has_eval
    if pending and nothing_left:
        pending = not _recorded(model_dir, step)
    if world_size > 1:
        decision: list[Any] = [pending]
        torch.distributed.broadcast_object_list(decision, src=0)
        pending = bool(decision[0])
    return pending


def trim_for_resume(model_dir: Path, step: int, *, pending: bool) -> int:
    """Drop from ``eval_results.jsonl`` the training run's evaluations the resumed run makes
    again: those after ``step``, and that of ``step`` itself when it is ``pending``. Call on
    rank 0. Returns how many lines were dropped."""
    return trim_eval_results(model_dir, step - 1 if pending else step)


def _recorded(model_dir: Path, step: int) -> bool:
    """Whether the training run's evaluation of ``step`` is in ``eval_results.jsonl``."""
    path = as_path(model_dir) / EVAL_RESULTS
    if not path.is_file():
        return False
    return any("command" not in r and int(r.get("step", -1)) == step for r in read_jsonl(path))
