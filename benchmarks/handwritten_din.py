#!/usr/bin/env python
"""DIN on the synthetic Taobao data, written by hand on TorchRec: the baseline that
``tzrec-run train examples/din_taobao.toml`` is compared against (``benchmarks/compare_din.py``).

This file uses no tzrec-run code (only torch, torchrec, fbgemm_gpu, pyarrow and numpy): it is what
a competent TorchRec user would write for the same model on the same data.

* Data: the Parquet files of ``--data`` (``DIR/train`` of ``tzrec-run data synth taobao``), read
  and turned into batches **before the clock starts** (the loop is fed from memory and pays
  nothing for its input): dense float32 ``[B, 3]`` (``log1p(price)``, ``log1p(user_pv_7d)``,
  ``item_ctr_7d``), a ``KeyedJaggedTensor`` with one id per row for each of the 14 pooled id
  features, a second one for the ``EmbeddingCollection`` with the candidate ``adgroup_id`` (one id
  per row) and ``click_seq__adgroup_id`` (the row's ``click_50_seq``, its last 50 ids), labels
  (``click``) float32. ``pid`` is mapped to ids by its dictionary (tzrec-run hashes it; the table
  has the same 20 rows).
* Model: DIN as ``tzrun_plugins.models.din`` with the example's settings: an
  ``EmbeddingBagCollection`` with one dim-16 table per pooled id feature; an
  ``EmbeddingCollection`` with the ``adgroup_id`` table (6,000 x 16) looked up by the candidate
  and the sequence; a tower MLP [256, 128, 64] over [dense, pooled embeddings, candidate
  embedding]; DIN's target attention (MLP [64, 32] over ``[q, s, q - s, q * s]``, masked softmax)
  of the candidate over the padded ``[B, 50, 16]`` sequence; a final MLP [64] over [tower,
  attention] and a linear layer to one logit; mean binary cross-entropy with logits.
* Training: fused row-wise Adagrad (lr 0.05) on both collections via
  ``apply_optimizer_in_backward``; ``EmbeddingShardingPlanner`` (table_wise/row_wise/
  table_row_wise on the fused kernel); ``DistributedModelParallel``; Adam (lr 1e-3) on the rest;
  ``TrainPipelineSparseDist``; one process (gloo).

Timing: from just before the train pipeline is created to the drained pipeline after the last
step; samples/s = batch_size * steps / seconds. The last line is machine readable::

    RESULT samples_per_s=<float> steps=<steps> world_size=1

Run::

    python benchmarks/handwritten_din.py --data /tmp/tzrun_bench_taobao/train --batch-size 2048 --steps 40
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

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, PoolingType
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

LABEL = "click"
DENSE = [("price", True), ("user_pv_7d", True), ("item_ctr_7d", False)]  # (column, log1p), as the example
# (column, num_buckets) of the pooled id features, as in examples/din_taobao.toml
POOLED = [
    ("user_id", 4000), ("cms_segid", 97), ("cms_group_id", 13), ("final_gender_code", 2), ("age_level", 7),
    ("pvalue_level", 4), ("shopping_level", 3), ("occupation", 2), ("new_user_class_level", 5), ("pid", 20),
    ("cate_id", 120), ("campaign_id", 3000), ("customer", 1500), ("brand", 600),
]
POOLED_NAMES = [name for name, _ in POOLED]
CANDIDATE, CANDIDATE_ROWS = "adgroup_id", 6000
SEQUENCE, SEQUENCE_COLUMN, MAX_LEN = "click_seq__adgroup_id", "click_50_seq", 50
DIM = 16
TOWER_UNITS = [256, 128, 64]
ATTENTION_UNITS = [64, 32]
FINAL_UNITS = [64]
SEED = 42


class Batch(Pipelineable):
    """Dense features, pooled ids, the candidate and sequence ids, labels."""

    def __init__(self, dense: torch.Tensor, sparse: KeyedJaggedTensor, sequence: KeyedJaggedTensor, labels: torch.Tensor) -> None:
        self.dense, self.sparse, self.sequence, self.labels = dense, sparse, sequence, labels

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(*(t.to(device, non_blocking=non_blocking) for t in (self.dense, self.sparse, self.sequence, self.labels)))

    def record_stream(self, stream: torch.Stream) -> None:
        for t in (self.dense, self.sparse, self.sequence, self.labels):
            t.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return Batch(*(t.pin_memory() for t in (self.dense, self.sparse, self.sequence, self.labels)))


def to_batch(table: pa.Table) -> Batch:
    rows = table.num_rows
    dense = np.empty((rows, len(DENSE)), dtype=np.float32)
    for j, (name, log1p) in enumerate(DENSE):
        dense[:, j] = table.column(name).to_numpy()
        if log1p:
            np.log1p(np.maximum(dense[:, j], 0.0), out=dense[:, j])
    values = []
    for name in POOLED_NAMES:
        column = table.column(name)
        if name == "pid":
            column = pa.chunked_array([c.dictionary_encode().indices for c in column.chunks]).cast(pa.int64())
        values.append(column.to_numpy() % dict(POOLED)[name])
    sparse = KeyedJaggedTensor(
        keys=POOLED_NAMES, values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
        lengths=torch.ones(rows * len(POOLED_NAMES), dtype=torch.int32), stride=rows,
    )
    seq = table.column(SEQUENCE_COLUMN).combine_chunks()
    offsets = seq.offsets.to_numpy()
    ids = seq.flatten().to_numpy()
    lengths = np.diff(offsets)
    keep = np.minimum(lengths, MAX_LEN)  # the last MAX_LEN ids: the most recent
    kept = np.concatenate([ids[end - k:end] for end, k in zip(offsets[1:], keep)]) if rows else ids[:0]
    sequence = KeyedJaggedTensor(
        keys=[CANDIDATE, SEQUENCE],
        values=torch.from_numpy(np.concatenate([table.column(CANDIDATE).to_numpy(), kept]).astype(np.int64)),
        lengths=torch.from_numpy(np.concatenate([np.ones(rows), keep]).astype(np.int32)), stride=rows,
    )
    labels = torch.from_numpy(table.column(LABEL).to_numpy().astype(np.float32))
    return Batch(torch.from_numpy(dense), sparse, sequence, labels)


def memory_batches(data: str, batch_size: int, steps: int) -> list[Batch]:
    """``steps`` batches of ``batch_size`` rows, cycling over the files' rows."""
    files = sorted(str(p) for p in Path(data).rglob("*.parquet")) if os.path.isdir(data) else [data]
    columns = [LABEL, *(n for n, _ in DENSE), *POOLED_NAMES, CANDIDATE, SEQUENCE_COLUMN]
    table = pa.concat_tables(pq.read_table(f, columns=columns) for f in files)
    if table.num_rows < batch_size:
        raise SystemExit(f"{data}: {table.num_rows} rows, fewer than one batch of {batch_size}")
    starts = itertools.cycle(range(0, table.num_rows - batch_size + 1, batch_size))
    return [to_batch(table.slice(next(starts), batch_size)) for _ in range(steps)]


