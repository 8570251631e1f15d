"""The resumed boundary's evaluation: which checkpoints re-run it, and what ``eval_results.jsonl``
keeps for the resumed run to append."""

from __future__ import annotations

import json

import pytest

from tzrun.io.files import EVAL_RESULTS
from tzrun.runner.boundary_eval import PENDING_KEY, evaluation_pending, resume_evaluation


def _write(model_dir, *rows):
    (model_dir / EVAL_RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _steps(model_dir):
    return [(r["step"], r.get("command")) for r in map(json.loads, (model_dir / EVAL_RESULTS).read_text().splitlines())]


@pytest.mark.parametrize(("loop", "has_eval", "expected"), [
    ({PENDING_KEY: True}, True, True),
    ({PENDING_KEY: False}, True, False),  # a signal stop: its step was never evaluated
    ({}, True, False),  # a checkpoint older than the flag resumes as it always did
    ({PENDING_KEY: True}, False, False),  # nothing to evaluate with
])
def test_only_a_boundary_checkpoint_with_an_eval_input_re_runs_its_evaluation(tmp_path, loop, has_eval, expected):
    _write(tmp_path, {"step": 2, "auc": 0.5}, {"step": 4, "auc": 0.6})
    assert evaluation_pending(loop, tmp_path, 4, has_eval=has_eval, nothing_left=False, world_size=1) is expected


def test_a_finished_run_resumed_again_re_runs_its_last_evaluation_only_when_it_is_missing(tmp_path):
    loop = {PENDING_KEY: True}
    _write(tmp_path, {"step": 2, "auc": 0.5}, {"step": 4, "auc": 0.6})
    assert not evaluation_pending(loop, tmp_path, 4, has_eval=True, nothing_left=True, world_size=1)
    # the evaluation of 4 failed: only `tzrec-run evaluate` recorded that step
    _write(tmp_path, {"step": 2, "auc": 0.5}, {"step": 4, "auc": 0.6, "command": "evaluate"})
    assert evaluation_pending(loop, tmp_path, 4, has_eval=True, nothing_left=True, world_size=1)


def test_resume_drops_the_evaluations_it_makes_again_and_keeps_evaluate_commands(tmp_path):
    rows = [{"step": 2}, {"step": 4}, {"step": 4, "command": "evaluate"}, {"step": 6}]
    _write(tmp_path, *rows)
    assert resume_evaluation({PENDING_KEY: True}, tmp_path, 4, has_eval=True, nothing_left=False, rank=0, world_size=1).pending
    assert _steps(tmp_path) == [(2, None), (4, "evaluate")]
    _write(tmp_path, *rows)
    assert not resume_evaluation({}, tmp_path, 4, has_eval=True, nothing_left=False, rank=0, world_size=1).pending
    assert _steps(tmp_path) == [(2, None), (4, None), (4, "evaluate")]
