"""Stage mechanics: the order stages are called in, their state in checkpoints under their
names, the progress bar, early stopping's rule, and the checks of the run records."""

from __future__ import annotations

import json
import sys

import attrs
import pytest

import tzrun
from tzrun.config.load import load_config, parse_config
from tzrun.interfaces import EvalResult, RunContext, StepInfo, TrainLog
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.records import check_stack, config_sources, resolved_toml, resolved_tree
from tzrun.runner.stages import stage_names
from tzrun.testing import TINY_CONFIG, run_tiny_training
from tzrun_plugins.stages.early_stopping import EarlyStoppingConfig, EarlyStoppingStage
from tzrun_plugins.stages.progress import ProgressConfig, ProgressStage, format_train_log


@attrs.frozen
class RecorderConfig:
    tag: str = "?"


class Recorder:
    """A stage that records the hooks it sees (in a shared list) and counts its steps as state."""

    calls: list[tuple[str, str]] = []

    def __init__(self, cfg: RecorderConfig) -> None:
        self.tag = cfg.tag
        self.steps = 0
        self.loaded: dict | None = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run):
        Recorder.calls.append(("before_train", self.tag))

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        self.steps += 1
        Recorder.calls.append(("step", self.tag))

    @tzrun.hookimpl
    def tzrun_after_train_log(self, run, log):
        Recorder.calls.append(("log", self.tag))

    def state_dict(self):
        return {"steps": self.steps, "tag": self.tag}

    def load_state_dict(self, state):
        self.loaded = state


class RecorderPlugin:
    @tzrun.hookimpl
    def tzrun_register_stages(self, register):
        register("recorder", config=RecorderConfig, build=Recorder, description="records hook calls")


def test_stages_run_in_config_order_and_save_their_state_under_their_names(tmp_path):
    Recorder.calls.clear()
    run = run_tiny_training(
        tmp_path, in_process=True, plugins=[("recorder-plugin", RecorderPlugin())],
        overrides=['train.stages=[{type = "recorder", tag = "b"}, {type = "recorder", tag = "a"}]',
                   "train.num_steps=4", "train.log_every_n_steps=2"],
    )
    assert Recorder.calls[:1] == [("before_train", "b")] and Recorder.calls[1] == ("before_train", "a")
    steps = [tag for hook, tag in Recorder.calls if hook == "step"]
    assert steps == ["b", "a"] * 4
    assert [tag for hook, tag in Recorder.calls if hook == "log"] == ["b", "a"] * 2
    meta = json.loads((run.model_dir / "checkpoints" / "step-4" / "meta.json").read_text())
    assert meta["stages"] == {"recorder.0": {"steps": 4, "tag": "b"}, "recorder.1": {"steps": 4, "tag": "a"}}


def test_stage_names_are_the_type_or_type_and_index_when_repeated():
    registries = collect_registries(make_plugin_manager())
    text = TINY_CONFIG.format(model_dir="m", data_dir="d")
    raw = parse_config(text, "t.toml", ['train.stages=[{type = "progress"}, {type = "tensorboard"}, {type = "tensorboard"}]'])
    assert stage_names(load_config(raw, registries)) == ["progress", "tensorboard.1", "tensorboard.2"]


def _run(total: int = 10) -> RunContext:
    return RunContext(config=None, model_dir=".", rank=0, world_size=1, local_rank=0, device="cpu", total_steps=total)


def _log(step: int, loss: float = 0.5) -> TrainLog:
    return TrainLog(step=step, epoch=0, steps=5, loss=loss, losses={"bce": loss}, learning_rates={"dense": 0.1},
                    metrics={"auc": 0.75}, samples_per_s=1000.0, data_wait_fraction=0.25, grad_norm=1.0, seconds=2.0,
                    time=0.0)


