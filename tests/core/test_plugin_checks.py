"""Mistakes a plugin author makes in hooks and components are reported by ``tzrec-run check``'s
checks (preflight), before any training, naming the plugin, the component and the fix."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import tzrun
from tzrun.errors import ConfigError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.runner.preflight import preflight
from tzrun.runner.facts import RunFacts
from tzrun.testing import assert_metric_rank_invariant, check_component, load_config_text, tiny_config_text


@attrs.frozen
class NoOptions:
    pass


class TypoStage:
    @tzrun.hookimpl
    def tzrun_after_train_logs(self, run: Any, log: Any) -> None: ...


class UnmarkedStage:
    def tzrun_after_train_log(self, run: Any, log: Any) -> None: ...


class WrongArgumentStage:
    @tzrun.hookimpl
    def tzrun_after_train_log(self, run: Any, logs: Any) -> None: ...


def _metric_classes() -> dict[str, Any]:
    import torch
    from torchmetrics import Metric

    class NoCompute(Metric):
        def update(self, prediction: Any, label: Any, weight: Any = None) -> None: ...

    class TorchmetricsSignature(Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("n", default=torch.zeros(()), dist_reduce_fx="sum")

        def update(self, preds: Any, target: Any) -> None:
            self.n += preds.numel()

        def compute(self) -> Any:
            return self.n

    class CounterState(Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("seen", default=[], dist_reduce_fx="cat")

        def update(self, prediction: Any, label: Any, weight: Any = None) -> None:
            from collections import Counter
            self.seen.append(Counter(label.tolist()))

        def compute(self) -> Any:
            return torch.zeros(())

    return {"no_compute": NoCompute, "preds_target": TorchmetricsSignature, "counter_state": CounterState}


class Mistakes:
    @tzrun.hookimpl
    def tzrun_register_stages(self, register: Any) -> None:
        for name, cls in (("typo_stage", TypoStage), ("unmarked_stage", UnmarkedStage), ("wrong_arg_stage", WrongArgumentStage)):
            register(name, config=NoOptions, build=lambda cfg, cls=cls: cls())

    @tzrun.hookimpl
    def tzrun_register_metrics(self, register: Any) -> None:
        for name in ("no_compute", "preds_target", "counter_state"):
            register(name, config=NoOptions, build=lambda cfg, name=name: _metric_classes()[name]())


@pytest.fixture(scope="module")
def pm() -> Any:
    return make_plugin_manager(plugins=[("mistakes", Mistakes())], distributions=["tzrec-run"])


def _check(pm: Any, tmp_path: Any, override: str) -> str:
    cfg, registries = load_config_text(tiny_config_text(tmp_path, tmp_path / "run"), pm, [override])
    with pytest.raises(ConfigError) as info:
        preflight(RunFacts(cfg, registries), "run.toml")
    return str(info.value)


@pytest.mark.parametrize(("stage", "expected"), [
    ("typo_stage", "unknown hook tzrun_after_train_logs (did you mean tzrun_after_train_log?)"),
    ("unmarked_stage", "tzrun_after_train_log has no @tzrun.hookimpl marker, so tzrec-run never calls it; "
                       "mark it with @tzrun.hookimpl"),
    ("wrong_arg_stage", "wrong argument(s) 'logs' in tzrun_after_train_log: its hookspec takes run, log"),
])
def test_a_stage_hook_mistake_is_found_at_check_time(pm, tmp_path, stage, expected):
    message = _check(pm, tmp_path, f'train.stages=[{{type="progress"}}, {{type="{stage}"}}]')
    assert f"train.stages[1]: stage '{stage}' (plugin 'mistakes') breaks a rule: {expected}" in message
    assert "train.stages[0]" not in message  # the built-in stage conforms


@pytest.mark.parametrize(("metric", "expected"), [
    ("no_compute", "build(cfg) must return a torchmetrics.Metric (with update() and compute()) "
                   "(it raised TypeError: Can't instantiate abstract class NoCompute"),
    ("preds_target", "update(prediction, label, weight) must accept tzrec-run's arguments (not torchmetrics' "
                     "update(preds, target)) (it raised TypeError:"),
    ("counter_state", "every state must be a tensor or a list of tensors (add_state); seen is not"),
])
def test_a_metric_mistake_is_found_at_check_time(pm, tmp_path, metric, expected):
    message = _check(pm, tmp_path, f'metrics=[{{type="auc"}}, {{type="{metric}"}}]')
    assert f"metrics[1]: metric '{metric}' (plugin 'mistakes') breaks a rule: {expected}" in message
    assert "metrics[0]" not in message
    with pytest.raises(AssertionError, match="breaks a rule"):
        check_component("metric", metric, pm=pm)


def test_a_command_that_builds_no_metric_does_not_probe_one(pm, tmp_path):
    """``predict --export`` starts with ``probes=()``: the export's program scores, nothing of
    the registries is built, so a broken metric (or its imports) does not stop or slow it; the
    kinds it names are still probed."""
    cfg, registries = load_config_text(tiny_config_text(tmp_path, tmp_path / "run"), pm, ['metrics=[{type="no_compute"}]'])
    preflight(RunFacts(cfg, registries), "run.toml", probes=())
    preflight(RunFacts(cfg, registries), "run.toml", probes=("loss", "stage"))
    with pytest.raises(ConfigError, match=r"metrics\[0\]: metric 'no_compute' \(plugin 'mistakes'\) breaks a rule"):
        preflight(RunFacts(cfg, registries), "run.toml", probes=("metric",))


def test_check_component_passes_a_conforming_component_and_names_its_plugin():
    assert check_component("dense_optimizer", "adam", {"lr": 0.01}).plugin == "tzrun_plugins.optim"
    assert check_component("metric", "grouped_auc").distribution == "tzrec-run"


def test_a_metric_on_two_gloo_ranks_equals_one_process():
    import torch

    gen = torch.Generator().manual_seed(1)
    rows = {"prediction": torch.rand(50, generator=gen), "label": (torch.rand(50, generator=gen) > 0.5).float(),
            "weight": torch.ones(50)}
    value = assert_metric_rank_invariant("auc", rows, world_size=2, distributions=["tzrec-run"])
    assert 0.0 < float(value) < 1.0
