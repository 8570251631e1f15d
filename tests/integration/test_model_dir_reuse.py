"""A model dir left by a run that failed before its first checkpoint (issue 17, point 7): a
retry that fixed a feature reuses it without ``--overwrite``; another model is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import cli
from tzrun.errors import EXIT_DATA
from tzrun.runner.run_marker import RUN_MARKER

pytestmark = pytest.mark.slow

CONFIG = """
model_dir = "{model_dir}"
[data]
train_input = "{data}"
batch_size = 32
labels = ["label"]
[model]
type = "deepfm"
deep_hidden_units = [{hidden}]
final_hidden_units = [4]
[[losses]]
type = "binary_cross_entropy"
[train]
num_steps = 6
save_checkpoints_steps = 3
sparse_optimizer = {{ type = "adagrad", lr = 0.05 }}
dense_optimizer = {{ type = "adam", lr = 0.001 }}
[[features.dense]]
name = "d0"
[[features.sparse]]
name = "c0"
num_buckets = 10
embedding_dim = {dim}
"""


def _data(path: Path, null_label_at: int | None) -> None:
    labels = [float(i % 2) for i in range(256)]
    if null_label_at is not None:
        labels[null_label_at] = None
    path.mkdir(exist_ok=True)
    pq.write_table(pa.table({"label": labels, "d0": [0.5] * 256, "c0": [i % 10 for i in range(256)]}), path / "t.parquet")


def _train(tmp_path: Path, hidden: int = 8, dim: int = 4):
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(model_dir=tmp_path / "run", data=tmp_path / "data", hidden=hidden, dim=dim))
    return cli(["train", str(config)])


def test_a_run_that_saved_nothing_is_retried_with_a_fixed_feature_but_not_with_another_model(tmp_path: Path):
    _data(tmp_path / "data", null_label_at=40)  # fails at step 2, before the checkpoint of step 3
    failed = _train(tmp_path)
    assert failed.returncode == EXIT_DATA and "row 40 (counting from 0): column 'label'" in failed.stderr
    assert (tmp_path / "run" / "resolved_config.json").is_file() and not (tmp_path / "run" / "checkpoints").exists()
    first_run = json.loads((tmp_path / "run" / RUN_MARKER).read_text())["run_id"]  # marked before anything else

    other_model = _train(tmp_path, hidden=6)
    assert other_model.returncode != 0
    assert "holds another run (it saved no checkpoint, but its [model] differs)" in other_model.stderr
    assert "model.deep_hidden_units[0]: 8 in the model dir's run, 6 now" in other_model.stderr

    _data(tmp_path / "data", null_label_at=None)
    retried = _train(tmp_path, dim=8)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert "replacing the records of an earlier run that saved no checkpoint" in retried.stderr
    assert "features.sparse[0].embedding_dim: 4 in the model dir's run, 8 now" in retried.stderr
    assert (tmp_path / "run" / "checkpoints" / "step-6").is_dir()
    assert json.loads((tmp_path / "run" / RUN_MARKER).read_text())["run_id"] != first_run  # a run that replaced it

    after_a_checkpoint = _train(tmp_path, dim=4)  # now the dir holds a model: refused as before
    assert after_a_checkpoint.returncode != 0 and "holds another run (resolved_config.json" in after_a_checkpoint.stderr
