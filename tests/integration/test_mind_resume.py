"""MIND draws its routing start from torch's CPU generator at every training batch and checkpoints
that generator's state per rank: a run stopped by a signal and resumed trains exactly as an
uninterrupted one (the same loss at every step, the same weights at the end)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import REPO
from tests.integration.test_resume import Losses
from tests.integration.test_update_path import weights
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.session import Session
from tzrun.runner.trainer import train

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "mind_taobao.toml"
EVAL_INPUT = 'eval_input = "data/taobao_synth/eval"\n'


@pytest.fixture(scope="module")
def taobao(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,024 rows of synthetic Taobao data (read-only)."""
    from tzrun_tools.synth_taobao import synth_taobao

    root = tmp_path_factory.mktemp("mind_taobao")
    synth_taobao(root, rows=1024, eval_rows=128, seed=2, rows_per_file=1024, row_group_size=256)
    return root


def _train(taobao: Path, model_dir: Path, recorder: Losses, resume: bool = False):
    pm = make_plugin_manager(plugins=[("losses", recorder)])
    registries = collect_registries(pm)
    overrides = [
        f'data.train_input="{taobao / "train"}"', f'model_dir="{model_dir}"', "data.batch_size=128", "data.num_workers=0", "data.shuffle_buffer_rows=256", "metrics=[]",
        "train.num_steps=8", "train.save_checkpoints_steps=3",
        "model.user_hidden_units=[8]", "model.history_hidden_units=[8]", "model.max_k=3", "model.high_dim=8",
        "model.concat_hidden_units=[8]", "model.item_hidden_units=[8]", "model.output_dim=8",
    ]
    text = EXAMPLE.read_text()
    assert EVAL_INPUT in text
    raw = parse_config(text.replace(EVAL_INPUT, ""), str(EXAMPLE), overrides)  # no evaluation: training only
    return train(Session(load_config(raw, registries), raw, pm, registries), resume=resume)


def test_a_mind_run_stopped_and_resumed_draws_the_same_routing_starts(taobao, tmp_path):
    whole = Losses()
    uninterrupted = _train(taobao, tmp_path / "whole", whole)
    first = Losses(signal_at=5)  # stopped mid-epoch (8 steps of 128 rows), after the checkpoint at step 3
    stopped = _train(taobao, tmp_path / "split", first)
    assert stopped.stopped_by == "SIGUSR1" and [s for s, _ in list_checkpoints(tmp_path / "split")] == [3, 5]
    rest = Losses()
    resumed = _train(taobao, tmp_path / "split", rest, resume=True)
    assert resumed.steps == 8 and sorted(rest.steps) == [6, 7, 8]
    assert {**first.steps, **rest.steps} == whole.steps  # the same loss at every step, exactly
    a, b = weights(uninterrupted.model), weights(resumed.model)
    for key in a:
        assert torch.equal(a[key], b[key]), key
