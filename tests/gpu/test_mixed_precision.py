"""bf16 and fp16 (with the gradient scaler) training on CUDA, in process, through ``train``.

The run is tests/integration/test_update_path.py's small DeepFM (``CONFIG``); on a CUDA machine
its parts go to ``cuda:0`` with NCCL.
"""

from __future__ import annotations

import math

import pytest
import torch

import tzrun
from tests.integration.test_update_path import (  # noqa: F401  (_process_group: module fixture)
    DtypeProbe,
    _process_group,
    _run_with,
    final_weights,
)
from tests.checkpoint_entries import read_saved
from tzrun.runner.checkpoint import checkpoint_dir


class Probe(DtypeProbe):
    """The dtypes of a Linear's outputs, each step's loss, and the device of the model."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.devices: set[str] = set()

    @tzrun.hookimpl
    def tzrun_before_train(self, run):
        super().tzrun_before_train(run)
        self.devices = {p.device.type for p in run.model.parameters()}

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        self.losses.append(float(step.loss))


@pytest.mark.parametrize(
    ("precision", "dtype", "extra"),
    [
        ("bf16", torch.bfloat16, []),
        ("fp16", torch.float16, ["train.grad_scaler={init_scale = 1024.0}"]),
    ],
)
def test_mixed_precision_trains_on_cuda_with_finite_loss(tmp_path, criteo_dir, precision, dtype, extra):
    probe = Probe()
    result = _run_with(tmp_path, criteo_dir, probe, f'train.mixed_precision="{precision}"', "train.num_steps=8", *extra)
    assert result.steps == 8
    assert probe.devices == {"cuda"}
    assert probe.dtypes == {dtype}
    assert len(probe.losses) == 8 and all(math.isfinite(x) for x in probe.losses), probe.losses
    assert len(set(probe.losses)) > 1  # it trains
    assert all(torch.isfinite(v).all() for v in final_weights(result).values())
    if precision == "fp16":
        scale = read_saved(checkpoint_dir(tmp_path / "run", 8), "update")["scaler"]["scale"]
        assert math.isfinite(scale) and scale > 0  # the scaler ran and was checkpointed
