"""The ``inverse_sqrt`` LR schedule: a closed-form ``torch.optim.lr_scheduler.LRScheduler``.

Each param group's lr at position ``k`` (``last_epoch``: the number of ``step()`` calls so far)
is a function of ``k`` and that group's base lr alone (its lr when the scheduler was made), so
it never depends on the history of steps, a group whose base lr is 0 (a frozen part) stays at
0, and a restored position gives exactly the lr an uninterrupted run has there.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

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


class InverseSqrtLR(LRScheduler):
    """The ``inverse_sqrt`` schedule over every param group of ``optimizer``.

    Attributes:
        by_epoch: whether tzrec-run steps it once per epoch (``True``) or once per training
            batch (``False``).
        cfg: the schedule's options.
    """

    def __init__(self, optimizer: Optimizer, cfg: InverseSqrtConfig) -> None:
        self.cfg = cfg
        self.by_epoch = cfg.by_epoch
        super().__init__(optimizer)

    def get_lr(self) -> list[float | torch.Tensor]:
        """Every param group's lr at the current position."""
        return [inverse_sqrt_lr(self.cfg, float(base), self.last_epoch) for base in self.base_lrs]

    def _get_closed_form_lr(self) -> list[float | torch.Tensor]:
        return self.get_lr()

    def state_dict(self) -> dict[str, Any]:
        """The position only (plain ints and a bool, loadable with ``weights_only=True``): the
        shape of the schedule comes from the config, the base lrs from the optimizer."""
        return {"last_epoch": self.last_epoch, "step_count": self._step_count, "by_epoch": self.by_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Move to the saved position and write its lrs into the optimizer's param groups, so
        the next batch trains with the lr it would have had without the interruption."""
        saved_by_epoch = bool(state_dict.get("by_epoch", self.by_epoch))
        if saved_by_epoch != self.by_epoch:
            unit = {True: "epochs", False: "steps"}
            warnings.warn(
                f"inverse_sqrt: the checkpoint counted {unit[saved_by_epoch]} and the config counts "
                f"{unit[self.by_epoch]}; continuing at position {int(state_dict['last_epoch'])} in {unit[self.by_epoch]}",
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


def build_inverse_sqrt(cfg: InverseSqrtConfig, optimizer: Optimizer) -> InverseSqrtLR:
    """The ``inverse_sqrt`` scheduler over ``optimizer``."""
    return InverseSqrtLR(optimizer, cfg)
