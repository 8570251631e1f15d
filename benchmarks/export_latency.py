"""Latency of an exported program on CPU, per batch of 1, 64 and 1,024 rows, and the
Predictor's rows/s (transforms included), for examples/deepfm_criteo.toml's model.

    python benchmarks/export_latency.py [--rows 20000] [--threads 1]

The model has its initial weights (latency does not depend on them); the rows come from
``synth_criteo``. Prints one line per measurement: the median of the repeats.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import pyarrow as pa

    from tzrun.interfaces import ModelContext
    from tzrun.runner.session import Session
    from tzrun_serving import Predictor
    from tzrun_serving.export import export_model, write_export
    from tzrun_serving.manifest import manifest_of
    from tzrun_tools.synth import synth_criteo

    work = Path(tempfile.mkdtemp())
    synth_criteo(work / "data", rows=1024, eval_rows=args.rows, seed=0, rows_per_file=args.rows, row_group_size=args.rows)
    session = Session.from_config(REPO / "examples" / "deepfm_criteo.toml",
                                  [f'data.train_input="{work / "data" / "eval"}"', f'model_dir="{work / "run"}"'])
    specs, cfg = session.specs, session.cfg
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), tuple(cfg.data.labels))
    model = session.registries["model"].get(cfg.model.type, "model.type").build(cfg.model.config, ctx).eval()
    started = time.perf_counter()
    exported = export_model(copy.deepcopy(model), specs, ["logits", "probs"])
    write_export(work / "export", exported, manifest_of(session.facts, list(exported), {"step": 0}))
    print(f"export (trace + save): {time.perf_counter() - started:.1f} s")
    table = pa.concat_tables(pa.parquet.read_table(p) for p in sorted((work / "data" / "eval").glob("*.parquet")))
    predictor = Predictor(work / "export")
    from tzrun.data.features import BatchBuilder

    builder = BatchBuilder(specs, (), None)
    for rows in (1, 64, 1024):
        inputs, _, _ = predictor.encode(table.slice(0, rows))
        batch = builder(table.slice(0, rows), "eval")
        repeats = 200 if rows < 1024 else 50
        with torch.no_grad():
            eager = _median_ms(lambda: model(batch), repeats)
        print(f"batch of {rows}: exported program {_median_ms(lambda: predictor.run(inputs), repeats):.3f} ms, "
              f"the model's eager TorchRec forward {eager:.3f} ms")
    started = time.perf_counter()
    predictor.predict(table, batch_size=1024)
    seconds = time.perf_counter() - started
    print(f"Predictor.predict (transforms + program), batches of 1024: {table.num_rows / seconds:,.0f} rows/s")


if __name__ == "__main__":
    import pyarrow.parquet  # noqa: F401 - pa.parquet

    main()
