"""Registers the first-party models."""

from __future__ import annotations

from typing import Any

import tzrun
from tzrun_plugins.models import (dbmtl, dcn, deepfm, din, dlrm, dssm, dssm_v2, mask_net, mind, mmoe, multi_tower,
                                  pepnet, ple, rocket_launching, tdm, wide_and_deep, wukong)


def _binary(cfg: object) -> tuple[str, ...]:
    return ("logits", "probs")


def _light_and_booster(cfg: object) -> tuple[str, ...]:
    return ("logits", "probs", "logits_booster", "probs_booster")


def _per_task(cfg: Any) -> tuple[str, ...]:  # any model with tasks
    return tuple(f"{kind}/{task.name}" for task in cfg.tasks for kind in ("logits", "probs"))


def _dbmtl_outputs(cfg: dbmtl.DBMTLConfig) -> tuple[str, ...]:
    two = tuple(f"class_logits/{task.name}" for task in cfg.tasks if task.num_classes == 2)
    return _per_task(cfg) + two


def _towers(cfg: object) -> tuple[str, ...]:
    return ("similarity", "sampled_similarity", "user_embedding", "item_embedding")


@tzrun.hookimpl
def tzrun_register_models(register: tzrun.RegisterModels) -> None:
    register("deepfm", config=deepfm.DeepFMConfig, build=deepfm.build_deepfm, outputs=_binary,
             description="DeepFM: wide + FM + deep MLP over id and dense features")
    register("din", config=din.DINConfig, build=din.build_din, outputs=_binary,
             description="DIN: MLP towers over pooled features, target attention of the candidate over each "
                         "behaviour sequence, final MLP")
    register("multi_tower", config=multi_tower.MultiTowerConfig, build=multi_tower.build_multi_tower, outputs=_binary,
             description="MultiTower: an MLP tower per group of features, final MLP (TorchEasyRec's multi_tower)")
    register("dlrm", config=dlrm.DLRMConfig, build=dlrm.build_dlrm, outputs=_binary,
             description="DLRM: bottom MLP, embeddings, pairwise dot interaction, top MLP")
    register("dcn_v1", config=dcn.DCNV1Config, build=dcn.build_dcn_v1, outputs=_binary,
             description="DCN v1: a cross network and a deep MLP side by side, final MLP")
    register("dcn_v2", config=dcn.DCNV2Config, build=dcn.build_dcn_v2, outputs=_binary,
             description="DCN v2: optional backbone MLP, low-rank cross network, optional deep MLP, final MLP")
    register("mask_net", config=mask_net.MaskNetConfig, build=mask_net.build_mask_net, outputs=_binary,
             description="MaskNet: instance-guided masks over layer-normalized inputs, MaskBlocks in parallel or "
                         "serial, top MLP")
    register("wukong", config=wukong.WuKongConfig, build=wukong.build_wukong, outputs=_binary,
             description="WuKong: a dense MLP field and the id embeddings, stacked FM and linear compression "
                         "blocks, final MLP")
    register("wide_and_deep", config=wide_and_deep.WideAndDeepConfig, build=wide_and_deep.build_wide_and_deep, outputs=_binary,
             description="Wide & Deep: a linear model over the ids plus a deep MLP")
    register("rocket_launching", config=rocket_launching.RocketLaunchingConfig,
             build=rocket_launching.build_rocket_launching, outputs=_light_and_booster,
             description="Rocket Launching: a light net and a booster net over a shared MLP, the light net "
                         "distilled from the booster (logits, hint losses); export serves the light net")
    register("tdm", config=tdm.TDMConfig, build=tdm.build_tdm, outputs=_binary,
             description="TDM's ranking network: multi-window attention of the tree node over the behaviour "
                         "sequence, final MLP (the tree: tzrec-run tdm-tree)")
    register("mmoe", config=mmoe.MMoEConfig, build=mmoe.build_mmoe, outputs=_per_task,
             description="MMoE: shared experts, per-task gates and towers (logits/<task>, probs/<task>)")
    register("ple", config=ple.PLEConfig, build=ple.build_ple, outputs=_per_task,
             description="PLE: levels of task and shared experts with gates (CGC), per-task towers "
                         "(logits/<task>, probs/<task>)")
    register("dbmtl", config=dbmtl.DBMTLConfig, build=dbmtl.build_dbmtl, outputs=_dbmtl_outputs,
             description="DBMTL: bottom MLP, optional MMoE, task towers and relation MLPs over the towers "
                         "each task depends on (logits/<task>, probs/<task>; class_logits/<task> with num_classes = 2)")
    register("pepnet", config=pepnet.PEPNetConfig, build=pepnet.build_pepnet, outputs=_per_task,
             description="PEPNet: EPNet's gate over the shared input from domain features, per-task PPNet layers "
                         "gated by user/item features, task towers (logits/<task>, probs/<task>)")
    register("dssm", config=dssm.DSSMConfig, build=dssm.build_dssm, outputs=_towers,
             description="DSSM two-tower retrieval: user and item towers, in-batch [B, B] and sampled "
                         "[B, 1 + N] similarities with temperature")
    register("dssm_v2", config=dssm_v2.DSSMV2Config, build=dssm_v2.build_dssm_v2, outputs=_towers,
             description="DSSM-v2 two-tower retrieval: dssm with one embedding lookup read by both towers, a "
                         "feature allowed in both (TorchEasyRec's dssm_v2)")
    register("mind", config=mind.MINDConfig, build=mind.build_mind, outputs=mind.mind_outputs,
             description="MIND multi-interest retrieval: capsule interests of the behaviour sequence by dynamic "
                         "routing, label-aware attention, item tower; DSSM's similarities")
