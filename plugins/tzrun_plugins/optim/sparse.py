"""Sparse (embedding) optimizers: declarative specs that torchrec fuses into FBGEMM's kernels.

Each config holds exactly the options FBGEMM's lookup for that optimizer reads
(``fbgemm_gpu/split_embedding_codegen_lookup_invokers/lookup_<optimizer>.py``), with FBGEMM's
defaults. The update rules quoted in the docstrings are FBGEMM's codegen
(``fbgemm_gpu/codegen/genscript/optimizers.py``); ``g`` is a touched row's gradient, the sum over
every bag that looked the row up (after gradient clipping, see below), ``t`` FBGEMM's step
counter (1 on the first step), and only touched rows change.

Gradient clipping (``gradient_clipping = true``) is applied by FBGEMM's autograd function,
before the optimizer: each element of each bag's pooled-output gradient is clamped to
``[-max_gradient, max_gradient]``, and only then summed into the rows. A row looked up in ``k``
bags (or ``k`` times in one bag) can therefore receive up to ``k * max_gradient`` per element.

FBGEMM's CPU kernels fuse SGD, Adagrad and row-wise Adagrad; these three run everywhere. The
others are CUDA only: on CPU, ``cpu_policy = "data_parallel"`` trains their tables
data-parallel with the torch equivalent in ``spec.torch_fallback``
(:mod:`tzrun_plugins.optim.torch_equivalents`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Literal

import attrs

from tzrun import SparseOptimizerSpec

__all__ = [
    "SparseSGDConfig",
    "SparseAdagradConfig",
    "SparseRowWiseAdagradConfig",
    "SparseAdamConfig",
    "SparseLambConfig",
    "SparseLarsSGDConfig",
    "SparsePartialRowWiseAdamConfig",
    "SparsePartialRowWiseLambConfig",
    "build_sgd",
    "build_adagrad",
    "build_rowwise_adagrad",
    "build_adam",
    "build_lamb",
    "build_lars_sgd",
    "build_partial_rowwise_adam",
    "build_partial_rowwise_lamb",
]

_positive = attrs.validators.gt(0.0)
_non_negative = attrs.validators.ge(0.0)
_unit = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0))


def _lr() -> Any:
    return attrs.field(validator=_non_negative)


def _eps() -> Any:
    return attrs.field(default=1e-8, validator=_positive)


def _max_gradient() -> Any:
    return attrs.field(default=1.0, validator=_positive)


def _weight_decay() -> Any:
    return attrs.field(default=0.0, validator=_non_negative)


def _initial_accumulator_value() -> Any:
    return attrs.field(default=0.0, validator=_non_negative)


@attrs.frozen
class SparseSGDConfig:
    """Options of sparse ``sgd`` (FBGEMM ``EXACT_SGD``).

    Update of a touched row: ``w -= lr * g``.

    Attributes:
        lr: learning rate.
        gradient_clipping: clamp each bag's output gradient to ``[-max_gradient, max_gradient]``
            before it is summed into the rows.
        max_gradient: the clamp bound.
    """

    lr: float = _lr()
    gradient_clipping: bool = False
    max_gradient: float = _max_gradient()


@attrs.frozen
class SparseAdagradConfig:
    """Options of sparse ``adagrad`` (FBGEMM ``EXACT_ADAGRAD``): an accumulator per element.

    Update of a touched row, element-wise: ``h += g * g``; ``w -= lr * g / (sqrt(h) + eps)``.
    No weight decay.

    Attributes:
        lr: learning rate.
        eps: added to the root of the accumulator.
        gradient_clipping: clamp each bag's output gradient to ``[-max_gradient, max_gradient]``
            before it is summed into the rows.
        max_gradient: the clamp bound.
        initial_accumulator_value: the starting value of ``h`` (FBGEMM's ``momentum1``).
    """

    lr: float = _lr()
    eps: float = _eps()
    gradient_clipping: bool = False
    max_gradient: float = _max_gradient()
    initial_accumulator_value: float = _initial_accumulator_value()


@attrs.frozen
class SparseRowWiseAdagradConfig:
    """Options of sparse ``rowwise_adagrad`` (FBGEMM ``EXACT_ROWWISE_ADAGRAD``): one accumulator
    per embedding row, so the optimizer state is one float per row instead of one per element.

    Update of a touched row of width ``D``::

        g' = g + weight_decay * w        if weight_decay_mode = "l2", else g
        h += sum(g' * g') / D             (one value per row)
        m = lr / (sqrt(h) + eps)
        c = 1 - m * weight_decay          "l2"
            1 - lr * weight_decay         "decoupled"
            1                             "none"
        w = c * w - m * g

    With ``"l2"`` the decay enters the accumulator and shrinks the row by the adaptive step;
    with ``"decoupled"`` it shrinks the row by ``lr * weight_decay`` and leaves ``h`` alone.

    FBGEMM's CPU kernel does not apply weight decay to a float32 table read by a single
    feature (it takes FBGEMM's vectorised row-wise Adagrad, called with weight decay 0); it
    does for a table several features share. On CUDA both modes always apply.

    Attributes:
        lr: learning rate.
        eps: added to the root of the accumulator.
        weight_decay: the decay coefficient (0: none).
        weight_decay_mode: ``"l2"`` or ``"decoupled"`` (see above); ``"none"`` needs
            ``weight_decay = 0``.
        gradient_clipping: clamp each bag's output gradient to ``[-max_gradient, max_gradient]``
            before it is summed into the rows.
        max_gradient: the clamp bound.
        initial_accumulator_value: the starting value of ``h`` (FBGEMM's ``momentum1``).
    """

    lr: float = _lr()
    eps: float = _eps()
    weight_decay: float = _weight_decay()
    weight_decay_mode: Literal["none", "l2", "decoupled"] = "l2"
    gradient_clipping: bool = False
    max_gradient: float = _max_gradient()
    initial_accumulator_value: float = _initial_accumulator_value()

    def __attrs_post_init__(self) -> None:
        if self.weight_decay > 0 and self.weight_decay_mode == "none":
            raise ValueError(
                f'weight_decay = {self.weight_decay} with weight_decay_mode = "none": '
                'set weight_decay_mode = "l2" or "decoupled", or weight_decay = 0'
            )


@attrs.frozen
class _MomentsConfig:
    """The options FBGEMM's Adam, LAMB and their partial row-wise forms read.

    Attributes:
        lr: learning rate.
        eps: added to the root of the bias-corrected second moment.
        beta1: decay of the first moment.
        beta2: decay of the second moment (one per element, or per row for the partial
            row-wise forms).
        weight_decay: weight decay (where it enters: each optimizer's rule).
        gradient_clipping: clamp each bag's output gradient to ``[-max_gradient, max_gradient]``
            before it is summed into the rows.
        max_gradient: the clamp bound.
    """

    lr: float = _lr()
    eps: float = _eps()
    beta1: float = attrs.field(default=0.9, validator=_unit)
    beta2: float = attrs.field(default=0.999, validator=_unit)
    weight_decay: float = _weight_decay()
    gradient_clipping: bool = False
    max_gradient: float = _max_gradient()


@attrs.frozen
class SparseAdamConfig(_MomentsConfig):
    """Options of sparse ``adam`` (FBGEMM ``ADAM``; CUDA only).

    Update of a touched row, element-wise::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        w -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w)

    The weight decay is decoupled (AdamW's): it shrinks ``w`` and never enters ``m`` or ``v``.

    Options: those of :class:`_MomentsConfig`; ``weight_decay`` is decoupled weight decay.
    """


@attrs.frozen
class SparseLambConfig(_MomentsConfig):
    """Options of sparse ``lamb`` (FBGEMM ``LAMB``; CUDA only).

    Update of a touched row (each row is its own LAMB "layer")::

        m = beta1 * m + (1 - beta1) * g                                     element-wise
        v = beta2 * v + (1 - beta2) * g * g
        r = m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w
        w -= lr * (|w| / |r|) * r                                          |.|: the row's L2 norm

    A row whose weights are all zero never moves (its trust ratio is 0).

    Options: those of :class:`_MomentsConfig`; ``weight_decay`` is added to the update direction
    ``r`` before the trust ratio.
    """


@attrs.frozen
class SparsePartialRowWiseAdamConfig(_MomentsConfig):
    """Options of sparse ``partial_rowwise_adam`` (FBGEMM ``PARTIAL_ROWWISE_ADAM``; CUDA only):
    Adam with one second moment per row.

    Update of a touched row of width ``D``::

        v = beta2 * v + (1 - beta2) * sum(g * g) / D                        one value per row
        m = beta1 * m + (1 - beta1) * g                                     element-wise
        w -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w)

    Options: those of :class:`_MomentsConfig`; ``weight_decay`` is decoupled weight decay.
    """


@attrs.frozen
class SparsePartialRowWiseLambConfig(_MomentsConfig):
    """Options of sparse ``partial_rowwise_lamb`` (FBGEMM ``PARTIAL_ROWWISE_LAMB``; CUDA only):
    LAMB with one second moment per row.

    Update of a touched row of width ``D``::

        v = beta2 * v + (1 - beta2) * sum(g * g) / D                        one value per row
        m = beta1 * m + (1 - beta1) * g                                     element-wise
        r = m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * w
        w -= lr * (|w| / |r|) * r                                          |.|: the row's L2 norm

    Options: those of :class:`_MomentsConfig`; ``weight_decay`` is added to the update direction
    ``r`` before the trust ratio.
    """


@attrs.frozen
class SparseLarsSGDConfig:
    """Options of sparse ``lars_sgd`` (FBGEMM ``LARS_SGD``; CUDA only): SGD with momentum and a
    layer-wise (here: row-wise) adaptive rate.

    Update of a touched row::

        a = lr * eta * |w| / (|g| + weight_decay * |w|)                     |.|: the row's L2 norm
        m = momentum * m + a * (g + weight_decay * w)                       element-wise
        w -= m

    There is no bias correction and no ``eps``; a row whose weights are all zero never moves.

    Attributes:
        lr: learning rate.
        eta: LARS trust coefficient.
        momentum: momentum factor.
        weight_decay: L2 weight decay, inside the trust ratio and the update.
        gradient_clipping: clamp each bag's output gradient to ``[-max_gradient, max_gradient]``
            before it is summed into the rows.
        max_gradient: the clamp bound.
    """

    lr: float = _lr()
    eta: float = attrs.field(default=0.001, validator=_positive)
    momentum: float = attrs.field(default=0.9, validator=_unit)
    weight_decay: float = _weight_decay()
    gradient_clipping: bool = False
    max_gradient: float = _max_gradient()


def _clipping(cfg: Any) -> dict[str, Any]:
    """FBGEMM's clipping kwargs, only when on (FBGEMM's default is off)."""
    return {"gradient_clipping": True, "max_gradient": cfg.max_gradient} if cfg.gradient_clipping else {}


def build_sgd(cfg: SparseSGDConfig) -> SparseOptimizerSpec:
    """The spec of fused SGD."""
    from torchrec.optim.optimizers import SGD

    return SparseOptimizerSpec(SGD, {"lr": cfg.lr, **_clipping(cfg)}, "EXACT_SGD")


def build_adagrad(cfg: SparseAdagradConfig) -> SparseOptimizerSpec:
    """The spec of fused Adagrad."""
    from torchrec.optim.optimizers import Adagrad

    kwargs = {"lr": cfg.lr, "eps": cfg.eps, **_clipping(cfg)}
    return SparseOptimizerSpec(
        Adagrad, kwargs, "EXACT_ADAGRAD", initial_accumulator_value=cfg.initial_accumulator_value
    )


def build_rowwise_adagrad(cfg: SparseRowWiseAdagradConfig) -> SparseOptimizerSpec:
    """The spec of fused row-wise Adagrad."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    kwargs: dict[str, Any] = {"lr": cfg.lr, "eps": cfg.eps}
    if cfg.weight_decay:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

        mode = WeightDecayMode.L2 if cfg.weight_decay_mode == "l2" else WeightDecayMode.DECOUPLE
        kwargs.update(weight_decay=cfg.weight_decay, weight_decay_mode=mode)
    kwargs.update(_clipping(cfg))
    return SparseOptimizerSpec(
        RowWiseAdagrad, kwargs, "EXACT_ROWWISE_ADAGRAD", initial_accumulator_value=cfg.initial_accumulator_value
    )


def _moments_kwargs(cfg: _MomentsConfig) -> dict[str, Any]:
    return {
        "lr": cfg.lr,
        "eps": cfg.eps,
        "beta1": cfg.beta1,
        "beta2": cfg.beta2,
        "weight_decay": cfg.weight_decay,
        **_clipping(cfg),
    }


def build_adam(cfg: SparseAdamConfig) -> SparseOptimizerSpec:
    """The spec of fused Adam. FBGEMM's Adam is AdamW's rule, so its torch equivalent is
    ``torch.optim.AdamW`` (``ClippedAdamW``, which clamps the gradient first, with
    ``gradient_clipping``)."""
    import torch
    from torchrec.optim.optimizers import Adam

    from tzrun_plugins.optim.torch_equivalents import ClippedAdamW

    adamw: dict[str, Any] = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    fallback: Callable[[Iterable[Any]], Any]
    if cfg.gradient_clipping:
        fallback = functools.partial(ClippedAdamW, max_gradient=cfg.max_gradient, **adamw)
    else:
        fallback = functools.partial(torch.optim.AdamW, **adamw)
    return SparseOptimizerSpec(Adam, _moments_kwargs(cfg), "ADAM", cpu_supported=False, torch_fallback=fallback)


def build_lamb(cfg: SparseLambConfig) -> SparseOptimizerSpec:
    """The spec of fused LAMB."""
    from torchrec.optim.optimizers import LAMB

    from tzrun_plugins.optim.torch_equivalents import FbgemmLamb

    kwargs = _moments_kwargs(cfg)
    fallback = functools.partial(FbgemmLamb, **kwargs)
    return SparseOptimizerSpec(LAMB, kwargs, "LAMB", cpu_supported=False, torch_fallback=fallback)


def build_partial_rowwise_adam(cfg: SparsePartialRowWiseAdamConfig) -> SparseOptimizerSpec:
    """The spec of fused partial row-wise Adam."""
    from torchrec.optim.optimizers import PartialRowWiseAdam

    from tzrun_plugins.optim.torch_equivalents import FbgemmPartialRowWiseAdam

    kwargs = _moments_kwargs(cfg)
    fallback = functools.partial(FbgemmPartialRowWiseAdam, **kwargs)
    return SparseOptimizerSpec(
        PartialRowWiseAdam, kwargs, "PARTIAL_ROWWISE_ADAM", cpu_supported=False, torch_fallback=fallback
    )


def build_partial_rowwise_lamb(cfg: SparsePartialRowWiseLambConfig) -> SparseOptimizerSpec:
    """The spec of fused partial row-wise LAMB."""
    from torchrec.optim.optimizers import PartialRowWiseLAMB

    from tzrun_plugins.optim.torch_equivalents import FbgemmPartialRowWiseLamb

    kwargs = _moments_kwargs(cfg)
    fallback = functools.partial(FbgemmPartialRowWiseLamb, **kwargs)
    return SparseOptimizerSpec(
        PartialRowWiseLAMB, kwargs, "PARTIAL_ROWWISE_LAMB", cpu_supported=False, torch_fallback=fallback
    )


def build_lars_sgd(cfg: SparseLarsSGDConfig) -> SparseOptimizerSpec:
    """The spec of fused LARS SGD."""
    from torchrec.optim.optimizers import LarsSGD

    from tzrun_plugins.optim.torch_equivalents import FbgemmLarsSGD

    kwargs = {"lr": cfg.lr, "eta": cfg.eta, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay, **_clipping(cfg)}
    fallback = functools.partial(FbgemmLarsSGD, **kwargs)
    return SparseOptimizerSpec(LarsSGD, kwargs, "LARS_SGD", cpu_supported=False, torch_fallback=fallback)
