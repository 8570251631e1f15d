#!/usr/bin/env python
"""DeepFM on the synthetic Criteo data, written by hand on TorchRec: the baseline that
``tzrec-run train examples/deepfm_criteo.toml`` is compared against.

This file uses no tzrec-run code at all (only torch, torchrec, fbgemm_gpu, pyarrow and numpy):
it is what a competent TorchRec user would write for the same model on the same data.

* Data: the Parquet files of ``--data`` (e.g. ``DIR/train`` of ``tzrec-run data synth criteo``).
  The row groups are dealt round-robin to the ranks; each rank reads its row groups as record
  batches with pyarrow in a ``torch.utils.data.DataLoader`` with 1 worker (single-threaded, as
  tzrec-run's workers are), which cuts them into batches of ``--batch-size`` rows (the last
  batch of a pass may be shorter) and converts each to a ``Pipelineable`` batch: dense float32
  ``[B, 13]`` = ``log1p(int_*)`` with nulls as 0, a ``KeyedJaggedTensor`` with one id per row
  for each of ``cat_0..cat_25``, labels float32. The data is re-read (a new DataLoader
  iterator, as for a new epoch) when a rank runs out of it.
* ``--in-memory``: the batches of the timed steps are read and built before the clock starts
  and then fed from a list: the loop pays nothing for its input (the baseline for "how fast can
  the model train at all").
* ``--table-rows N,N,...``: the 26 tables' sizes (default the example's; ``compare_deepfm.py
  --cardinalities kaggle`` passes the data's own, from its ``synth.json``).
* Model: DeepFM as ``tzrun_plugins.models.deepfm`` with the example's settings: a "deep"
  EmbeddingBagCollection with one dim-16 table per id feature, a "wide" one with one dim-4
  table per id feature, FM over the deep embeddings, deep MLP [256, 128, 64] over
  [dense, embeddings], final MLP [64] over [wide, fm, deep], a linear layer to one logit, mean
  binary cross-entropy with logits.
* Training: fused row-wise Adagrad (lr 0.05) on the embeddings via
  ``apply_optimizer_in_backward``; ``EmbeddingShardingPlanner`` with every table constrained to
  table_wise/row_wise/table_row_wise sharding on the fused kernel; ``DistributedModelParallel``;
  Adam (lr 1e-3) on the rest through ``KeyedOptimizerWrapper``; ``CombinedOptimizer``;
  ``TrainPipelineSparseDist``.

Timing (rank 0): with ``--warmup-steps 0`` (the default) the clock starts just before the train
pipeline is created (so it includes starting the DataLoader worker and filling the pipeline, as
tzrec-run's own number does) and stops when the pipeline is drained after the last step; model
building, sharding and process-group set-up are excluded. With ``--warmup-steps W`` the clock
starts after the W-th step returns instead and the last ``steps - W`` steps are timed.
samples/s = batch_size * world_size * timed_steps / seconds (every step counted as a full batch,
as tzrec-run counts). The last line on rank 0 is machine readable::

    RESULT samples_per_s=<float> steps=<timed steps> world_size=<int>

Run::

    python benchmarks/handwritten_deepfm.py --data /tmp/tzrun_bench_criteo/train --batch-size 2048 --steps 60
    torchrun --standalone --nproc-per-node 2 benchmarks/handwritten_deepfm.py --data /tmp/tzrun_bench_criteo/train --steps 60
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, IterableDataset

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.model_parallel import get_default_sharders
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable

LABEL = "label"
DENSE = [f"int_{i}" for i in range(13)]
# (column, num_buckets), as in examples/deepfm_criteo.toml
SPARSE = list(zip(
    [f"cat_{i}" for i in range(26)],
    [1000, 500, 4000, 3000, 300, 24, 1500, 600, 3, 2000, 1500, 4000, 1000,
     27, 1500, 3000, 10, 1500, 800, 4, 3000, 18, 15, 2000, 105, 2000],
))
SPARSE_NAMES = [name for name, _ in SPARSE]
EMBEDDING_DIM = 16
WIDE_DIM = 4
DEEP_UNITS = [256, 128, 64]
FINAL_UNITS = [64]
SEED = 42


# ----------------------------------------------------------------------------- data


class Batch(Pipelineable):
    """What the train pipeline moves around: dense features, ids, labels."""

    def __init__(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, labels: torch.Tensor) -> None:
        self.dense = dense
        self.sparse = sparse
        self.labels = labels

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        self.dense.record_stream(stream)
        self.sparse.record_stream(stream)
        self.labels.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return Batch(self.dense.pin_memory(), self.sparse.pin_memory(), self.labels.pin_memory())


def to_batch(table: pa.Table) -> Batch:
    rows = table.num_rows
    dense = np.empty((rows, len(DENSE)), dtype=np.float32)
    for j, name in enumerate(DENSE):
        dense[:, j] = table.column(name).fill_null(0).to_numpy()
    np.log1p(np.maximum(dense, 0.0, out=dense), out=dense)
    values, lengths = [], []
    for name in SPARSE_NAMES:
        column = table.column(name)
        if column.null_count:  # never in the synthetic data, but a null must give no id
            lengths.append((~column.is_null().to_numpy(zero_copy_only=False)).astype(np.int32))
            column = column.drop_null()
        else:
            lengths.append(np.ones(rows, dtype=np.int32))
        values.append(column.to_numpy().astype(np.int64, copy=False))
    sparse = KeyedJaggedTensor(
        keys=SPARSE_NAMES,
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths)),
        stride=rows,
    )
    labels = torch.from_numpy(table.column(LABEL).to_numpy().astype(np.float32))
    return Batch(torch.from_numpy(dense), sparse, labels)


class ParquetBatches(IterableDataset):
    """One pass over this rank's row groups, as batches of ``batch_size`` rows."""

    def __init__(self, row_groups: list[tuple[str, int]], batch_size: int) -> None:
        self.row_groups = row_groups
        self.batch_size = batch_size
        self.columns = [LABEL, *DENSE, *SPARSE_NAMES]

    def __iter__(self):
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        for path, files_groups in itertools.groupby(self.row_groups, key=lambda g: g[0]):
            parquet_file = pq.ParquetFile(path)
            groups = [index for _, index in files_groups]
            for record_batch in parquet_file.iter_batches(
                batch_size=self.batch_size, row_groups=groups, columns=self.columns
            ):
                pending.append(record_batch)
                pending_rows += record_batch.num_rows
                while pending_rows >= self.batch_size:
                    table = pa.Table.from_batches(pending)
                    yield to_batch(table.slice(0, self.batch_size))
                    rest = table.slice(self.batch_size)
                    pending, pending_rows = rest.to_batches(), rest.num_rows
        if pending_rows:
            yield to_batch(pa.Table.from_batches(pending))


