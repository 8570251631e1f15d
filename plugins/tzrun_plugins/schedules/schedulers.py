"""The first-party LR schedulers: closed-form ``torch.optim.lr_scheduler.LRScheduler`` subclasses.

Each param group's lr at position ``k`` (``last_epoch``, the number of ``step()`` calls so far)
is a function of ``k`` and that group's base lr alone (its lr when the scheduler was created,
torch's ``initial_lr``), so the result never depends on the history of steps, and a group whose
base lr is 0 (a frozen part) stays at exactly 0.
"""

from __future__ import annotations

import bisect
import math
import warnings
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from tzrun_plugins.schedules.config import (
    CosineAnnealingConfig,
    CosineAnnealingWarmRestartsConfig,
    ExponentialDecayConfig,
    ManualStepConfig,
)

__all__ = [
    "ClosedFormLR",
    "ConstantLR",
    "ExponentialDecayLR",
    "ManualStepLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestartsLR",
]


class ClosedFormLR(LRScheduler):
    """A scheduler whose lr is ``lr_at(base, k)`` for each param group.

    Subclasses implement :meth:`lr_at`. Its ``state_dict`` is the position only (plain ints and
    a bool, loadable with ``torch.load(weights_only=True)``); the shape of the schedule and the
    base lrs come from the config and the optimizer the scheduler is built with, so a resumed
    run continues where it stopped under the schedule its config describes now.

    Attributes:
        by_epoch: whether the runner steps it once per epoch (``True``) or once per training
            batch (``False``).
    """

    def __init__(self, optimizer: Optimizer, *, by_epoch: bool = False) -> None:
        self.by_epoch = by_epoch
        super().__init__(optimizer)

    def lr_at(self, base: float, k: int) -> float:
        """The lr at position ``k`` of a param group whose base lr is ``base`` (not 0)."""
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        """Every param group's lr at the current position (a group with base lr 0 gets 0)."""
        k = self.last_epoch
        return [0.0 if float(base) == 0.0 else self.lr_at(float(base), k) for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float]:
        return self.get_lr()

    def state_dict(self) -> dict[str, Any]:
        """The position: ``{"last_epoch": k, "step_count": ..., "by_epoch": ...}``."""
        return {"last_epoch": self.last_epoch, "step_count": self._step_count, "by_epoch": self.by_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Move to the saved position and write its lrs into the optimizer's param groups, so
        the next batch trains with the lr it would have had without the interruption."""
        saved_by_epoch = bool(state_dict.get("by_epoch", self.by_epoch))
        if saved_by_epoch != self.by_epoch:
            unit = {True: "epochs", False: "steps"}
            warnings.warn(
                f"{type(self).__name__}: the checkpoint counted {unit[saved_by_epoch]} and the config counts "
                f"{unit[self.by_epoch]} (by_epoch = {str(self.by_epoch).lower()}); continuing at position "
                f"{int(state_dict['last_epoch'])} in {unit[self.by_epoch]}",
                UserWarning,
                stacklevel=2,
            )
        self.last_epoch = int(state_dict["last_epoch"])
        self._step_count = int(state_dict.get("step_count", self.last_epoch + 1))
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [g["lr"].clone() if isinstance(g["lr"], torch.Tensor) else g["lr"] for g in self.optimizer.param_groups]


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
            return c.warmup_learning_rate + (base - c.warmup_learning_rate) * k / c.warmup_size
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
