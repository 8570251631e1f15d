"""Losses and metrics in real runs: group keys read from the data, grouped metrics and losses,
decayed train metrics in the step info and log lines, every eval value in eval_results.jsonl."""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.integration.test_update_path import Recorder, CONFIG, _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.trainer import train
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow


def brute_grouped_auc(p, y, g):
    """Mean over groups with both classes of the pairwise AUC (ties 1/2), as a double loop."""
    values = []
    for key in np.unique(g):
        m = g == key
        pos, neg = p[m][y[m] == 1], p[m][y[m] == 0]
        if len(pos) and len(neg):
            values.append(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg)))
    return float(np.mean(values))


def test_grouped_metrics_and_losses_train_metrics_and_results(tmp_path, criteo_dir, caplog):
    model_dir = tmp_path / "run"
    recorder = Recorder()
    pm = make_plugin_manager(plugins=[("recorder", recorder)])
    registries = collect_registries(pm)
    raw = parse_config(CONFIG.format(model_dir=model_dir, train=criteo_dir / "train"), "<test>", [
        f'data.eval_input="{criteo_dir / "eval"}"',
        'losses=[{type = "binary_cross_entropy"}, {type = "pairwise_logistic", group_by = "cat_5", weight = 0.5}]',
        'metrics=[{type = "auc"}, {type = "grouped_auc", group_by = "cat_5"}, {type = "log_loss"}, '
        '{type = "calibration"}, {type = "accuracy", name = "acc"}]',
        'train_metrics=[{type = "auc", decay_step = 2, decay_rate = 0.5}]',
        'train.stages=[{type = "progress", mode = "lines"}]',
        "train.log_every_n_steps=2",
        "eval.save_predictions=true",
    ])
    cfg = load_config(raw, registries)
    with caplog.at_level(logging.INFO, logger="tzrun"):
        result = train(Session(cfg, raw, pm, registries))

    values = result.eval.metrics
    assert set(values) == {"auc", "grouped_auc", "log_loss", "calibration", "acc",
                           "loss/binary_cross_entropy", "loss/pairwise_logistic"}
    table = pq.read_table(model_dir / "predictions" / "step-4" / "rank-0.parquet")
    saved = {name: table.column(name).to_numpy() for name in table.column_names}
    assert len(saved["probs"]) == 3001
    expected = brute_grouped_auc(saved["probs"], saved["label/label"], saved["group/cat_5"])
    assert values["grouped_auc"] == pytest.approx(expected, abs=1e-6)
    assert values["calibration"] == pytest.approx(saved["probs"].mean() / saved["label/label"].mean(), rel=1e-5)

    # the decayed train AUC: no value before the first window, then windows of 2 steps
    assert [bool(s) for s in recorder.metrics] == [False, True, True, True]
    assert "auc=" in caplog.text.split("step 2/4 epoch 0")[1].splitlines()[0]
    lines = [json.loads(line) for line in (model_dir / "eval_results.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 4 and lines[-1]["grouped_auc"] == values["grouped_auc"]


