"""A model dir on S3 (a real moto server on loopback, reached through the standard AWS
environment): checkpoints, markers, manifests, results, TensorBoard events and profiler traces
go there; a run stopped by SIGTERM resumes exactly, ``evaluate``, ``ckpt ls``/``inspect`` and
``--init-from`` read it; on 2 ranks, a rank killed while saving leaves the previous
checkpoint, and the job resumes from it to the same result as an uninterrupted run.

The data stays local here (the data tests read it from S3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import fsspec
import pytest

import tzrun
from tests.conftest import EXAMPLE, REPO, cli, example_overrides
from tests.integration import fault_plugin
from tests.warm_ranks import warm_executable
from tzrun.config.load import load_config, parse_config
from tzrun.io.files import EVAL_RESULTS, read_jsonl
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.testing import tiny_config_text
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

STEPS = ("train.num_steps=6", "train.save_checkpoints_steps=3", "train.log_every_n_steps=1")
STAGES = ('train.stages=[{type = "metrics_log"}, {type = "tensorboard", flush_secs = 1}, '
          '{type = "profiler", wait = 0, warmup = 1, active = 1, repeat = 1}]')


class Losses:
    """Records each step's loss; optionally sends itself ``signum`` after step ``signal_at``."""

    def __init__(self, signal_at: int | None = None, signum: int = signal.SIGTERM) -> None:
        self.steps: dict[int, float] = {}
        self.signal_at, self.signum = signal_at, signum

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        self.steps[step.step] = float(step.loss)
        if step.step == self.signal_at:
            os.kill(os.getpid(), self.signum)


def _train(criteo_dir: Path, model_dir: str, recorder: Losses, *extra: str, resume: bool = False, overwrite: bool = False,
           init_from=None):
    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.trainer import train

    pm = make_plugin_manager(plugins=[("losses", recorder)])
    registries = collect_registries(pm)
    raw = parse_config(tiny_config_text(criteo_dir, "unused"), "<test>", [f'model_dir="{model_dir}"', *STEPS, *extra])
    try:
        return train(Session(load_config(raw, registries), raw, pm, registries), resume=resume, overwrite=overwrite,
                     init_from=init_from)
    finally:
        shutdown_distributed()


def _results(model_dir: str | Path) -> list[dict]:
    return read_jsonl(tzrun.as_path(model_dir) / EVAL_RESULTS)


def _keys(url: str) -> list[str]:
    fs, inner = tzrun.filesystem(url)
    fs.invalidate_cache()
    return [k[len(inner.rstrip("/")) + 1:] for k in fs.find(inner)]


