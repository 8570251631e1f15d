#!/usr/bin/env python
"""Scaling curves (issue 29): samples/s and peak RSS of ``tzrec-run train`` and of the hand-written
loop against total table rows, batch size and ranks, and checkpoint save/load against size.

Each point is one subprocess of an existing benchmark, whose ``--json`` result is collected:

* ``rows``, ``batch``, ``ranks``: ``compare_deepfm.py --cardinalities kaggle --handwritten-input
  memory --handwritten-malloc tuned`` (fresh processes, interleaved rounds; tzrec-run reads Parquet,
  the hand-written loop trains on batches built in memory), the tables scaled to each total with
  ``--table-rows-total`` (``kaggle``: the Kaggle cardinalities capped at 1M, 5.57M rows, as the
  earlier figures). A point shared by several sweeps (kaggle tables, batch 8192, 1 rank) runs once.
  The rows sweep's points also resume each tzrec-run run for one more step (``--resume``: the
  checkpoint's load, a step and a save) and record that process's peak (``framework_resume``).
* ``checkpoint``: ``checkpoint_speed.py --size-mb N`` (save and load against ``dd`` in the same run).

Results go to ``OUT/scaling.json`` (merged into what is there, written after every point) and the
PNGs ``OUT/scaling_{rows,batch,ranks,checkpoint}.png``; ``--plot-only`` redraws them from the JSON.
A point whose estimated memory (tables + row-wise Adagrad state, twice over for set-up and the
framework's final checkpoint, plus 1.5 GiB per process) passes 90% of the memory available is
skipped with a line saying so; a job that passes it anyway is killed by ``compare_deepfm.py``.

    python benchmarks/scaling.py --rounds 2                      # every sweep, default sizes
    python benchmarks/scaling.py --sweep batch --batches 1024,4096 --rounds 1
    python benchmarks/scaling.py --plot-only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_deepfm import REPO, busy_fraction, memory_limit  # noqa: E402

SWEEPS = ("rows", "batch", "ranks", "checkpoint")
BYTES_PER_ROW = (16 + 4) * 4 + 2 * 4  # deep + wide float32 rows, one row-wise Adagrad float each
GIB = 2**30


def count(text: str) -> int:
    """``100M``, ``30m``, ``50k`` or ``400000`` as an int."""
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1:].lower(), 1)
    return round(float(text[:-1] if scale > 1 else text) * scale)


def table_total(point: str) -> int:
    """Table rows in all of a rows-sweep point (``kaggle`` or a count)."""
    from tzrun_tools.synth import kaggle_cardinalities

    return sum(kaggle_cardinalities()) if point == "kaggle" else count(point)


def steps_for(args: argparse.Namespace, batch: int) -> int:
    return args.steps or max(args.min_steps, math.ceil(args.samples / batch))


def estimate_bytes(total_rows: int, batch: int, steps: int, nproc: int) -> int:
    """What one loop of a point is expected to hold at its peak, all processes together."""
    in_memory_batches = batch * steps * nproc * 300  # the hand-written loop's prebuilt batches
    return 2 * total_rows * BYTES_PER_ROW + int(1.5 * GIB) * nproc + in_memory_batches


def point_key(rows: str, batch: int, nproc: int, steps: int, data_rows: int) -> str:
    return f"rows={rows} batch={batch} nproc={nproc} steps={steps} data_rows={data_rows}"


class Driver:
    """Runs the points of the chosen sweeps, each once, and keeps the results file current."""

    def __init__(self, args: argparse.Namespace, results: dict[str, Any]) -> None:
        self.args, self.results = args, results
        self.limit = memory_limit(args.memory_limit_gb)
        self.done: set[str] = set()
        self.seconds: list[float] = []  # wall seconds per run of one loop
        self.left = 0  # loop runs still to do

    def save(self) -> None:
        path = self.args.out / "scaling.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.results, indent=1) + "\n")

    def eta(self) -> str:
        if not self.seconds:
            return ""
        per_run = sum(self.seconds) / len(self.seconds)
        return f"; {per_run:.0f} s per loop run so far, about {self.left * per_run / 60:.1f} min left for the training points"

    def train_point(self, rows: str, batch: int, nproc: int) -> str:
        """Measure (or reuse) one training point; returns its key."""
        args = self.args
        steps = steps_for(args, batch)
        key = point_key(rows, batch, nproc, steps, args.data_rows)
        if key in self.done:
            print(f"point {key}: measured already in this run", flush=True)
            return key
        self.done.add(key)
        total = table_total(rows)
        point: dict[str, Any] = {"table_rows": rows, "table_rows_total": total, "batch_size": batch,
                                 "nproc": nproc, "steps": steps, "data_rows": args.data_rows, "rounds": args.rounds}
        need = estimate_bytes(total, batch, steps, nproc)
        self.left -= 2 * args.rounds
        if self.limit is not None and need > self.limit:
            point["skipped"] = (f"estimated {need / GIB:.1f} GiB per loop (tables + optimizer state x2, "
                                f"processes, batches), over the limit of {self.limit / GIB:.1f} GiB")
            print(f"point {key}: SKIPPED, {point['skipped']}", flush=True)
        else:
            point.update(self.run_compare(rows, batch, nproc, steps, key, need))
        self.results.setdefault("points", {})[key] = point
        self.save()
        return key

    def run_compare(self, rows: str, batch: int, nproc: int, steps: int, key: str, need: int) -> dict[str, Any]:
        args = self.args
        data = args.data_root / f"kaggle_{rows}_{args.data_rows}"
        out = Path(tempfile.mkdtemp(prefix="tzrun_scaling_")) / "point.json"
        command = [sys.executable, str(REPO / "benchmarks" / "compare_deepfm.py"), "--cardinalities", "kaggle",
                   "--handwritten-input", "memory", "--handwritten-malloc", "tuned", "--data", str(data),
                   "--rows", str(args.data_rows), "--batch-size", str(batch), "--steps", str(steps),
                   "--rounds", str(args.rounds), "--nproc-per-node", str(nproc), "--json", str(out)]
        if rows != "kaggle":
            command += ["--table-rows-total", str(table_total(rows))]
        if nproc == 1 and batch == args.rows_batch:  # the rows sweep's points: a resume's peak as well
            command.append("--resume")
        if self.limit is not None:
            command += ["--memory-limit-gb", f"{self.limit / GIB:.2f}"]
        print(f"point {key}: estimated peak {need / GIB:.1f} GiB per loop\n  $ {' '.join(command)}", flush=True)
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.perf_counter() - started
        summary = [line for line in proc.stdout.splitlines() if line.startswith(("data:", "SUMMARY", "WARNING"))]
        if proc.returncode or not out.exists():
            tail = "\n    ".join(proc.stdout.splitlines()[-12:])
            print(f"  FAILED (exit {proc.returncode}) after {wall:.0f} s:\n    {tail}", flush=True)
            return {"failed": proc.stdout.splitlines()[-12:], "wall_s": wall}
        result = json.loads(out.read_text())
        out.unlink()
        out.parent.rmdir()
        runs = [loop["wall_s"] for r in result["rounds"] for loop in r.values()]
        self.seconds += runs
        med = result["median"]
        print(f"  {'; '.join(summary)}\n  done in {wall:.0f} s: hand-written {med['handwritten']['samples_per_s']:,.0f}, "
              f"tzrec-run {med['framework']['samples_per_s']:,.0f} samples/s, ratio {result['ratio']['median']:.3f}; "
              f"peak PSS {med['handwritten']['peak_pss_bytes'] / GIB:.2f} / "
              f"{med['framework']['peak_pss_bytes'] / GIB:.2f} GiB"
              + (f", resumed {med['framework_resume']['peak_pss_bytes'] / GIB:.2f} GiB" if "framework_resume" in med else "")
              + self.eta(), flush=True)
        return {"result": result, "wall_s": wall}

    def checkpoint_point(self, size_mb: int) -> None:
        args = self.args
        need = 3 * size_mb * 2**20 + int(1.5 * GIB)  # saved state, load target, async copy
        entry: dict[str, Any] = {"size_mb": size_mb, "rounds": args.checkpoint_rounds}
        if self.limit is not None and need > self.limit:
            entry["skipped"] = f"estimated {need / GIB:.1f} GiB, over the limit of {self.limit / GIB:.1f} GiB"
            print(f"checkpoint {size_mb} MB: SKIPPED, {entry['skipped']}", flush=True)
        else:
            out = Path(tempfile.mkdtemp(prefix="tzrun_scaling_")) / "checkpoint.json"
            command = [sys.executable, str(REPO / "benchmarks" / "checkpoint_speed.py"), "--size-mb", str(size_mb),
                       "--rounds", str(args.checkpoint_rounds), "--dir", str(args.checkpoint_dir), "--json", str(out)]
            print(f"checkpoint {size_mb} MB:\n  $ {' '.join(command)}", flush=True)
            started = time.perf_counter()
            proc = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            entry["wall_s"] = time.perf_counter() - started
            if proc.returncode or not out.exists():
                entry["failed"] = proc.stdout.splitlines()[-12:]
                print("  FAILED:\n    " + "\n    ".join(entry["failed"]), flush=True)
            else:
                entry["result"] = json.loads(out.read_text())
                out.unlink()
                out.parent.rmdir()
                print("  " + "\n  ".join(proc.stdout.splitlines()[-9:]) + f"\n  done in {entry['wall_s']:.0f} s", flush=True)
        self.results.setdefault("checkpoint", {})[str(size_mb)] = entry
        self.save()

    def run(self) -> None:
        args = self.args
        plan: dict[str, list[tuple[str, int, int]]] = {
            "rows": [(rows, args.rows_batch, 1) for rows in args.table_rows],
            "batch": [(args.base_table_rows, batch, 1) for batch in args.batches],
            "ranks": [(args.base_table_rows, args.ranks_batch, nproc) for nproc in (1, 2)],
        }
        chosen = {name: points for name, points in plan.items() if name in args.sweep}
        unique = {point_key(r, b, n, steps_for(args, b), args.data_rows) for points in chosen.values() for r, b, n in points}
        self.left = 2 * args.rounds * len(unique)
        print(f"{len(unique)} training point(s) x {args.rounds} round(s) x 2 loops"
              + (f", {len(args.checkpoint_sizes)} checkpoint size(s)" if "checkpoint" in args.sweep else "")
              + (f"; memory limit {self.limit / GIB:.1f} GiB" if self.limit else ""), flush=True)
        self.results.setdefault("sweeps", {})
        for name, points in chosen.items():
            print(f"\n== sweep {name}", flush=True)
            self.results["sweeps"][name] = [self.train_point(*point) for point in points]
            self.save()
        if "checkpoint" in args.sweep:
            print("\n== sweep checkpoint", flush=True)
            self.results["sweeps"]["checkpoint"] = [str(size) for size in args.checkpoint_sizes]
            for size in args.checkpoint_sizes:
                self.checkpoint_point(size)


# ----------------------------------------------------------------------------- plots


def human(n: float) -> str:
    """``5.57M``, ``50k``, ``8192``: a tick label."""
    if n >= 10**6:
        return f"{n / 10**6:.3g}M"
    return f"{n / 10**3:.3g}k" if n >= 10**5 else str(int(n))


def _errorbar(ax: Any, xs: list[float], values: list[list[float]], label: str, marker: str, **style: Any) -> None:
    """Medians with their min-max range."""
    medians = [statistics.median(v) for v in values]  # an even count's mean of the middle two, not the upper one
    low = [m - min(v) for m, v in zip(medians, values)]
    high = [max(v) - m for m, v in zip(medians, values)]
    ax.errorbar(xs, medians, yerr=[low, high], marker=marker, capsize=3, label=label, **style)


def plot_training(results: dict[str, Any], sweep: str, out: Path) -> Path | None:
    """``scaling_<sweep>.png``: samples/s of both loops, their ratio, and the peak memory of each."""
    import matplotlib.pyplot as plt

    points = [results["points"][key] for key in results.get("sweeps", {}).get(sweep, [])
              if key in results.get("points", {}) and "result" in results["points"][key]]
    if not points:
        return None
    field = {"rows": "table_rows_total", "batch": "batch_size", "ranks": "nproc"}[sweep]
    points.sort(key=lambda p: p[field])
    xs = [p[field] for p in points]
    rounds = [p["result"]["rounds"] for p in points]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for loop, label, marker, color in (("handwritten", "hand-written (in memory)", "o", "C0"),
                                       ("framework", "tzrec-run (Parquet)", "s", "C1")):
        _errorbar(axes[0], xs, [[r[loop]["samples_per_s"] for r in rs] for rs in rounds], label, marker, color=color)
        _errorbar(axes[2], xs, [[r[loop]["peak_pss_bytes"] / GIB for r in rs] for rs in rounds], f"{label}, PSS of all",
                  marker, color=color)
        _errorbar(axes[2], xs, [[r[loop]["max_rss_bytes"] / GIB for r in rs] for rs in rounds],
                  f"{label}, largest process (RSS)", marker, color=color, linestyle="--", alpha=0.6)
    if all("framework_resume" in r for rs in rounds for r in rs):  # the rows sweep: a resume's load, step and save
        _errorbar(axes[2], xs, [[r["framework_resume"]["peak_pss_bytes"] / GIB for r in rs] for rs in rounds],
                  "tzrec-run --resume (load, a step, save), PSS of all", "^", color="C2")
    _errorbar(axes[1], xs, [[r["framework"]["samples_per_s"] / r["handwritten"]["samples_per_s"] for r in rs]
                            for rs in rounds], "tzrec-run / hand-written", "D")
    axes[1].axhline(1.0, color="grey", linewidth=0.8)
    xlabel = {"rows": "table rows in all", "batch": "batch size per rank", "ranks": "ranks (processes)"}[sweep]
    for ax, title in zip(axes, ("samples/s", "ratio tzrec-run / hand-written", "peak memory (GiB)")):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if sweep != "ranks":
            ax.set_xscale("log", base=2 if sweep == "batch" else 10)
        ax.set_xticks(xs, [human(x) for x in xs])
        ax.minorticks_off()
    p = points[0]
    fig.suptitle(f"DeepFM, Kaggle-shaped tables; {p['rounds']} round(s) per point, medians and min-max; "
                 f"steps {', '.join(str(q['steps']) for q in points)}; data {p['data_rows']:,} rows; "
                 f"batch {', '.join(str(q['batch_size']) for q in points) if sweep != 'batch' else 'as shown'}",
                 fontsize=9)
    fig.tight_layout()
    path = out / f"scaling_{sweep}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_checkpoint(results: dict[str, Any], out: Path) -> Path | None:
    """``scaling_checkpoint.png``: seconds, MB/s and x disk of saves and loads against size."""
    import matplotlib.pyplot as plt

    entries = [results["checkpoint"][size] for size in results.get("sweeps", {}).get("checkpoint", [])
               if "result" in results.get("checkpoint", {}).get(size, {})]
    if not entries:
        return None
    entries.sort(key=lambda e: e["result"]["state_mb"])
    xs = [e["result"]["state_mb"] for e in entries]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = ["dd write", "dd read", "save", "async save, blocking", "async save, total", "load"]
    for name in names:
        ops = [e["result"]["operations"].get(name) for e in entries]
        if any(op is None for op in ops):
            continue
        style = "--" if name.startswith("dd") else "-"
        axes[0].plot(xs, [op["seconds"] for op in ops], style, marker="o", label=name)
        axes[1].plot(xs, [op["mb_per_s"] for op in ops], style, marker="o", label=name)
        if not name.startswith("dd"):
            axes[2].plot(xs, [op["x_disk"] for op in ops], marker="o", label=name)
    axes[2].axhline(0.5, color="grey", linewidth=0.8, label="goal: half the disk")
    for ax, title in zip(axes, ("seconds", "MB/s", "x the disk (dd) in the same run")):
        ax.set_title(title)
        ax.set_xlabel("checkpoint state (MB)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [f"{x:,.0f}" for x in xs])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"checkpoint_speed.py, {entries[0]['rounds']} round(s) per size, medians; directory "
                 f"{entries[0]['result']['dir']}", fontsize=9)
    fig.tight_layout()
    path = out / "scaling_checkpoint.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_all(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    drawn = [plot_training(results, sweep, out) for sweep in ("rows", "batch", "ranks")]
    return [p for p in [*drawn, plot_checkpoint(results, out)] if p is not None]


# ----------------------------------------------------------------------------- main


def csv(kind: Any) -> Any:
    return lambda text: [kind(item) for item in text.split(",") if item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", type=csv(str), default=list(SWEEPS), help="sweeps to run (default: rows,batch,ranks,checkpoint)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per training point (default 2)")
    parser.add_argument("--samples", type=count, default=40 * 8192,
                        help="rows per rank each training run trains on: steps = samples / batch (default 327680)")
    parser.add_argument("--min-steps", type=int, default=20, help="at least this many steps per run (default 20)")
    parser.add_argument("--steps", type=int, default=None, help="the same number of steps at every point (overrides --samples)")
    parser.add_argument("--table-rows", type=csv(str), default=["kaggle", "30M", "100M"],
                        help="rows sweep: tables' rows in all (kaggle = the Kaggle cardinalities capped at 1M, 5.57M)")
    parser.add_argument("--base-table-rows", default="kaggle", help="batch and ranks sweeps: tables' rows in all (default kaggle)")
    parser.add_argument("--rows-batch", type=int, default=8192, help="rows sweep: batch size (default 8192)")
    parser.add_argument("--batches", type=csv(int), default=[1024, 4096, 8192, 16384, 32768], help="batch sweep: sizes")
    parser.add_argument("--ranks-batch", type=int, default=8192, help="ranks sweep: batch size per rank (default 8192)")
    parser.add_argument("--data-rows", type=count, default=400_000, help="Parquet rows generated per table size (default 400k)")
    parser.add_argument("--data-root", type=Path, default=Path("/tmp/tzrun_scaling"), help="where the data sets are kept")
    parser.add_argument("--checkpoint-sizes", type=csv(int), default=[256, 1024, 4096], help="checkpoint sweep: MB")
    parser.add_argument("--checkpoint-rounds", type=int, default=2, help="checkpoint sweep: rounds per size (default 2)")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("/tmp"), help="checkpoint sweep: a directory on the disk to measure")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="skip (and kill) points above this (default: 90%% of the memory available at start)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="results directory")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNGs from OUT/scaling.json")
    args = parser.parse_args()
    unknown = set(args.sweep) - set(SWEEPS)
    if unknown:
        parser.error(f"--sweep: unknown {', '.join(sorted(unknown))} (choose from {', '.join(SWEEPS)})")

    path = args.out / "scaling.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.plot_only:
        busy = busy_fraction()
        if busy is not None and busy > 0.2:
            print(f"WARNING: {busy:.0%} of the {os.cpu_count()} CPU(s) busy before starting; the timings will be skewed")
        started = time.perf_counter()
        Driver(args, results).run()
        print(f"\nall sweeps done in {(time.perf_counter() - started) / 60:.1f} min; results in {path}")
    elif not path.exists():
        raise SystemExit(f"{path}: no results to plot; run the sweeps first")
    for png in plot_all(results, args.out):
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
