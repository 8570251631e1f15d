"""The model of ``model_config``: ``[model]`` for ``deepfm``, ``wide_and_deep``, ``dlrm``, ``dcn_v1``, ``dcn_v2``, ``mask_net``,
``wukong``, ``mmoe``, ``ple``, ``dbmtl``, ``pepnet``, ``dssm``, ``dssm_v2``, ``mind``, ``multi_tower``,
``multi_tower_din`` (``din``), ``rocket_launching`` and ``tdm``, and which of the converted features it reads.

TorchEasyRec's MLP messages become lists of layer widths (tzrec-run's MLPs are ``Linear -> ReLU``
layers; dropout, other activations and normalization are reported). TorchEasyRec's models read
their feature groups; tzrec-run's read every feature (DSSM: the features each tower names; pepnet's
gates: the features each gate names), so a group that leaves a feature out of a part is noted, and a
feature in no group is not converted.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from tzrun_tools.convert.evaluation import TWO_CLASS_TASKS
from tzrun_tools.convert.features import FeatureSet
from tzrun_tools.convert.groups import Groups, attention_mlp
from tzrun_tools.convert.nodes import Finding, Node

__all__ = ["ConvertedModel", "convert_architecture"]

_F = "float"
#: Fields of a task tower that :mod:`tzrun_tools.convert.evaluation` converts (or reports).
_TOWER_OUTPUTS = ("tower_name", "label_name", "weight", "num_class", "metrics", "losses", "train_metrics",
                  "sample_weight_name", "task_space_indicator_label", "in_task_space_weight",
                  "out_task_space_weight", "pareto_min_loss_weight")


class ConvertedModel(NamedTuple):
    """The ``[model]`` table and the tzrec-run features it reads."""

    table: dict[str, Any]
    features: set[str]


def _mlp(node: Node, name: str, bias: bool = False) -> Optional[list[int]]:
    """The layer widths of the MLP message ``name`` of ``node`` (``None`` when it is unset). ``bias``: the model
    has an option of its own for the MLP's biases (the caller reads it), so ``bias: false`` is not reported."""
    mlp = node.child(name)
    if mlp is None:
        return None
    units = mlp.values("hidden_units", "int")
    if any(mlp.values("dropout_ratio", _F)):
        mlp.skip("dropout_ratio", "dropout has no equivalent in tzrec-run's MLPs")
    if mlp.value("activation", "str", "nn.ReLU") != "nn.ReLU":
        mlp.skip("activation", "tzrec-run's MLPs use ReLU")
    for flag, reason in (("use_bn", "batch normalization"), ("use_ln", "layer normalization")):
        if mlp.value(flag, "bool", False):
            mlp.skip(flag, f"{reason} has no equivalent in tzrec-run's MLPs")
    if mlp.value("bias", "bool", True) is False and not bias:
        mlp.skip("bias", "tzrec-run's MLP layers always have a bias")
    mlp.rest()
    return units


def _names(groups: Groups, feats: FeatureSet, group: Optional[str] = None) -> list[str]:
    """The tzrec-run features of ``group`` (of every group when ``None``), in order."""
    return list(dict.fromkeys(n for f in groups.features(group) for n in feats.names.get(f, ())))


def _parts(node: Node, groups: Groups, feats: FeatureSet, parts: dict[str, tuple[str, str]]) -> None:
    """Note each part whose TorchEasyRec group reads fewer features than tzrec-run's part does.

    ``parts``: part -> (TorchEasyRec group name, ``"id"`` or ``"dense"`` or ``"all"`` features here).
    """
    used = set(_names(groups, feats))
    sparse = [f["name"] for f in feats.sparse if f["name"] in used]
    dense = [f["name"] for f in feats.dense if f["name"] in used]
    for part, (group, kind) in parts.items():
        here = {"id": sparse, "dense": dense, "all": dense + sparse}[kind]
        added = [n for n in here if n not in set(_names(groups, feats, group))]
        if added:
            what = {"id": "id feature", "dense": "dense feature", "all": "feature"}[kind]
            node.findings.notes.append(Finding(node.path.rsplit(".", 1)[0] + ".feature_groups", (
                f"the {part} reads every {what} here, also {', '.join(added)} (not in group '{group}')")))


