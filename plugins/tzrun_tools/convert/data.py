"""The training keys of ``data_config``: batch sizes, labels, sample weights and the reader."""

from __future__ import annotations

from typing import Any

from tzrun_tools.convert.nodes import Finding, Node

__all__ = ["convert_data"]

_CSV_TYPES = {"INT32": "int32", "INT64": "int64", "STRING": "string", "FLOAT": "float32", "DOUBLE": "float64",
              "INT": "int32", "BIGINT": "int64", "BOOLEAN": "bool"}
_DATA_NOT_CONVERTED = {
    "pin_memory": "tzrec-run decides pinning itself (a speed option)",
    "drop_remainder": "every row is trained on here; a short last batch is not dropped",
    "min_batch_size": "every row is trained on here; short batches are not dropped",
    "shuffle": "set data.shuffle_buffer_rows (a number of rows; tzrec-run help shuffling)",
    "shuffle_buffer_size": "set data.shuffle_buffer_rows (a number of rows; tzrec-run help shuffling)",
    "fg_threads": "tzrec-run has no feature generator (FG)",
    "fg_encoded": "tzrec-run has no feature generator (FG)",
    "fg_encoded_multival_sep": "set separator on each multi-value [[features.sparse]] (tzrec-run help features)",
    "is_orderby_partition": "MaxCompute (ODPS) input is not supported",
    "odps_data_quota_name": "MaxCompute (ODPS) input is not supported",
    "odps_data_compression": "MaxCompute (ODPS) input is not supported",
    "sample_mask_prob": "sample masking has no equivalent",
    "negative_sample_mask_prob": "sample masking has no equivalent",
    "in_order": "batches are always in order here (resume is exact)",
}
_SAMPLERS = ("negative_sampler", "negative_sampler_v2", "hard_negative_sampler", "hard_negative_sampler_v2")
_TDM_NOT_CONVERTED = {
    "attr_delimiter": "the tree is one Parquet node table here (tzrec-run tdm-tree), not delimited text",
    "field_delimiter": "the tree is one Parquet node table here (tzrec-run tdm-tree), not delimited text",
    "num_eval_sample": "evaluation rows are expanded as training rows are, with layer_num_sample",
}


def convert_data(node: Node, data: dict[str, Any]) -> None:
    """Convert ``data_config`` into the ``[data]`` table ``data``."""
    for name, key in (("batch_size", "batch_size"), ("eval_batch_size", "eval_batch_size"), ("num_workers", "num_workers")):
        value = node.value(name, "int")
        if value is not None:
            data[key] = value
    labels = node.values("label_fields", "str")
    if labels:
        data["labels"] = labels
    weights = node.values("sample_weight_fields", "str")
    if weights:
        data["sample_weight"] = weights[0]
        if len(weights) > 1:
            node.findings.not_converted.append(Finding(node.at("sample_weight_fields"), f"{weights[1:]}: one sample "
                                                       "weight column per run here (TorchEasyRec's rank models use the first too)"))
    _batch_cost(node, data)
    dataset = node.value("dataset_type", "str", "OdpsDataset")
    if dataset == "ParquetDataset":
        data["reader"] = {"type": "parquet"}
    elif dataset == "CsvDataset":
        data["reader"] = _csv_reader(node)
    else:
        if not node.has("dataset_type"):
            node.findings.not_converted.append(Finding(node.at("dataset_type"), "unset, so OdpsDataset: MaxCompute "
                                                       "tables are not readable here; export them to Parquet"))
        node.skip("dataset_type", f"{dataset}: tzrec-run reads Parquet and CSV files (export the data to Parquet)")
    fg_mode = node.value("fg_mode", "str", "FG_NONE")
    if fg_mode != "FG_NONE":
        node.skip("fg_mode", f"{fg_mode}: tzrec-run has no feature generator (FG): each feature reads its input "
                             "column as it is (ids are hashed, looked up and bucketized here; other FG expressions are "
                             "not computed)")
    for name, reason in _DATA_NOT_CONVERTED.items():
        node.skip(name, reason)
    if node.has("force_base_data_group"):
        node.note("force_base_data_group", (
            f"{str(node.value('force_base_data_group', 'bool', False)).lower()}: nothing to set: every feature of a "
            "batch has the same rows here, a sampler's items after the batch's own (the layout true asks for, which "
            "dssm_v2 needs); the models compute the same either way"))
    tdm = node.child("tdm_sampler")
    if tdm is not None:
        data["sampler"] = _tdm_sampler(tdm)
    for name in _SAMPLERS:
        node.skip(name, "not converted: the converted two-tower model trains on in-batch negatives; to sample "
                        "negatives from an item table, add [data.sampler] type = \"negative\" with the sampled_softmax "
                        "loss (tzrec-run help retrieval; graph-based and hard-negative samplers have no equivalent)")
    node.rest()


