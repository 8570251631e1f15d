#!/usr/bin/env python
"""Eval AUC of collision-free ids (``zch``) against ``hash_bucket_size`` of the same table rows, on
an id space that drifts.

Synthesises Criteo-shaped data with ``tzrec-run data synth criteo --drift`` (``cat_2``, ``cat_3``,
``cat_11``, ``cat_15`` and ``cat_20`` are open id spaces: new ids keep arriving over the rows, old
ones fade, about 2,000 ids of each are live at any row and each id has an effect of its own on the
label; ``synth.json`` holds the Bayes AUC, the AUC of the true click probability on the eval split),
then trains ``examples/deepfm_criteo.toml`` on it twice, changing only the drifting features' id
source, at the same table rows (``--table-rows``, default 2048, for the deep and the wide table of
each):

- ``zch``: ``zch = { size = ROWS, eviction_interval = 2, eviction_policy = { type = POLICY } }``
  (``--policy``, default ``distance_lfu``: the ids looked up often and lately keep their rows);
- ``hash``: ``hash_bucket_size = ROWS`` (an integer id modulo ROWS: unrelated ids share a row).

Everything runs in this one Python process on CPU through ``tzrec-run``'s entry function (one
rank; the runs are seeded: the same command gives the same numbers on the same machine). It prints
a Markdown table: each variant's eval AUC and training time, and the Bayes AUC.

    python benchmarks/zch_vs_hash.py                        # 400k rows, 1 epoch each
    python benchmarks/zch_vs_hash.py --rows 50000           # a quick look

The data is generated unless ``--data`` already holds a drifting ``synth.json`` of the same rows and seed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "deepfm_criteo.toml"
VARIANTS: tuple[str, ...] = ("zch", "hash")


@dataclass(frozen=True)
class Outcome:
    """One trained variant."""

    variant: str
    id_source: str
    auc: float
    seconds: float


def tzrec_run(argv: list[str]) -> None:
    """Run ``tzrec-run argv`` in this process; exit with its message when it fails."""
    from tzrun.cli.main import main

    code = main(argv)
    if code != 0:
        raise SystemExit(f"tzrec-run {' '.join(argv)}: exit code {code}")


def ensure_data(data: Path, rows: int, seed: int) -> dict:
    """Synthesise the drifting data into ``data`` unless it is there; return its ``synth.json``."""
    report = data / "synth.json"
    if report.exists():
        have = json.loads(report.read_text())
        if have.get("train_rows") == rows and have.get("seed") == seed and have.get("drift_columns"):
            print(f"data: using {data}")
            return have
        raise SystemExit(f"{data}: holds {have.get('train_rows')} train rows of seed {have.get('seed')} "
                         f"(drifting: {bool(have.get('drift_columns'))}), not --rows {rows} --seed {seed} --drift; "
                         "delete it or pass another --data")
    start = time.perf_counter()
    tzrec_run(["data", "synth", "criteo", "--drift", "--rows", str(rows), "--seed", str(seed), "--out", str(data)])
    print(f"data: synthesised in {time.perf_counter() - start:.0f} s", flush=True)
    return json.loads(report.read_text())


def id_source(variant: str, table_rows: int, policy: str) -> str:
    """The TOML line giving a drifting feature its ids in ``variant``."""
    if variant == "zch":
        return f'zch = {{ size = {table_rows}, eviction_interval = 2, eviction_policy = {{ type = "{policy}" }} }}'
    return f"hash_bucket_size = {table_rows}"


def write_config(path: Path, columns: list[str], source: str) -> Path:
    """The DeepFM example with each of ``columns`` reading its ids through ``source``."""
    text = EXAMPLE.read_text()
    for name in columns:
        text, n = re.subn(rf'name = "{name}"\nnum_buckets = \d+', f'name = "{name}"\n{source}', text)
        if n != 1:
            raise SystemExit(f"{EXAMPLE}: no [[features.sparse]] {name} with num_buckets to replace")
    path.write_text(text)
    return path


def train_variant(config: Path, data: Path, model_dir: Path) -> float:
    """Train ``config`` on ``data`` for one epoch; return the final eval AUC."""
    tzrec_run([
        "train", str(config),
        "--set", f"data.train_input={json.dumps(str(data / 'train'))}",
        "--set", f"data.eval_input={json.dumps(str(data / 'eval'))}",
        "--model-dir", str(model_dir), "--overwrite",
    ])
    lines = (model_dir / "eval_results.jsonl").read_text().splitlines()
    return float(json.loads(lines[-1])["auc"])


def print_table(outcomes: list[Outcome], bayes_auc: float, table_rows: int) -> None:
    """A Markdown table: one row per variant, and the Bayes AUC."""
    print(f"| drifting features' ids ({table_rows} rows per table) | eval AUC | Bayes AUC - AUC | train + eval s |")
    print("| --- | --- | --- | --- |")
    for o in outcomes:
        print(f"| `{o.id_source}` | {o.auc:.4f} | {bayes_auc - o.auc:.4f} | {o.seconds:.0f} |")
    print(f"| Bayes AUC (the true click probability) | {bayes_auc:.4f} | 0 | |")


def measure(args: argparse.Namespace, work: Path) -> None:
    """Generate (or reuse) the data, train each variant, print the table."""
    data = (args.data or work / "criteo_drift").resolve()
    report = ensure_data(data, args.rows, args.seed)
    columns = list(report["drift_columns"])
    print(f"sizes: {args.rows} train rows, {report['eval_rows']} eval rows (seed {args.seed}); drifting: "
          f"{', '.join(columns)}; 1 epoch of examples/deepfm_criteo.toml per variant; 1 process, CPU", flush=True)
    outcomes = []
    for variant in args.variants:
        source = id_source(variant, args.table_rows, args.policy)
        config = write_config(work / f"deepfm_{variant}.toml", columns, source)
        start = time.perf_counter()
        auc = train_variant(config, data, work / f"{variant}_model")
        outcomes.append(Outcome(variant, source, auc, time.perf_counter() - start))
        print(f"{variant}: eval AUC {auc:.4f} in {outcomes[-1].seconds:.0f} s", flush=True)
    print()
    print_table(outcomes, float(report["bayes_auc"]), args.table_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400_000, help="train rows to synthesise (default 400000; eval: rows/10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    parser.add_argument("--table-rows", type=int, default=2048, help="rows of each drifting feature's tables (default 2048)")
    parser.add_argument("--policy", default="distance_lfu", help="zch's eviction policy (default distance_lfu)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="which variants (default both)")
    parser.add_argument("--data", type=Path, default=None, help="data directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (data, configs, model dirs)")
    args = parser.parse_args()
    args.variants = list(dict.fromkeys(args.variants))
    work = Path(tempfile.mkdtemp(prefix="tzrun_zch_vs_hash_"))
    try:
        measure(args, work)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
