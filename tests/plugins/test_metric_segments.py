"""The segment helpers the exact grouped metrics are built on."""

from __future__ import annotations

import pytest
import torch

from tzrun_plugins.metrics._segments import lexsort, segmented_cumsum


def _reference(values: torch.Tensor, starts: torch.Tensor, exclusive: bool) -> torch.Tensor:
    out, running = [], 0.0
    for v, s in zip(values.tolist(), starts.tolist()):
        running = 0.0 if s else running
        out.append(running if exclusive else running + v)
        running += v
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("integral", [False, True])
def test_segmented_cumsum_restarts_at_every_segment(exclusive: bool, integral: bool) -> None:
    g = torch.Generator().manual_seed(3)
    values = torch.randint(0, 5, (2000,), generator=g).to(torch.float64)  # counts: both paths apply
    starts = torch.rand(2000, generator=g) < 0.05
    starts[0] = True
    expected = _reference(values, starts, exclusive)
    assert torch.equal(segmented_cumsum(values, starts, exclusive=exclusive, integral=integral), expected)


def test_the_integral_path_is_exact_over_a_long_running_sum() -> None:
    n = 1 << 20
    starts = torch.zeros(n, dtype=torch.bool)
    starts[::1000] = True
    out = segmented_cumsum(torch.ones(n, dtype=torch.float64), starts, exclusive=True, integral=True)
    assert torch.equal(out, (torch.arange(n) % 1000).to(torch.float64))


@pytest.mark.parametrize("widths", [(32,), (20, 12), (5,), (40,), (20, 20)])
def test_lexsort_orders_and_finds_runs_for_narrow_and_wide_keys(widths: tuple[int, ...]) -> None:
    # keys of up to 32 bits in all are sorted as int32 (shifted by 2**31): order and runs stay
    g = torch.Generator().manual_seed(sum(widths))
    keys = []
    for bits in widths:
        values = torch.randint(0, 4, (500,), generator=g)
        values = torch.where(values == 3, (1 << bits) - 1, values)  # the top of the range
        keys.append((values, bits))
    result = lexsort(keys)
    rows = sorted(range(500), key=lambda i: (tuple(int(v[i]) for v, _ in keys), i))
    assert result.perm.tolist() == rows
    for prefix in range(1, len(keys) + 1):
        expected = [True] + [
            tuple(int(v[a]) for v, _ in keys[:prefix]) != tuple(int(v[b]) for v, _ in keys[:prefix])
            for a, b in zip(rows, rows[1:])
        ]
        assert result.runs(prefix).tolist() == expected
