"""A directory is a run before anything in it is removed (issue 27, point 2): ``train`` into a
non-empty directory without tzrec-run's marker is refused (exit 78) and keeps every byte, with
or without ``--overwrite``; ``--overwrite`` of a marked run removes only the run's outputs; an
interrupted save is cleaned only in a marked dir; a run written before markers is adopted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli
from tzrun.config.load import parse_config
from tzrun.errors import EXIT_CONFIG
from tzrun.runner.checkpoint import remove_incomplete_checkpoints
from tzrun.runner.manifest import MANIFEST, MARKER, marker_bytes
from tzrun.runner.model_dir import claim_model_dir, refuse_foreign_model_dir
from tzrun.runner.records import RESOLVED_JSON, write_run_records
from tzrun.runner.run_lock import LOCK_FILE
from tzrun.runner.run_marker import (
    MARKER_FORMAT,
    RUN_MARKER,
    NotARunDirError,
    check_run_dir,
    read_run_marker,
    write_run_marker,
)
from tzrun.testing import load_config_text, tiny_config_text


def _foreign(root: Path) -> Path:
    """A user's directory that looks a little like a run: no marker, no resolved_config.json."""
    (root / "checkpoints" / "step-5").mkdir(parents=True)
    (root / "checkpoints" / "step-5" / "weights.bin").write_bytes(b"\x00\x01user weights")
    (root / "plots").mkdir()
    (root / "plots" / "x.png").write_bytes(b"\x89PNG not really")
    (root / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (root / "notes.txt").write_text("my notes\n")
    return root


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.fixture
def tiny(tmp_path, tzrun_pm):
    text = tiny_config_text(tmp_path / "data", tmp_path / "run").replace(
        "stages = []", 'stages = [{ type = "tensorboard" }, { type = "metrics_log" }]')
    return load_config_text(text, tzrun_pm)


@pytest.mark.parametrize("overwrite,resume", [(False, False), (True, False), (False, True)])
def test_a_foreign_directory_is_refused_before_and_when_claimed_and_keeps_every_byte(tmp_path, tiny, overwrite, resume):
    cfg, registries = tiny
    run = _foreign(tmp_path / "run")
    before = _snapshot(run)
    with pytest.raises(NotARunDirError) as refused:
        refuse_foreign_model_dir(run, overwrite=overwrite, rank=0, world_size=1)
    message = str(refused.value)
    assert "\n" not in message and refused.value.exit_code == EXIT_CONFIG
    assert f"{run} is not empty and is not a tzrec-run model dir (no {RUN_MARKER} marker; it holds checkpoints, " \
           "metrics.jsonl, notes.txt, plots)" in message
    assert message.endswith("choose an empty or new directory (--model-dir)")
    assert ("--overwrite removes only a tzrec-run model dir's own outputs" in message) == overwrite
    with pytest.raises(NotARunDirError):  # the claim itself refuses too (every caller, with the lock or not)
        claim_model_dir(run, cfg, registries, overwrite=overwrite, resume=resume, rank=0)
    assert remove_incomplete_checkpoints(run) == []  # step-5 has no COMPLETE, but this is not a run's dir
    assert _snapshot(run) == before


def _refuse_worker(rank: int, world_size: int, init_file: str, root: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        seen = Path(root) / ("foreign" if rank == 0 else "empty")  # rank 1 alone would see nothing wrong
        try:
            refuse_foreign_model_dir(seen, overwrite=True, rank=rank, world_size=world_size)
            outcome = "passed"
        except NotARunDirError as error:
            outcome = str(error)
        (Path(root) / f"rank{rank}.txt").write_text(outcome)
    finally:
        dist.destroy_process_group()


def test_every_rank_refuses_with_rank_0s_reading(tmp_path):
    from tests.warm_ranks import warm_spawn

    _foreign(tmp_path / "foreign")
    warm_spawn(_refuse_worker, (2, str(tmp_path / "store"), str(tmp_path)))
    outcomes = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert outcomes[0] == outcomes[1] and "foreign is not empty and is not a tzrec-run model dir" in outcomes[0]


@pytest.mark.slow
def test_train_into_a_foreign_directory_exits_78_with_one_line_and_changes_nothing(tmp_path, criteo_dir):
    run = _foreign(tmp_path / "run")
    before = _snapshot(run)
    config = tmp_path / "run.toml"
    config.write_text(tiny_config_text(criteo_dir, run))
    for flags in ([], ["--overwrite"]):
        done = cli(["train", str(config), *flags])
        assert done.returncode == EXIT_CONFIG, done.stderr[-3000:]
        errors = [line for line in done.stderr.splitlines() if "is not a tzrec-run model dir" in line]
        assert len(errors) == 1 and errors[0].endswith("choose an empty or new directory (--model-dir)"), done.stderr
        assert "Traceback" not in done.stderr
        assert _snapshot(run) == before  # no run.lock, no marker, no records


def test_overwrite_of_a_marked_run_removes_its_outputs_and_keeps_a_user_file(tmp_path, tiny):
    cfg, registries = tiny
    run = tmp_path / "run"
    (run / "checkpoints" / "step-4").mkdir(parents=True)
    (run / "checkpoints" / "step-4" / MARKER).write_text("step 4\n")
    (run / "tensorboard" / "train").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "logs" / "train.log").write_text("2026-11-27 03:03:14 INFO [rank 0] tzrun: training 4 steps\n")
    for name in ("metrics.jsonl", "eval_results.jsonl", "best.json", "env.json", RESOLVED_JSON,
                 "resolved_config.toml", "notes.txt"):
        (run / name).write_text("{}\n")
    old_id = write_run_marker(run)
    claim_model_dir(run, cfg, registries, overwrite=True, resume=False, rank=0)
    assert sorted(p.name for p in run.iterdir()) == [RUN_MARKER, "notes.txt"]
    assert (run / "notes.txt").read_text() == "{}\n"
    marker = read_run_marker(run)
    assert marker["format"] == MARKER_FORMAT and marker["run_id"] != old_id  # the replacing run is a new run


def test_an_interrupted_save_is_removed_in_a_marked_dir_and_a_new_dir_is_marked(tmp_path, tiny):
    cfg, registries = tiny
    run = tmp_path / "run"
    assert claim_model_dir(run, cfg, registries, overwrite=False, resume=False, rank=0) is None  # a new directory
    run_id = read_run_marker(run)["run_id"]
    (run / "checkpoints" / "step-3").mkdir(parents=True)  # a save that never finished
    assert claim_model_dir(run, cfg, registries, overwrite=False, resume=True, rank=0) is None
    assert not (run / "checkpoints" / "step-3").exists()
    assert read_run_marker(run)["run_id"] == run_id  # resuming is the same run


def test_a_directory_with_only_the_run_lock_is_empty_and_a_newer_marker_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("{}")
    assert check_run_dir(run) == "empty"
    (run / RUN_MARKER).write_text(json.dumps({"format": MARKER_FORMAT + 1}))
    with pytest.raises(NotARunDirError, match=rf"written by a newer tzrec-run \(marker format {MARKER_FORMAT + 1};"):
        check_run_dir(run)


def test_a_run_written_before_markers_is_adopted_and_resumed(tmp_path, tiny, caplog):
    cfg, registries = tiny
    run = tmp_path / "run"
    (run / "checkpoints" / "step-4").mkdir(parents=True)
    manifest = b"{}"  # the claim reads the marker only; a complete marker records the manifest's digest
    (run / "checkpoints" / "step-4" / MANIFEST).write_bytes(manifest)
    (run / "checkpoints" / "step-4" / MARKER).write_bytes(marker_bytes(4, manifest))
    raw = parse_config(tiny_config_text(tmp_path / "data", run), "<test>", [])
    write_run_records(run, cfg, raw, world_size=1, plugins=[])
    (run / "notes.txt").write_text("mine\n")
    assert check_run_dir(run) == "legacy"
    with caplog.at_level("WARNING", logger="tzrun.runner.model_dir"):
        resumed = claim_model_dir(run, cfg, registries, overwrite=False, resume=True, rank=0)
    assert resumed == run / "checkpoints" / "step-4"
    assert "written before tzrec-run marked its model dirs; adopting it" in caplog.text
    assert read_run_marker(run)["format"] == MARKER_FORMAT and (run / "notes.txt").read_text() == "mine\n"
