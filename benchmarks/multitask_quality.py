#!/usr/bin/env python
"""AUC per task of the multi-task examples (mmoe, dbmtl, ple) against the Bayes AUC of the data.

Synthesises Taobao-shaped data with ``tzrec-run data synth taobao`` (labels ``click`` and ``buy``,
``buy`` drawn only where ``click`` is 1; ``synth.json`` holds each label's Bayes AUC on the eval
split: the AUC of its true probability, the ceiling of any model), trains
``examples/mmoe_taobao.toml``, ``dbmtl_taobao.toml`` and ``ple_taobao.toml`` on it as they are
(one process, CPU; only the data paths, the model directory and, with ``--epochs``, the number of
epochs are set), and prints per model and task the eval AUC, the task's Bayes AUC and the gap.

Everything runs in this one Python process through ``tzrec-run``'s entry function; the runs are
deterministic (the same command gives the same numbers on the same machine).

    python benchmarks/multitask_quality.py                      # 300k rows, 1 epoch: 8 min on 2 busy cores
    python benchmarks/multitask_quality.py --rows 20000 --models mmoe   # a quick look

The data is generated unless ``--data`` already holds a ``synth.json`` for the same rows and seed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS: tuple[str, ...] = ("mmoe", "dbmtl", "ple")


@dataclass(frozen=True)
class TaskQuality:
    """One task of one trained model against its label's Bayes AUC."""

    model: str
    task: str
    label: str
    auc: float
    bayes_auc: float

    @property
    def gap(self) -> float:
        """How far the model's eval AUC is below the Bayes AUC."""
        return self.bayes_auc - self.auc


def tzrec_run(argv: list[str]) -> None:
    """Run ``tzrec-run argv`` in this process; exit with its message when it fails."""
    from tzrun.cli.main import main

    code = main(argv)
    if code != 0:
        raise SystemExit(f"tzrec-run {' '.join(argv)}: exit code {code}")


def ensure_data(data: Path, rows: int, seed: int) -> dict[str, float]:
    """Synthesise the Taobao data into ``data`` unless it is there; return its Bayes AUC per label."""
    report = data / "synth.json"
    if report.exists():
        have = json.loads(report.read_text())
        if have.get("train_rows") == rows and have.get("seed") == seed:
            print(f"data: using {data}")
            return dict(have["bayes_auc"])
        raise SystemExit(f"{data}: holds {have.get('train_rows')} train rows of seed {have.get('seed')}, "
                         f"not --rows {rows} --seed {seed}; delete it or pass another --data")
    start = time.perf_counter()
    tzrec_run(["data", "synth", "taobao", "--rows", str(rows), "--seed", str(seed), "--out", str(data)])
    print(f"data: synthesised in {time.perf_counter() - start:.0f} s", flush=True)
    return dict(json.loads(report.read_text())["bayes_auc"])


def example(model: str) -> Path:
    """The example config of ``model``."""
    return REPO / "examples" / f"{model}_taobao.toml"


def train_example(model: str, data: Path, model_dir: Path, epochs: int) -> dict[str, float]:
    """Train ``examples/<model>_taobao.toml`` on ``data``; return its final evaluation's metrics."""
    tzrec_run([
        "train", str(example(model)),
        "--set", f"data.train_input={json.dumps(str(data / 'train'))}",
        "--set", f"data.eval_input={json.dumps(str(data / 'eval'))}",
        "--set", f"train.num_epochs={epochs}",
        "--model-dir", str(model_dir), "--overwrite",
    ])
    lines = (model_dir / "eval_results.jsonl").read_text().splitlines()
    return dict(json.loads(lines[-1]))


def task_qualities(model: str, metrics: dict[str, float], bayes: dict[str, float]) -> list[TaskQuality]:
    """Each ``auc`` metric of the example (one per task, ``<task>_auc``) beside its label's Bayes AUC."""
    config = tomllib.loads(example(model).read_text())
    aucs = [(m["name"], m["label"]) for m in config.get("metrics", []) if m.get("type") == "auc"]
    unknown = [label for _, label in aucs if label not in bayes]
    if not aucs or unknown:
        raise SystemExit(f"{example(model)}: [[metrics]] needs an auc metric per task on a label of the synthetic "
                         f"data ({', '.join(sorted(bayes))}); found {aucs}")
    return [TaskQuality(model, name.removesuffix("_auc"), label, float(metrics[name]), float(bayes[label]))
            for name, label in aucs]


def print_table(rows: list[TaskQuality]) -> None:
    """A Markdown table: one row per model and task."""
    print("| model | task (label) | eval AUC | Bayes AUC | gap |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| `{row.model}_taobao` | {row.task} ({row.label}) | {row.auc:.4f} | {row.bayes_auc:.4f} | {row.gap:.4f} |")


def print_sizes(rows: int, seed: int, epochs: int, models: list[str]) -> None:
    """The data's size and each model's number of steps (from its ``data.batch_size``)."""
    steps = []
    for model in models:
        batch_size = int(tomllib.loads(example(model).read_text())["data"]["batch_size"])
        steps.append(f"{model} {epochs * -(-rows // batch_size)} steps of {batch_size} rows")
    print(f"sizes: {rows} train rows, {max(rows // 10, 1000)} eval rows (seed {seed}); {epochs} epoch(s): "
          f"{', '.join(steps)}; 1 process, CPU", flush=True)


def measure(models: list[str], data: Path, work: Path, epochs: int, bayes: dict[str, float]) -> None:
    """Train each model in turn and print the table of its tasks against the Bayes AUC."""
    results: list[TaskQuality] = []
    seconds: dict[str, float] = {}
    for model in models:
        start = time.perf_counter()
        metrics = train_example(model, data, work / f"{model}_model", epochs)
        seconds[model] = time.perf_counter() - start
        results.extend(task_qualities(model, metrics, bayes))
        print(f"{model}: trained and evaluated in {seconds[model]:.0f} s", flush=True)
    print()
    print_table(results)
    print("\ntime: " + ", ".join(f"{m} {s:.0f} s" for m, s in seconds.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="train rows to synthesise (default 300000; eval: rows/10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    parser.add_argument("--epochs", type=int, default=1, help="training epochs of each model (default 1, as the examples)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS), help="which examples (default all)")
    parser.add_argument("--data", type=Path, default=None, help="data directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (data, model dirs)")
    args = parser.parse_args()
    models = list(dict.fromkeys(args.models))

    print_sizes(args.rows, args.seed, args.epochs, models)
    work = Path(tempfile.mkdtemp(prefix="tzrun_multitask_quality_"))
    try:
        data = (args.data or work / "taobao_synth").resolve()
        measure(models, data, work, args.epochs, ensure_data(data, args.rows, args.seed))
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
