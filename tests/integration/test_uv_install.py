"""tzrec-run installed into an environment made by ``uv venv`` (which has no pip), with the
README's uv commands, then ``install-stack --dry-run``, ``install-stack`` and ``env``; and
``install-stack`` against an index it cannot reach, or one without the build it needs.

torch's CPU build (about 200 MB) comes from a wheel already on this machine when pip's configured
``find-links`` directories hold one (served as a local copy of PyTorch's index, so nothing is
downloaded twice); otherwise from PyTorch's index, as the README says.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, built_wheel
from tzrun.errors import EXIT_INSTALL
from tzrun.stack import TORCH_INDEX

pytestmark = pytest.mark.slow

_TORCH_WHEEL = f"torch-2.13.0+cpu-cp{sys.version_info[0]}{sys.version_info[1]}-cp{sys.version_info[0]}{sys.version_info[1]}-"


def readme_uv_commands() -> list[str]:
    """The README's uv block ("Install from a wheel"), one command a line."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Install from a wheel", 1)[1].split("\n## ", 1)[0]
    block = section.split("With [uv]", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def _local_torch_wheel() -> Path | None:
    """A torch 2.13.0+cpu wheel for this Python in one of pip's configured find-links directories."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    dirs = [os.environ.get("PIP_FIND_LINKS", "")]
    dirs += [line.split("=", 1)[1].strip("'\"") for line in listed.splitlines() if ".find-links=" in line]
    for entry in " ".join(dirs).split():
        folder = Path(entry.removeprefix("file://"))
        found = sorted(folder.glob(f"{_TORCH_WHEEL}*.whl")) if folder.is_dir() else []
        if found:
            return found[0]
    return None


def _simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index in ``root`` that serves ``wheels`` (torch's); its file:// URL."""
    (root / "torch").mkdir(parents=True)
    links = "".join(f'<a href="{w.resolve().as_uri()}">{w.name}</a>\n' for w in wheels)
    (root / "torch" / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root.resolve().as_uri()


def _run(command: str | list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    args = shlex.split(command) if isinstance(command, str) else command
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_a_uv_environment_installs_the_stack_and_names_what_an_index_lacks(tmp_path, tmp_path_factory):
    uv = pytest.importorskip("uv").find_uv_bin()
    commands = readme_uv_commands()
    assert commands[0] == "uv venv ENV && source ENV/bin/activate" and commands[-1] == "tzrec-run install-stack"
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    dist.mkdir()
    shutil.copy(built_wheel(tmp_path_factory), dist)  # built once per session (tests/conftest.py)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{Path(uv).parent}{os.pathsep}{env.get('PATH', '')}",
               VIRTUAL_ENV=str(venv))
    made = _run([uv, "venv", "-q", str(venv), "--python", sys.executable], tmp_path, env)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    assert _run([python, "-c", "import pip"], work, env).returncode != 0  # uv's environment has no pip

    wheel = _local_torch_wheel()
    torch_index = _simple_index(tmp_path / "index", [wheel]) if wheel else TORCH_INDEX["cpu"]
    for command in commands[1:-1]:
        command = command.replace(TORCH_INDEX["cpu"], torch_index).replace("uv pip", f"{uv} pip")
        done = _run(command, dist, env)
        assert done.returncode == 0, f"{command}\n{done.stderr}"

    dry = _run("tzrec-run install-stack --dry-run", work, env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == ["+ python -m ensurepip --default-pip",
                                       "+ python -m tzrun_tools.torchrec_wheel --stack cpu"]
    assert _run([python, "-c", "import pip"], work, env).returncode != 0  # a dry run installs nothing
    stack = _run(commands[-1], work, env)
    assert stack.returncode == 0, stack.stderr
    good = _run("tzrec-run env", work, env)
    assert good.returncode == 0 and "a known-good triple" in good.stdout, good.stdout + good.stderr
    assert _run([python, "-m", "pip", "check"], work, env).returncode == 0

    # torch gone, and an index that cannot be reached (nor a local wheel directory in pip's config)
    assert _run([uv, "pip", "uninstall", "--python", python, "torch"], work, env).returncode == 0
    bare = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    bare["PIP_CONFIG_FILE"] = os.devnull
    gone = _run("tzrec-run install-stack --index-url http://127.0.0.1:9/", work, bare)
    assert gone.returncode == EXIT_INSTALL, gone.stderr
    assert gone.stderr.count("\n") == 1, gone.stderr
    assert gone.stderr == ("tzrec-run install-stack: cannot reach http://127.0.0.1:9/ for torch==2.13.0+cpu: let "
                           "this machine reach it, or name an index or mirror that holds torch==2.13.0+cpu: "
                           "`tzrec-run install-stack --index-url URL`\n")
    # an index that holds no CPU build for this Python
    empty = _simple_index(tmp_path / "empty", [])
    none = _run(f"tzrec-run install-stack --index-url {empty}", work, bare)
    assert none.returncode == EXIT_INSTALL and none.stderr.count("\n") == 1, none.stderr
    assert none.stderr.startswith(f"tzrec-run install-stack: {empty} has no torch==2.13.0+cpu for Python "
                                  f"{sys.version_info[0]}.{sys.version_info[1]}.")
    assert "CPython 3.10 to 3.14" in none.stderr and "uv venv --python 3.11" in none.stderr
