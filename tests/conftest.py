"""Shared fixtures: tzrun's own pytest plugin, a small synthetic Criteo set, a run helper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# tests.s3_server: the loopback S3 server fixtures of the remote-storage tests
pytest_plugins = ["tzrun.testing", "tests.s3_server"]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "deepfm_criteo.toml"


@pytest.fixture(scope="session")
def criteo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic Criteo-like dataset (shared by the whole session; read-only)."""
    from tzrun_tools.synth import synth_criteo

    out = tmp_path_factory.mktemp("criteo")
    synth_criteo(out, rows=12_000, eval_rows=3_001, seed=7, rows_per_file=5_000, row_group_size=2_000)
    return out


def example_overrides(criteo_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    """``--set`` overrides that point the DeepFM example at ``criteo_dir`` with small steps."""
    return [
        f'data.train_input="{criteo_dir / "train"}"',
        f'data.eval_input="{criteo_dir / "eval"}"',
        f'model_dir="{model_dir}"',
        "data.batch_size=1024",
        "data.eval_batch_size=1024",
        "data.num_workers=0",
        "model.deep_hidden_units=[32, 16]",
        "model.final_hidden_units=[16]",
        "train.log_every_n_steps=4",
        *extra,
    ]


def run_cli(args: list[str], *, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tzrun ARGS`` and return the finished process (output captured)."""
    # a native crash prints the Python stacks of every thread (shown by the failing assertion)
    full_env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tzrun", *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO
    )
