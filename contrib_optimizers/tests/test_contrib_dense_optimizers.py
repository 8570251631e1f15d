"""Lion and AdaBelief against their papers' update rules: steps computed by hand, then many
steps against a per-element transcription of each paper's algorithm."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from tzrun.errors import ConfigError
from tzrun.testing import load_config_text, tiny_config_text
from tzrun_contrib_optimizers.dense import AdaBelief, Lion
from tzrun_contrib_optimizers.options import AdaBeliefConfig, LionConfig


def _steps(optimizer_class, w0, grads, **kwargs):
    """Apply ``grads`` (one list per step) to a float64 parameter starting at ``w0``."""
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    opt = optimizer_class([p], **kwargs)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    return p.detach().tolist()


# ---------------------------------------------------------------------------------------------
# Lion (Chen et al. 2023, Algorithm 2):  c = b1 m + (1 - b1) g;  w -= lr (sign(c) + wd w);
#                                         m = b2 m + (1 - b2) g


def test_lion_first_steps_by_hand():
    # lr 0.1, b1 0.9, b2 0.99.  Step 1 (m = 0): c = 0.1 g1, so w moves by -0.1 sign(g1), and a
    # zero gradient does not move (sign(0) = 0).  m1 = 0.01 g1.
    w0 = [1.0, -2.0, 0.5, 0.0]
    g1 = [0.3, -0.1, 0.0, 2.0]
    assert _steps(Lion, w0, [g1], lr=0.1) == pytest.approx([0.9, -1.9, 0.5, -0.1], abs=1e-15)
    # Step 2: c = 0.9 * m1 + 0.1 * g2 = 0.009 g1 + 0.1 g2
    #   = [0.0027 - 0.02, -0.0009 - 0.04, 0 + 0.01, 0.018 - 0.01] = [-0.0173, -0.0409, 0.01, 0.008]
    # The last element moves against its own gradient: the momentum of g1 = 2.0 outweighs g2.
    g2 = [-0.2, -0.4, 0.1, -0.1]
    assert _steps(Lion, w0, [g1, g2], lr=0.1) == pytest.approx([1.0, -1.8, 0.4, -0.2], abs=1e-15)


def test_lion_weight_decay_is_decoupled_and_scaled_by_lr():
    # w1 = w0 (1 - lr wd) - lr sign(c) = [1.0, -2.0] * (1 - 0.1 * 0.5) - 0.1 * [1, -1]
    assert _steps(Lion, [1.0, -2.0], [[0.3, -0.1]], lr=0.1, weight_decay=0.5) == pytest.approx([0.85, -1.8], abs=1e-15)


def _lion_reference(w, grads, lr, b1, b2, wd):
    m = [0.0] * len(w)
    w = list(w)
    for g in grads:
        for i, gi in enumerate(g):
            c = b1 * m[i] + (1 - b1) * gi
            sign = (c > 0) - (c < 0)
            w[i] = w[i] - lr * (sign + wd * w[i])
            m[i] = b2 * m[i] + (1 - b2) * gi
    return w


def test_lion_many_steps_match_the_algorithm():
    rng = random.Random(0)
    w0 = [rng.uniform(-1, 1) for _ in range(16)]
    grads = [[rng.gauss(0, 1) for _ in range(16)] for _ in range(12)]
    got = _steps(Lion, w0, grads, lr=0.03, betas=(0.8, 0.95), weight_decay=0.2)
    assert got == pytest.approx(_lion_reference(w0, grads, 0.03, 0.8, 0.95, 0.2), abs=1e-12)


# ---------------------------------------------------------------------------------------------
# AdaBelief (Zhuang et al. 2020, Algorithm 2):  m = b1 m + (1 - b1) g;
#   s = b2 s + (1 - b2) (g - m)^2 + eps;  w -= lr m/(1 - b1^t) / (sqrt(s/(1 - b2^t)) + eps)


def test_adabelief_first_steps_by_hand():
    # lr 0.09, b1 0.9, b2 0.999, eps 1e-16 (negligible at these magnitudes).
    # Step 1, g = 1.0:  m = 0.1;  s = 0.001 * (1.0 - 0.1)^2 = 0.00081
    #   m_hat = 0.1 / 0.1 = 1;  s_hat = 0.00081 / 0.001 = 0.81;  w = 1 - 0.09 * 1 / 0.9 = 0.9
    # (Adam would step by lr = 0.09: its v_hat is g^2 = 1, AdaBelief's is (g - m)^2 / (1 - b2).)
    assert _steps(AdaBelief, [1.0], [[1.0]], lr=0.09) == pytest.approx([0.9], abs=1e-12)
    # Step 2, g = 0.5:  m = 0.09 + 0.05 = 0.14;  s = 0.999 * 0.00081 + 0.001 * (0.5 - 0.14)^2 = 0.00093879
    #   m_hat = 0.14 / 0.19 = 0.7368421052631579;  s_hat = 0.00093879 / 0.001999 = 0.4696298149074605
    #   w = 0.9 - 0.09 * 0.7368421052631579 / sqrt(0.4696298149074605) = 0.803230362584475
    assert _steps(AdaBelief, [1.0], [[1.0], [0.5]], lr=0.09) == pytest.approx([0.803230362584475], abs=1e-12)


def test_adabelief_weight_decay_is_decoupled():
    # w1 = 1.0 * (1 - 0.09 * 0.5) - 0.1 = 0.855 (the step is the one above: 0.1)
    assert _steps(AdaBelief, [1.0], [[1.0]], lr=0.09, weight_decay=0.5) == pytest.approx([0.855], abs=1e-12)


def _adabelief_reference(w, grads, lr, b1, b2, eps, wd):
    m, s, w = [0.0] * len(w), [0.0] * len(w), list(w)
    for t, g in enumerate(grads, start=1):
        for i, gi in enumerate(g):
            w[i] *= 1 - lr * wd
            m[i] = b1 * m[i] + (1 - b1) * gi
            s[i] = b2 * s[i] + (1 - b2) * (gi - m[i]) ** 2 + eps
            m_hat, s_hat = m[i] / (1 - b1**t), s[i] / (1 - b2**t)
            w[i] -= lr * m_hat / (math.sqrt(s_hat) + eps)
    return w


def test_adabelief_many_steps_match_the_algorithm():
    rng = random.Random(1)
    w0 = [rng.uniform(-1, 1) for _ in range(16)]
    grads = [[rng.gauss(0, 1) for _ in range(16)] for _ in range(12)]
    got = _steps(AdaBelief, w0, grads, lr=0.01, betas=(0.85, 0.99), eps=1e-8, weight_decay=0.1)
    assert got == pytest.approx(_adabelief_reference(w0, grads, 0.01, 0.85, 0.99, 1e-8, 0.1), abs=1e-12)


@pytest.mark.parametrize("optimizer_class", [Lion, AdaBelief])
def test_a_group_at_lr_zero_does_not_move_and_state_dicts_resume(optimizer_class):
    torch.manual_seed(0)
    frozen, trained = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    before = frozen.detach().clone()
    grads = [torch.randn(3) for _ in range(4)]

    def make(params):
        return optimizer_class([{"params": [params[0]], "lr": 0.0}, {"params": [params[1]], "lr": 0.01, "weight_decay": 0.1}])

    opt = make([frozen, trained])
    for g in grads[:2]:
        frozen.grad, trained.grad = g.clone(), g.clone()
        opt.step()
    state = copy.deepcopy(opt.state_dict())  # as a checkpoint holds it: no tensor shared with opt
    resumed_params = [torch.nn.Parameter(frozen.detach().clone()), torch.nn.Parameter(trained.detach().clone())]
    resumed = make(resumed_params)
    resumed.load_state_dict(state)
    for g in grads[2:]:
        frozen.grad, trained.grad = g.clone(), g.clone()
        opt.step()
        resumed_params[0].grad, resumed_params[1].grad = g.clone(), g.clone()
        resumed.step()
    assert torch.equal(frozen, before)
    assert torch.equal(resumed_params[1], trained)


def test_options_come_from_the_toml_of_the_installed_plugin(tzrun_pm, tmp_path):
    text = tiny_config_text(tmp_path / "data", tmp_path / "run")
    cfg, registries = load_config_text(
        text, tzrun_pm, ['train.dense_optimizer={type="lion", lr=0.0003, beta2=0.98, weight_decay=1.0}']
    )
    assert cfg.train.dense_optimizer.config == LionConfig(lr=0.0003, beta2=0.98, weight_decay=1.0)
    entry = registries["dense_optimizer"].get("adabelief", "train.dense_optimizer.type")
    assert (entry.plugin, entry.distribution) == ("tzrun_contrib_optimizers", "tzrun-contrib-optimizers")
    optimizer = entry.build(AdaBeliefConfig(lr=0.01), [torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(optimizer, AdaBelief) and optimizer.param_groups[0]["eps"] == 1e-16

    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.beta1: .*1\.5"):
        load_config_text(text, tzrun_pm, ['train.dense_optimizer={type="adabelief", lr=0.01, beta1=1.5}'])
    with pytest.raises(ConfigError, match=r"train\.dense_optimizer\.epsilon: unknown key .*did you mean 'eps'"):
        load_config_text(text, tzrun_pm, ['train.dense_optimizer={type="adabelief", lr=0.01, epsilon=1e-8}'])
