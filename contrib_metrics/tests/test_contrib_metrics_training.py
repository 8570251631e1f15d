"""A short real run through the installed entry point (``python -m tzrun train`` in a fresh
process) whose TOML names every metric of this distribution and a contrib optimizer; the
values it reports are recomputed from the predictions it saved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import average_precision_score, ndcg_score

import tzrun_contrib_metrics
from tzrun.testing import entry_points_of, run_tiny_training

DIST = "tzrun-contrib-metrics"


def test_the_entry_point_is_installed():
    assert [(ep.name, ep.value) for ep in entry_points_of(DIST)] == [("tzrun_contrib_metrics", "tzrun_contrib_metrics.hooks")], (
        f"{DIST} is not installed: pip install -e contrib_metrics (scripts/setup.sh does)"
    )


def test_a_short_run_reports_the_contrib_metrics_exactly(tmp_path: Path):
    if not entry_points_of("tzrun-contrib-optimizers"):
        pytest.skip("the run also names a contrib optimizer: pip install -e contrib_optimizers (scripts/setup.sh installs both)")
    run = run_tiny_training(
        tmp_path,
        overrides=[
            'train.dense_optimizer={type="adabelief", lr=0.003}',
            'metrics=[{type="ndcg_at_k", k=5, group_by="cat_5"}, {type="average_precision"}, {type="copc"},'
            ' {type="copc", name="copc_by_cat_8", group_by="cat_8"}]',
            "eval.save_predictions=true",
        ],
    )
    mine = run.plugin("tzrun_contrib_metrics")
    assert (mine["distribution"], mine["version"]) == (DIST, tzrun_contrib_metrics.__version__)
    assert run.plugin("tzrun_contrib_optimizers")["components"]["dense_optimizer"] == ["adabelief", "lion"]

    # one rank, eval rows in file order: the saved predictions line up with the eval data
    saved = pq.read_table(tmp_path / "tiny_run" / "predictions" / f"step-{run.steps}" / "rank-0.parquet")
    data = pq.read_table(tmp_path / "tiny_data" / "eval", columns=["label", "cat_5", "cat_8"])
    assert saved.num_rows == data.num_rows == 2048
    labels = data.column("label").to_numpy().astype(np.float64)
    np.testing.assert_array_equal(saved.column("label/label").to_numpy(), labels)
    probs = saved.column("probs").to_numpy().astype(np.float64)
    cat_5, cat_8 = data.column("cat_5").to_numpy(), data.column("cat_8").to_numpy()

    assert run.metrics["average_precision"] == pytest.approx(average_precision_score(labels, probs), abs=1e-9)
    assert run.metrics["copc"] == pytest.approx(labels.sum() / probs.sum(), rel=1e-9)
    per_group = [labels[cat_8 == g].sum() / probs[cat_8 == g].sum() for g in np.unique(cat_8)]
    assert run.metrics["copc_by_cat_8"] == pytest.approx(np.mean(per_group), rel=1e-9)
    ndcgs = []
    for g in np.unique(cat_5):
        rows = cat_5 == g
        if labels[rows].sum() > 0:  # groups without a click are left out; sklearn needs 2 rows
            ndcgs.append(ndcg_score([labels[rows]], [probs[rows]], k=5) if rows.sum() > 1 else 1.0)
    assert run.metrics["ndcg_at_k"] == pytest.approx(np.mean(ndcgs), abs=1e-9)
