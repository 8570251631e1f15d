#!/usr/bin/env python
"""Issue 9, target 4b: the time of ``compute()`` at the end of an evaluation, per 10 million
rows on one rank. Goal: under 2 seconds.

``metrics_bench.py`` times ``update`` and ``compute`` together against torchmetrics; this one
separates them. Each metric is fed ``--rows`` rows in evaluation-sized batches (untimed: the
evaluation loop does that while the model runs), then ``compute()`` is timed alone. Rows are
float32 probabilities with labels drawn from them, weights of 1, and for the grouped metrics
one group per 10 rows (``grouped_auc``) or 100 rows (``grouped_xauc``). The cases run
interleaved, ``--rounds`` times; the summary gives each one's median and range.

    python benchmarks/metric_compute.py                      # 10,000,000 rows, 3 rounds
    python benchmarks/metric_compute.py --rows 1000000 --rounds 2
    python benchmarks/metric_compute.py --malloc default    # glibc's allocator as it comes

The evaluation runs in a training or ``tzrec-run evaluate`` process, which tunes glibc's
allocator (``train.tune_malloc``, on by default); so does this benchmark unless told otherwise.

One process: ``compute()`` on a rank first gathers every rank's rows (``dist_reduce_fx="cat"``)
and then sorts them all, so with R ranks of 10M rows each it sorts R * 10M rows; the goal
is stated per 10M rows. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from tzrun_plugins.metrics.auc import AUC
from tzrun_plugins.metrics.grouped_auc import GroupedAUC
from tzrun_plugins.metrics.grouped_xauc import GroupedXAUC
from tzrun_plugins.metrics.pointwise import LogLoss
from tzrun_plugins.metrics.xauc import XAUC

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics_bench import _data  # noqa: E402  (the same rows as the update+compute benchmark)

GOAL_S = 2.0


def _compute_seconds(make: Callable[[], Any], feed: Callable[[Any, slice], None], rows: int, batch: int) -> float:
    metric = make()
    for lo in range(0, rows, batch):
        feed(metric, slice(lo, min(rows, lo + batch)))
    gc.collect()
    start = time.perf_counter()
    value = float(metric.compute())
    seconds = time.perf_counter() - start
    assert value == value, "compute() returned NaN"
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8192, help="rows per update (the eval batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--malloc", choices=("tuned", "default"), default="tuned",
                        help="glibc's allocator as a training run sets it (train.tune_malloc, the default) or as it is")
    args = parser.parse_args()
    if args.malloc == "tuned":
        from tzrun.runner.allocator import tune_malloc

        tune_malloc()
    d = _data(args.rows, args.seed)
    cases: dict[str, tuple[Callable[[], Any], Callable[[Any, slice], None]]] = {
        "auc (exact)": (AUC, lambda m, s: m.update(d["probs"][s], d["label"][s], d["ones"][s])),
        "auc (thresholds = 200)": (lambda: AUC(thresholds=200),
                                   lambda m, s: m.update(d["probs"][s], d["label"][s], d["ones"][s])),
        "grouped_auc (N/10 groups)": (
            GroupedAUC, lambda m, s: m.update(d["probs"][s], d["label"][s], d["ones"][s], d["groups"][s])),
        "xauc (exact)": (XAUC, lambda m, s: m.update(d["probs"][s], d["watch_time"][s], d["ones"][s])),
        "grouped_xauc (N/100 groups)": (
            GroupedXAUC,
            lambda m, s: m.update(d["probs"][s], d["watch_time"][s], d["ones"][s], d["small_groups"][s])),
        "log_loss": (LogLoss, lambda m, s: m.update(d["probs"][s], d["label"][s], d["ones"][s])),
    }
    for make, feed in cases.values():  # untimed warm-up of every kernel
        _compute_seconds(make, feed, 20_000, args.batch_size)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(args.rounds):
        for name in (list(cases) if r % 2 == 0 else list(reversed(cases))):
            times[name].append(_compute_seconds(*cases[name], args.rows, args.batch_size))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    scale = 10_000_000 / args.rows
    print(f"\ncompute() alone after {args.rows:,} rows in batches of {args.batch_size}, {args.rounds} rounds, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, malloc {args.malloc}")
    print(f"{'metric':32s} {'median s':>9s} {'min-max':>13s} {'s per 10M':>10s}  goal < {GOAL_S} s")
    for name, ts in times.items():
        per = statistics.median(ts) * scale
        print(f"{name:32s} {statistics.median(ts):9.3f} {min(ts):6.3f}-{max(ts):.3f} {per:10.3f}  "
              f"{'met' if per < GOAL_S else 'NOT met'}")


if __name__ == "__main__":
    main()
