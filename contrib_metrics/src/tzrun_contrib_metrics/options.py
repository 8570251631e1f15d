"""TOML options of the metrics (attrs classes, free of torch so plugin loading stays fast)."""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ["NDCGConfig", "AveragePrecisionConfig", "COPCConfig"]


@attrs.frozen
class NDCGConfig:
    """Options of ``ndcg_at_k`` (it needs ``group_by``: the query or user column).

    Attributes:
        k: the cut-off: the first ``k`` positions of each group's ranking count.
        gain: a row's gain from its label ``y``: ``"linear"`` (``y``, sklearn's
            ``ndcg_score``) or ``"exponential"`` (``2^y - 1``); the same for 0/1 labels.
        empty_groups: what a group without any gain (no positive label) counts as:
            ``"skip"`` (left out of the average), ``"zero"`` or ``"one"``.
    """

    k: int = attrs.field(validator=attrs.validators.ge(1))
    gain: Literal["linear", "exponential"] = "linear"
    empty_groups: Literal["skip", "zero", "one"] = "skip"


@attrs.frozen
class AveragePrecisionConfig:
    """``average_precision`` has no options."""


@attrs.frozen
class COPCConfig:
    """``copc`` has no options; ``group_by`` (optional) chooses between the pooled value and
    the average over groups."""
