"""Training in the test process: a plugin defined in the test drives a real run, and the
checkpoint it writes loads back into a freshly built model."""

from __future__ import annotations

import attrs
import pytest
import torch

import tzrun
from tests.conftest import EXAMPLE, example_overrides
from tzrun.runner.build import build_run
from tzrun.runner.checkpoint import load_checkpoint
from tzrun.runner.distributed import init_distributed, shutdown_distributed
from tzrun.runner.session import Session
from tzrun.runner.trainer import train

pytestmark = pytest.mark.slow


@attrs.frozen
class CountingSGDConfig:
    lr: float


def _local(value):
    return value.local_shards()[0].tensor if hasattr(value, "local_shards") else value


def test_inline_plugin_optimizer_trains_a_run_and_its_checkpoint_loads_back(criteo_dir, tmp_path):
    steps = []

    class CountingSGD(torch.optim.SGD):
        def step(self, closure=None):
            if len(self.param_groups[0]["params"]) > 1:  # the run's, not the conformance check's toy parameter
                steps.append(1)
            return super().step(closure)

    class Counting:
        @tzrun.hookimpl
        def tzrun_register_dense_optimizers(self, register):
            register("counting_sgd", config=CountingSGDConfig, build=lambda cfg, params: CountingSGD(params, lr=cfg.lr))

    session = Session.from_config(
        EXAMPLE, example_overrides(criteo_dir, tmp_path / "run", 'train.dense_optimizer={type="counting_sgd", lr=0.1}'),
        plugins=[("counting", Counting())])
    try:
        result = train(session)
        assert result.steps == 12 and len(steps) == 12  # the plugin's optimizer did every dense step
        assert result.eval is not None and result.eval.rows == 3001
        trained = {k: _local(v).clone() for k, v in result.model.state_dict().items()}

        torch.manual_seed(12345)  # a different initialisation
        fresh = build_run(session.facts, init_distributed()).model
        fresh_state = {k: _local(v) for k, v in fresh.state_dict().items()}
        assert set(fresh_state) == set(trained)
        assert any(not torch.equal(fresh_state[k], trained[k]) for k in trained)
        load_checkpoint(result.checkpoint, {"model": fresh})
        for key, value in fresh.state_dict().items():
            assert torch.equal(_local(value), trained[key]), key
    finally:
        shutdown_distributed()


def test_loading_an_incomplete_checkpoint_is_refused(tmp_path):
    (tmp_path / "state").mkdir()
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint(tmp_path, {"model": torch.nn.Linear(1, 1)})
