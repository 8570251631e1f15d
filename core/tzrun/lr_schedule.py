"""A base class for LR schedules that resume exactly: the lr is a closed-form function of the
position, so a checkpoint needs only the position (public API: ``tzrun.ClosedFormLR``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["ClosedFormLR"]


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
