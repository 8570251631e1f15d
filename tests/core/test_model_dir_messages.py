"""A model dir where a checkpoint is expected, and a model dir left by a run that saved
nothing (issue 17, point 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cli
from tzrun.errors import EXIT_CHECKPOINT, CheckpointError
from tzrun.runner.inspect import describe_checkpoint
from tzrun.runner.manifest import MANIFEST, MARKER, marker_bytes


def _model_dir(tmp_path: Path, complete: list[int], incomplete: list[int] = ()) -> Path:
    model_dir = tmp_path / "run"
    for step in [*complete, *incomplete]:
        (model_dir / "checkpoints" / f"step-{step}").mkdir(parents=True)
    for step in complete:  # a complete marker records its manifest's digest
        (model_dir / "checkpoints" / f"step-{step}" / MANIFEST).write_bytes(b"{}")
        (model_dir / "checkpoints" / f"step-{step}" / MARKER).write_bytes(marker_bytes(step, b"{}"))
    return model_dir


def test_ckpt_inspect_of_a_model_dir_says_it_is_one_and_names_its_checkpoints(tmp_path: Path):
    model_dir = _model_dir(tmp_path, [4, 8], [12])
    done = cli(["ckpt", "inspect", str(model_dir)])
    assert done.returncode == EXIT_CHECKPOINT
    assert "never finished" not in done.stderr
    assert f"{model_dir}: is a model dir, not a checkpoint (its complete checkpoints: step-4, step-8)" in done.stderr
    assert f"tzrec-run ckpt ls {model_dir}" in done.stderr
    assert f"tzrec-run ckpt inspect {model_dir / 'checkpoints' / 'step-8'}" in done.stderr


def test_ckpt_inspect_of_a_model_dir_without_checkpoints(tmp_path: Path):
    model_dir = _model_dir(tmp_path, [], [3])
    with pytest.raises(CheckpointError, match=r"is a model dir, not a checkpoint \(it has no complete checkpoint yet\)"):
        describe_checkpoint(model_dir)
