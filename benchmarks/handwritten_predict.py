#!/usr/bin/env python
"""Batched inference with DeepFM written by hand on TorchRec: the baseline that ``tzrec-run
predict`` is compared against (``benchmarks/predict_speed.py``).

No tzrec-run code: the model, the Parquet reading and the batches are
``benchmarks/handwritten_deepfm.py``'s (one DataLoader worker, single-threaded, cutting the
files' row groups into batches of ``--batch-size`` rows). The model is sharded by
``DistributedModelParallel`` on the fused kernel as in training, put in eval mode, and scored
under ``torch.no_grad()``; the probabilities are collected and written as one Parquet file
(``--output``), as ``predict`` writes its scores. The weights are the initial ones (speed does
not depend on them).

Printed, machine readable (one process)::

    RESULT rows=<int> rows_per_s=<steady state> loop_s=<seconds> setup_s=<seconds>

``rows_per_s`` counts every row from the first batch's arrival to the written file (the
DataLoader's start is in ``setup_s``, with the imports left out, building and sharding).

    python benchmarks/handwritten_predict.py --data DIR/train --batch-size 8192 --output /tmp/scores.parquet
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

started = time.perf_counter()

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchrec.distributed import DistributedModelParallel  # noqa: E402
from torchrec.distributed.model_parallel import get_default_sharders  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology  # noqa: E402
from torchrec.distributed.planner.types import ParameterConstraints  # noqa: E402
from torchrec.distributed.types import ShardingEnv  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from handwritten_deepfm import SPARSE, SPARSE_NAMES, DeepFM, ParquetBatches, rank_row_groups, single_threaded_worker  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="Parquet file or directory")
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--output", required=True, help="the .parquet file of scores")
    parser.add_argument("--table-rows", default=",".join(str(n) for _, n in SPARSE))
    args = parser.parse_args()
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    imported = time.perf_counter()

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    table_rows = [int(n) for n in args.table_rows.split(",")]
    model = DeepFM(list(zip(SPARSE_NAMES, table_rows)))
    constraints = {t.name: ParameterConstraints(sharding_types=["table_wise", "row_wise", "table_row_wise"],
                                                compute_kernels=["fused"])
                   for ebc in (model.deep_ebc, model.wide_ebc) for t in ebc.embedding_bag_configs()}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), batch_size=args.batch_size,
                                       constraints=constraints)
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(model, get_default_sharders(), pg)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), plan=plan,
                                   sharders=get_default_sharders(), device=torch.device("cpu"))
    dmp.eval()
    loader = DataLoader(ParquetBatches(rank_row_groups(args.data, 0, 1), args.batch_size), batch_size=None,
                        num_workers=1, worker_init_fn=single_threaded_worker)
    batches = iter(loader)
    first = next(batches)
    setup = time.perf_counter() - imported
    loop_started = time.perf_counter()
    scores, rows = [], 0
    with torch.no_grad():
        batch = first
        while batch is not None:
            scores.append(torch.sigmoid(dmp(batch)).numpy())
            rows += batch.labels.shape[0]
            batch = next(batches, None)
    pq.write_table(pa.table({"probs": np.concatenate(scores)}), args.output)
    loop = time.perf_counter() - loop_started
    print(f"hand-written inference: {rows} rows in {loop:.2f} s ({rows / loop:,.0f} rows/s); set-up {setup:.2f} s, "
          f"imports {imported - started:.2f} s", flush=True)
    print(f"RESULT rows={rows} rows_per_s={rows / loop:.1f} loop_s={loop:.3f} setup_s={setup:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
