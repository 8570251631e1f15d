"""Options of the first-party LR schedules, and the ``build(cfg, optimizer)`` of each.

This module does not import torch (``tzrec-run check`` and ``plugins`` read it); the schedulers
themselves are in :mod:`tzrun_plugins.schedules.schedulers`. ``k`` below is the number of
``step()`` calls so far: training batch ``n`` (1-based) uses the lr of ``k = n - 1``, or, with
``by_epoch = true``, every batch of epoch ``e`` (0-based) uses the lr of ``k = e``.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

__all__ = [
    "ConstantConfig",
    "ExponentialDecayConfig",
    "ManualStepConfig",
    "CosineAnnealingConfig",
    "CosineAnnealingWarmRestartsConfig",
    "build_constant",
    "build_exponential_decay",
    "build_manual_step",
    "build_cosine_annealing",
    "build_cosine_annealing_warm_restarts",
]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(what: str) -> Any:
    """A validator: an int above 0; ``what`` says what the number counts."""

    def check(instance: Any, attribute: Any, value: Any) -> None:
        if not _is_int(value) or value <= 0:
            raise ValueError(f"{attribute.name} must be an integer of at least 1 ({what}), got {value!r}")

    return check


def _non_negative_int(instance: Any, attribute: Any, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{attribute.name} must be an integer of at least 0, got {value!r}")


def _learning_rate(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a learning rate of at least 0, got {value!r}")


def _warmup_size() -> Any:
    return attrs.field(default=0, validator=_non_negative_int)


def _zero_lr() -> Any:
    return attrs.field(default=0.0, validator=_learning_rate)


@attrs.frozen
class ConstantConfig:
    """``constant`` has no options: every step uses the optimizer's ``lr``."""


@attrs.frozen
class ExponentialDecayConfig:
    """Options of ``exponential_decay``: after a linear warmup, the lr is multiplied by
    ``decay_factor`` every ``decay_size`` steps (or epochs), and never goes below
    ``min_learning_rate``.

    Attributes:
        decay_size: steps (epochs with ``by_epoch``) per decay; required, unlike TorchEasyRec
            where leaving it at 0 crashes with a ZeroDivisionError.
        decay_factor: what the lr is multiplied by per decay, in (0, 1].
        staircase: decay in whole steps of ``decay_factor`` (``true``) or continuously.
        warmup_learning_rate: the lr at ``k = 0`` when ``warmup_size > 0``.
        warmup_size: steps (epochs) of linear warmup from ``warmup_learning_rate`` to the
            optimizer's ``lr``; decay counts from the end of the warmup.
        min_learning_rate: the floor of the decayed lr (not applied during warmup).
        by_epoch: step once per epoch instead of once per training batch.
    """

    decay_size: int = attrs.field(validator=_positive_int("steps per decay, or epochs with by_epoch = true"))
    decay_factor: float = attrs.field(default=0.95)
    staircase: bool = True
    warmup_learning_rate: float = _zero_lr()
    warmup_size: int = _warmup_size()
    min_learning_rate: float = _zero_lr()
    by_epoch: bool = False

    @decay_factor.validator
    def _check_decay_factor(self, attribute: Any, value: Any) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
            raise ValueError(
                f"decay_factor must be above 0 and at most 1 (the lr is multiplied by it every decay_size steps), "
                f"got {value!r}"
            )


@attrs.frozen
class ManualStepConfig:
    """Options of ``manual_step``: the lr becomes ``learning_rates[i]`` at step (epoch)
    ``schedule_sizes[i]`` and keeps it until the next size; before the first size it is the
    optimizer's ``lr``.

    Attributes:
        schedule_sizes: the steps (epochs) at which the lr changes, strictly increasing, each
            at least 1.
        learning_rates: the lr from each of those steps on, one per schedule size.
        warmup: before the first size, go linearly from the optimizer's ``lr`` (at ``k = 0``)
            towards ``learning_rates[0]`` instead of holding the optimizer's ``lr``.
        by_epoch: step once per epoch instead of once per training batch.
    """

    schedule_sizes: tuple[int, ...]
    learning_rates: tuple[float, ...]
    warmup: bool = False
    by_epoch: bool = False

    def __attrs_post_init__(self) -> None:
        sizes, rates = list(self.schedule_sizes), list(self.learning_rates)
        if not sizes:
            raise ValueError('schedule_sizes is empty: give at least one step at which the lr changes, or use type = "constant"')
        if not all(_is_int(s) for s in sizes) or sizes[0] < 1:
            raise ValueError(f"schedule_sizes must be integers of at least 1 (steps, or epochs with by_epoch = true), got {sizes}")
        for before, after in zip(sizes, sizes[1:]):
            if after <= before:
                raise ValueError(f"schedule_sizes must be strictly increasing, got {sizes} ({after} after {before})")
        if len(rates) != len(sizes):
            raise ValueError(
                f"learning_rates has {len(rates)} and schedule_sizes has {len(sizes)} entries: "
                "give one learning rate per schedule size"
            )
        for rate in rates:
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (math.isfinite(rate) and rate >= 0):
                raise ValueError(f"learning_rates must be learning rates of at least 0, got {rates}")


