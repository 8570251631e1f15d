#!/usr/bin/env python
"""Recall@k of DSSM on the synthetic Taobao data trained with in-batch negatives and with sampled
negatives (``[data.sampler]``, uniform and popularity-weighted), every model evaluated the same way.

Three runs train the same model on the same data (``examples/dssm_taobao.toml`` and
``examples/dssm_taobao_sampled.toml`` at ``--epochs`` epochs):

* ``in_batch``: ``in_batch_softmax`` over the other clicked ads of the batch (about 512);
* ``sampled_uniform``: ``sampled_softmax`` over ``--num-negatives`` ads drawn uniformly from
  ``items.parquet``;
* ``sampled_popularity``: the same, ads drawn by their share of impressions (``weight =
  "popularity"``), as TorchEasyRec's negative sampler draws by its weight column;
* ``sampled_popularity_keep_batch_items``: the same with ``exclude_batch_items = false`` (the
  other runs leave the batch's clicked ads out of the draws, as TorchEasyRec does).

Then ``tzrec-run evaluate`` scores each final checkpoint on the same eval rows three ways:
recall@k among the clicked ads of the eval batch (``in_batch = true``, 2,048 rows per batch),
and among 1 + ``--eval-negatives`` ads drawn for each eval batch uniformly and by popularity
(``sampled = true``, leaving out the batch's clicked ads; the draws are the same for every
model: they depend on the seed, the step and the eval rows only). Random ranking gives k / 512 and k / (1 + eval negatives).

    python benchmarks/retrieval_negatives.py                   # 200k rows, 2 epochs, 1024 negatives
    python benchmarks/retrieval_negatives.py --rows 50000 --epochs 1

The data is generated with ``tzrec-run data synth taobao`` unless ``--data`` already holds a
``synth.json``. The wall time of each training run is shown for information (the in-batch run does
not carry sampled items, so it is also the cheapest per step).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IN_BATCH = REPO / "examples" / "dssm_taobao.toml"
SAMPLED = REPO / "examples" / "dssm_taobao_sampled.toml"
KS = (5, 50)


def tzrec_run() -> list[str]:
    script = Path(sys.executable).parent / "tzrec-run"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tzrun"]


def sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def run(args: list[str]) -> str:
    proc = subprocess.run([*tzrec_run(), *args], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{proc.stderr[-3000:]}")
    return proc.stdout


def ensure_data(data: Path, rows: int) -> None:
    if (data / "synth.json").exists() and (data / "items.parquet").exists():
        print(f"data: using {data}")
        return
    print(f"data: writing {rows} rows to {data}")
    run(["data", "synth", "taobao", "--rows", str(rows), "--out", str(data)])


def sampler(data: Path, negatives: int, weighted: bool, exclude: bool = True) -> str:
    """A ``--set`` of ``[data.sampler]``: ``negatives`` ads from items.parquet, by popularity or
    uniformly, leaving out the batch's clicked ads unless ``exclude`` is false."""
    weight = ', weight = "popularity"' if weighted else ""
    return (f'data.sampler={{type = "negative", item_table = "{data / "items.parquet"}", item_id = "adgroup_id", '
            f"num_negatives = {negatives}{weight}, exclude_batch_items = {str(exclude).lower()}}}")


def train(name: str, data: Path, out: Path, epochs: int, negatives: int, weighted: bool | None, exclude: bool) -> float:
    """Train run ``name``: in-batch (``weighted`` None) or with sampled negatives; its seconds."""
    overrides = [
        f'data.train_input="{data / "train"}"', f'data.eval_input="{data / "eval"}"',
        f'model_dir="{out / name}"', f"train.num_epochs={epochs}", "eval.num_steps=1",  # evaluated after
    ]
    config = IN_BATCH
    if weighted is not None:
        config = SAMPLED
        overrides.append(sampler(data, negatives, weighted, exclude))
    started = time.perf_counter()
    run(["train", str(config), "--overwrite", *sets(*overrides)])
    return time.perf_counter() - started


def evaluate(name: str, data: Path, out: Path, negatives: int, weighted: bool) -> dict[str, float]:
    """Recall@k of run ``name``'s last checkpoint in-batch and among ``negatives`` sampled ads."""
    metrics = [f'{{type = "recall_at_k", name = "in_batch_{k}", k = {k}, in_batch = true}}' for k in KS]
    metrics += [f'{{type = "recall_at_k", name = "sampled_{k}", k = {k}, sampled = true, prediction = "sampled_similarity"}}'
                for k in KS]
    run(["evaluate", str(SAMPLED), "--checkpoint", "latest", "--model-dir", str(out / name), *sets(
        f'data.eval_input="{data / "eval"}"', sampler(data, negatives, weighted), 'losses=[{type = "in_batch_softmax"}]',
        f"metrics=[{', '.join(metrics)}]",
    )])
    return json.loads((out / name / "eval_results.jsonl").read_text().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "taobao_bench")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-negatives", type=int, default=1024)
    parser.add_argument("--eval-negatives", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=None, help="model dirs (default: a temporary directory)")
    args = parser.parse_args()
    ensure_data(args.data, args.rows)
    out = args.out or Path(tempfile.mkdtemp(prefix="retrieval_negatives_"))
    runs = {  # name: (weighted, exclude_batch_items) of the training sampler
        "in_batch": (None, True),
        "sampled_uniform": (False, True),
        "sampled_popularity": (True, True),
        "sampled_popularity_keep_batch_items": (True, False),
    }
    rows = []
    for name, (weighted, exclude) in runs.items():
        seconds = train(name, args.data, out, args.epochs, args.num_negatives, weighted, exclude)
        uniform = evaluate(name, args.data, out, args.eval_negatives, weighted=False)
        popular = evaluate(name, args.data, out, args.eval_negatives, weighted=True)
        rows.append((name, seconds, uniform, popular))
        print(f"{name}: trained in {seconds:.0f} s", flush=True)
    n = args.eval_negatives
    head = " | ".join(f"in-batch @{k}" for k in KS) + " | " + " | ".join(f"uniform 1+{n} @{k}" for k in KS)
    head += " | " + " | ".join(f"popularity 1+{n} @{k}" for k in KS)
    print(f"\n| training | {head} | train s |")
    print("|" + " --- |" * (2 + 3 * len(KS)))
    for name, seconds, uniform, popular in rows:
        cells = [f"{uniform[f'in_batch_{k}']:.3f}" for k in KS] + [f"{uniform[f'sampled_{k}']:.3f}" for k in KS]
        cells += [f"{popular[f'sampled_{k}']:.3f}" for k in KS]
        print(f"| {name} | {' | '.join(cells)} | {seconds:.0f} |")
    print(f"\nrandom ranking: in-batch @k = k / (clicked rows per eval batch, about 512); sampled @k = k / {1 + n}")
    print(f"model dirs: {out}")


if __name__ == "__main__":
    main()
