"""Tests for tzrun_plugins.metrics.grouped_xauc against an O(n^2) reference written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tzrun_plugins.metrics.grouped_xauc import GroupedXAUC, GroupedXAUCConfig, build_grouped_xauc, grouped_exact_xauc


def _reference(preds, target, group, weight=None, weight_by_size=True) -> float:
    p, y, g = np.asarray(preds, np.float64), np.asarray(target, np.float64), np.asarray(group)
    w = np.ones_like(p) if weight is None else np.asarray(weight, np.float64)
    keep = w > 0
    p, y, g, w = p[keep], y[keep], g[keep], w[keep]
    values, sizes = [], []
    for key in np.unique(g):
        m = g == key
        gp, gy, gw = p[m], y[m], w[m]
        ww = gw[:, None] * gw[None, :] * (gy[:, None] > gy[None, :])
        if ww.sum() == 0:
            continue
        dp = gp[:, None] - gp[None, :]
        values.append((ww * ((dp > 0) + 0.5 * (dp == 0))).sum() / ww.sum())
        sizes.append(m.sum())
    lam = np.asarray(sizes, np.float64) if weight_by_size else np.ones(len(values))
    return float((np.asarray(values) * lam).sum() / lam.sum())


def _data(n: int, groups: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 5, (n,), generator=g).float()
    p = torch.round((y / 8 + torch.rand(n, generator=g)) * 10) / 10
    group = torch.randint(0, groups, (n,), generator=g) * 104729
    w = torch.rand(n, generator=g) * 2
    return p, y, group, w


@pytest.mark.parametrize(("n", "groups", "seed"), [(40, 3, 0), (700, 50, 1), (2500, 200, 2), (1200, 1, 3)])
@pytest.mark.parametrize("weight_by_size", [True, False])
def test_matches_brute_force(n: int, groups: int, seed: int, weight_by_size: bool) -> None:
    p, y, group, w = _data(n, groups, seed)
    for weight in (None, w):
        expected = _reference(p, y, group, weight, weight_by_size)
        assert grouped_exact_xauc(p, y, group, weight, weight_by_size) == pytest.approx(expected, abs=1e-9)
        metric = GroupedXAUC(weight_by_size=weight_by_size)
        half = n // 2
        metric.update(p[:half], y[:half], None if weight is None else weight[:half], group[:half])
        metric.update(p[half:], y[half:], None if weight is None else weight[half:], group[half:])
        assert float(metric.compute()) == pytest.approx(expected, abs=1e-9)


def test_pairs_across_groups_never_count() -> None:
    # inside each group the order is perfect; across groups it is reversed
    p = torch.tensor([0.1, 0.2, 0.8, 0.9])
    y = torch.tensor([5.0, 6.0, 1.0, 2.0])
    group = torch.tensor([1, 1, 2, 2])
    assert grouped_exact_xauc(p, y, group) == pytest.approx(1.0)


def test_groups_without_comparable_pairs_are_skipped() -> None:
    p = torch.tensor([0.1, 0.2, 0.3, 0.9, 0.8, 0.5])
    y = torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])  # group 2 has only tied targets
    group = torch.tensor([1, 1, 1, 2, 2, 2])
    assert grouped_exact_xauc(p, y, group) == pytest.approx(1.0)
    with pytest.warns(RuntimeWarning, match="no group"):
        assert grouped_exact_xauc(p[3:], y[3:], group[3:]) == 0.5


def test_split_across_instances_equals_one_instance() -> None:
    p, y, group, w = _data(3000, 150, 4)
    single = GroupedXAUC()
    single.update(p, y, w, group)
    expected = float(single.compute())
    owner = torch.randint(0, 4, (3000,), generator=torch.Generator().manual_seed(5))
    parts = [GroupedXAUC() for _ in range(4)]
    for r, part in enumerate(parts):
        part.update(p[owner == r], y[owner == r], w[owner == r], group[owner == r])
    for part in parts[1:]:
        parts[0].merge_state(part)
    assert float(parts[0].compute()) == pytest.approx(expected, abs=1e-12)


def test_padding_rows_change_nothing() -> None:
    p, y, group, w = _data(600, 30, 6)
    expected = grouped_exact_xauc(p, y, group, w)
    metric = GroupedXAUC()
    metric.update(torch.cat([p, torch.full((50,), float("nan"))]), torch.cat([y, torch.zeros(50)]),
                  torch.cat([w, torch.zeros(50)]), torch.cat([group, group[:50]]))
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-12)


def test_config_and_builder() -> None:
    assert GroupedXAUCConfig().weight_by_size is True
    assert build_grouped_xauc(GroupedXAUCConfig(weight_by_size=False)).weight_by_size is False


def _reference_wrong(preds, target, group, weight=None, weight_by_size=True) -> float:
    """TorchEasyRec's rule inside each group: every pair counts, only strict agreement scores;
    groups of two rows or more, weighted by their number of rows."""
    p, y, g = np.asarray(preds, np.float64), np.asarray(target, np.float64), np.asarray(group)
    w = np.ones_like(p) if weight is None else np.asarray(weight, np.float64)
    keep = w > 0
    p, y, g, w = p[keep], y[keep], g[keep], w[keep]
    values, sizes = [], []
    for key in np.unique(g):
        m = g == key
        if m.sum() < 2:
            continue
        gp, gy, gw = p[m], y[m], w[m]
        ww = gw[:, None] * gw[None, :] * np.triu(np.ones((m.sum(), m.sum()), bool), k=1)
        agree = (gy[:, None] - gy[None, :]) * (gp[:, None] - gp[None, :]) > 0
        values.append((ww * agree).sum() / ww.sum())
        sizes.append(m.sum())
    lam = np.asarray(sizes, np.float64) if weight_by_size else np.ones(len(values))
    return float((np.asarray(values) * lam).sum() / lam.sum())


def test_ties_wrong_hand_computed() -> None:
    # group 1: pairs (a,b) tied targets -> 0, (a,c) and (b,c) concordant -> 2/3, 3 rows
    # group 2: one pair with tied predictions -> 0, 2 rows; group 3: one row, not counted
    # TorchEasyRec: size-weighted (3 * 2/3 + 2 * 0) / 5 = 0.4
    p = torch.tensor([0.1, 0.2, 0.9, 0.5, 0.5, 0.3])
    y = torch.tensor([1.0, 1.0, 3.0, 1.0, 2.0, 7.0])
    group = torch.tensor([1, 1, 1, 2, 2, 3])
    assert grouped_exact_xauc(p, y, group, ties="wrong") == pytest.approx(0.4, abs=1e-15)
    metric = build_grouped_xauc(GroupedXAUCConfig(ties="wrong"))
    metric.update(p, y, None, group)
    assert float(metric.compute()) == pytest.approx(0.4, abs=1e-15)
    # the default rule: group 1 = 2/2, group 2 = 1/2 (tied predictions) -> (3 + 1) / 5
    assert grouped_exact_xauc(p, y, group) == pytest.approx(0.8, abs=1e-15)


@pytest.mark.parametrize(("n", "groups", "seed"), [(40, 3, 0), (700, 50, 1), (1200, 1, 3)])
@pytest.mark.parametrize("weight_by_size", [True, False])
def test_ties_wrong_matches_brute_force(n: int, groups: int, seed: int, weight_by_size: bool) -> None:
    p, y, group, w = _data(n, groups, seed)
    for weight in (None, w):
        expected = _reference_wrong(p, y, group, weight, weight_by_size)
        assert grouped_exact_xauc(p, y, group, weight, weight_by_size, ties="wrong") == pytest.approx(expected, abs=1e-12)
        metric = GroupedXAUC(weight_by_size=weight_by_size, ties="wrong")
        metric.update(p[: n // 2], y[: n // 2], None if weight is None else weight[: n // 2], group[: n // 2])
        metric.update(p[n // 2 :], y[n // 2 :], None if weight is None else weight[n // 2 :], group[n // 2 :])
        assert float(metric.compute()) == pytest.approx(expected, abs=1e-12)


def test_ties_option_is_checked() -> None:
    with pytest.raises(ValueError, match="ties"):
        GroupedXAUCConfig(ties="half")
    with pytest.raises(ValueError, match="ties"):
        GroupedXAUC(ties="half")
