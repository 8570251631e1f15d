"""Failure is a collective fact (2-rank jobs under torchrun on CPU): an error on one rank, or a
rank that freezes, ends the whole job within seconds, naming the rank, with the documented exit
code, and leaves the last complete checkpoint usable (:mod:`tzrun.runner.watchdog`), and the
model dir's log file the failing rank's error. The jobs start with torchrun's own spelling,
``--nproc_per_node``, their processes forked from warm interpreters (tests/warm_ranks.py: the
faults act inside a rank)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE, REPO, cli, example_overrides
from tests.integration import fault_plugin
from tests.integration.test_train import _sets
from tests.warm_ranks import warm_executable
from tzrun.errors import EXIT_DATA, EXIT_RANK_LOST
from tzrun.runner.checkpoint import list_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

STEPS = ("train.num_steps=10", "train.save_checkpoints_steps=3", "train.rank_timeout_s=8")


#: Fewer steps, for the tests that train a run three times.
SHORT = ("train.num_steps=6",)


def _run(criteo_dir, tmp_path, fault, *extra, timeout=120, model_dir=None, flags=()):
    """Train 2 ranks with ``fault``; returns the process, the seconds from the fault to the
    job's end, and the model dir."""
    model_dir = model_dir or tmp_path / "run"
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text().replace("num_epochs = 1", ""))
    env = {**os.environ, **fault_plugin.install(Path(tempfile.mkdtemp(dir=tmp_path, prefix="site-"))), fault_plugin.ENV: fault,
           fault_plugin.STAMP_ENV: str(tmp_path / "fault-time"),
           "TZRUN_STRICT_PLUGINS": "1", "PYTHONFAULTHANDLER": "1"}
    cmd = [str(warm_executable()), "-m", "tzrun", "train", str(config),
           *_sets(example_overrides(criteo_dir, model_dir, *STEPS, *extra)), "--nproc_per_node", "2", *flags]
    # a session of its own, so that cleanup reaches every process the job started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        for number in (signal.SIGCONT, signal.SIGKILL):  # nothing is left behind, frozen or not
            try:
                os.killpg(proc.pid, number)
            except ProcessLookupError:
                pass
        proc.wait()
    ended = time.time()
    stamp = tmp_path / "fault-time"
    seconds = ended - float(stamp.read_text()) if stamp.exists() else float("inf")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), seconds, model_dir


def test_a_data_error_on_rank_1_stops_both_ranks_at_once_with_the_data_error_code(criteo_dir, tmp_path):
    proc, seconds, model_dir = _run(criteo_dir, tmp_path, "raise@4:1")
    assert proc.returncode == EXIT_DATA, proc.stderr[-3000:]
    assert proc.stderr.count("tzrec-run: rank 1 failed: part-1.csv, line 151, column 'I3'") == 1, proc.stderr[-3000:]
    assert "Traceback" not in _rank_lines(proc.stderr, 0)  # rank 0 only waited: no traceback of its own
    # nor torchrun's (its ChildFailedError report goes to a log file, shown with --log-level debug)
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr[-3000:]
    # rank 0 waited in a collective: without the watchdog it would wait train.collective_timeout_s (300 s)
    assert seconds < 30, seconds
    assert [s for s, _ in list_checkpoints(model_dir)] == [3]
    # the model dir's log holds rank 0's lines and the failing rank's error, dated
    log = (model_dir / "logs" / "train.log").read_text()
    dated = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.search(rf"^{dated} INFO \[rank 0\] tzrun: training 10 steps .* on 2 rank\(s\)", log, re.M), log
    # (the evaluation at step 3, before the checkpoint: whether rank 0 also logs step 4 depends on
    # whether rank 1's reader fails before or after step 4's collectives, which its read-ahead times)
    assert re.search(rf"^{dated} INFO \[rank 0\] tzrun\.progress: eval at step 3 over 3001 rows .* auc=", log, re.M), log
    error = re.escape("part-1.csv, line 151, column 'I3'")
    assert re.search(rf"^{dated} ERROR \[rank 1\] tzrun: the run failed: {error}", log, re.M), log
    assert re.search(rf"^{dated} ERROR \[rank 0\] tzrun: rank 1 failed: {error}", log, re.M), log
    assert "Traceback" not in log  # a TzrunError is its one line


def test_a_failure_while_rank_1_evaluates_stops_both_ranks(criteo_dir, tmp_path):
    proc, seconds, model_dir = _run(criteo_dir, tmp_path, "raise-eval@3:1", flags=("--log-level", "debug"))
    assert proc.returncode == EXIT_DATA, proc.stderr[-3000:]
    assert proc.stderr.count("tzrec-run: rank 1 failed: eval.csv, line 7") == 1, proc.stderr[-3000:]
    assert "ChildFailedError" in proc.stderr  # torchrun's own report, shown at debug level only
    assert seconds < 30, seconds
    assert [s for s, _ in list_checkpoints(model_dir)] == [3]  # written before the evaluation that failed


