"""glibc's allocator, tuned to keep freed memory (``train.tune_malloc``, on by default).

A training step frees and reallocates the same large buffers (activations, gradients, the
sparse features of a batch) at every step. With glibc's defaults, blocks above the dynamic
mmap threshold come straight from ``mmap`` and go back to the kernel on ``free``, and the heap
top is trimmed whenever 128 KiB are free: each step pays page faults to get the memory back.
Three ``mallopt`` settings keep it instead:

* ``M_MMAP_THRESHOLD`` = 32 MiB (glibc's maximum on 64-bit): blocks below it come from the
  heap and are reused; this also switches off glibc's dynamic threshold;
* ``M_TRIM_THRESHOLD`` = 1 GiB: the heap top is returned to the kernel only above that;
* ``M_TOP_PAD`` = 64 MiB: each heap growth takes that much extra, so growth is rare.

They are set with ``mallopt`` in every process that trains or evaluates (each rank calls
:func:`tune_malloc` itself, whatever launched it; DataLoader workers inherit the settings when
they fork), at the start of the run. A setting the user gave through glibc's own environment
variables (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``) is
left alone. Elsewhere than Linux with glibc nothing happens. The cost: the process keeps up to
about 1 GiB of freed memory that another process on the host cannot use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

__all__ = ["MALLOPT_SETTINGS", "tune_malloc"]

log = logging.getLogger("tzrun")

#: ``(name, mallopt parameter number, value, glibc environment variable)``.
MALLOPT_SETTINGS = (
    ("M_MMAP_THRESHOLD", -3, 32 * 1024 * 1024, "MALLOC_MMAP_THRESHOLD_"),
    ("M_TRIM_THRESHOLD", -1, 1024 * 1024 * 1024, "MALLOC_TRIM_THRESHOLD_"),
    ("M_TOP_PAD", -2, 64 * 1024 * 1024, "MALLOC_TOP_PAD_"),
)


def tune_malloc() -> dict[str, int]:
    """Apply :data:`MALLOPT_SETTINGS` with ``mallopt`` (see the module doc); returns what was
    set, by name (empty when the C library is not glibc)."""
    if not sys.platform.startswith("linux"):
        return {}
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return {}
    applied = {}
    for name, parameter, value, variable in MALLOPT_SETTINGS:
        if variable in os.environ:
            continue
        if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            applied[name] = value
        else:
            log.warning("mallopt(%s, %d) was refused; glibc keeps its default", name, value)
    return applied
