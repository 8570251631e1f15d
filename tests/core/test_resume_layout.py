"""The rows a resumed shuffled epoch still has to read, on another layout (issue 20, point 4):
thousands of scattered intervals on both sides, computed in one sweep."""

from __future__ import annotations

import random
import time

from tzrun.runner.position import DataPosition, Layout, resume_layout_for


def _rows(intervals):
    return {r for a, b in intervals for r in range(a, b)}


def test_a_second_resume_reads_exactly_the_rows_not_consumed_yet():
    rng = random.Random(3)
    total = 60_000
    # a partial epoch (the rows left after a first resume) and what was consumed of it since
    partial = tuple((r, r + 1) for r in range(0, total, 2))
    consumed = tuple(sorted((r, r + 1) for r in rng.sample(range(total), 20_000)))
    saved = DataPosition(0, 5, Layout(2, 0, 512, partial), consumed, total)
    started = time.perf_counter()
    layout, start = resume_layout_for(saved, Layout(1, 0, 512))
    assert time.perf_counter() - started < 30  # the former scan took minutes (this takes well under 1 s idle)
    assert start == 0 and (layout.world_size, layout.batch_size) == (1, 512)
    assert list(layout.rows) == sorted(layout.rows)
    assert _rows(layout.rows) == _rows(partial) - _rows(consumed)


def test_the_same_layout_continues_where_it_stopped():
    saved = DataPosition(0, 5, Layout(2, 0, 512), ((0, 100),), 1000)
    assert resume_layout_for(saved, Layout(2, 0, 512)) == (Layout(2, 0, 512), 5)
