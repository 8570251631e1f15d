"""tzrec-run installed as a user would: the wheel built from this repository, installed into a
fresh virtual environment outside it with the README's commands only ("Install from a wheel"),
then ``env``, ``init``, the ``data synth`` command ``init`` prints, ``train``, ``plot`` and ``check``
run from a directory outside the repository."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, built_wheel
from tzrun.errors import EXIT_CONFIG

pytestmark = pytest.mark.slow

_WHEEL = "tzrec_run-0.1.0-py3-none-any.whl"


def readme_install_commands() -> list[str]:
    """The commands of the README's "Install from a wheel" block that install into an environment
    (``python -m pip install ...`` and ``tzrec-run install-stack``), in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Install from a wheel", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    return [c for c in commands if c.startswith("python -m pip install") or c.startswith("tzrec-run install-stack")]


#: seconds each command took, printed at the end of the test (run pytest with -s to see them)
_TIMES: dict[str, float] = {}


def _run(command: list[str] | str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    args = shlex.split(command) if isinstance(command, str) else command
    started = time.monotonic()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    _TIMES[f"{len(_TIMES) + 1:2d}. " + " ".join(Path(a).name if os.sep in a else a for a in args)[:90]] = (
        time.monotonic() - started)
    return done


def test_wheel_installs_and_trains_outside_the_repository(tmp_path, tmp_path_factory):
    started = time.monotonic()
    commands = readme_install_commands()
    assert len(commands) == 3 and commands[-1] == "tzrec-run install-stack", commands
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    # the build itself is not what this test is about: the project's own setuptools, no isolation,
    # once per session (tests/integration/test_uv_install.py installs the same wheel)
    dist.mkdir()
    shutil.copy(built_wheel(tmp_path_factory), dist / _WHEEL)
    python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert _run([str(python), "-m", "venv", str(venv)], tmp_path, dict(os.environ)).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    # pip compiles every module it installs (15 s for torch alone) where the commands below import
    # about a third of them: here each is compiled when first imported instead, and kept (pip's
    # PIP_NO_COMPILE reads "0" as --no-compile; PYTHONDONTWRITEBYTECODE, which CI images often
    # set, would compile them again in every process)
    env["PIP_NO_COMPILE"] = "0"
    env.setdefault("PIP_RETRIES", "0")  # an index this machine cannot reach fails at once, not after retries
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    # the README's commands, up to the stack's: tzrec-run runs and says what is missing
    for command in commands[:-1]:
        done = _run(command, dist, env)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
    missing = _run("tzrec-run env", work, env)
    assert missing.returncode != 0 and "problem: torchrec is not installed" in missing.stderr
    assert "to install torchrec, run: tzrec-run install-stack" in missing.stderr
    init = _run("tzrec-run init --example deepfm_criteo", work, env)
    assert init.returncode == 0, init.stderr
    untrained = _run("tzrec-run train deepfm_criteo.toml", work, env)
    assert untrained.returncode == EXIT_CONFIG and untrained.stderr.count("\n") == 1, untrained.stderr
    assert "torchrec is not installed" in untrained.stderr and "run `tzrec-run install-stack`" in untrained.stderr
    stack = _run(commands[-1], dist, env)
    assert stack.returncode == 0, stack.stderr
    check = _run([str(venv / "bin" / "python"), "-m", "pip", "check"], work, env)
    assert check.returncode == 0, check.stdout

    # init's commands, with few rows
    synth = re.search(r"^  (tzrec-run data synth .*)$", init.stdout, re.M)
    assert synth is not None and "tzrec-run train deepfm_criteo.toml" in init.stdout, init.stdout
    made = _run(re.sub(r"--rows \d+", "--rows 4096", synth.group(1)), work, env)
    assert made.returncode == 0 and "wrote 4096 train" in made.stdout, made.stderr
    trained = _run("tzrec-run train deepfm_criteo.toml", work, env)
    assert trained.returncode == 0, trained.stderr
    assert "trained 2 steps" in trained.stdout and "final eval at step 2 over 1000 rows: auc=" in trained.stdout
    assert (work / "runs" / "deepfm_criteo" / "checkpoints" / "step-2").is_dir()
    good = _run("tzrec-run env", work, env)
    assert good.returncode == 0 and "a known-good triple" in good.stdout, good.stderr
    assert re.search(r"^torchrec +1\.8\.0\+tzrun\.cpu$", good.stdout, re.M), good.stdout
    # an extra that is not installed is one line naming it
    plot = _run("tzrec-run plot runs/deepfm_criteo", work, env)
    assert plot.returncode == EXIT_CONFIG
    assert plot.stderr == "tzrec-run: tzrec-run plot needs matplotlib, which is not installed: run `pip install 'tzrec-run[plot]'`\n"
    board = _run(["tzrec-run", "check", "deepfm_criteo.toml", "--no-data", "--set", 'train.stages=[{type = "tensorboard"}]'],
                 work, env)
    assert board.returncode == EXIT_CONFIG
    assert "train.stages[0]: the tensorboard stage needs TensorBoard, which is not installed: run `pip install " \
           "'tzrec-run[tensorboard]'`" in board.stderr, board.stderr
    print(f"wheel build, fresh install and a 2-step run outside the repository: {time.monotonic() - started:.1f} s")
    for command, seconds in _TIMES.items():
        print(f"  {seconds:6.1f} s  {command}")
