"""Tests for tzrun_plugins.metrics.grouped_auc against an O(n^2) reference written here."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from tzrun_plugins.metrics.grouped_auc import GroupedAUC, GroupedAUCConfig, build_grouped_auc, grouped_binary_auc


def _reference(preds, target, group, weight=None, weight_by_size=False) -> float:
    """Per-group weighted Mann-Whitney AUC by brute force over all pairs, then averaged."""
    p, y, g = np.asarray(preds, np.float64), np.asarray(target, np.float64), np.asarray(group)
    w = np.ones_like(p) if weight is None else np.asarray(weight, np.float64)
    keep = w > 0
    p, y, g, w = p[keep], y[keep], g[keep], w[keep]
    values, sizes = [], []
    for key in np.unique(g):
        m = g == key
        pos, neg = (y[m] == 1), (y[m] == 0)
        if not pos.any() or not neg.any():
            continue
        pp, pn = p[m][pos][:, None], p[m][neg][None, :]
        wp, wn = w[m][pos][:, None], w[m][neg][None, :]
        wins = (wp * wn * ((pp > pn) + 0.5 * (pp == pn))).sum()
        values.append(wins / (wp.sum() * wn.sum()))
        sizes.append(m.sum())
    lam = np.asarray(sizes, np.float64) if weight_by_size else np.ones(len(values))
    return float((np.asarray(values) * lam).sum() / lam.sum())


def _data(n: int, groups: int, seed: int, decimals: int = 1) -> tuple[torch.Tensor, ...]:
    """Tied predictions, labels correlated with them, group keys spread over a wide range."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(n, generator=g)
    target = (torch.rand(n, generator=g) < raw).long()
    preds = torch.round(raw * 10**decimals) / 10**decimals
    group = torch.randint(0, groups, (n,), generator=g) * 7919 - 50_000
    weight = torch.rand(n, generator=g) * 2
    return preds, target, group, weight


