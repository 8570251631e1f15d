"""What of the torch / FBGEMM / TorchRec stack and of tzrec-run's extras is installed, and the
one command that installs what is missing. Imports nothing heavy (``tzrec-run env`` and the
checks before ``train``, ``evaluate`` and ``check`` use it before torch is imported).

The stack is installed by ``tzrec-run install-stack`` (:mod:`tzrun_tools.install_stack`): torch
2.13 from PyTorch's index for the stack, FBGEMM 1.8 and TorchRec 1.8.0 with its metadata
corrected (:mod:`tzrun_tools.torchrec_wheel`). Everything it names works for a user who installed
tzrec-run from a wheel: no file of the repository is needed.
"""

from __future__ import annotations

import importlib.util
import platform
from typing import Mapping
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tzrun.errors import MissingDependencyError

__all__ = [
    "TORCH_INDEX", "TORCH_RANGE", "TORCH_PIN", "TORCH_CPU_PYTHONS", "in_range", "EXTRAS", "INSTALL_STACK",
    "detect_stack", "install_stack_command",
    "extra_command", "missing_extras", "require_stack", "require_extra", "torchrec_needs_correction", "join_and",
    "installed_version", "stack_versions", "check_stack",
]

#: PyTorch's wheel index for each stack (PyPI's torch for Linux is a CUDA build).
TORCH_INDEX = {"cpu": "https://download.pytorch.org/whl/cpu", "cuda": "https://download.pytorch.org/whl/cu128"}
#: The torch releases FBGEMM 1.8 is built for (FBGEMM 1.X goes with torch 2.(X+5)).
TORCH_RANGE = ">=2.13,<2.14"
#: The torch each stack installs when none of :data:`TORCH_RANGE` is: for the CPU stack the
#: ``+cpu`` build, which no index but PyTorch's CPU index (or a mirror of it) holds, so pip can
#: never settle for PyPI's CUDA build of the same version.
TORCH_PIN = {"cpu": "torch==2.13.0+cpu", "cuda": f"torch{TORCH_RANGE}"}
#: The Pythons torch 2.13.0 (CPU and CUDA builds), fbgemm-gpu-cpu 1.8.0 and TorchRec 1.8.0 publish
#: wheels for (the classifiers of pyproject.toml say the same).
TORCH_CPU_PYTHONS = "3.10 to 3.14"
#: tzrec-run's optional extras: the import each needs, and what it is for.
EXTRAS = {
    "tensorboard": ("tensorboard", "the tensorboard stage"),
    "plot": ("matplotlib", "tzrec-run plot"),
    "s3": ("s3fs", "s3:// paths"),
    "gcs": ("gcsfs", "gs:// paths"),
    "azure": ("adlfs", "abfs:// and az:// paths"),
    "mlflow": ("mlflow", "the mlflow stage"),
}
#: The command that installs the stack (what is missing of it, or all of it).
INSTALL_STACK = "tzrec-run install-stack"

_MODULES = {"torch": "torch", "fbgemm_gpu": "fbgemm_gpu", "torchrec": "torchrec"}


