"""The whole pipeline config: :func:`convert_pipeline_config` and the TOML it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional

from tzrun.convert.data import convert_data
from tzrun.convert.evaluation import Outputs, convert_eval, convert_export, convert_model
from tzrun.convert.nodes import Finding, Findings, Node
from tzrun.convert.prototext import parse_text_proto
from tzrun.convert.train import convert_train
from tzrun.errors import TzrunError

__all__ = ["Conversion", "convert_pipeline_config", "convert_file", "summary_lines"]


class Conversion(NamedTuple):
    """The result of :func:`convert_pipeline_config`.

    Attributes:
        toml: the TOML text: the findings as comments on top, the converted keys, and a commented
            placeholder for the model and the features.
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
    if "://" in path:
        root.skip(name, f"'{path}' is not a local file, directory or glob: export the data to Parquet and set "
                        f"data.{key}")
    elif "," in path:
        root.skip(name, f"'{path}' lists several paths: set data.{key} to one directory or glob")
    else:
        data[key] = path


def _feature_summary(features: list[Any]) -> list[tuple[str, list[str], list[tuple[str, str]]]]:
    """For the placeholder: each feature kind, its feature names, and an example's TOML keys."""
    by_kind: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    for item in features:
        for kind, values in item.items() if isinstance(item, dict) else ():
            inner = values[-1] if values and isinstance(values[-1], dict) else {}
            name = str((inner.get("feature_name") or inner.get("sequence_name") or ["?"])[-1])
            names, example = by_kind.setdefault(kind, ([], []))
            if not names:
                example.append(("name", f'"{name}"'))
                for key in ("num_buckets", "hash_bucket_size", "embedding_dim"):
                    value = inner.get(key, [None])[-1]
                    if isinstance(value, int) and kind == "id_feature":
                        example.append((key, str(value)))
            names.append(name)
    return [(kind, names, example) for kind, (names, example) in by_kind.items()]


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
    note = "Pareto-efficient weights at every step (docs/losses.md#loss-weighting)"
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
    model_dir = root.value("model_dir", "str")
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
    if model_node is not None:
        _loss_weighting(model_node, outputs, train)
        model_node.skip("kd", "knowledge distillation has no equivalent")
        model_node.skip("variational_dropout", "variational dropout (feature selection) has no equivalent")
        architecture = [n for n in model_node.fields if n not in model_node.used]
        model_node.used.update(architecture)
        if architecture:
            findings.not_converted.append(Finding(
                "model_config", f"{', '.join(architecture)}: the model is not converted; write [model] (docs/models.md)"))
    for node_name, convert in (("eval_config", lambda n: convert_eval(n, evaluation, train.get("dense_optimizer"))),
                               ("export_config", lambda n: convert_export(n, evaluation, outputs.names))):
        node = root.child(node_name)
        if node is not None:
            convert(node)
    features = root.fields.get("feature_configs", [])
    root.skip("feature_configs", f"{len(features)} feature(s) not converted; write [[features.dense]] and "
                                 "[[features.sparse]] (docs/data.md)")
    root.rest()

    tree: dict[str, Any] = {}
    if model_dir is not None:
        tree["model_dir"] = model_dir
    for key, value in (("data", data), ("train", train), ("eval", evaluation), ("losses", outputs.losses),
                       ("metrics", outputs.metrics), ("train_metrics", outputs.train_metrics)):
        if value:
            tree[key] = value
    missing = [key for key, name in (("train_input", "train_input_path"), ("eval_input", "eval_input_path"))
               if key not in data and (key == "train_input" or root.has(name))]
    toml = _render(tree, findings, source, model_name, _feature_summary(features), missing)
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
_SAME_MODELS = {"deepfm", "dlrm", "dssm", "mmoe", "wide_and_deep"}


def _render(tree: Mapping[str, Any], findings: Findings, source: str, model: Optional[str],
            features: list[tuple[str, list[str], list[tuple[str, str]]]], missing: list[str]) -> str:
    from tzrun.runner.records import emit_toml  # the TOML writer of resolved_config.toml

    name = Path(source).name
    lines = [f"# Converted from the TorchEasyRec config {name} by `tzrec-run convert`: the training parts only.",
             "# Fill in the TODO at the end (the model and its features), then run `tzrec-run check` on this file.",
             "# See docs/migration.md for what each field became and why."]
    for title, items in (("Not converted (no equivalent here; protobuf field: why)", findings.not_converted),
                         ("Converted with another meaning, or a TorchEasyRec default written out", findings.notes)):
        if items:
            lines += ["#", f"# {title}:"] + [f"#   {item}" for item in items]
    lines.append("")
    emit_toml(lines, tree, "", "", {})
    lines += ["", "# " + "-" * 98, "# TODO: the model and the features are not converted; write them (docs/models.md, docs/data.md)."]
    if missing:
        lines.append(f"# In [data], set {' and '.join(missing)}: a Parquet or CSV file, directory or glob.")
    if model is not None:
        hint = f'"{model}"' if model in _SAME_MODELS else '"..."   # choose one of `tzrec-run plugins`'
        lines += ["#", f"# {'[model]':<24}  # TorchEasyRec's model_config.{model}", f"# type = {hint}"]
        if any("/" in str(x.get("prediction", "")) for x in tree.get("losses", ())):
            lines.append("# (name the tasks after TorchEasyRec's tower_name: losses and metrics read logits/<task>, probs/<task>)")
    for kind, names, example in features:
        lines += ["#", f"# feature_configs: {len(names)} {kind}: {', '.join(names)}"]
        if kind in ("raw_feature", "id_feature"):
            table = "dense" if kind == "raw_feature" else "sparse"
            lines.append(f"# {f'[[features.{table}]]':<24}  # one per {kind}, e.g.")
            lines += [f"# {key} = {value}" for key, value in example]
    return "\n".join(lines) + "\n"
