"""Training end to end through `tzrec-run`, in one process and under torchrun with 2 ranks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import roc_auc_score

from tests.conftest import EXAMPLE, cli, example_overrides
from tests.warm_ranks import warm_cli
from tzrun.runner.checkpoint import MARKER, list_checkpoints
from tzrun_plugins.metrics.auc import binary_auc
from tzrun.errors import EXIT_CONFIG

pytestmark = pytest.mark.slow


def _sets(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def _results(model_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (model_dir / "eval_results.jsonl").read_text().splitlines()]


def test_train_in_one_process_evaluates_and_checkpoints(criteo_dir, tmp_path):
    model_dir = tmp_path / "run"
    proc = cli(["train", str(EXAMPLE), *_sets(example_overrides(criteo_dir, model_dir, "train.save_checkpoints_steps=5"))])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 12,000 rows at 1,024 per step: 12 steps; checkpoints and evals at 5, 10 and 12
    assert [s for s, _ in list_checkpoints(model_dir)] == [5, 10, 12]
    assert all((p / MARKER).is_file() and (p / "state" / ".metadata").is_file() for _, p in list_checkpoints(model_dir))
    results = _results(model_dir)
    assert [r["step"] for r in results] == [5, 10, 12]
    assert all(r["rows"] == 3001 for r in results)  # every eval row once, padding excluded
    assert 0.55 < results[-1]["auc"] <= 1.0  # it learned something in 12 steps
    assert "final eval at step 12 over 3001 rows: auc=" in proc.stdout
    assert f"checkpoint: {model_dir / 'checkpoints' / 'step-12'}" in proc.stdout
    assert "tzrun.progress: step 4/12 epoch 0  loss=" in proc.stderr  # the progress stage logged
    meta = json.loads((model_dir / "checkpoints" / "step-12" / "meta.json").read_text())
    assert meta["step"] == 12 and meta["world_size"] == 1
    assert {"tzrun_plugins.optim", "tzrun_plugins.models"} <= {p["name"] for p in meta["plugins"]}


def test_model_dir_with_checkpoints_is_refused_without_overwrite(criteo_dir, tmp_path):
    model_dir = tmp_path / "run"
    sets = _sets(example_overrides(criteo_dir, model_dir, "train.num_epochs=1"))
    assert cli(["train", str(EXAMPLE), *sets]).returncode == 0
    before = sorted(p.name for p in (model_dir / "checkpoints").iterdir())
    again = cli(["train", str(EXAMPLE), *sets])
    assert again.returncode == EXIT_CONFIG
    assert f"{model_dir} already has checkpoints (latest: step-12); pass --resume to continue from it, --overwrite" in again.stderr
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == before  # nothing lost
    assert cli(["train", str(EXAMPLE), *sets, "--overwrite"]).returncode == 0
    assert len(_results(model_dir)) == 1  # the old results went with --overwrite


METRICS = (
    'metrics=[{type = "auc"}, {type = "grouped_auc", group_by = "cat_5"}, '
    '{type = "grouped_xauc", group_by = "cat_5", prediction = "probs"}, {type = "xauc", prediction = "probs"}, '
    '{type = "log_loss"}, {type = "normalized_entropy"}, {type = "calibration"}, {type = "accuracy"}, '
    '{type = "mae", prediction = "probs"}, {type = "mse", prediction = "probs"}, {type = "rmse", prediction = "probs"}]'
)


@pytest.mark.multiproc
def test_two_ranks_train_and_their_auc_is_the_one_process_auc_of_the_same_predictions(criteo_dir, tmp_path):
    model_dir = tmp_path / "run2"
    # eval batches of 750: rank 0 has 1,500 rows (2 batches), rank 1 has 1,501 (3): rank 0 pads
    overrides = example_overrides(criteo_dir, model_dir, "data.eval_batch_size=750", "eval.save_predictions=true", METRICS)
    proc = warm_cli(["train", str(EXAMPLE), *_sets(overrides), "--nproc-per-node", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 6,000 rows per rank at 1,024 per step: 6 steps
    result = _results(model_dir)[-1]
    assert result["step"] == 6 and result["rows"] == 3001
    files = sorted((model_dir / "predictions" / "step-6").glob("rank-*.parquet"))
    assert [f.name for f in files] == ["rank-0.parquet", "rank-1.parquet"]
    tables = [pq.read_table(f) for f in files]
    assert [t.num_rows for t in tables] == [1500, 1501]
    probs = np.concatenate([t.column("probs").to_numpy() for t in tables])
    labels = np.concatenate([t.column("label/label").to_numpy() for t in tables])
    import torch

    one_process = binary_auc(torch.from_numpy(probs), torch.from_numpy(labels))
    assert result["auc"] == pytest.approx(one_process, abs=1e-6)
    assert result["auc"] == pytest.approx(roc_auc_score(labels, probs), abs=1e-6)
    # every metric over the 2 ranks equals the metric over all rows in this one process; the
    # cat_5 groups (and their duplicates) are split across the ranks
    groups = np.concatenate([t.column("group/cat_5").to_numpy() for t in tables])
    assert len(set(tables[0].column("group/cat_5").to_numpy()) & set(tables[1].column("group/cat_5").to_numpy())) > 5
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries
    from tzrun.testing import load_config_text

    registries = collect_registries(make_plugin_manager())
    cfg, _ = load_config_text(EXAMPLE.read_text(), overrides=[*overrides[:2], METRICS])
    p, y, g = torch.from_numpy(probs), torch.from_numpy(labels), torch.from_numpy(groups)
    for component in cfg.metrics:
        metric = registries["metric"].get(component.type, "x").build(component.config)
        if component.fields.group_by:
            metric.update(p, y, torch.ones_like(p), group=g)
        else:
            metric.update(p, y, torch.ones_like(p))
        name = component.fields.name or component.type
        assert result[name] == pytest.approx(float(metric.compute()), abs=1e-6), name
    # the eval labels are exactly the eval split's labels (each row once)
    eval_labels = pq.read_table(criteo_dir / "eval").column("label").to_numpy()
    assert sorted(labels.tolist()) == sorted(eval_labels.astype(np.float32).tolist())
    meta = json.loads((model_dir / "checkpoints" / "step-6" / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert sorted(p.name for p in (model_dir / "checkpoints" / "step-6" / "state").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
