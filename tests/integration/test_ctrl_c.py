"""Ctrl-C (SIGINT) stops a run like SIGTERM: a checkpoint at the step it stopped, exit code
75, no traceback, and ``--resume`` finishes the run (issue 17)."""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLE, cli, example_overrides
from tests.warm_ranks import warm_cli
from tests.integration import fault_plugin
from tests.integration.test_train import _results, _sets
from tzrun.runner.checkpoint import is_complete, list_checkpoints
from tzrun.runner.signals import EXIT_STOPPED_BY_SIGNAL

pytestmark = pytest.mark.slow


def _train(criteo_dir, model_dir, *args, env=None):
    config = EXAMPLE.read_text().replace("num_epochs = 1", "")
    path = model_dir.parent / "run.toml"
    path.write_text(config)
    overrides = example_overrides(criteo_dir, model_dir, "train.num_steps=10", "train.save_checkpoints_steps=6",
                                  "data.num_workers=1")
    # Ctrl-C needs a process of its own (forked warm: tests/warm_ranks.py); the resume does not
    return warm_cli(["train", str(path), *_sets(overrides), *args], env=env) if env else cli(["train", str(path), *_sets(overrides), *args])


def test_ctrl_c_saves_a_checkpoint_exits_75_without_a_traceback_and_resumes(criteo_dir, tmp_path):
    model_dir = tmp_path / "run"
    env = {**fault_plugin.install(tmp_path / "site"), fault_plugin.ENV: "signal@4:0:SIGINT"}
    stopped = _train(criteo_dir, model_dir, env=env)
    assert stopped.returncode == EXIT_STOPPED_BY_SIGNAL, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr
    assert "stopped by SIGINT at step 4" in stopped.stdout
    assert [s for s, _ in list_checkpoints(model_dir)] == [4] and is_complete(model_dir / "checkpoints" / "step-4")

    resumed = _train(criteo_dir, model_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    assert [s for s, _ in list_checkpoints(model_dir)][-1] == 10 and _results(model_dir)[-1]["step"] == 10


def test_ctrl_c_at_a_terminal_reaches_the_data_workers_too_and_still_saves(criteo_dir, tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    model_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text().replace("num_epochs = 1", ""))
    overrides = example_overrides(criteo_dir, model_dir, "train.num_steps=10", "data.num_workers=2")
    env = {**os.environ, **fault_plugin.install(tmp_path / "site"), fault_plugin.ENV: "signal-group@4:0:SIGINT"}
    stopped = subprocess.run(  # a session of its own: the group signal reaches this job only
        [sys.executable, "-m", "tzrun", "train", str(config), *_sets(overrides)],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO, start_new_session=True,
    )
    assert stopped.returncode == EXIT_STOPPED_BY_SIGNAL, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "stopped by SIGINT at step 4" in stopped.stdout
    assert [s for s, _ in list_checkpoints(model_dir)] == [4]
