"""Checkpoints are pruned once per checkpoint boundary (they were pruned after the save and
again after the best checkpoint was recorded)."""

from __future__ import annotations

import tzrun.runner.trainer as trainer_module
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.testing import run_tiny_training


def test_each_boundary_prunes_once_and_the_best_and_newest_stay(tmp_path, monkeypatch):
    calls = []
    prune = trainer_module.prune_checkpoints

    def counting(model_dir, keep):
        calls.append(keep)
        return prune(model_dir, keep)

    monkeypatch.setattr(trainer_module, "prune_checkpoints", counting)
    run = run_tiny_training(tmp_path, in_process=True, overrides=[
        "train.save_checkpoints_steps=1", "train.keep_checkpoint_max=1", 'eval.best_metric="auc"'])
    assert run.steps == 4
    assert calls == [1, 1, 1, 1]  # boundaries at steps 1, 2, 3 and 4: one prune each (eight before)
    kept = [step for step, _ in list_checkpoints(run.model_dir)]
    best = (run.model_dir / "best.json").read_text()
    assert kept[-1] == 4 and len(kept) <= 2, (kept, best)
