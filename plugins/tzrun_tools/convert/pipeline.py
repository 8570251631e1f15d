"""The whole pipeline config: :func:`convert_pipeline_config` and the TOML it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional

from tzrun_tools.convert.data import convert_data
from tzrun_tools.convert.evaluation import Outputs, convert_eval, convert_export, convert_model
from tzrun_tools.convert.features import FeatureSet, convert_features
from tzrun_tools.convert.groups import Groups, read_groups
from tzrun_tools.convert.models import convert_architecture
from tzrun_tools.convert.nodes import Finding, Findings, Node
from tzrun_tools.convert.prototext import parse_text_proto
from tzrun_tools.convert.train import convert_train
from tzrun.errors import TzrunError

__all__ = ["Conversion", "convert_pipeline_config", "convert_file", "summary_lines"]


class Conversion(NamedTuple):
    """The result of :func:`convert_pipeline_config`.

    Attributes:
        toml: the TOML text: the findings as comments on top, the converted keys, and a commented
            placeholder for the model and each feature that is not converted.
        tree: the converted keys as TOML-shaped data.
        not_converted: fields that have no tzrec-run equivalent here (or are not known).
        notes: fields converted to something that behaves differently, or defaults written out.
    """

    toml: str
    tree: dict[str, Any]
    not_converted: list[Finding]
    notes: list[Finding]


def _input_path(root: Node, name: str, data: dict[str, Any], key: str) -> None:
    path = root.value(name, "str")
    if not path:
        return
    data[key] = path
    if "://" in path:
        root.skip(name, f"'{path}' is not a local file, directory or glob (kept as data.{key}, which check does "
                        f"not read): export the data to Parquet and set data.{key}")
    elif "," in path:
        root.skip(name, f"'{path}' lists several paths (kept as data.{key}, which check does not read): set "
                        f"data.{key} to one directory or glob")


def _loss_weighting(model_node: Node, outputs: Outputs, train: dict[str, Any]) -> None:
    """``use_pareto_loss_weight`` and the towers' ``pareto_min_loss_weight`` as ``[train.loss_weighting]``."""
    if not model_node.value("use_pareto_loss_weight", "bool"):
        if outputs.min_weights:
            model_node.findings.notes.append(Finding("model_config", "pareto_min_loss_weight is unused without "
                                                                     "use_pareto_loss_weight (as in TorchEasyRec)"))
        return
    weighting: dict[str, Any] = {"type": "pareto"}
    if outputs.min_weights:
        weighting["min_weights"] = dict(outputs.min_weights)
    note = "Pareto-efficient weights at every step (tzrec-run help loss-weighting)"
    if len(outputs.losses) > 2:
        weighting["solver"] = "pe_ltr"
        note += "; solver = \"pe_ltr\" gives TorchEasyRec's weights, \"exact\" the true minimum"
    train["loss_weighting"] = weighting
    model_node.note("use_pareto_loss_weight", note)


def convert_pipeline_config(text: str, source: str = "<string>") -> Conversion:
    """Convert the training parts of a TorchEasyRec pipeline config.

    Args:
        text: the pipeline config, protobuf text format.
        source: its file name, for errors and the output's header.

    Returns:
        The TOML text and tree, and what was not converted or converted with another meaning.

    Raises:
        ProtoTextError: the text is not protobuf text format.
    """
    findings = Findings()
    root = Node(parse_text_proto(text, source), "", findings)
    data: dict[str, Any] = {}
    train: dict[str, Any] = {}
    evaluation: dict[str, Any] = {}
    outputs = Outputs()
    model_dir = root.value("model_dir", "str") or None
    _input_path(root, "train_input_path", data, "train_input")
    _input_path(root, "eval_input_path", data, "eval_input")
    data_node = root.child("data_config")
    if data_node is not None:
        convert_data(data_node, data)
    train_node = root.child("train_config")
    if train_node is not None:
        convert_train(train_node, train)
    model_node = root.child("model_config")
    model_name = convert_model(model_node, outputs) if model_node is not None else None
    groups = read_groups(model_node, model_name) if model_node is not None else Groups()
    encoded = str(data_node.fields.get("fg_mode", ["FG_NONE"])[-1]) == "FG_NONE" if data_node is not None else True
    features = convert_features(root, groups, encoded)
    model = None
    if model_node is not None:
        _loss_weighting(model_node, outputs, train)
        model = _model(model_node, model_name, groups, features)
    for node_name, convert in (("eval_config", lambda n: convert_eval(n, evaluation, train.get("dense_optimizer"))),
                               ("export_config", lambda n: convert_export(n, evaluation, outputs.names))):
        node = root.child(node_name)
        if node is not None:
            convert(node)
    root.rest()

    tree: dict[str, Any] = {}
    if model_dir is not None:
        tree["model_dir"] = model_dir
    for key, value in (("data", data), ("model", model), ("train", train), ("eval", evaluation),
                       ("losses", outputs.losses), ("metrics", outputs.metrics),
                       ("train_metrics", outputs.train_metrics), ("features", features.tree())):
        if value:
            tree[key] = value
    missing = [key for key, name in (("train_input", "train_input_path"), ("eval_input", "eval_input_path"))
               if key not in data and (key == "train_input" or root.has(name))]
    if model_dir is None:
        findings.not_converted.append(Finding("model_dir", "unset (TorchEasyRec's --model_dir gives it): set "
                                                           "model_dir, which tzrec-run requires"))
    toml = _render(tree, findings, source, None if model else model_name, features.placeholders, missing)
    return Conversion(toml, tree, findings.not_converted, findings.notes)


