"""One process: a run's log file in the model dir grows across a resume, and ``train`` and
``evaluate`` print their results as JSON with ``--json`` (the schema of docs/cli.md) while the
logs stay on standard error. (The 2-rank case, with a failing rank, is in
``test_collective_failure.py``.)"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import cli
from tzrun.testing import TINY_CONFIG

pytestmark = [pytest.mark.slow]

DATED = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def test_resume_appends_to_the_log_file_and_train_and_evaluate_print_json(criteo_dir, tmp_path):
    model_dir = tmp_path / "run"
    config = tmp_path / "tiny.toml"
    config.write_text(TINY_CONFIG.format(model_dir=model_dir, data_dir=criteo_dir))
    first = cli(["train", str(config), "--set", "train.save_checkpoints_steps=2", "--json"])
    assert first.returncode == 0, first.stderr[-3000:]
    result = json.loads(first.stdout)  # standard output is the JSON alone
    assert result["steps"] == 4 and result["model_dir"] == str(model_dir)
    assert result["checkpoint"] == str(model_dir / "checkpoints" / "step-4")
    assert result["eval"]["step"] == 4 and result["eval"]["rows"] > 0 and 0 < result["eval"]["metrics"]["auc"] < 1
    assert result["seconds"] > 0 and result["samples_per_second"] > 0
    assert result["stopped_by"] is None and result["stop_reason"] is None
    assert "INFO [rank 0] tzrun: training 4 steps" in first.stderr  # the logs went to standard error
    log = (model_dir / "logs" / "train.log").read_text()
    assert re.search(rf"^{DATED} INFO \[rank 0\] tzrun: training 4 steps ", log, re.M), log

    resumed = cli(["train", str(config), "--set", "train.num_steps=6", "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.startswith("trained 6 steps")  # without --json, the lines as before
    after = (model_dir / "logs" / "train.log").read_text()
    assert after.startswith(log) and re.search(rf"^{DATED} INFO \[rank 0\] tzrun: resuming from ", after[len(log):], re.M)

    evaluated = cli(["evaluate", str(config), "--checkpoint", "latest", "--json"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    evaluation = json.loads(evaluated.stdout)
    assert evaluation == {"checkpoint": str(model_dir / "checkpoints" / "step-6"), "ema": False, "step": 6,
                          "rows": evaluation["rows"], "metrics": evaluation["metrics"],
                          "seconds": evaluation["seconds"], "recorded_in": str(model_dir / "eval_results.jsonl")}
    assert 0 < evaluation["seconds"] < 60  # the pass alone
    assert set(evaluation["metrics"]) == {"auc", "loss/binary_cross_entropy"} and evaluation["rows"] > 0
