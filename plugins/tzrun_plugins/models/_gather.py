"""Row gathers across ranks that TorchRec's train pipelines can trace.

TorchRec's pipelines trace a model's forward with ``torch.fx`` to find its sharded modules'
inputs; a collective cannot run on the tracer's placeholder values, so the gather is a leaf of the
trace (``torch.fx.wrap``) and runs only for real.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_gather

__all__ = ["gather_rows"]


@torch.fx.wrap
def gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """Every rank's ``rows`` concatenated in rank order (``[world_size * n, ...]``), with
    gradients flowing back to the rank each row came from; ``rows`` as they are on one process.
    Every rank must call it with the same number of rows."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return rows
    # torch.distributed.nn.functional has no annotations
    return torch.cat(all_gather(rows), dim=0)  # type: ignore[no-untyped-call]