def _deepfm(model: Node, groups: Groups, feats: FeatureSet, wide: bool) -> dict[str, Any]:
    table: dict[str, Any] = {"type": "deepfm" if not wide else "wide_and_deep",
                             "deep_hidden_units": _mlp(model, "deep") or []}
    final = _mlp(model, "final")
    if not wide:
        table["final_hidden_units"] = final or []
    elif final is not None:
        model.skip("final", "wide_and_deep has no final MLP here: the wide logit is added to the deep one")
    dim = model.value("wide_embedding_dim", "int")
    if dim is not None:
        table["wide_embedding_dim"] = dim
    model.skip("wide_init_fn", "embeddings are initialized by TorchRec's default here")
    fm = "fm" if "fm" in groups.groups else "deep"
    parts = {"wide part": ("wide", "id"), "deep part": ("deep", "all")}
    if not wide:
        parts["FM part"] = (fm, "id")
    _parts(model, groups, feats, parts)
    return table


def _wide_and_deep(model: Node, groups: Groups, feats: FeatureSet) -> dict[str, Any]:
    return _deepfm(model, groups, feats, wide=True)


def _dlrm(model: Node, groups: Groups, feats: FeatureSet) -> dict[str, Any]:
    table: dict[str, Any] = {"type": "dlrm"}
    dense = _mlp(model, "dense_mlp")
    if dense:
        table["dense_hidden_units"] = dense
    else:
        model.findings.not_converted.append(Finding(model.at("dense_mlp"), (
            "unset or empty: tzrec-run's dlrm needs dense features and a bottom MLP (default [64, 16]; its last "
            "width must be the embedding_dim)")))
    table["top_hidden_units"] = _mlp(model, "final") or []
    table["arch_with_sparse"] = model.value("arch_with_sparse", "bool", True)
    _parts(model, groups, feats, {"bottom MLP": ("dense", "dense"), "interaction": ("sparse", "id")})
    return table


def _mmoe(model: Node, groups: Groups, feats: FeatureSet) -> dict[str, Any]:
    table: dict[str, Any] = {"type": "mmoe", "num_experts": model.value("num_expert", "int", 3),
                             "expert_hidden_units": _mlp(model, "expert_mlp") or []}
    gate = _mlp(model, "gate_mlp")
    if gate:
        table["gate_hidden_units"] = gate
    table["tasks"] = _tasks(model, "mmoe")
    return _every_feature(model, groups, feats, table, "experts")


def _every_feature(model: Node, groups: Groups, feats: FeatureSet, table: dict[str, Any], part: str) -> dict[str, Any]:
    """``table`` of a model whose ``part`` reads every feature and sequence group (TorchEasyRec's: its
    first group): a group that leaves some out is noted, and the sequence groups' encoders are added."""
    _parts(model, groups, feats, {part: (next(iter(groups.groups), ""), "all")})
    encoders = _encoders(groups, feats, _names(groups, feats))
    if encoders:
        table["sequence_encoders"] = encoders
    return table


def _tasks(model: Node, name: str,
           more: Optional[Callable[[Node, dict[str, Any]], None]] = None) -> list[dict[str, Any]]:
    """``[[model.tasks]]``: one per ``task_towers`` entry (``name`` = ``tower_name``, ``hidden_units`` = its
    ``mlp``, and what ``more`` adds; its losses and metrics are converted by
    :mod:`tzrun_tools.convert.evaluation`)."""
    tasks = []
    for i, tower in enumerate(model.indexed_children("task_towers")):
        tower.used.update(_TOWER_OUTPUTS)
        num_class = tower.value("num_class", "int", 1)
        if num_class != 1 and not (num_class == 2 and name in TWO_CLASS_TASKS):
            tower.skip("num_class", f"tzrec-run's {name} outputs one logit per task"
                       + (" (or two, num_classes = 2)" if name in TWO_CLASS_TASKS else ""))
        units = _mlp(tower, "mlp")
        tasks.append({"name": tower.value("tower_name", "str") or f"task_{i}", "hidden_units": units or []})
        if num_class == 2 and name in TWO_CLASS_TASKS:
            tasks[-1]["num_classes"] = 2
            tower.note("num_class", f"2: two logits, class_logits/{tasks[-1]['name']}, which jrc and "
                                    f"softmax_cross_entropy read; probs/{tasks[-1]['name']}, which the metrics read, "
                                    "is TorchEasyRec's probs1 (the softmax's class 1)")
        if more is not None:
            more(tower, tasks[-1])
        tower.rest()
    return tasks


