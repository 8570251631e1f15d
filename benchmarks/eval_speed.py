#!/usr/bin/env python
"""Issue 9, target 4: evaluation throughput against training throughput, same data, same run.
Goal: eval rows/s >= 2x training samples/s.

Each round is one fresh ``tzrec-run train`` of ``examples/deepfm_criteo.toml`` for ``--steps``
steps whose eval input is the whole train split (400,000 rows with the quick-start data), so the
evaluation pass is long enough to time. Training samples/s is the ``trained ...`` line (training
segments only); eval rows/s is the final evaluation's rows / seconds from ``metrics.jsonl`` (the
pass, metric computation at its end included: exact AUC over every row of every rank).

    python benchmarks/eval_speed.py --data data/criteo_synth --steps 120 --rounds 3

The metric computation on its own (exact AUC over 10 million rows in well under 2 s per rank)
is timed by ``benchmarks/metrics_bench.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_deepfm import (  # noqa: E402
    add_run_arguments,
    ensure_data,
    framework_config,
    ratio_summary,
    samples_per_s,
    train_args,
    tzrec_run,
)

from tzrun.io.files import read_jsonl  # noqa: E402

TARGET = 2.0


def run(config: Path, data: Path, model_dir: Path, batch: int, eval_batch: int) -> tuple[float, float, int]:
    """One run: (training samples/s, eval rows/s, eval rows)."""
    args = train_args(config, data, model_dir, f"data.batch_size={batch}", f"data.eval_batch_size={eval_batch}",
                      eval_split="train")
    train = samples_per_s([*tzrec_run(), *args])
    evals = [r for r in read_jsonl(model_dir / "metrics.jsonl") if r["kind"] == "eval"]
    last = evals[-1]
    return train, last["rows"] / last["seconds"], last["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, steps=120, rounds=3)
    parser.add_argument("--eval-batch-size", type=int, default=8192)
    args = parser.parse_args()
    ensure_data(args.data, args.rows)
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        config = framework_config(Path(tmp), args.steps)
        for r in range(args.rounds):
            train, evaluate, rows = run(config, args.data.resolve(), Path(tmp) / "run", args.batch_size, args.eval_batch_size)
            ratios.append(evaluate / train)
            print(f"round {r + 1}: train {train:,.0f} samples/s, eval {evaluate:,.0f} rows/s over {rows:,} rows, "
                  f"ratio {ratios[-1]:.2f}", flush=True)
    print(ratio_summary("eval/train", ratios, TARGET, digits=2))


if __name__ == "__main__":
    main()
