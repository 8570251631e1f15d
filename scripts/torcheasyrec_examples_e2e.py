#!/usr/bin/env python
"""TorchEasyRec's example configs end to end, as a migrating team would run them before real data.

For every config of ``tests/core/torcheasyrec_examples.py`` (``EXAMPLES``: TorchEasyRec's
``examples/*.config``, verbatim copies or written to their structure), each step a ``tzrec-run``
process that must exit 0:

1. ``convert`` the protobuf text into TOML; a config whose model is not converted (the model is
   not built here yet) is a ``no model`` row, not a failure;
2. ``check`` it for its cluster: ``--device cuda`` for the examples written for GPU clusters
   (Criteo Terabyte's 40M-row tables: check's memory estimate refuses them on a CPU host), plain
   ``check`` otherwise;
3. ``data synth --like`` it into synthetic Parquet (and a sampler's item table; for a ``tdm``
   sampler, its tree built with ``tzrec-run tdm-tree`` from the synthetic items and
   ``layer_num_sample`` set to the tree's levels, the deepest levels keeping the config's counts);
4. ``train`` ``--steps`` steps on CPU, on that data (the ``--set`` lines ``data synth`` printed);
5. ``export`` the last checkpoint;
6. ``predict`` the eval rows with the export.

Steps 3 to 6 run on CPU with every table capped at ``--max-table-rows`` rows (``--set`` on the
feature's ``num_buckets`` or ``hash_bucket_size``; the data is drawn for the capped config): the
point is that each piece fits the next, not the memory of the full tables, which step 2 checks.
A config ``convert`` writes no model for appears as a ``no model`` row.

It fetches nothing and writes only below ``--work`` (a temporary directory by default). It takes
minutes per example on a small CPU host; run it alone::

    python scripts/torcheasyrec_examples_e2e.py                  # every example, a table at the end
    python scripts/torcheasyrec_examples_e2e.py --only dssm_taobao --work /tmp/e2e --steps 5

Exit status 0 when no row failed (``no model`` rows are not failures), 1 otherwise.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.core.torcheasyrec_examples import EXAMPLES  # noqa: E402 - the repository's own copies

#: Examples written for a GPU cluster (Criteo Terabyte's 40M-row tables: 24 GiB with their optimizer state, more
#: than check's estimate allows on this CPU host; tdm_taobao's sparse Adam, which FBGEMM fuses on GPUs only):
#: checked with ``--device cuda``, as tests/core/test_convert.py does.
GPU_EXAMPLES = {"wukong_criteo", "masknet_criteo", "dcn_v2_criteo", "rocket_launching_criteo", "tdm_taobao"}

_STEPS = ("convert", "check", "synth", "train", "export", "predict")


@dataclass
class Row:
    """One example's outcome: each step's result (``ok``, ``FAIL``, ``-``) and a note."""

    name: str
    model: str = "-"
    steps: dict[str, str] = field(default_factory=lambda: dict.fromkeys(_STEPS, "-"))
    note: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return "FAIL" in self.steps.values()


def _tzrec_run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tzrun", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[-1][:160] if lines else f"exit {proc.returncode}"


def _caps(config: dict, limit: int) -> list[str]:
    """``--set`` lines capping every table of the converted ``config`` at ``limit`` rows."""
    out = []
    for path, feature in _id_features(config):
        for key in ("num_buckets", "hash_bucket_size"):
            if feature.get(key, 0) > limit:
                out.append(f"{path}.{key}={limit}")
    return out


def _id_features(config: dict) -> list[tuple[str, dict]]:
    """Every id feature of ``config`` (sparse, then sequences') and its TOML path."""
    features = config.get("features", {})
    places = [(f"features.sparse[{i}]", f) for i, f in enumerate(features.get("sparse", []))]
    places += [(f"features.sequence[{g}].features[{j}]", f) for g, group in enumerate(features.get("sequence", []))
               for j, f in enumerate(group.get("features", []))]
    return places


def _small(config: dict, work: Path, steps: int) -> list[str]:
    """``--set`` lines for a short CPU run into ``work``."""
    sets = [f'model_dir="{work / "run"}"', "data.batch_size=256", "data.eval_batch_size=256", "data.num_workers=0",
            f"train.num_steps={steps}", "train.save_checkpoints_steps=0", "train.stages=[]"]
    if config.get("data", {}).get("sampler", {}).get("type") == "negative":
        sets.append("data.sampler.num_negatives=64")
    optimizer = config.get("train", {}).get("sparse_optimizer", {})
    if optimizer.get("type") not in (None, "sgd", "adagrad", "rowwise_adagrad"):  # FBGEMM fuses it on GPUs only
        if config.get("features", {}).get("sequence"):
            # a sequence's table cannot train data-parallel on CPU (FBGEMM's CPU dense kernel
            # pools every lookup): rowwise_adagrad at the config's lr stands in for this CPU run
            sets.append(f'train.sparse_optimizer={{type = "rowwise_adagrad", lr = {optimizer.get("lr", 0.001)}}}')
        else:
            sets.append('train.sparse_optimizer.cpu_policy="data_parallel"')
    return sets


def _items(data: Path, columns: list[str], out: Path) -> Path:
    """The item table of the synthetic rows, train and eval: the first row of each item id,
    ``columns`` only."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    table = pa.concat_tables([ds.dataset(str(data / part), format="parquet").to_table(columns=columns)
                              for part in ("train", "eval")])
    ids = table.column(columns[0])
    first = pc.index_in(pc.unique(ids), value_set=ids)  # each unique id's first row
    pq.write_table(table.take(first), out)
    return out


def _tree(row: Row, config: dict, data: Path, work: Path, timeout: float, limit: int) -> list[str] | None:
    """A ``tdm`` sampler's tree, built with ``tzrec-run tdm-tree`` from the synthetic rows' items
    (train and eval: every clicked item is a leaf) and their attributes, as a migrating team
    builds it from its item table; the ``--set`` lines pointing the sampler at it, giving one
    ``layer_num_sample`` entry per level of it (:func:`_layers`) and the item id's table a row
    per node id ([] without a tdm sampler, None on failure)."""
    sampler = config.get("data", {}).get("sampler", {})
    if sampler.get("type") != "tdm":
        return []
    attrs = sampler.get("attr_fields", [])
    items = _items(data, [sampler["item_id"], *attrs], work / "items.parquet")
    cmd = ["tdm-tree", str(items), "--item-id", sampler["item_id"], "--cate-id", attrs[0],
           *(a for f in attrs for a in ("--attr-fields", f)), "--out", str(work / "nodes.parquet")]
    if _step(row, "synth", cmd, timeout) is None:
        return None
    layers = _layers(sampler["layer_num_sample"], work / "nodes.parquet")
    return [f'data.sampler.tree="{work / "nodes.parquet"}"', f"data.sampler.layer_num_sample={layers}",
            *_node_buckets(config, sampler["item_id"], work / "nodes.parquet", limit)]


def _node_buckets(config: dict, item_id: str, tree: Path, limit: int) -> list[str]:
    """``--set`` lines giving the item id's table (every id feature sharing it, its buckets
    capped at ``limit``) a row for each node id of ``tree`` (its non-leaf ids follow the items')."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows = pc.max(pq.read_table(tree, columns=[item_id]).column(item_id)).as_py() + 1
    places = _id_features(config)
    tables = {f.get("table") or f"{f['name']}_emb" for _, f in places if f.get("column", f["name"]) == item_id}
    return [f"{path}.num_buckets={rows}" for path, f in places
            if (f.get("table") or f"{f['name']}_emb") in tables and min(f.get("num_buckets", rows), limit) < rows]


def _layers(configured: list[int], tree: Path) -> list[int]:
    """``layer_num_sample`` for ``tree``, from the converted config's: one entry per level of
    the tree, root 0; each level takes the entry of the configured level as far from the leaves
    (the deep levels, where most negatives are drawn, keep their counts), at most the level's
    nodes but one."""
    import numpy as np
    import pyarrow.parquet as pq

    counts = np.bincount(pq.read_table(tree, columns=["tree_level"]).column("tree_level").to_numpy()).tolist()
    tail = configured[-(len(counts) - 1):]
    tail = [configured[-1]] * (len(counts) - 1 - len(tail)) + tail  # a tree deeper than the config's
    return [0] + [min(k, have - 1) for k, have in zip(tail, counts[1:])]


def _sets(lines: list[str]) -> list[str]:
    return [arg for line in lines for arg in ("--set", line)]


def _step(row: Row, name: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run one step; on failure mark it and note its last line."""
    try:
        proc = _tzrec_run(args, timeout)
    except subprocess.TimeoutExpired:
        row.steps[name], row.note = "FAIL", f"{name}: timed out after {timeout:.0f} s"
        return None
    if proc.returncode != 0:
        row.steps[name], row.note = "FAIL", f"{name}: {_last_line(proc)}"
        return None
    row.steps[name] = "ok"
    return proc


def run_example(name: str, text: str, work: Path, args: argparse.Namespace) -> Row:
    """Every step for one example, stopping at the first that fails."""
    row = Row(name)
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.config").write_text(text)
    toml = work / f"{name}.toml"
    if _step(row, "convert", ["convert", str(work / f"{name}.config"), "--out", str(toml)], args.timeout) is None:
        return row
    config = tomllib.loads(toml.read_text())
    row.model = config.get("model", {}).get("type", "-")
    if row.model == "-":
        row.note = "no model: convert leaves [model] to write (the model is not built here yet)"
        return row
    data = work / "data"
    inputs = [f'model_dir="{work / "run"}"', f'data.train_input="{data}/train"',  # those TorchEasyRec's
              f'data.eval_input="{data}/eval"']  # command line may give: convert then leaves them unset
    device = ["--device", "cuda"] if name in GPU_EXAMPLES else []
    if _step(row, "check", ["check", str(toml), *device, *_sets(inputs)], args.timeout) is None:
        return row
    cpu = _caps(config, args.max_table_rows)
    synth = _step(row, "synth", ["data", "synth", "--like", str(toml), str(data), "--rows", str(args.rows),
                                 "--eval-rows", str(args.eval_rows), *_sets(inputs + cpu)], args.timeout)
    if synth is None:
        return row
    pointed = shlex.split(synth.stdout.splitlines()[-1])[1::2]
    tree = _tree(row, config, data, work, args.timeout, args.max_table_rows)
    if tree is None:
        return row
    run = _sets(inputs + cpu + pointed + tree + _small(config, work, args.steps))
    if _step(row, "train", ["train", str(toml), *run, "--overwrite"], args.timeout) is None:
        return row
    if _step(row, "export", ["export", str(toml), *run, "--out", str(work / "export")], args.timeout) is None:
        return row
    towers = not (work / "export" / "model.pt2").exists()  # a two-tower export: user_tower and item_tower
    scorer = (["--checkpoint", "latest", "--outputs", "user_embedding,item_embedding"] if towers
              else ["--export", str(work / "export")])
    _step(row, "predict", ["predict", str(toml), *run, *scorer, "--input", f"{data}/eval",
                           "--output", str(work / "predictions"), "--overwrite"], args.timeout)
    if not row.failed:
        row.note = "; ".join(filter(None, [
            f"{len(cpu)} table(s) capped at {args.max_table_rows} rows" if cpu else "",
            "checked with --device cuda" if device else "",
            "predict from the checkpoint (predict --export runs a 'model' program; towers export two)" if towers else ""]))
    return row


def format_table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    head = ["example", "model", *_STEPS, "s", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([r.name, r.model, *r.steps.values(), f"{r.seconds:.0f}", r.note]) + " |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", metavar="NAME", help="run this example only (repeatable)")
    p.add_argument("--work", type=Path, help="keep every file here (default: a temporary directory)")
    p.add_argument("--rows", type=int, default=6000, help="synthetic train rows (default 6000)")
    p.add_argument("--eval-rows", type=int, default=1000, help="synthetic eval rows (default 1000)")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--max-table-rows", type=int, default=100_000, help="cap of every table on CPU (default 100000)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one step may take (default 900)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the examples, print the table; 1 when a row failed."""
    args = _parser().parse_args(argv)
    names = args.only or list(EXAMPLES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tzrec-e2e-") as tmp:
        work = args.work or Path(tmp)
        for name in names:
            start = time.monotonic()
            if name in EXAMPLES:
                row = run_example(name, EXAMPLES[name], work / name, args)
            else:
                row = Row(name, "-", note=f"not an example of tests/core/torcheasyrec_examples.py: {sorted(EXAMPLES)}")
            row.seconds = time.monotonic() - start
            print(f"{name}: {' '.join(f'{k}={v}' for k, v in row.steps.items())} {row.note}", file=sys.stderr, flush=True)
            rows.append(row)
    print(format_table(rows))
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
