"""The losses and metrics of ``model_config`` (task towers included), ``eval_config`` and ``export_config``."""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

from tzrun_tools.convert.nodes import Finding, Node

__all__ = ["Outputs", "TWO_CLASS_TASKS", "convert_model", "convert_eval", "convert_export"]

_F = "float"

#: ModelConfig fields that are not the model's own oneof message.
_MODEL_LEVEL = {"feature_groups", "metrics", "losses", "train_metrics", "num_class", "use_pareto_loss_weight",
                "variational_dropout", "kd"}
_MATCH_MODELS = {"dssm", "dssm_v2", "mind", "dat", "match_model"}
#: The multi-task models whose task towers may have ``num_class: 2`` (a task's ``num_classes = 2``):
#: their losses of two logits read ``class_logits/<task>``.
TWO_CLASS_TASKS = frozenset({"dbmtl"})
#: The losses that read a task's two logits when it has two classes.
_TWO_LOGIT_LOSSES = {"jrc", "softmax_cross_entropy"}
_TOWER_NOT_CONVERTED = {
    "sample_weight_name": "one sample weight column per run here: data.sample_weight",
    "task_space_indicator_label": "task-space loss weights have no equivalent",
    "in_task_space_weight": "task-space loss weights have no equivalent",
    "out_task_space_weight": "task-space loss weights have no equivalent",
}


class _Task(NamedTuple):
    """Where a tower's (or the model's) losses and metrics read from."""

    suffix: str = ""  # TorchEasyRec's result name suffix, "_<tower_name>"
    tower: Optional[str] = None
    label: Optional[str] = None
    weight: float = 1.0
    match: bool = False
    num_class: Optional[int] = None
    net: Optional[str] = None  # rocket_launching: "" (light) or "_booster", a suffix of the name and output read
    two_logits: bool = False  # a task of two classes: its two logits are class_logits/<tower>
    one_logit: bool = False  # a model of one logit whatever num_class (tdm): two classes are binary


class Outputs:
    """The converted losses and metrics, and the tzrec-run name of each TorchEasyRec result."""

    def __init__(self) -> None:
        self.losses: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.train_metrics: list[dict[str, Any]] = []
        self.names: dict[str, str] = {}  # TorchEasyRec result name -> tzrec-run result name
        self.min_weights: dict[str, float] = {}  # loss name -> its tower's pareto_min_loss_weight


def _placed(entry: dict[str, Any], task: _Task, name: str, prediction: str, taken: list[dict[str, Any]]) -> dict[str, Any]:
    """``entry`` with name, prediction and label set for its task."""
    base = name + (task.suffix if task.net is None else task.net)
    unique, n = base, 2
    while any(other.get("name", other["type"]) == unique for other in taken):
        unique, n = f"{base}_{n}", n + 1
    head: dict[str, Any] = {"type": entry.pop("type")}
    if unique != head["type"]:
        head["name"] = unique
    if task.tower is not None:
        head["prediction"] = f"{prediction}/{task.tower}"
    elif task.net:
        head["prediction"] = prediction + task.net
    if task.label is not None:
        head["label"] = task.label
    return {**head, **entry}


def _loss(node: Node, task: _Task, outputs: Outputs) -> None:
    name = node.which(["binary_cross_entropy", "softmax_cross_entropy", "l2_loss", "jrc_loss", "binary_focal_loss",
                       "recon_loss", "commitment_loss", "contrastive_loss"])
    if name is None:
        node.rest()
        return
    loss = node.child(name) or Node({}, node.at(name), node.findings)
    out: dict[str, Any]
    if name in ("recon_loss", "commitment_loss", "contrastive_loss"):
        node.skip(name, "semantic-id (RQ-VAE) losses have no equivalent")
        return node.rest()
    if name == "binary_cross_entropy":
        out = {"type": "binary_cross_entropy"}
        loss.copy(out, {"label_smoothing": ("label_smoothing", _F)})
    elif name == "softmax_cross_entropy" and task.match:
        out = {"type": "in_batch_softmax"}
        loss.skip("label_smoothing", "ignored by TorchEasyRec's matching models too")
        node.note(name, "matching model: in_batch_softmax over the batch's other items (sampled negatives: "
                        "[data.sampler] and sampled_softmax: tzrec-run help retrieval)")
    elif name == "softmax_cross_entropy" and (task.net is not None or task.one_logit) and task.num_class == 2:
        out = {"type": "binary_cross_entropy"}
        loss.copy(out, {"label_smoothing": ("label_smoothing", _F)})
        node.note(name, "two classes: binary_cross_entropy on the one logit of " + (
            "the model" if task.one_logit else "each net") + " here")
    elif name == "softmax_cross_entropy":
        out = {"type": "softmax_cross_entropy"}
        if task.num_class:
            out["num_classes"] = task.num_class
        loss.copy(out, {"label_smoothing": ("label_smoothing", _F)})
    elif name == "l2_loss":
        out = {"type": "l2"}
    elif name == "jrc_loss":
        out = {"type": "jrc"}
        loss.copy(out, {"alpha": ("alpha", _F)})
        session = loss.value("session_name", "str")
        if session is not None:
            out["group_by"] = session
            loss.note("session_name", "group_by names an input column: the column of the feature "
                                      f"'{session}' (the same name unless its expression reads another)")
    else:
        out = {"type": "binary_focal"}
        loss.copy(out, {"gamma": ("gamma", _F), "alpha": ("alpha", _F)})
    loss.rest()
    node.rest()
    reads = "class_logits" if task.two_logits and out["type"] in _TWO_LOGIT_LOSSES else "logits"
    placed = _placed(out, task, out["type"], "similarity" if task.match else reads, outputs.losses)
    if task.weight != 1.0:
        placed["weight"] = task.weight
    outputs.losses.append(placed)
    outputs.names[name + task.suffix] = "loss/" + placed.get("name", placed["type"])


