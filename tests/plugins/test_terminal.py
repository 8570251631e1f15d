"""What the terminal shows during a run: log lines above the progress bar (never inside it),
the date in each log line, and memory in the train log line."""

from __future__ import annotations

import logging
import mmap
import re
import sys

from tests.plugins.test_stages import _log, _run
from tzrun.cli.logs import setup_logging
from tzrun.interfaces import StepInfo
from tzrun.runner.memory_use import device_peak_bytes, resident_bytes
from tzrun.runner.log_file import DATE_FORMAT, log_format, redact_record
from tzrun_plugins.stages.progress import ProgressConfig, ProgressStage, format_train_log


def test_a_log_record_during_the_bar_is_written_on_a_line_of_its_own_and_the_bar_redrawn(capsys):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(log_format(0), DATE_FORMAT))
    handler.addFilter(redact_record)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        stage = ProgressStage(ProgressConfig(mode="bar"))
        run = _run(10)
        stage.tzrun_before_train(run)
        for i in range(1, 4):
            stage.tzrun_after_train_step(run, StepInfo(i, 0, None, {}, 8, {}))
        logging.getLogger("tzrun.test").warning("reading s3://user:secret@bucket/x")
        stage.tzrun_after_train_step(run, StepInfo(4, 0, None, {}, 8, {}))
        stage.tzrun_after_train(run, 10)
        assert handler.stream is sys.stderr  # given back when the bar closed
    finally:
        root.removeHandler(handler)
    err = capsys.readouterr().err
    line = next(part for part in re.split(r"[\r\n]", err) if "tzrun.test" in part)
    # the whole record and nothing of the bar on its line; the password redacted as before
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d WARNING \[rank 0\] tzrun\.test: reading "
                        r"s3://user:\*\*\*@bucket/x", line), repr(err)
    after = err[err.index("bucket/x") + len("bucket/x"):]
    assert after.startswith("\n") and "train:" in after and "3/10" in after  # the bar drawn again below it


def test_log_lines_carry_the_date(capsys):
    root = logging.getLogger()
    before = list(root.handlers)
    root.handlers = []
    try:
        setup_logging()
        logging.getLogger("tzrun.test").warning("careful")
    finally:
        root.handlers = before
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d WARNING \[rank 0\] tzrun\.test: careful$",
                     capsys.readouterr().err, re.M)


def test_the_train_log_line_shows_resident_and_device_memory():
    import attrs

    record = attrs.evolve(_log(5), rss_bytes=3 * 2**30 // 2, device_memory_bytes=2**31)
    line = format_train_log(record, total_steps=105)
    assert "data_wait=25.0%  mem=1.50GiB device_mem=2.00GiB  eta 0:00:40" in line
    assert "mem=" not in format_train_log(_log(5), total_steps=105)  # unknown: left out


def test_the_train_log_line_shows_each_zch_tables_miss_share_occupancy_admissions_and_evictions():
    import attrs

    counts = {"ids_seen": 200, "misses": 7, "miss_share": 0.035, "admitted": 14, "evicted": 12, "rows_in_use": 97,
              "occupancy": 0.97}
    line = format_train_log(attrs.evolve(_log(5), zch={"user_emb": counts}), total_steps=105)
    assert "data_wait=25.0%  zch/user_emb=miss 3.5% occ 97.0% adm 14 ev 12  eta 0:00:40" in line
    assert "zch/" not in format_train_log(_log(5), total_steps=105)


def test_resident_memory_is_this_process_s():
    rss = resident_bytes()
    assert rss is not None and 10 * 2**20 < rss < 64 * 2**30
    # fresh anonymous pages: a bytearray may reuse heap pages already resident (an earlier
    # in-process run's train.tune_malloc raises glibc's mmap threshold for the whole process)
    held = mmap.mmap(-1, 256 * 2**20)
    for page in range(0, len(held), mmap.PAGESIZE):
        held[page] = 1  # touch every page
    assert resident_bytes() - rss > 200 * 2**20
    held.close()


def test_no_device_memory_without_an_initialised_cuda_device():
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return  # tests/gpu/test_memory_use.py covers a device
    assert device_peak_bytes() is None


def test_with_a_bar_the_train_and_eval_lines_reach_the_log_file_but_not_the_terminal_twice(capsys, tmp_path):
    from tzrun.interfaces import EvalResult
    from tzrun.runner.log_file import LogFile

    terminal = logging.StreamHandler(sys.stderr)
    log_file = LogFile(tmp_path, 0)
    root, tzrun_log = logging.getLogger(), logging.getLogger("tzrun")
    level = tzrun_log.level
    tzrun_log.setLevel(logging.INFO)
    root.addHandler(terminal)
    root.addHandler(log_file)
    try:
        stage = ProgressStage(ProgressConfig(mode="bar"))
        run = _run(10)
        stage.tzrun_before_train(run)
        stage.tzrun_after_train_log(run, _log(5))
        stage.tzrun_after_eval(run, 5, EvalResult(5, {"auc": 0.7}, 100))
        stage.tzrun_after_train(run, 10)
    finally:
        root.removeHandler(terminal)
        root.removeHandler(log_file)
        log_file.close()
        tzrun_log.setLevel(level)
    err = capsys.readouterr().err
    assert "step 5/10" not in err and err.count("eval at step 5 over 100 rows: auc=0.700000") == 1
    written = (tmp_path / "logs" / "train.log").read_text()
    assert "INFO [rank 0] tzrun.progress: step 5/10 epoch 0  loss=0.50000" in written
    assert "INFO [rank 0] tzrun.progress: eval at step 5 over 100 rows: auc=0.700000" in written
    assert "not_on_terminal" not in err and terminal.filters == []  # the filter left with the bar
