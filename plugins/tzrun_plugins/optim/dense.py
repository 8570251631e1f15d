"""Dense optimizers: the ``torch.optim`` classes, with torch's own defaults.

Every option maps one to one onto the torch argument of the same name (``beta1``/``beta2`` are
torch's ``betas``). ``foreach`` and ``fused`` choose torch's implementation: unset lets torch pick
(``foreach`` where it can), ``fused = true`` asks for the single-kernel version where torch has
one (``sgd``, ``adagrad``, ``adam``, ``adamw``; on CPU too). They change speed, not results.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import attrs

__all__ = [
    "SGDConfig",
    "AdagradConfig",
    "AdamConfig",
    "AdamWConfig",
    "RMSpropConfig",
    "AdadeltaConfig",
    "build_sgd",
    "build_adagrad",
    "build_adam",
    "build_adamw",
    "build_rmsprop",
    "build_adadelta",
]

_non_negative = attrs.validators.ge(0.0)
_positive = attrs.validators.gt(0.0)
_unit = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0))


def _implementation(cfg: Any, fused_available: bool = True) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if cfg.foreach is not None:
        kwargs["foreach"] = cfg.foreach
    if fused_available and cfg.fused is not None:
        kwargs["fused"] = cfg.fused
    return kwargs


def _not_both(instance: Any, attribute: Any, value: Optional[bool]) -> None:
    if value and instance.foreach:
        raise ValueError("fused = true and foreach = true exclude each other; set one of them")


@attrs.frozen
class SGDConfig:
    """Options of dense ``sgd`` (``torch.optim.SGD``). The momentum default is torch's 0, not
    TorchEasyRec's 0.9.

    Attributes:
        lr: learning rate.
        momentum: momentum factor.
        dampening: dampening of the momentum.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening = 0``).
        weight_decay: L2 penalty, added to the gradient.
        foreach: use torch's multi-tensor implementation (unset: torch decides).
        fused: use torch's fused implementation.
    """

    lr: float = attrs.field(validator=_non_negative)
    momentum: float = attrs.field(default=0.0, validator=_non_negative)
    dampening: float = attrs.field(default=0.0, validator=_non_negative)
    nesterov: bool = False
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    foreach: Optional[bool] = None
    fused: Optional[bool] = attrs.field(default=None, validator=_not_both)

    def __attrs_post_init__(self) -> None:
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov = true needs momentum > 0 and dampening = 0")


@attrs.frozen
class AdagradConfig:
    """Options of dense ``adagrad`` (``torch.optim.Adagrad``).

    Attributes:
        lr: learning rate.
        lr_decay: the lr of update t is ``lr / (1 + (t - 1) * lr_decay)``.
        weight_decay: L2 penalty.
        initial_accumulator_value: starting value of the sum of squared gradients.
        eps: added to the denominator.
        foreach: use torch's multi-tensor implementation (unset: torch decides).
        fused: use torch's fused implementation.
    """

    lr: float = attrs.field(validator=_non_negative)
    lr_decay: float = attrs.field(default=0.0, validator=_non_negative)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    initial_accumulator_value: float = attrs.field(default=0.0, validator=_non_negative)
    eps: float = attrs.field(default=1e-10, validator=_positive)
    foreach: Optional[bool] = None
    fused: Optional[bool] = attrs.field(default=None, validator=_not_both)


@attrs.frozen
class AdamConfig:
    """Options of dense ``adam`` (``torch.optim.Adam``).

    Attributes:
        lr: learning rate.
        beta1: decay rate of the first moment estimate.
        beta2: decay rate of the second moment estimate.
        eps: added to the denominator.
        weight_decay: L2 penalty, added to the gradient.
        amsgrad: use the AMSGrad variant (the maximum of past second moments).
        foreach: use torch's multi-tensor implementation (unset: torch decides).
        fused: use torch's fused implementation.
    """

    lr: float = attrs.field(validator=_non_negative)
    beta1: float = attrs.field(default=0.9, validator=_unit)
    beta2: float = attrs.field(default=0.999, validator=_unit)
    eps: float = attrs.field(default=1e-8, validator=_positive)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    amsgrad: bool = False
    foreach: Optional[bool] = None
    fused: Optional[bool] = attrs.field(default=None, validator=_not_both)


@attrs.frozen
class AdamWConfig(AdamConfig):
    """Options of dense ``adamw`` (``torch.optim.AdamW``): Adam with decoupled weight decay.

    Attributes:
        lr, beta1, beta2, eps, amsgrad, foreach, fused: as for ``adam``.
        weight_decay: decoupled weight decay, ``w -= lr * weight_decay * w`` (torch's default 0.01).
    """

    weight_decay: float = attrs.field(default=0.01, validator=_non_negative)


@attrs.frozen
class RMSpropConfig:
    """Options of dense ``rmsprop`` (``torch.optim.RMSprop``).

    Attributes:
        lr: learning rate.
        alpha: smoothing constant of the squared-gradient average.
        eps: added to the denominator.
        weight_decay: L2 penalty.
        momentum: momentum factor.
        centered: normalize by an estimate of the gradient's variance.
        foreach: use torch's multi-tensor implementation (unset: torch decides).
    """

    lr: float = attrs.field(validator=_non_negative)
    alpha: float = attrs.field(default=0.99, validator=_unit)
    eps: float = attrs.field(default=1e-8, validator=_positive)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    momentum: float = attrs.field(default=0.0, validator=_non_negative)
    centered: bool = False
    foreach: Optional[bool] = None


@attrs.frozen
class AdadeltaConfig:
    """Options of dense ``adadelta`` (``torch.optim.Adadelta``). Its ``lr`` scales the
    computed step; torch's default 1.0 is the update of the paper.

    Attributes:
        lr: factor of the update.
        rho: decay rate of the running averages.
        eps: added inside the roots.
        weight_decay: L2 penalty.
        foreach: use torch's multi-tensor implementation (unset: torch decides).
    """

    lr: float = attrs.field(validator=_non_negative)
    rho: float = attrs.field(default=0.9, validator=_unit)
    eps: float = attrs.field(default=1e-6, validator=_positive)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    foreach: Optional[bool] = None


def build_sgd(cfg: SGDConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.SGD`` over ``params``."""
    import torch

    return torch.optim.SGD(
        params, lr=cfg.lr, momentum=cfg.momentum, dampening=cfg.dampening, nesterov=cfg.nesterov,
        weight_decay=cfg.weight_decay, **_implementation(cfg),
    )


def build_adagrad(cfg: AdagradConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.Adagrad`` over ``params``."""
    import torch

    return torch.optim.Adagrad(
        params, lr=cfg.lr, lr_decay=cfg.lr_decay, weight_decay=cfg.weight_decay,
        initial_accumulator_value=cfg.initial_accumulator_value, eps=cfg.eps, **_implementation(cfg),
    )


def build_adam(cfg: AdamConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.Adam`` over ``params``."""
    import torch

    return torch.optim.Adam(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay,
        amsgrad=cfg.amsgrad, **_implementation(cfg),
    )


def build_adamw(cfg: AdamWConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.AdamW`` over ``params``."""
    import torch

    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay,
        amsgrad=cfg.amsgrad, **_implementation(cfg),
    )


def build_rmsprop(cfg: RMSpropConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.RMSprop`` over ``params``."""
    import torch

    return torch.optim.RMSprop(
        params, lr=cfg.lr, alpha=cfg.alpha, eps=cfg.eps, weight_decay=cfg.weight_decay,
        momentum=cfg.momentum, centered=cfg.centered, **_implementation(cfg, fused_available=False),
    )


def build_adadelta(cfg: AdadeltaConfig, params: Iterable[Any]) -> Any:
    """``torch.optim.Adadelta`` over ``params``."""
    import torch

    return torch.optim.Adadelta(
        params, lr=cfg.lr, rho=cfg.rho, eps=cfg.eps, weight_decay=cfg.weight_decay,
        **_implementation(cfg, fused_available=False),
    )