def _ple(model: Node, groups: Groups, feats: FeatureSet) -> Optional[dict[str, Any]]:
    """``ple``: extraction networks (CGC levels) of task and shared experts, task towers."""
    levels = []
    for level in model.indexed_children("extraction_networks"):
        level.used.add("network_name")  # a label only: the levels are numbered by their order here
        out: dict[str, Any] = {"num_task_experts": level.value("expert_num_per_task", "int", 1),
                               "task_expert_hidden_units": _mlp(level, "task_expert_net") or []}
        shared = level.value("share_num", "int", 0)
        if shared:
            out["num_shared_experts"] = shared
            units = _mlp(level, "share_expert_net")
            if units:
                out["shared_expert_hidden_units"] = units
        elif level.has("share_expert_net"):
            level.skip("share_expert_net", "share_num is 0: there is no shared expert")
        level.rest()
        levels.append(out)
    if not levels:
        model.findings.not_converted.append(Finding(model.at("extraction_networks"), (
            "no extraction network, so the model is not converted")))
        return None
    table: dict[str, Any] = {"type": "ple", "extraction_networks": levels, "tasks": _tasks(model, "ple")}
    return _every_feature(model, groups, feats, table, "extraction networks")


def _dcn(model: Node, groups: Groups, feats: FeatureSet, version: int) -> dict[str, Any]:
    """``dcn_v1`` (cross, deep, final) and ``dcn_v2`` (backbone, low-rank cross, deep, final)."""
    table: dict[str, Any] = {"type": f"dcn_v{version}"}
    if version == 2:
        backbone = _mlp(model, "backbone")
        if backbone:
            table["backbone_hidden_units"] = backbone
    cross = model.child("cross") or Node({}, model.at("cross"), model.findings)
    table["cross_num"] = cross.value("cross_num", "int", 3)
    if version == 2:
        table["low_rank"] = cross.value("low_rank", "int", 32)
    cross.rest()
    table["deep_hidden_units"] = _mlp(model, "deep") or []
    table["final_hidden_units"] = _mlp(model, "final") or []
    first = next(iter(groups.groups), "")
    _parts(model, groups, feats, {"cross network": (first, "all")})
    return table


def _mask_net(model: Node, groups: Groups, feats: FeatureSet) -> dict[str, Any]:
    """``mask_net { mask_net_module { n_mask_blocks mask_block use_parallel top_mlp } }``."""
    module = model.child("mask_net_module") or Node({}, model.at("mask_net_module"), model.findings)
    block = module.child("mask_block") or Node({}, module.at("mask_block"), model.findings)
    table: dict[str, Any] = {"type": "mask_net"}
    for owner, key in ((module, "n_mask_blocks"), (block, "hidden_dim")):
        value = owner.value(key, "int")
        if value is not None:
            table[key] = value
    ratio = block.value("reduction_ratio", _F, 1.0)
    aggregation = block.value("aggregation_dim", "int")
    if ratio:
        table["reduction_ratio"] = ratio
        if aggregation:
            block.skip("aggregation_dim", f"{aggregation}: TorchEasyRec uses reduction_ratio ({ratio:g}, its default "
                                          "1.0 when unset) whenever it is not 0; so does the converted config")
    elif aggregation:
        table["aggregation_dim"] = aggregation
    table["use_parallel"] = module.value("use_parallel", "bool", True)
    table["top_hidden_units"] = _mlp(module, "top_mlp") or []
    block.rest()
    module.rest()
    first = next(iter(groups.groups), "")
    _parts(model, groups, feats, {"mask blocks": (first, "all")})
    return table


def _wukong(model: Node, groups: Groups, feats: FeatureSet) -> dict[str, Any]:
    """``wukong { dense_mlp wukong_layers final }``; a dense MLP that TorchEasyRec would refuse (its last width is
    not the embedding width) gets one more layer, to that width."""
    table: dict[str, Any] = {"type": "wukong"}
    used = set(_names(groups, feats))
    dims = sorted({f["embedding_dim"] for f in feats.sparse if f["name"] in used})
    dense = _mlp(model, "dense_mlp")
    if any(f["name"] in used for f in feats.dense) and len(dims) == 1:
        dim = dims[0]
        if not dense:
            model.findings.notes.append(Finding(model.at("dense_mlp"), (
                f"unset or empty, which TorchEasyRec's wukong refuses beside dense features: written [{dim}] (one "
                "layer to the id features' embedding_dim: its output is a field)")))
            dense = [dim]
        elif dense[-1] != dim:
            model.findings.notes.append(Finding(model.at("dense_mlp"), (
                f"{dense} ends at {dense[-1]}, not at the id features' embedding_dim {dim}, which TorchEasyRec refuses "
                f"('dense mlp last hidden_unit must be the same sparse feature dim'): written {dense + [dim]}")))
            dense = dense + [dim]
    if dense:
        table["dense_hidden_units"] = dense
    layers = []
    for layer in model.indexed_children("wukong_layers"):
        out: dict[str, Any] = {}
        layer.copy(out, {"lcb_feature_num": ("lcb_feature_num", "int"), "fmb_feature_num": ("fmb_feature_num", "int")})
        out["compressed_feature_num"] = layer.value("compressed_feature_num", "int", 16)
        out["feature_num_hidden_units"] = _mlp(layer, "feature_num_mlp") or []
        layer.rest()
        layers.append(out)
    table["wukong_layers"] = layers
    table["final_hidden_units"] = _mlp(model, "final") or []
    sparse = next(iter(groups.groups)) if len(groups.groups) == 1 else "sparse"
    _parts(model, groups, feats, {"dense MLP": ("dense", "dense"), "WuKong layers": (sparse, "id")})
    return table