def installed_version(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` that is installed, or None."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def stack_versions() -> dict[str, str | None]:
    """Installed versions of the packages a run depends on (None when not installed)."""
    return {
        "python": platform.python_version(),
        "tzrec-run": installed_version("tzrec-run"),
        "torch": installed_version("torch"),
        "fbgemm_gpu": installed_version("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-gpu-nightly", "fbgemm-gpu-genai"),
        "torchrec": installed_version("torchrec", "torchrec-nightly"),
        "torchmetrics": installed_version("torchmetrics"),
        "pyarrow": installed_version("pyarrow"),
        "numpy": installed_version("numpy"),
        "pluggy": installed_version("pluggy"),
    }


def _parse(version: str | None) -> Version | None:
    try:
        return Version(version) if version else None
    except InvalidVersion:
        return None


def _minor(version: str | None) -> tuple[int, int] | None:
    parsed = _parse(version)
    if parsed is None:
        return None
    major, minor = (*parsed.release, 0)[:2]
    return major, minor


def in_range(version: str | None, specifier: str) -> bool:
    """Whether ``version`` (e.g. ``2.13.0+cpu``, a pre-release too) is in ``specifier``
    (e.g. ``>=2.13,<2.14``); False for None or a version that does not parse."""
    parsed = _parse(version)
    return parsed is not None and SpecifierSet(specifier).contains(parsed, prereleases=True)


def check_stack(versions: Mapping[str, str | None]) -> list[str]:
    """Problems with the torch / fbgemm / torchrec triple: FBGEMM 1.X is built for torch
    2.(X+5), and torchrec 1.X goes with FBGEMM 1.X. Empty when the triple is known-good."""
    torch_v, fbgemm_v, torchrec_v = (_minor(versions.get(k)) for k in ("torch", "fbgemm_gpu", "torchrec"))
    problems = []
    for name, parsed in (("torch", torch_v), ("fbgemm_gpu", fbgemm_v), ("torchrec", torchrec_v)):
        if parsed is None:
            problems.append(f"{name} is not installed")
    if torch_v and fbgemm_v:
        if fbgemm_v[0] != 1 or torch_v != (2, fbgemm_v[1] + 5):
            want = f"torch 2.{fbgemm_v[1] + 5}" if fbgemm_v[0] == 1 else "the torch its release notes name"
            problems.append(
                f"fbgemm_gpu {versions['fbgemm_gpu']} is built for {want}, but torch is {versions['torch']}: "
                "its kernels may fail to load or crash; install the matching pair (tzrec-run install-stack "
                "installs torch 2.13 with FBGEMM 1.8 and TorchRec 1.8)")
    if fbgemm_v and torchrec_v and torchrec_v != fbgemm_v:
        problems.append(
            f"torchrec {versions['torchrec']} goes with fbgemm_gpu {torchrec_v[0]}.{torchrec_v[1]}, but fbgemm_gpu is "
            f"{versions['fbgemm_gpu']}; install matching releases (torchrec 1.X with fbgemm 1.X)")
    return problems


def join_and(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def detect_stack() -> str:
    """``cuda`` when FBGEMM's CUDA build is installed, else ``cpu``."""
    return "cuda" if installed_version("fbgemm-gpu") is not None else "cpu"


def install_stack_command(stack: str | None = None) -> str:
    """The one command that installs what is missing of the stack for ``stack`` (default: the
    installed FBGEMM's, else the CPU stack)."""
    return INSTALL_STACK + (" --cuda" if (stack or detect_stack()) == "cuda" else "")


def extra_command(extra: str) -> str:
    """The command that installs ``extra``'s packages, e.g. ``pip install 'tzrec-run[plot]'``."""
    return f"pip install 'tzrec-run[{extra}]'"


def missing_extras() -> list[str]:
    """The extras (of :data:`EXTRAS`) whose package is not installed."""
    return [extra for extra, (module, _) in EXTRAS.items() if importlib.util.find_spec(module) is None]


def require_stack() -> None:
    """Raise a one-line error when torch, FBGEMM or TorchRec cannot be imported (``train``,
    ``evaluate``, ``check`` and ``plan`` need all three).

    Only looks the modules up (no import), so it costs milliseconds.

    Raises:
        MissingDependencyError: naming what is missing and :func:`install_stack_command`.
    """
    missing = [name for name, module in _MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingDependencyError(
            f"{join_and(missing)} {'is' if len(missing) == 1 else 'are'} not installed (train, evaluate, check "
            f"and plan need torch, FBGEMM and TorchRec): run `{install_stack_command()}`")


def require_extra(extra: str) -> None:
    """Raise a one-line error when ``extra``'s package is not installed.

    Raises:
        MissingDependencyError: naming the extra and :func:`extra_command`.
    """
    module, what = EXTRAS[extra]
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(
            f"{what} needs {module}, which is not installed: run `{extra_command(extra)}`")


def torchrec_needs_correction(version: str | None) -> bool:
    """Whether the installed TorchRec is the published 1.8 wheel, whose metadata asks for the
    CUDA FBGEMM and torchmetrics 1.0.3 (``pip check`` fails) rather than the corrected one."""
    parsed = _parse(version)
    return parsed is not None and parsed.release[:2] == (1, 8) and not (parsed.local or "").startswith("tzrun")
