"""Registers the first-party eviction policies and admission filters of collision-free ids."""

from __future__ import annotations

import tzrun
from tzrun_plugins.zch import admission, policies


@tzrun.hookimpl
def tzrun_register_eviction_policies(register: tzrun.Register) -> None:
    register("lfu", config=policies.LFUConfig, build=policies.build_lfu,
             description="keep the most looked-up ids (TorchRec's LFU_EvictionPolicy)")
    register("lru", config=policies.DecayConfig, build=policies.build_lru,
             description="keep the most recently looked-up ids (TorchRec's LRU_EvictionPolicy)")
    register("distance_lfu", config=policies.DecayConfig, build=policies.build_distance_lfu,
             description="lookups discounted by the steps since the last one (TorchRec's DistanceLFU_EvictionPolicy)")


@tzrun.hookimpl
def tzrun_register_admission_filters(register: tzrun.Register) -> None:
    register("threshold", config=admission.ThresholdConfig, build=admission.build_threshold,
             description="admit an id seen at least min_count times between two evictions")
