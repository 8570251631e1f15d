"""Tests for tzrun_plugins.metrics.retrieval: expectations over every tie-breaking, by enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from tzrun_plugins.metrics.options import TopKConfig
from tzrun_plugins.metrics.retrieval import HitRateAtK, RecallAtK, build_hit_rate_at_k, build_recall_at_k


def _reference_row(scores: np.ndarray, positives: np.ndarray, k: int) -> tuple[float, float]:
    """E[#positives in top k] and P[a positive in top k], averaged over all rankings of the
    candidates that are consistent with the scores (= uniform random tie-breaking)."""
    found, hits, orders = 0.0, 0.0, 0
    for order in itertools.permutations(range(len(scores))):
        ranked = scores[list(order)]
        if np.any(ranked[:-1] < ranked[1:]):
            continue
        top = list(order[:k])
        found += positives[top].sum()
        hits += positives[top].any()
        orders += 1
    return found / orders, hits / orders


def _tied_scores(rows: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (rows, cols), generator=g).float() / 2


@pytest.mark.parametrize("k", [1, 2, 3, 6, 9])
def test_relevance_matrix_matches_enumeration(k: int) -> None:
    g = torch.Generator().manual_seed(k)
    scores = _tied_scores(30, 6, k)
    relevant = torch.rand(30, 6, generator=g) < 0.3
    relevant[0] = False  # a row without positives counts in neither metric
    weight = torch.rand(30, generator=g)
    found, hit, count = [], [], []
    for s, r in zip(scores.numpy(), relevant.numpy()):
        f, h = _reference_row(s, r, k)
        found.append(f), hit.append(h), count.append(r.sum())
    w = weight.double().numpy()
    recall = RecallAtK(k=k)
    hit_rate = HitRateAtK(k=k)
    for metric in (recall, hit_rate):
        metric.update(scores[:11], relevant[:11].float(), weight[:11])
        metric.update(scores[11:], relevant[11:].float(), weight[11:])
    assert float(recall.compute()) == pytest.approx((w * found).sum() / (w * count).sum(), abs=1e-12)
    assert float(hit_rate.compute()) == pytest.approx((w * hit).sum() / (w * (np.array(count) > 0)).sum(), abs=1e-12)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_positive_index_matches_enumeration(k: int) -> None:
    scores = _tied_scores(25, 7, 10 + k)
    index = torch.randint(0, 7, (25,), generator=torch.Generator().manual_seed(k))
    expected = []
    for s, i in zip(scores.numpy(), index.numpy()):
        positives = np.zeros(7, dtype=bool)
        positives[i] = True
        expected.append(_reference_row(s, positives, k)[0])
    for cls in (RecallAtK, HitRateAtK):
        metric = cls(k=k)
        metric.update(scores, index.float())  # the core passes labels as float32
        assert float(metric.compute()) == pytest.approx(float(np.mean(expected)), abs=1e-12)


def test_in_batch_uses_the_diagonal_and_drops_padding_columns() -> None:
    scores = torch.tensor(
        [
            [0.9, 0.1, 0.5, 2.0],
            [0.3, 0.8, 0.9, 2.0],
            [0.2, 0.4, 0.6, 2.0],
            [0.0, 0.0, 0.0, 0.0],  # row 3 is padding; its column scores 2.0 everywhere
        ]
    )
    weight = torch.tensor([1.0, 1.0, 2.0, 0.0])
    metric = RecallAtK(k=1, in_batch=True)
    metric.update(scores, None, weight)
    # without column 3: row 0 ranks its positive first, row 1 second, row 2 first
    assert float(metric.compute()) == pytest.approx((1 + 0 + 2) / 4)
    unpadded = HitRateAtK(k=1, in_batch=True)
    unpadded.update(scores[:3, :3], None)
    assert float(unpadded.compute()) == pytest.approx(2 / 3)


def test_top_k_is_not_batch_dependent_for_given_candidates() -> None:
    g = torch.Generator().manual_seed(20)
    scores, index = torch.randn(64, 50, generator=g), torch.randint(0, 50, (64,), generator=g)
    whole, parts = RecallAtK(k=5), [RecallAtK(k=5) for _ in range(3)]
    whole.update(scores, index)
    for part, rows in zip(parts, torch.tensor_split(torch.arange(64), 3)):
        part.update(scores[rows], index[rows])
    for part in parts[1:]:
        parts[0].merge_state(part)
    assert float(parts[0].compute()) == pytest.approx(float(whole.compute()), abs=1e-12)
    ranks = (scores > scores.gather(1, index[:, None])).sum(1)
    assert float(whole.compute()) == pytest.approx(float((ranks < 5).double().mean()), abs=1e-12)


def test_no_positive_is_nan_with_warning() -> None:
    metric = HitRateAtK(k=2)
    metric.update(torch.rand(3, 4), torch.zeros(3, 4))
    with pytest.warns(RuntimeWarning, match="no row has a positive"):
        assert math.isnan(float(metric.compute()))


@pytest.mark.parametrize(
    ("scores", "target", "in_batch", "match"),
    [
        (torch.rand(4), torch.zeros(4), False, r"\[B, C\]"),
        (torch.rand(3, 4), torch.tensor([0, 1, 4]), False, r"lie in \[0, 4\)"),
        (torch.rand(3, 4), torch.tensor([0.0, 1.5, 2.0]), False, "whole numbers"),
        (torch.rand(3, 4), torch.full((3, 4), 0.5), False, "0 or 1"),
        (torch.rand(3, 4), torch.zeros(2), False, "column indices"),
        (torch.rand(3, 4), None, False, "target is required"),
        (torch.rand(3, 4), None, True, "square"),
        (torch.tensor([[0.1, float("nan")]]), torch.tensor([0]), False, "NaN"),
    ],
)
def test_bad_input(scores: torch.Tensor, target, in_batch: bool, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RecallAtK(k=2, in_batch=in_batch).update(scores, target)


def test_configs_and_builders() -> None:
    assert TopKConfig() == TopKConfig(k=10, in_batch=False)
    with pytest.raises(ValueError, match="k must be"):
        TopKConfig(k=0)
    assert build_recall_at_k(TopKConfig(k=3)).k == 3
    assert build_hit_rate_at_k(TopKConfig(in_batch=True)).in_batch is True
