"""The GPU suite's fused-optimizer harness and references (tests/gpu/fused.py), checked on CPU.

tests/gpu compares FBGEMM's CUDA kernels with these references; here the harness runs on
FBGEMM's CPU kernels (the optimizers that have one) and each by-hand reference is checked
against a plain torch optimizer where the two rules coincide, so the GPU tests do not rest on
untested code.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.gpu import fused
from tests.plugins.test_sparse_optimizers import process_group  # noqa: F401  (a one-process gloo group, module-wide)

#: the GPU suite's cases that FBGEMM's CPU kernels run as they are; rowwise_adagrad without its
#: weight decay, which FBGEMM's CPU kernel skips on a table one feature reads (a documented gap,
#: tests/plugins/test_sparse_optimizers.py; CUDA applies it)
CPU_CASES = {
    "sgd": fused.CASES["sgd"],
    "adagrad": fused.CASES["adagrad"],
    "rowwise_adagrad": "lr = 0.1, eps = 0.1",
    "ema_rowwise_adagrad": fused.CASES["ema_rowwise_adagrad"],
}




def test_every_registered_sparse_optimizer_has_a_case_and_a_reference():
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    registered = set(collect_registries(make_plugin_manager())["sparse_optimizer"].names())
    assert registered == set(fused.CASES) == set(fused.REFERENCES)


@pytest.mark.parametrize("name", sorted(CPU_CASES))
def test_the_harness_on_fbgemms_cpu_kernels_matches_the_reference(process_group, name):
    cfg, spec = fused.spec_for(name, CPU_CASES[name])
    actual = fused.fused_train(spec, torch.device("cpu"))
    assert not torch.allclose(actual, fused.W0, atol=1e-3)  # it trained
    torch.testing.assert_close(actual.double(), fused.reference(name, cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(fused.CASES))
def test_each_case_sets_options_that_change_the_rule(name):
    """A case whose options the spec dropped would still match a reference built with
    defaults; the cases' values differ from the defaults, and the reference moves with them."""
    cfg, spec = fused.spec_for(name, fused.CASES[name])
    default_cfg, _ = fused.spec_for(name, "lr = 0.01")
    assert spec.kwargs["lr"] == cfg.lr != default_cfg.lr
    assert not torch.allclose(fused.reference(name, cfg), fused.reference(name, default_cfg), atol=1e-4)


def _row_constant_magnitude_grads() -> list[torch.Tensor]:
    """Gradients whose elements have one magnitude per row: a row's mean of g * g is then
    each element's g * g, so the row-wise rules equal the element-wise ones."""
    out = []
    for step in range(fused.STEPS):
        gen = torch.Generator().manual_seed(100 + step)
        magnitude = torch.rand(fused.ROWS, 1, generator=gen) + 0.5
        sign = torch.randint(0, 2, (fused.ROWS, fused.DIM), generator=gen) * 2 - 1
        out.append(magnitude * sign)
    return out


def test_rowwise_adagrad_reference_is_torch_adagrad_when_the_row_rule_is_the_element_rule():
    cfg, _ = fused.spec_for("rowwise_adagrad", "lr = 0.1, eps = 0.1, initial_accumulator_value = 0.3")
    grads = _row_constant_magnitude_grads()
    expected = fused.torch_optimizer_reference(
        lambda p: torch.optim.Adagrad(p, lr=0.1, eps=0.1, initial_accumulator_value=0.3), grads=grads
    )
    torch.testing.assert_close(fused.rowwise_adagrad_reference(cfg, grads=grads), expected)
    # and with the general gradients they differ: the reference is row-wise
    assert not torch.allclose(fused.rowwise_adagrad_reference(cfg), fused.torch_optimizer_reference(
        lambda p: torch.optim.Adagrad(p, lr=0.1, eps=0.1, initial_accumulator_value=0.3)), atol=1e-4)


@pytest.mark.parametrize("mode", ["l2", "decoupled"])
def test_rowwise_adagrad_reference_matches_a_hand_computation_of_one_row(mode):
    cfg, _ = fused.spec_for("rowwise_adagrad", f'lr = 0.1, eps = 0.1, weight_decay = 0.5, weight_decay_mode = "{mode}"')
    w, h = [float(x) for x in fused.W0[2]], 0.0
    for grad in fused.GRADS:
        g = [float(x) for x in grad[2]]
        decayed = [gi + 0.5 * wi for gi, wi in zip(g, w)] if mode == "l2" else g
        h += sum(x * x for x in decayed) / len(w)
        m = 0.1 / (math.sqrt(h) + 0.1)
        c = 1 - m * 0.5 if mode == "l2" else 1 - 0.1 * 0.5
        w = [c * wi - m * gi for wi, gi in zip(w, g)]
    torch.testing.assert_close(fused.rowwise_adagrad_reference(cfg)[2], torch.tensor(w, dtype=torch.float64))


@pytest.mark.parametrize(("lamb", "name"), [(False, "partial_rowwise_adam"), (True, "partial_rowwise_lamb")])
def test_partial_rowwise_references_are_adamw_and_lamb_when_the_row_rule_is_the_element_rule(lamb, name):
    from tzrun_plugins.optim.torch_equivalents import FbgemmLamb

    cfg, _ = fused.spec_for(name, fused.CASES[name])
    grads = _row_constant_magnitude_grads()
    if lamb:
        make = lambda p: FbgemmLamb(p, lr=cfg.lr, eps=cfg.eps, beta1=cfg.beta1, beta2=cfg.beta2,  # noqa: E731
                                    weight_decay=cfg.weight_decay)
    else:
        make = lambda p: torch.optim.AdamW(p, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,  # noqa: E731
                                           weight_decay=cfg.weight_decay)
    torch.testing.assert_close(
        fused.partial_rowwise_reference(cfg, lamb, grads=grads), fused.torch_optimizer_reference(make, grads=grads)
    )


@pytest.mark.parametrize(("lamb", "name"), [(False, "partial_rowwise_adam"), (True, "partial_rowwise_lamb")])
def test_partial_rowwise_references_agree_with_tzrec_runs_cpu_fallbacks(lamb, name):
    """Two independent writings of FBGEMM's rule: the reference and the optimizer that trains
    these tables data-parallel on CPU (``spec.torch_fallback``)."""
    cfg, spec = fused.spec_for(name, fused.CASES[name])
    torch.testing.assert_close(
        fused.partial_rowwise_reference(cfg, lamb), fused.torch_optimizer_reference(spec.torch_fallback)
    )


def test_ema_reference_is_rowwise_adagrad_plus_the_soft_update():
    cfg, _ = fused.spec_for("ema_rowwise_adagrad", "lr = 0.1, eps = 0.1, ema_every = 2, ema_coef = 0.0")
    plain, _ = fused.spec_for("rowwise_adagrad", "lr = 0.1, eps = 0.1")
    torch.testing.assert_close(fused.ema_rowwise_adagrad_reference(cfg), fused.rowwise_adagrad_reference(plain))
    moved, _ = fused.spec_for("ema_rowwise_adagrad", "lr = 0.0, ema_every = 2, ema_coef = 0.25")
    w = fused.ema_rowwise_adagrad_reference(moved)  # lr 0: only step 2's EMA moves the slow half
    half = fused.DIM // 2
    w0 = fused.W0.double()
    torch.testing.assert_close(w[:, :half], w0[:, :half])
    torch.testing.assert_close(w[:, half:], w0[:, half:] + 0.25 * (w0[:, :half] - w0[:, half:]))
