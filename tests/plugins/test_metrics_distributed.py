"""Every metric of issue 4 on 2 gloo ranks equals one process over the same rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

from tzrun_plugins.metrics.auc import AUC
from tzrun_plugins.metrics.grouped_auc import GroupedAUC
from tzrun_plugins.metrics.grouped_xauc import GroupedXAUC
from tzrun_plugins.metrics.pointwise import MAE, MSE, RMSE, Accuracy, Calibration, LogLoss, NormalizedEntropy
from tzrun_plugins.metrics.retrieval import HitRateAtK, RecallAtK
from tzrun_plugins.metrics.sid import RelativeL1, UniqueRatio
from tzrun_plugins.metrics.xauc import XAUC

_N = 2400


def _rows() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    p = torch.round(torch.rand(_N, generator=g) * 20) / 20
    rows = {
        "p": p,
        "y": (torch.rand(_N, generator=g) < p).float(),
        "t": torch.randint(0, 6, (_N,), generator=g).float() + p,  # regression target, tied
        "w": torch.rand(_N, generator=g) * 2,
        "g": torch.randint(0, 97, (_N,), generator=g) * 1_000_003,
        "scores": torch.randint(0, 4, (_N, 12), generator=g).float(),
        "index": torch.randint(0, 12, (_N,), generator=g).float(),
        "codes": torch.randint(0, 3, (_N, 2), generator=g),
    }
    rows["w"][::11] = 0.0  # padding
    dup = torch.arange(300)  # duplicated rows: the copies go to the other rank
    rows = {k: torch.cat([v, v[dup]]) for k, v in rows.items()}
    return rows


def _owner() -> torch.Tensor:
    owner = torch.randint(0, 2, (_N + 300,), generator=torch.Generator().manual_seed(1))
    owner[_N:] = 1 - owner[:300]
    return owner


# name -> (factory, feed(metric, rows)) ; rows are one rank's (or all) rows
_METRICS: dict[str, tuple[Callable[[], Any], Callable[[Any, dict[str, torch.Tensor]], None]]] = {
    "grouped_auc": (GroupedAUC, lambda m, r: m.update(r["p"], r["y"], r["w"], r["g"])),
    "grouped_auc_by_size": (lambda: GroupedAUC(weight_by_size=True), lambda m, r: m.update(r["p"], r["y"], r["w"], r["g"])),
    "xauc": (XAUC, lambda m, r: m.update(r["p"], r["t"], r["w"])),
    "xauc_sampled": (lambda: XAUC(mode="sampled", num_samples=50_000, seed=5), lambda m, r: m.update(r["p"], r["t"], r["w"])),
    "grouped_xauc": (GroupedXAUC, lambda m, r: m.update(r["p"], r["t"], r["w"], r["g"])),
    "xauc_ties_wrong": (lambda: XAUC(ties="wrong"), lambda m, r: m.update(r["p"], r["t"], r["w"])),
    "grouped_xauc_ties_wrong": (lambda: GroupedXAUC(ties="wrong"), lambda m, r: m.update(r["p"], r["t"], r["w"], r["g"])),
    "accuracy_ge": (lambda: Accuracy(compare=">="), lambda m, r: m.update(r["p"], r["y"], r["w"])),
    "relative_l1": (RelativeL1, lambda m, r: m.update(torch.stack([r["p"], r["t"]], 1), torch.stack([r["t"], r["p"]], 1), r["w"])),
    "log_loss": (LogLoss, lambda m, r: m.update(r["p"], r["y"], r["w"])),
    "normalized_entropy": (NormalizedEntropy, lambda m, r: m.update(r["p"], r["y"], r["w"])),
    "calibration": (Calibration, lambda m, r: m.update(r["p"], r["y"], r["w"])),
    "accuracy": (Accuracy, lambda m, r: m.update(r["p"], r["y"], r["w"])),
    "mae": (MAE, lambda m, r: m.update(r["p"], r["t"], r["w"])),
    "mse": (MSE, lambda m, r: m.update(r["p"], r["t"], r["w"])),
    "rmse": (RMSE, lambda m, r: m.update(r["p"], r["t"], r["w"])),
    "recall_at_k": (lambda: RecallAtK(k=3), lambda m, r: m.update(r["scores"], r["index"], r["w"])),
    "hit_rate_at_k": (lambda: HitRateAtK(k=3), lambda m, r: m.update(r["scores"], r["index"], r["w"])),
}


def _split(rows: dict[str, torch.Tensor], mask: torch.Tensor, parts: int) -> list[dict[str, torch.Tensor]]:
    chunks = torch.tensor_split(torch.nonzero(mask).reshape(-1), parts)
    return [{k: v[c] for k, v in rows.items()} for c in chunks]


def _worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        rows, owner = _rows(), _owner()
        values: dict[str, float] = {}
        for name, (make, feed) in _METRICS.items():
            metric = make()
            for batch in _split(rows, owner == rank, 3 + rank):  # uneven batches
                feed(metric, batch)
            values[name] = float(metric.compute())
        only_rank0 = GroupedAUC()  # rank 1's group-key state stays empty
        if rank == 0:
            only_rank0.update(rows["p"], rows["y"], rows["w"], rows["g"])
        values["grouped_auc_one_rank"] = float(only_rank0.compute())
        in_batch = _in_batch_metrics()
        decayed = _train_auc()
        for batch in _split(rows, owner == rank, 4):
            for name, metric in in_batch.items():
                _feed_batch(name, metric, batch)
            decayed.update(_step_output(batch))
        values.update({name: float(metric.compute()) for name, metric in in_batch.items()})
        values["decayed_train_auc"] = decayed.values["auc"]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(values))
    finally:
        dist.destroy_process_group()


def _in_batch_metrics() -> dict[str, Any]:
    """Metrics whose value depends on the batches (the same batches on ranks or in one process)."""
    return {
        "xauc_in_batch": XAUC(mode="in_batch"),
        "xauc_in_batch_torcheasyrec": XAUC(mode="in_batch", ties="wrong", averaging="per_batch"),
        "unique_ratio": UniqueRatio(),
    }


def _feed_batch(name: str, metric: Any, batch: dict[str, torch.Tensor]) -> None:
    if name == "unique_ratio":
        metric.update(batch["codes"], batch["t"], batch["w"])
    else:
        metric.update(batch["p"], batch["t"], batch["w"])


def _train_auc():
    """The core's ``[[train_metrics]]`` tracker with one decayed ``auc`` (rate 0.7, window 2)."""
    from tzrun.config.schema import Component, TrainMetricFields
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries
    from tzrun.runner.slots import MetricSlot
    from tzrun.runner.train_metrics import TrainMetrics
    from tzrun_plugins.metrics.options import AUCConfig

    component = Component("auc", {}, AUCConfig(), TrainMetricFields(decay_rate=0.7, decay_step=2))
    slot = MetricSlot("auc", "probs", "label", component)
    return TrainMetrics([slot], collect_registries(make_plugin_manager()), torch.device("cpu"))


