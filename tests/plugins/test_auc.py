"""Tests for tzrun_plugins.metrics.auc: exact / binned ROC AUC, weights, padding, distributed."""

from __future__ import annotations

import warnings
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch
import torch.distributed as dist
from sklearn.metrics import roc_auc_score
from torchmetrics.classification import BinaryAUROC

from tzrun_plugins.metrics.auc import AUC, AUCConfig, binary_auc, build_auc


def _tied_data(n: int, seed: int, decimals: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities rounded to ``decimals`` (many ties) and labels correlated with them."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.rand(n, generator=g)
    target = (torch.rand(n, generator=g) < raw).long()
    scale = 10**decimals
    preds = torch.round(raw * scale) / scale
    return preds, target


def _sk(preds: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> float:
    sw = None if weight is None else weight.double().numpy()
    return float(roc_auc_score(target.numpy(), preds.double().numpy(), sample_weight=sw))


# --------------------------------------------------------------------------- exact mode


@pytest.mark.parametrize(("n", "seed", "decimals"), [(50, 0, 1), (1000, 1, 2), (20000, 2, 2), (5000, 3, 0)])
def test_matches_sklearn_with_ties(n: int, seed: int, decimals: int) -> None:
    preds, target = _tied_data(n, seed, decimals)
    assert len(torch.unique(preds)) < n  # there really are ties
    expected = _sk(preds, target)
    assert binary_auc(preds, target) == pytest.approx(expected, abs=1e-9)
    metric = AUC()
    metric.update(preds, target)
    value = metric.compute()
    assert value.dtype == torch.float64 and value.ndim == 0
    assert float(value) == pytest.approx(expected, abs=1e-9)


def test_all_tied_is_one_half() -> None:
    preds = torch.full((100,), 0.3)
    target = torch.arange(100) % 2
    assert binary_auc(preds, target) == pytest.approx(0.5, abs=1e-12)


def test_perfect_and_inverted() -> None:
    preds = torch.tensor([0.1, 0.2, 0.8, 0.9])
    assert binary_auc(preds, torch.tensor([0, 0, 1, 1])) == pytest.approx(1.0, abs=1e-12)
    assert binary_auc(preds, torch.tensor([1, 1, 0, 0])) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_sklearn_weighted(seed: int) -> None:
    preds, target = _tied_data(5000, seed)
    g = torch.Generator().manual_seed(100 + seed)
    weight = torch.rand(5000, generator=g) * 3
    expected = _sk(preds, target, weight)
    assert binary_auc(preds, target, weight) == pytest.approx(expected, abs=1e-9)
    metric = AUC()
    metric.update(preds, target, weight)
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-9)
    # Weighting really changes the value.
    assert abs(expected - _sk(preds, target)) > 1e-6


def test_integer_weights_equal_row_repetition() -> None:
    preds, target = _tied_data(300, 4, decimals=1)
    reps = torch.randint(1, 4, (300,), generator=torch.Generator().manual_seed(5))
    repeated = binary_auc(preds.repeat_interleave(reps), target.repeat_interleave(reps))
    assert binary_auc(preds, target, reps.float()) == pytest.approx(repeated, abs=1e-12)


def test_weight_zero_padding_has_no_effect() -> None:
    preds, target = _tied_data(3000, 6)
    weight = torch.rand(3000, generator=torch.Generator().manual_seed(7)) + 0.1
    reference = binary_auc(preds, target, weight)

    # Padding rows: random preds (some equal to real preds, so they join tie groups), labels
    # that would even be invalid, and a NaN prediction; all with weight 0.
    pad = 1000
    g = torch.Generator().manual_seed(8)
    pad_preds = torch.round(torch.rand(pad, generator=g) * 100) / 100
    pad_preds[0] = float("nan")
    pad_target = torch.randint(0, 2, (pad,), generator=g)
    pad_target[1] = 7
    perm = torch.randperm(3000 + pad, generator=g)
    all_preds = torch.cat([preds, pad_preds])[perm]
    all_target = torch.cat([target, pad_target])[perm]
    all_weight = torch.cat([weight, torch.zeros(pad)])[perm]

    assert binary_auc(all_preds, all_target, all_weight) == pytest.approx(reference, abs=1e-12)
    metric = AUC()
    metric.update(all_preds[:1500], all_target[:1500], all_weight[:1500])
    metric.update(all_preds[1500:], all_target[1500:], all_weight[1500:])
    assert float(metric.compute()) == pytest.approx(reference, abs=1e-12)
    assert sum(p.numel() for p in metric.preds) == 3000  # padding is not even stored


def test_batched_updates_equal_one_update() -> None:
    preds, target = _tied_data(4000, 9)
    weight = torch.rand(4000, generator=torch.Generator().manual_seed(10))
    one = AUC()
    one.update(preds, target, weight)
    batched = AUC()
    for lo, hi in [(0, 1), (1, 700), (700, 701), (701, 701), (701, 2500), (2500, 4000)]:
        batched.update(preds[lo:hi], target[lo:hi], weight[lo:hi])
    assert float(batched.compute()) == pytest.approx(float(one.compute()), abs=1e-12)
    assert float(one.compute()) == pytest.approx(_sk(preds, target, weight), abs=1e-9)


def test_logits_and_probabilities_agree() -> None:
    preds, target = _tied_data(2000, 11)
    preds = preds.clamp(0.005, 0.995)
    logits = torch.logit(preds.double())
    expected = _sk(preds, target)
    assert binary_auc(logits, target) == pytest.approx(expected, abs=1e-9)
    metric = AUC()
    metric.set_dtype(torch.float64)
    metric.update(logits * 50.0, target)  # far outside [0, 1]: no sigmoid, no saturation
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-9)


