"""The ``inverse_sqrt`` LR schedule: a closed-form ``torch.optim.lr_scheduler.LRScheduler``.

Each param group's lr at position ``k`` (``last_epoch``: the number of ``step()`` calls so far)
is a function of ``k`` and that group's base lr alone (its lr when the scheduler was made), so
it never depends on the history of steps, a group whose base lr is 0 (a frozen part) stays at
0, and a restored position gives exactly the lr an uninterrupted run has there.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer

from tzrun import ClosedFormLR
from tzrun_contrib_optimizers.options import InverseSqrtConfig

__all__ = ["InverseSqrtLR", "build_inverse_sqrt", "inverse_sqrt_lr"]


def inverse_sqrt_lr(cfg: InverseSqrtConfig, base: float, k: int) -> float:
    """The lr at position ``k`` of a param group whose base lr is ``base`` (see
    :class:`~tzrun_contrib_optimizers.options.InverseSqrtConfig`)."""
    if base == 0.0:
        return 0.0
    warmup = cfg.warmup_size
    if k < warmup:
        return cfg.warmup_learning_rate + (base - cfg.warmup_learning_rate) * k / warmup
    timescale = cfg.timescale if cfg.timescale is not None else max(warmup, 1)
    return max(base * math.sqrt(timescale / (k - warmup + timescale)), cfg.min_learning_rate)


class InverseSqrtLR(ClosedFormLR):
    """The ``inverse_sqrt`` schedule over every param group of ``optimizer``, on tzrec-run's
    public :class:`tzrun.ClosedFormLR` (which saves the position only and restores it exactly).

    Attributes:
        cfg: the schedule's options.
    """

    def __init__(self, optimizer: Optimizer, cfg: InverseSqrtConfig) -> None:
        self.cfg = cfg
        super().__init__(optimizer, by_epoch=cfg.by_epoch)

    def lr_at(self, base: float, k: int) -> float:
        """The lr at position ``k`` of a param group whose base lr is ``base``."""
        return inverse_sqrt_lr(self.cfg, base, k)


def build_inverse_sqrt(cfg: InverseSqrtConfig, optimizer: Optimizer) -> InverseSqrtLR:
    """The ``inverse_sqrt`` scheduler over ``optimizer``."""
    return InverseSqrtLR(optimizer, cfg)
