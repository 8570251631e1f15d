"""``ndcg_at_k`` against a brute-force reference that averages DCG over every order of tied
rows (the definition of tie-averaged DCG), against sklearn, and split over metric states."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from sklearn.metrics import ndcg_score

from tzrun_contrib_metrics.ndcg import NDCGAtK


def _dcg(gains, k):
    return sum(g / math.log2(r + 2) for r, g in enumerate(gains[:k]))


def brute_force_ndcg(rows, k, gain="linear", empty_groups="skip"):
    """rows: (prediction, label, weight, group). Every group: mean DCG over all orders that
    respect the predictions (ties in every order), over the ideal DCG; then the mean."""
    values = []
    for key in sorted({r[3] for r in rows}):
        kept = [(p, w * (y if gain == "linear" else 2**y - 1)) for p, y, w, g in rows if g == key and w > 0]
        if not kept:
            continue
        blocks = [[gn for p, gn in kept if p == s] for s in sorted({p for p, _ in kept}, reverse=True)]
        orders = list(itertools.product(*(itertools.permutations(b) for b in blocks)))
        dcg = sum(_dcg([x for block in order for x in block], k) for order in orders) / len(orders)
        ideal = _dcg(sorted((gn for _, gn in kept), reverse=True), k)
        if ideal > 0:
            values.append(dcg / ideal)
        elif empty_groups != "skip":
            values.append(0.0 if empty_groups == "zero" else 1.0)
    return sum(values) / len(values) if values else None


def random_rows(seed, n=60, groups=9):
    rng = random.Random(seed)
    return [
        (rng.choice([0.1, 0.2, 0.2, 0.5, 0.7, 0.9]), rng.choice([0, 0, 1, 2]), rng.choice([0.0, 0.5, 1.0, 1.0, 2.0]),
         rng.randrange(groups) * 1_000_003 - 4)
        for _ in range(n)
    ]


def tensors(rows):
    p, y, w, g = zip(*rows)
    return torch.tensor(p), torch.tensor(y, dtype=torch.float32), torch.tensor(w), torch.tensor(g, dtype=torch.int64)


def metric_value(rows, batches=1, **options):
    metric = NDCGAtK(**options)
    for chunk in range(batches):
        part = rows[chunk::batches]
        if part:
            p, y, w, g = tensors(part)
            metric.update(p, y, w, group=g)
    return float(metric.compute())


def test_the_docstring_example_by_hand():
    # group 7 ranked: y = 0, 1, (1 cut off at k = 2):  DCG = 1/log2(3);  IDCG = 1 + 1/log2(3)
    metric = NDCGAtK(k=2)
    metric.update(torch.tensor([0.9, 0.8, 0.1]), torch.tensor([0, 1, 1]), group=torch.tensor([7, 7, 7]))
    expected = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-15)


def test_ties_are_averaged_over_their_orders_by_hand():
    # a tie at positions 1-2 between a relevant and an irrelevant row, k = 1:
    # half the orders have DCG 1, half 0 -> DCG 0.5; IDCG 1
    metric = NDCGAtK(k=1)
    metric.update(torch.tensor([0.5, 0.5]), torch.tensor([1, 0]), group=torch.tensor([0, 0]))
    assert float(metric.compute()) == pytest.approx(0.5, abs=1e-15)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "options",
    [{"k": 1}, {"k": 3}, {"k": 50}, {"k": 3, "gain": "exponential"}, {"k": 2, "empty_groups": "zero"}, {"k": 4, "empty_groups": "one"}],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_equals_the_brute_force_reference(seed, options):
    rows = random_rows(seed)
    want = brute_force_ndcg(rows, **options)
    assert metric_value(rows, batches=3, **options) == pytest.approx(want, abs=1e-12)


def test_equals_sklearn_per_group_with_unit_weights():
    rng = random.Random(3)
    groups = {key: [(rng.choice([0.1, 0.3, 0.3, 0.8]), rng.choice([0, 1, 2])) for _ in range(rng.randint(2, 12))] for key in range(15)}
    rows = [(p, y, 1.0, key) for key, items in groups.items() for p, y in items]
    expected = [ndcg_score([[y for _, y in items]], [[p for p, _ in items]], k=5) for items in groups.values()]
    assert metric_value(rows, k=5, empty_groups="zero") == pytest.approx(sum(expected) / len(expected), abs=1e-12)


def test_padding_rows_change_nothing():
    rows = random_rows(11)
    metric = NDCGAtK(k=3)
    p, y, w, g = tensors(rows)
    metric.update(p, y, w, group=g)
    # weight 0: first in every ranking, relevant, even a NaN prediction: none of it counts
    pad = torch.zeros(len(rows))
    metric.update(torch.full((len(rows),), float("nan")), torch.full((len(rows),), 2.0), pad, group=g)
    metric.update(torch.full((len(rows),), 99.0), torch.ones(len(rows)), pad, group=g)
    assert float(metric.compute()) == pytest.approx(brute_force_ndcg(rows, 3), abs=1e-12)


def test_rows_split_over_metric_states_give_the_value_of_one():
    """What a distributed compute does: every rank's states concatenated (merge_state), with
    each group's rows spread over several states and one state that saw nothing."""
    rows = random_rows(5, n=200, groups=13)
    random.Random(0).shuffle(rows)
    whole = metric_value(rows, k=4)
    parts = [NDCGAtK(k=4) for _ in range(4)]  # the last one sees no row, as a rank without data
    for i, part in enumerate(parts[:3]):
        p, y, w, g = tensors(rows[i::3])
        part.update(p, y, w, group=g)
    for part in parts[1:]:
        parts[0].merge_state(part)
    assert float(parts[0].compute()) == pytest.approx(whole, abs=1e-12)


def test_no_relevant_group_is_zero_with_a_warning_and_group_by_is_required():
    metric = NDCGAtK(k=3)
    metric.update(torch.tensor([0.3, 0.2]), torch.tensor([0, 0]), group=torch.tensor([1, 2]))
    with pytest.warns(RuntimeWarning, match="ndcg_at_k is undefined because no group has a row with a positive label"):
        assert float(metric.compute()) == 0.0
    with pytest.raises(ValueError, match="group_by"):
        NDCGAtK(k=3).update(torch.tensor([0.3]), torch.tensor([1]))
    with pytest.raises(ValueError, match="group keys must be integers"):
        NDCGAtK(k=3).update(torch.tensor([0.3]), torch.tensor([1]), group=torch.tensor([1.5]))
