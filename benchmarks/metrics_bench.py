#!/usr/bin/env python
"""Time the exact ranking metrics against their baselines, as ratios measured in the same run.

Each case feeds a metric ``N`` rows in evaluation-sized batches (``--batch-size``, default
65536) through ``update`` and then calls ``compute`` once; the time covers both. Rows are
float32 probabilities with labels drawn from them (as a model's eval output) and, for our
metrics, weights of 1 (what the evaluation loop passes without a sample-weight column).

* ``auc`` (exact) over ``N`` rows  vs  ``torchmetrics.classification.BinaryAUROC(thresholds=None)``
  (exact, no weights) over the same rows. Goal: ratio <= 1.
* ``grouped_auc`` over the same ``N`` rows in ``N / 10`` groups  vs  exact ``auc``. Goal: <= 2.
* ``xauc`` (exact) over ``N / 10`` rows with regression targets  vs  exact ``auc`` over ``N / 10``
  rows. Goal: <= 3.
* for information: ``xauc`` with random sample weights, ``grouped_xauc`` over ``N / 10`` rows
  in ``N / 100`` groups.

After an untimed warm-up of every case on 20,000 rows, the cases run interleaved, ``--rounds``
times; the summary gives each case's median time and the median (min-max) of its per-round
ratio to its baseline.

    python benchmarks/metrics_bench.py                    # N = 10,000,000
    python benchmarks/metrics_bench.py --rows 1000000 --rounds 3

Run it on an otherwise idle machine: timings under CPU contention mean little, and they hurt
the metrics made of many short vectorized passes (``xauc``) more than one long sort.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any, Callable

import torch
from torchmetrics.classification import BinaryAUROC

from tzrun_plugins.metrics.auc import AUC
from tzrun_plugins.metrics.grouped_auc import GroupedAUC
from tzrun_plugins.metrics.grouped_xauc import GroupedXAUC
from tzrun_plugins.metrics.xauc import XAUC


def _data(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, generator=g)
    probs = torch.sigmoid(logits)
    return {
        "probs": probs,
        "label": (torch.rand(rows, generator=g) < probs).float(),
        "ones": torch.ones(rows),
        "weight": torch.rand(rows, generator=g) * 2,
        "groups": torch.randint(0, max(1, rows // 10), (rows,), generator=g),
        "small_groups": torch.randint(0, max(1, rows // 100), (rows,), generator=g),
        "watch_time": torch.round(torch.exp(logits + torch.randn(rows, generator=g)) * 10) / 10,
    }


def _timed(make: Callable[[], Any], feed: Callable[[Any, slice], None], rows: int, batch_size: int) -> float:
    gc.collect()
    start = time.perf_counter()
    metric = make()
    for lo in range(0, rows, batch_size):
        feed(metric, slice(lo, min(rows, lo + batch_size)))
    float(metric.compute())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="N (default 10,000,000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--batch-size", type=int, default=65536, help="rows per update (default 65536)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n, small = args.rows, max(2, args.rows // 10)
    data = _data(n, args.seed)
    d = data

    cases: dict[str, tuple[Callable[[], Any], Callable[[Any, slice], None], int]] = {
        "torchmetrics BinaryAUROC, N": (
            lambda: BinaryAUROC(thresholds=None), lambda m, s: m.update(d["probs"][s], d["label"][s].long()), n),
        "auc, N": (AUC, lambda m, s: m.update(d["probs"][s], d["label"][s], d["ones"][s]), n),
        "grouped_auc, N rows, N/10 groups": (
            GroupedAUC, lambda m, s: m.update(d["probs"][s], d["label"][s], d["ones"][s], d["groups"][s]), n),
        "auc, N/10": (AUC, lambda m, s: m.update(d["probs"][s], d["label"][s], d["ones"][s]), small),
        "xauc, N/10": (XAUC, lambda m, s: m.update(d["probs"][s], d["watch_time"][s], d["ones"][s]), small),
        "xauc weighted, N/10": (XAUC, lambda m, s: m.update(d["probs"][s], d["watch_time"][s], d["weight"][s]), small),
        "grouped_xauc, N/10 rows, N/100 groups": (
            GroupedXAUC,
            lambda m, s: m.update(d["probs"][s], d["watch_time"][s], d["ones"][s], d["small_groups"][s]),
            small,
        ),
    }
    baselines = {
        "auc, N": ("torchmetrics BinaryAUROC, N", "<= 1"),
        "grouped_auc, N rows, N/10 groups": ("auc, N", "<= 2"),
        "xauc, N/10": ("auc, N/10", "<= 3"),
        "xauc weighted, N/10": ("auc, N/10", "info"),
        "grouped_xauc, N/10 rows, N/100 groups": ("auc, N/10", "info"),
    }
    for make, feed, rows in cases.values():  # untimed: first calls of torch kernels, allocator
        _timed(make, feed, min(rows, 20_000), args.batch_size)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(args.rounds):
        order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
        for name in order:
            make, feed, rows = cases[name]
            times[name].append(_timed(make, feed, rows, args.batch_size))
        print(f"round {round_ + 1}/{args.rounds} done", flush=True)

    print(f"\nN = {n:,} rows, {args.rounds} rounds, batch {args.batch_size}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'case':40s} {'median s':>9s}  ratio: median (min-max) to baseline, goal")
    for name in cases:
        line = f"{name:40s} {statistics.median(times[name]):9.3f}"
        if name in baselines:
            base, goal = baselines[name]
            ratios = [t / b for t, b in zip(times[name], times[base])]
            line += f"  {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) to [{base}], goal {goal}"
        print(line)


if __name__ == "__main__":
    main()
