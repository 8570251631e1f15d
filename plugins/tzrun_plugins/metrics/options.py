"""TOML options of the first-party metrics (kept free of torch so plugin loading stays fast)."""

from __future__ import annotations

from typing import Any, Literal

import attrs

__all__ = [
    "AUCConfig",
    "AccuracyConfig",
    "GroupedAUCConfig",
    "GroupedXAUCConfig",
    "LogLossConfig",
    "NoOptionsConfig",
    "RelativeL1Config",
    "TopKConfig",
    "XAUCConfig",
    "TIE_RULES",
]

TIE_RULES = ("drop", "wrong")
#: how XAUC scores a pair with equal targets or predictions (:attr:`XAUCConfig.ties`)
TieRule = Literal["drop", "wrong"]
XAUCMode = Literal["exact", "sampled", "in_batch"]
XAUCAveraging = Literal["pooled", "per_batch"]
"""The values of the XAUC metrics' ``ties`` option."""


def _check_thresholds(thresholds: object) -> None:
    """Raise ``ValueError`` unless ``thresholds`` is ``None`` or an int >= 2."""
    if thresholds is None:
        return
    if isinstance(thresholds, bool) or not isinstance(thresholds, int) or thresholds < 2:
        raise ValueError(f"auc: thresholds must be None (exact AUC) or an integer >= 2, got {thresholds!r}")