def test_column_shapes_and_label_dtypes() -> None:
    preds, target = _tied_data(500, 12)
    expected = _sk(preds, target)
    assert binary_auc(preds[:, None], target[:, None]) == pytest.approx(expected, abs=1e-9)
    assert binary_auc(preds, target.bool()) == pytest.approx(expected, abs=1e-9)
    metric = AUC()
    metric.update(preds[:, None], target.float()[:, None], torch.ones(500, 1))
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-9)


def test_float64_storage_keeps_close_predictions_apart() -> None:
    # Distinct in float64 but equal in float32.
    preds = 0.5 + 1e-12 * torch.arange(200, dtype=torch.float64)
    target = (torch.arange(200) >= 100).long()
    assert binary_auc(preds, target) == pytest.approx(1.0, abs=1e-12)
    metric = AUC()
    metric.set_dtype(torch.float64)
    metric.update(preds, target)
    assert float(metric.compute()) == pytest.approx(1.0, abs=1e-12)
    default = AUC()  # float32 storage (documented): the values collapse into one tie
    default.update(preds, target)
    assert float(default.compute()) == pytest.approx(0.5, abs=1e-12)


def test_reset() -> None:
    preds, target = _tied_data(200, 13)
    metric = AUC()
    metric.update(preds, 1 - target)
    metric.reset()
    metric.update(preds, target)
    assert float(metric.compute()) == pytest.approx(_sk(preds, target), abs=1e-9)


# --------------------------------------------------------------------------- degenerate input


@pytest.mark.parametrize(
    ("preds", "target", "weight", "match"),
    [
        (torch.rand(10), torch.ones(10), None, "only positive"),
        (torch.rand(10), torch.zeros(10), None, "only negative"),
        (torch.empty(0), torch.empty(0), None, "no rows"),
        (torch.rand(4), torch.tensor([0, 1, 0, 1]), torch.tensor([1.0, 0.0, 2.0, 0.0]), "only negative"),
        (torch.rand(4), torch.tensor([0, 1, 0, 1]), torch.zeros(4), "no rows"),
    ],
)
def test_degenerate_returns_half_with_warning(
    preds: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, match: str
) -> None:
    with pytest.warns(RuntimeWarning, match=match):
        assert binary_auc(preds, target, weight) == 0.5
    metric = AUC()
    metric.update(preds, target, weight)
    with pytest.warns(RuntimeWarning, match=match):
        value = metric.compute()
    assert value.dtype == torch.float64 and float(value) == 0.5


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric AUC was called before:UserWarning")
def test_no_update_returns_half_with_warning() -> None:
    for metric in (AUC(), AUC(thresholds=10)):
        with pytest.warns(RuntimeWarning, match="no rows"):
            assert float(metric.compute()) == 0.5


