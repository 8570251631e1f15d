#!/usr/bin/env python
"""Issue 38, scoring: ``tzrec-run predict`` (from a checkpoint and from an export) against
``tzrec-run evaluate``'s loop and a hand-written batched inference loop, on the same rows.
Goal: predict scores at least 0.9x as many rows per second as each of the two.

Set-up (once): the synthetic Criteo data (``--rows``, default 4,000,000 train rows), a
checkpoint of ``examples/deepfm_criteo.toml`` trained ``--steps`` steps on it, and its export.
Then ``--rounds`` rounds, each running, one after the other (interleaved, so that a change in
the machine's speed touches every contender alike):

* ``evaluate --checkpoint latest --json`` over the train rows: its ``seconds`` (the pass, exact
  AUC at its end included, the restore not) and its whole command;
* ``predict --checkpoint latest`` and ``predict --export DIR`` over the same rows into Parquet:
  the rows/s they print (reading, scoring and writing; the restore or the export's opening is
  printed apart) and the whole command;
* ``benchmarks/handwritten_predict.py`` (no tzrec-run code): its steady rows/s and the whole
  command.

Every contender reads with its batch size ``--batch-size`` (``data.eval_batch_size``) on one
process. Outside the loop is everything else of the whole command (the interpreter, imports,
the restore or the export's opening, start-up of the reader, exit). Prints each round, then
the medians and the ratios of the loops' rows/s; ``--out`` writes them as JSON.

    python benchmarks/predict_speed.py --data /tmp/predict_bench --rounds 3
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_deepfm import ensure_data, framework_config, train_args, tzrec_run  # noqa: E402

HERE = Path(__file__).resolve().parent
TARGET = 0.9
PREDICTED = re.compile(r"predicted (\d+) rows with .* in ([\d.]+) s \(([\d,]+) rows/s; .* took ([\d.]+) s before\)")


def timed(command: list[str]) -> tuple[str, float]:
    """Run ``command``; its standard output and wall seconds (it must succeed)."""
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/tmp/predict_bench"))
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    data = args.data.resolve()
    ensure_data(data, args.rows)
    rows_in = str(data / "train")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = framework_config(work, args.steps)
        model_dir = work / "run"
        sets = [f"data.eval_batch_size={args.batch_size}"]
        timed([*tzrec_run(), *train_args(config, data, model_dir, *sets)])
        common = ["--model-dir", str(model_dir), "--set", f"data.eval_batch_size={args.batch_size}"]
        timed([*tzrec_run(), "export", str(config), *common, "--out", str(work / "export")])
        contenders = {
            "evaluate": [*tzrec_run(), "evaluate", str(config), *common, "--checkpoint", "latest", "--json",
                         "--set", f"data.eval_input={json.dumps(rows_in)}"],
            "predict --checkpoint": [*tzrec_run(), "predict", str(config), *common, "--checkpoint", "latest",
                                     "--input", rows_in, "--output", str(work / "ckpt.parquet"), "--overwrite"],
            "predict --export": [*tzrec_run(), "predict", str(config), "--set", f"data.eval_batch_size={args.batch_size}",
                                 "--export", str(work / "export"), "--input", rows_in,
                                 "--output", str(work / "export.parquet"), "--overwrite"],
            "hand-written": [sys.executable, str(HERE / "handwritten_predict.py"), "--data", rows_in,
                             "--batch-size", str(args.batch_size), "--output", str(work / "hand.parquet")],
        }
        results: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        for r in range(args.rounds):
            for name, command in contenders.items():
                out, wall = timed(command)
                got = measured(name, out)
                got.update(wall_s=wall, rows_per_s=got["rows"] / got["loop_s"], start_s=wall - got["loop_s"])
                results[name].append(got)
                print(f"round {r + 1} {name}: {got['rows_per_s']:,.0f} rows/s over {got['rows']:,.0f} rows; whole "
                      f"command {wall:.1f} s, of which {got['start_s']:.1f} s outside the loop", flush=True)
    summary = {name: {key: statistics.median(x[key] for x in runs) for key in runs[0]} for name, runs in results.items()}
    print()
    for name, s in summary.items():
        opened = f" (the restore or the export's opening {s['opened_s']:.1f} s of it)" if "opened_s" in s else ""
        print(f"{name:22s} median {s['rows_per_s']:>9,.0f} rows/s in the loop; whole command {s['wall_s']:.1f} s "
              f"({s['rows'] / s['wall_s']:,.0f} rows/s), {s['start_s']:.1f} s outside the loop{opened}")
    ok = True
    for scorer in ("predict --checkpoint", "predict --export"):
        for base in ("evaluate", "hand-written"):
            ratio = summary[scorer]["rows_per_s"] / summary[base]["rows_per_s"]
            ok &= ratio >= TARGET
            print(f"{scorer} / {base}: {ratio:.2f}x (target >= {TARGET}x)")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rounds": results,
                                        "medians": summary}, indent=2))
    print("PASS" if ok else "FAIL")


def measured(name: str, out: str) -> dict[str, float]:
    """Rows and the seconds of the loop (reading, scoring and writing; evaluate: its pass and
    metrics) from a contender's output."""
    if name == "evaluate":
        result = json.loads(out)
        return {"rows": float(result["rows"]), "loop_s": float(result["seconds"])}
    if name == "hand-written":
        fields = dict(kv.split("=") for kv in out.strip().splitlines()[-1].split()[1:])
        return {"rows": float(fields["rows"]), "loop_s": float(fields["loop_s"])}
    said = PREDICTED.search(out)
    if said is None:
        raise SystemExit(f"{name}: no 'predicted ...' line in:\n{out[-2000:]}")
    rows = float(said[1])
    return {"rows": rows, "loop_s": rows / float(said[3].replace(",", "")), "opened_s": float(said[4])}


if __name__ == "__main__":
    main()