def mlp(in_features: int, units: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in units:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return nn.Sequential(*layers)


@torch.fx.wrap
def padded(values: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged rows of ``values`` ``[N, D]`` as ``[B, MAX_LEN, D]`` (left-aligned) and their mask."""
    dense = torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [MAX_LEN], 0.0)
    mask = torch.arange(MAX_LEN).unsqueeze(0) < (offsets[1:] - offsets[:-1]).unsqueeze(1)
    return dense, mask


@torch.fx.wrap
def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1) * mask.to(scores.dtype)


class DIN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        meta = torch.device("meta")
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"{n}_emb", num_embeddings=rows, embedding_dim=DIM, feature_names=[n],
                                       pooling=PoolingType.SUM) for n, rows in POOLED],
            device=meta,
        )
        self.ec = EmbeddingCollection(
            tables=[EmbeddingConfig(name=f"{CANDIDATE}_emb", num_embeddings=CANDIDATE_ROWS, embedding_dim=DIM,
                                    feature_names=[CANDIDATE, SEQUENCE])],
            device=meta,
        )
        tower_in = len(DENSE) + (len(POOLED) + 1) * DIM
        self.tower = mlp(tower_in, TOWER_UNITS)
        self.attention = mlp(4 * DIM, ATTENTION_UNITS)
        self.score = nn.Linear(ATTENTION_UNITS[-1], 1)
        self.final = mlp(TOWER_UNITS[-1] + DIM, FINAL_UNITS)
        self.output = nn.Linear(FINAL_UNITS[-1], 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        pooled = self.ebc(batch.sparse).to_dict()
        looked_up = self.ec(batch.sequence)
        query = looked_up[CANDIDATE].values()  # one id per row: [B, D]
        seq = looked_up[SEQUENCE]
        sequence, mask = padded(seq.values(), seq.offsets())
        tower = self.tower(torch.cat([batch.dense, *(pooled[n] for n in POOLED_NAMES), query], dim=1))
        q = query.unsqueeze(1).expand_as(sequence)
        scores = self.score(self.attention(torch.cat([q, sequence, q - sequence, q * sequence], dim=-1))).squeeze(-1)
        attended = torch.bmm(masked_softmax(scores, mask).unsqueeze(1), sequence).squeeze(1)
        return self.output(self.final(torch.cat([tower, attended], dim=1))).squeeze(-1)


class WithLoss(nn.Module):
    """Returns the ``(loss, outputs)`` pair TorchRec's train pipelines expect."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch):
        logits = self.model(batch)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="Parquet file or directory (e.g. DIR/train)")
    parser.add_argument("--batch-size", type=int, default=2048, help="rows per step")
    parser.add_argument("--steps", type=int, required=True, help="training steps")
    parser.add_argument("--log-every", type=int, default=25, help="print the mean loss every N steps")
    args = parser.parse_args()
    for name in ("torchrec.distributed.planner", "torchrec.distributed.train_pipeline",
                 "torchrec.distributed.utils", "torchrec.distributed.model_parallel"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    device = torch.device("cpu")
    torch.manual_seed(SEED)

    model = WithLoss(DIN())
    for collection in (model.model.ebc, model.model.ec):
        apply_optimizer_in_backward(RowWiseAdagrad, collection.parameters(), {"lr": 0.05, "eps": 1e-8})
    tables = [t.name for t in model.model.ebc.embedding_bag_configs()] + [t.name for t in model.model.ec.embedding_configs()]
    constraints = {name: ParameterConstraints(sharding_types=["table_wise", "row_wise", "table_row_wise"],
                                              compute_kernels=["fused"]) for name in tables}
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                       batch_size=args.batch_size, constraints=constraints)
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(model, sharders, pg)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=sharders, device=device)
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters(), include=False)),
        lambda params: torch.optim.Adam(params, lr=1e-3),
    )
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense_optimizer])
    batches = iter(memory_batches(args.data, args.batch_size, args.steps))  # before the clock

    started = time.perf_counter()
    pipeline = TrainPipelineSparseDist(dmp, optimizer, device, execute_all_batches=True)
    step, loss_sum, logged = 0, None, 0
    while True:
        try:
            loss, _, _ = pipeline.progress(batches)
        except StopIteration:
            break
        step += 1
        loss_sum = loss if loss_sum is None else loss_sum + loss
        logged += 1
        if args.log_every and step % args.log_every == 0:
            print(f"step {step}  loss={float(loss_sum) / logged:.5f}", flush=True)
            loss_sum, logged = None, 0
    seconds = time.perf_counter() - started

    rate = args.batch_size * step / seconds
    print(f"hand-written DIN: {step} steps in {seconds:.2f} s, {rate:,.0f} samples/s (batch {args.batch_size}; "
          "in-memory batches; pipeline creation and fill included, set-up excluded)", flush=True)
    print(f"RESULT samples_per_s={rate:.3f} steps={step} world_size=1", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
