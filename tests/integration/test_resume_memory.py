"""A shuffled run stopped by a signal on 2 ranks and resumed on 1 (issue 20, point 4).

The rows not consumed yet of a shuffled epoch stopped mid-window are thousands of single rows.
Reading each on its own decoded its row group again and kept the whole decoded record batch
alive, so the resumed run grew memory without training a step (OOM-killed at 23.6 GB on the
fault pass's data). Here the data has one large row group per file, which makes the growth
show quickly: before the fix the resume failed under a 4 GB address-space cap in seconds
("malloc of size 32768 failed"); a healthy run peaks at about 0.6 GB resident.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLE, REPO, example_overrides
from tests.integration import fault_plugin
from tests.integration.test_train import _sets
from tzrun.runner.signals import EXIT_STOPPED_BY_SIGNAL

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

ROWS = 30_000
CAP_BYTES = 4 << 30
SETTINGS = ("data.shuffle_buffer_rows=10000", "train.save_checkpoints_steps=3")


@pytest.fixture(scope="module")
def big_groups(tmp_path_factory):
    """Two files of one 15,000-row group each."""
    from tzrun_tools.synth import synth_criteo

    out = tmp_path_factory.mktemp("criteo-big-groups")
    synth_criteo(out, rows=ROWS, eval_rows=1_001, seed=7, rows_per_file=15_000, row_group_size=15_000)
    return out


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))


def _train(data, model_dir, extra, *args, env, timeout, cap=False):
    config = model_dir.parent / "run.toml"
    config.write_text(EXAMPLE.read_text().replace("num_epochs = 1", ""))
    cmd = [sys.executable, "-m", "tzrun", "train", str(config),
           *_sets(example_overrides(data, model_dir, *SETTINGS, *extra)), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1", **env},
                          preexec_fn=_cap_memory if cap else None)


def _data_position(model_dir, step):
    return json.loads((model_dir / "checkpoints" / f"step-{step}" / "meta.json").read_text())["data"]


def _rows(intervals):
    return sum(b - a for a, b in intervals)


def test_a_shuffled_run_stopped_on_two_ranks_resumes_on_one_within_a_memory_cap(big_groups, tmp_path):
    model_dir = tmp_path / "run"
    env = fault_plugin.install(tmp_path / "site")
    proc = _train(big_groups, model_dir, ["train.num_steps=20"], "--nproc-per-node", "2",
                  env={**env, fault_plugin.ENV: "signal@3:1:SIGTERM"}, timeout=300)
    assert proc.returncode == EXIT_STOPPED_BY_SIGNAL, proc.stderr[-3000:]
    stopped = _data_position(model_dir, 3)
    assert _rows(stopped["consumed_rows"]) == 2 * 3 * 1024
    assert len(stopped["consumed_rows"]) > 1000  # a window read in part: scattered single rows

    # 1 rank: the 23,856 rows left are 24 steps (the last one 304 rows); stop one short of them
    proc = _train(big_groups, model_dir, ["train.num_steps=26"], "--resume", env=env, timeout=120, cap=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"the {ROWS - 6144} rows of epoch 0 not consumed yet are shared out across 1 rank(s)" in proc.stderr
    first_step = re.search(r"first training step done ([\d.]+) s after the process started", proc.stderr)
    assert first_step and float(first_step.group(1)) < 60, proc.stderr[-3000:]
    resumed = _data_position(model_dir, 26)
    assert resumed["epoch"] == 0 and resumed["layout"]["world_size"] == 1
    # every row consumed before the stop is still consumed, and 23 more batches of new rows
    consumed = resumed["consumed_rows"]
    assert all(any(a <= x and y <= b for a, b in consumed) for x, y in stopped["consumed_rows"])
    assert _rows(consumed) == 6144 + 23 * 1024