def _relations(tower: Node, task: dict[str, Any]) -> None:
    """A ``BayesTaskTower``'s ``relation_tower_names`` and ``relation_mlp``."""
    names = tower.values("relation_tower_names", "str")
    units = _mlp(tower, "relation_mlp")
    if units is None:
        if names:
            tower.skip("relation_tower_names", "TorchEasyRec reads them only with a relation_mlp, which is unset")
        return
    if names:
        task["relation_tasks"] = names
    task["relation_hidden_units"] = units


def _dbmtl(model: Node, groups: Groups, feats: FeatureSet) -> Optional[dict[str, Any]]:
    """``dbmtl``: bottom MLP, optional MMoE, task towers with relation MLPs."""
    if model.has("mask_net"):
        model.skip("mask_net", "a MaskNet bottom has no equivalent in tzrec-run's dbmtl, so the model is not converted")
        return None
    table: dict[str, Any] = {"type": "dbmtl"}
    bottom = _mlp(model, "bottom_mlp")
    if bottom:
        table["bottom_hidden_units"] = bottom
    experts = _mlp(model, "expert_mlp")
    if experts:
        table["expert_hidden_units"] = experts
        table["num_experts"] = model.value("num_expert", "int", 3)
        gate = _mlp(model, "gate_mlp")
        if gate:
            table["gate_hidden_units"] = gate
    else:
        for name in ("num_expert", "gate_mlp"):
            model.skip(name, "used only with expert_mlp (the MMoE), which is unset")
    table["tasks"] = _tasks(model, "dbmtl", _relations)
    return _every_feature(model, groups, feats, table, "bottom")


def _pepnet(model: Node, groups: Groups, feats: FeatureSet) -> Optional[dict[str, Any]]:
    """``pepnet``: TorchEasyRec's groups named ``all`` (the shared input), ``domain`` (EPNet's gate) and ``uia``
    (PPNet's gates) become every feature, ``domain_features`` and ``uia_features``; its per-domain towers
    (``domain_input_name``, ``task_domain_num``) are reported."""
    main, domain, uia = "all", "domain", "uia"
    if main not in groups.groups:
        model.findings.not_converted.append(Finding(model.path, (
            f"TorchEasyRec's pepnet reads the feature group named '{main}' as its shared input, and there is none "
            f"(groups: {', '.join(groups.groups) or 'none'}), so the model is not converted")))
        return None
    table: dict[str, Any] = {"type": "pepnet"}

    def gate_features(group: str, gate: str, fields: tuple[str, ...]) -> list[str]:
        """The converted features of ``group``; without any, ``fields`` are reported."""
        names = _names(groups, feats, group)
        if not names:
            why = (f"there is no group named '{group}'" if group not in groups.groups
                   else f"group '{group}' has no converted feature")
            for name in fields:
                model.skip(name, f"TorchEasyRec builds {gate} only with a feature group named '{group}', and {why}")
        return names

    domain_features = gate_features(domain, "EPNet", ("epnet_hidden_unit", "epnet_gamma"))
    if domain_features:
        table["domain_features"] = domain_features
        model.copy(table, {"epnet_hidden_unit": ("epnet_hidden_unit", "int"), "epnet_gamma": ("epnet_gamma", _F)})
    uia_features = gate_features(uia, "PPNet", ("ppnet_hidden_units", "ppnet_activation", "ppnet_dropout_ratio",
                                                "ppnet_gamma"))
    if uia_features:
        units = model.values("ppnet_hidden_units", "int")
        if not units:
            model.findings.not_converted.append(Finding(model.at("ppnet_hidden_units"), (
                f"unset or empty beside a group named '{uia}': TorchEasyRec's PPNet fails without layers, so the model "
                "is not converted")))
            return None
        table["uia_features"] = uia_features
        table["ppnet_hidden_units"] = units
        model.copy(table, {"ppnet_gamma": ("ppnet_gamma", _F)})
        if model.value("ppnet_activation", "str", "nn.ReLU") != "nn.ReLU":
            model.skip("ppnet_activation", "tzrec-run's PPNet layers use ReLU")
        if any(model.values("ppnet_dropout_ratio", _F)):
            model.skip("ppnet_dropout_ratio", "dropout has no equivalent in tzrec-run's PPNet layers")
    if model.has("domain_input_name"):
        model.skip("domain_input_name", (
            "per-domain towers (task_domain_num copies of each task tower, the loss and metrics reading the copy of "
            "each row's domain) have no equivalent here: one tower per task, trained on every row (the domain's label "
            "column stays in data.labels, read by no loss)"))
    model.skip("task_domain_num", "used only with domain_input_name, whose per-domain towers are not converted")
    table["tasks"] = _tasks(model, "pepnet")
    _parts(model, groups, feats, {"shared input": (main, "all")})
    encoders = _encoders(groups, feats, _names(groups, feats))
    if encoders:
        table["sequence_encoders"] = encoders
    return table


