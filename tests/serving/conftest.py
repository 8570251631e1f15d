"""The one training run the serving tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tzrun.testing import TinyRun, run_tiny_training

#: one rank; evaluation with the EMA averages; a best checkpoint by AUC at steps 2 and 4, with
#: saved predictions; exports at each better AUC and at the end, 2 kept
EMA = 'train.dense_optimizer={type="sgd", lr=0.1, ema={decay=0.5, use_for_eval=true}}'
OVERRIDES = [EMA, 'eval.best_metric="auc"', "eval.save_predictions=true", "train.save_checkpoints_steps=2",
             "train.keep_checkpoint_max=5", "export={on_best=true, at_end=true, keep=2}"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """The tiny config trained on one rank with :data:`OVERRIDES` (``tiny.toml`` and
    ``tiny_data/`` beside its model dir)."""
    return run_tiny_training(tmp_path_factory.mktemp("serving_run"), overrides=OVERRIDES)


#: two ranks: a best checkpoint by AUC at steps 2 and 4, exports at each better AUC and at the end
TWO_RANK_OVERRIDES = ['eval.best_metric="auc"', "train.save_checkpoints_steps=2",
                      "export={on_best=true, at_end=true, keep=2}"]


@pytest.fixture(scope="session")
def two_rank_run(tiny_run: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny config (``tiny_run``'s file and data) trained on 2 ranks with
    :data:`TWO_RANK_OVERRIDES`; returns its model dir."""
    from tests.warm_ranks import warm_cli

    model_dir = tmp_path_factory.mktemp("two_rank") / "run"
    sets = [a for s in TWO_RANK_OVERRIDES for a in ("--set", s)]
    proc = warm_cli(["train", str(tiny_run.model_dir.parent / "tiny.toml"), "--model-dir", str(model_dir),
                    "--nproc-per-node", "2", *sets], timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return model_dir