_METRIC_READS = {"auc": "probs", "grouped_auc": "probs", "accuracy": "probs", "normalized_entropy": "probs",
                 "mae": "logits", "mse": "logits", "xauc": "logits", "grouped_xauc": "logits",
                 "recall_at_k": "similarity"}


def _metric(node: Node, task: _Task, outputs: Outputs, into: list[dict[str, Any]], train: bool) -> None:
    names = ["auc", "multiclass_auc", "recall_at_k", "mean_absolute_error", "mean_squared_error", "accuracy",
             "grouped_auc", "xauc", "grouped_xauc", "normalized_entropy"]
    name = node.which(names)
    if train:
        decay: dict[str, Any] = {}
        node.copy(decay, {"decay_rate": ("decay_rate", _F), "decay_step": ("decay_step", "int")})
    if name is None:
        node.rest()
        return
    metric = node.child(name) or Node({}, node.at(name), node.findings)
    out: dict[str, Any]
    result_name, base_name = name, None
    if name == "multiclass_auc":
        node.skip(name, "no multi-class AUC in tzrec-run's metrics")
        return node.rest()
    if name == "auc":
        out = {"type": "auc"}
        thresholds = metric.value("thresholds", "int", 200)
        (metric if metric.has("thresholds") else node).note(
            "thresholds" if metric.has("thresholds") else name,
            f"the exact AUC; TorchEasyRec's is binned over {thresholds} thresholds (add thresholds = {thresholds} "
            "for that value)" + ("; in training logs, the decayed exact AUC over each window" if train else ""))
    elif name == "recall_at_k":
        k = metric.value("top_k", "int", 5)
        out = {"type": "recall_at_k", "k": k}
        if task.match:
            out["in_batch"] = True
            node.note(name, "over the batch's other items as candidates (in_batch = true); with [data.sampler], "
                            "sampled = true scores the sampled items instead (tzrec-run help retrieval)")
        result_name, base_name = f"recall@{k}", f"recall_at_{k}"
    elif name in ("mean_absolute_error", "mean_squared_error"):
        out = {"type": "mae" if name == "mean_absolute_error" else "mse"}
    elif name == "accuracy":
        if task.num_class and task.num_class > 1:
            node.skip(name, "multi-class accuracy has no equivalent (tzrec-run's accuracy is binary)")
            return node.rest()
        out = {"type": "accuracy"}
        metric.copy(out, {"threshold": ("threshold", _F)})
        metric.skip("top_k", "top-k accuracy is for multi-class models, which tzrec-run's accuracy is not for")
    elif name in ("grouped_auc", "grouped_xauc"):
        out = {"type": name}
        key = metric.value("grouping_key", "str")
        if key is not None:
            out["group_by"] = key
            metric.note("grouping_key", f"group_by names an input column: the column of the feature '{key}'")
        if name == "grouped_xauc":
            if metric.has("max_pairs_per_group"):
                metric.values("max_pairs_per_group", "int")
            out["ties"] = "wrong"
            node.note(name, "exact per-group XAUC over all pairs, with TorchEasyRec's tie rule (ties = \"wrong\"); "
                            "TorchEasyRec samples up to max_pairs_per_group pairs per group, with replacement")
    elif name == "xauc":
        out = _xauc(node, metric)
    else:
        out = {"type": "normalized_entropy"}
        metric.copy(out, {"eta": ("eps", _F)})
    metric.rest()
    node.rest()
    placed = _placed(out, task, base_name or out["type"], _METRIC_READS[out["type"]], into)
    if train:
        placed.update(decay)
    into.append(placed)
    if not train:
        outputs.names[result_name + task.suffix] = placed.get("name", placed["type"])


def _xauc(node: Node, metric: Node) -> dict[str, Any]:
    """TorchEasyRec's ``xauc``: its tie rule (``ties = "wrong"``: every pair in the denominator,
    tied targets or predictions score 0) and, in batch, its mean of per-batch values."""
    out: dict[str, Any] = {"type": "xauc"}
    if metric.value("in_batch", "bool"):
        out.update(mode="in_batch", ties="wrong", averaging="per_batch")
        node.note("xauc", "in-batch XAUC with TorchEasyRec's rules: tied pairs counted wrong (ties = \"wrong\") "
                          "and the mean of per-batch values (averaging = \"per_batch\")")
        return out
    for key in ("sample_ratio", "max_pairs"):
        if metric.has(key):
            metric.values(key, _F)
    out["ties"] = "wrong"
    node.note("xauc", "the exact XAUC over all pairs with TorchEasyRec's tie rule (ties = \"wrong\"), the value "
                      "TorchEasyRec estimates by sampling pairs with replacement (for a seeded estimate set "
                      "mode = \"sampled\" and num_samples)")
    return out


