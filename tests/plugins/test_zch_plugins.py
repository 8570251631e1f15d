"""Eviction policies and admission filters are plugin kinds: a third party's are picked by name,
built by the run, and checked by ``tzrun.testing.check_component``; a broken one is named."""

from __future__ import annotations

import attrs
import pytest
import torch

import tzrun
from tzrun.testing import check_component, load_config_text, registered
from tests.plugins.test_zch_config import BASE


@attrs.frozen
class HalfConfig:
    """Options of the test's ``keep_half`` filter."""

    quantile: float = 0.5


def build_half(cfg: HalfConfig):
    def admit(counts: torch.Tensor):
        threshold = torch.quantile(counts.double(), cfg.quantile)
        return counts > threshold, threshold

    return admit


@attrs.frozen
class NoOptions:
    """No options."""


def build_recent(cfg: NoOptions, admission):
    from torchrec.modules.mc_modules import LRU_EvictionPolicy

    return LRU_EvictionPolicy(decay_exponent=2.0, threshold_filtering_func=admission)


class ThirdParty:
    @tzrun.hookimpl
    def tzrun_register_eviction_policies(self, register):
        register("very_recent", config=NoOptions, build=build_recent)
        register("not_a_policy", config=NoOptions, build=lambda cfg, admission: object())

    @tzrun.hookimpl
    def tzrun_register_admission_filters(self, register):
        register("keep_half", config=HalfConfig, build=build_half)
        register("no_mask", config=NoOptions, build=lambda cfg: (lambda counts: (None, 0)))


@pytest.mark.parametrize(("kind", "name"), [("eviction_policy", "lfu"), ("eviction_policy", "lru"),
                                            ("eviction_policy", "distance_lfu"), ("admission_filter", "threshold")])
def test_the_builtins_conform(kind, name, tzrun_pm):
    check_component(kind, name, pm=tzrun_pm)


def test_a_third_partys_policy_and_filter_are_picked_by_name_and_built_by_the_run(tzrun_pm):
    from tzrun.runner.zch import swap_managed_collisions
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    with registered(tzrun_pm, ThirdParty(), "third_party"):
        check_component("eviction_policy", "very_recent", pm=tzrun_pm)
        check_component("admission_filter", "keep_half", {"quantile": 0.25}, pm=tzrun_pm)
        cfg, registries = load_config_text(BASE.format(
            zch='zch = { size = 8, eviction_policy = { type = "very_recent" }, admission = { type = "keep_half", quantile = 0.25 } }'),
            tzrun_pm)
        holder = torch.nn.Module()
        holder.bags = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
            name="user_emb", num_embeddings=8, embedding_dim=4, feature_names=["user"])], device=torch.device("meta"))
        assert swap_managed_collisions(holder, cfg, registries, world_size=1) == 1
    module = holder.bags.managed._managed_collision_collection._managed_collision_modules["user_emb"]
    policy = module._eviction_policy
    assert type(policy).__name__ == "LRU_EvictionPolicy" and policy._decay_exponent == 2.0
    mask, _ = policy._threshold_filtering_func(torch.tensor([1, 2, 3, 4]))
    assert mask.tolist() == [False, True, True, True]  # the quantile option reached the filter


def test_a_policy_and_a_filter_that_break_the_contract_are_named(tzrun_pm):
    with registered(tzrun_pm, ThirdParty(), "third_party"):
        with pytest.raises(AssertionError, match=r"eviction policy 'not_a_policy' .*third_party.*MCHEvictionPolicy"):
            check_component("eviction_policy", "not_a_policy", pm=tzrun_pm)
        with pytest.raises(AssertionError, match=r"admission filter 'no_mask' .*third_party.*bool tensor"):
            check_component("admission_filter", "no_mask", pm=tzrun_pm)