def _tdm_sampler(node: Node) -> dict[str, Any]:
    """``tdm_sampler`` as ``[data.sampler] type = "tdm"``: its node and edge tables become the one
    node table ``tzrec-run tdm-tree`` writes, beside them."""
    import posixpath

    items = node.value("item_input_path", "str", "")
    tree = posixpath.join(posixpath.dirname(items) or ".", "nodes.parquet")
    sampler: dict[str, Any] = {"type": "tdm", "tree": tree, "item_id": node.value("item_id_field", "str", "")}
    sampler["layer_num_sample"] = node.values("layer_num_sample", "int")
    attrs = node.values("attr_fields", "str")
    if attrs:
        sampler["attr_fields"] = attrs
    ratio = node.value("remain_ratio", "float")
    if ratio is not None:
        sampler["remain_ratio"] = ratio
    kind = node.value("probability_type", "str")
    if kind is not None:
        sampler["probability_type"] = kind.lower()
    node.note("item_input_path", f"the node and edge tables are one Parquet node table here, {tree}: write it with "
                                 "tzrec-run tdm-tree (tzrec-run help models, the tdm section)")
    node.values("edge_input_path", "str")
    node.values("predict_edge_input_path", "str")
    node.note("predict_edge_input_path", "retrieval walks the same node table (tzrec-run tdm-retrieve)")
    for name, reason in _TDM_NOT_CONVERTED.items():
        node.skip(name, reason)
    node.rest()
    return sampler


def _batch_cost(node: Node, data: dict[str, Any]) -> None:
    """``batch_cost_size`` and ``sample_cost_field`` as ``data.batch_cost_size`` and ``data.sample_cost``."""
    cap, field = node.value("batch_cost_size", "int"), node.value("sample_cost_field", "str")
    if not cap:
        if field:
            node.skip("sample_cost_field", "unused without batch_cost_size (as in TorchEasyRec)")
        return
    data["batch_cost_size"] = cap
    notes = []
    if field:
        data["sample_cost"] = field
    else:
        notes.append("no sample_cost_field: a row's cost is 1 + its sequences' lengths here "
                     "(data.sample_cost = \"sequence_length\", the default)")
    if "batch_size" in data:
        notes.append(f"a batch also holds at most batch_size = {data['batch_size']} rows here, and a row over the cap "
                     "alone is a batch of its own")
    if notes:
        node.note("batch_cost_size", "; ".join(notes))


def _csv_reader(node: Node) -> dict[str, Any]:
    reader: dict[str, Any] = {"type": "csv"}
    delimiter = node.value("delimiter", "str")
    if delimiter is not None:
        reader["delimiter"] = delimiter
    reader["header"] = node.value("with_header", "bool", False)
    columns: list[tuple[str, Any]] = []
    for field_node in node.indexed_children("input_fields"):
        columns.append((field_node.value("input_name", "str"), field_node.value("input_type", "str")))
        field_node.rest()
    text = node.value("input_fields_str", "str")
    if text:
        for item in filter(None, (p.strip() for p in text.split(";"))):
            name, _, kind = item.partition(":")
            columns.append((name.strip(), kind.strip().upper() or None))
    if columns:
        if not reader["header"]:
            reader["column_names"] = [name for name, _ in columns]
        types = {name: _CSV_TYPES[kind] for name, kind in columns if kind in _CSV_TYPES}
        if types:
            reader["column_types"] = types
        for name, kind in columns:
            if kind is not None and kind not in _CSV_TYPES:
                node.findings.not_converted.append(Finding(node.at("input_fields"), f"'{name}' is {kind}: list and map "
                                                           "columns are read from Parquet, not CSV"))
    return reader
