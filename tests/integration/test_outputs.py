"""What a person reads after a run: the learning-rate groups named after their embedding modules
(log line, ``metrics.jsonl``), the epoch ``ckpt ls`` shows agreeing with the train log, the
TensorBoard runs without a ``tensorboard/`` level, and ``tzrec-run plot``'s PNG files."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import cli
from tzrun.testing import tiny_config_text

pytestmark = pytest.mark.slow

STAGES = 'train.stages=[{type = "progress", mode = "lines"}, {type = "metrics_log"}, {type = "tensorboard"}]'


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory, criteo_dir):
    """Exactly one epoch (12,000 rows at 2,048 a step: 6 steps), logged every 2 steps,
    checkpointed and evaluated every 3."""
    tmp = tmp_path_factory.mktemp("outputs")
    config = tmp / "run.toml"
    config.write_text(tiny_config_text(criteo_dir, tmp / "run").replace("num_steps = 4", "num_epochs = 1"))
    proc = cli(["train", str(config), "--set", "data.batch_size=2048", "--set", "train.log_every_n_steps=2",
                    "--set", "train.save_checkpoints_steps=3", "--set", STAGES])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, tmp / "run"


def test_the_sparse_learning_rate_groups_are_named_with_their_tables(one_epoch):
    proc, model_dir = one_epoch
    assert "learning-rate group sparse/deep_ebc holds cat_0_emb, cat_5_emb, cat_8_emb" in proc.stderr
    assert "learning-rate group sparse/wide_ebc holds cat_0_emb_wide, cat_5_emb_wide, cat_8_emb_wide" in proc.stderr
    train = [r for r in map(json.loads, (model_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert set(train[0]["learning_rates"]) == {"sparse/deep_ebc", "sparse/wide_ebc", "dense"}
    assert re.search(r"step 2/6 epoch 0 .* lr/sparse/deep_ebc=0\.1 lr/sparse/wide_ebc=0\.1 lr/dense=0\.1 ", proc.stderr)


def test_ckpt_ls_names_the_epoch_the_train_log_named(one_epoch):
    proc, model_dir = one_epoch
    logged = {int(s): int(e) for s, e in re.findall(r"tzrun\.progress: step (\d+)/6 epoch (\d+)", proc.stderr)}
    assert logged == {2: 0, 4: 0, 6: 0}
    listed = json.loads(cli(["ckpt", "ls", str(model_dir), "--json"]).stdout)
    assert [(c["step"], c["epoch"]) for c in listed] == [(3, 0), (6, 0)]  # the last step of epoch 0 is in epoch 0
    text = cli(["ckpt", "inspect", str(model_dir / "checkpoints" / "step-6")]).stdout
    assert "step        6, epoch 0, world size 1" in text
    assert "data        resumes in epoch 1, 0 step(s) into it" in text  # where a resumed run goes on


def test_tensorboard_runs_are_the_model_dirs_own(one_epoch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, model_dir = one_epoch
    assert not (model_dir / "tensorboard").exists()
    # `tensorboard --logdir <parent>` names the runs run/train and run/eval
    evaluation = EventAccumulator(str(model_dir / "eval"))
    evaluation.Reload()
    assert [e.step for e in evaluation.Scalars("metric/auc")] == [3, 6]
    train = EventAccumulator(str(model_dir / "train"))
    train.Reload()
    assert "lr/sparse/deep_ebc" in train.Tags()["scalars"]


def test_plot_draws_the_run(one_epoch, tmp_path):
    _, model_dir = one_epoch
    plotted = cli(["plot", str(model_dir), "--out", str(tmp_path)])
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    names = sorted(p.rsplit("/", 1)[-1] for p in plotted.stdout.split())
    assert names == ["eval.png", "learning_rates.png", "loss.png", "throughput.png"]
    assert all((tmp_path / n).read_bytes().startswith(b"\x89PNG") for n in names)
