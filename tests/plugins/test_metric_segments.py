"""The segment helpers the exact grouped metrics are built on."""

from __future__ import annotations

import pytest
import torch

from tzrun_plugins.metrics._segments import segmented_cumsum


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
