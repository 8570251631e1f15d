"""The ``mlflow`` stage against a real MLflow tracking server the test starts on 127.0.0.1
(``mlflow server`` with a SQLite store), read back with MLflow's own client: the same train and
eval values as ``metrics.jsonl``, the resolved config as params, the checkpoint path as a tag;
and a server that is not there is one warning, not a dead run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import cli
from tests.s3_server import wait_until_answered
from tzrun.testing import tiny_config_text

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory) -> Iterator[str]:
    """``mlflow server`` on a free loopback port, with a SQLite backend store in a temp dir, and
    without MLflow 3's job executor (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION``: its start held the
    server's for 50 s on 2 cores; the stage runs no server jobs)."""
    pytest.importorskip("mlflow", reason="the mlflow stage's test needs MLflow (the test extra installs it)")
    pytest.importorskip("sqlalchemy", reason="the MLflow tracking server needs SQLAlchemy (the test extra)")
    home = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    log = open(home / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}", "--default-artifact-root", str(home / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, cwd=home, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    if not wait_until_answered(f"{uri}/health", server, 180):
        server.kill()
        raise RuntimeError(f"mlflow server did not start: {(home / 'server.log').read_text()[-3000:]}")
    yield uri
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _train(tmp: Path, criteo_dir: Path, stage: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    config = tmp / "run.toml"
    config.write_text(tiny_config_text(criteo_dir, tmp / "run"))
    sets = ["train.num_steps=6", "train.log_every_n_steps=2", "train.save_checkpoints_steps=3",
            f'train.stages=[{{type = "metrics_log"}}, {stage}]', *overrides]
    return cli(["train", str(config), *[a for s in sets for a in ("--set", s)]])


def test_the_mlflow_run_holds_what_metrics_jsonl_holds(tracking_uri, tmp_path, criteo_dir):
    from mlflow.tracking import MlflowClient

    proc = _train(tmp_path, criteo_dir, f'{{type = "mlflow", tracking_uri = "{tracking_uri}", experiment = "tzrun-test", '
                                        'run_name = "tiny", tags = { team = "ranking" }}')
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "mlflow stage" not in proc.stderr  # no warning

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("tzrun-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny"
    model_dir = tmp_path / "run"
    assert run.data.tags["team"] == "ranking" and run.data.tags["tzrun.model_dir"] == str(model_dir)
    assert run.data.tags["tzrun.checkpoint"] == str(model_dir / "checkpoints" / "step-6")
    params = run.data.params
    assert params["model.type"] == "deepfm" and params["data.batch_size"] == "256"
    assert params["train.num_steps"] == "6" and params["features.sparse.1.name"] == "cat_5"
    assert params["train.stages.1.type"] == "mlflow"

    records = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    expected: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r["kind"] == "train":
            values = {"loss": r["loss"], "samples_per_s": r["samples_per_s"], "data_wait_fraction": r["data_wait_fraction"],
                      "grad_norm": r["grad_norm"], **{f"loss/{k}": v for k, v in r["losses"].items()},
                      **{f"lr/{k}": v for k, v in r["learning_rates"].items()},
                      **{f"loss_weight/{k}": v for k, v in r["loss_weights"].items()},
                      **{f"train_metric/{k}": v for k, v in r["metrics"].items()}}
        else:
            values = {f"eval/{k}": v for k, v in r["metrics"].items()}
        for key, value in values.items():
            expected.setdefault(key, []).append((r["step"], value))
    assert set(run.data.metrics) == set(expected)
    for key, points in expected.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert [s for s, _ in history] == [s for s, _ in points], key
        assert [v for _, v in history] == pytest.approx([v for _, v in points], rel=1e-12), key
    assert [s for s, _ in expected["eval/auc"]] == [3, 6] and [s for s, _ in expected["loss"]] == [2, 4, 6]


def test_a_tracking_server_that_is_not_there_is_a_warning_not_a_dead_run(tmp_path, criteo_dir):
    pytest.importorskip("mlflow", reason="the mlflow stage needs MLflow's client (the mlflow extra)")
    gone = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    proc = _train(tmp_path, criteo_dir, f'{{type = "mlflow", tracking_uri = "{gone}", request_timeout = 2, max_retries = 0}}')
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "trained 6 steps" in proc.stdout
    warned = [line for line in proc.stderr.splitlines() if "mlflow stage: could not" in line]
    assert len(warned) == 1, proc.stderr[-4000:]
    assert f"could not start the run at {gone}" in warned[0]
    assert warned[0].endswith("training goes on, and this run logs nothing more to MLflow")
