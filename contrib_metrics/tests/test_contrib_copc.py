"""``copc`` by hand, against a per-group computation written out, and split over states."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import pytest
import torch

from tzrun_contrib_metrics.copc import COPC


def direct_copc(preds, labels, weights, groups=None):
    clicks, predicted = defaultdict(float), defaultdict(float)
    for i, (p, y, w) in enumerate(zip(preds, labels, weights)):
        key = 0 if groups is None else groups[i]
        clicks[key] += w * y
        predicted[key] += w * p
    values = [clicks[k] / predicted[k] for k in predicted if predicted[k] > 0]
    return sum(values) / len(values)


def value(preds, labels, weights=None, groups=None, batches=1):
    metric = COPC()
    for b in range(batches):
        metric.update(
            torch.tensor(preds[b::batches], dtype=torch.float64), torch.tensor(labels[b::batches]),
            None if weights is None else torch.tensor(weights[b::batches], dtype=torch.float64),
            group=None if groups is None else torch.tensor(groups[b::batches]),
        )
    return float(metric.compute())


def test_pooled_and_per_group_by_hand():
    preds, labels = [0.2, 0.3, 0.1, 0.4], [1, 0, 0, 1]
    # pooled: 2 clicks / 1.0 predicted
    assert value(preds, labels) == pytest.approx(2.0, abs=1e-15)
    # groups a = rows 0, 1 (1 / 0.5 = 2), b = rows 2, 3 (1 / 0.5 = 2) -> 2; with weights 3 on row 3:
    # b = 3 / (0.1 + 1.2) -> mean of 2 and 3/1.3
    assert value(preds, labels, [1, 1, 1, 3], groups=[5, 5, 9, 9]) == pytest.approx((2 + 3 / 1.3) / 2, abs=1e-15)


@pytest.mark.parametrize("seed", range(4))
def test_equals_the_direct_computation(seed):
    rng = random.Random(seed)
    n = 400
    preds = [rng.random() * 0.5 for _ in range(n)]
    labels = [int(rng.random() < p * 1.3) for p in preds]
    weights = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(n)]
    groups = [rng.randrange(30) - 10 for _ in range(n)]
    assert value(preds, labels, weights, groups, batches=5) == pytest.approx(direct_copc(preds, labels, weights, groups), rel=1e-12)
    assert value(preds, labels, weights, batches=5) == pytest.approx(direct_copc(preds, labels, weights), rel=1e-12)


def test_padding_rows_change_nothing_and_states_merge():
    preds, labels, weights, groups = [0.2, 0.3, 0.1, 0.4, 0.05], [1, 0, 0, 1, 1], [1.0, 2.0, 1.0, 1.0, 0.5], [1, 2, 1, 3, 2]
    whole = value(preds, labels, weights, groups)
    parts = [COPC() for _ in range(3)]  # the last one sees no row, as a rank without data
    for i, part in enumerate(parts[:2]):
        part.update(
            torch.tensor(preds[i::2], dtype=torch.float64), torch.tensor(labels[i::2]),
            torch.tensor(weights[i::2], dtype=torch.float64), group=torch.tensor(groups[i::2]),
        )
        part.update(torch.tensor([5.0]), torch.tensor([1.0]), torch.zeros(1), group=torch.tensor([1]))  # padding
    for part in parts[1:]:
        parts[0].merge_state(part)
    assert float(parts[0].compute()) == pytest.approx(whole, rel=1e-12)


def test_no_predicted_click_is_nan_with_a_warning():
    with pytest.warns(RuntimeWarning, match="copc is undefined because the predictions sum to 0"):
        assert math.isnan(value([0.0, 0.0], [1, 0]))
    with pytest.raises(ValueError, match="predictions must be at least 0"):
        value([-0.1], [1])
