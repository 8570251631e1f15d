"""Weighted row-wise metrics: log loss, normalized entropy, calibration, accuracy, MAE, MSE, RMSE.

Each is a ratio of weighted sums over rows (``w_i`` the sample weight, 1 when none is
given), kept as float64 ``sum`` states: rows of weight 0 add nothing, and under
``torch.distributed`` the sums of all ranks are added before the ratio is taken, so the
value is the one over all rows whatever the number of ranks (up to the rounding of float64
addition order). Predictions are used in float64.

=====================  ==========  ============================================================
metric                 labels      value
=====================  ==========  ============================================================
``log_loss``           ``[0, 1]``  ``sum w_i CE_i / sum w_i``, ``CE_i = -y log q - (1-y) log(1-q)``,
                                   ``q = clamp(p_i, eps, 1 - eps)``
``normalized_entropy`` ``[0, 1]``  ``log_loss / H(b)``, ``b = sum w_i y_i / sum w_i``,
                                   ``H(b) = -b log b - (1-b) log(1-b)``
``calibration``        ``[0, 1]``  ``sum w_i p_i / sum w_i y_i``
``accuracy``           ``{0, 1}``  ``sum w_i [(p_i > threshold) == y_i] / sum w_i`` (``>=`` with
                                   ``compare = ">="``)
``mae``                real        ``sum w_i |p_i - y_i| / sum w_i``
``mse``                real        ``sum w_i (p_i - y_i)^2 / sum w_i``
``rmse``               real        ``sqrt(mse)``
=====================  ==========  ============================================================

The first four take probabilities (``prediction = "probs"``) and refuse values outside
``[0, 1]``. A value whose denominator is 0 (no rows; ``H(b) = 0`` because every label is 0
or every label is 1; no positive label for ``calibration``) is undefined: ``compute``
returns NaN with a :class:`RuntimeWarning` saying why.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor
from torchmetrics import Metric

from tzrun_plugins.metrics._inputs import LabelKind, weighted_rows
from tzrun_plugins.metrics.options import AccuracyConfig, LogLossConfig, NoOptionsConfig

__all__ = [
    "MAE",
    "MSE",
    "RMSE",
    "Accuracy",
    "Calibration",
    "LogLoss",
    "NormalizedEntropy",
    "build_accuracy",
    "build_calibration",
    "build_log_loss",
    "build_mae",
    "build_mse",
    "build_normalized_entropy",
    "build_rmse",
]


class _WeightedSums(Metric):
    """Keeps ``sum_i w_i * term_i`` per named term (float64, summed across ranks)."""

    is_differentiable = False
    full_state_update = False
    name: ClassVar[str]
    labels: ClassVar[LabelKind]
    probabilities: ClassVar[bool] = False
    terms: ClassVar[tuple[str, ...]]
    weight: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for term in ("weight", *self.terms):
            self.add_state(term, default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def _row_terms(self, preds: Tensor, target: Tensor) -> dict[str, Tensor]:
        """Per-row values of each term, from float64 predictions and targets."""
        raise NotImplementedError

    def update(self, preds: Tensor, target: Tensor, weight: Tensor | None = None) -> None:
        """Add a batch of rows.

        Args:
            preds: Predictions, ``[B]`` or ``[B, 1]``.
            target: Labels of the kind the metric accepts, same shape.
            weight: Optional finite non-negative sample weights; rows of weight 0 are dropped.

        Raises:
            ValueError: On a bad shape, a NaN prediction, a probability outside ``[0, 1]``, a
                label of the wrong kind, or a negative or non-finite weight.
        """
        preds, target, weight, _ = weighted_rows(self.name, preds, target, weight, labels=self.labels)
        preds = preds.detach().to(torch.float64)
        if self.probabilities and not bool(((preds >= 0) & (preds <= 1)).all()):
            raise ValueError(
                f'{self.name}: preds must be probabilities in [0, 1]; is prediction = "logits" configured '
                'instead of "probs"?'
            )
        target = target.detach().to(torch.float64)
        w = torch.ones_like(preds) if weight is None else weight.detach().to(torch.float64)
        self.weight = self.weight + w.sum().to(self.weight.device)
        for term, values in self._row_terms(preds, target).items():
            setattr(self, term, getattr(self, term) + (w * values).sum().to(self.weight.device))

    def _ratio(self, numerator: Tensor, denominator: Tensor, why: str) -> Tensor:
        if not bool(denominator > 0):
            warnings.warn(f"{self.name} is undefined because {why}; returning NaN", RuntimeWarning, stacklevel=3)
            return torch.tensor(math.nan, dtype=torch.float64, device=self.device)
        return (numerator / denominator).to(torch.float64)


_NO_ROWS = "no rows (with positive weight) were given"


class LogLoss(_WeightedSums):
    """Weighted binary cross entropy of probabilities (see the module docstring)."""

    name, labels, probabilities = "log_loss", "unit", True
    terms: ClassVar[tuple[str, ...]] = ("loss",)
    higher_is_better = False
    loss: Tensor

    def __init__(self, eps: float = 1e-12, **kwargs: Any) -> None:
        """Create the metric; probabilities are clamped to ``[eps, 1 - eps]``."""
        super().__init__(**kwargs)
        self.eps = eps

    def _row_terms(self, preds: Tensor, target: Tensor) -> dict[str, Tensor]:
        q = preds.clamp(self.eps, 1.0 - self.eps)
        return {"loss": -(target * torch.log(q) + (1.0 - target) * torch.log1p(-q))}

    def compute(self) -> Tensor:
        """``sum w CE / sum w`` over all ranks' rows."""
        return self._ratio(self.loss, self.weight, _NO_ROWS)