def test_progress_bar_moves_every_step_and_shows_the_log_values(capsys):
    stage = ProgressStage(ProgressConfig(mode="bar"))
    run = _run(10)
    stage.tzrun_before_train(run)
    for i in range(1, 6):
        stage.tzrun_after_train_step(run, StepInfo(i, 0, None, {}, 8, {}))
    stage.tzrun_after_train_log(run, _log(5))
    assert stage.bar.n == 5 and stage.bar.total == 10
    stage.tzrun_after_eval(run, 5, EvalResult(5, {"auc": 0.7}, 100))
    stage.tzrun_after_train(run, 10)
    err = capsys.readouterr().err
    assert "loss=0.5000" in err and "data_wait=25%" in err and "eval at step 5 over 100 rows: auc=0.700000" in err
    assert "\r" in err  # redrawn in place
    assert stage.bar is None


def test_progress_line_has_eta_at_the_window_pace():
    line = format_train_log(_log(5), total_steps=105)
    # 2 s for 5 steps, 100 steps to go: 40 s
    assert line.startswith("step 5/105 epoch 0  loss=0.50000  auc=0.75000  lr/dense=0.1  samples/s=1000  data_wait=25.0%")
    assert line.endswith("eta 0:00:40")


def test_progress_on_other_ranks_is_silent(capsys):
    stage = ProgressStage(ProgressConfig(mode="bar"))
    run = attrs.evolve(_run(), rank=1)
    stage.tzrun_before_train(run)
    stage.tzrun_after_train_log(run, _log(5))
    assert stage.bar is None and capsys.readouterr().err == ""


@pytest.mark.parametrize("mode, values, stops_after", [
    ("max", [0.5, 0.6, 0.6, 0.59], 4),       # 0.6 twice: not better; patience 2 runs out at the 4th
    ("max", [0.5, 0.6, 0.65, 0.7, 0.71], None),
    ("min", [1.0, 0.9, 0.95, 0.85, 0.92], None),  # 0.85 improves just in time
    ("min", [1.0, 1.0, 1.0], 3),
])
def test_early_stopping_rule(mode, values, stops_after):
    stage = EarlyStoppingStage(EarlyStoppingConfig(metric="m", mode=mode, patience=2))
    stage.metric, stage.mode = "m", mode
    run = _run()
    for i, value in enumerate(values, 1):
        stage.tzrun_after_eval(run, i, EvalResult(i, {"m": value}, 1))
        if run.stop_requested:
            break
    assert (i if run.stop_requested else None) == stops_after


def test_early_stopping_min_delta_needs_more_than_the_delta():
    stage = EarlyStoppingStage(EarlyStoppingConfig(metric="m", mode="max", patience=1, min_delta=0.01))
    stage.metric, stage.mode = "m", "max"
    run = _run()
    stage.tzrun_after_eval(run, 1, EvalResult(1, {"m": 0.5}, 1))
    stage.tzrun_after_eval(run, 2, EvalResult(2, {"m": 0.51}, 1))  # +0.01 is not more than 0.01
    assert run.stop_requested and "did not improve on 0.5 (step 1) by more than 0.01" in run.stop_reason


def test_resolved_config_round_trips_with_sources():
    registries = collect_registries(make_plugin_manager())
    text = TINY_CONFIG.format(model_dir="m", data_dir="d")
    raw = parse_config(text, "t.toml", ["train.num_steps=9", 'train.dense_optimizer={type = "adam", lr = 0.01}',
                                        'metrics=[{type = "auc", thresholds = 200}, {type = "grouped_auc", group_by = "cat_0"}]'])
    cfg = load_config(raw, registries)
    tree = resolved_tree(cfg)
    sources = config_sources(tree, raw)
    assert sources["train.num_steps"] == "--set" and sources["train.seed"] == "file"
    assert sources["train.dense_optimizer.lr"] == "--set" and sources["train.dense_optimizer.amsgrad"] == "default"
    assert sources["metrics[1].group_by"] == "--set" and sources["data.reader.type"] == "default"
    text_out = resolved_toml(tree, sources, "t.toml")
    assert "amsgrad = false  # default" in text_out and "seed = 3\n" in text_out
    again = load_config(parse_config(text_out, "resolved.toml"), registries)
    assert resolved_tree(again) == tree


