"""The torch equivalents of FBGEMM's GPU-only sparse optimizers, against FBGEMM's formulas.

Each expected value is computed here with plain python floats, row by row and element by
element, as ``fbgemm_gpu/codegen/genscript/optimizers.py`` (pytorch/FBGEMM) writes the update:
``adam()``, ``lamb()``, ``lars_sgd()``, ``partial_rowwise_adam()``, ``partial_rowwise_lamb()``.
"""

from __future__ import annotations

import math

import pytest
import torch

from tzrun_plugins.optim import sparse, torch_equivalents

# Three rows of width 3: an ordinary row, a row whose gradient is zero on the first step (an
# untouched row of a data-parallel table), and a row with one large gradient (for clipping).
W0 = [[0.5, -1.0, 0.25], [0.3, 0.2, -0.1], [-0.4, 0.6, 0.8]]
GRADS = [
    [[0.1, -0.2, 0.3], [0.0, 0.0, 0.0], [2.5, -0.1, 0.05]],
    [[-0.3, 0.1, 0.2], [0.2, -0.1, 0.4], [-3.0, 0.2, 0.1]],
    [[0.05, 0.05, -0.4], [0.1, 0.3, -0.2], [0.5, 0.5, -1.5]],
]


def clip(g: float, max_gradient: float | None) -> float:
    return g if max_gradient is None else max(-max_gradient, min(max_gradient, g))


def norm(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs))


def fbgemm_moments(lr, eps, beta1, beta2, weight_decay, trust_ratio=False, rowwise=False, max_gradient=None):
    """The weights after each step under ``adam()`` / ``partial_rowwise_adam()``, or with
    ``trust_ratio`` ``lamb()`` / ``partial_rowwise_lamb()``. Both compute, per element,
    ``r = m_hat / (sqrt(v_hat) + eps) + weight_decay * w``; Adam steps ``w -= lr * r``, LAMB
    ``w -= lr * |w| / |r| * r`` per row (no step for a zero ``r``, where FBGEMM's is 0/0)."""
    w = [row[:] for row in W0]
    m = [[0.0] * len(row) for row in w]
    v = [0.0 if rowwise else [0.0] * len(row) for row in w]
    out = []
    for t, grads in enumerate(GRADS, start=1):
        for i, row in enumerate(w):
            g = [clip(x, max_gradient) for x in grads[i]]
            if rowwise:
                v[i] = beta2 * v[i] + (1 - beta2) * sum(x * x for x in g) / len(g)
            r = []
            for d in range(len(row)):
                m[i][d] = beta1 * m[i][d] + (1 - beta1) * g[d]
                if rowwise:
                    second = v[i]
                else:
                    v[i][d] = beta2 * v[i][d] + (1 - beta2) * g[d] * g[d]
                    second = v[i][d]
                r.append(m[i][d] / (1 - beta1**t) / (math.sqrt(second / (1 - beta2**t)) + eps) + weight_decay * row[d])
            ratio = (norm(row) / norm(r) if norm(r) > 0 else 0.0) if trust_ratio else 1.0
            for d in range(len(row)):
                row[d] -= lr * ratio * r[d]
        out.append([row[:] for row in w])
    return out


def fbgemm_lars(lr, eta, momentum, weight_decay, max_gradient=None):
    """``lars_sgd()``: the weights after each step (a zero denominator takes rate 0)."""
    w = [row[:] for row in W0]
    m = [[0.0] * len(row) for row in w]
    out = []
    for grads in GRADS:
        for i, row in enumerate(w):
            g = [clip(x, max_gradient) for x in grads[i]]
            denominator = norm(g) + weight_decay * norm(row)
            rate = lr * eta * norm(row) / denominator if denominator > 0 else 0.0
            for d in range(len(row)):
                m[i][d] = momentum * m[i][d] + rate * (g[d] + weight_decay * row[d])
                row[d] -= m[i][d]
        out.append([row[:] for row in w])
    return out


def run(make_optimizer) -> list[list[list[float]]]:
    """The weights after each of the steps of ``GRADS`` (float64, so python floats compare)."""
    weight = torch.nn.Parameter(torch.tensor(W0, dtype=torch.float64))
    optimizer = make_optimizer([weight])
    out = []
    for grads in GRADS:
        weight.grad = torch.tensor(grads, dtype=torch.float64)
        optimizer.step()
        out.append(weight.detach().tolist())
    return out


def assert_close(actual, expected):
    assert torch.tensor(actual) == pytest.approx(torch.tensor(expected), rel=1e-9, abs=1e-12)


