#!/usr/bin/env python
"""The cost of the loop stages: ``tzrec-run train examples/deepfm_criteo.toml`` with
``progress``, ``tensorboard`` and ``metrics_log`` against the same run with no stages at all,
interleaved over several rounds (which one goes first alternates).

Each run is a fresh process; its samples/s is the ``trained N steps in S s (X samples/s)`` line
(training segments only: evaluation, checkpoints and set-up excluded, as in
``compare_deepfm.py``). The ratio is staged / bare per round; the target is >= 0.98 (at most 2 %
overhead). The train log runs every ``--log-every`` steps in both runs (it is the loop's, not a
stage's), so the comparison isolates what the stages themselves cost.

    python benchmarks/stages_overhead.py --data data/criteo_synth --steps 180 --rounds 4

Run it on an otherwise idle machine: timings under CPU contention mean nothing.
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

TARGET = 0.98
STAGED = 'train.stages=[{type = "progress", mode = "lines"}, {type = "tensorboard"}, {type = "metrics_log"}]'
BARE = "train.stages=[]"


def run(config: Path, data: Path, model_dir: Path, stages: str, log_every: int, batch: int) -> float:
    """One training run; returns its samples/s (one eval batch: evaluation is outside the timing)."""
    args = train_args(config, data, model_dir, "eval.num_steps=1", f"data.batch_size={batch}",
                      f"train.log_every_n_steps={log_every}", stages)
    return samples_per_s([*tzrec_run(), *args])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, steps=180, rounds=4)
    parser.add_argument("--log-every", type=int, default=20)
    args = parser.parse_args()
    ensure_data(args.data, args.rows)
    ratios, staged_rates, bare_rates = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        config = framework_config(Path(tmp), args.steps)
        for r in range(args.rounds):
            order = [("bare", BARE), ("staged", STAGED)]
            if r % 2:
                order.reverse()
            rates = {}
            for name, stages in order:
                rates[name] = run(config, args.data, Path(tmp) / name, stages, args.log_every, args.batch_size)
            ratios.append(rates["staged"] / rates["bare"])
            staged_rates.append(rates["staged"])
            bare_rates.append(rates["bare"])
            print(f"round {r + 1}: bare {rates['bare']:,.0f} samples/s, staged {rates['staged']:,.0f} samples/s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    print(ratio_summary("staged/bare", ratios, TARGET))


if __name__ == "__main__":
    main()
