"""Tests for tzrun_plugins.metrics.xauc against an O(n^2) reference written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from tzrun_plugins.metrics._pairs import dominance
from tzrun_plugins.metrics.xauc import XAUC, XAUCConfig, build_xauc, exact_xauc


def _reference(preds, target, weight=None) -> float:
    """Over all unordered pairs with different targets: agreement, ties in preds count 1/2."""
    p, y = np.asarray(preds, np.float64), np.asarray(target, np.float64)
    w = np.ones_like(p) if weight is None else np.asarray(weight, np.float64)
    keep = w > 0
    p, y, w = p[keep], y[keep], w[keep]
    dy, dp = y[:, None] - y[None, :], p[:, None] - p[None, :]
    ww = w[:, None] * w[None, :] * (dy > 0)  # each unordered comparable pair once
    return float((ww * ((dp > 0) + 0.5 * (dp == 0))).sum() / ww.sum())


def _data(n: int, seed: int, p_decimals: int = 1, y_levels: int = 6) -> tuple[torch.Tensor, ...]:
    """Tied predictions and tied targets (watch-time-like), correlated, with weights."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, y_levels, (n,), generator=g).float() * 2.5
    p = torch.round((y / 15 + torch.rand(n, generator=g)) * 10**p_decimals) / 10**p_decimals
    w = torch.rand(n, generator=g) * 3
    return p, y, w


