"""``tzrec-run install-stack [--cuda] [--dry-run] [--index-url URL]``: install what is missing of
the torch / FBGEMM / TorchRec stack into the running Python's environment, with pip.

0. pip itself, when the environment has none (a ``uv venv``): ``python -m ensurepip``, or
   ``uv pip install pip`` where the interpreter has no ensurepip;
1. torch 2.13 alone (``--no-deps``) from PyTorch's index for the stack (``torch==2.13.0+cpu``
   for the CPU stack: the label keeps pip from ever taking PyPI's CUDA build), unless a 2.13 is
   installed. Asking PyTorch's index about torch only keeps every other package on the usual
   indexes;
2. FBGEMM 1.8 (``fbgemm-gpu-cpu``, or ``fbgemm-gpu`` with ``--cuda``) and torch's own
   dependencies, from the usual indexes, with torch held to what step 1 installed;
3. TorchRec 1.8.0 with its metadata corrected (:mod:`tzrun_tools.torchrec_wheel`).

Each step runs only when what it installs is missing or of the wrong release, so a second run
installs nothing. The environment then passes ``pip check``. A step that fails ends the command
with one line (what could not be installed, why, and the next step) and
:data:`~tzrun.errors.EXIT_INSTALL`.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
import sys
from typing import NamedTuple

from tzrun.errors import EXIT_INSTALL
from tzrun.stack import INSTALL_STACK, TORCH_CPU_PYTHONS, TORCH_INDEX, TORCH_PIN, TORCH_RANGE, in_range
from tzrun.stack import installed_version as _version
from tzrun_tools.torchrec_wheel import FBGEMM_DISTRIBUTIONS, FBGEMM_RANGE, TORCHREC_VERSION, local_version

__all__ = ["Step", "install_steps", "install_stack", "failure_line"]

#: What pip prints when it cannot reach an index (urllib3's and requests' words for it).
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Name or service not known|Temporary failure in name "
    r"resolution|Connection refused|ConnectTimeout|timed out|ProxyError|SSLError|Network is unreachable|"
    r"No route to host|Could not fetch URL|Connection reset")
_NO_MATCH = re.compile(r"No matching distribution found for|from versions: none")


class Step(NamedTuple):
    """One command of an install: what it installs (for messages), its argument list, and the
    index it asks (None: the indexes pip is configured with)."""

    what: str
    argv: list[str]
    index: str | None = None


def _bootstrap(python: str) -> Step | None:
    """The step that gives the environment pip, or None when it has pip."""
    if importlib.util.find_spec("pip") is not None:
        return None
    uv = shutil.which("uv")
    if importlib.util.find_spec("ensurepip") is None and uv is not None:
        return Step("pip (with uv)", [uv, "pip", "install", "--python", python, "pip"])
    return Step("pip (with ensurepip)", [python, "-m", "ensurepip", "--default-pip"])


def install_steps(stack: str, python: str = sys.executable, index_url: str | None = None) -> list[Step]:
    """The commands that install what is missing of ``stack``; TorchRec's step is the last, as
    ``[python, "-m", "tzrun_tools.torchrec_wheel", ...]``.

    Args:
        stack: ``cpu`` or ``cuda``.
        python: the interpreter whose environment gets the stack.
        index_url: where torch comes from (default: PyTorch's index for the stack).
    """
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    fbgemm = FBGEMM_DISTRIBUTIONS[stack]
    torch_now = _version("torch")
    torch_ok = in_range(torch_now, TORCH_RANGE)
    steps = []
    if not torch_ok:
        index = index_url or TORCH_INDEX[stack]
        steps.append(Step(TORCH_PIN[stack], [*pip, "--no-deps", "--index-url", index, TORCH_PIN[stack]], index))
    if not torch_ok or not in_range(_version(fbgemm), FBGEMM_RANGE):
        held = f"torch=={torch_now}" if torch_ok else TORCH_PIN[stack]
        steps.append(Step(f"{fbgemm}{FBGEMM_RANGE}", [*pip, held, f"{fbgemm}{FBGEMM_RANGE}"]))
    if _version("torchrec") != local_version(stack):
        steps.append(Step(f"torchrec {TORCHREC_VERSION}", [python, "-m", "tzrun_tools.torchrec_wheel", "--stack", stack]))
    bootstrap = _bootstrap(python) if steps else None
    return [bootstrap, *steps] if bootstrap else steps


def _pip_said(stderr: str) -> str:
    """pip's last error line (or its last line), shortened for one line of ours."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    said = (errors or lines or ["no message"])[-1].removeprefix("ERROR: ")
    return said if len(said) <= 200 else said[:197] + "..."


def failure_line(step: Step, stderr: str) -> str:
    """The one line that says why ``step`` failed (from pip's standard error) and what to do."""
    again = f"then run `{INSTALL_STACK}` again (it installs only what is still missing)"
    where = step.index or "the package index pip is configured with (PyPI unless PIP_INDEX_URL says otherwise)"
    python = f"Python {platform.python_version()} on {platform.system()} {platform.machine()}"
    if step.what.startswith("pip "):
        return (f"cannot give this environment pip ({_pip_said(stderr)}): install pip into it "
                f"(`uv pip install --python {sys.executable} pip`), {again}")
    if _UNREACHABLE.search(stderr):
        fix = (f"let this machine reach it, or name an index or mirror that holds {step.what}: "
               f"`{INSTALL_STACK} --index-url URL`" if step.index else
               "let this machine reach it, or point pip at a mirror (PIP_INDEX_URL, or PIP_FIND_LINKS for a "
               f"directory of wheels), {again}")
        return f"cannot reach {where} for {step.what}: {fix}"
    if _NO_MATCH.search(stderr) and step.index:
        return (f"{step.index} has no {step.what} for {python}: PyTorch publishes torch 2.13.0's CPU build for "
                f"CPython {TORCH_CPU_PYTHONS} on Linux x86_64 and aarch64; make the environment with one of those "
                f"(`uv venv --python 3.11`, or `python3.11 -m venv`), or name an index that holds it with "
                f"`{INSTALL_STACK} --index-url URL`")
    if _NO_MATCH.search(stderr):
        return (f"{where} has no {step.what} for {python}: FBGEMM 1.8 and TorchRec 1.8 publish wheels for "
                f"CPython {TORCH_CPU_PYTHONS} on Linux; make the environment with one of those, {again}")
    return f"installing {step.what} failed: pip says: {_pip_said(stderr)}; fix that, {again}"


def install_stack(stack: str, dry_run: bool = False, index_url: str | None = None) -> int:
    """Run :func:`install_steps` for ``stack``, printing each command first.

    Returns:
        0, or :data:`~tzrun.errors.EXIT_INSTALL` after one line on standard error
        (:func:`failure_line`) when a step fails; pip's own standard error is shown only when
        the step succeeds (its warnings).
    """
    steps = install_steps(stack, index_url=index_url)
    if not steps:
        print(f"the {stack} stack is installed: torch {_version('torch')}, "
              f"{FBGEMM_DISTRIBUTIONS[stack]} {_version(FBGEMM_DISTRIBUTIONS[stack])}, torchrec {_version('torchrec')}")
        return 0
    for step in steps:
        shown = step.argv if step.argv[0] != sys.executable else ["python", *step.argv[1:]]
        print("+ " + " ".join(shown), flush=True)
        if dry_run:
            continue
        done = subprocess.run(step.argv, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            print(f"tzrec-run install-stack: {failure_line(step, done.stderr)}", file=sys.stderr)
            return EXIT_INSTALL
        sys.stderr.write(done.stderr)
    return 0