_SIMILARITY = {"COSINE": "cosine", "EUCLID": "euclid", "INNER_PRODUCT": "euclid"}


def _rocket_launching(model: Node, groups: Groups, feats: FeatureSet) -> dict[str, Any]:
    """``rocket_launching { share_mlp booster_mlp light_mlp feature_based_distillation feature_distillation_function }``."""
    table: dict[str, Any] = {"type": "rocket_launching"}
    share = _mlp(model, "share_mlp")
    if share:
        table["share_hidden_units"] = share
    table["booster_hidden_units"] = _mlp(model, "booster_mlp") or []
    table["light_hidden_units"] = _mlp(model, "light_mlp") or []
    distill = model.value("feature_based_distillation", "bool", False)
    table["feature_based_distillation"] = distill
    function = model.value("feature_distillation_function", "str", "COSINE")
    if function not in _SIMILARITY:
        model.skip("feature_distillation_function", f"{function!r} is none of COSINE, EUCLID, INNER_PRODUCT")
    elif distill:
        table["feature_distillation_function"] = _SIMILARITY[function]
        if function == "INNER_PRODUCT":
            model.note("feature_distillation_function", "TorchEasyRec computes INNER_PRODUCT as EUCLID (the square "
                                                        "root of the summed squared distances): written \"euclid\"")
    elif model.has("feature_distillation_function"):
        model.skip("feature_distillation_function", "used only with feature_based_distillation: true")
    model.findings.notes.append(Finding(model.path, "each loss and metric is written for both nets: the light net's read logits/probs "
                                   "(what export serves), the booster's logits_booster/probs_booster; the model adds "
                                   "its hint losses itself (loss/hint_l2_loss, loss/similarity_<i>_<j>)"))
    return _every_feature(model, groups, feats, table, "shared input")


def _encoders(groups: Groups, feats: FeatureSet, names: list[str]) -> list[dict[str, Any]]:
    """The ``[[model.sequence_encoders]]`` of the sequence groups among ``names``."""
    converted = {g["name"] for g in feats.sequence}
    return [{"sequence": n, **encoder} for n in names
            if n in converted and (encoder := groups.sequences[n].encoder) is not None]


def _towers_of(model: Node, groups: Groups, feats: FeatureSet) -> list[dict[str, Any]]:
    """``towers``: one MLP tower per input group."""
    towers = []
    for tower in model.indexed_children("towers"):
        group = tower.value("input", "str", "")
        towers.append({"features": _names(groups, feats, group), "hidden_units": _mlp(tower, "mlp") or []})
        tower.rest()
    return towers


def _multi_tower(model: Node, groups: Groups, feats: FeatureSet) -> Optional[dict[str, Any]]:
    """``multi_tower``: MLP towers over groups, a final MLP."""
    towers = _towers_of(model, groups, feats)
    if not towers:
        model.findings.not_converted.append(Finding(model.at("towers"), "no towers, so the model is not converted"))
        return None
    return {"type": "multi_tower", "towers": towers, "final_hidden_units": _mlp(model, "final") or []}


