"""The run's log file on an object store: each rank writes locally and uploads its file whole
(rank 0 as logs/train.log, another rank as logs/train.rank-N.log only when it logged), at the
end and on the way out of a failing process; a resumed run appends to the earlier file."""

from __future__ import annotations

import logging

import fsspec
import pytest

from tzrun.runner.log_file import log_file


def _read(url: str) -> str:
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    return fs.cat_file(url.removeprefix("s3://")).decode()


def test_rank_0s_log_and_an_error_are_uploaded_and_a_resume_appends(s3_bucket):
    log = logging.getLogger("tzrun.test_s3_log")
    log.setLevel(logging.INFO)
    model_dir = f"{s3_bucket}/run"
    with log_file(model_dir, 0):
        log.info("first run")
    assert _read(f"{model_dir}/logs/train.log").endswith("INFO [rank 0] tzrun.test_s3_log: first run\n")
    with pytest.raises(ValueError), log_file(model_dir, 0):
        log.info("resumed")
        raise ValueError("broken")
    text = _read(f"{model_dir}/logs/train.log")
    lines = text.splitlines()
    assert lines[0].endswith("first run") and lines[1].endswith("resumed")
    assert "ERROR [rank 0] tzrun: the run failed: ValueError: broken" in lines[2]
    assert "Traceback" in text  # not one of tzrun's errors: its traceback


def test_another_rank_uploads_its_own_file_only_when_it_logged(s3_bucket):
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    model_dir = f"{s3_bucket}/run"
    with log_file(model_dir, 1):
        pass
    assert not fs.exists(f"{model_dir}/logs/train.rank-1.log".removeprefix("s3://"))
    with log_file(model_dir, 1):
        logging.getLogger("tzrun.test_s3_log").warning("careful")
    assert _read(f"{model_dir}/logs/train.rank-1.log").endswith("WARNING [rank 1] tzrun.test_s3_log: careful\n")


def test_a_process_the_watchdog_ends_uploads_its_log_on_the_way_out(s3_bucket):
    """The watchdog's end: rank 0 records another rank's failure, then logging.shutdown() and
    os._exit (no context manager, no finally runs)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    model_dir = f"{s3_bucket}/run"
    code = (f"import logging; from tzrun.runner.log_file import LogFile; from tzrun.runner.watchdog import _end; "
            f"logging.getLogger().addHandler(LogFile({model_dir!r}, 0)); "
            "_end(65, 'rank 1 failed: part-1.csv, line 151')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 65 and proc.stderr == "tzrec-run: rank 1 failed: part-1.csv, line 151\n", proc.stderr
    assert _read(f"{model_dir}/logs/train.log").endswith("ERROR [rank 0] tzrun: rank 1 failed: part-1.csv, line 151\n")