class NormalizedEntropy(LogLoss):
    """Log loss divided by the entropy of the weighted base rate (see the module docstring)."""

    name = "normalized_entropy"
    terms: ClassVar[tuple[str, ...]] = ("loss", "positive")
    positive: Tensor

    def _row_terms(self, preds: Tensor, target: Tensor) -> dict[str, Tensor]:
        return {**super()._row_terms(preds, target), "positive": target}

    def compute(self) -> Tensor:
        """``log_loss / H(base rate)`` over all ranks' rows."""
        if not bool(self.weight > 0):
            return self._ratio(self.loss, self.weight, _NO_ROWS)
        rate = (self.positive / self.weight).clamp(0.0, 1.0)
        entropy = -(torch.xlogy(rate, rate) + torch.xlogy(1.0 - rate, 1.0 - rate))
        why = "the weighted base rate of the labels is 0 or 1 (its entropy is 0)"
        return self._ratio(self.loss / self.weight, entropy, why)


class Calibration(_WeightedSums):
    """Weighted mean prediction over weighted mean label (see the module docstring)."""

    name, labels, probabilities, terms = "calibration", "unit", True, ("predicted", "positive")
    higher_is_better = None
    predicted: Tensor
    positive: Tensor

    def _row_terms(self, preds: Tensor, target: Tensor) -> dict[str, Tensor]:
        return {"predicted": preds, "positive": target}

    def compute(self) -> Tensor:
        """``sum w p / sum w y`` over all ranks' rows."""
        return self._ratio(self.predicted, self.positive, "no label is positive (sum of weighted labels is 0)")


class Accuracy(_WeightedSums):
    """Weighted share of rows whose thresholded probability equals the label."""

    name, labels, probabilities, terms = "accuracy", "binary", True, ("correct",)
    higher_is_better = True
    correct: Tensor

    def __init__(self, threshold: float = 0.5, compare: Literal[">", ">="] = ">", **kwargs: Any) -> None:
        """Create the metric.

        Args:
            threshold: The probability rows are compared with.
            compare: ``">"`` (torchmetrics' rule): a row is predicted positive when
                ``p > threshold``; ``">="``: when ``p >= threshold``.
            **kwargs: Passed to :class:`torchmetrics.Metric`.

        Raises:
            ValueError: On another ``compare`` or a threshold outside ``[0, 1]``.
        """
        AccuracyConfig(threshold=threshold, compare=compare)  # validates
        super().__init__(**kwargs)
        self.threshold, self.compare = threshold, compare

    def update(self, preds: Tensor, target: Tensor, weight: Tensor | None = None) -> None:
        """Add a batch of rows (see :meth:`_WeightedSums.update`). The threshold is compared
        in the predictions' own dtype, as torchmetrics does (``0.3`` is ``0.3f`` for float32)."""
        preds = torch.as_tensor(preds)
        dtype = preds.dtype if preds.is_floating_point() else torch.float64
        self._cut = float(torch.tensor(self.threshold, dtype=dtype))
        super().update(preds, target, weight)

    def _row_terms(self, preds: Tensor, target: Tensor) -> dict[str, Tensor]:
        positive = preds > self._cut if self.compare == ">" else preds >= self._cut
        return {"correct": (positive.to(torch.float64) == target).to(torch.float64)}

    def compute(self) -> Tensor:
        """``sum w [correct] / sum w`` over all ranks' rows."""
        return self._ratio(self.correct, self.weight, _NO_ROWS)


class MAE(_WeightedSums):
    """Weighted mean absolute error."""

    name, labels, terms = "mae", "real", ("error",)
    higher_is_better = False
    error: Tensor

    def _row_terms(self, preds: Tensor, target: Tensor) -> dict[str, Tensor]:
        return {"error": (preds - target).abs()}

    def compute(self) -> Tensor:
        """``sum w |p - y| / sum w`` over all ranks' rows."""
        return self._ratio(self.error, self.weight, _NO_ROWS)


class MSE(_WeightedSums):
    """Weighted mean squared error."""

    name, labels, terms = "mse", "real", ("error",)
    higher_is_better = False
    error: Tensor

    def _row_terms(self, preds: Tensor, target: Tensor) -> dict[str, Tensor]:
        return {"error": (preds - target).square()}

    def compute(self) -> Tensor:
        """``sum w (p - y)^2 / sum w`` over all ranks' rows."""
        return self._ratio(self.error, self.weight, _NO_ROWS)


class RMSE(MSE):
    """Square root of the weighted mean squared error."""

    name = "rmse"

    def compute(self) -> Tensor:
        """``sqrt(sum w (p - y)^2 / sum w)`` over all ranks' rows."""
        return super().compute().sqrt()


def build_log_loss(cfg: LogLossConfig) -> LogLoss:
    """Build ``log_loss``."""
    return LogLoss(eps=cfg.eps)


def build_normalized_entropy(cfg: LogLossConfig) -> NormalizedEntropy:
    """Build ``normalized_entropy``."""
    return NormalizedEntropy(eps=cfg.eps)


def build_calibration(cfg: NoOptionsConfig) -> Calibration:
    """Build ``calibration``."""
    return Calibration()


def build_accuracy(cfg: AccuracyConfig) -> Accuracy:
    """Build ``accuracy``."""
    return Accuracy(threshold=cfg.threshold, compare=cfg.compare)


def build_mae(cfg: NoOptionsConfig) -> MAE:
    """Build ``mae``."""
    return MAE()


def build_mse(cfg: NoOptionsConfig) -> MSE:
    """Build ``mse``."""
    return MSE()


def build_rmse(cfg: NoOptionsConfig) -> RMSE:
    """Build ``rmse``."""
    return RMSE()