def _validate_thresholds_field(_instance: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator for :attr:`AUCConfig.thresholds`."""
    _check_thresholds(value)


@attrs.frozen
class AUCConfig:
    """TOML options of the metric ``auc``."""

    thresholds: int | None = attrs.field(default=None, validator=_validate_thresholds_field)
    """``None`` (default): the exact ROC AUC over all rows. An integer ``N >= 2``: the binned
    approximation of ``torchmetrics.classification.BinaryAUROC(thresholds=N)`` (constant memory;
    sample weights weight the counts)."""

    @property
    def default_name(self) -> str | None:
        """The result name when the table sets no ``name``: the binned variant is labelled
        ``auc_binned<N>`` so that it is never mistaken for the exact AUC."""
        return None if self.thresholds is None else f"auc_binned{self.thresholds}"


def _positive_int(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an integer >= 1, got {value!r}")


def _non_negative_int(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be an integer >= 0, got {value!r}")


def _open_half(_instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0.0 < value < 0.5:
        raise ValueError(f"{attribute.name} must be in (0, 0.5), got {value!r}")


@attrs.frozen
class NoOptionsConfig:
    """TOML options of a metric that has none (``calibration``, ``mae``, ``mse``, ``rmse``)."""


@attrs.frozen
class GroupedAUCConfig:
    """TOML options of the metric ``grouped_auc``."""

    weight_by_size: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    """``false`` (default): the plain mean of the groups' AUCs. ``true``: each group's AUC
    weighted by its number of rows (of positive weight)."""


@attrs.frozen
class XAUCConfig:
    """TOML options of the metric ``xauc``."""

    mode: Literal["exact", "sampled", "in_batch"] = attrs.field(
        default="exact", validator=attrs.validators.in_(("exact", "sampled", "in_batch"))
    )
    """``"exact"`` (default): every pair of rows of all ranks, O(n log n). ``"sampled"``:
    ``num_samples`` random pairs drawn at ``compute`` from all ranks' rows. ``"in_batch"``:
    only pairs inside one ``update`` batch, pooled over batches."""
    num_samples: int = attrs.field(default=1_000_000, validator=_positive_int)
    """``"sampled"`` mode: number of pairs drawn (pairs with equal targets are then dropped)."""
    seed: int = attrs.field(default=0, validator=_non_negative_int)
    """``"sampled"`` mode: seed of the pair sampler; the same rows give the same value."""
    ties: Literal["drop", "wrong"] = attrs.field(default="drop", validator=attrs.validators.in_(TIE_RULES))
    """``"drop"`` (default): pairs with equal targets are left out; a pair with equal
    predictions counts 1/2 (so XAUC equals the AUC on 0/1 targets). ``"wrong"``:
    TorchEasyRec's rule: every pair of rows counts in the denominator and scores 1 only when
    predictions and targets order it strictly the same way (equal targets or equal
    predictions score 0)."""
    averaging: Literal["pooled", "per_batch"] = attrs.field(
        default="pooled", validator=attrs.validators.in_(("pooled", "per_batch"))
    )
    """``"in_batch"`` mode only. ``"pooled"`` (default): the pairs of all batches pooled,
    ``sum_b num_b / sum_b den_b``. ``"per_batch"``: TorchEasyRec's mean of the batches' XAUCs
    (batches without a counted pair are skipped)."""

    def __attrs_post_init__(self) -> None:
        if self.averaging != "pooled" and self.mode != "in_batch":
            raise ValueError(
                f'averaging = "{self.averaging}" applies to mode = "in_batch" only (mode is "{self.mode}")',
                attrs.fields(type(self)).averaging,
            )


@attrs.frozen
class GroupedXAUCConfig:
    """TOML options of the metric ``grouped_xauc``."""

    weight_by_size: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    """``true`` (default): each group's XAUC weighted by its number of rows (of positive
    weight). ``false``: the plain mean over groups."""
    ties: Literal["drop", "wrong"] = attrs.field(default="drop", validator=attrs.validators.in_(TIE_RULES))
    """As ``xauc``'s ``ties``: ``"drop"`` (default) leaves pairs with equal targets out and
    counts equal predictions 1/2; ``"wrong"`` is TorchEasyRec's rule (every pair of the group
    in the denominator, ties score 0; a group is valid with two rows)."""


@attrs.frozen
class LogLossConfig:
    """TOML options of the metrics ``log_loss`` and ``normalized_entropy``."""

    eps: float = attrs.field(default=1e-12, validator=_open_half)
    """Probabilities are clamped to ``[eps, 1 - eps]`` (in float64) before the logarithm."""


def _non_negative_finite(_instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (0.0 <= value < float("inf")):
        raise ValueError(f"{attribute.name} must be finite and >= 0, got {value!r}")


@attrs.frozen
class RelativeL1Config:
    """TOML options of the metric ``relative_l1``."""

    eps: float = attrs.field(default=1e-4, validator=_non_negative_finite)
    """Added to the denominator ``max(|t|, |p|)`` (TorchEasyRec's ``epsilon``, 1e-4)."""


@attrs.frozen
class AccuracyConfig:
    """TOML options of the metric ``accuracy``."""

    threshold: float = attrs.field(default=0.5, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    """The probability a row is compared with (see ``compare``)."""
    compare: Literal[">", ">="] = attrs.field(default=">", validator=attrs.validators.in_((">", ">=")))
    """``">"`` (default, the rule of torchmetrics, which TorchEasyRec uses): a row is predicted
    positive when ``p > threshold``. ``">="``: when ``p >= threshold`` (tzrec-run's rule up
    to 0.1.0)."""


@attrs.frozen
class TopKConfig:
    """TOML options of the metrics ``recall_at_k`` and ``hit_rate_at_k``."""

    k: int = attrs.field(default=10, validator=_positive_int)
    """Number of top-scored candidates that count as retrieved."""
    in_batch: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    """``true``: the score matrix is ``[B, B]`` and row ``i``'s positive is column ``i`` (the
    other rows' items are its negatives; padding rows' columns are no candidates). ``false``:
    the label gives each row's positive column (or a ``[B, C]`` relevance matrix)."""
    sampled: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    """``true``: the score matrix is ``[B, 1 + N]`` with each row's positive in column 0 and
    the ``N`` items ``[data.sampler]`` drew as its negatives (set ``prediction =
    "sampled_similarity"``); the label is not used. Not with ``in_batch``."""

    def __attrs_post_init__(self) -> None:
        if self.in_batch and self.sampled:
            raise ValueError("set in_batch or sampled, not both")
