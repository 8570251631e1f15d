"""Every metric on a real 2-process gloo group: groups split over the ranks, duplicated rows,
uneven shares, a rank with no rows at all, all against one process over the same rows."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tzrun_contrib_metrics.average_precision import AveragePrecision
from tzrun_contrib_metrics.copc import COPC
from tzrun_contrib_metrics.ndcg import NDCGAtK

WORKER = r"""
import json, sys, warnings
import torch, torch.distributed as dist
from tzrun_contrib_metrics.average_precision import AveragePrecision
from tzrun_contrib_metrics.copc import COPC
from tzrun_contrib_metrics.ndcg import NDCGAtK

rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
warnings.simplefilter("ignore")  # a rank without rows is told that compute came before update
shares = torch.load(sys.argv[3], weights_only=True)
values = {}
for case, batches in shares[rank].items():
    metrics = {"ndcg": NDCGAtK(k=3), "ap": AveragePrecision(), "copc": COPC(), "copc_grouped": COPC()}
    for p, y, w, g in batches:
        metrics["ndcg"].update(p, y, w, group=g)
        metrics["ap"].update(p, y, w)
        metrics["copc"].update(p, y, w)
        metrics["copc_grouped"].update(p, y, w, group=g)
    values[case] = {name: float(m.compute()) for name, m in metrics.items()}
print(json.dumps(values))
dist.destroy_process_group()
"""


def _rows(seed: int, n: int) -> list[tuple[float, int, float, int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        p = rng.choice([0.05, 0.1, 0.2, 0.2, 0.4, 0.6, 0.6, 0.9])
        rows.append((p, int(rng.random() < 0.2 + 0.6 * p), rng.choice([0.0, 0.5, 1.0, 1.0, 2.0]), rng.randrange(12) * 7919))
    rows += rows[:40]  # duplicated rows
    rng.shuffle(rows)
    return rows


def _batches(rows, size):
    out = []
    for start in range(0, len(rows), size):
        p, y, w, g = zip(*rows[start:start + size])
        out.append((torch.tensor(p, dtype=torch.float64), torch.tensor(y), torch.tensor(w, dtype=torch.float64), torch.tensor(g)))
    return out


def _one_process(rows):
    metrics = {"ndcg": NDCGAtK(k=3), "ap": AveragePrecision(), "copc": COPC(), "copc_grouped": COPC()}
    for p, y, w, g in _batches(rows, 64):
        metrics["ndcg"].update(p, y, w, group=g)
        metrics["ap"].update(p, y, w)
        metrics["copc"].update(p, y, w)
        metrics["copc_grouped"].update(p, y, w, group=g)
    return {name: float(m.compute()) for name, m in metrics.items()}


def test_two_ranks_give_the_value_of_one_process(tmp_path: Path):
    rows = _rows(0, 300)
    cases = {
        "interleaved": (rows[0::2], rows[1::2]),
        "uneven": (rows[:50], rows[50:]),
        "rank_1_has_no_rows": (rows, []),
    }
    shares = [{case: _batches(parts[rank], 32) for case, parts in cases.items()} for rank in range(2)]
    torch.save(shares, tmp_path / "shares.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), str(tmp_path / "store"), str(tmp_path / "shares.pt")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for rank in range(2)
    ]
    outputs = []
    for worker in workers:
        stdout, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr
        outputs.append(json.loads(stdout.strip().splitlines()[-1]))
    expected = _one_process(rows)
    for case in cases:
        for rank in range(2):
            assert outputs[rank][case] == pytest.approx(expected, rel=1e-12), (case, rank)
