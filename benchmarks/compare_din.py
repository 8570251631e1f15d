#!/usr/bin/env python
"""Throughput of ``tzrec-run train examples/din_taobao.toml`` (reading Parquet) against the
hand-written TorchRec loop of ``benchmarks/handwritten_din.py`` (the same model, with its
``EmbeddingCollection``, fed batches built in memory before its clock starts), on the same data,
in one process each, interleaved over several rounds.

Both run with the same glibc allocator settings: tzrec-run applies ``train.tune_malloc`` (the
default) with ``mallopt``; the hand-written loop gets the same values through glibc's
``MALLOC_*_`` variables. Each reports samples/s over its training steps (pipeline creation and
fill included; process start, set-up, checkpoint and evaluation excluded; see
``compare_deepfm.py``). The ratio is framework / hand-written per round (goal >= 0.95): it
includes everything tzrec-run's input costs (reading Parquet, building the id and sequence
batches), which the hand-written loop does not pay.

    python benchmarks/compare_din.py                          # 100k rows, 40 steps, 3 rounds
    python benchmarks/compare_din.py --rounds 1 --steps 20 --rows 30000 --batch-size 1024

The data is generated with ``tzrec-run data synth taobao`` unless ``--data`` already holds a
``synth.json``. Run it on an otherwise idle machine: timings under CPU contention mean nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_deepfm import FRAMEWORK_RE, HANDWRITTEN_RE, busy_fraction, run, spread, tzrec_run  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "din_taobao.toml"
HANDWRITTEN = REPO / "benchmarks" / "handwritten_din.py"
TARGET = 0.95


def ensure_data(data: Path, rows: int) -> None:
    """Make the synthetic Taobao data unless ``data`` has it."""
    report = data / "synth.json"
    if report.exists():
        have = json.loads(report.read_text()).get("train_rows")
        note = "" if have == rows else f" (it has {have} train rows, not --rows {rows}; delete it or pass another --data)"
        print(f"data: using {data}{note}")
        return
    print(f"data: generating {rows} rows into {data} ...", flush=True)
    subprocess.run([*tzrec_run(), "data", "synth", "taobao", "--rows", str(rows), "--out", str(data)], check=True)


def framework_config(work: Path) -> Path:
    """The example with ``num_epochs = 1`` replaced by ``num_steps = 1`` (set again by --set;
    the config needs exactly one of the two and a --set cannot delete a key)."""
    text, n = re.subn(r"(?m)^num_epochs\s*=\s*1\s*$", "num_steps = 1", EXAMPLE.read_text())
    if n != 1:
        raise SystemExit(f"{EXAMPLE}: expected one 'num_epochs = 1' line; update {__file__}")
    path = work / "din_taobao_bench.toml"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="train rows to generate (default 100000)")
    parser.add_argument("--batch-size", type=int, default=2048, help="rows per step (default 2048)")
    parser.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/tzrun_bench_taobao"), help="data directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, config, model dir)")
    parser.add_argument("--framework-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra --set for tzrec-run train (repeatable)")
    args = parser.parse_args()

    from tzrun.runner.allocator import MALLOPT_SETTINGS

    data = args.data.resolve()
    ensure_data(data, args.rows)
    busy = busy_fraction()
    if busy is not None and busy > 0.2:
        print(f"WARNING: {busy:.0%} of the CPU(s) busy before starting; the timings will be skewed")
    work = Path(tempfile.mkdtemp(prefix="tzrun_bench_din_"))
    config = framework_config(work)
    hand_cmd = [sys.executable, str(HANDWRITTEN), "--data", str(data / "train"), "--batch-size", str(args.batch_size),
                "--steps", str(args.steps)]
    hand_env = {variable: str(value) for _, _, value, variable in MALLOPT_SETTINGS}
    fw_cmd = [
        *tzrec_run(), "train", str(config),
        "--set", f"data.train_input={json.dumps(str(data / 'train'))}",
        "--set", f"data.eval_input={json.dumps(str(data / 'eval'))}",
        "--set", "eval.num_steps=1",
        "--set", f"data.batch_size={args.batch_size}",
        "--set", f"train.num_steps={args.steps}",
        "--set", "train.tune_malloc=true",
        "--model-dir", str(work / "framework_model"), "--overwrite",
    ]
    for extra in args.framework_set:
        fw_cmd += ["--set", extra]
    print(f"work dir: {work}")
    print(f"hand-written: {' '.join(hand_cmd)}  (in-memory batches; {' '.join(f'{k}={v}' for k, v in hand_env.items())})")
    print(f"framework:    {' '.join(fw_cmd)}")
    print(f"{args.rounds} round(s), {args.steps} steps of {args.batch_size} rows, 1 process\n", flush=True)

    rows = []
    for i in range(args.rounds):
        order = ["hand-written", "framework"] if i % 2 == 0 else ["framework", "hand-written"]
        result: dict[str, tuple[float, float]] = {}
        for who in order:
            if who == "hand-written":
                match, measured = run(hand_cmd, work / f"round{i + 1}_handwritten.log", HANDWRITTEN_RE, "hand-written run", hand_env)
                result[who] = (float(match.group(1)), measured.wall)
            else:
                match, measured = run(fw_cmd, work / f"round{i + 1}_framework.log", FRAMEWORK_RE, "tzrec-run train")
                if int(match.group(1)) != args.steps:
                    raise SystemExit(f"tzrec-run reported {match.group(0)!r}; expected {args.steps} steps")
                result[who] = (float(match.group(3).replace(",", "")), measured.wall)
        hand, fw = result["hand-written"][0], result["framework"][0]
        rows.append((hand, fw, fw / hand))
        print(f"round {i + 1}/{args.rounds} (order: {' then '.join(order)})")
        for who in ("hand-written", "framework"):
            print(f"  {who:14}{result[who][0]:>12,.0f} samples/s{result[who][1]:>10.1f} s wall")
        print(f"  ratio framework / hand-written: {fw / hand:.3f}\n", flush=True)

    hands, fws, ratios = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    print(f"summary over {len(rows)} round(s), {args.steps} steps x {args.batch_size} rows, 1 process:")
    print(f"  hand-written samples/s   {spread(hands, ',.0f')}")
    print(f"  framework samples/s      {spread(fws, ',.0f')}")
    print(f"  ratio (per round)        {spread(ratios, '.3f')}   goal >= {TARGET}")
    print(f"SUMMARY handwritten_median={statistics.median(hands):.1f} framework_median={statistics.median(fws):.1f} "
          f"ratio_median={statistics.median(ratios):.4f} rounds={len(rows)} steps={args.steps} batch_size={args.batch_size} "
          f"framework_set={','.join(args.framework_set) or '-'}")
    if args.keep:
        print(f"logs and configs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
