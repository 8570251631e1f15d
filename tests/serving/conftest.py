"""The one training run the serving tests share."""

from __future__ import annotations

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
