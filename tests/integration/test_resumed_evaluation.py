"""A run resumed from a boundary's checkpoint evaluates that step again; the core, not each
stage, makes sure that every plugin hears each step's evaluation once: a third-party recorder
written naively (it appends every evaluation it hears, in a file or in its state) ends with
each step once."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

import tzrun
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.testing import tiny_config_text

pytestmark = pytest.mark.slow


class FileRecorder:
    """Appends the step of every evaluation it hears to a file; keeps no state."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @tzrun.hookimpl
    def tzrun_after_eval(self, run, step, result):
        with self.path.open("a") as out:
            out.write(f"{step}\n")


@attrs.define
class StateRecorderConfig:
    pass


class StateRecorder:
    """A stage that appends the step of every evaluation it hears to its state."""

    built: list["StateRecorder"] = []

    def __init__(self, cfg: StateRecorderConfig) -> None:
        self.steps: list[int] = []
        StateRecorder.built.append(self)

    @tzrun.hookimpl
    def tzrun_after_eval(self, run, step, result):
        self.steps.append(step)

    def state_dict(self):
        return {"steps": list(self.steps)}

    def load_state_dict(self, state):
        self.steps = list(state["steps"])


class StateRecorderPlugin:
    @tzrun.hookimpl
    def tzrun_register_stages(self, register):
        register("state_recorder", config=StateRecorderConfig, build=StateRecorder, description="records evaluations")


def _train(model_dir: Path, data_dir: Path, recorded: Path, num_steps: int, *, resume: bool):
    import torch.distributed as dist

    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.session import Session
    from tzrun.runner.trainer import train

    pm = make_plugin_manager(plugins=[("file-recorder", FileRecorder(recorded)), ("state-recorder", StateRecorderPlugin())])
    registries = collect_registries(pm)
    raw = parse_config(tiny_config_text(data_dir, model_dir), "<tiny>", [
        f"train.num_steps={num_steps}", "train.save_checkpoints_steps=2",
        'train.stages=[{type = "state_recorder"}, {type = "metrics_log"}]'])
    created = not dist.is_initialized()
    try:
        return train(Session(load_config(raw, registries), raw, pm, registries), resume=resume, overwrite=not resume)
    finally:
        if created:
            shutdown_distributed()


def test_a_naive_recorder_hears_each_evaluation_once_across_a_resume_from_a_boundary(tmp_path, criteo_dir):
    model_dir, recorded = tmp_path / "run", tmp_path / "heard.txt"
    StateRecorder.built.clear()
    _train(model_dir, criteo_dir, recorded, 4, resume=False)
    meta = json.loads((model_dir / "checkpoints" / "step-4" / "meta.json").read_text())
    assert meta["evaluate_on_resume"] is True and meta["stages"]["state_recorder"] == {"steps": [2]}
    assert recorded.read_text().split() == ["2", "4"]

    _train(model_dir, criteo_dir, recorded, 6, resume=True)  # evaluates 4 again, then trains to 6
    assert recorded.read_text().split() == ["2", "4", "6"]  # the file recorder heard 4 before
    assert StateRecorder.built[-1].steps == [2, 4, 6]  # the restored state had not
    metrics = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if r["kind"] == "eval"] == [2, 4, 6]
    assert [json.loads(line)["step"] for line in (model_dir / "eval_results.jsonl").read_text().splitlines()] == [2, 4, 6]
