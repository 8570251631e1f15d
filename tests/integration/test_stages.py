"""The loop stages through ``tzrec-run train``: what each one produced, read back with the tools
users would use (TensorBoard's own event reader, the profiler's trace JSON, ``metrics.jsonl``),
the run records, ``tzrec-run plot``, and early stopping across a resume."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import cli
from tzrun.cli.main import main
from tzrun.testing import tiny_config_text
from tzrun.errors import EXIT_CONFIG

pytestmark = pytest.mark.slow

STAGES = (
    'train.stages=[{type = "progress", mode = "lines"}, {type = "metrics_log"}, '
    '{type = "tensorboard", histograms_every_n_steps = 6}, '
    '{type = "profiler", wait = 1, warmup = 1, active = 2}]'
)


def _train(tmp: Path, criteo_dir: Path, *overrides: str, model_dir: Path | None = None, flags: tuple[str, ...] = ()):
    model_dir = model_dir or tmp / "run"
    config = tmp / "run.toml"
    config.write_text(tiny_config_text(criteo_dir, model_dir))
    args = ["train", str(config), *flags]
    for override in overrides:
        args += ["--set", override]
    if any("tensorboard" in o for o in overrides):
        _next_second()
    return cli(args), model_dir


def _next_second() -> None:
    """Wait for the next second of the clock. TensorBoard names an event file by the second it
    is opened in, then the process id and a per-process counter, and reads a directory's files
    in the order of their names: two runs in one process (the test's) within one second may be
    read in the wrong order (counter 10 before 9), and the later run's purge of resumed steps
    applied to the earlier run's events. Runs in processes of their own are seconds apart."""
    time.sleep(1 - time.time() % 1 + 0.01)


@pytest.fixture(scope="module")
def staged(tmp_path_factory, criteo_dir):
    """One run with progress (lines), metrics_log, tensorboard and profiler: 12 steps, a train
    log every 3, a checkpoint and an evaluation every 6."""
    tmp = tmp_path_factory.mktemp("stages")
    proc, model_dir = _train(tmp, criteo_dir, "train.num_steps=12", "train.log_every_n_steps=3",
                             "train.save_checkpoints_steps=6", STAGES)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, model_dir, tmp


def _records(model_dir: Path, kind: str) -> list[dict]:
    lines = (model_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_progress_prints_plain_lines_off_a_terminal(staged):
    proc, _, _ = staged
    lines = re.findall(r"tzrun\.progress: (step \d+/12 epoch 0  loss=\S+ .*)", proc.stderr)
    assert [int(re.match(r"step (\d+)", line).group(1)) for line in lines] == [3, 6, 9, 12]
    assert all("samples/s=" in line and "data_wait=" in line and "eta " in line and "lr/dense=0.1" in line for line in lines)
    assert len(re.findall(r"tzrun\.progress: eval at step (6|12) over 3001 rows in [0-9.]+ s \([0-9,]+ rows/s\): auc=", proc.stderr)) == 2
    assert "\r" not in proc.stderr  # no bar when standard error is not a terminal


def test_metrics_log_lines_parse_and_match_the_progress_lines(staged):
    proc, model_dir, _ = staged
    train = _records(model_dir, "train")
    assert [r["step"] for r in train] == [3, 6, 9, 12] and all(r["steps"] == 3 for r in train)
    logged = dict(re.findall(r"step (\d+)/12 epoch 0  loss=(\S+)", proc.stderr))
    for record in train:
        assert f"{record['loss']:.5f}" == logged[str(record["step"])]
        assert record["losses"]["binary_cross_entropy"] == pytest.approx(record["loss"])
        assert record["learning_rates"]["dense"] == pytest.approx(0.1)
        assert record["samples_per_s"] > 0 and 0 <= record["data_wait_fraction"] <= 1 and record["grad_norm"] > 0
    evals = _records(model_dir, "eval")
    results = [json.loads(line) for line in (model_dir / "eval_results.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals] == [r["step"] for r in results] == [6, 12]
    for logged_eval, result in zip(evals, results):
        assert logged_eval["rows"] == 3001
        assert logged_eval["metrics"]["auc"] == pytest.approx(result["auc"], abs=1e-12)


def test_tensorboard_events_hold_the_stable_tags_with_the_logged_values(staged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, model_dir, _ = staged
    assert not (model_dir / "tensorboard").exists()  # the runs are the model dir's: `--logdir runs` names them run/train
    train = EventAccumulator(str(model_dir / "train"), size_guidance={"histograms": 0, "scalars": 0})
    train.Reload()
    tags = set(train.Tags()["scalars"])
    assert {"loss/total", "loss/binary_cross_entropy", "lr/dense", "perf/samples_per_s",
            "perf/data_wait_fraction", "grad/global_norm"} <= tags
    assert any(t.startswith("lr/sparse") for t in tags)
    records = {r["step"]: r for r in _records(model_dir, "train")}
    loss = train.Scalars("loss/total")
    assert [e.step for e in loss] == [3, 6, 9, 12]
    for event in loss:
        assert event.value == pytest.approx(records[event.step]["loss"], rel=1e-6)
    assert train.Scalars("grad/global_norm")[0].value == pytest.approx(records[3]["grad_norm"], rel=1e-6)
    histograms = set(train.Tags()["histograms"])
    assert any(t.startswith("param/") for t in histograms) and any(t.startswith("grad/") for t in histograms)
    assert {e.step for t in histograms for e in train.Histograms(t)} == {6, 12}

    evaluation = EventAccumulator(str(model_dir / "eval"))
    evaluation.Reload()
    assert {"metric/auc", "loss/binary_cross_entropy"} <= set(evaluation.Tags()["scalars"])
    results = {r["step"]: r for r in _records(model_dir, "eval")}
    for event in evaluation.Scalars("metric/auc"):
        assert event.value == pytest.approx(results[event.step]["metrics"]["auc"], rel=1e-6)


def test_profiler_writes_a_chrome_trace_of_the_active_steps(staged):
    _, model_dir, _ = staged
    traces = sorted((model_dir / "profiler").glob("rank0*.pt.trace.json"))
    assert len(traces) == 1, list((model_dir / "profiler").iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}  # wait 1, warmup 1, active 2
    assert any("embedding" in e.get("name", "").lower() or "tbe" in e.get("name", "").lower() for e in events)


def test_plot_draws_non_empty_pngs(staged, tmp_path):
    _, model_dir, _ = staged
    proc = cli(["plot", str(model_dir), "--out", str(tmp_path / "plots")])
    assert proc.returncode == 0, proc.stderr
    written = [Path(line) for line in proc.stdout.splitlines()]
    assert sorted(p.name for p in written) == ["eval.png", "learning_rates.png", "loss.png", "throughput.png"]
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    missing = cli(["plot", str(tmp_path / "nowhere")])
    assert missing.returncode == EXIT_CONFIG and "metrics.jsonl: no such file" in missing.stderr


def test_a_run_records_its_resolved_config_with_sources_and_its_environment(staged):
    _, model_dir, tmp = staged
    resolved = json.loads((model_dir / "resolved_config.json").read_text())
    sources = resolved["sources"]
    assert resolved["config"]["train"]["num_steps"] == 12 and sources["train.num_steps"] == "--set"
    assert sources["data.batch_size"] == "file" and sources["train.keep_checkpoint_max"] == "default"
    assert sources["train.stages[0].type"] == "--set" and sources["train.stages[3].record_shapes"] == "default"
    text = (model_dir / "resolved_config.toml").read_text()
    assert "num_steps = 12  # --set" in text and "keep_checkpoint_max = 0  # default" in text
    assert "batch_size = 256\n" in text
    check = cli(["check", str(model_dir / "resolved_config.toml")])
    assert check.returncode == 0, check.stderr  # the record is a config that trains the same run
    env = json.loads((model_dir / "env.json").read_text())
    assert env["versions"]["torch"].startswith("2.13.0") and env["versions"]["fbgemm_gpu"] == "1.8.0"
    assert env["versions"]["torchrec"].startswith("1.8.0") and env["stack_problems"] == []
    assert env["world_size"] == 1 and env["seed"] == 3
    assert {p["name"] for p in env["plugins"]} >= {"tzrun_plugins.stages", "tzrun_plugins.models"}
    assert env["git"] is None  # the config is not in a git repository


def test_a_model_dir_of_another_run_is_refused_unless_overwritten(staged, criteo_dir):
    _, model_dir, tmp = staged
    proc, _ = _train(tmp, criteo_dir, "model.deep_hidden_units=[4]", "train.num_steps=2", model_dir=model_dir,
                     flags=("--resume",))
    assert proc.returncode == EXIT_CONFIG
    assert "holds another run" in proc.stderr and "model.deep_hidden_units: [16, 8] in the model dir's run, [4] now" in proc.stderr
    assert (model_dir / "checkpoints" / "step-12" / "COMPLETE").exists()  # nothing was touched


def test_early_stopping_ends_at_the_right_eval_and_its_state_survives_resume(tmp_path, criteo_dir):
    # The eval loss falls as training goes on, so in "max" mode the first evaluation stays the
    # best and every later one counts against the patience.
    common = ('eval.best_metric="loss/binary_cross_entropy"', 'eval.best_mode="max"', "train.save_checkpoints_steps=2",
              "train.keep_checkpoint_max=1",
              'train.stages=[{type = "early_stopping", patience = 2}, {type = "metrics_log"}, {type = "tensorboard"}]')
    first, model_dir = _train(tmp_path, criteo_dir, "train.num_steps=4", *common)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "stopped early" not in first.stdout  # evals at 2 (best) and 4 (1 of 2)
    meta = json.loads((model_dir / "checkpoints" / "step-4" / "meta.json").read_text())
    # the checkpoint of step 4 was written before the evaluation of step 4: it holds the state
    # after the evaluation of step 2, and says that its own evaluation is still to run
    assert meta["stages"]["early_stopping"] == {"metric": "loss/binary_cross_entropy", "best": pytest.approx(
        meta["stages"]["early_stopping"]["best"]), "best_step": 2, "bad_evals": 0}
    assert meta["evaluate_on_resume"] is True
    # the finished run resumed as it was: nothing to train, and its last evaluation is recorded
    done = (model_dir / "eval_results.jsonl").read_text()
    finished, _ = _train(tmp_path, criteo_dir, "train.num_steps=4", *common, flags=("--resume",))
    assert finished.returncode == 0 and "evaluating step 4 again" not in finished.stderr, finished.stderr[-3000:]
    assert (model_dir / "eval_results.jsonl").read_text() == done

    resumed, _ = _train(tmp_path, criteo_dir, "train.num_steps=12", *common, flags=("--resume",))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "evaluating step 4 again: its result is not part of the checkpoint" in resumed.stderr
    # with its state restored and the evaluation of 4 run again, the stage stops after the eval
    # at 6; without either, it would go on to 8 or 10
    assert "stopped early at step 6: early_stopping: loss/binary_cross_entropy did not improve" in resumed.stdout
    assert "(step 2)" in resumed.stdout
    best = json.loads((model_dir / "best.json").read_text())
    assert best["step"] == 2 and best["checkpoint"] == "checkpoints/step-2"
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == ["step-2", "step-6"]
    results = (model_dir / "eval_results.jsonl").read_text()
    assert [json.loads(line)["step"] for line in results.splitlines()] == [2, 4, 6]

    # the run never interrupted: the same evaluations, best checkpoint and stop
    (tmp_path / "straight").mkdir()
    straight, straight_dir = _train(tmp_path / "straight", criteo_dir, "train.num_steps=12", *common)
    assert "stopped early at step 6: early_stopping" in straight.stdout, straight.stderr[-3000:]
    assert (straight_dir / "eval_results.jsonl").read_text() == results
    assert json.loads((straight_dir / "best.json").read_text()) == best
    # the records of the stages hold each evaluation once, with the values of eval_results.jsonl
    logged = {r["step"]: r["metrics"] for r in _records(model_dir, "eval")}
    assert [r["step"] for r in _records(model_dir, "eval")] == [2, 4, 6]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(model_dir / "eval"))
    events.Reload()
    scalars = events.Scalars("loss/binary_cross_entropy")
    assert [e.step for e in scalars] == [2, 4, 6]
    assert [e.value for e in scalars] == pytest.approx([logged[s]["loss/binary_cross_entropy"] for s in (2, 4, 6)])

    # resumed once more, the run stopped early at 6 runs that evaluation again, stops again there,
    # and records it once
    again, _ = _train(tmp_path, criteo_dir, "train.num_steps=12", *common, flags=("--resume",))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped early at step 6: early_stopping" in again.stdout
    assert (model_dir / "eval_results.jsonl").read_text() == results
    assert [r["step"] for r in _records(model_dir, "eval")] == [2, 4, 6]


def test_stage_checks_run_in_tzrec_run_check(tmp_path, criteo_dir, capsys):
    config = tmp_path / "run.toml"
    config.write_text(tiny_config_text(criteo_dir, tmp_path / "run"))

    def check(*overrides: str) -> SimpleNamespace:  # in-process: the command's code and stderr
        args = ["check", str(config)]
        for o in overrides:
            args += ["--set", o]
        code = main(args)
        return SimpleNamespace(returncode=code, stderr=capsys.readouterr().err)

    unknown = check('train.stages=[{type = "early_stopping", metric = "aucc"}]')
    assert unknown.returncode == EXIT_CONFIG
    assert "train.stages[0].metric: 'aucc' is not an eval result (available: auc, loss/binary_cross_entropy)" in unknown.stderr
    unset = check('train.stages=[{type = "early_stopping"}]')
    assert "train.stages[0].metric: is not set and neither is eval.best_metric" in unset.stderr
    differs = check('train.stages=[{type = "early_stopping", metric = "auc"}]', 'eval.best_metric="loss/binary_cross_entropy"',
                    'eval.best_mode="min"')
    assert "differs from eval.best_metric 'loss/binary_cross_entropy'" in differs.stderr
    bad_option = check('train.stages=[{type = "early_stopping", metric = "auc", patience = 0}]')
    assert bad_option.returncode == EXIT_CONFIG and "train.stages[0].patience" in bad_option.stderr
    config.write_text("\n".join(l for l in tiny_config_text(criteo_dir, tmp_path / "run").splitlines()
                                if not l.startswith("eval_input")))
    no_eval = check('train.stages=[{type = "early_stopping", metric = "auc"}]', "metrics=[]")
    assert no_eval.returncode == EXIT_CONFIG and "train.stages[0]: early stopping needs evaluations: set data.eval_input" in no_eval.stderr
    config.write_text(tiny_config_text(criteo_dir, tmp_path / "run"))
    ok = check('train.stages=[{type = "early_stopping", metric = "auc"}]')
    assert ok.returncode == 0, ok.stderr


def test_env_command_reports_a_known_good_triple():
    proc = cli(["env", "--json"])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["problems"] == [] and report["versions"]["fbgemm_gpu"] == "1.8.0"
