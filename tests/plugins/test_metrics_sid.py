"""Tests for the SID metrics relative_l1 and unique_ratio (TorchEasyRec's definitions)."""

from __future__ import annotations

import math

import pytest
import torch

from tzrun_plugins.metrics.options import NoOptionsConfig, RelativeL1Config
from tzrun_plugins.metrics.sid import RelativeL1, UniqueRatio, build_relative_l1, build_unique_ratio


def test_relative_l1_hand_computed() -> None:
    # |t - p| / (max(|t|, |p|) + eps) per element, eps = 0:
    # (1, 2): 1/2 ; (2, 2): 0 ; (-1, 3): 4/3 ; (0, 0): 0/0 -> with eps 1e-4 it is 0
    metric = RelativeL1(eps=0.0)
    metric.update(torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 2.0]]))
    metric.update(torch.tensor([[-1.0, 4.0]]), torch.tensor([[3.0, 4.0]]))
    assert float(metric.compute()) == pytest.approx((0.5 + 0 + 4 / 3 + 0) / 4, abs=1e-15)
    default = build_relative_l1(RelativeL1Config())
    default.update(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 3.0]]))
    assert default.eps == 1e-4
    assert float(default.compute()) == pytest.approx((0.0 + 2 / (3 + 1e-4)) / 2, abs=1e-15)


def test_relative_l1_is_the_mean_over_elements_not_rows() -> None:
    # TorchEasyRec aggregates element-wise: a batch of 3 rows of D = 2 weighs 3x a batch of 1
    a = RelativeL1(eps=0.0)
    a.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 2.0]]))  # 1/2 each
    a.update(torch.zeros(3, 2), torch.ones(3, 2))  # 1 each
    assert float(a.compute()) == pytest.approx((2 * 0.5 + 6 * 1.0) / 8, abs=1e-15)


def test_relative_l1_weights_and_padding() -> None:
    g = torch.Generator().manual_seed(0)
    p, t = torch.randn(50, 4, generator=g), torch.randn(50, 4, generator=g)
    w = torch.rand(50, generator=g) * 2
    w[::7] = 0.0
    p[::7] = float("nan")  # padding rows never matter
    metric = RelativeL1()
    metric.update(p, t, w)
    keep = w > 0
    pd, td = p.double(), t.double()
    rel = (td - pd).abs() / (torch.maximum(td.abs(), pd.abs()) + 1e-4)
    expected = (w[keep, None].double() * rel[keep]).sum() / (w[keep].double().sum() * 4)
    assert float(metric.compute()) == pytest.approx(float(expected), rel=1e-12)
    # integer weights = repeated rows
    repeated = RelativeL1()
    repeated.update(torch.cat([p[1:3], p[2:3]]), torch.cat([t[1:3], t[2:3]]))
    weighted = RelativeL1()
    weighted.update(p[1:3], t[1:3], torch.tensor([1.0, 2.0]))
    assert float(weighted.compute()) == pytest.approx(float(repeated.compute()), rel=1e-12)


def test_unique_ratio_hand_computed() -> None:
    # batch 1: 4 rows, 3 distinct -> 0.75 ; batch 2: 2 rows, 1 distinct -> 0.5 ; mean 0.625
    metric = build_unique_ratio(NoOptionsConfig())
    metric.update(torch.tensor([[1, 2], [1, 2], [3, 4], [1, 3]]), torch.zeros(4))
    metric.update(torch.tensor([[7, 7], [7, 7]]), torch.zeros(2))
    assert float(metric.compute()) == pytest.approx(0.625, abs=1e-15)


def test_unique_ratio_is_per_batch_and_skips_padding() -> None:
    metric = UniqueRatio()
    # the same code in two batches counts as distinct in each (TorchEasyRec's proxy)
    metric.update(torch.tensor([[1, 1]]))
    metric.update(torch.tensor([[1, 1], [2, 2], [2, 2]]), None, torch.tensor([1.0, 1.0, 0.0]))
    metric.update(torch.tensor([[5, 5]]), None, torch.tensor([0.0]))  # padding only: skipped
    assert float(metric.compute()) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("make", [RelativeL1, UniqueRatio])
def test_no_rows_is_nan_with_warning(make) -> None:
    with pytest.warns(RuntimeWarning, match="undefined"):
        assert math.isnan(float(make().compute()))


def test_merged_states_equal_one_instance() -> None:
    # what the distributed sum does: split rows (relative_l1) or batches (unique_ratio)
    g = torch.Generator().manual_seed(3)
    p, t = torch.randn(40, 3, generator=g), torch.randn(40, 3, generator=g)
    codes = torch.randint(0, 3, (40, 2), generator=g)
    one_l1, one_ur = RelativeL1(), UniqueRatio()
    parts_l1, parts_ur = [RelativeL1(), RelativeL1()], [UniqueRatio(), UniqueRatio()]
    for i, idx in enumerate(torch.tensor_split(torch.arange(40), 5)):
        one_l1.update(p[idx], t[idx])
        one_ur.update(codes[idx])
        parts_l1[i % 2].update(p[idx], t[idx])
        parts_ur[i % 2].update(codes[idx])
    parts_l1[0].merge_state(parts_l1[1])
    parts_ur[0].merge_state(parts_ur[1])
    assert float(parts_l1[0].compute()) == pytest.approx(float(one_l1.compute()), rel=1e-14)
    assert float(parts_ur[0].compute()) == pytest.approx(float(one_ur.compute()), rel=1e-14)


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="same shape"):
        RelativeL1().update(torch.ones(3, 2), torch.ones(3, 3))
    with pytest.raises(ValueError, match="NaN"):
        RelativeL1().update(torch.tensor([float("nan")]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"\[B\] or \[B, D\]"):
        UniqueRatio().update(torch.ones(2, 2, 2))
    with pytest.raises(ValueError, match="eps"):
        RelativeL1Config(eps=-1.0)
