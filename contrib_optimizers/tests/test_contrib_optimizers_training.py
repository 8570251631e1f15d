"""A short real run through the installed entry point: ``python -m tzrun train`` in a fresh
process, whose TOML names this distribution's optimizers and schedule and a contrib metric."""

from __future__ import annotations

import math

import pytest

import tzrun_contrib_optimizers
from tzrun.testing import entry_points_of, run_tiny_training

DIST = "tzrun-contrib-optimizers"


def test_the_entry_point_is_installed():
    assert [(ep.name, ep.value) for ep in entry_points_of(DIST)] == [("tzrun_contrib_optimizers", "tzrun_contrib_optimizers.hooks")], (
        f"{DIST} is not installed: pip install -e contrib_optimizers (scripts/setup.sh does)"
    )


def test_a_short_run_trains_with_the_contrib_optimizers_and_metrics(tmp_path):
    if not entry_points_of("tzrun-contrib-metrics"):
        pytest.skip("the run also names a contrib metric: pip install -e contrib_metrics (scripts/setup.sh installs both)")
    run = run_tiny_training(
        tmp_path,
        overrides=[
            'train.dense_optimizer={type="lion", lr=0.0003, weight_decay=0.1, lr_schedule={type="inverse_sqrt", warmup_size=2}}',
            'train.sparse_optimizer={type="ema_rowwise_adagrad", lr=0.05, ema_every=2}',
            'metrics=[{type="auc"}, {type="average_precision"}]',
        ],
    )
    assert run.steps == 4
    assert 0.0 < run.metrics["average_precision"] <= 1.0 and math.isfinite(run.metrics["loss/binary_cross_entropy"])
    mine = run.plugin("tzrun_contrib_optimizers")  # the plugin set the checkpoint recorded
    assert (mine["distribution"], mine["version"]) == (DIST, tzrun_contrib_optimizers.__version__)
    assert mine["components"] == {
        "sparse_optimizer": ["ema_rowwise_adagrad"],
        "dense_optimizer": ["adabelief", "lion"],
        "lr_scheduler": ["inverse_sqrt"],
    }
    assert run.plugin("tzrun_contrib_metrics")["distribution"] == "tzrun-contrib-metrics"
