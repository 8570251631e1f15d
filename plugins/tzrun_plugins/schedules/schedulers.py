"""The first-party LR schedulers: closed-form ``torch.optim.lr_scheduler.LRScheduler`` subclasses.

Each param group's lr at position ``k`` (``last_epoch``, the number of ``step()`` calls so far)
is a function of ``k`` and that group's base lr alone (its lr when the scheduler was created,
torch's ``initial_lr``), so the result never depends on the history of steps, and a group whose
base lr is 0 (a frozen part) stays at exactly 0.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from typing import TYPE_CHECKING

from torch.optim import Optimizer

from tzrun import ClosedFormLR

if TYPE_CHECKING:  # the options modules import this one lazily, when a schedule is built
    from tzrun_plugins.schedules.config import (
        CosineAnnealingConfig,
        CosineAnnealingWarmRestartsConfig,
        ExponentialDecayConfig,
        ManualStepConfig,
    )

__all__ = [
    "ConstantLR",
    "ExponentialDecayLR",
    "ManualStepLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestartsLR",
]


class _ConfiguredLR(ClosedFormLR):
    """A closed-form scheduler built from a config with a ``by_epoch`` option."""

    def __init__(self, optimizer: Optimizer, cfg: Any) -> None:
        self.cfg = cfg
        super().__init__(optimizer, by_epoch=cfg.by_epoch)


class _WarmupLR(_ConfiguredLR):
    """A linear warmup from ``warmup_learning_rate`` over ``warmup_size`` steps, then
    :meth:`after_warmup` of the steps since its end."""

    def lr_at(self, base: float, k: int) -> float:
        c = self.cfg
        if k < c.warmup_size:
            return float(c.warmup_learning_rate + (base - c.warmup_learning_rate) * k / c.warmup_size)
        return self.after_warmup(base, k - c.warmup_size)

    def after_warmup(self, base: float, t: int) -> float:
        """The lr ``t`` steps after the warmup."""
        raise NotImplementedError


def _half_cosine(base: float, floor: float, t: int, length: int) -> float:
    """``floor + (base - floor) * (1 + cos(pi * t / length)) / 2``."""
    return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * t / length))


class ConstantLR(ClosedFormLR):
    """Every step uses the base lr."""

    def lr_at(self, base: float, k: int) -> float:
        return base


class ExponentialDecayLR(_WarmupLR):
    """``exponential_decay`` (see :class:`~tzrun_plugins.schedules.config.ExponentialDecayConfig`)."""

    cfg: ExponentialDecayConfig

    def after_warmup(self, base: float, t: int) -> float:
        c = self.cfg
        p = t // c.decay_size if c.staircase else t / c.decay_size
        return max(base * c.decay_factor**p, c.min_learning_rate)


class ManualStepLR(_ConfiguredLR):
    """``manual_step`` (see :class:`~tzrun_plugins.schedules.config.ManualStepConfig`).

    ``learning_rates[i]`` applies from ``k == schedule_sizes[i]`` on; TorchEasyRec starts it
    one step later.
    """

    cfg: ManualStepConfig

    def lr_at(self, base: float, k: int) -> float:
        c = self.cfg
        reached = bisect.bisect_right(c.schedule_sizes, k)
        if reached:
            return c.learning_rates[reached - 1]
        if c.warmup:
            return base + (c.learning_rates[0] - base) * k / c.schedule_sizes[0]
        return base


class CosineAnnealingLR(_WarmupLR):
    """``cosine_annealing`` (see :class:`~tzrun_plugins.schedules.config.CosineAnnealingConfig`)."""

    cfg: CosineAnnealingConfig

    def after_warmup(self, base: float, t: int) -> float:
        c = self.cfg
        return _half_cosine(base, c.min_learning_rate, min(t, c.T_max), c.T_max)


class CosineAnnealingWarmRestartsLR(_WarmupLR):
    """``cosine_annealing_warm_restarts`` (see
    :class:`~tzrun_plugins.schedules.config.CosineAnnealingWarmRestartsConfig`)."""

    cfg: CosineAnnealingWarmRestartsConfig

    def after_warmup(self, base: float, t: int) -> float:
        c = self.cfg
        length = c.T_0
        if c.T_mult == 1:
            t %= length
        else:
            while t >= length:  # whole cycles, in integers: restarts land exactly on their step
                t -= length
                length *= c.T_mult
        return _half_cosine(base, c.min_learning_rate, t, length)
