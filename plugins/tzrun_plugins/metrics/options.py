"""TOML options of the first-party metrics (kept free of torch so plugin loading stays fast)."""

from __future__ import annotations

import attrs

__all__ = ["AUCConfig"]


def _check_thresholds(thresholds: object) -> None:
    """Raise ``ValueError`` unless ``thresholds`` is ``None`` or an int >= 2."""
    if thresholds is None:
        return
    if isinstance(thresholds, bool) or not isinstance(thresholds, int) or thresholds < 2:
        raise ValueError(f"auc: thresholds must be None (exact AUC) or an integer >= 2, got {thresholds!r}")


def _validate_thresholds_field(_instance: object, _attribute: attrs.Attribute, value: object) -> None:
    """attrs validator for :attr:`AUCConfig.thresholds`."""
    _check_thresholds(value)


@attrs.frozen
class AUCConfig:
    """TOML options of the metric ``auc``."""

    thresholds: int | None = attrs.field(default=None, validator=_validate_thresholds_field)
    """``None`` (default): the exact ROC AUC over all rows. An integer ``N >= 2``: the binned
    approximation of ``torchmetrics.classification.BinaryAUROC(thresholds=N)`` (constant memory;
    sample weights weight the counts)."""
