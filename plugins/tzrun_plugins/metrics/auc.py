"""Binary ROC AUC: exact (tie-aware, weighted, distributed) or binned.

This module provides the metric ``auc``:

* :class:`AUCConfig` - its TOML options (``thresholds``),
* :func:`build_auc` - builds the metric from the options,
* :class:`AUC` - a :class:`torchmetrics.Metric` computing the ROC AUC over every row seen by
  every rank,
* :func:`binary_auc` - the same exact computation as a plain function.

**Exact mode** (the default, ``thresholds = None``) returns exactly what
``sklearn.metrics.roc_auc_score(target, preds, sample_weight=weight)`` returns: the ROC curve
has one point per *distinct* prediction value, and the area is integrated with the trapezoid
rule, so tied predictions count one half (a positive and a negative with the same score
contribute half a correctly ordered pair). The computation runs in float64 with a single
sort (O(n log n), vectorized, no Python loop over rows). ``preds`` may be probabilities or
logits: the AUC only depends on the order of the predictions, so no sigmoid is applied.

**Binned mode** (``thresholds = N``) is an *approximation*: it follows
``torchmetrics.classification.BinaryAUROC(thresholds=N)``, counting rows at ``N`` evenly
spaced thresholds in ``[0, 1]`` and integrating that coarse ROC curve. Its state is a fixed
``O(N)`` set of counters instead of every row.

**Degenerate input**: when the rows (with positive weight) contain only one class, or there
are no rows at all, the AUC is undefined; both modes then return ``0.5`` and emit a
:class:`RuntimeWarning` saying why (never NaN, never an exception).

**Sample weights and padding**: ``weight`` must be finite and non-negative. Rows of weight
``0`` are dropped in :meth:`AUC.update` (the framework pads batches with such rows), so they
have no effect at all - not even their ``preds``/``target`` values are validated or stored.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from tzrun_plugins.metrics._states import PredictionRows
from tzrun_plugins.metrics.options import AUCConfig, _check_thresholds

__all__ = ["AUC", "AUCConfig", "binary_auc", "build_auc"]


def build_auc(cfg: AUCConfig) -> AUC:
    """Build the ``auc`` metric from its options.

    Args:
        cfg: The metric's options.

    Returns:
        A fresh :class:`AUC` metric.
    """
    return AUC(thresholds=cfg.thresholds)


def _as_1d(x: Tensor, name: str) -> Tensor:
    """Return ``x`` as a 1-D tensor, accepting ``[B]`` or ``[B, 1]``."""
    if x.ndim == 2 and x.shape[1] == 1:
        return x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"auc: {name} must have shape [B] or [B, 1], got {tuple(x.shape)}")
    return x


def _validate(preds: Tensor, target: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """Check and flatten the inputs and drop the rows of weight 0.

    Args:
        preds: Scores, shape ``[B]`` or ``[B, 1]``, real dtype.
        target: Labels in ``{0, 1}``, same number of rows.
        weight: Optional finite non-negative sample weights, same number of rows.

    Returns:
        ``(preds, target, weight)`` as 1-D tensors restricted to the rows of positive weight
        (all rows if ``weight`` is ``None``).

    Raises:
        ValueError: On a bad shape, dtype, label, prediction or weight.
    """
    preds = torch.as_tensor(preds)
    target = torch.as_tensor(target)
    if preds.is_complex():
        raise ValueError(f"auc: preds must be real-valued, got dtype {preds.dtype}")
    preds = _as_1d(preds, "preds")
    target = _as_1d(target, "target")
    if preds.shape != target.shape:
        raise ValueError(
            f"auc: preds and target must have the same shape, got {tuple(preds.shape)} and {tuple(target.shape)}"
        )
    if weight is not None:
        weight = _as_1d(torch.as_tensor(weight), "weight")
        if weight.shape != preds.shape:
            raise ValueError(
                f"auc: weight must have the same shape as preds, got {tuple(weight.shape)} and {tuple(preds.shape)}"
            )
        if weight.is_complex() or weight.dtype == torch.bool:
            raise ValueError(f"auc: weight must be a real number tensor, got dtype {weight.dtype}")
        if not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
            raise ValueError("auc: weight must be finite and non-negative")
        keep = weight > 0
        if not bool(keep.all()):
            preds, target, weight = preds[keep], target[keep], weight[keep]
    if not bool(((target == 0) | (target == 1)).all()):
        raise ValueError("auc: target values must be 0 or 1 (in rows with positive weight)")
    if preds.is_floating_point() and bool(torch.isnan(preds).any()):
        raise ValueError("auc: preds contain NaN (in rows with positive weight)")
    return preds, target, weight


def _exact_auc(preds: Tensor, target: Tensor, weight: Tensor | None) -> Tensor | str:
    """Exact tie-aware (optionally weighted) ROC AUC in float64.

    Args:
        preds: 1-D scores without NaN.
        target: 1-D labels in ``{0, 1}``.
        weight: 1-D positive weights, or ``None`` for unit weights.

    Returns:
        The AUC as a float64 scalar tensor, or a string explaining why it is undefined.
    """
    n = preds.numel()
    if n == 0:
        return "no rows (with positive weight) were given"
    # Sort an integer key with the order of the scores: torch sorts integers with a radix sort,
    # about twice as fast as its comparison sort of floats (equal scores get equal keys).
    from tzrun_plugins.metrics._segments import float_key

    key, _ = float_key(preds)
    sorted_preds, order = torch.sort(key, descending=True)
    pos = target.to(torch.float64)[order]
    if weight is None:
        tp_inc, fp_inc = pos, 1.0 - pos
    else:
        w = weight.to(torch.float64)[order]
        tp_inc = w * pos
        fp_inc = w - tp_inc  # exact: w for negatives, 0 for positives
    # Cumulative weighted positives / negatives at the last row of each group of equal preds:
    # these are the ROC points (unnormalised), one per distinct threshold.
    group_end = torch.ones(n, dtype=torch.bool, device=preds.device)
    group_end[:-1] = sorted_preds[1:] != sorted_preds[:-1]
    tps = torch.cumsum(tp_inc, 0)[group_end]
    fps = torch.cumsum(fp_inc, 0)[group_end]
    total_pos, total_neg = tps[-1], fps[-1]
    if not bool(total_pos > 0):
        return "only negative rows (target 0) were given"
    if not bool(total_neg > 0):
        return "only positive rows (target 1) were given"
    zero = tps.new_zeros(1)
    prev_tps = torch.cat([zero, tps[:-1]])
    d_fps = fps - torch.cat([zero, fps[:-1]])
    area = (d_fps * (tps + prev_tps)).sum() * 0.5  # trapezoids from (0, 0) to (total_neg, total_pos)
    return area / (total_pos * total_neg)


def _degenerate(reason: str) -> float:
    """Warn that the AUC is undefined and return the defined fallback value 0.5."""
    warnings.warn(f"AUC is undefined because {reason}; returning 0.5", RuntimeWarning, stacklevel=3)
    return 0.5


def binary_auc(preds: Tensor, target: Tensor, weight: Tensor | None = None) -> float:
    """Exact binary ROC AUC of one set of rows, identical to ``sklearn.metrics.roc_auc_score``.

    Ties in ``preds`` count one half; the result does not depend on any monotone transform of
    ``preds`` (probabilities and logits give the same value). Computed in float64 with one sort.

    Args:
        preds: Scores, shape ``[B]`` or ``[B, 1]``.
        target: Labels in ``{0, 1}`` (bool, integer or float), same shape.
        weight: Optional finite non-negative sample weights, same shape. Rows of weight 0
            are ignored entirely.

    Returns:
        The AUC in ``[0, 1]``; ``0.5`` with a :class:`RuntimeWarning` if only one class (or
        no row) has positive weight.

    Raises:
        ValueError: On a bad shape, a label outside ``{0, 1}``, a NaN prediction or a
            negative / non-finite weight.
    """
    preds, target, weight = _validate(preds, target, weight)
    result = _exact_auc(preds, target, weight)
    if isinstance(result, str):
        return _degenerate(result)
    return float(result)


class AUC(PredictionRows):
    """Exact binary ROC AUC, correct across ranks.

    **Exact mode** (``thresholds=None``, the default) keeps every row (list states reduced
    with ``dist_reduce_fx="cat"``), so under ``torch.distributed`` :meth:`compute` first
    gathers the rows of all ranks (torchmetrics syncs the states) and the value is the AUC
    over all of them - not an average of per-rank AUCs. The result equals
    ``sklearn.metrics.roc_auc_score`` (ties count one half, optional sample weights) and is
    computed in float64 with one sort.

    Storage: rows are stored in the metric's dtype (``self.dtype``: float32 by default), which
    is exact for float32 predictions and halves the memory of float64 copies; call
    ``metric.set_dtype(torch.float64)`` to keep float64 predictions or weights bit-exact.
    Using one fixed storage dtype keeps the states of all ranks gatherable (a rank that saw
    no rows contributes an empty tensor of ``self.dtype``). The computation itself is always
    float64. Rows of weight 0 are dropped at update and cost nothing.

    **Binned mode** (``thresholds=N``) is an **approximation**: it follows
    ``torchmetrics.classification.BinaryAUROC(thresholds=N)`` - per update, if any prediction
    lies outside ``[0, 1]`` the batch is passed through a sigmoid; rows are counted at ``N``
    evenly spaced thresholds in ``[0, 1]`` and the resulting coarse ROC curve is integrated
    with the trapezoid rule. Its state is ``O(N)`` counters (summed across ranks). It does
    weights its counts by the sample weights.

    In both modes an undefined AUC (only one class, or no rows) yields ``0.5`` and a
    :class:`RuntimeWarning`. :meth:`update` checks its inputs, which synchronises with the
    device once per call on accelerators.

    Example:
        >>> metric = AUC()
        >>> metric.update(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
        >>> round(float(metric.compute()), 4)
        0.75
    """

    is_differentiable = False
    tp: Tensor
    fp: Tensor
    num_pos: Tensor
    num_neg: Tensor
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0

    def __init__(self, thresholds: int | None = None, **kwargs: Any) -> None:
        """Create the metric.

        Args:
            thresholds: ``None`` for the exact AUC, or an integer ``N >= 2`` for the binned
                approximation with ``N`` thresholds.
            **kwargs: Passed to :class:`torchmetrics.Metric` (``process_group``,
                ``dist_sync_fn``, ``sync_on_compute``, ...).

        Raises:
            ValueError: If ``thresholds`` is neither ``None`` nor an int >= 2.
        """
        _check_thresholds(thresholds)
        super().__init__(keep_rows=thresholds is None, **kwargs)
        self.thresholds = thresholds
        if thresholds is not None:
            # tp[j] / fp[j]: weight of positive / negative rows with pred >= threshold j.
            self.add_state("tp", default=torch.zeros(thresholds, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("fp", default=torch.zeros(thresholds, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("num_pos", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("num_neg", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, weight: Tensor | None = None) -> None:
        """Add a batch of rows.

        Args:
            preds: Scores (probabilities or logits), shape ``[B]`` or ``[B, 1]``.
            target: Labels in ``{0, 1}``, same shape.
            weight: Optional finite non-negative sample weights, same shape. Rows of
                weight 0 are dropped.

        Raises:
            ValueError: On a bad shape, a label outside ``{0, 1}``, a NaN prediction, a
                negative / non-finite weight.
        """
        if self.thresholds is not None:
            self._update_binned(*_validate(preds, target, weight))
            return
        self.append_scored(*_validate(preds, target, weight))

    def _update_binned(self, preds: Tensor, target: Tensor, weight: Tensor | None) -> None:
        """Count one validated batch at the thresholds (binned mode)."""
        if preds.numel() == 0:
            return
        n_thr = self.tp.numel()
        preds = preds.detach().to(self.device)
        target = target.detach().to(self.device)
        preds = preds.to(torch.promote_types(preds.dtype, torch.float32))
        if not bool(((preds >= 0) & (preds <= 1)).all()):
            preds = preds.sigmoid()  # like torchmetrics: the batch holds logits
        # Same thresholds and comparison dtype as BinaryAUROC: linspace in float32, promoted.
        thr = torch.linspace(0, 1, n_thr, device=preds.device).to(preds.dtype)
        # idx = number of thresholds <= pred, so pred >= thr[j]  <=>  j < idx.
        idx = torch.searchsorted(thr, preds, right=True)
        is_pos = target == 1
        w = torch.ones_like(preds, dtype=torch.float64) if weight is None else weight.to(self.device, torch.float64)
        cnt_pos = torch.bincount(idx[is_pos], weights=w[is_pos], minlength=n_thr + 1)
        cnt_neg = torch.bincount(idx[~is_pos], weights=w[~is_pos], minlength=n_thr + 1)
        # tp[j] = rows with idx > j = reversed cumulative sum shifted by one.
        self.tp = self.tp + cnt_pos.flip(0).cumsum(0).flip(0)[1:].to(self.tp.dtype)
        self.fp = self.fp + cnt_neg.flip(0).cumsum(0).flip(0)[1:].to(self.fp.dtype)
        self.num_pos = self.num_pos + w[is_pos].sum()
        self.num_neg = self.num_neg + w[~is_pos].sum()

    def compute(self) -> Tensor:
        """AUC over every row given to :meth:`update` on every rank.

        Returns:
            A float64 scalar tensor; ``0.5`` (with a :class:`RuntimeWarning`) if the AUC is
            undefined.
        """
        if self.thresholds is not None:
            result = self._compute_binned()
        else:
            if isinstance(self.preds, list) and len(self.preds) == 0:
                result = "no rows (with positive weight) were given"
            else:
                result = _exact_auc(self.rows("preds"), self.rows("target"), self.rows("weight"))
        if isinstance(result, str):
            return torch.tensor(_degenerate(result), dtype=torch.float64, device=self.device)
        return result.to(torch.float64)

    def _compute_binned(self) -> Tensor | str:
        """Trapezoid area under the binned ROC curve, or why it is undefined."""
        num_pos = self.num_pos.to(torch.float64)
        num_neg = self.num_neg.to(torch.float64)
        if not bool(num_pos > 0) and not bool(num_neg > 0):
            return "no rows were given"
        if not bool(num_pos > 0):
            return "only negative rows (target 0) were given"
        if not bool(num_neg > 0):
            return "only positive rows (target 1) were given"
        tpr = (self.tp.to(torch.float64) / num_pos).flip(0)
        fpr = (self.fp.to(torch.float64) / num_neg).flip(0)
        return torch.trapezoid(tpr, fpr)
