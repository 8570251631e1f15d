"""The GPU smoke suite: every test here is marked ``gpu`` and skipped where CUDA is not available.

Run it on a machine with NVIDIA GPUs through ``bash scripts/gpu_smoke.sh`` (which sets up the
CUDA stack first), or by hand with ``python -m pytest tests/gpu``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def skip_reason() -> str | None:
    """Why this machine cannot run the suite, or None when it can."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU-only build")
    return f"needs CUDA: torch.cuda.is_available() is False ({build}); run scripts/gpu_smoke.sh on a machine with NVIDIA GPUs"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.gpu)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
