"""The device memory a train log record shows: the peak torch's CUDA allocator reserved in the
window, reset at each record."""

from __future__ import annotations


def test_the_device_peak_is_the_windows_and_resets_at_each_record():
    import torch

    from tzrun.runner.memory_use import device_peak_bytes

    held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    assert device_peak_bytes() >= 256 * 2**20
    del held
    torch.cuda.empty_cache()
    assert device_peak_bytes() >= 256 * 2**20  # the window began with it held
    assert device_peak_bytes() < 64 * 2**20  # this one did not