def rank_row_groups(data: str, rank: int, world_size: int) -> list[tuple[str, int]]:
    files = sorted(str(p) for p in Path(data).rglob("*.parquet")) if os.path.isdir(data) else [data]
    groups = [(f, i) for f in files for i in range(pq.ParquetFile(f).metadata.num_row_groups)]
    mine = groups[rank::world_size]
    if not mine:
        raise SystemExit(f"{data}: {len(groups)} row group(s), none left for rank {rank} of {world_size}")
    return mine


def single_threaded_worker(worker_id: int) -> None:
    """DataLoader worker init: one intra-op thread. A forked worker inherits the trainer's
    thread count, and two OpenMP pools on the same few cores can stall training (tzrec-run's
    loader does the same, see core/tzrun/data/loader.py; the baseline should not be slowed by
    a pitfall a competent user would fix)."""
    torch.set_num_threads(1)


def endless(loader: DataLoader):
    """Pass after pass over ``loader`` (each pass starts a new DataLoader iterator)."""
    while True:
        yield from loader


# ----------------------------------------------------------------------------- model


def mlp(in_features: int, units: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in units:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return nn.Sequential(*layers)


class DeepFM(nn.Module):
    def __init__(self, sparse: list[tuple[str, int]]) -> None:
        super().__init__()
        meta = torch.device("meta")
        self.deep_ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"{name}_emb", num_embeddings=n, embedding_dim=EMBEDDING_DIM,
                                   feature_names=[name], pooling=PoolingType.SUM)
                for name, n in sparse
            ],
            device=meta,
        )
        self.wide_ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"{name}_emb_wide", num_embeddings=n, embedding_dim=WIDE_DIM,
                                   feature_names=[name])
                for name, n in sparse
            ],
            device=meta,
        )
        self.deep = mlp(len(DENSE) + len(sparse) * EMBEDDING_DIM, DEEP_UNITS)
        self.final = mlp(WIDE_DIM + EMBEDDING_DIM + DEEP_UNITS[-1], FINAL_UNITS)
        self.output = nn.Linear(FINAL_UNITS[-1], 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        n = len(SPARSE)
        embedded = self.deep_ebc(batch.sparse).values()
        rows = embedded.shape[0]
        wide = self.wide_ebc(batch.sparse).values().view(rows, n, WIDE_DIM).sum(dim=1)
        vectors = embedded.view(rows, n, EMBEDDING_DIM)
        summed = vectors.sum(dim=1)
        fm = 0.5 * (summed * summed - (vectors * vectors).sum(dim=1))
        deep = self.deep(torch.cat([batch.dense, embedded], dim=1))
        return self.output(self.final(torch.cat([wide, fm, deep], dim=1))).squeeze(-1)


class WithLoss(nn.Module):
    """Returns the ``(loss, outputs)`` pair TorchRec's train pipelines expect."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch):
        logits = self.model(batch)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="Parquet file or directory (e.g. DIR/train)")
    parser.add_argument("--batch-size", type=int, default=2048, help="rows per step on each rank")
    parser.add_argument("--steps", type=int, required=True, help="training steps in all (warmup included)")
    parser.add_argument("--warmup-steps", type=int, default=0, help="first steps left out of the timing")
    parser.add_argument("--log-every", type=int, default=25, help="print the mean loss every N steps (rank 0)")
    parser.add_argument("--print-plan", action="store_true", help="print the sharding plan (rank 0)")
    parser.add_argument("--in-memory", action="store_true",
                        help="read and build the timed steps' batches before the clock starts, then feed them from memory")
    parser.add_argument("--table-rows", default=",".join(str(n) for _, n in SPARSE),
                        help="the 26 tables' sizes, comma-separated (default: the example's)")
    parser.add_argument("--print-step-times", action="store_true",
                        help="print the seconds each progress() call took (rank 0; diagnostics)")
    args = parser.parse_args()
    if not 0 <= args.warmup_steps < args.steps:
        parser.error("need 0 <= --warmup-steps < --steps")

    for name in ("torchrec.distributed.planner", "torchrec.distributed.train_pipeline",
                 "torchrec.distributed.utils", "torchrec.distributed.model_parallel"):
        logging.getLogger(name).setLevel(logging.ERROR)

    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun sets it to 1 with more than one process
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
    if "RANK" in os.environ:
        dist.init_process_group("gloo", init_method="env://")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    torch.manual_seed(SEED)

    loader = DataLoader(
        ParquetBatches(rank_row_groups(args.data, rank, world_size), args.batch_size),
        batch_size=None,
        num_workers=1,
        worker_init_fn=single_threaded_worker,
    )

    table_rows = [int(n) for n in args.table_rows.split(",")]
    if len(table_rows) != len(SPARSE_NAMES):
        parser.error(f"--table-rows needs {len(SPARSE_NAMES)} sizes, got {len(table_rows)}")
    model = WithLoss(DeepFM(list(zip(SPARSE_NAMES, table_rows))))
    for ebc in (model.model.deep_ebc, model.model.wide_ebc):
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05, "eps": 1e-8})
    constraints = {
        table.name: ParameterConstraints(
            sharding_types=["table_wise", "row_wise", "table_row_wise"], compute_kernels=["fused"]
        )
        for ebc in (model.model.deep_ebc, model.model.wide_ebc)
        for table in ebc.embedding_bag_configs()
    }
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, local_world_size=local_world_size, compute_device="cpu"),
        batch_size=args.batch_size,
        constraints=constraints,
    )
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(model, sharders, pg)
    if args.print_plan and rank == 0:
        print(plan, flush=True)
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=sharders, device=device
    )
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters(), include=False)),
        lambda params: torch.optim.Adam(params, lr=1e-3),
    )
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense_optimizer])
    feed = itertools.islice(endless(loader), args.steps)
    if args.in_memory:
        feed = iter(list(feed))  # every batch read and built before the clock starts
    dist.barrier()

    # ---- timed part (with --warmup-steps 0: pipeline creation, DataLoader start, all steps)
    started = time.perf_counter()
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device, execute_all_batches=True)
    batches = feed
    step, loss_sum, logged = 0, None, 0
    step_times, last = [], started
    while True:
        try:
            loss, _, _ = pipeline.progress(batches)
        except StopIteration:
            break
        step += 1
        if args.print_step_times:
            now = time.perf_counter()
            step_times.append(now - last)
            last = now
        if step == args.warmup_steps:
            started = time.perf_counter()
        if rank == 0 and args.log_every:
            loss_sum = loss if loss_sum is None else loss_sum + loss
            logged += 1
            if step % args.log_every == 0:
                print(f"step {step}  loss={float(loss_sum) / logged:.5f}", flush=True)
                loss_sum, logged = None, 0
    seconds = time.perf_counter() - started
    # ---- end of timed part

    timed = step - args.warmup_steps
    rate = args.batch_size * world_size * timed / seconds
    if rank == 0 and args.print_step_times:
        print("step seconds (the first includes pipeline creation, DataLoader start and fill): "
              + " ".join(f"{t:.3f}" for t in step_times), flush=True)
    if rank == 0:
        print(
            f"hand-written: {timed} timed steps (of {step}) on {world_size} rank(s) in {seconds:.2f} s, "
            f"{rate:,.0f} samples/s (batch {args.batch_size} per rank; "
            f"{'pipeline creation, DataLoader start and fill included' if args.warmup_steps == 0 else f'after {args.warmup_steps} warmup steps'}; "
            "set-up excluded)",
            flush=True,
        )
        print(f"RESULT samples_per_s={rate:.3f} steps={timed} world_size={world_size}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