@pytest.mark.parametrize(("n", "seed", "p_decimals", "y_levels"), [(2, 0, 1, 2), (3, 1, 0, 3), (64, 2, 1, 4), (65, 3, 1, 6), (1000, 4, 1, 6), (1500, 5, 3, 1000)])
def test_matches_brute_force(n: int, seed: int, p_decimals: int, y_levels: int) -> None:
    p, y, w = _data(n, seed, p_decimals, y_levels)
    for weight in (None, w):
        if len(torch.unique(y)) < 2:
            continue
        expected = _reference(p, y, weight)
        assert exact_xauc(p, y, weight) == pytest.approx(expected, abs=1e-9)
        metric = XAUC()
        metric.update(p[: n // 2], y[: n // 2], None if weight is None else weight[: n // 2])
        metric.update(p[n // 2 :], y[n // 2 :], None if weight is None else weight[n // 2 :])
        value = metric.compute()
        assert value.dtype == torch.float64 and float(value) == pytest.approx(expected, abs=1e-9)


def test_continuous_values_without_ties() -> None:
    g = torch.Generator().manual_seed(10)
    p, y = torch.randn(3000, generator=g, dtype=torch.float64), torch.randn(3000, generator=g, dtype=torch.float64)
    p = p + 0.3 * y
    assert exact_xauc(p, y) == pytest.approx(_reference(p, y), abs=1e-9)


def test_tie_policy() -> None:
    # pairs (0,1): targets tied -> excluded; (1,2): preds tied -> 1/2; (1,3): discordant;
    # (0,2), (0,3), (2,3): concordant
    preds = torch.tensor([0.1, 0.5, 0.5, 0.3])
    target = torch.tensor([1.0, 1.0, 4.0, 2.0])
    assert exact_xauc(preds, target) == pytest.approx((0.5 + 0 + 3) / 5)
    # all predictions tied: every comparable pair counts 1/2
    assert exact_xauc(torch.full((5,), 0.7), torch.arange(5.0)) == pytest.approx(0.5)


def test_binary_targets_give_the_auc() -> None:
    g = torch.Generator().manual_seed(11)
    y = torch.randint(0, 2, (2000,), generator=g)
    p = torch.round(torch.rand(2000, generator=g) * 20) / 20
    w = torch.rand(2000, generator=g)
    expected = roc_auc_score(y.numpy(), p.numpy(), sample_weight=w.numpy())
    assert exact_xauc(p, y.float(), w) == pytest.approx(expected, abs=1e-9)


def test_integer_weights_equal_repeated_rows() -> None:
    p, y, _ = _data(400, 12)
    reps = torch.randint(1, 4, (400,), generator=torch.Generator().manual_seed(13))
    repeated = exact_xauc(p.repeat_interleave(reps), y.repeat_interleave(reps))
    assert exact_xauc(p, y, reps.float()) == pytest.approx(repeated, abs=1e-12)


def test_padding_rows_change_nothing() -> None:
    p, y, w = _data(800, 14)
    expected = exact_xauc(p, y, w)
    pad_p = torch.full((300,), float("nan"))
    pad_y = torch.full((300,), float("inf"))
    metric = XAUC()
    metric.update(torch.cat([p, pad_p]), torch.cat([y, pad_y]), torch.cat([w, torch.zeros(300)]))
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-12)


def test_split_across_instances_equals_one_instance() -> None:
    p, y, w = _data(3000, 15)
    p, y, w = torch.cat([p, p[:400]]), torch.cat([y, y[:400]]), torch.cat([w, w[:400]])  # duplicates
    single = XAUC()
    single.update(p, y, w)
    expected = float(single.compute())
    owner = torch.randint(0, 3, (p.numel(),), generator=torch.Generator().manual_seed(16))
    parts = [XAUC() for _ in range(3)]
    for r, part in enumerate(parts):
        part.update(p[owner == r], y[owner == r], w[owner == r])
    for part in parts[1:]:
        parts[0].merge_state(part)
    assert float(parts[0].compute()) == pytest.approx(expected, abs=1e-12)


def test_sampled_is_deterministic_rank_invariant_and_close() -> None:
    p, y, w = _data(3000, 17, p_decimals=2)
    exact = exact_xauc(p, y, w)
    single = XAUC(mode="sampled", num_samples=200_000, seed=3)
    single.update(p, y, w)
    value = float(single.compute())
    assert value == pytest.approx(exact, abs=5e-3) and value != pytest.approx(exact, abs=1e-9)
    again = XAUC(mode="sampled", num_samples=200_000, seed=3)
    perm = torch.randperm(3000, generator=torch.Generator().manual_seed(18))
    halves = (perm[:1100], perm[1100:])
    other = XAUC(mode="sampled", num_samples=200_000, seed=3)
    again.update(p[halves[0]], y[halves[0]], w[halves[0]])
    other.update(p[halves[1]], y[halves[1]], w[halves[1]])
    other.merge_state(again)  # rows arrive in another order, from two 'ranks'
    assert float(other.compute()) == value
    different_seed = XAUC(mode="sampled", num_samples=200_000, seed=4)
    different_seed.update(p, y, w)
    assert float(different_seed.compute()) != value


def test_in_batch_pools_the_pairs_of_each_batch() -> None:
    p, y, w = _data(900, 19)
    batches = [(0, 300), (300, 350), (350, 900)]
    metric = XAUC(mode="in_batch")
    agree = pairs = 0.0
    for lo, hi in batches:
        metric.update(p[lo:hi], y[lo:hi], w[lo:hi])
        pw, py, pp = w[lo:hi].double(), y[lo:hi].double(), p[lo:hi].double()
        ww = pw[:, None] * pw[None, :] * (py[:, None] > py[None, :])
        dp = pp[:, None] - pp[None, :]
        agree += float((ww * ((dp > 0) + 0.5 * (dp == 0))).sum())
        pairs += float(ww.sum())
    assert float(metric.compute()) == pytest.approx(agree / pairs, abs=1e-9)
    assert abs(float(metric.compute()) - exact_xauc(p, y, w)) > 1e-6  # not the all-pairs value


@pytest.mark.parametrize("mode", ["exact", "sampled", "in_batch"])
def test_no_comparable_pair_is_half_with_warning(mode: str) -> None:
    metric = XAUC(mode=mode)
    metric.update(torch.rand(5), torch.full((5,), 3.0))
    with pytest.warns(RuntimeWarning, match="different targets"):
        assert float(metric.compute()) == 0.5


def test_float64_storage_keeps_close_values_apart() -> None:
    p = 1.0 + 1e-12 * torch.arange(50, dtype=torch.float64)
    y = torch.arange(50, dtype=torch.float64)
    metric = XAUC()
    metric.set_dtype(torch.float64)
    metric.update(p, y)
    assert float(metric.compute()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 8, 100, 256, 257, 1000])
def test_dominance_counts_ordered_pairs(size: int) -> None:
    g = torch.Generator().manual_seed(size)
    ranks = torch.randperm(size, generator=g).to(torch.int32)
    weight = torch.rand(size, generator=g, dtype=torch.float64)
    r, w = ranks.long(), weight
    upper = torch.triu(torch.ones(size, size, dtype=torch.bool), diagonal=1)
    mask = upper & (r[:, None] < r[None, :])
    assert float(dominance(ranks, None)) == float(mask.sum())
    # (relative: the reference sums size**2 products in an order that depends on torch's threads)
    assert float(dominance(ranks, weight)) == pytest.approx(float((w[:, None] * w[None, :] * mask).sum()), rel=1e-12,
                                                            abs=1e-12)
    per_rank = dominance(ranks, weight, per_row=True)
    expected = torch.zeros(size, dtype=torch.float64)
    expected[r] = (w[:, None] * w[None, :] * mask).sum(0)
    assert torch.allclose(per_rank, expected, atol=1e-12)


def test_bad_input_and_config() -> None:
    with pytest.raises(ValueError, match="finite"):
        XAUC().update(torch.rand(3), torch.tensor([1.0, float("inf"), 2.0]))
    with pytest.raises(ValueError, match="NaN"):
        exact_xauc(torch.tensor([0.1, float("nan")]), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="mode"):
        XAUC(mode="approx")
    with pytest.raises(ValueError, match="num_samples"):
        XAUCConfig(num_samples=0)
    metric = build_xauc(XAUCConfig(mode="sampled", num_samples=10, seed=2))
    assert (metric.mode, metric.num_samples, metric.seed) == ("sampled", 10, 2)


# --- TorchEasyRec compatibility: ties = "wrong", averaging = "per_batch" ---------------------


def _torcheasyrec_in_batch(preds: torch.Tensor, target: torch.Tensor) -> float:
    """TorchEasyRec's in_batch_xauc, as its source states it: over all pairs i < j of the
    batch, the mean of [(t_i - t_j)(p_i - p_j) > 0]."""
    i, j = torch.triu_indices(preds.numel(), preds.numel(), offset=1)
    return float((((target[i] - target[j]) * (preds[i] - preds[j])) > 0).double().mean())


def _reference_wrong(preds, target, weight=None) -> float:
    """Every unordered pair of distinct rows, weighted w_i w_j; only strict agreement scores."""
    p, y = np.asarray(preds, np.float64), np.asarray(target, np.float64)
    w = np.ones_like(p) if weight is None else np.asarray(weight, np.float64)
    keep = w > 0
    p, y, w = p[keep], y[keep], w[keep]
    upper = np.triu(np.ones((len(p), len(p)), bool), k=1)
    ww = w[:, None] * w[None, :] * upper
    agree = (y[:, None] - y[None, :]) * (p[:, None] - p[None, :]) > 0
    return float((ww * agree).sum() / ww.sum())


def test_ties_wrong_hand_computed() -> None:
    # the 6 pairs of test_tie_policy: (0,1) tied targets, (1,2) tied predictions and (1,3)
    # discordant score 0; (0,2), (0,3), (2,3) score 1 -> 3/6 (the default rule: 3.5/5)
    preds = torch.tensor([0.1, 0.5, 0.5, 0.3])
    target = torch.tensor([1.0, 1.0, 4.0, 2.0])
    assert exact_xauc(preds, target, ties="wrong") == 0.5
    assert exact_xauc(preds, target) == pytest.approx(0.7)
    assert exact_xauc(preds, target, ties="wrong") == _torcheasyrec_in_batch(preds, target)
    # a tied target alone is 0 under TorchEasyRec's rule, left out under the default one
    assert exact_xauc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1.0, 1.0, 2.0]), ties="wrong") == pytest.approx(2 / 3)
    assert exact_xauc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1.0, 1.0, 2.0])) == 1.0


