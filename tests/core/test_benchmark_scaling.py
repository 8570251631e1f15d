"""benchmarks/scaling.py and what it relies on in compare_deepfm.py: table sizes scaled to a total,
a child's peak memory measured and a child over the limit killed, the curves redrawn from a results file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from compare_deepfm import run_measured, scaled_kaggle  # noqa: E402

from tzrun_tools.synth import KAGGLE_CARDINALITIES, kaggle_cardinalities  # noqa: E402


@pytest.mark.parametrize("total", [50_000, sum(kaggle_cardinalities()), 30_000_000, 100_000_000])
def test_scaled_kaggle_tables_hold_the_total_asked_for(total):
    sizes = scaled_kaggle(total)
    assert len(sizes) == 26 and min(sizes) >= 1
    assert abs(sum(sizes) - total) <= 26
    if total <= sum(KAGGLE_CARDINALITIES):
        assert all(s <= c for s, c in zip(sizes, KAGGLE_CARDINALITIES))  # capped, never grown
    if total == sum(kaggle_cardinalities()):
        assert tuple(sizes) == kaggle_cardinalities()  # the figures' 5.57M rows


def test_a_child_is_measured_and_killed_past_the_memory_limit():
    hold = "import time; b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(3)"
    ok = run_measured([sys.executable, "-c", hold])
    assert ok.returncode == 0 and not ok.killed
    assert ok.max_rss >= 400 << 20 and ok.peak_tree_pss >= 400 << 20
    over = run_measured([sys.executable, "-c", hold], limit_bytes=200 << 20)
    assert over.returncode != 0 and "over the limit" in over.killed


def _round(hand: float, framework: float) -> dict:
    loop = {"wall_s": 1.0, "max_rss_bytes": 1 << 30, "peak_pss_bytes": 1 << 30}
    return {"handwritten": {**loop, "samples_per_s": hand}, "framework": {**loop, "samples_per_s": framework}}


def test_plot_only_draws_every_sweep_from_the_results_file(tmp_path):
    points, sweeps = {}, {"rows": [], "batch": [], "ranks": [], "checkpoint": ["16", "32"]}
    for sweep, field, values in (("rows", "table_rows_total", [50_000, 200_000]), ("batch", "batch_size", [256, 512]),
                                 ("ranks", "nproc", [1, 2])):
        for value in values:
            point = {"table_rows_total": 50_000, "batch_size": 256, "nproc": 1, "steps": 10, "data_rows": 70_000,
                     "rounds": 2, field: value, "result": {"rounds": [_round(100.0, 95.0), _round(110.0, 120.0)]}}
            points[f"{sweep}{value}"] = point
            sweeps[sweep].append(f"{sweep}{value}")
    operations = {name: {"seconds": 0.5, "mb_per_s": 32.0, "x_disk": 0.4, "round_seconds": [0.5]}
                  for name in ("dd write", "dd read", "save", "async save, blocking", "async save, total", "load")}
    checkpoint = {size: {"size_mb": int(size), "rounds": 1, "result": {"size_mb": int(size), "state_mb": float(size),
                                                                       "rounds": 1, "dir": "/tmp", "operations": operations}}
                  for size in ("16", "32")}
    (tmp_path / "scaling.json").write_text(json.dumps({"sweeps": sweeps, "points": points, "checkpoint": checkpoint}))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--plot-only", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in ("rows", "batch", "ranks", "checkpoint"):
        assert (tmp_path / f"scaling_{name}.png").stat().st_size > 10_000
