"""The ``pareto`` loss weighting: its weights are the minimum of ‖Σ w_i g_i‖² over {Σ w = 1,
w >= min_weights} (checked against a brute-force search and an independent solver), ``pe_ltr``
is TorchEasyRec's algorithm, and its options are checked with TOML paths."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import minimize, nnls

from tzrun.errors import ConfigError
from tzrun.testing import load_config_text
from tzrun_plugins.weighting.pareto import ParetoWeighting
from tzrun_plugins.weighting.solve import exact_weights, pe_ltr_weights


def _objective(w: np.ndarray, gram: np.ndarray) -> float:
    return float(w @ gram @ w)


def _simplex_grid(min_weights: np.ndarray, step: float) -> np.ndarray:
    """Every point of {Σ w = 1, w >= c} on a grid of ``step`` (brute force, K = 2 or 3)."""
    free = 1.0 - min_weights.sum()
    ticks = np.linspace(0.0, free, int(round(free / step)) + 1)
    points = [v + (free - sum(v),) for v in itertools.product(ticks, repeat=len(min_weights) - 1) if sum(v) <= free + 1e-12]
    return min_weights + np.array(points)


def _problem(seed: int, k: int, conflict: float) -> tuple[np.ndarray, np.ndarray]:
    """Gradients with some conflict (the second opposes the first) and random minimum weights."""
    rng = np.random.default_rng(seed)
    grads = rng.normal(size=(k, 7))
    grads[1] = -conflict * grads[0] + 0.3 * grads[1]
    min_weights = rng.dirichlet(np.ones(k + 1))[:k] * rng.uniform(0.0, 0.9)
    return grads @ grads.T, min_weights


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("k", [2, 3])
def test_exact_weights_are_the_brute_force_minimum(seed, k):
    gram, c = _problem(seed, k, conflict=0.5)
    gram = gram / np.trace(gram)
    w = exact_weights(torch.tensor(gram), torch.tensor(c)).numpy()
    grid = _simplex_grid(c, step=0.0025 if k == 2 else 0.005)
    values = np.einsum("nk,kl,nl->n", grid, gram, grid)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    assert (w >= c - 1e-12).all()
    assert _objective(w, gram) <= values.min() + 1e-9          # no grid point is better
    assert np.abs(w - grid[values.argmin()]).max() <= 0.01      # and the best one is next to it


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("k", [4, 6])
def test_exact_weights_match_an_independent_solver(seed, k):
    gram, c = _problem(100 + seed, k, conflict=0.8)
    gram = gram / np.trace(gram)
    w = exact_weights(torch.tensor(gram), torch.tensor(c)).numpy()
    starts = [c + (1 - c.sum()) * np.eye(k)[i] for i in range(k)] + [c + (1 - c.sum()) / k]
    reference = min(
        (minimize(lambda x: x @ gram @ x, x0, jac=lambda x: 2 * gram @ x, method="SLSQP",
                  bounds=[(ci, None) for ci in c], constraints={"type": "eq", "fun": lambda x: x.sum() - 1},
                  options={"ftol": 1e-15, "maxiter": 1000}).x for x0 in starts),
        key=lambda x: _objective(x, gram),
    )
    assert (w >= c - 1e-12).all() and w.sum() == pytest.approx(1.0, abs=1e-12)
    assert _objective(w, gram) <= _objective(reference, gram) + 1e-8
    np.testing.assert_allclose(w, reference, atol=1e-4)


def test_opposed_gradients_get_equal_weights_and_equal_ones_even_weights():
    g = torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
    opposed = torch.cat([g, -g]) @ torch.cat([g, -g]).T
    assert exact_weights(opposed, torch.zeros(2)).tolist() == pytest.approx([0.5, 0.5], abs=1e-6)
    same = torch.cat([g, g, g]) @ torch.cat([g, g, g]).T         # every weighting is a minimum
    assert exact_weights(same, torch.zeros(3)).tolist() == pytest.approx([1 / 3] * 3, abs=1e-6)


def test_a_minimum_weight_holds_when_the_free_minimum_is_below_it():
    g = torch.tensor([[1.0, 0.0], [10.0, 0.1]], dtype=torch.float64)   # the minimum puts ~all on loss 0
    free = exact_weights(g @ g.T, torch.zeros(2))
    assert free[1] < 0.05
    bounded = exact_weights(g @ g.T, torch.tensor([0.0, 0.4], dtype=torch.float64))
    assert bounded.tolist() == pytest.approx([0.6, 0.4], abs=1e-9)


def _torcheasyrec_pe_ltr(gram: np.ndarray, c: np.ndarray) -> np.ndarray:
    """TorchEasyRec's ``ParetoEfficientMultiTaskLoss._pareto_step`` and ``_asm``
    (tzrec/loss/pe_mtl_loss.py), with 2-D arrays for its ``np.mat`` (gone in numpy 2)."""
    k = len(c)
    C = c.reshape(-1, 1)
    e = np.ones((k, 1))
    M = np.vstack((np.hstack((gram, e)), np.hstack((e.T, np.zeros([1, 1], dtype=np.float32)))))
    z = np.vstack((-np.matmul(gram, C), 1 - np.sum(C)))
    hat_w = np.asarray(np.matmul(np.matmul(np.linalg.inv(np.matmul(M.T, M)), M), z)[:-1]).reshape(-1)
    A = np.eye(k)
    x0, _ = nnls(A, hat_w)
    out = minimize(lambda x: np.linalg.norm(A.dot(x) - hat_w), x0, method="SLSQP", bounds=[[0.0, None]] * k,
                   constraints={"type": "eq", "fun": lambda x: np.sum(x) + np.sum(c) - 1})
    return out.x + c


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("k", [2, 3, 4])
def test_pe_ltr_is_torcheasyrecs_algorithm(seed, k):
    gram, c = _problem(200 + seed, k, conflict=0.6)
    ours = pe_ltr_weights(torch.tensor(gram), torch.tensor(c)).numpy()
    np.testing.assert_allclose(ours, _torcheasyrec_pe_ltr(gram, c), atol=2e-4)
    if k == 2:  # one free dimension: projecting is the minimum
        np.testing.assert_allclose(ours, exact_weights(torch.tensor(gram), torch.tensor(c)).numpy(), atol=1e-7)


def test_pe_ltr_can_miss_the_minimum_with_three_losses():
    gram, c = _problem(3, 3, conflict=0.5)
    gram = gram / np.trace(gram)
    exact = exact_weights(torch.tensor(gram), torch.tensor(c)).numpy()
    pe_ltr = pe_ltr_weights(torch.tensor(gram), torch.tensor(c)).numpy()
    assert _objective(exact, gram) < _objective(pe_ltr, gram) - 1e-4


def test_the_module_weights_losses_by_their_gradients_over_the_params():
    torch.manual_seed(0)
    shared, head_a, head_b = torch.nn.Linear(4, 3), torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    params = [*shared.parameters(), *head_a.parameters(), *head_b.parameters()]
    x = torch.randn(16, 4)
    hidden = shared(x)
    losses = {"a": head_a(hidden).pow(2).mean(), "b": (head_b(hidden) - 3).pow(2).mean()}
    weighting = ParetoWeighting(["a", "b"], {"b": 0.2})
    total, weights = weighting(losses, params)

    flat = [torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in
                       zip(torch.autograd.grad(v, params, retain_graph=True, allow_unused=True), params)])
            for v in losses.values()]
    G = torch.stack(flat).double()
    expected = exact_weights(G @ G.T, torch.tensor([0.0, 0.2], dtype=torch.float64))
    assert [weights["a"].item(), weights["b"].item()] == pytest.approx(expected.tolist(), abs=1e-6)
    assert not weights["a"].requires_grad
    assert total.item() == pytest.approx(expected[0].item() * losses["a"].item() + expected[1].item() * losses["b"].item(), rel=1e-6)
    total.backward()
    assert shared.weight.grad is not None
    combined = expected[0] * flat[0].double() + expected[1] * flat[1].double()
    got = torch.cat([p.grad.reshape(-1) for p in params]).double()
    torch.testing.assert_close(got, combined, atol=1e-6, rtol=1e-5)


MMOE_LOSSES = """
model_dir = "runs/x"
[data]
train_input = "data/x"
labels = ["click", "buy"]
[model]
type = "mmoe"
num_experts = 2
expert_hidden_units = [8]
[[model.tasks]]
name = "ctr"
[[model.tasks]]
name = "cvr"
[[losses]]
type = "binary_cross_entropy"
name = "ctr_bce"
prediction = "logits/ctr"
label = "click"
[[losses]]
type = "binary_cross_entropy"
name = "cvr_bce"
prediction = "logits/cvr"
label = "buy"
[train]
num_steps = 1
sparse_optimizer = { type = "sgd", lr = 0.1 }
dense_optimizer = { type = "adam", lr = 0.001 }
[[features.sparse]]
name = "user_id"
num_buckets = 10
embedding_dim = 8
"""


def _check(weighting: str) -> None:
    from tzrun.kernel.registry import collect_registries  # noqa: F401  (load_config_text collects them)
    from tzrun.runner.preflight import preflight
    from tzrun.runner.facts import RunFacts

    cfg, registries = load_config_text(MMOE_LOSSES + f"[train.loss_weighting]\n{weighting}\n")
    preflight(RunFacts(cfg, registries), "<string>")


def test_a_valid_pareto_table_passes_and_sum_is_the_default():
    _check('type = "pareto"\nmin_weights = { ctr_bce = 0.3, cvr_bce = 0.2 }\nsolver = "pe_ltr"')
    cfg, _ = load_config_text(MMOE_LOSSES)
    assert cfg.train.loss_weighting.type == "sum"


@pytest.mark.parametrize("table, path, message", [
    ('type = "pareto"\nmin_weights = { ctr = 0.3 }', "train.loss_weighting.min_weights.ctr",
     "no loss named 'ctr' (losses: ctr_bce, cvr_bce); did you mean 'ctr_bce'?"),
    ('type = "pareto"\nmin_weights = { ctr_bce = 0.6, cvr_bce = 0.4 }', "train.loss_weighting.min_weights",
     "must sum to less than 1"),
    ('type = "pareto"\nmin_weights = { ctr_bce = -0.1 }', "train.loss_weighting.min_weights",
     "the minimum weight of 'ctr_bce' must be 0 or more"),
    ('type = "pareto"\nsolver = "slsqp"', "train.loss_weighting.solver", "slsqp"),
    ('type = "paretto"', "train.loss_weighting.type", "did you mean 'pareto'?"),
])
def test_bad_pareto_options_are_reported_at_their_toml_path(table, path, message):
    with pytest.raises(ConfigError) as info:
        _check(table)
    assert any(p.path == path and message in p.message for p in info.value.problems), info.value.problems