@pytest.mark.parametrize(("n", "seed", "p_decimals", "y_levels"), [(2, 0, 1, 2), (3, 1, 0, 3), (65, 3, 1, 6), (700, 4, 1, 6), (900, 5, 3, 1000)])
def test_ties_wrong_matches_brute_force(n: int, seed: int, p_decimals: int, y_levels: int) -> None:
    p, y, w = _data(n, seed, p_decimals, y_levels)
    assert exact_xauc(p, y, ties="wrong") == pytest.approx(_torcheasyrec_in_batch(p, y), abs=1e-12)
    for weight in (None, w):
        expected = _reference_wrong(p, y, weight)
        assert exact_xauc(p, y, weight, ties="wrong") == pytest.approx(expected, abs=1e-12)
        metric = XAUC(ties="wrong")
        metric.update(p[: n // 2], y[: n // 2], None if weight is None else weight[: n // 2])
        metric.update(p[n // 2 :], y[n // 2 :], None if weight is None else weight[n // 2 :])
        assert float(metric.compute()) == pytest.approx(expected, abs=1e-12)


def test_in_batch_per_batch_is_torcheasyrecs_mean_of_batch_values() -> None:
    p, y, _ = _data(600, 8, 1, 5)
    sizes = [50, 200, 7, 343]
    batches = list(zip(torch.split(p, sizes), torch.split(y, sizes)))
    expected = float(np.mean([_torcheasyrec_in_batch(bp, by) for bp, by in batches]))
    metric = build_xauc(XAUCConfig(mode="in_batch", ties="wrong", averaging="per_batch"))
    pooled = XAUC(mode="in_batch", ties="wrong")
    for bp, by in batches:
        metric.update(bp, by)
        pooled.update(bp, by)
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-12)
    # pooling weighs the batches by their pairs: a different number on unequal batches
    pairs = [s * (s - 1) / 2 for s in sizes]
    values = [_torcheasyrec_in_batch(bp, by) for bp, by in batches]
    assert float(pooled.compute()) == pytest.approx(np.dot(values, pairs) / sum(pairs), abs=1e-12)
    assert abs(float(pooled.compute()) - expected) > 1e-4


def test_per_batch_skips_batches_without_a_counted_pair() -> None:
    metric = XAUC(mode="in_batch", averaging="per_batch")  # default ties: tied targets left out
    metric.update(torch.tensor([0.1, 0.9]), torch.tensor([1.0, 2.0]))  # 1.0
    metric.update(torch.tensor([0.1, 0.9]), torch.tensor([3.0, 3.0]))  # no comparable pair
    metric.update(torch.tensor([0.9, 0.1, 0.5]), torch.tensor([1.0, 2.0, 3.0]))  # 1 of 3
    metric.update(torch.tensor([0.5]), torch.tensor([1.0]))  # one row: no pair
    assert float(metric.compute()) == pytest.approx((1.0 + 1 / 3) / 2, abs=1e-15)


def test_sampled_ties_wrong_estimates_the_exact_value() -> None:
    p, y, w = _data(400, 11, 1, 4)
    exact = exact_xauc(p, y, w, ties="wrong")
    metric = XAUC(mode="sampled", num_samples=400_000, seed=1, ties="wrong")
    metric.update(p, y, w)
    assert float(metric.compute()) == pytest.approx(exact, abs=0.01)
    assert abs(exact - exact_xauc(p, y, w)) > 0.05  # the rules differ on these tied targets


def test_compat_options_are_checked() -> None:
    with pytest.raises(ValueError, match="ties"):
        XAUCConfig(ties="half")
    with pytest.raises(ValueError, match="in_batch"):
        XAUCConfig(averaging="per_batch")
    with pytest.raises(ValueError, match="in_batch"):
        XAUC(mode="sampled", averaging="per_batch")
    with pytest.raises(ValueError, match="ties"):
        exact_xauc(torch.rand(3), torch.rand(3), ties="keep")
