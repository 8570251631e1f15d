"""The model dir's small files on S3 (a real moto server on loopback): atomic writes, JSON
lines (appended by rewriting the object), the run lock's exclusive create, the run marker, and checkpoint
listing, retention and clean-up through the store's own listing and delete."""

from __future__ import annotations

import json
import os
import socket

import pytest

import tzrun
from tzrun.errors import StorageError
from tzrun.io.files import read_jsonl
from tzrun.runner.checkpoint import list_checkpoints, remove_incomplete_checkpoints
from tzrun.runner.manifest import MANIFEST, MARKER, check_checkpoint, describe_files, manifest_bytes, marker_bytes
from tzrun.runner.retention import prune_checkpoints, read_best, record_best
from tzrun.runner.run_lock import LOCK_FILE, ModelDirLockedError, acquire_run_lock
from tzrun.runner.run_marker import RUN_MARKER, NotARunDirError, check_run_dir, read_run_marker, write_run_marker


def test_atomic_writes_and_json_lines_on_s3(s3_bucket: str) -> None:
    path = f"{s3_bucket}/run/eval_results.jsonl"
    assert tzrun.keep_jsonl(path, lambda r: True) == 0  # no file yet
    for step in (1, 2, 3):
        tzrun.append_jsonl(path, {"step": step, "auc": step / 10})
    assert read_jsonl(path) == [{"step": s, "auc": s / 10} for s in (1, 2, 3)]
    assert tzrun.keep_jsonl(path, lambda r: r["step"] <= 2) == 1
    tzrun.append_jsonl(path, {"step": 3, "auc": 0.5})  # read back after the rewrite, not a cached copy
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    tzrun.write_atomic(f"{s3_bucket}/run/best.json", b'{"a": 1}')
    tzrun.write_atomic(f"{s3_bucket}/run/best.json", b'{"a": 2}')
    assert json.loads(tzrun.as_path(f"{s3_bucket}/run/best.json").read_text()) == {"a": 2}
    fs, inner = tzrun.filesystem(f"{s3_bucket}/run")
    assert sorted(k.rsplit("/", 1)[-1] for k in fs.find(inner)) == ["best.json", "eval_results.jsonl"]  # no temp files


def test_a_second_run_is_refused_the_run_lock_on_s3_and_a_released_lock_is_free(s3_bucket: str) -> None:
    model_dir = f"{s3_bucket}/run"
    lock = acquire_run_lock(model_dir, command="tzrec-run train first.toml")
    holder = json.loads(tzrun.as_path(f"{model_dir}/{LOCK_FILE}").read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(ModelDirLockedError, match=rf"{model_dir} is in use by another run \(host .*pid {os.getpid()}.*"
                                                  r"tzrec-run train first.toml\); wait for it to end"):
        acquire_run_lock(model_dir, command="tzrec-run train second.toml")
    lock.release()
    assert not tzrun.as_path(f"{model_dir}/{LOCK_FILE}").exists()
    acquire_run_lock(model_dir).release()


def test_a_lock_from_another_host_is_refused_with_the_command_that_removes_it(s3_bucket: str) -> None:
    lock = tzrun.as_path(f"{s3_bucket}/run/{LOCK_FILE}")
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": 0, "command": "tzrec-run train"}))
    with pytest.raises(ModelDirLockedError, match=rf"on another host.*remove its lock \(rm {s3_bucket}/run/{LOCK_FILE}\)"):
        acquire_run_lock(f"{s3_bucket}/run")


def _checkpoint(model_dir: str, step: int, *, complete: bool = True) -> None:
    root = tzrun.as_path(f"{model_dir}/checkpoints/step-{step}")
    (root / "state" / "__0_0.distcp").write_bytes(b"x" * step)
    (root / "meta.json").write_text(json.dumps({"step": step}))
    manifest = manifest_bytes(step, describe_files(root, ["meta.json", "state/__0_0.distcp"]))
    (root / MANIFEST).write_bytes(manifest)
    if complete:
        (root / MARKER).write_bytes(marker_bytes(step, manifest))


def test_checkpoints_on_s3_are_listed_checked_pruned_and_cleaned_up(s3_bucket: str) -> None:
    model_dir = f"{s3_bucket}/run"
    for step in (2, 4, 6, 8):
        _checkpoint(model_dir, step)
    _checkpoint(model_dir, 10, complete=False)  # a save that never finished
    assert [s for s, _ in list_checkpoints(model_dir)] == [2, 4, 6, 8]
    assert check_checkpoint(f"{model_dir}/checkpoints/step-4").state == "ok"
    tzrun.as_path(f"{model_dir}/checkpoints/step-4/state/__0_0.distcp").write_bytes(b"y" * 4)
    assert check_checkpoint(f"{model_dir}/checkpoints/step-4").problems == (
        "state/__0_0.distcp: corrupted (its SHA-256 differs from the one written)",)
    assert remove_incomplete_checkpoints(model_dir) == []  # not (yet) marked as a run's: nothing is removed
    write_run_marker(model_dir)
    assert [p.name for p in remove_incomplete_checkpoints(model_dir)] == ["step-10"]
    record_best(model_dir, 2, {"auc": 0.9}, "auc", "max", write=True)
    assert read_best(model_dir).step == 2
    assert [p.name for p in prune_checkpoints(model_dir, keep=2)] == ["step-4"]  # the best one stays
    assert [s for s, _ in list_checkpoints(model_dir)] == [2, 6, 8]
    fs, inner = tzrun.filesystem(model_dir)
    assert not [k for k in fs.find(inner) if "/step-4/" in k or "/step-10/" in k]  # every object removed


def test_a_prefix_on_s3_is_a_run_only_with_the_marker_and_a_foreign_one_is_left_alone(s3_bucket: str) -> None:
    model_dir = f"{s3_bucket}/run"
    assert check_run_dir(model_dir) == "empty"  # no object under the prefix
    lock = acquire_run_lock(model_dir)
    assert check_run_dir(model_dir) == "empty"  # the lock alone does not make it foreign
    lock.release()
    tzrun.as_path(f"{model_dir}/checkpoints/step-5/weights.bin").write_bytes(b"user weights")
    tzrun.as_path(f"{model_dir}/notes.txt").write_text("mine")
    fs, inner = tzrun.filesystem(model_dir)
    before = {k: fs.cat_file(k) for k in fs.find(inner)}
    with pytest.raises(NotARunDirError, match=rf"{model_dir} is not empty and is not a tzrec-run model dir "
                                              rf"\(no \{RUN_MARKER} marker; it holds checkpoints, notes.txt\); --overwrite"):
        check_run_dir(model_dir, overwrite=True)
    assert remove_incomplete_checkpoints(model_dir) == []
    fs.invalidate_cache()
    assert {k: fs.cat_file(k) for k in fs.find(inner)} == before
    run_id = write_run_marker(model_dir)
    assert check_run_dir(model_dir) == "run" and read_run_marker(model_dir)["run_id"] == run_id


def test_a_model_dir_in_a_missing_bucket_is_refused_and_no_bucket_is_created(s3_bucket: str) -> None:
    missing = f"{s3_bucket}-missing"
    with pytest.raises(StorageError, match=rf"{missing}/run: cannot create the run lock: its bucket .* does not exist"):
        acquire_run_lock(f"{missing}/run")
    fs, _ = tzrun.filesystem(missing)
    assert not fs.exists(missing.removeprefix("s3://"))
