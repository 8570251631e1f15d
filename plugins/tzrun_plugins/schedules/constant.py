"""The ``constant`` schedule: every step uses the optimizer's configured ``lr``."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["ConstantConfig", "build_constant"]


@attrs.frozen
class ConstantConfig:
    """``constant`` has no options."""


def build_constant(cfg: ConstantConfig, optimizer: Any) -> Any:
    """A scheduler that keeps every param group's lr as it is."""
    from torch.optim.lr_scheduler import ConstantLR

    return ConstantLR(optimizer, factor=1.0, total_iters=0)