MOMENTS = {"lr": 0.05, "eps": 1e-3, "beta1": 0.8, "beta2": 0.95}


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fbgemm_adam_is_adamw_and_the_spec_falls_back_to_it(weight_decay):
    spec = sparse.build_adam(sparse.SparseAdamConfig(**MOMENTS, weight_decay=weight_decay))
    weight = torch.nn.Parameter(torch.zeros(3, 3))
    assert type(spec.torch_fallback([weight])) is torch.optim.AdamW
    adamw = lambda params: torch.optim.AdamW(params, lr=0.05, betas=(0.8, 0.95), eps=1e-3, weight_decay=weight_decay)
    assert_close(run(adamw), fbgemm_moments(**MOMENTS, weight_decay=weight_decay))
    assert_close(run(spec.torch_fallback), fbgemm_moments(**MOMENTS, weight_decay=weight_decay))


def test_clipped_adamw_clamps_the_gradient_by_value_first():
    spec = sparse.build_adam(sparse.SparseAdamConfig(**MOMENTS, weight_decay=0.1, gradient_clipping=True, max_gradient=1.0))
    assert type(spec.torch_fallback([torch.nn.Parameter(torch.zeros(1))])) is torch_equivalents.ClippedAdamW
    assert_close(run(spec.torch_fallback), fbgemm_moments(**MOMENTS, weight_decay=0.1, max_gradient=1.0))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_partial_rowwise_adam_keeps_one_second_moment_per_row(weight_decay):
    make = lambda params: torch_equivalents.FbgemmPartialRowWiseAdam(params, **MOMENTS, weight_decay=weight_decay)
    assert_close(run(make), fbgemm_moments(**MOMENTS, weight_decay=weight_decay, rowwise=True))
    weight = torch.nn.Parameter(torch.zeros(3, 3))
    weight.grad = torch.ones(3, 3)
    optimizer = make([weight])
    optimizer.step()
    assert optimizer.state[weight]["momentum2"].shape == (3,)
    assert optimizer.state[weight]["momentum1"].shape == (3, 3)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_lamb_scales_each_row_by_its_trust_ratio(weight_decay):
    make = lambda params: torch_equivalents.FbgemmLamb(params, **MOMENTS, weight_decay=weight_decay)
    expected = fbgemm_moments(**MOMENTS, weight_decay=weight_decay, trust_ratio=True)
    assert_close(run(make), expected)
    if weight_decay == 0.0:  # the row with a zero first gradient stays put instead of turning NaN
        assert expected[0][1] == W0[1]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_partial_rowwise_lamb(weight_decay):
    make = lambda params: torch_equivalents.FbgemmPartialRowWiseLamb(params, **MOMENTS, weight_decay=weight_decay)
    assert_close(run(make), fbgemm_moments(**MOMENTS, weight_decay=weight_decay, trust_ratio=True, rowwise=True))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_lars_sgd_adapts_the_rate_per_row(weight_decay):
    make = lambda params: torch_equivalents.FbgemmLarsSGD(params, lr=0.5, eta=0.01, momentum=0.7, weight_decay=weight_decay)
    assert_close(run(make), fbgemm_lars(lr=0.5, eta=0.01, momentum=0.7, weight_decay=weight_decay))


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: torch_equivalents.FbgemmLamb(p, **MOMENTS, gradient_clipping=True, max_gradient=1.0),
         lambda: fbgemm_moments(**MOMENTS, weight_decay=0.0, trust_ratio=True, max_gradient=1.0)),
        (lambda p: torch_equivalents.FbgemmPartialRowWiseAdam(p, **MOMENTS, gradient_clipping=True, max_gradient=1.0),
         lambda: fbgemm_moments(**MOMENTS, weight_decay=0.0, rowwise=True, max_gradient=1.0)),
        (lambda p: torch_equivalents.FbgemmLarsSGD(p, lr=0.5, eta=0.01, gradient_clipping=True, max_gradient=1.0),
         lambda: fbgemm_lars(lr=0.5, eta=0.01, momentum=0.9, weight_decay=0.0, max_gradient=1.0)),
    ],
    ids=["lamb", "partial_rowwise_adam", "lars_sgd"],
)
def test_gradient_clipping_clamps_each_element(make, expected):
    assert_close(run(make), expected())


@pytest.mark.parametrize(
    ("build", "config", "cls"),
    [
        (sparse.build_lamb, sparse.SparseLambConfig, "FbgemmLamb"),
        (sparse.build_lars_sgd, sparse.SparseLarsSGDConfig, "FbgemmLarsSGD"),
        (sparse.build_partial_rowwise_adam, sparse.SparsePartialRowWiseAdamConfig, "FbgemmPartialRowWiseAdam"),
        (sparse.build_partial_rowwise_lamb, sparse.SparsePartialRowWiseLambConfig, "FbgemmPartialRowWiseLamb"),
    ],
)
def test_fallbacks_carry_every_option_of_the_spec(build, config, cls):
    spec = build(config(lr=0.3, weight_decay=0.01, gradient_clipping=True, max_gradient=2.0))
    optimizer = spec.torch_fallback([torch.nn.Parameter(torch.zeros(2, 2))])
    assert type(optimizer) is getattr(torch_equivalents, cls)
    group = optimizer.param_groups[0]
    assert {k: group[k] for k in spec.kwargs} == dict(spec.kwargs)
