"""The memory a rank uses, as each train log record shows it: resident memory and the peak of
the CUDA device's allocator (torchtitan shows the same on each log line)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["resident_bytes", "device_peak_bytes"]


def resident_bytes(statm: Path = Path("/proc/self/statm")) -> int | None:
    """This process's resident memory in bytes (``/proc/self/statm``), or None where the system
    has no ``/proc`` (then the train log leaves it out)."""
    try:
        resident_pages = int(statm.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def device_peak_bytes() -> int | None:
    """The most memory torch's CUDA allocator held (reserved) on this process's device since the
    previous call, whose peak it resets; None without an initialised CUDA device."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    peak = int(torch.cuda.max_memory_reserved())
    torch.cuda.reset_peak_memory_stats()
    return peak