def _step_output(batch):
    from types import SimpleNamespace

    return SimpleNamespace(outputs={"probs": batch["p"]}, labels={"label": batch["y"]}, weights=batch["w"], groups={})


@pytest.mark.multiproc
def test_two_ranks_equal_one_process(tmp_path: Path) -> None:
    from tests.warm_ranks import warm_spawn

    warm_spawn(_worker, (2, str(tmp_path / "store"), str(tmp_path)))
    rows, owner = _rows(), _owner()
    expected: dict[str, float] = {}
    for name, (make, feed) in _METRICS.items():
        metric = make()
        feed(metric, rows)
        expected[name] = float(metric.compute())
    expected["grouped_auc_one_rank"] = expected["grouped_auc"]
    in_batch = _in_batch_metrics()
    decayed = _train_auc()
    per_rank = [_split(rows, owner == r, 4) for r in range(2)]
    for step in range(4):
        for r in range(2):
            b = per_rank[r][step]
            for name, metric in in_batch.items():
                _feed_batch(name, metric, b)  # the same batches, in one process
        both = {k: torch.cat([per_rank[0][step][k], per_rank[1][step][k]]) for k in rows}
        decayed.update(_step_output(both))  # a step's rows of both ranks
    expected.update({name: float(metric.compute()) for name, metric in in_batch.items()})
    expected["decayed_train_auc"] = decayed.values["auc"]

    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert set(got) == set(expected)
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, abs=1e-9), f"rank {rank}: {name}"
    # the per-rank values differ: the test would catch a metric that does not gather
    half = GroupedAUC()
    half.update(rows["p"][owner == 0], rows["y"][owner == 0], rows["w"][owner == 0], rows["g"][owner == 0])
    assert abs(float(half.compute()) - expected["grouped_auc"]) > 1e-4
