#!/usr/bin/env python
"""Issue 9, target 3: training fed from Parquet through the reader against training on batches
already in memory, with string ids hashed at read time. Goal: ratio >= 0.90.

The data is the synthetic Criteo set with its 26 id columns rewritten as 8-digit hexadecimal
strings (Criteo's own look), and the DeepFM example's id features switched from ``num_buckets``
to ``hash_bucket_size`` (4x the ids of each column), so every batch hashes 26 string columns.

* **reader**: ``tzrec-run train`` as a user runs it: the Parquet reader and the batch builder
  (decode, hash, fill, log1p) in the DataLoader worker(s), ``data.num_workers`` of the example.
* **memory**: the same run in a fresh process, except that its batches (the same ones, up to
  1024 of them, then cycled) are built before the clock starts: no reading, decoding or hashing
  during training. It patches ``TrainData.batches`` for that, and nothing else. (An earlier
  version cycled 32 batches; training on the run's own batches measured the same.)

Both report samples/s over the training segments (``trained ... samples/s``). Rounds alternate
the order; the summary gives the median and spread of reader / memory.

    python benchmarks/input_pipeline.py --data data/criteo_synth --steps 120 --rounds 4 [--batch-size 8192]

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
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

TARGET = 0.90

_MEMORY_MAIN = r'''
import itertools, sys
from tzrun.runner import position

original = position.TrainData.batches

def batches(self, from_step=0):
    total = self.total - from_step
    made = list(itertools.islice(original(self, from_step), min(total, 1024)))  # before the clock starts
    return (made[i % len(made)] for i in range(total))

position.TrainData.batches = batches
from tzrun.cli.main import console_main
sys.argv = ["tzrec-run", *sys.argv[1:]]
console_main()
'''


def string_ids(data: Path, out: Path) -> Path:
    """The Parquet files of ``data`` with ``cat_*`` as hex strings, in ``out`` (made once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tzrun_tools.criteo_text import hex_id

    if (out / "done").exists():
        return out
    for split in ("train", "eval"):
        (out / split).mkdir(parents=True, exist_ok=True)
        for part in sorted((data / split).glob("part-*.parquet")):
            table = pq.read_table(part)
            for i, name in enumerate(table.column_names):
                if name.startswith("cat_"):
                    strings = pa.array([hex_id(v) for v in table.column(name).to_pylist()], pa.string())
                    table = table.set_column(i, name, strings)
            pq.write_table(table, out / split / part.name, row_group_size=32_768)
    (out / "done").write_text("")
    return out


def hashed_config(config: Path) -> Path:
    """The example with every ``num_buckets = N`` of an id feature as ``hash_bucket_size = 4N``."""
    import re

    text = re.sub(r"(?m)^num_buckets = (\d+)", lambda m: f"hash_bucket_size = {4 * int(m.group(1))}", config.read_text())
    path = config.with_name("hashed.toml")
    path.write_text(text)
    return path


def run(mode: str, config: Path, data: Path, model_dir: Path, batch: int) -> float:
    args = train_args(config, data, model_dir, "eval.num_steps=1", f"data.batch_size={batch}")
    command = [*tzrec_run(), *args] if mode == "reader" else [sys.executable, "-c", _MEMORY_MAIN, *args]
    return samples_per_s(command, f"the {mode} run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, steps=120, rounds=4)
    args = parser.parse_args()
    ensure_data(args.data, args.rows)
    data = string_ids(args.data.resolve(), args.data.resolve().parent / (args.data.name + "_string_ids"))
    ratios, readers, memories = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        config = hashed_config(framework_config(Path(tmp), args.steps))
        for r in range(args.rounds):
            order = ["reader", "memory"] if r % 2 == 0 else ["memory", "reader"]
            rate = {mode: run(mode, config, data, Path(tmp) / mode, args.batch_size) for mode in order}
            readers.append(rate["reader"])
            memories.append(rate["memory"])
            ratios.append(rate["reader"] / rate["memory"])
            print(f"round {r + 1}: reader {rate['reader']:,.0f} samples/s, memory {rate['memory']:,.0f} samples/s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    print(ratio_summary("reader/memory", ratios, TARGET, detail=(
        f" at batch {args.batch_size}; reader median {statistics.median(readers):,.0f}, memory median "
        f"{statistics.median(memories):,.0f} samples/s")))


if __name__ == "__main__":
    main()