def test_stack_check_names_the_mismatch():
    good = {"torch": "2.13.0+cpu", "fbgemm_gpu": "1.8.0", "torchrec": "1.8.0"}
    assert check_stack(good) == []
    torch_off = check_stack({**good, "torch": "2.12.1"})
    assert len(torch_off) == 1 and "fbgemm_gpu 1.8.0 is built for torch 2.13, but torch is 2.12.1" in torch_off[0]
    torchrec_off = check_stack({**good, "torchrec": "1.7.0"})
    assert "torchrec 1.7.0 goes with fbgemm_gpu 1.7" in torchrec_off[0]
    missing = check_stack({**good, "torchrec": None})
    assert missing == ["torchrec is not installed"]


def test_progress_auto_mode_uses_lines_off_a_terminal(monkeypatch, caplog):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    stage = ProgressStage(ProgressConfig())
    run = _run(10)
    stage.tzrun_before_train(run)
    with caplog.at_level("INFO", logger="tzrun.progress"):
        stage.tzrun_after_train_log(run, _log(5))
    assert stage.bar is None and "step 5/10 epoch 0  loss=0.50000" in caplog.text


def test_overwrite_removes_what_the_stages_declare_they_write(tmp_path, tzrun_pm):
    # the core knows no stage's directory: --overwrite asks each stage (register(..., outputs=fn))
    from tzrun.runner.model_dir import claim_model_dir, run_outputs
    from tzrun.runner.run_marker import write_run_marker
    from tzrun.testing import load_config_text, tiny_config_text

    text = tiny_config_text(tmp_path / "data", tmp_path / "run").replace(
        "stages = []", 'stages = [{ type = "tensorboard", log_dir = "tb_custom" }, { type = "metrics_log" }]')
    cfg, registries = load_config_text(text, tzrun_pm)
    outputs = run_outputs(cfg, registries)
    # this config's own places, and each stage's default place (an earlier run may have used it)
    assert {"tb_custom", "tensorboard", "profiler", "metrics.jsonl", "checkpoints", "eval_results.jsonl"} <= set(outputs)
    run = tmp_path / "run"
    for name in ("tb_custom/train", "tensorboard/train", "profiler", "notes/keep"):
        (run / name).mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    write_run_marker(run)  # only a run's dir is cleaned
    claim_model_dir(run, cfg, registries, overwrite=True, resume=False, rank=0)
    assert sorted(p.name for p in run.iterdir()) == [".tzrec-run", "notes"]  # what no one declares is left alone


def test_tensorboard_declares_its_two_runs_and_never_the_model_dir():
    from tzrun_plugins.stages.tensorboard import TensorBoardConfig, tensorboard_outputs

    # the runs are the model dir's own (and an earlier version's tensorboard/ goes with --overwrite)
    assert tensorboard_outputs(TensorBoardConfig()) == ["train", "eval", "tensorboard"]
    assert tensorboard_outputs(TensorBoardConfig(log_dir=".")) == ["train", "eval", "tensorboard"]
    assert tensorboard_outputs(TensorBoardConfig(log_dir="tb")) == ["tb"]


def test_mlflow_params_are_the_resolved_config_flattened_with_keys_mlflow_accepts():
    from tzrun_plugins.stages.mlflow_tracking import flatten_params

    tree = {"model_dir": "runs/x", "data": {"batch_size": 256, "labels": ["label"]},
            "train": {"stages": [{"type": "progress"}, {"type": "mlflow", "tags": {}}], "num_steps": 4}}
    assert flatten_params(tree) == {
        "model_dir": "runs/x", "data.batch_size": "256", "data.labels": '["label"]',
        "train.stages.0.type": "progress", "train.stages.1.type": "mlflow", "train.stages.1.tags": "{}",
        "train.num_steps": "4"}
