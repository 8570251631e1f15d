"""The third-party distributions type-check against tzrun's public API (``py.typed``):
``mypy --strict`` passes on ``contrib_optimizers`` and ``contrib_metrics``, as it does on a
plugin made from the template (``test_new_plugin.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_mypy_strict_accepts_the_contrib_distributions(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / ".mypy_cache"),
         "contrib_optimizers/src", "contrib_metrics/src"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout
