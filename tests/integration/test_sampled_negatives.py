"""DSSM with sampled negatives (``[data.sampler]``): it trains in one process and on two ranks,
and a run stopped by a signal and resumed draws the same negatives as an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.warm_ranks import warm_cli
from tests.integration.test_resume import Losses
from tests.integration.test_update_path import _process_group, weights  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.trainer import train
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "dssm_taobao_sampled.toml"


@pytest.fixture(scope="module")
def taobao(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,048 train and 1,024 eval rows of synthetic Taobao data with its items.parquet (read-only)."""
    from tzrun_tools.synth_taobao import synth_taobao

    root = tmp_path_factory.mktemp("taobao")
    synth_taobao(root, rows=2048, eval_rows=1024, seed=1, rows_per_file=1024, row_group_size=512)
    return root


def _overrides(taobao: Path, model_dir: Path, *extra: str) -> list[str]:
    return [
        f'data.train_input="{taobao / "train"}"',
        f'data.eval_input="{taobao / "eval"}"',
        f'data.sampler.item_table="{taobao / "items.parquet"}"',
        f'model_dir="{model_dir}"',
        "data.batch_size=256",  # 8 steps per epoch
        "data.eval_batch_size=512",
        "data.sampler.num_negatives=32",
        "model.user_hidden_units=[16]",
        "model.item_hidden_units=[16]",
        "model.output_dim=8",
        *extra,
    ]


def _train(taobao: Path, model_dir: Path, recorder: Losses, *extra: str, resume: bool = False):
    pm = make_plugin_manager(plugins=[("losses", recorder)])
    registries = collect_registries(pm)
    raw = parse_config(EXAMPLE.read_text(), str(EXAMPLE), _overrides(taobao, model_dir, *extra))
    return train(Session(load_config(raw, registries), raw, pm, registries), resume=resume)


def test_dssm_trains_on_sampled_negatives(taobao, tmp_path):
    losses = Losses()
    result = _train(taobao, tmp_path / "run", losses, "train.num_epochs=3", "model.temperature=0.1")
    assert result.steps == 24
    first = sum(losses.steps[s][0] for s in range(1, 5)) / 4
    last = sum(losses.steps[s][0] for s in range(21, 25)) / 4
    assert last < first - 0.1, (first, last)  # log(33) = 3.5 at the start
    evaluation = json.loads((tmp_path / "run" / "eval_results.jsonl").read_text().splitlines()[-1])
    assert evaluation["recall_at_5_sampled"] > 5 / 33  # better than ranking at random among 1 + 32


def test_a_run_stopped_and_resumed_draws_the_same_negatives(taobao, tmp_path):
    options = ("train.num_steps=12", "train.save_checkpoints_steps=5", "data.num_workers=2", "data.shuffle_buffer_rows=512")
    whole = Losses()
    uninterrupted = _train(taobao, tmp_path / "whole", whole, *options)
    first = Losses(signal_at=7)  # stopped in the first epoch; resumed across the epoch boundary
    stopped = _train(taobao, tmp_path / "split", first, *options)
    assert stopped.stopped_by == "SIGUSR1" and [s for s, _ in list_checkpoints(tmp_path / "split")] == [5, 7]
    rest = Losses()
    resumed = _train(taobao, tmp_path / "split", rest, *options, resume=True)
    assert resumed.steps == 12
    assert {**first.steps, **rest.steps} == whole.steps  # the same loss at every step, exactly
    a, b = weights(uninterrupted.model), weights(resumed.model)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.multiproc
@pytest.mark.parametrize("gather", [False, True])
def test_dssm_trains_on_sampled_negatives_on_two_ranks(taobao, tmp_path, gather):
    model_dir = tmp_path / "run"
    sets = _overrides(taobao, model_dir, "train.num_epochs=1", "data.num_workers=0",
                      f"model.gather_negatives={str(gather).lower()}")
    proc = warm_cli(["train", str(EXAMPLE), *[a for s in sets for a in ("--set", s)], "--nproc-per-node", "2"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])
    assert result["step"] == 4 and result["rows"] == 1024
    assert 0.0 < result["recall_at_5_sampled"] <= 1.0 and result["loss/sampled_softmax"] > 0.0
    # 50 >= 1 + 32 candidates on a rank retrieve every positive; gathered, there are 1 + 2 * 32
    assert (result["recall_at_50_sampled"] < 1.0) == gather
    meta = json.loads((model_dir / "checkpoints" / "step-4" / "meta.json").read_text())
    assert meta["world_size"] == 2