def test_binned_degenerate() -> None:
    metric = AUC(thresholds=20)
    metric.update(torch.rand(10), torch.ones(10))
    with pytest.warns(RuntimeWarning, match="only positive"):
        assert float(metric.compute()) == 0.5


def test_no_warning_on_normal_input() -> None:
    preds, target = _tied_data(100, 14)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        binary_auc(preds, target)
        metric = AUC()
        metric.update(preds, target)
        metric.compute()


# --------------------------------------------------------------------------- binned mode


def _smooth_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = (torch.rand(n, generator=g) < 0.4).long()
    logits = torch.randn(n, generator=g) + 1.2 * target
    return torch.sigmoid(logits), target


def test_binned_is_close_to_exact_but_differs() -> None:
    preds, target = _smooth_data(20000, 15)
    exact = binary_auc(preds, target)
    metric = AUC(thresholds=200)
    metric.update(preds, target)
    binned = float(metric.compute())
    assert binned == pytest.approx(exact, abs=1e-2)
    assert abs(binned - exact) > 1e-7
    assert metric.compute().dtype == torch.float64


@pytest.mark.parametrize("num_thresholds", [2, 5, 100])
def test_binned_matches_torchmetrics(num_thresholds: int) -> None:
    preds, target = _smooth_data(6000, 16)
    logits = torch.logit(preds)
    ours = AUC(thresholds=num_thresholds)
    ref = BinaryAUROC(thresholds=num_thresholds)
    for batch_preds, batch_target in [(preds[:3000], target[:3000]), (logits[3000:], target[3000:])]:
        ours.update(batch_preds, batch_target)
        ref.update(batch_preds, batch_target)
    assert float(ours.compute()) == pytest.approx(float(ref.compute()), abs=1e-6)


def test_binned_weights_count_rows_and_padding_is_ignored() -> None:
    """Integer weights in binned mode equal repeating rows; weight-0 rows change nothing."""
    gen = torch.Generator().manual_seed(5)
    preds = torch.rand(500, generator=gen)
    target = (torch.rand(500, generator=gen) < preds).long()
    counts = torch.randint(0, 4, (500,), generator=gen)
    weighted = AUC(thresholds=50)
    weighted.update(preds, target, counts.double())
    repeated = AUC(thresholds=50)
    repeated.update(preds.repeat_interleave(counts), target.repeat_interleave(counts))
    assert float(weighted.compute()) == pytest.approx(float(repeated.compute()), abs=1e-12)


# --------------------------------------------------------------------------- validation and config


