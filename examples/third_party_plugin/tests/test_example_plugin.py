"""The example plugin, tested the way its own CI would, with tzrec-run's kit."""

from __future__ import annotations

import pytest
import torch

from tzrun.testing import load_config_text, run_tiny_training, tiny_config_text
from tzrun_example_plugin.components import LabelMean, SignSGD


def test_sign_sgd_steps_by_the_sign():
    w = torch.nn.Parameter(torch.tensor([1.0, 1.0, 1.0]))
    w.grad = torch.tensor([0.3, -2.0, 0.0])
    SignSGD([w], lr=0.1).step()
    assert w.tolist() == pytest.approx([0.9, 1.1, 1.0])


def test_label_mean_ignores_padding_and_merges():
    a, b = LabelMean(), LabelMean()
    a.update(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), torch.tensor([3.0, 1.0]))
    b.update(torch.tensor([0.5]), torch.tensor([1.0]), torch.tensor([0.0]))  # a padding row
    a.merge_state(b)
    assert float(a.compute()) == pytest.approx(0.75)


def test_the_installed_plugin_is_named_in_toml(tzrun_pm, tmp_path):
    text = tiny_config_text(tmp_path / "data", tmp_path / "run")
    cfg, registries = load_config_text(text, tzrun_pm, ['train.dense_optimizer={type="sign_sgd", lr=0.01}'])
    assert registries["dense_optimizer"].get("sign_sgd", "x").distribution == "tzrun-example-plugin"


def test_a_short_training_run(tmp_path):
    run = run_tiny_training(tmp_path, overrides=[
        'train.dense_optimizer={type="sign_sgd", lr=0.001}', 'metrics=[{type="label_mean"}]',
    ])
    assert 0.0 < run.metrics["label_mean"] < 1.0
    assert run.plugin("tzrun_example_plugin")["distribution"] == "tzrun-example-plugin"