def _task_outputs(node: Node, task: _Task, outputs: Outputs) -> None:
    for child in node.indexed_children("losses"):
        _loss(child, task, outputs)
    for child in node.indexed_children("metrics"):
        _metric(child, task, outputs, outputs.metrics, train=False)
    for child in node.indexed_children("train_metrics"):
        _metric(child, task, outputs, outputs.train_metrics, train=True)


def convert_model(node: Node, outputs: Outputs) -> Optional[str]:
    """Losses and metrics of ``model_config``; returns the model oneof's name."""
    model_names = [n for n, v in node.fields.items() if n not in _MODEL_LEVEL and v and isinstance(v[-1], dict)]
    model_name = model_names[-1] if model_names else None
    num_class = node.fields.get("num_class", [None])[-1]
    task = _Task(match=model_name in _MATCH_MODELS, num_class=num_class if isinstance(num_class, int) else None,
                 one_logit=model_name == "tdm")
    if model_name == "rocket_launching":  # TorchEasyRec applies each loss and metric to both nets
        for suffix, net in (("_light", ""), ("_booster", "_booster")):
            _task_outputs(node, task._replace(suffix=suffix, net=net), outputs)
        node.findings.notes[:] = list(dict.fromkeys(node.findings.notes))  # each note once, not once per net
        return model_name
    _task_outputs(node, task, outputs)
    if model_name is not None:
        model = Node(node.fields[model_name][-1], node.at(model_name), node.findings)
        for i, tower in enumerate(model.indexed_children("task_towers")):
            name = tower.value("tower_name", "str") or f"task_{i}"
            tower_class = tower.fields.get("num_class", [None])[-1]
            tower_task = _Task(suffix=f"_{name}", tower=name, label=tower.value("label_name", "str"),
                               weight=tower.value("weight", _F, 1.0), num_class=tower_class,
                               two_logits=model_name in TWO_CLASS_TASKS and tower_class == 2)
            before = len(outputs.losses)
            _task_outputs(tower, tower_task, outputs)
            min_weight = tower.value("pareto_min_loss_weight", _F)
            if min_weight:
                outputs.min_weights.update({loss.get("name", loss["type"]): min_weight for loss in outputs.losses[before:]})
            for field_name, reason in _TOWER_NOT_CONVERTED.items():
                tower.skip(field_name, reason)
    return model_name


# --- eval_config and export_config ------------------------------------------------------------


def convert_eval(node: Node, evaluation: dict[str, Any], dense: Optional[dict[str, Any]]) -> None:
    """Convert ``eval_config`` into ``[eval]``; ``use_dense_ema`` goes to the converted ``dense``
    optimizer."""
    steps = node.value("num_steps", "int")
    if steps:
        evaluation["num_steps"] = steps
    node.skip("log_step_count_steps", "evaluation progress is shown by the progress stage, without an interval")
    use_ema = node.value("use_dense_ema", "bool")
    if use_ema is not None:
        if dense is not None and "ema" in dense:
            dense["ema"]["use_for_eval"] = use_ema
        else:
            node.skip("use_dense_ema", "no dense_optimizer.ema is configured")
    node.rest()


def convert_export(node: Node, evaluation: dict[str, Any], names: Mapping[str, str]) -> None:
    """Convert ``export_config``'s best exporter into ``[eval]``'s best metric.

    ``names`` maps TorchEasyRec result names to tzrec-run's (:attr:`Outputs.names`).
    """
    kind = node.value("exporter_type", "str", "latest")
    metric = node.value("best_exporter_metric", "str", "auc")
    larger = node.value("metric_larger_is_better", "bool", True)
    if kind == "best":
        if metric in names:
            evaluation["best_metric"] = names[metric]
            evaluation["best_mode"] = "max" if larger else "min"
            node.note("exporter_type", "the best checkpoint is recorded in best.json and kept from pruning; export it "
                                       "with tzrec-run export CONFIG --checkpoint best --out DIR (or [export] on_best = true "
                                       "during training)")
        else:
            node.findings.not_converted.append(Finding(node.at("best_exporter_metric"), f"'{metric}' is none of the "
                                                       f"converted eval results ({', '.join(names) or 'none'})"))
    else:
        node.skip("exporter_type", "export the latest checkpoint with tzrec-run export CONFIG --checkpoint latest --out DIR "
                                   "(or [export] at_end = true during training)")
        for name in ("best_exporter_metric", "metric_larger_is_better"):
            node.skip(name, f"used only with exporter_type \"best\" (this one is \"{kind}\")")
    node.rest("an export is made by tzrec-run export (tzrec-run help serving), not configured here")