@attrs.frozen
class CosineAnnealingConfig:
    """Options of ``cosine_annealing``: after a linear warmup, half a cosine from the
    optimizer's ``lr`` down to ``min_learning_rate`` over ``T_max`` steps (epochs), then
    ``min_learning_rate``.

    Attributes:
        T_max: steps (epochs) from the optimizer's ``lr`` down to ``min_learning_rate``.
        min_learning_rate: the lr at and after the end of the cosine.
        warmup_learning_rate: the lr at ``k = 0`` when ``warmup_size > 0``.
        warmup_size: steps (epochs) of linear warmup before the cosine starts.
        by_epoch: step once per epoch instead of once per training batch.
    """

    T_max: int = attrs.field(validator=_positive_int("steps from the lr down to min_learning_rate"))
    min_learning_rate: float = _zero_lr()
    warmup_learning_rate: float = _zero_lr()
    warmup_size: int = _warmup_size()
    by_epoch: bool = False


@attrs.frozen
class CosineAnnealingWarmRestartsConfig:
    """Options of ``cosine_annealing_warm_restarts`` (SGDR): after a linear warmup, cosine
    cycles from the optimizer's ``lr`` down towards ``min_learning_rate``, the first ``T_0``
    steps (epochs) long, each next one ``T_mult`` times longer.

    Attributes:
        T_0: length of the first cycle.
        T_mult: each cycle is this many times longer than the one before (1: all equal).
        min_learning_rate: the lr the cycles decay towards.
        warmup_learning_rate: the lr at ``k = 0`` when ``warmup_size > 0``.
        warmup_size: steps (epochs) of linear warmup before the first cycle.
        by_epoch: step once per epoch instead of once per training batch.
    """

    T_0: int = attrs.field(validator=_positive_int("steps in the first cycle"))
    T_mult: int = attrs.field(default=1, validator=_positive_int("growth factor of the cycle length; 1 keeps cycles equal"))
    min_learning_rate: float = _zero_lr()
    warmup_learning_rate: float = _zero_lr()
    warmup_size: int = _warmup_size()
    by_epoch: bool = False


def build_constant(cfg: ConstantConfig, optimizer: Any) -> Any:
    """A scheduler that keeps every param group's lr as it is."""
    from tzrun_plugins.schedules.schedulers import ConstantLR

    return ConstantLR(optimizer)


def build_exponential_decay(cfg: ExponentialDecayConfig, optimizer: Any) -> Any:
    """The ``exponential_decay`` scheduler over ``optimizer``."""
    from tzrun_plugins.schedules.schedulers import ExponentialDecayLR

    return ExponentialDecayLR(optimizer, cfg)


def build_manual_step(cfg: ManualStepConfig, optimizer: Any) -> Any:
    """The ``manual_step`` scheduler over ``optimizer``."""
    from tzrun_plugins.schedules.schedulers import ManualStepLR

    return ManualStepLR(optimizer, cfg)


def build_cosine_annealing(cfg: CosineAnnealingConfig, optimizer: Any) -> Any:
    """The ``cosine_annealing`` scheduler over ``optimizer``."""
    from tzrun_plugins.schedules.schedulers import CosineAnnealingLR

    return CosineAnnealingLR(optimizer, cfg)


def build_cosine_annealing_warm_restarts(cfg: CosineAnnealingWarmRestartsConfig, optimizer: Any) -> Any:
    """The ``cosine_annealing_warm_restarts`` scheduler over ``optimizer``."""
    from tzrun_plugins.schedules.schedulers import CosineAnnealingWarmRestartsLR

    return CosineAnnealingWarmRestartsLR(optimizer, cfg)
