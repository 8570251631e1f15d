"""TOML options of every component (attrs classes, free of torch so plugin loading stays fast).

tzrec-run structures each component's TOML table into its class strictly: an unknown key, a
string for a float or a value a validator refuses is an error naming its TOML path.
"""

from __future__ import annotations

from typing import Optional

import attrs

__all__ = ["LionConfig", "AdaBeliefConfig", "InverseSqrtConfig", "EmaRowWiseAdagradConfig"]

_non_negative = attrs.validators.ge(0.0)
_positive = attrs.validators.gt(0.0)
_unit = attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0))


@attrs.frozen
class LionConfig:
    """Options of dense ``lion``: Algorithm 2 of Chen et al., "Symbolic Discovery of
    Optimization Algorithms" (2023). Per element, with gradient ``g``::

        c = beta1 * m + (1 - beta1) * g
        w = w - lr * (sign(c) + weight_decay * w)
        m = beta2 * m + (1 - beta2) * g

    The update has the same size for every element, so ``lr`` is typically 3-10 times smaller
    than AdamW's and ``weight_decay`` 3-10 times larger (the paper's advice).

    Attributes:
        lr: learning rate.
        beta1: interpolation between momentum and gradient for the update's sign.
        beta2: decay of the momentum.
        weight_decay: decoupled weight decay, scaled by ``lr``.
    """

    lr: float = attrs.field(validator=_non_negative)
    beta1: float = attrs.field(default=0.9, validator=_unit)
    beta2: float = attrs.field(default=0.99, validator=_unit)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)


@attrs.frozen
class AdaBeliefConfig:
    """Options of dense ``adabelief``: Algorithm 2 of Zhuang et al., "AdaBelief Optimizer:
    Adapting Stepsizes by the Belief in Observed Gradients" (NeurIPS 2020), as the authors'
    ``adabelief-pytorch`` 0.2 computes it without rectification. Per element, at step ``t``::

        w = w * (1 - lr * weight_decay)
        m = beta1 * m + (1 - beta1) * g
        s = beta2 * s + (1 - beta2) * (g - m)^2 + eps
        w = w - lr / (1 - beta1^t) * m / (sqrt(s / (1 - beta2^t)) + eps)

    Attributes:
        lr: learning rate.
        beta1: decay of the first moment.
        beta2: decay of the "belief" (the second moment of ``g - m``).
        eps: added to ``s`` at every step and to the denominator (the authors' default 1e-16
            plays the part of Adam's 1e-8).
        weight_decay: decoupled weight decay, scaled by ``lr`` (AdamW's).
    """

    lr: float = attrs.field(validator=_non_negative)
    beta1: float = attrs.field(default=0.9, validator=_unit)
    beta2: float = attrs.field(default=0.999, validator=_unit)
    eps: float = attrs.field(default=1e-16, validator=_positive)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)


@attrs.frozen
class InverseSqrtConfig:
    """Options of the LR schedule ``inverse_sqrt``. At position ``k`` (the number of
    scheduler steps so far; batch ``n`` trains with position ``n - 1``), for a param group
    whose optimizer ``lr`` is ``base``::

        k <  W:  warmup_learning_rate + (base - warmup_learning_rate) * k / W
        k >= W:  max(base * sqrt(T / (k - W + T)), min_learning_rate)

    with ``W = warmup_size`` and ``T = timescale`` (default ``W``, or 1 when ``W = 0``). With
    the default timescale this is fairseq's ``inverse_sqrt`` (``base * sqrt(W / k)`` after
    the warmup), the schedule of Vaswani et al. (2017) up to its constant.

    Attributes:
        warmup_size: steps (epochs with ``by_epoch``) of linear warmup.
        warmup_learning_rate: the lr at ``k = 0`` when ``warmup_size > 0``.
        timescale: after the warmup the lr is halved every time ``k - W + T`` quadruples.
        min_learning_rate: the floor of the decay (not applied during the warmup).
        by_epoch: step once per epoch instead of once per training batch.
    """

    warmup_size: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    warmup_learning_rate: float = attrs.field(default=0.0, validator=_non_negative)
    timescale: Optional[int] = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    min_learning_rate: float = attrs.field(default=0.0, validator=_non_negative)
    by_epoch: bool = False


@attrs.frozen
class EmaRowWiseAdagradConfig:
    """Options of the sparse optimizer ``ema_rowwise_adagrad`` (FBGEMM
    ``EMAINPLACE_ROWWISE_ADAGRAD``, fused on CPU and CUDA).

    Each embedding row of width ``D`` (even) is a fast half ``w[:D/2]`` and a slow half
    ``w[D/2:]``. FBGEMM counts the forward calls of each table (``t = 1, 2, ...``) and, on a
    training forward with ``t % ema_every == 0`` and ``t >= ema_start``, before the lookup,
    moves the slow half of every row of the table towards its fast half (the soft target
    update of Lillicrap et al. 2016)::

        w[D/2:] += ema_coef * (w[:D/2] - w[D/2:])

    The backward pass then applies row-wise Adagrad (FBGEMM ``EXACT_ROWWISE_ADAGRAD``) to the
    touched rows, with ``g`` a row's summed gradient::

        h += sum(g * g) / D;  w -= lr * g / (sqrt(h) + eps)

    A model reads both halves (e.g. the slow half as a target, or their sum). Evaluation
    batches also advance FBGEMM's counter (without an EMA); the counter is not part of a
    checkpoint, so after a resume it starts again from 0. The halves are those of each shard:
    keep such tables on table-wise or row-wise sharding, not column-wise.

    Attributes:
        lr: learning rate of the row-wise Adagrad step.
        eps: added to the root of the accumulator.
        ema_every: apply the EMA every this many forward calls.
        ema_start: the first forward call that may apply it.
        ema_coef: the EMA's step towards the fast half (0: never moves, 1: copies it).
    """

    lr: float = attrs.field(validator=_non_negative)
    eps: float = attrs.field(default=1e-8, validator=_positive)
    ema_every: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    ema_start: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    ema_coef: float = attrs.field(default=0.6, validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0)))