def _din(model: Node, groups: Groups, feats: FeatureSet) -> Optional[dict[str, Any]]:
    """``multi_tower_din``: MLP towers over groups, a target-attention tower per SEQUENCE group."""
    table: dict[str, Any] = {"type": "din"}
    towers = _towers_of(model, groups, feats)
    attention = []
    converted = {g["name"] for g in feats.sequence}
    for tower in model.indexed_children("din_towers"):
        group = tower.value("input", "str", "")
        din: dict[str, Any] = {"sequence": group, **attention_mlp(tower)}
        tower.rest()
        if group not in converted or "query" not in next(g for g in feats.sequence if g["name"] == group):
            model.findings.not_converted.append(Finding(tower.at("input"), (
                f"group '{group}' is no sequence group with a query here (see its findings), so the model is not "
                "converted")))
            return None
        attention.append(din)
    if towers:
        table["towers"] = towers
    table["din_towers"] = attention
    table["final_hidden_units"] = _mlp(model, "final") or []
    return table


def _tdm(model: Node, groups: Groups, feats: FeatureSet) -> Optional[dict[str, Any]]:
    """``tdm``: multi-window attention over the ``SEQUENCE`` group, a final MLP over it and the other groups."""
    sequence = [g.name for g in groups.groups.values() if g.type == "SEQUENCE"]
    group = next((g for g in feats.sequence if sequence and g["name"] == sequence[0]), None)
    if group is None or "query" not in group:
        model.findings.not_converted.append(Finding(model.path, (
            "no SEQUENCE feature group with the candidate's features converts to a sequence group with a query "
            "(see its findings), so the model is not converted")))
        return None
    features = [n for g in groups.groups.values() if g.type != "SEQUENCE" for n in _names(groups, feats, g.name)]
    table: dict[str, Any] = {"type": "tdm", "history": group["name"], "features": list(dict.fromkeys(features))}
    windin = model.child("multiwindow_din")
    if windin is not None:
        table["windows_len"] = windin.values("windows_len", "int")
        table.update(_tdm_attention(windin))
        windin.rest()
    final = model.child("final")
    if final is not None:
        table["final_hidden_units"] = final.values("hidden_units", "int")
        table["final_batch_norm"] = final.value("use_bn", "bool", False)
        _unsupported(final, "tdm's final MLP")
        if final.value("activation", "str", "nn.ReLU") != "nn.ReLU":
            final.skip("activation", "tdm's final MLP uses ReLU")
        final.rest()
    return table


def _unsupported(mlp: Node, what: str, fields: tuple[str, ...] = ("dropout_ratio", "use_ln")) -> None:
    """Report the MLP options of ``fields`` that ``mlp`` sets and ``what`` has not."""
    reasons = {"dropout_ratio": "dropout", "use_bn": "batch normalization", "use_ln": "layer normalization"}
    for field in fields:
        if any(mlp.values(field, "str")) and mlp.value(field, "str") not in ("0", "0.0", "false"):
            mlp.skip(field, f"{reasons[field]} has no equivalent in {what}")


def _tdm_attention(windin: Node) -> dict[str, Any]:
    """``multiwindow_din.attn_mlp`` as ``attention_hidden_units`` and ``attention_activation``."""
    attn = windin.child("attn_mlp")
    if attn is None:
        return {}
    table: dict[str, Any] = {"attention_hidden_units": attn.values("hidden_units", "int")}
    activation = attn.value("activation", "str", "nn.ReLU").strip()
    if activation in ("nn.ReLU", "nn.PReLU"):
        table["attention_activation"] = "prelu" if activation == "nn.PReLU" else "relu"
    else:
        attn.skip("activation", f"tdm's attention MLP uses relu or prelu (nn.PReLU), not {activation}")
    _unsupported(attn, "tdm's attention MLP", ("dropout_ratio", "use_bn", "use_ln"))
    attn.rest()
    return table


