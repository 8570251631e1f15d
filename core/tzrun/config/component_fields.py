"""The core-read keys of the component tables (``type = "..."``) of the config schema: what
tzrec-run itself reads next to a component's own options (a sparse optimizer's
``lr_schedule``, a dense optimizer's ``parts`` and ``ema``, a loss's or metric's ``name``,
``label``, ``prediction``, ``weight`` and ``group_by``). The second pass of
:mod:`tzrun.config.load` structures them into a :class:`~tzrun.config.base.Component`'s
``fields``."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

import attrs

from tzrun.config.base import Component, _in_unit_open

__all__ = ["SparseOptimizerFields", "EMAConfig", "PartFields", "DenseOptimizerFields", "LossFields", "MetricFields",
           "TrainMetricFields"]


@attrs.frozen
class SparseOptimizerFields:
    """Keys of a sparse optimizer table that tzrec-run reads itself.

    Attributes:
        lr_schedule: the schedule of the fused optimizer's learning rate (default ``constant``;
            see docs/schedules.md); per-table overrides share the schedule of
            ``train.sparse_optimizer``.
        cpu_policy: what to do on CPU when FBGEMM has no CPU kernel for the optimizer:
            ``"error"`` (default) stops with a config error; ``"data_parallel"`` trains the
            table data-parallel with the equivalent torch optimizer, whose state moves for
            every row at every step (not only for the touched rows). See
            docs/sparse_optimizers.md, CPU policy.
    """

    lr_schedule: Optional[Component] = Component("constant")
    cpu_policy: Literal["error", "data_parallel"] = "error"


@attrs.frozen
class EMAConfig:
    """``ema = { decay = 0.999 }`` in ``[train.dense_optimizer]``: an exponential moving
    average of every dense parameter, updated after each dense optimizer step.

    Attributes:
        decay: ``ema = decay * ema + (1 - decay) * weight``; the first update copies the weights.
        use_for_eval: evaluate with the averaged weights (training continues on the raw ones).
    """

    decay: float = attrs.field(default=0.999, validator=_in_unit_open)
    use_for_eval: bool = True


def _regex(instance: Any, attribute: Any, value: str) -> None:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}", attribute) from None


@attrs.frozen
class PartFields:
    """Keys of a ``[[train.dense_optimizer.parts]]`` table that tzrec-run reads itself.

    Attributes:
        pattern: a regular expression that must match the whole parameter name (as
            ``tzrec-run check --params`` prints them); a parameter matched by two parts is an error.
        lr_schedule: this part's schedule (default: the dense optimizer's schedule, with the
            same options, applied to this part's lr).
    """

    pattern: str = attrs.field(validator=_regex, metadata={
        "missing": 'each part needs pattern = "<regex over parameter names>", e.g. "deep\\..*"'})
    lr_schedule: Optional[Component] = None


@attrs.frozen
class DenseOptimizerFields:
    """Keys of ``[train.dense_optimizer]`` that tzrec-run reads itself.

    Attributes:
        lr_schedule: the schedule of the optimizer's learning rate (default ``constant``; see
            docs/schedules.md).
        parts: part optimizers, each over the dense parameters its ``pattern`` matches; the
            others stay with this optimizer (see docs/optimizers.md, Part optimizers).
        ema: an exponential moving average of the dense weights (off when unset; see
            docs/optimizers.md, EMA of dense weights).
    """

    lr_schedule: Optional[Component] = Component("constant")
    parts: tuple[Component, ...] = ()
    ema: Optional[EMAConfig] = None


@attrs.frozen
class LossFields:
    """Keys of a ``[[losses]]`` table that tzrec-run reads itself.

    Attributes:
        name: the loss's name in logs and results (default: its type); the names of the
            ``[[losses]]`` must differ. Each evaluation reports every loss as
            ``loss/<name>``, its mean over rows.
        label: the label column it is computed against (default: the first of ``data.labels``).
        prediction: the model output it consumes (default: what the loss registered,
            ``logits`` unless it registered another); the model must make it.
        weight: its factor in the total loss.
        group_by: the input column whose values group rows (a session, a user, a query):
            integers, or strings hashed with FNV-1a 64. Required by the losses that need one
            (``jrc``), accepted by some (``pairwise_logistic``), refused by the others.
    """

    name: Optional[str] = None
    label: Optional[str] = None
    prediction: Optional[str] = None
    weight: float = 1.0
    group_by: Optional[str] = None


@attrs.frozen
class MetricFields:
    """Keys of a ``[[metrics]]`` table that tzrec-run reads itself (see :class:`LossFields`;
    ``group_by`` names the group key of grouped metrics such as ``grouped_auc``).

    Attributes:
        name: the metric's name in logs and results (default: its type, or the name its
            options give, e.g. ``auc_binned200``); the names within ``[[metrics]]`` (and
            within ``[[train_metrics]]``) must differ.
        label: the label column it is computed against (default: the first of ``data.labels``).
        prediction: the model output it consumes (default: what the metric registered,
            ``probs`` unless it registered another); the model must make it.
        group_by: the input column whose values group rows (a session, a user, a query):
            integers, or strings hashed with FNV-1a 64. Required by the metrics that need one
            (``grouped_auc``), refused by those that use none.
    """

    name: Optional[str] = None
    label: Optional[str] = None
    prediction: Optional[str] = None
    group_by: Optional[str] = None


@attrs.frozen
class TrainMetricFields(MetricFields):
    """Keys of a ``[[train_metrics]]`` table that tzrec-run reads itself: those of
    :class:`MetricFields`, and the decay of the value training logs show.

    Attributes:
        decay_rate: every ``decay_step`` steps the metric is computed over those steps' rows
            (all ranks) and reset; the value shown is ``decay_rate * previous + (1 - decay_rate)
            * window`` (the first window's value as is). Before the first window closes there
            is no value (TorchEasyRec shows 0.0).
        decay_step: the window, in training steps.
    """

    decay_rate: float = attrs.field(default=0.9, validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0)))
    decay_step: int = attrs.field(default=100, validator=attrs.validators.ge(1))
