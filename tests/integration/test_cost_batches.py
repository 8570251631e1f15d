"""Cost-aware batches in real runs: stopped and resumed in one process, bit-identical to the
uninterrupted run; on two ranks (torchrun, gloo) the ranks step together to a clean end."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import EXAMPLE, example_overrides
from tests.warm_ranks import warm_cli
from tests.integration.test_resume import Losses, _train
from tests.integration.test_train import _results, _sets
from tests.integration.test_update_path import weights
from tzrun.runner.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

#: a batch closes before its positives pass 200 (about 800 of the 1,024 rows at a 0.25 positive rate)
COST = ("data.batch_cost_size=200", 'data.sample_cost="label"')


def _plan(criteo_dir, world_size: int, cap: int = 200) -> tuple[int, list[int]]:
    """Every rank's step count of a cost-batched epoch, planned as the run plans it, and each
    rank's own batch count."""
    from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig
    from tzrun.data.cost import BatchCost
    from tzrun.data.features import BatchBuilder, feature_specs
    from tzrun.data.loader import RankInput
    from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader

    builder = BatchBuilder(feature_specs(FeaturesConfig(dense=(DenseFeatureConfig("int_0"),))), ["label"], None)
    inputs = [RankInput(ParquetReader(ParquetConfig()), str(criteo_dir / "train"), 1024, 0, ["label"], builder, rank,
                        world_size, cost=BatchCost(cap, "label", column="label")) for rank in range(world_size)]
    steps = {i.steps for i in inputs}
    assert len(steps) == 1
    return steps.pop(), [i.split.num_batches for i in inputs]


def test_a_cost_batched_run_stopped_and_resumed_is_the_uninterrupted_run(tmp_path, criteo_dir):
    per_epoch, _ = _plan(criteo_dir, 1)
    assert per_epoch > 12  # more steps than 12,000 rows in batches of 1,024: the cap closes batches
    whole = Losses()
    uninterrupted = _train(tmp_path, criteo_dir, "whole", whole, *COST)
    assert uninterrupted.steps == 18
    first = Losses(signal_at=7)
    stopped = _train(tmp_path, criteo_dir, "split", first, *COST)
    assert stopped.stopped_by == "SIGUSR1" and [s for s, _ in list_checkpoints(tmp_path / "split")] == [5, 7]
    meta = json.loads((tmp_path / "split" / "checkpoints" / "step-7" / "meta.json").read_text())
    assert meta["data"]["layout"]["batch_cost"] == [200, "label"]
    assert sum(b - a for a, b in meta["data"]["consumed_rows"]) < 7 * 1024  # cost batches are smaller
    rest = Losses()
    resumed = _train(tmp_path, criteo_dir, "split", rest, *COST, resume=True)
    assert resumed.steps == 18 and resumed.stopped_by is None
    assert {**first.steps, **rest.steps} == whole.steps  # the same loss and lr at every step, exactly
    a, b = weights(uninterrupted.model), weights(resumed.model)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.multiproc
def test_two_ranks_with_cost_batches_step_together_and_end_cleanly(criteo_dir, tmp_path):
    per_epoch, own = _plan(criteo_dir, 2, cap=150)
    assert own == [11, 10] and per_epoch == 11  # rank 1 pads its last step of each epoch
    model_dir = tmp_path / "run"
    overrides = example_overrides(criteo_dir, model_dir, "train.num_epochs=2", "data.num_workers=1",
                                  "data.batch_cost_size=150", 'data.sample_cost="label"')
    proc = warm_cli(["train", str(EXAMPLE), *_sets(overrides), "--nproc-per-node", "2"], timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(model_dir)[-1]["step"] == 2 * per_epoch
