"""``tzrec-run install-stack [--cuda] [--dry-run]``: install what is missing of the torch /
FBGEMM / TorchRec stack into the running Python's environment, with pip.

1. torch 2.13 alone (``--no-deps``) from PyTorch's index for the stack, unless a 2.13 is
   installed: PyPI's torch for Linux is a CUDA build of several GB, and asking PyTorch's index
   about torch only keeps every other package on the usual indexes;
2. FBGEMM 1.8 (``fbgemm-gpu-cpu``, or ``fbgemm-gpu`` with ``--cuda``) and torch's own
   dependencies, from the usual indexes;
3. TorchRec 1.8.0 with its metadata corrected (:mod:`tzrun.tools.torchrec_wheel`).

Each step runs only when what it installs is missing or of the wrong release, so a second run
installs nothing. The environment then passes ``pip check``.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tzrun.stack import TORCH_INDEX, TORCH_RANGE
from tzrun.stack import installed_version as _version
from tzrun.tools.torchrec_wheel import FBGEMM_DISTRIBUTIONS, FBGEMM_RANGE, local_version

__all__ = ["install_steps", "install_stack"]


def _release(version: str | None, prefix: str) -> bool:
    return version is not None and re.match(re.escape(prefix) + r"(\.|$|\+)", version) is not None


def install_steps(stack: str, python: str = sys.executable) -> list[list[str]]:
    """The pip commands (argument lists) that install what is missing of ``stack``; TorchRec's
    step is the last, as ``[python, "-m", "tzrun.tools.torchrec_wheel", ...]``."""
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    steps = []
    torch_ok = _release(_version("torch"), "2.13")
    if not torch_ok:
        steps.append([*pip, "--no-deps", "--index-url", TORCH_INDEX[stack], f"torch{TORCH_RANGE}"])
    if not torch_ok or not _release(_version(FBGEMM_DISTRIBUTIONS[stack]), "1.8"):
        steps.append([*pip, f"torch{TORCH_RANGE}", f"{FBGEMM_DISTRIBUTIONS[stack]}{FBGEMM_RANGE}"])
    if _version("torchrec") != local_version(stack):
        steps.append([python, "-m", "tzrun.tools.torchrec_wheel", "--stack", stack])
    return steps


def install_stack(stack: str, dry_run: bool = False) -> int:
    """Run :func:`install_steps` for ``stack``, printing each command first; returns the exit
    code (pip's, when a step fails)."""
    steps = install_steps(stack)
    if not steps:
        print(f"the {stack} stack is installed: torch {_version('torch')}, "
              f"{FBGEMM_DISTRIBUTIONS[stack]} {_version(FBGEMM_DISTRIBUTIONS[stack])}, torchrec {_version('torchrec')}")
        return 0
    for step in steps:
        print("+ " + " ".join(["python", *step[1:]]), flush=True)
        if dry_run:
            continue
        done = subprocess.run(step)
        if done.returncode != 0:
            return done.returncode
    return 0