def _dssm(model: Node, groups: Groups, feats: FeatureSet, v2: bool = False) -> Optional[dict[str, Any]]:
    """``dssm`` and ``dssm_v2``: each tower's group becomes its features. ``dssm_v2`` looks up one embedding group for
    both towers, as tzrec-run's towers do, so a feature in both groups stays in both; ``dssm`` keeps it in the user
    tower and reports it."""
    table: dict[str, Any] = {"type": "dssm_v2" if v2 else "dssm"}
    for side in ("user", "item"):
        tower = model.child(f"{side}_tower") or Node({}, model.at(f"{side}_tower"), model.findings)
        group = tower.value("input", "str", "")
        names = _names(groups, feats, group)
        if side == "item" and not v2:
            both = [n for n in names if n in table["user_features"]]
            if both:
                tower.skip("input", f"{', '.join(both)} also in the user tower: a feature belongs to one tower "
                                    "here (kept in the user tower); declare a copy under another name for the item tower")
                tower.used.discard("input")
                names = [n for n in names if n not in both]
        table[f"{side}_features"] = names
        table[f"{side}_hidden_units"] = _mlp(tower, "mlp") or []
        tower.rest()
        if not names:
            model.findings.not_converted.append(Finding(tower.at("input"), (
                f"group '{group}' has no converted feature, so the model is not converted")))
            return None
    shared = sorted(_tables(feats, table["user_features"]) & _tables(feats, table["item_features"]))
    if shared and not v2:
        model.note("item_tower", f"{', '.join(shared)}: looked up by features of both towers; TorchEasyRec's dssm gives "
                                 "each tower its own embedding group (two tables of that name), tzrec-run's dssm one "
                                 "(as TorchEasyRec's dssm_v2); set another table on one side to keep them apart")
    encoders = _encoders(groups, feats, table["user_features"] + table["item_features"])
    table["output_dim"] = model.value("output_dim", "int", 64)
    similarity = model.value("similarity", "str", "INNER_PRODUCT")
    if similarity not in ("COSINE", "INNER_PRODUCT"):
        model.skip("similarity", f"{similarity}: tzrec-run's {table['type']} offers cosine and inner_product; the model is "
                                 "not converted")
        return None
    table["similarity"] = similarity.lower()
    table["temperature"] = model.value("temperature", _F, 1.0)
    if not model.value("in_batch_negative", "bool", False):
        model.note("in_batch_negative", "false: TorchEasyRec scores each user against its negative sampler's "
                                        "items; here against the other items of the batch (in-batch negatives)")
    if encoders:
        table["sequence_encoders"] = encoders
    return table


def _mind(model: Node, groups: Groups, feats: FeatureSet) -> Optional[dict[str, Any]]:
    """``mind``: the user tower's group, its history group (a ``[[features.sequence]]`` group here), the item tower's
    group, each MLP's widths, the capsule options and the similarity."""
    table: dict[str, Any] = {"type": "mind"}
    user = model.child("user_tower") or Node({}, model.at("user_tower"), model.findings)
    item = model.child("item_tower") or Node({}, model.at("item_tower"), model.findings)
    table["user_features"] = _names(groups, feats, user.value("input", "str", ""))
    history = user.value("history_input", "str", "")
    if history not in {g["name"] for g in feats.sequence}:
        model.findings.not_converted.append(Finding(user.at("history_input"), (
            f"'{history}' is no SEQUENCE group with converted features, so the model is not converted")))
        return None
    table["history"] = history
    table["item_features"] = _names(groups, feats, item.value("input", "str", ""))
    for side, names in (("user", table["user_features"]), ("item", table["item_features"])):
        if not names:
            node = user if side == "user" else item
            model.findings.not_converted.append(Finding(node.at("input"), (
                f"group '{node.value('input', 'str', '')}' has no converted feature, so the model is not converted")))
            return None
    table["user_hidden_units"] = _mlp(user, "user_mlp") or []
    # TorchEasyRec's hist_seq_mlp has no biases, whatever its bias says; tzrec-run's history MLP neither
    table["history_hidden_units"] = _mlp(user, "hist_seq_mlp", bias=True) or []
    concat = user.child("concat_mlp")
    table["concat_bias"] = concat.value("bias", "bool", True) if concat is not None else True
    table["concat_hidden_units"] = _mlp(user, "concat_mlp", bias=True) or []
    user.skip("user_seq_combine", "TorchEasyRec's MIND does not read it")
    _capsule(user, table)
    user.rest()
    table["item_hidden_units"] = _mlp(item, "mlp") or []
    item.rest()
    table["output_dim"] = model.value("output_dim", "int", 64)
    table["simi_pow"] = model.value("simi_pow", _F, 10.0)
    similarity = model.value("similarity", "str", "COSINE")
    if similarity not in ("COSINE", "INNER_PRODUCT"):
        model.skip("similarity", f"{similarity}: tzrec-run's mind offers cosine and inner_product; the model is not converted")
        return None
    table["similarity"] = similarity.lower()
    table["temperature"] = model.value("temperature", _F, 1.0)
    if not model.value("in_batch_negative", "bool", False):
        model.note("in_batch_negative", "false: TorchEasyRec scores each user against its negative sampler's "
                                        "items; here against the other items of the batch (in-batch negatives)")
    return table