def test_one_rank_stopped_by_sigterm_on_s3_resumes_exactly_and_evaluate_ckpt_and_init_from_read_it(
        tmp_path, criteo_dir, s3_bucket):
    whole = Losses()
    _train(criteo_dir, str(tmp_path / "local"), whole)
    model_dir = f"{s3_bucket}/run"
    first = Losses(signal_at=4)
    stopped = _train(criteo_dir, model_dir, first, STAGES)
    assert stopped.stopped_by == "SIGTERM" and stopped.steps == 4
    assert [s for s, _ in list_checkpoints(model_dir)] == [3, 4]
    assert "run.lock" not in _keys(model_dir)  # released at the end
    second = Losses()
    resumed = _train(criteo_dir, model_dir, second, STAGES, resume=True)
    assert resumed.steps == 6 and resumed.stopped_by is None
    assert {**first.steps, **second.steps} == whole.steps  # the same loss at every step, exactly
    assert _results(model_dir) == _results(tmp_path / "local")  # evaluations at 3 and 6, to the last bit
    metrics = read_jsonl(f"{model_dir}/metrics.jsonl")
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]  # each step once
    keys = _keys(model_dir)
    assert {"checkpoints/step-6/COMPLETE", "checkpoints/step-6/manifest.json", "checkpoints/step-6/state/.metadata",
            "env.json", "resolved_config.toml"} <= set(keys)
    assert any(k.startswith("profiler/rank0.") for k in keys), keys
    events = tmp_path / "events"
    fsspec.filesystem("s3").get(f"{model_dir.removeprefix('s3://')}/train/", str(events / "train"), recursive=True)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train = EventAccumulator(str(events / "train"), size_guidance={"scalars": 0}).Reload()
    assert sorted({e.step for e in train.Scalars("loss/total")}) == [1, 2, 3, 4, 5, 6]

    listed = cli(["ckpt", "ls", model_dir])
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [line.split()[:5] for line in listed.stdout.splitlines()[1:]] == [
        ["step-3", "3", "0", "1", "complete"], ["step-4", "4", "0", "1", "complete"], ["step-6", "6", "0", "1", "complete"]]
    inspected = cli(["ckpt", "inspect", f"{model_dir}/checkpoints/step-4", "--json"])
    assert inspected.returncode == 0, inspected.stderr[-2000:]
    assert json.loads(inspected.stdout)["manifest"]["state"] == "ok"

    config = tmp_path / "run.toml"
    config.write_text(tiny_config_text(criteo_dir, "unused"))
    evaluated = cli(["evaluate", str(config), "--model-dir", model_dir, "--checkpoint", "step-6", *[
        a for o in STEPS for a in ("--set", o)]])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    last = _results(model_dir)[-1]
    assert last["command"] == "evaluate" and last["checkpoint"] == f"{model_dir}/checkpoints/step-6"
    assert {k: last[k] for k in ("auc", "loss/binary_cross_entropy")} == {
        k: _results(tmp_path / "local")[-1][k] for k in ("auc", "loss/binary_cross_entropy")}

    from tzrun.runner.init_from import InitFrom

    warm = f"{s3_bucket}/warm"
    started = _train(criteo_dir, warm, Losses(), "train.num_steps=1",
                     init_from=InitFrom(f"{model_dir}/checkpoints/step-6", None, False, (), ()))
    assert started.steps == 1
    report = json.loads(tzrun.as_path(f"{warm}/init_report.json").read_text())
    assert report["checkpoint"] == f"{model_dir}/checkpoints/step-6" and report["loaded"]

    _train(criteo_dir, model_dir, Losses(), "train.num_steps=1", overwrite=True)  # the earlier run's outputs go
    assert [s for s, _ in list_checkpoints(model_dir)] == [1]
    assert [r["step"] for r in _results(model_dir)] == [1]
    assert not [k for k in _keys(model_dir) if k.startswith(("train/", "eval/", "profiler/", "metrics.jsonl"))]


def _torchrun(criteo_dir: Path, tmp_path: Path, model_dir: str, *flags: str, fault: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    if fault:
        env.update({**fault_plugin.install(Path(tempfile.mkdtemp(dir=tmp_path, prefix="site-"))),
                    fault_plugin.ENV: fault, "TZRUN_STRICT_PLUGINS": "1"})
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text().replace("num_epochs = 1", ""))
    overrides = example_overrides(criteo_dir, "", "train.num_steps=8", "train.save_checkpoints_steps=3")
    overrides = [o for o in overrides if not o.startswith("model_dir")] + [f'model_dir="{model_dir}"']
    cmd = [str(warm_executable()), "-m", "tzrun", "train", str(config), *[a for o in overrides for a in ("--set", o)],
           "--nproc-per-node", "2", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing is left behind
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.multiproc
def test_two_ranks_on_s3_sigterm_then_a_kill_during_save_resume_to_the_uninterrupted_result(
        tmp_path, criteo_dir, s3_bucket):
    whole = _torchrun(criteo_dir, tmp_path, f"{s3_bucket}/whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    model_dir = f"{s3_bucket}/run"
    stopped = _torchrun(criteo_dir, tmp_path, model_dir, fault="signal@4:1:SIGTERM")
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    at = [s for s, _ in list_checkpoints(model_dir)]
    assert at[0] == 3 and 4 <= at[-1] <= 6, at
    # the resumed job: rank 0 is killed while writing step 8 (its state saved, no marker yet);
    # torchrun restarts it, and it resumes from the last complete checkpoint
    resumed = _torchrun(criteo_dir, tmp_path, model_dir, "--resume", "--max-restarts", "1",
                        fault="kill-during-save@8:0")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    resumed_from = [line for line in resumed.stderr.splitlines() if "resuming from" in line]
    assert len(resumed_from) == 2 and f"step-{at[-1]}" in resumed_from[-1], resumed_from
    assert [s for s, _ in list_checkpoints(model_dir)][-1] == 8
    assert _results(model_dir)[-1] == _results(f"{s3_bucket}/whole")[-1]  # the same eval values, to the last bit
