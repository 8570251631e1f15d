"""Tests for tzrun_plugins.metrics.pointwise against direct numpy formulas, with weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss as sk_log_loss
from torchmetrics.classification import BinaryAccuracy

from tzrun_plugins.metrics.options import AccuracyConfig, LogLossConfig, NoOptionsConfig
from tzrun_plugins.metrics.pointwise import (
    MAE,
    MSE,
    RMSE,
    Accuracy,
    Calibration,
    LogLoss,
    NormalizedEntropy,
    build_accuracy,
    build_log_loss,
    build_normalized_entropy,
)


def _binary(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g)
    p[:5] = torch.tensor([0.0, 1.0, 0.5, 1e-9, 1.0 - 1e-7])  # edges: clamping, the threshold
    y = (torch.rand(n, generator=g) < p).float()
    w = torch.rand(n, generator=g) * 2
    w[::7] = 0.0  # padding
    return p, y, w


def _fed(metric, p, y, w, batches=3):
    for idx in torch.tensor_split(torch.arange(p.numel()), batches):
        metric.update(p[idx], y[idx], None if w is None else w[idx])
    return float(metric.compute())


def _numpy_log_loss(p, y, w, eps=1e-12):
    q = np.clip(p.double().numpy(), eps, 1 - eps)
    y, w = y.double().numpy(), w.double().numpy()
    return float((w * -(y * np.log(q) + (1 - y) * np.log(1 - q))).sum() / w.sum())


def test_log_loss() -> None:
    p, y, w = _binary(3000, 0)
    assert _fed(LogLoss(), p, y, w) == pytest.approx(_numpy_log_loss(p, y, w), rel=1e-12)
    assert _fed(LogLoss(), p, y, None) == pytest.approx(_numpy_log_loss(p, y, torch.ones(3000)), rel=1e-12)
    inner = slice(5, None)  # away from the clamped edges sklearn clips differently
    keep = w[inner] > 0
    expected = sk_log_loss(y[inner][keep].numpy(), p[inner][keep].double().numpy(), sample_weight=w[inner][keep].numpy())
    assert _fed(LogLoss(), p[inner], y[inner], w[inner]) == pytest.approx(expected, rel=1e-9)
    assert _fed(build_log_loss(LogLossConfig(eps=1e-3)), p, y, w) == pytest.approx(_numpy_log_loss(p, y, w, 1e-3), rel=1e-12)


def test_log_loss_accepts_soft_labels() -> None:
    p, _, w = _binary(500, 1)
    y = torch.rand(500, generator=torch.Generator().manual_seed(2))
    assert _fed(LogLoss(), p, y, w) == pytest.approx(_numpy_log_loss(p, y, w), rel=1e-12)


def test_normalized_entropy() -> None:
    p, y, w = _binary(3000, 3)
    wn, yn = w.double().numpy(), y.double().numpy()
    rate = (wn * yn).sum() / wn.sum()
    entropy = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    expected = _numpy_log_loss(p, y, w) / entropy
    assert _fed(NormalizedEntropy(), p, y, w) == pytest.approx(expected, rel=1e-12)
    assert _fed(build_normalized_entropy(LogLossConfig()), p, y, w) == pytest.approx(expected, rel=1e-12)
    # predicting the base rate everywhere gives exactly 1
    base = torch.full((3000,), float(rate), dtype=torch.float64)
    assert _fed(NormalizedEntropy(), base, y, w) == pytest.approx(1.0, rel=1e-12)


def test_calibration() -> None:
    p, y, w = _binary(2000, 4)
    expected = float((w.double() * p.double()).sum() / (w.double() * y.double()).sum())
    assert _fed(Calibration(), p, y, w) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("compare", [">", ">="])
@pytest.mark.parametrize("threshold", [0.5, 0.3, 0.0, 1.0])
def test_accuracy(threshold: float, compare: str) -> None:
    p, y, w = _binary(2000, 5)
    p = torch.round(p * 10) / 10  # many probabilities equal to the threshold
    wn, pn = w.double().numpy(), p.numpy()
    positive = pn > np.float32(threshold) if compare == ">" else pn >= np.float32(threshold)
    correct = (positive == (y.numpy() == 1)).astype(np.float64)
    expected = float((wn * correct).sum() / wn.sum())
    metric = build_accuracy(AccuracyConfig(threshold=threshold, compare=compare))
    assert _fed(metric, p, y, w) == pytest.approx(expected, rel=1e-12)


def test_accuracy_at_the_threshold_follows_torchmetrics_by_default() -> None:
    # issue 18's case: p = [.5, .5, .5], y = [1, 1, 0]; torchmetrics (TorchEasyRec's accuracy)
    # predicts positive only above the threshold: 1 of 3 right
    preds, target = torch.tensor([0.5, 0.5, 0.5]), torch.tensor([1.0, 1.0, 0.0])
    expected = float(BinaryAccuracy(threshold=0.5)(preds, target.long()))
    assert expected == pytest.approx(1 / 3)
    for metric, value in ((Accuracy(), 1 / 3), (Accuracy(compare=">"), 1 / 3), (Accuracy(compare=">="), 2 / 3)):
        metric.update(preds, target)
        assert float(metric.compute()) == pytest.approx(value, abs=1e-15)
    assert float(_fed(Accuracy(), preds, target, torch.ones(3))) == pytest.approx(expected, abs=1e-7)


def test_accuracy_matches_torchmetrics_on_random_rows() -> None:
    p, y, _ = _binary(3000, 9)
    p = torch.round(p * 20) / 20
    for threshold in (0.5, 0.25, 0.05):
        ours = _fed(Accuracy(threshold=threshold), p, y, torch.ones_like(p))
        assert ours == pytest.approx(float(BinaryAccuracy(threshold=threshold)(p, y.long())), abs=1e-6)


def test_regression_errors() -> None:
    g = torch.Generator().manual_seed(6)
    p, y, w = torch.randn(2500, generator=g) * 3, torch.randn(2500, generator=g) * 3, torch.rand(2500, generator=g)
    w[::5] = 0.0
    d, wn = (p.double() - y.double()).numpy(), w.double().numpy()
    mse = float((wn * d**2).sum() / wn.sum())
    assert _fed(MAE(), p, y, w) == pytest.approx(float((wn * np.abs(d)).sum() / wn.sum()), rel=1e-12)
    assert _fed(MSE(), p, y, w) == pytest.approx(mse, rel=1e-12)
    assert _fed(RMSE(), p, y, w) == pytest.approx(math.sqrt(mse), rel=1e-12)
    assert _fed(MSE(), p, y, None) == pytest.approx(float((d**2).mean()), rel=1e-12)


def test_padding_rows_change_nothing() -> None:
    p, y, w = _binary(300, 7)
    keep = w > 0
    for cls in (LogLoss, NormalizedEntropy, Calibration, Accuracy, MAE, MSE, RMSE):
        clean = _fed(cls(), p[keep], y[keep], w[keep], batches=1)
        junk_p, junk_y = p.clone(), y.clone()
        junk_p[~keep], junk_y[~keep] = float("nan"), 7.0  # invalid values, weight 0
        assert _fed(cls(), junk_p, junk_y, w) == pytest.approx(clean, rel=1e-12), cls.__name__


def test_split_across_instances_equals_one_instance() -> None:
    p, y, w = _binary(3000, 8)
    owner = torch.randint(0, 3, (3000,), generator=torch.Generator().manual_seed(9))
    for cls in (LogLoss, NormalizedEntropy, Calibration, Accuracy, MAE, MSE, RMSE):
        expected = _fed(cls(), p, y, w, batches=1)
        parts = [cls() for _ in range(3)]
        for r, part in enumerate(parts):
            part.update(p[owner == r], y[owner == r], w[owner == r])
        for part in parts[1:]:
            parts[0].merge_state(part)
        assert float(parts[0].compute()) == pytest.approx(expected, rel=1e-12), cls.__name__


@pytest.mark.parametrize(
    ("metric", "target", "match"),
    [
        (NormalizedEntropy(), torch.ones(4), "base rate"),
        (NormalizedEntropy(), torch.zeros(4), "base rate"),
        (Calibration(), torch.zeros(4), "no label is positive"),
    ],
)
def test_undefined_is_nan_with_warning(metric, target: torch.Tensor, match: str) -> None:
    metric.update(torch.full((4,), 0.3), target)
    with pytest.warns(RuntimeWarning, match=match):
        assert math.isnan(float(metric.compute()))


def test_no_rows_is_nan_with_warning() -> None:
    metric = MSE()
    metric.update(torch.rand(3), torch.rand(3), torch.zeros(3))
    with pytest.warns(RuntimeWarning, match="no rows"):
        assert math.isnan(float(metric.compute()))


@pytest.mark.parametrize(
    ("metric", "preds", "target", "match"),
    [
        (LogLoss(), torch.tensor([-1.0, 2.0]), torch.tensor([0.0, 1.0]), "probabilities"),
        (Calibration(), torch.tensor([0.2, 1.5]), torch.tensor([0.0, 1.0]), "probabilities"),
        (LogLoss(), torch.tensor([0.2, 0.5]), torch.tensor([0.0, 1.5]), r"\[0, 1\]"),
        (Accuracy(), torch.tensor([0.2, 0.5]), torch.tensor([0.0, 0.5]), "0 or 1"),
        (MSE(), torch.tensor([0.2, float("nan")]), torch.tensor([0.0, 1.0]), "NaN"),
        (MAE(), torch.tensor([0.2, 0.1]), torch.tensor([0.0, float("inf")]), "finite"),
    ],
)
def test_bad_input(metric, preds: torch.Tensor, target: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        metric.update(preds, target)


def test_configs() -> None:
    with pytest.raises(ValueError, match="eps"):
        LogLossConfig(eps=0.0)
    with pytest.raises(ValueError, match="threshold"):
        AccuracyConfig(threshold=1.5)
    with pytest.raises(ValueError, match="compare"):
        AccuracyConfig(compare="=>")
    NoOptionsConfig()


def test_binned_auc_is_labelled_as_such_in_results():
    from tests.core.test_config import MINIMAL
    from tzrun.runner.slots import metric_slots
    from tzrun.testing import load_config_text

    cfg, registries = load_config_text(MINIMAL, overrides=['metrics=[{type = "auc"}, {type = "auc", thresholds = 200}]'])
    assert [s.name for s in metric_slots(cfg, registries)] == ["auc", "auc_binned200"]
