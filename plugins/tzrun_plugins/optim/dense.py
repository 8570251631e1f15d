"""Dense optimizers: the torch.optim classes, with their torch defaults."""

from __future__ import annotations

from typing import Any, Iterable

import attrs

__all__ = [
    "SGDConfig",
    "AdamConfig",
    "AdamWConfig",
    "AdagradConfig",
    "build_sgd",
    "build_adam",
    "build_adamw",
    "build_adagrad",
]

_non_negative = attrs.validators.ge(0.0)
_unit = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0))


@attrs.frozen
class SGDConfig:
    """Options of dense ``sgd`` (``torch.optim.SGD``). Unlike TorchEasyRec (momentum 0.9), the
    momentum default is torch's 0.

    Attributes:
        lr: learning rate.
        momentum: momentum factor.
        weight_decay: L2 penalty.
    """

    lr: float = attrs.field(validator=_non_negative)
    momentum: float = attrs.field(default=0.0, validator=_non_negative)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)


@attrs.frozen
class AdamConfig:
    """Options of dense ``adam`` (``torch.optim.Adam``).

    Attributes:
        lr: learning rate.
        beta1, beta2: decay rates of the first and second moment estimates.
        eps: added to the denominator.
        weight_decay: L2 penalty (added to the gradient).
    """

    lr: float = attrs.field(validator=_non_negative)
    beta1: float = attrs.field(default=0.9, validator=_unit)
    beta2: float = attrs.field(default=0.999, validator=_unit)
    eps: float = attrs.field(default=1e-8, validator=attrs.validators.gt(0.0))
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)


@attrs.frozen
class AdamWConfig(AdamConfig):
    """Options of dense ``adamw`` (``torch.optim.AdamW``): Adam with decoupled weight decay.

    Attributes:
        lr, beta1, beta2, eps: as for ``adam``.
        weight_decay: decoupled weight decay (torch's default 0.01).
    """

    weight_decay: float = attrs.field(default=0.01, validator=_non_negative)


@attrs.frozen
class AdagradConfig:
    """Options of dense ``adagrad`` (``torch.optim.Adagrad``).

    Attributes:
        lr: learning rate.
        eps: added to the denominator.
        weight_decay: L2 penalty.
        initial_accumulator_value: starting value of the sum of squares.
    """

    lr: float = attrs.field(validator=_non_negative)
    eps: float = attrs.field(default=1e-10, validator=attrs.validators.gt(0.0))
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    initial_accumulator_value: float = attrs.field(default=0.0, validator=_non_negative)


def build_sgd(cfg: SGDConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.SGD`` over ``params``."""
    import torch

    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def build_adam(cfg: AdamConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.Adam`` over ``params``."""
    import torch

    return torch.optim.Adam(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )


def build_adamw(cfg: AdamWConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.AdamW`` over ``params``."""
    import torch

    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay
    )


def build_adagrad(cfg: AdagradConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.Adagrad`` over ``params``."""
    import torch

    return torch.optim.Adagrad(
        params,
        lr=cfg.lr,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        initial_accumulator_value=cfg.initial_accumulator_value,
    )