@pytest.mark.parametrize(("n", "groups", "seed"), [(60, 3, 0), (500, 40, 1), (3000, 300, 2), (2000, 5, 3)])
@pytest.mark.parametrize("weight_by_size", [False, True])
def test_matches_brute_force_with_ties_and_weights(n: int, groups: int, seed: int, weight_by_size: bool) -> None:
    preds, target, group, weight = _data(n, groups, seed)
    assert len(torch.unique(preds)) < n / 4  # ties inside groups
    for w in (None, weight):
        expected = _reference(preds, target, group, w, weight_by_size)
        assert grouped_binary_auc(preds, target, group, w, weight_by_size) == pytest.approx(expected, abs=1e-9)
        metric = GroupedAUC(weight_by_size=weight_by_size)
        metric.update(preds[: n // 3], target[: n // 3], None if w is None else w[: n // 3], group[: n // 3])
        metric.update(preds[n // 3 :], target[n // 3 :], None if w is None else w[n // 3 :], group[n // 3 :])
        value = metric.compute()
        assert value.dtype == torch.float64 and value.ndim == 0
        assert float(value) == pytest.approx(expected, abs=1e-9)


def test_each_group_is_sklearn_auc() -> None:
    preds, target, group, weight = _data(2000, 4, 4, decimals=2)
    per_group = [
        roc_auc_score(target[group == k].numpy(), preds[group == k].numpy(), sample_weight=weight[group == k].numpy())
        for k in torch.unique(group)
    ]
    assert grouped_binary_auc(preds, target, group, weight) == pytest.approx(float(np.mean(per_group)), abs=1e-9)


def test_weight_by_size_weights_groups_by_row_count() -> None:
    # group 1: 2 rows, AUC 1; group 2: 4 rows, AUC 0; group 3 has one class and is skipped
    preds = torch.tensor([0.1, 0.9, 0.9, 0.8, 0.2, 0.1, 0.5, 0.6])
    target = torch.tensor([0, 1, 0, 0, 1, 1, 1, 1])
    group = torch.tensor([1, 1, 2, 2, 2, 2, 3, 3])
    assert grouped_binary_auc(preds, target, group) == pytest.approx(0.5)
    assert grouped_binary_auc(preds, target, group, weight_by_size=True) == pytest.approx(2 / 6)


def test_padding_rows_change_nothing() -> None:
    preds, target, group, weight = _data(1500, 100, 5)
    expected = grouped_binary_auc(preds, target, group, weight)
    pad = 500
    g = torch.Generator().manual_seed(6)
    pad_preds = torch.rand(pad, generator=g)
    pad_preds[0] = float("nan")
    pad_target = torch.randint(0, 3, (pad,), generator=g)  # even invalid labels
    pad_group = group[torch.randint(0, 1500, (pad,), generator=g)]  # joins real groups
    perm = torch.randperm(1500 + pad, generator=g)
    all_rows = [torch.cat(x)[perm] for x in ((preds, pad_preds), (target, pad_target), (weight, torch.zeros(pad)), (group, pad_group))]
    metric = GroupedAUC()
    metric.update(all_rows[0], all_rows[1], all_rows[2], all_rows[3])
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-12)
    assert sum(x.numel() for x in metric.group) == 1500


def test_split_across_instances_equals_one_instance() -> None:
    """Groups and duplicated rows split over several 'ranks', states merged as sync would."""
    preds, target, group, weight = _data(4000, 200, 7)
    preds = torch.cat([preds, preds[:500]])  # exact duplicates, landing on other ranks
    target, group, weight = torch.cat([target, target[:500]]), torch.cat([group, group[:500]]), torch.cat([weight, weight[:500]])
    single = GroupedAUC()
    single.update(preds, target, weight, group)
    expected = float(single.compute())
    g = torch.Generator().manual_seed(8)
    for ranks in (2, 3, 5):
        owner = torch.randint(0, ranks, (preds.numel(),), generator=g)
        parts = [GroupedAUC() for _ in range(ranks)]
        for r, part in enumerate(parts):
            m = owner == r
            part.update(preds[m], target[m], weight[m], group[m])
        merged = parts[0]
        for part in parts[1:]:
            merged.merge_state(part)
        assert float(merged.compute()) == pytest.approx(expected, abs=1e-12)


def test_float64_storage_and_wide_group_keys() -> None:
    preds = 0.5 + 1e-12 * torch.arange(8, dtype=torch.float64)
    target = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    group = torch.tensor([2**62, 2**62, 2**62, 2**62, -(2**62), -(2**62), -(2**62), -(2**62)], dtype=torch.int64)
    metric = GroupedAUC()
    metric.set_dtype(torch.float64)
    metric.update(preds, target, None, group)
    assert all(k.dtype == torch.int64 for k in metric.group)  # ids never rounded through floats
    assert float(metric.compute()) == pytest.approx(_reference(preds, target, group), abs=1e-12)
    assert float(metric.compute()) == pytest.approx(1.0)


def test_large_group_keys_survive_set_dtype_and_to() -> None:
    key = 2**40 + 1
    metric = GroupedAUC()
    metric.update(torch.tensor([0.1, 0.9]), torch.tensor([0, 1]), None, torch.tensor([key, key]))
    metric.set_dtype(torch.float64)
    metric = metric.to("cpu")
    assert metric.group[0].dtype == torch.int64 and int(metric.group[0][0]) == key


@pytest.mark.parametrize(
    ("target", "weight", "match"),
    [
        (torch.tensor([1, 1, 0, 0]), None, "no group has both"),
        (torch.tensor([0, 1, 0, 1]), torch.zeros(4), "no rows"),
    ],
)
def test_degenerate_is_half_with_warning(target: torch.Tensor, weight: torch.Tensor | None, match: str) -> None:
    group = torch.tensor([1, 1, 2, 2])
    with pytest.warns(RuntimeWarning, match=match):
        assert grouped_binary_auc(torch.rand(4), target, group, weight) == 0.5


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric GroupedAUC was called before:UserWarning")
def test_no_update_is_half_with_warning() -> None:
    with pytest.warns(RuntimeWarning, match="no rows"):
        assert float(GroupedAUC().compute()) == 0.5


def test_no_warning_on_normal_input() -> None:
    preds, target, group, _ = _data(200, 5, 9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grouped_binary_auc(preds, target, group)


@pytest.mark.parametrize(
    ("group", "match"),
    [
        (torch.tensor([1.0, 2.0, 3.0, 4.0]), "integer tensor"),
        (torch.tensor([1, 2, 3]), "one key per row"),
        (torch.ones(4, 2, dtype=torch.int64), r"shape \[B\] or \[B, 1\]"),
    ],
)
def test_bad_group_keys(group: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GroupedAUC().update(torch.rand(4), torch.tensor([0, 1, 0, 1]), None, group)


def test_label_outside_binary_is_refused() -> None:
    with pytest.raises(ValueError, match="0 or 1"):
        grouped_binary_auc(torch.rand(3), torch.tensor([0, 2, 1]), torch.tensor([1, 1, 1]))


def test_config_and_builder() -> None:
    assert GroupedAUCConfig().weight_by_size is False
    assert build_grouped_auc(GroupedAUCConfig(weight_by_size=True)).weight_by_size is True
    with pytest.raises(TypeError):
        GroupedAUCConfig(weight_by_size="yes")  # type: ignore[arg-type]