@pytest.mark.parametrize(
    ("preds", "target", "weight", "match"),
    [
        (torch.rand(5), torch.ones(4), None, "same shape"),
        (torch.rand(4, 2), torch.ones(4, 2), None, r"shape \[B\] or \[B, 1\]"),
        (torch.rand(2, 2, 1), torch.ones(2, 2, 1), None, r"shape \[B\] or \[B, 1\]"),
        (torch.tensor(0.5), torch.tensor(1), None, r"shape \[B\] or \[B, 1\]"),
        (torch.rand(4), torch.tensor([0, 1, 2, 1]), None, "0 or 1"),
        (torch.rand(4), torch.tensor([0.0, 1.0, 0.5, 1.0]), None, "0 or 1"),
        (torch.rand(4), torch.tensor([0, 1, -1, 1]), None, "0 or 1"),
        (torch.tensor([0.1, float("nan"), 0.3, 0.4]), torch.tensor([0, 1, 0, 1]), None, "NaN"),
        (torch.rand(4), torch.tensor([0, 1, 0, 1]), torch.tensor([1.0, -1.0, 1.0, 1.0]), "non-negative"),
        (torch.rand(4), torch.tensor([0, 1, 0, 1]), torch.tensor([1.0, float("inf"), 1.0, 1.0]), "finite"),
        (torch.rand(4), torch.tensor([0, 1, 0, 1]), torch.ones(3), "weight must have the same shape"),
    ],
)
def test_validation_errors(
    preds: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        binary_auc(preds, target, weight)
    with pytest.raises(ValueError, match=match):
        AUC().update(preds, target, weight)
    if weight is None:
        with pytest.raises(ValueError, match=match):
            AUC(thresholds=10).update(preds, target)


@pytest.mark.parametrize("bad", [0, 1, -5, 2.5, True, "100"])
def test_bad_thresholds(bad: object) -> None:
    with pytest.raises(ValueError, match="thresholds"):
        AUC(thresholds=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="thresholds"):
        AUCConfig(thresholds=bad)  # type: ignore[arg-type]


def test_config_and_builder() -> None:
    cfg = AUCConfig()
    assert cfg.thresholds is None
    metric = build_auc(cfg)
    assert isinstance(metric, AUC) and metric.thresholds is None
    binned = build_auc(AUCConfig(thresholds=50))
    assert binned.thresholds == 50
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.thresholds = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- distributed


_DIST_N = 3001
_DIST_SPLIT = 1234  # rank 0 gets rows [0, 1234), rank 1 gets [1234, 3001)


def _dist_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    preds, target = _tied_data(_DIST_N, 17, decimals=1)  # 11 distinct values: ties straddle ranks
    weight = torch.rand(_DIST_N, generator=torch.Generator().manual_seed(18)) * 2
    weight[::13] = 0.0  # some padding rows
    return preds, target, weight


def _dist_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        preds, target, weight = _dist_data()
        lo, hi = (0, _DIST_SPLIT) if rank == 0 else (_DIST_SPLIT, _DIST_N)
        mid = (lo + hi) // 2 + 17 * rank  # uneven batch sizes too

        weighted = AUC()
        unweighted = AUC()
        binned = AUC(thresholds=50)
        only_rank0 = AUC()  # rank 1 never updates: its states are empty
        for a, b in [(lo, mid), (mid, hi)]:
            weighted.update(preds[a:b], target[a:b], weight[a:b])
            unweighted.update(preds[a:b], target[a:b])
            binned.update(preds[a:b], target[a:b])
        if rank == 0:
            only_rank0.update(preds, target, weight)

        values = [float(m.compute()) for m in (weighted, unweighted, binned, only_rank0)]
        Path(out_dir, f"rank{rank}.txt").write_text(" ".join(repr(v) for v in values))
    finally:
        dist.destroy_process_group()


def test_distributed_equals_single_process(tmp_path: Path) -> None:
    world_size = 2
    from tests.warm_ranks import warm_spawn

    warm_spawn(_dist_worker, (world_size, str(tmp_path / "store"), str(tmp_path)), nprocs=world_size)
    preds, target, weight = _dist_data()
    single_binned = AUC(thresholds=50)
    single_binned.update(preds, target)
    expected = [
        _sk(preds, target, weight),
        _sk(preds, target),
        float(single_binned.compute()),
        _sk(preds, target, weight),
    ]
    for rank in range(world_size):
        values = [float(v) for v in (tmp_path / f"rank{rank}.txt").read_text().split()]
        assert values == pytest.approx(expected, abs=1e-9), f"rank {rank}"
    # Per-rank AUCs differ from the global one: the test would catch averaging.
    lo_auc = _sk(preds[:_DIST_SPLIT], target[:_DIST_SPLIT], weight[:_DIST_SPLIT])
    hi_auc = _sk(preds[_DIST_SPLIT:], target[_DIST_SPLIT:], weight[_DIST_SPLIT:])
    assert abs(lo_auc - expected[0]) > 1e-4 and abs(hi_auc - expected[0]) > 1e-4
    assert abs((lo_auc + hi_auc) / 2 - expected[0]) > 1e-6
    assert np.isfinite(expected).all()
