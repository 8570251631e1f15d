#!/usr/bin/env python
"""Throughput of ``tzrec-run train examples/deepfm_criteo.toml`` against the hand-written TorchRec
loop of ``benchmarks/handwritten_deepfm.py``, on the same data, interleaved over several rounds.

Each round runs both (hand-written first in even rounds, the framework first in odd ones), each
as a fresh process (or a fresh ``torchrun`` job with ``--nproc-per-node 2``), and reads the
samples/s each reports:

* framework: the ``trained N steps in S s (X samples/s)`` line of ``tzrec-run train``; X covers
  the training segments only (pipeline creation, DataLoader start and pipeline fill included;
  process start, data and model set-up, sharding, checkpointing and evaluation excluded).
* hand-written: its ``RESULT samples_per_s=...`` line, measured the same way (``--warmup-steps
  0``: the clock runs from just before the train pipeline is created to the drained pipeline
  after the last step; set-up excluded).

Both count ``batch_size * world_size * steps`` rows. The ratio is framework / hand-written per
round (the framework's goal is >= 0.97); the summary gives the median and the min-max of each.
The wall time of each process (start-up and set-up included) is shown for information only.

    python benchmarks/compare_deepfm.py                       # 200k rows, 60 steps, 3 rounds, 1 process
    python benchmarks/compare_deepfm.py --nproc-per-node 2 --rounds 5

``--handwritten-input memory`` feeds the hand-written loop batches built before its clock
starts (the ceiling: a loop that pays nothing for input), while tzrec-run reads Parquet as
always; the ratio then includes everything tzrec-run's input costs. ``--cardinalities kaggle``
generates data whose 26 id columns have the Criteo Kaggle data's cardinalities capped at 1M
(zipf ids; 6.6M rows in all) and sizes both models' tables to match:

    python benchmarks/compare_deepfm.py --cardinalities kaggle --batch-size 8192 --steps 40 \
        --handwritten-input memory --handwritten-malloc tuned --data /tmp/tzrun_bench_kaggle

The data is generated with ``tzrec-run data synth criteo`` unless ``--data`` already holds a
``synth.json``. Run it on an otherwise idle machine: timings under CPU contention mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "deepfm_criteo.toml"
HANDWRITTEN = REPO / "benchmarks" / "handwritten_deepfm.py"
TARGET = 0.97

HANDWRITTEN_RE = re.compile(r"^RESULT samples_per_s=([0-9.eE+-]+) steps=(\d+) world_size=(\d+)\s*$", re.M)
FRAMEWORK_RE = re.compile(r"^trained (\d+) steps in ([0-9.]+) s \(([0-9,.]+) samples/s\)\s*$", re.M)


def tzrec_run() -> list[str]:
    script = Path(sys.executable).parent / "tzrec-run"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tzrun"]


def ensure_data(data: Path, rows: int, cardinalities: str = "example") -> list[int]:
    """Make the synthetic data unless ``data`` has it; returns its 26 cardinalities."""
    report = data / "synth.json"
    if report.exists():
        document = json.loads(report.read_text())
        have = document.get("train_rows")
        note = "" if have == rows else f" (it has {have} train rows, not --rows {rows}; delete it or pass another --data to regenerate)"
        print(f"data: using {data}{note}")
        return [int(c) for c in document["cardinalities"]]
    print(f"data: generating {rows} rows into {data} ({cardinalities} cardinalities) ...", flush=True)
    if cardinalities == "kaggle":
        from tzrun.tools.synth import kaggle_cardinalities, synth_criteo

        return list(synth_criteo(data, rows=rows, cardinalities=kaggle_cardinalities(1_000_000)).cardinalities)
    subprocess.run([*tzrec_run(), "data", "synth", "criteo", "--rows", str(rows), "--out", str(data)], check=True)
    return [int(c) for c in json.loads(report.read_text())["cardinalities"]]


def framework_config(work: Path, steps: int, table_rows: list[int] | None = None) -> Path:
    """The example with ``num_epochs = 1`` replaced by ``num_steps = steps`` (the config needs
    exactly one of the two, and a ``--set`` override cannot delete a key), and its features'
    ``num_buckets`` replaced by ``table_rows`` when given."""
    text, n = re.subn(r"(?m)^num_epochs\s*=\s*1\s*$", f"num_steps = {steps}", EXAMPLE.read_text())
    if n != 1:
        raise SystemExit(f"{EXAMPLE}: expected one 'num_epochs = 1' line; update {__file__}")
    if table_rows is not None:
        sizes = iter(table_rows)
        text, n = re.subn(r"(?m)^num_buckets = \d+$", lambda _: f"num_buckets = {next(sizes)}", text)
        if n != len(table_rows):
            raise SystemExit(f"{EXAMPLE}: expected {len(table_rows)} num_buckets lines, found {n}; update {__file__}")
    path = work / "deepfm_criteo_bench.toml"
    path.write_text(text)
    return path


def train_args(config: Path, data: Path, model_dir: Path, *sets: str, eval_split: str = "eval") -> list[str]:
    """``train CONFIG`` on ``data`` into ``model_dir`` (overwritten), with ``--set`` for each of ``sets``."""
    args = ["train", str(config), "--model-dir", str(model_dir), "--overwrite",
            "--set", f"data.train_input={json.dumps(str(data / 'train'))}",
            "--set", f"data.eval_input={json.dumps(str(data / eval_split))}"]
    for override in sets:
        args += ["--set", override]
    return args


def samples_per_s(command: list[str], what: str = "tzrec-run train") -> float:
    """Run a training command and return the samples/s of its ``trained ...`` line."""
    proc = subprocess.run(command, capture_output=True, text=True)
    match = FRAMEWORK_RE.search(proc.stdout)
    if proc.returncode or match is None:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return float(match.group(3).replace(",", ""))


def busy_fraction(seconds: float = 1.0) -> float | None:
    """Fraction of all CPUs busy over ``seconds`` (from /proc/stat; None where there is none)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return None
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def run(command: list[str], log: Path, pattern: re.Pattern[str], what: str,
        env: dict[str, str] | None = None) -> tuple[re.Match[str], float]:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - started
    log.write_text(f"$ {' '.join(command)}\n{proc.stdout}")
    match = pattern.search(proc.stdout)
    if proc.returncode or not match:
        tail = "\n".join(proc.stdout.splitlines()[-25:])
        raise SystemExit(f"{what} failed (exit {proc.returncode}); full output in {log}\n{tail}")
    return match, wall


