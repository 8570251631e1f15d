"""First-party optimizers and losses against torch's own classes and direct formulas."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
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
    ("toml", "reference"),
    [
        ('{type="sgd", lr=0.1, momentum=0.9, dampening=0.0, nesterov=true, weight_decay=0.01}',
         lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.0, nesterov=True, weight_decay=0.01)),
        ('{type="sgd", lr=0.1, momentum=0.5, dampening=0.3, fused=true}',
         lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, dampening=0.3)),
        ('{type="adagrad", lr=0.1, lr_decay=0.1, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-6, foreach=false}',
         lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.1, weight_decay=0.01, initial_accumulator_value=0.1, eps=1e-6)),
        ('{type="adam", lr=0.1, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.01, amsgrad=true}',
         lambda p: torch.optim.Adam(p, lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.01, amsgrad=True)),
        ('{type="adamw", lr=0.1, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, fused=true}',
         lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)),
        ('{type="rmsprop", lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.5, centered=true}',
         lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.01, momentum=0.5, centered=True)),
        ('{type="adadelta", lr=1.0, rho=0.95, eps=1e-5, weight_decay=0.01}',
         lambda p: torch.optim.Adadelta(p, lr=1.0, rho=0.95, eps=1e-5, weight_decay=0.01)),
    ],
)
def test_every_dense_option_reaches_torch(registries, toml, reference):
    """Three steps with every option set give the parameters torch's own optimizer gives."""
    cfg, _ = load_config_text(MINIMAL, overrides=[f"train.dense_optimizer={toml}"])
    entry = registries["dense_optimizer"].get(cfg.train.dense_optimizer.type, "x")
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(6, generator=gen)
    grads = [torch.randn(6, generator=gen) for _ in range(3)]
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    optimizers = (entry.build(cfg.train.dense_optimizer.config, [ours]), reference([theirs]))
    for grad in grads:
        for param, optimizer in zip((ours, theirs), optimizers):
            param.grad = grad.clone()
            optimizer.step()
    assert not torch.equal(ours.detach(), start)
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('{type="sgd", lr=0.1, nesterov=true}', "nesterov = true needs momentum > 0 and dampening = 0"),
        ('{type="adam", lr=0.1, fused=true, foreach=true}', "fused = true and foreach = true exclude each other"),
        ('{type="adam", lr=0.1, beta1=1.0}', "train.dense_optimizer.beta1: must be"),
        ('{type="rmsprop", lr=-1.0}', "train.dense_optimizer.lr: must be >= 0"),
    ],
)
def test_dense_option_errors_say_what_is_wrong(toml, message):
    from tzrun.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config_text(MINIMAL, overrides=[f"train.dense_optimizer={toml}"])


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
