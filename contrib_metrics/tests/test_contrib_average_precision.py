"""``average_precision`` against a brute-force reference written from its definition, against
``sklearn.metrics.average_precision_score``, and split over metric states."""

from __future__ import annotations

import random

import pytest
import torch
from sklearn.metrics import average_precision_score

from tzrun_contrib_metrics.average_precision import AveragePrecision


def brute_force_ap(preds, labels, weights):
    """For every distinct score t, from the highest: the precision at t times the recall gained."""
    rows = [(p, y, w) for p, y, w in zip(preds, labels, weights) if w > 0]
    positives = sum(w * y for _, y, w in rows)
    ap, previous_recall = 0.0, 0.0
    for t in sorted({p for p, _, _ in rows}, reverse=True):
        tp = sum(w * y for p, y, w in rows if p >= t)
        fp = sum(w * (1 - y) for p, y, w in rows if p >= t)
        recall = tp / positives
        ap += (recall - previous_recall) * tp / (tp + fp)
        previous_recall = recall
    return ap


def random_data(seed, n=300):
    rng = random.Random(seed)
    preds = [rng.choice([0.05, 0.1, 0.2, 0.2, 0.4, 0.6, 0.6, 0.9]) + rng.choice([0.0, 0.0, 0.001]) for _ in range(n)]
    labels = [int(rng.random() < 0.2 + 0.6 * p) for p in preds]
    weights = [rng.choice([0.0, 0.5, 1.0, 1.0, 3.0]) for _ in range(n)]
    return preds, labels, weights


def value(preds, labels, weights=None, batches=1):
    metric = AveragePrecision()
    for b in range(batches):
        metric.update(
            torch.tensor(preds[b::batches]), torch.tensor(labels[b::batches]),
            None if weights is None else torch.tensor(weights[b::batches]),
        )
    return float(metric.compute())


def test_the_docstring_example_by_hand():
    # thresholds 0.9 (P 1, R 1/2), 0.5 (two tied rows: P 2/3, R 1), 0.1 (R unchanged)
    assert value([0.9, 0.5, 0.5, 0.1], [1, 0, 1, 0]) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3, abs=1e-15)


@pytest.mark.parametrize("seed", range(5))
def test_equals_the_brute_force_reference_and_sklearn_with_ties_and_weights(seed):
    preds, labels, weights = random_data(seed)
    got = value(preds, labels, weights, batches=4)
    assert got == pytest.approx(brute_force_ap(preds, labels, weights), abs=1e-12)
    assert got == pytest.approx(average_precision_score(labels, preds, sample_weight=weights), abs=1e-12)


def test_only_the_order_of_predictions_counts():
    preds, labels, weights = random_data(7)
    logits = torch.logit(torch.tensor(preds, dtype=torch.float64)).tolist()
    assert value(logits, labels, weights) == pytest.approx(value(preds, labels, weights), abs=1e-12)


def test_padding_rows_change_nothing_and_states_merge():
    preds, labels, weights = random_data(9)
    whole = value(preds, labels, weights)
    parts = [AveragePrecision() for _ in range(3)]  # the last one sees no row, as a rank without data
    for i, part in enumerate(parts[:2]):
        part.update(torch.tensor(preds[i::2]), torch.tensor(labels[i::2]), torch.tensor(weights[i::2]))
        part.update(torch.tensor([1.0, float("inf")]), torch.tensor([0, 7]), torch.zeros(2))  # padding
    for part in parts[1:]:
        parts[0].merge_state(part)
    assert float(parts[0].compute()) == pytest.approx(whole, abs=1e-12)


def test_no_positive_row_is_zero_with_a_warning_and_labels_are_checked():
    with pytest.warns(RuntimeWarning, match="average_precision is undefined because no row with label 1"):
        assert value([0.1, 0.4], [0, 0]) == 0.0
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        value([0.1, 0.4], [0, 2])