def _capsule(user: Node, table: dict[str, Any]) -> None:
    """``capsule_config`` (TorchEasyRec's B2ICapsule) onto ``mind``'s options; its ``max_seq_len`` is the history
    group's ``max_len`` here."""
    capsule = user.child("capsule_config") or Node({}, user.at("capsule_config"), user.findings)
    for name, kind, default in (("max_k", "int", 5), ("high_dim", "int", 64), ("num_iters", "int", 3),
                                ("routing_logits_scale", _F, 20.0), ("routing_logits_stddev", _F, 1.0),
                                ("squash_pow", _F, 1.0), ("const_caps_num", "bool", False)):
        table[name] = capsule.value(name, kind, default)
    table["routing_init"] = capsule.value("routing_init_method", "str", "normal")
    length = capsule.value("max_seq_len", "int", 0)
    if length:
        capsule.note("max_seq_len", f"{length}: the capsules read the history group's max_len ids here "
                                    "([[features.sequence]] max_len, from its features' sequence_length)")
    capsule.rest()


def _tables(feats: FeatureSet, names: list[str]) -> set[str]:
    """The tables the id features (and sequence groups' features) among ``names`` look up (``table``, by default
    ``<name>_emb``)."""
    chosen = set(names)
    features = [f for f in feats.sparse if f["name"] in chosen]
    features += [f for group in feats.sequence if group["name"] in chosen for f in group.get("features", ())]
    return {f.get("table") or f"{f['name']}_emb" for f in features}


_MODELS: dict[str, Callable[[Node, Groups, FeatureSet], Optional[dict[str, Any]]]] = {
    "deepfm": lambda m, g, f: _deepfm(m, g, f, wide=False), "wide_and_deep": _wide_and_deep, "dlrm": _dlrm,
    "dcn_v1": lambda m, g, f: _dcn(m, g, f, 1), "dcn_v2": lambda m, g, f: _dcn(m, g, f, 2), "mask_net": _mask_net,
    "wukong": _wukong,
    "mmoe": _mmoe, "ple": _ple, "dbmtl": _dbmtl, "pepnet": _pepnet, "dssm": _dssm,
    "dssm_v2": lambda m, g, f: _dssm(m, g, f, v2=True), "mind": _mind, "multi_tower_din": _din,
    "multi_tower": _multi_tower, "rocket_launching": _rocket_launching, "tdm": _tdm,
}


def convert_architecture(node: Node, name: Optional[str], groups: Groups,
                         feats: FeatureSet) -> Optional[ConvertedModel]:
    """Convert the model message ``name`` of ``node`` (``model_config``).

    Returns:
        The ``[model]`` table and the features it reads, or ``None`` when the model is none of
        those converted here (the caller reports it).
    """
    if name not in _MODELS:
        return None
    model = Node(node.fields[name][-1], node.at(name), node.findings)
    table = _MODELS[name](model, groups, feats)
    if table is None:
        return None
    model.rest()
    node.used.add(name)
    num_class = node.value("num_class", "int", 1)
    if num_class == 2 and name in ("rocket_launching", "tdm"):
        node.used.add("num_class")
        node.note("num_class", f"2: one logit{' per net' if name == 'rocket_launching' else ''} here, with binary "
                               "losses (a two-class softmax is the sigmoid of the difference of its two logits)")
    elif num_class != 1:
        node.skip("num_class", f"{num_class}: tzrec-run's {name} outputs one logit per task")
    if name in ("dssm", "dssm_v2"):
        features = set(table["user_features"]) | set(table["item_features"])
    elif name == "mind":
        features = set(table["user_features"]) | set(table["item_features"]) | {table["history"]}
    elif name in ("multi_tower_din", "multi_tower"):
        features = {n for tower in table.get("towers", ()) for n in tower["features"]}
        for din in table.get("din_towers", ()):
            group = next(g for g in feats.sequence if g["name"] == din["sequence"])
            features |= {din["sequence"], *group["query"]}
    elif name == "tdm":
        group = next(g for g in feats.sequence if g["name"] == table["history"])
        features = {*table["features"], table["history"], *group["query"]}
    else:
        features = set(_names(groups, feats))
    return ConvertedModel(table, features)