def convert_file(path: str | Path) -> Conversion:
    """:func:`convert_pipeline_config` of a file.

    Raises:
        TzrunError: the file is missing or unreadable.
        ProtoTextError: it is not protobuf text format.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise TzrunError(f"{path}: cannot read the file: {reason}") from None
    return convert_pipeline_config(text, str(path))


def summary_lines(conversion: Conversion) -> list[str]:
    """What ``tzrec-run convert`` tells on standard error: every field not converted, and the notes."""
    lines = []
    for title, items in (("not converted", conversion.not_converted), ("converted with another meaning, or a "
                         "TorchEasyRec default written out", conversion.notes)):
        if items:
            lines.append(f"{len(items)} field(s) {title}:")
            lines.extend(f"  {item}" for item in items)
    return lines


#: tzrec-run models named as TorchEasyRec names them.
_SAME_MODELS = {n: n for n in ("deepfm", "dlrm", "dcn_v1", "dcn_v2", "mask_net", "wukong", "dssm", "dssm_v2", "mmoe", "ple", "dbmtl", "pepnet", "wide_and_deep", "multi_tower")} | {"multi_tower_din": "din"}


def _model(node: Node, name: Optional[str], groups: Groups, features: FeatureSet) -> Optional[dict[str, Any]]:
    """The ``[model]`` table (``None`` when not converted); keeps the features the model reads."""
    node.skip("kd", "knowledge distillation has no equivalent")
    node.skip("variational_dropout", "variational dropout (feature selection) has no equivalent")
    converted = convert_architecture(node, name, groups, features)
    if groups.groups:
        used = converted.features if converted is not None else {n for f in groups.features()
                                                                  for n in features.names.get(f, ())}
        dropped = features.keep(used)
        if dropped:
            where = "the towers' feature groups" if name in ("dssm", "dssm_v2") and converted is not None else "the feature groups"
            node.findings.not_converted.append(Finding("feature_configs", (
                f"{', '.join(dropped)}: in none of {where}, so TorchEasyRec's model does not read them "
                "(tzrec-run's model would); left out")))
    architecture = [n for n in node.fields if n not in node.used]
    node.used.update(architecture)
    if architecture:
        node.findings.not_converted.append(Finding(
            "model_config", f"{', '.join(architecture)}: the model is not converted; write [model] (tzrec-run help models)"))
    return converted.table if converted is not None else None


def _render(tree: Mapping[str, Any], findings: Findings, source: str, model: Optional[str],
            placeholders: list[tuple[str, str, str]], missing: list[str]) -> str:
    from tzrun.runner.records import emit_toml  # the TOML writer of resolved_config.toml

    name = Path(source).name
    todo = model is not None or bool(placeholders) or bool(missing) or "model_dir" not in tree
    lines = [f"# Converted from the TorchEasyRec config {name} by `tzrec-run convert`.",
             "# Fill in the TODO at the end, then run `tzrec-run check` on this file." if todo else
             "# Run `tzrec-run check` on this file; the comments below list what was not converted and why.",
             "# `tzrec-run help migration` says what each field became and why."]
    for title, items in (("Not converted (no equivalent here; protobuf field: why)", findings.not_converted),
                         ("Converted with another meaning, or a TorchEasyRec default written out", findings.notes)):
        if items:
            lines += ["#", f"# {title}:"] + [f"#   {item}" for item in items]
    lines.append("")
    emit_toml(lines, tree, "", "", {})
    if not todo:
        return "\n".join(lines) + "\n"
    lines += ["", "# " + "-" * 98, "# TODO: what is not converted; write it (tzrec-run help models, tzrec-run help features)."]
    if "model_dir" not in tree:
        lines.append('# model_dir = "..."   # where checkpoints and logs go (required)')
    if missing:
        lines.append(f"# In [data], set {' and '.join(missing)}: a Parquet or CSV file, directory or glob.")
    if model is not None:
        hint = f'"{_SAME_MODELS[model]}"' if model in _SAME_MODELS else '"..."   # choose one of `tzrec-run plugins`'
        lines += ["#", f"# {'[model]':<24}  # TorchEasyRec's model_config.{model}", f"# type = {hint}"]
        if any("/" in str(x.get("prediction", "")) for x in tree.get("losses", ())):
            lines.append("# (name the tasks after TorchEasyRec's tower_name: losses and metrics read logits/<task>, probs/<task>)")
    for kind, feature, reason in placeholders:
        lines += ["#", f"# {kind} '{feature}': {reason}", "# [[features.sparse]] or [[features.dense]]",
                  f'# name = "{feature}"']
    return "\n".join(lines) + "\n"
