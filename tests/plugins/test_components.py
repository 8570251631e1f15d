"""First-party optimizers and losses against torch's own classes and direct formulas."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tzrun.plugins import make_plugin_manager
from tzrun.registry import collect_registries
from tzrun.testing import load_config_text
from tests.core.test_config import MINIMAL


@pytest.fixture(scope="module")
def registries():
    return collect_registries(make_plugin_manager())


@pytest.mark.parametrize(
    ("name", "cls", "expected"),
    [
        ("sgd", torch.optim.SGD, {"lr": 0.5, "momentum": 0.0, "weight_decay": 0.0}),
        ("adam", torch.optim.Adam, {"lr": 0.5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}),
        ("adamw", torch.optim.AdamW, {"lr": 0.5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}),
        ("adagrad", torch.optim.Adagrad, {"lr": 0.5, "eps": 1e-10, "initial_accumulator_value": 0.0}),
    ],
)
def test_dense_optimizers_are_torch_classes_with_torch_defaults(registries, name, cls, expected):
    cfg, _ = load_config_text(MINIMAL, overrides=[f'train.dense_optimizer={{type="{name}", lr=0.5}}'])
    entry = registries["dense_optimizer"].get(name, "x")
    optimizer = entry.build(cfg.train.dense_optimizer.config, [torch.nn.Parameter(torch.zeros(3))])
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert {k: group[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("name", "fbgemm", "kwargs"),
    [
        ("sgd", "EXACT_SGD", {"lr": 0.5}),
        ("adagrad", "EXACT_ADAGRAD", {"lr": 0.5, "eps": 1e-8}),
        ("rowwise_adagrad", "EXACT_ROWWISE_ADAGRAD", {"lr": 0.5, "eps": 1e-8}),
    ],
)
def test_sparse_optimizer_specs_map_to_fbgemm_types_torchrec_fuses(registries, name, fbgemm, kwargs):
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    cfg, _ = load_config_text(MINIMAL, overrides=[f'train.sparse_optimizer={{type="{name}", lr=0.5}}'])
    spec = registries["sparse_optimizer"].get(name, "x").build(cfg.train.sparse_optimizer.config)
    assert spec.fbgemm_type == fbgemm and spec.cpu_supported
    assert optimizer_type_to_emb_opt_type(spec.optimizer_class).name == fbgemm
    assert dict(spec.kwargs) == kwargs


def test_rowwise_adagrad_weight_decay_is_l2(registries):
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

    cfg, _ = load_config_text(MINIMAL, overrides=['train.sparse_optimizer={type="rowwise_adagrad", lr=0.5, weight_decay=0.1}'])
    spec = registries["sparse_optimizer"].get("rowwise_adagrad", "x").build(cfg.train.sparse_optimizer.config)
    assert spec.kwargs["weight_decay"] == 0.1 and spec.kwargs["weight_decay_mode"] == WeightDecayMode.L2


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_bce_is_the_weighted_mean_and_ignores_padding(registries, smoothing):
    cfg, _ = load_config_text(MINIMAL, overrides=[f"losses[0].label_smoothing={smoothing}"])
    loss = registries["loss"].get("binary_cross_entropy", "x").build(cfg.losses[0].config)
    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(8, generator=gen), torch.randint(0, 2, (8,), generator=gen).float()
    weights = torch.tensor([1.0, 2.0, 0.5, 1.0, 0.0, 3.0, 1.0, 1.0])
    target = labels * (1 - smoothing) + 0.5 * smoothing
    per_row = -(target * torch.log(torch.sigmoid(logits)) + (1 - target) * torch.log(1 - torch.sigmoid(logits)))
    expected = (per_row * weights).sum() / weights.sum()
    assert loss(logits, labels, weights).item() == pytest.approx(expected.item(), rel=1e-6)
    # padding rows (weight 0) change nothing, whatever they hold
    padded = loss(torch.cat([logits, torch.tensor([50.0])]), torch.cat([labels, torch.tensor([0.0])]), torch.cat([weights, torch.tensor([0.0])]))
    assert padded.item() == pytest.approx(expected.item(), rel=1e-6)
    # an all-padding batch has loss 0, not NaN
    assert loss(logits[:1], labels[:1], torch.zeros(1)).item() == 0.0
    if smoothing == 0.0:  # unit weights: torch's own mean BCE
        assert loss(logits, labels, torch.ones(8)).item() == pytest.approx(
            F.binary_cross_entropy_with_logits(logits, labels).item(), rel=1e-6)