def test_a_frozen_rank_is_named_and_the_job_ends_within_rank_timeout(criteo_dir, tmp_path):
    proc, seconds, model_dir = _run(criteo_dir, tmp_path, "stop@5:1")
    assert proc.returncode == EXIT_RANK_LOST, proc.stderr[-3000:]
    match = re.search(r"tzrec-run: rank 1 stopped responding(?: at step [1-5])? \(no heartbeat for (\d+) s; "
                      r"train.rank_timeout_s = 8\)", proc.stderr)
    assert match, proc.stderr[-3000:]
    assert 8 <= int(match.group(1)) <= 12
    assert seconds < 8 + 10, seconds
    assert [s for s, _ in list_checkpoints(model_dir)] == [3]
    ls = cli(["ckpt", "ls", str(model_dir)])
    assert ls.returncode == 0 and "step-3" in ls.stdout, ls.stdout + ls.stderr


def _rank_lines(stderr: str, rank: int) -> str:
    """The lines torchrun prefixes with ``[rank]`` (none without ``--tee``) plus the lines the
    logging format tags with ``[rank R]``."""
    return "\n".join(line for line in stderr.splitlines() if f"[rank {rank}]" in line)


def test_a_bad_row_in_rank_1s_share_stops_both_ranks_naming_file_row_and_column(criteo_dir, tmp_path):
    # rows are shared out in order: rank 1 reads rows 6,000-11,999, so the third file is its alone
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "train_bad"
    shutil.copytree(criteo_dir / "train", bad)
    last = sorted(bad.glob("*.parquet"))[-1]
    table = pq.read_table(last)
    ids = table.column("cat_0").to_numpy().copy()
    ids[500] = 1_000_000  # outside cat_0's 1,000 buckets
    pq.write_table(table.set_column(table.schema.get_field_index("cat_0"), "cat_0", pa.array(ids)), last)
    started = time.time()
    proc, _, model_dir = _run(criteo_dir, tmp_path, "", f'data.train_input="{bad}"')
    assert proc.returncode == EXIT_DATA, proc.stderr[-3000:]
    root_cause = re.findall(rf"tzrec-run: rank 1 failed: {re.escape(str(last))}: row 500 .*cat_0", proc.stderr)
    assert len(root_cause) == 1, proc.stderr[-3000:]  # once, from rank 0, naming the file, the row and the column
    # without the watchdog rank 0 would wait train.collective_timeout_s (300 s) in its next collective
    assert time.time() - started < 90


def test_a_bad_row_in_rank_1s_share_of_the_eval_data_stops_both_ranks(criteo_dir, tmp_path):
    # the 3,001 eval rows: rank 1 reads rows 1,500-3,000
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "eval_bad"
    shutil.copytree(criteo_dir / "eval", bad)
    path = sorted(bad.glob("*.parquet"))[0]
    table = pq.read_table(path)
    ids = table.column("cat_0").to_numpy().copy()
    ids[2500] = 1_000_000
    pq.write_table(table.set_column(table.schema.get_field_index("cat_0"), "cat_0", pa.array(ids)), path)
    started = time.time()
    proc, _, model_dir = _run(criteo_dir, tmp_path, "", f'data.eval_input="{bad}"', *SHORT)
    assert proc.returncode == EXIT_DATA, proc.stderr[-3000:]
    assert len(re.findall(rf"tzrec-run: rank 1 failed: {re.escape(str(path))}: row 2500 .*cat_0", proc.stderr)) == 1, \
        proc.stderr[-3000:]
    assert time.time() - started < 90
    # the checkpoint of that boundary was written before its evaluation: complete, and verified
    assert [s for s, _ in list_checkpoints(model_dir)] == [3]
    inspect = cli(["ckpt", "inspect", str(model_dir / "checkpoints" / "step-3"), "--json"])
    described = json.loads(inspect.stdout)
    assert described["complete"] and described["manifest"]["state"] == "ok" and described["manifest"]["hashed"], described
    assert not (model_dir / "eval_results.jsonl").exists() or not (model_dir / "eval_results.jsonl").read_text()

    # with the eval data fixed, --resume evaluates step 3 first and ends as the run never interrupted
    resumed, _, _ = _run(criteo_dir, tmp_path, "", *SHORT, flags=("--resume",))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "evaluating step 3 again: its result is not part of the checkpoint" in resumed.stderr
    straight, _, straight_dir = _run(criteo_dir, tmp_path, "", *SHORT, model_dir=tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    rows = [json.loads(line) for line in (model_dir / "eval_results.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6]
    assert rows == [json.loads(line) for line in (straight_dir / "eval_results.jsonl").read_text().splitlines()]
