"""The built-in admission filter of collision-free ids: ``threshold``, an id enters the table
only once it was looked up at least ``min_count`` times between two evictions (TorchEasyRec
wrote such a filter as a Python lambda string that it evaluated; here it is a named component
with checked options)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import attrs

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["ThresholdConfig", "build_threshold"]


@attrs.frozen
class ThresholdConfig:
    """Options of ``threshold``.

    Attributes:
        min_count: the lookups an id needs between two evictions to be admitted (1 admits
            every id, as no filter does).
    """

    min_count: int = attrs.field(default=2, validator=attrs.validators.ge(1))


def build_threshold(cfg: ThresholdConfig) -> Callable[["Tensor"], tuple["Tensor", float]]:
    """The filter: ``counts -> (counts >= min_count, min_count - 1)`` (TorchRec filters out
    the ids whose count is at most the threshold it returns)."""
    minimum = cfg.min_count

    def admit(counts: "Tensor") -> tuple["Tensor", float]:
        return counts >= minimum, float(minimum - 1)

    return admit
