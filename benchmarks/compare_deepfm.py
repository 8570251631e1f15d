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

``--table-rows-total N`` (with ``--cardinalities kaggle``) scales those cardinalities to N table
rows in all (the biggest tables capped lower, or every table scaled up past the real data's 33.8M).
``--json OUT`` writes every round's samples/s and each job's peak memory (``max_rss``: its largest
process, ``ru_maxrss``; ``peak_pss``: its processes' PSS summed, sampled every second, so a forked
DataLoader worker's shared pages count once) for ``benchmarks/scaling.py``; a
job whose processes together pass ``--memory-limit-gb`` is killed and reported rather than left to
the kernel's OOM killer.

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
import threading
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


def scaled_kaggle(total: int) -> list[int]:
    """The Criteo Kaggle cardinalities scaled to ``total`` rows in all: up to the real data's sum
    the biggest tables are capped (as hashing them into fewer buckets would), past it every table
    grows in proportion."""
    from tzrun_tools.synth import KAGGLE_CARDINALITIES

    real = sum(KAGGLE_CARDINALITIES)
    if total >= real:
        return [max(1, round(c * total / real)) for c in KAGGLE_CARDINALITIES]
    lo, hi = 1, max(KAGGLE_CARDINALITIES)
    while lo < hi:  # the largest cap whose capped sum is at most total
        cap = (lo + hi + 1) // 2
        lo, hi = (cap, hi) if sum(min(c, cap) for c in KAGGLE_CARDINALITIES) <= total else (lo, cap - 1)
    return [min(c, lo) for c in KAGGLE_CARDINALITIES]


def ensure_data(data: Path, rows: int, cardinalities: str = "example", table_rows_total: int | None = None) -> list[int]:
    """Make the synthetic data unless ``data`` has it; returns its 26 cardinalities."""
    report = data / "synth.json"
    if report.exists():
        document = json.loads(report.read_text())
        have = document.get("train_rows")
        note = "" if have == rows else f" (it has {have} train rows, not --rows {rows}; delete it or pass another --data to regenerate)"
        have_total = sum(document["cardinalities"])
        if table_rows_total is not None and have_total != sum(scaled_kaggle(table_rows_total)):
            note += f" (its tables have {have_total:,} rows in all, not --table-rows-total {table_rows_total:,})"
        print(f"data: using {data}{note}")
        return [int(c) for c in document["cardinalities"]]
    print(f"data: generating {rows} rows into {data} ({cardinalities} cardinalities) ...", flush=True)
    if cardinalities == "kaggle":
        from tzrun_tools.synth import kaggle_cardinalities, synth_criteo

        sizes = kaggle_cardinalities(1_000_000) if table_rows_total is None else tuple(scaled_kaggle(table_rows_total))
        return list(synth_criteo(data, rows=rows, cardinalities=sizes).cardinalities)
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


def tree_rss(pid: int, proportional: bool = False) -> int:
    """Resident bytes of ``pid`` and all its descendants (0 where /proc cannot say); with
    ``proportional``, their PSS (pages shared by forked processes counted once; costlier to read)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            if proportional:
                pss = next(line for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines() if line.startswith("Pss:"))
                total += int(pss.split()[1]) * 1024
            else:
                total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return total


class Measured:
    """A finished process: its output, wall seconds, exit status and peak memory."""

    def __init__(self, stdout: str, wall: float, returncode: int, max_rss: int, peak_tree_pss: int, killed: str) -> None:
        self.stdout, self.wall, self.returncode = stdout, wall, returncode
        self.max_rss = max_rss  # bytes, the largest single process of the job (ru_maxrss)
        self.peak_tree_pss = peak_tree_pss  # bytes, the job's processes' PSS summed, sampled every second
        self.killed = killed  # why the job was killed, or ""


def run_measured(command: list[str], env: dict[str, str] | None = None, limit_bytes: int | None = None) -> Measured:
    """Run ``command`` in its own session, sampling its process tree's memory: the whole session
    is killed when its RSS (checked every 0.2 s) passes ``limit_bytes``; its PSS is read every second."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    peak, killed, done = [0], [""], threading.Event()

    def watch() -> None:
        tick = 0
        while not done.wait(0.2):
            rss = tree_rss(proc.pid)
            tick += 1
            if tick % 5 == 0:
                peak[0] = max(peak[0], tree_rss(proc.pid, proportional=True))
            if limit_bytes and rss > limit_bytes and not killed[0]:
                killed[0] = f"killed: its processes held {rss / 2**30:.1f} GiB, over the limit of {limit_bytes / 2**30:.1f} GiB"
                os.killpg(proc.pid, 9)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stdout = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    watcher.join()
    return Measured(stdout, time.perf_counter() - started, proc.returncode, usage.ru_maxrss * 1024, peak[0], killed[0])


def run(command: list[str], log: Path, pattern: re.Pattern[str], what: str,
        env: dict[str, str] | None = None, limit_bytes: int | None = None) -> tuple[re.Match[str], Measured]:
    result = run_measured(command, env, limit_bytes)
    log.write_text(f"$ {' '.join(command)}\n{result.stdout}")
    match = pattern.search(result.stdout)
    if result.returncode or not match:
        tail = "\n".join(result.stdout.splitlines()[-25:])
        raise SystemExit(f"{what} failed (exit {result.returncode}{'; ' + result.killed if result.killed else ''}); "
                         f"full output in {log}\n{tail}")
    return match, result


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


def memory_limit(gb: float | None) -> int | None:
    """``gb`` in bytes, or 90% of the memory available now (None where it cannot be read)."""
    if gb is not None:
        return int(gb * 2**30)
    from tzrun.runner.host_memory import host_memory

    memory = host_memory()
    return None if memory is None else int(memory.available * 0.9)


def write_json(out: Path, args: argparse.Namespace, nproc: int, table_rows: list[int], records: list[dict]) -> None:
    """The run's settings, every round's measurements and their medians, as JSON."""
    def median(loop: str, field: str) -> float:
        return statistics.median(r[loop][field] for r in records)

    ratios = [r["framework"]["samples_per_s"] / r["handwritten"]["samples_per_s"] for r in records]
    document = {
        "nproc": nproc, "steps": args.steps, "batch_size": args.batch_size, "data_rows": args.rows,
        "table_rows": table_rows, "table_rows_total": sum(table_rows), "handwritten_input": args.handwritten_input,
        "handwritten_malloc": args.handwritten_malloc, "framework_set": args.framework_set, "rounds": records,
        "median": {loop: {field: median(loop, field) for field in records[0][loop]}
                   for loop in ("handwritten", "framework", "framework_resume") if loop in records[0]},
        "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")


def rate_after(metrics: Path, warmup: int, rows_per_step: int) -> float:
    """Samples/s of the train log windows of ``metrics`` (a ``metrics.jsonl``) after step
    ``warmup``: their rows over their seconds."""
    windows = [r for r in map(json.loads, metrics.read_text().splitlines())
               if r.get("kind") == "train" and r["step"] - r["steps"] >= warmup]
    if not windows:
        raise SystemExit(f"{metrics}: no train log window after step {warmup}")
    return sum(r["steps"] for r in windows) * rows_per_step / sum(r["seconds"] for r in windows)


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
    parser.add_argument("--table-rows-total", type=int, default=None, metavar="N",
                        help="with --cardinalities kaggle: scale the tables (and the generated ids) to N rows in all")
    parser.add_argument("--warmup-steps", type=int, default=0, metavar="W",
                        help="time only the steps after step W in both loops (default 0: all of them); the "
                             "framework's rate then comes from its metrics.jsonl windows (train.log_every_n_steps=W), "
                             "so a compiled run's compile (on the first steps) is left out")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="write every round's samples/s and peak RSS, and the medians, to OUT")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="kill a job whose processes together hold more than this (default: 90%% of the "
                             "memory available at start)")
    parser.add_argument("--resume", action="store_true",
                        help="after each framework run, resume its checkpoint for one more step (a load, a step, a "
                             "save) and measure that process's peak too (framework_resume in --json)")
    args = parser.parse_args()
    if args.table_rows_total is not None and args.cardinalities != "kaggle":
        parser.error("--table-rows-total needs --cardinalities kaggle")

    data = args.data.resolve()
    table_rows = ensure_data(data, args.rows, args.cardinalities, args.table_rows_total)
    limit = memory_limit(args.memory_limit_gb)
    busy = busy_fraction()
    if busy is not None and busy > 0.2:
        print(f"WARNING: {busy:.0%} of the {os.cpu_count()} CPU(s) busy before starting; the timings will be skewed")

    work = Path(tempfile.mkdtemp(prefix="tzrun_bench_"))
    config = framework_config(work, args.steps, table_rows)
    nproc = args.nproc_per_node
    hand_cmd = [
        str(HANDWRITTEN), "--data", str(data / "train"), "--batch-size", str(args.batch_size),
        "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps), "--table-rows", ",".join(map(str, table_rows)),
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
    if args.warmup_steps:
        if not 0 < args.warmup_steps < args.steps:
            parser.error("--warmup-steps must be between 0 and --steps")
        fw_cmd += ["--set", f"train.log_every_n_steps={args.warmup_steps}"]
    for extra in args.framework_set:
        fw_cmd += ["--set", extra]
    hand_env = {}
    if args.handwritten_malloc == "tuned":
        from tzrun.runner.allocator import MALLOPT_SETTINGS

        hand_env = {variable: str(value) for _, _, value, variable in MALLOPT_SETTINGS}
    if nproc > 1:
        fw_cmd += ["--nproc-per-node", str(nproc)]
    # the same run resumed from its last checkpoint for one more step: its load, a step and a save
    resume_cmd = [a for a in fw_cmd if a != "--overwrite"] + ["--resume", "--set", f"train.num_steps={args.steps + 1}"]

    print(f"work dir: {work}")
    print(f"hand-written: {' '.join(hand_cmd)}  (glibc malloc: {args.handwritten_malloc}; input: {args.handwritten_input})")
    print(f"framework:    {' '.join(fw_cmd)}")
    print(
        f"{args.rounds} round(s), {args.steps} steps of {args.batch_size} rows per rank on {nproc} process(es); "
        "samples/s = batch_size * world_size * steps / training time (pipeline creation, DataLoader start and "
        "pipeline fill included; process start, set-up, checkpoint and evaluation excluded)"
        + (f"; only the steps after step {args.warmup_steps} are timed" if args.warmup_steps else "") + "\n",
        flush=True,
    )

    rows, records = [], []
    for i in range(args.rounds):
        order = ["hand-written", "framework"] if i % 2 == 0 else ["framework", "hand-written"]
        result: dict[str, tuple[float, Measured]] = {}
        for who in order:
            if who == "hand-written":
                match, measured = run(hand_cmd, work / f"round{i + 1}_handwritten.log", HANDWRITTEN_RE, "hand-written run",
                                      hand_env, limit)
                timed = args.steps - args.warmup_steps
                if int(match.group(2)) != timed or int(match.group(3)) != nproc:
                    raise SystemExit(f"hand-written run reported {match.group(0)!r}; expected {timed} timed steps on {nproc} rank(s)")
                result[who] = (float(match.group(1)), measured)
            else:
                match, measured = run(fw_cmd, work / f"round{i + 1}_framework.log", FRAMEWORK_RE, "tzrec-run train",
                                      limit_bytes=limit)
                if int(match.group(1)) != args.steps:
                    raise SystemExit(f"tzrec-run reported {match.group(0)!r}; expected {args.steps} steps")
                rate = float(match.group(3).replace(",", ""))
                if args.warmup_steps:
                    rate = rate_after(work / "framework_model" / "metrics.jsonl", args.warmup_steps,
                                      args.batch_size * nproc)
                result[who] = (rate, measured)
                if args.resume:
                    _, resumed = run(resume_cmd, work / f"round{i + 1}_resume.log", FRAMEWORK_RE, "tzrec-run train --resume",
                                     limit_bytes=limit)
                    result["framework resume"] = (0.0, resumed)
        hand, fw = result["hand-written"][0], result["framework"][0]
        rows.append((hand, fw, fw / hand))
        names = {"handwritten": "hand-written", "framework": "framework", "framework_resume": "framework resume"}
        records.append({key: {"samples_per_s": rate, "wall_s": m.wall, "max_rss_bytes": m.max_rss,
                              "peak_pss_bytes": m.peak_tree_pss}
                        for key, (rate, m) in ((k, result[who]) for k, who in names.items() if who in result)})
        print(f"round {i + 1}/{args.rounds} (order: {' then '.join(order)})")
        print(f"  {'':14}{'samples/s':>12}{'process wall s':>16}{'peak PSS GiB':>14}")
        for who in ("hand-written", "framework", "framework resume"):
            if who in result:
                rate, m = result[who]
                print(f"  {who:14}{rate:>12,.0f}{m.wall:>16.1f}{m.peak_tree_pss / 2**30:>14.2f}")
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
        f"cardinalities={args.cardinalities} framework_set={','.join(args.framework_set) or '-'} "
        f"warmup_steps={args.warmup_steps}"
    )
    if args.json is not None:
        write_json(args.json, args, nproc, table_rows, records)
    if args.keep:
        print(f"logs and configs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