def add_run_arguments(parser: argparse.ArgumentParser, *, steps: int, rounds: int) -> None:
    """The options every ``tzrec-run train`` benchmark on the synthetic Criteo data takes."""
    parser.add_argument("--data", type=Path, default=Path("data/criteo_synth"))
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=rounds)


def ratio_summary(name: str, ratios: list[float], target: float, digits: int = 3, detail: str = "") -> str:
    """``NAME: median M (min A, max B) over N rounds[ DETAIL]; target >= T: met|NOT met``."""
    median = statistics.median(ratios)
    return (f"{name}: median {median:.{digits}f} (min {min(ratios):.{digits}f}, max {max(ratios):.{digits}f}) "
            f"over {len(ratios)} rounds{detail}; target >= {target}: {'met' if median >= target else 'NOT met'}")


def spread(values: list[float], fmt: str) -> str:
    return f"median {format(statistics.median(values), fmt)}  (min {format(min(values), fmt)}, max {format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="train rows to generate (default 200000)")
    parser.add_argument("--batch-size", type=int, default=2048, help="rows per step on each rank (default 2048)")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run (default 60)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--nproc-per-node", type=int, default=1, choices=[1, 2], help="processes per run (default 1)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/tzrun_bench_criteo"), help="data directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, config, model dirs)")
    parser.add_argument(
        "--handwritten-malloc", choices=["default", "tuned"], default="default",
        help="glibc allocator of the hand-written loop: glibc's defaults, or the settings tzrec-run applies "
             "(train.tune_malloc) through glibc's MALLOC_*_ variables (default: default)")
    parser.add_argument("--handwritten-input", choices=["parquet", "memory"], default="parquet",
                        help="the hand-written loop reads Parquet in a DataLoader worker (default), or trains on "
                             "batches built in memory before its clock starts")
    parser.add_argument("--cardinalities", choices=["example", "kaggle"], default="example",
                        help="the id columns' cardinalities when generating data: the example's small ones "
                             "(default), or the Criteo Kaggle data's capped at 1M")
    parser.add_argument("--framework-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra --set for tzrec-run train, e.g. train.tune_malloc=false (repeatable)")
    args = parser.parse_args()

    data = args.data.resolve()
    table_rows = ensure_data(data, args.rows, args.cardinalities)
    busy = busy_fraction()
    if busy is not None and busy > 0.2:
        print(f"WARNING: {busy:.0%} of the {os.cpu_count()} CPU(s) busy before starting; the timings will be skewed")

    work = Path(tempfile.mkdtemp(prefix="tzrun_bench_"))
    config = framework_config(work, args.steps, table_rows)
    nproc = args.nproc_per_node
    hand_cmd = [
        str(HANDWRITTEN), "--data", str(data / "train"), "--batch-size", str(args.batch_size),
        "--steps", str(args.steps), "--warmup-steps", "0", "--table-rows", ",".join(map(str, table_rows)),
    ]
    if args.handwritten_input == "memory":
        hand_cmd.append("--in-memory")
    if nproc > 1:
        hand_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *hand_cmd]
    else:
        hand_cmd = [sys.executable, *hand_cmd]
    fw_cmd = [
        *tzrec_run(), "train", str(config),
        "--set", f"data.train_input={json.dumps(str(data / 'train'))}",
        "--set", f"data.eval_input={json.dumps(str(data / 'eval'))}",
        "--set", "eval.num_steps=1",  # one eval batch: evaluation is outside the timing anyway
        "--set", f"data.batch_size={args.batch_size}",
        "--set", f"train.num_steps={args.steps}",
        "--model-dir", str(work / "framework_model"), "--overwrite",
    ]
    for extra in args.framework_set:
        fw_cmd += ["--set", extra]
    hand_env = {}
    if args.handwritten_malloc == "tuned":
        from tzrun.runner.allocator import MALLOPT_SETTINGS

        hand_env = {variable: str(value) for _, _, value, variable in MALLOPT_SETTINGS}
    if nproc > 1:
        fw_cmd += ["--nproc-per-node", str(nproc)]

    print(f"work dir: {work}")
    print(f"hand-written: {' '.join(hand_cmd)}  (glibc malloc: {args.handwritten_malloc}; input: {args.handwritten_input})")
    print(f"framework:    {' '.join(fw_cmd)}")
    print(
        f"{args.rounds} round(s), {args.steps} steps of {args.batch_size} rows per rank on {nproc} process(es); "
        "samples/s = batch_size * world_size * steps / training time (pipeline creation, DataLoader start and "
        "pipeline fill included; process start, set-up, checkpoint and evaluation excluded)\n",
        flush=True,
    )

    rows = []
    for i in range(args.rounds):
        order = ["hand-written", "framework"] if i % 2 == 0 else ["framework", "hand-written"]
        result: dict[str, tuple[float, float]] = {}
        for who in order:
            if who == "hand-written":
                match, wall = run(hand_cmd, work / f"round{i + 1}_handwritten.log", HANDWRITTEN_RE, "hand-written run", hand_env)
                if int(match.group(2)) != args.steps or int(match.group(3)) != nproc:
                    raise SystemExit(f"hand-written run reported {match.group(0)!r}; expected {args.steps} steps on {nproc} rank(s)")
                result[who] = (float(match.group(1)), wall)
            else:
                match, wall = run(fw_cmd, work / f"round{i + 1}_framework.log", FRAMEWORK_RE, "tzrec-run train")
                if int(match.group(1)) != args.steps:
                    raise SystemExit(f"tzrec-run reported {match.group(0)!r}; expected {args.steps} steps")
                result[who] = (float(match.group(3).replace(",", "")), wall)
        hand, fw = result["hand-written"][0], result["framework"][0]
        rows.append((hand, fw, fw / hand))
        print(f"round {i + 1}/{args.rounds} (order: {' then '.join(order)})")
        print(f"  {'':14}{'samples/s':>12}{'process wall s':>16}")
        for who in ("hand-written", "framework"):
            print(f"  {who:14}{result[who][0]:>12,.0f}{result[who][1]:>16.1f}")
        print(f"  ratio framework / hand-written: {fw / hand:.3f}\n", flush=True)

    hands, fws, ratios = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    print(f"summary over {len(rows)} round(s), {nproc} process(es), {args.steps} steps x {args.batch_size} rows per rank:")
    print(f"  hand-written samples/s   {spread(hands, ',.0f')}")
    print(f"  framework samples/s      {spread(fws, ',.0f')}")
    print(f"  ratio (per round)        {spread(ratios, '.3f')}   target >= {TARGET}")
    print(
        f"SUMMARY handwritten_median={statistics.median(hands):.1f} framework_median={statistics.median(fws):.1f} "
        f"ratio_median={statistics.median(ratios):.4f} ratio_min={min(ratios):.4f} ratio_max={max(ratios):.4f} "
        f"rounds={len(rows)} nproc={nproc} steps={args.steps} batch_size={args.batch_size} "
        f"handwritten_malloc={args.handwritten_malloc} handwritten_input={args.handwritten_input} "
        f"cardinalities={args.cardinalities} framework_set={','.join(args.framework_set) or '-'}"
    )
    if args.keep:
        print(f"logs and configs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
