"""The eviction policies of collision-free ids: TorchRec's ``LFU_EvictionPolicy``,
``LRU_EvictionPolicy`` and ``DistanceLFU_EvictionPolicy``, with their options.

At an eviction the ids of the table and those seen since the last eviction are ranked by the
policy's score; the top ``size - 1`` per slice keep (or get) a row. ``lfu`` scores by the count
of lookups, ``lru`` by ``1 / (steps since the last lookup) ** decay_exponent``, and
``distance_lfu`` by ``count / (steps since the last lookup) ** decay_exponent``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import attrs

__all__ = ["LFUConfig", "DecayConfig", "build_lfu", "build_lru", "build_distance_lfu"]


@attrs.frozen
class LFUConfig:
    """Options of ``lfu`` (none): an id's score is how often it was looked up."""


@attrs.frozen
class DecayConfig:
    """Options of ``lru`` and ``distance_lfu``.

    Attributes:
        decay_exponent: how fast an id's score falls with the steps since its last lookup.
    """

    decay_exponent: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))


Admission = Optional[Callable[..., Any]]


def build_lfu(cfg: LFUConfig, admission: Admission) -> Any:
    """TorchRec's ``LFU_EvictionPolicy`` filtering new ids with ``admission``."""
    from torchrec.modules.mc_modules import LFU_EvictionPolicy

    return LFU_EvictionPolicy(threshold_filtering_func=admission)


def build_lru(cfg: DecayConfig, admission: Admission) -> Any:
    """TorchRec's ``LRU_EvictionPolicy`` filtering new ids with ``admission``."""
    from torchrec.modules.mc_modules import LRU_EvictionPolicy

    return LRU_EvictionPolicy(decay_exponent=cfg.decay_exponent, threshold_filtering_func=admission)


def build_distance_lfu(cfg: DecayConfig, admission: Admission) -> Any:
    """TorchRec's ``DistanceLFU_EvictionPolicy`` filtering new ids with ``admission``."""
    from torchrec.modules.mc_modules import DistanceLFU_EvictionPolicy

    return DistanceLFU_EvictionPolicy(decay_exponent=cfg.decay_exponent, threshold_filtering_func=admission)
