"""A diverged model's NaN predictions at evaluation are a named error, not torchmetrics' raw
``ValueError``."""

from __future__ import annotations

import pytest
import torch

from tzrun.errors import NonFinitePredictionError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.evaluate import update_metric
from tzrun.runner.model import StepOutput
from tzrun.runner.slots import MetricSlot


def _out(probs: torch.Tensor) -> StepOutput:
    labels = {"label": (torch.arange(probs.numel()) % 2).float()}
    return StepOutput(torch.tensor(0.0), {}, {"probs": probs}, labels, torch.ones(probs.numel()), probs.numel(), {}, None)


@pytest.fixture
def auc():
    registries = collect_registries(make_plugin_manager())
    entry = registries["metric"].get("auc", "metrics")
    return entry.build(entry.config())


def test_nan_predictions_at_eval_name_the_step_the_output_and_the_metric(auc):
    slot = MetricSlot("auc", "probs", "label", None)
    update_metric(auc, slot, _out(torch.tensor([0.2, 0.7, 0.4, 0.9])), step=30)
    with pytest.raises(NonFinitePredictionError,
                       match=r"the evaluation at step 40: output 'probs' holds 2 NaN or infinite prediction\(s\) of 4 \(metric 'auc'\)"):
        update_metric(auc, slot, _out(torch.tensor([0.2, float("nan"), float("nan"), 0.9])), step=40)

