"""``feature_configs``: ``[[features.sparse]]`` and ``[[features.dense]]``.

An ``id_feature`` (and a ``lookup_feature`` with buckets) becomes a sparse feature with the same
buckets (``num_buckets``, ``hash_bucket_size``, ``vocab_list`` or ``vocab_dict`` as ``vocab``,
``vocab_file``, ``zch`` as a ``zch`` table); a ``raw_feature`` with ``boundaries`` a bucketized sparse feature; one without a
dense feature (``zscore`` normalizers as ``mean``/``std``). A ``sequence_feature``'s id features
(and raw features with ``boundaries``) become features named ``<sequence>__<feature>``
(TorchEasyRec's names): the members of a sequence group the model reads
(:mod:`tzrun_tools.convert.sequences`) go into ``[[features.sequence]]``, truncated to
``sequence_length``; the others stay sparse features, pooled as the ``pooling_encoder`` over
their group says. Its raw features without ``boundaries`` (and a ``sequence_raw_feature``
without) are dense sequences: ``[[features.sequence.dense]]`` of the group that reads them, with
their ``default_value`` and ``zscore`` normalizer; one that no sequence group reads is reported. Any other kind is left as a placeholder with the
reason. tzrec-run has no feature generator: every feature reads its column as it is (the column
of an ``expression: "user:x"`` is ``x``).
"""

from __future__ import annotations

from typing import Any, Optional

from tzrun_tools.convert.groups import Groups
from tzrun_tools.convert.nodes import Finding, Node
from tzrun_tools.convert.sequences import gather_sequences
from tzrun_tools.convert.train import constraints

__all__ = ["FeatureSet", "convert_features"]

_KINDS = ("id_feature", "raw_feature", "combo_feature", "lookup_feature", "match_feature", "sequence_feature",
          "expr_feature", "overlap_feature", "tokenize_feature", "custom_feature", "kv_dot_product",
          "bool_mask_feature", "combine_feature", "sequence_id_feature", "sequence_raw_feature",
          "sequence_combo_feature", "sequence_lookup_feature", "sequence_match_feature", "sequence_expr_feature",
          "sequence_overlap_feature", "sequence_tokenize_feature", "sequence_custom_feature",
          "sequence_kv_dot_product", "sequence_bool_mask_feature", "sequence_combine_feature")
_NO_FG = ("tzrec-run has no feature generator: compute '{name}' into a column and declare it in "
          "[[features.sparse]] or [[features.dense]] (tzrec-run help features)")
_SKIPPED = {
    "init_fn": "embeddings are initialized by TorchRec's default here",
    "use_mask": "feature masking has no equivalent",
    "weighted": "weighted 'id:weight' strings are not parsed: put the weights in a parallel column and set "
                "weight_column (tzrec-run help features)",
    "fg_encoded_default_value": "tzrec-run has no feature generator (FG): a missing value gives no id",
    "fg_value_type": "tzrec-run has no feature generator (FG)",
    "sequence_fields": "tzrec-run has no feature generator (FG)",
    "default_bucketize_value": "a value outside the buckets is a bad row here (data.on_bad_row), not this id",
    "asset_dir": "vocab_file is read relative to the working directory",
    "combiner": "tzrec-run has no feature generator (FG): the looked-up values must be the feature's column",
    "need_discrete": "tzrec-run has no feature generator (FG): the looked-up values must be the feature's column",
    "need_key": "tzrec-run has no feature generator (FG): the looked-up values must be the feature's column",
    "value_separator": "tzrec-run has no feature generator (FG): the looked-up values must be the feature's column",
    "autodis": "dense embeddings (AutoDis) have no equivalent: the value is fed as it is",
    "mlp": "dense embeddings (MLP) have no equivalent: the value is fed as it is",
}


class FeatureSet:
    """The converted features.

    Attributes:
        dense: the ``[[features.dense]]`` tables.
        sparse: the ``[[features.sparse]]`` tables.
        names: each TorchEasyRec feature name (and sequence name) -> the tzrec-run features it became.
        placeholders: ``(kind, name, reason)`` of each feature not converted.
    """

    def __init__(self) -> None:
        self.dense: list[dict[str, Any]] = []
        self.sparse: list[dict[str, Any]] = []
        self.names: dict[str, list[str]] = {}
        self.placeholders: list[tuple[str, str, str]] = []
        self.bucketized: list[str] = []  # bucketized by the feature generator: num_buckets written
        self.sequences: set[str] = set()  # the features that are sequences
        self.sequence: list[dict[str, Any]] = []  # the [[features.sequence]] groups
        self.dense_sequences: dict[str, tuple[Node, dict[str, Any]]] = {}  # [[features.sequence.dense]] to place
        self.lengths: dict[str, Optional[int]] = {}  # sequence feature -> its sequence_length
        self.untruncated: list[tuple[Node, int, list[str]]] = []  # (node, sequence_length, its features)

    def keep(self, used: set[str]) -> list[str]:
        """Keep only the features named in ``used``; returns the names of the others."""
        dropped = [f["name"] for f in self.dense + self.sparse + self.sequence if f["name"] not in used]
        self.dense = [f for f in self.dense if f["name"] in used]
        self.sparse = [f for f in self.sparse if f["name"] in used]
        self.sequence = [f for f in self.sequence if f["name"] in used]
        return dropped

    def agree_on_pooling(self, findings: Any) -> None:
        """Give the features of a table shared with a pooled sequence the sequence's pooling (tzrec-run's
        features of one table must agree on it; for one id per row, sum and mean are the same)."""
        by_table: dict[str, list[dict[str, Any]]] = {}
        for feature in self.sparse:
            by_table.setdefault(feature.get("table", f"{feature['name']}_emb"), []).append(feature)
        for table, features in by_table.items():
            sequences = {f.get("pooling", "sum") for f in features if f["name"] in self.sequences}
            if len(sequences) != 1 or len({f.get("pooling", "sum") for f in features}) == 1:
                continue
            pooling = sequences.pop()
            changed = [f for f in features if f.get("pooling", "sum") != pooling]
            for feature in changed:
                feature["pooling"] = pooling
                if pooling == "sum":
                    del feature["pooling"]
            findings.notes.append(Finding("feature_configs", (
                f"{', '.join(f['name'] for f in changed)}: pooled with {pooling} like the sequences sharing table "
                f"'{table}' (the features of a table agree on it here; for one id per row it is the same)")))

    def tree(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.dense:
            out["dense"] = self.dense
        if self.sparse:
            out["sparse"] = self.sparse
        if self.sequence:
            out["sequence"] = self.sequence
        return out


class _Sequence:
    """The sequence a sub-feature belongs to (or a ``sequence_*_feature``'s own)."""

    def __init__(self, prefix: str, delim: Optional[str], length: Optional[int]) -> None:
        self.prefix, self.delim, self.length = prefix, delim, length


def convert_features(root: Node, groups: Groups, encoded: bool) -> FeatureSet:
    """Convert ``feature_configs`` of ``root`` (the pipeline config).

    Args:
        root: the pipeline config.
        groups: its feature groups (for the pooling of sequences).
        encoded: the input holds the feature generator's output (``fg_mode: FG_NONE``, the
            default): ids already bucketized, values already normalized.
    """
    out = FeatureSet()
    for item in root.indexed_children("feature_configs"):
        kind = item.which(_KINDS)
        node = item.child(kind) if kind is not None else None
        item.rest()
        if node is None:
            continue
        if kind == "sequence_feature":
            _sequence_feature(node, groups, out, encoded)
        elif kind in ("id_feature", "raw_feature", "lookup_feature", "sequence_id_feature", "sequence_raw_feature"):
            seq = None
            if kind.startswith("sequence_") or (kind != "lookup_feature" and node.has("sequence_length")):
                # TorchEasyRec >= 1.0.3: an id or raw feature with sequence_length is a sequence
                seq = _Sequence("", node.value("sequence_delim", "str", ";"), node.value("sequence_length", "int"))
                kind = kind.replace("sequence_", "")
            if seq is not None and kind == "raw_feature" and not node.has("boundaries"):
                names = _dense_sequence(node, out, seq, encoded)
            else:
                names = _feature(kind, node, out, groups, seq, encoded)
            if seq is not None:
                _not_truncated(node, seq, names, out)
        else:
            _placeholder(kind, node, out, _NO_FG)
    gather_sequences(groups, out, root.findings, encoded)
    for dense_name, (dense_node, _) in out.dense_sequences.items():
        _placeholder("sequence raw_feature", dense_node, out, "a sequence of values in no sequence group the model reads: "
                     "it is a [[features.sequence.dense]] of a group here (a sequence_groups entry with an "
                     "encoder, or a SEQUENCE group of multi_tower_din)", dense_name)
    for node, length, names in out.untruncated:
        if any(n in out.sequences for n in names):
            node.note("sequence_length", f"sequences are not truncated to {length} ids here: every id of a row is "
                                         "pooled")
    out.agree_on_pooling(root.findings)
    hashed = [f["name"] for f in out.sparse if "hash_bucket_size" in f]
    if encoded and out.bucketized:
        root.note("feature_configs", f"{', '.join(out.bucketized)}: the input holds the feature generator's ids "
                                     "(fg_mode FG_NONE), so each is num_buckets = its table size")
    if hashed:
        root.note("feature_configs", f"{', '.join(hashed)}: hashed with FNV-1a 64 here, not the feature generator's "
                                     "hash: as many buckets, other ids (tzrec-run help features)")
    return out


def _not_truncated(node: Node, seq: _Sequence, names: list[str], out: FeatureSet) -> None:
    """Remember the sequence_length of ``names``; noted as not applied where they stay pooled."""
    out.lengths.update((n, seq.length) for n in names)
    if seq.length:
        out.untruncated.append((node, seq.length, names))


def _placeholder(kind: str, node: Node, out: FeatureSet, reason: str, name: Optional[str] = None) -> None:
    name = name or str((node.fields.get("feature_name") or node.fields.get("sequence_name") or ["?"])[-1])
    reason = reason.replace("{name}", name)
    node.used.update(node.fields)
    node.findings.not_converted.append(Finding(node.path, reason))
    out.placeholders.append((kind, name, reason))


def _sequence_feature(node: Node, groups: Groups, out: FeatureSet, encoded: bool) -> None:
    name = node.value("sequence_name", "str", "")
    seq = _Sequence(f"{name}__", node.value("sequence_delim", "str", ";"), node.value("sequence_length", "int"))
    node.skip("sequence_pk", "tzrec-run has no feature generator (FG): each sub-feature reads its own column")
    members: list[str] = []
    for item in node.indexed_children("features"):
        kind = item.which(_KINDS)
        child = item.child(kind) if kind is not None else None
        item.rest()
        if child is None:
            continue
        if kind == "id_feature" or (kind == "raw_feature" and child.has("boundaries")):
            members += _feature(kind, child, out, groups, seq, encoded)
        elif kind == "raw_feature":
            members += _dense_sequence(child, out, seq, encoded)
        else:
            _placeholder(f"sequence {kind}", child, out, "only the id and raw features of a sequence are converted: compute "
                         "'{name}' into a list column and declare it in [[features.sparse]] (tzrec-run help features)",
                         f"{seq.prefix}{child.value('feature_name', 'str', '?')}")
    node.rest()
    _not_truncated(node, seq, members, out)
    out.names[name] = members


def _feature(kind: str, node: Node, out: FeatureSet, groups: Groups, seq: Optional[_Sequence],
             encoded: bool) -> list[str]:
    """Convert one id, raw or lookup feature; returns its tzrec-run name (or nothing)."""
    name = (seq.prefix if seq else "") + node.value("feature_name", "str", "")
    if node.has("dynamicemb"):
        _placeholder(kind, node, out, "dynamicemb: dynamic embedding tables have no equivalent; declare the feature "
                                      "with zch (collision-free ids, tzrec-run help zch) or hash_bucket_size instead", name)
        return []
    if node.value("stub_type", "bool"):
        _placeholder(kind, node, out, "a stub feature only feeds the feature generator, which tzrec-run has not", name)
        return []
    if seq is not None and name in groups.refused:  # a group's query features are plain id features
        _placeholder(kind, node, out, groups.refused[name], name)
        return []
    table: dict[str, Any] = {"name": name}
    _column(kind, node, table, name, seq, encoded)
    bucketized = any(node.has(f) for f in ("hash_bucket_size", "num_buckets", "vocab_list", "vocab_dict", "vocab_file"))
    if (kind == "raw_feature" or (kind == "lookup_feature" and not bucketized)) and not node.has("boundaries"):
        return _dense(kind, node, out, table)
    if encoded:
        size = _encoded_size(node)
        if size is None:
            _placeholder(kind, node, out, "the table size is that of its vocab_file: declare the feature by hand with "
                                          "num_buckets", name)
            return []
        table["num_buckets"] = size
        if not node.has("num_buckets"):
            out.bucketized.append(name)
    elif kind == "raw_feature" or (kind == "lookup_feature" and not bucketized):
        table["boundaries"] = node.values("boundaries", "float")
        node.skip("normalizer", "the boundaries apply to the column as it is here, not to a normalized value")
    elif not _ids(node, table):
        _placeholder(kind, node, out, "set none of hash_bucket_size, num_buckets, vocab_list, vocab_dict, "
                                      "vocab_file: declare its ids by hand", name)
        return []
    if not _embedding(node, table, groups.pooling.get(name) if seq is not None else None, seq):
        _placeholder(kind, node, out, "no embedding_dim: declare it by hand", name)
        return []
    out.sparse.append(table)
    out.names[name] = [name]
    if seq is not None:
        out.sequences.add(name)
    return [name]


def _encoded_size(node: Node) -> Optional[int]:
    """The table size of a feature whose input holds the feature generator's ids."""
    for field in ("hash_bucket_size", "num_buckets"):
        if node.has(field):
            return node.value(field, "int")
    if node.has("boundaries"):
        return len(node.values("boundaries", "float")) + 1
    if node.has("vocab_list"):
        given = node.has("default_bucketize_value")  # then no default and <OOV> entries are added
        node.used.add("default_bucketize_value")
        return len(node.values("vocab_list", "str")) + (0 if given else 2)
    if node.has("vocab_dict"):
        ids = [entry.value("value", "int", 0) for entry in node.indexed_children("vocab_dict")]
        return max(ids) + 1 if ids else None
    return None


def _column(kind: str, node: Node, table: dict[str, Any], name: str, seq: Optional[_Sequence], encoded: bool) -> None:
    if encoded:  # the column is the feature's name, its values the feature generator's output
        for field in ("expression", "map", "key", "default_value", "normalizer"):
            node.values(field, "str")
        return
    if kind == "lookup_feature":
        for field in ("map", "key"):
            node.values(field, "str")
        node.note("map", f"the feature generator's lookup is not run: column '{name}' must hold the looked-up values")
        return
    expression = node.value("expression", "str")  # a sequence's sub-feature reads column <sequence>__<name>
    if expression and seq is None:
        column = expression.split(":", 1)[-1]
        if column != name:
            table["column"] = column


#: TorchEasyRec's ``ZeroCollisionHash`` eviction policies (its oneof) -> tzrec-run's
_EVICTION_POLICIES = {"lfu": "lfu", "lru": "lru", "distance_lfu": "distance_lfu"}


def _zch(node: Node, table: dict[str, Any]) -> None:
    """``zch { zch_size eviction_interval lfu|lru|distance_lfu threshold_filtering_func }`` as a
    ``zch`` table; the filter, a Python lambda string TorchEasyRec evaluates, is reported."""
    zch = node.child("zch")
    if zch is None:
        return
    block: dict[str, Any] = {"size": zch.value("zch_size", "int")}
    if zch.has("eviction_interval"):
        block["eviction_interval"] = zch.value("eviction_interval", "int")
    policy = zch.which(_EVICTION_POLICIES)
    if policy is not None:
        options = zch.child(policy)
        block["eviction_policy"] = {"type": _EVICTION_POLICIES[policy]}
        if options is not None and options.has("decay_exponent"):
            block["eviction_policy"]["decay_exponent"] = options.value("decay_exponent", "float")
        if options is not None:
            options.rest()
    zch.skip("threshold_filtering_func", "a Python lambda string, which tzrec-run never evaluates: set "
                                         "zch.admission = { type = \"threshold\", min_count = N } (or a plugin's filter)")
    zch.rest()
    table["zch"] = block


def _ids(node: Node, table: dict[str, Any]) -> bool:
    """How a value becomes an id: ``False`` when no field says."""
    if node.has("zch"):
        for field in ("hash_bucket_size", "num_buckets", "vocab_list", "vocab_dict", "vocab_file"):
            node.skip(field, "zch is set too; TorchEasyRec uses that one")
        _zch(node, table)
        return True
    given = [f for f in ("hash_bucket_size", "num_buckets", "vocab_list", "vocab_dict", "vocab_file") if node.has(f)]
    for extra in given[1:]:
        node.skip(extra, f"{given[0]} is set too; TorchEasyRec uses that one")
    if not given:
        return False
    field = given[0]
    if field in ("hash_bucket_size", "num_buckets"):
        table[field] = node.value(field, "int")
    elif field == "vocab_file":
        table["vocab_file"] = node.value(field, "str")
    elif field == "vocab_list":
        table["vocab"] = node.values(field, "str")
    else:
        vocab = _vocab_dict(node)
        if vocab is None:
            return False
        table["vocab"] = vocab
    if field.startswith("vocab"):
        node.note(field, "here vocab[i] is id i + 1 and any other token id 0 (TorchEasyRec: default_value 0, "
                         "<OOV> 1, its own ids from 2): the same rows, numbered otherwise")
    return True


def _vocab_dict(node: Node) -> Optional[list[str]]:
    pairs: list[tuple[int, str]] = []
    for entry in node.indexed_children("vocab_dict"):
        pairs.append((entry.value("value", "int", 0), entry.value("key", "str", "")))
        entry.rest()
    ids = [i for i, _ in pairs]
    if len(set(ids)) != len(ids):
        node.findings.not_converted.append(Finding(node.at("vocab_dict"), "several tokens share an id: a vocab here "
                                                   "gives each token its own id; write the feature by hand"))
        return None
    return [token for _, token in sorted(pairs)]


def _embedding(node: Node, table: dict[str, Any], pooling: Optional[str], seq: Optional[_Sequence]) -> bool:
    dim = node.value("embedding_dim", "int")
    if not dim:
        return False
    table["embedding_dim"] = dim
    name = node.value("embedding_name", "str")
    if name:
        table["table"] = name
    own = node.value("pooling", "str", "sum")
    pooling = pooling or own
    if pooling not in ("sum", "mean"):
        node.skip_value(node.at("pooling"), pooling, "'sum' or 'mean'")
    elif pooling != "sum":
        table["pooling"] = pooling
    separator = seq.delim if seq and seq.delim else node.value("separator", "str")
    if seq and node.has("separator"):
        node.skip("separator", "the sequence's sequence_delim separates the ids of a row")
    if separator:
        table["separator"] = separator
    if node.value("trainable", "bool", True) is False:
        table["trainable"] = False
    limits = node.child("embedding_constraints")
    if limits is not None:
        converted = constraints(limits)
        if converted:
            table["embedding_constraints"] = converted
    _common(node)
    return True


def _common(node: Node) -> None:
    """The fields every kind shares that tzrec-run has no use for, and the rest reported."""
    if node.has("value_dim"):
        node.values("value_dim", "int")
        node.note("value_dim", "a row's values are read from its column as they are (a list column, or a string "
                               "split on separator)")
    data_type = node.value("data_type", "str", "FP32")
    if data_type != "FP32":
        node.skip("data_type", f"{data_type}: embedding tables are float32 here")
    if "default_value" not in node.used and node.value("default_value", "str"):
        node.skip("default_value", "a missing value gives no id here; fill the column instead")
    for field in ("sequence_length", "sequence_delim"):
        node.used.add(field)
    for field, reason in _SKIPPED.items():
        if field not in node.used:
            node.skip(field, reason)
    node.rest()


def _dense_sequence(node: Node, out: FeatureSet, seq: _Sequence, encoded: bool) -> list[str]:
    """A raw feature of a sequence without boundaries: a dense sequence, placed into the group
    that reads it by :func:`~tzrun_tools.convert.sequences.gather_sequences`."""
    name = seq.prefix + node.value("feature_name", "str", "")
    table: dict[str, Any] = {"name": name, "column": name}
    _column("raw_feature", node, table, name, seq, encoded)
    names = _dense("raw_feature", node, out, table, sequence=True)
    if names:
        out.dense.remove(table)
        if seq.delim:
            table["separator"] = seq.delim  # the group's, taken off when it is placed
        out.dense_sequences[name] = (node, table)
        out.sequences.add(name)
    return names


def _dense(kind: str, node: Node, out: FeatureSet, table: dict[str, Any], sequence: bool = False) -> list[str]:
    name = table["name"]
    if node.value("value_dim", "int", 1) > 1:
        _placeholder(kind, node, out, "value_dim > 1: dense features hold one value each here; split it into "
                                      "one column per value" + (" (a dense sequence per value)" if sequence else ""),
                     name)
        return []
    encoded = "default_value" in node.used  # the feature generator's output: its defaults and normalizer applied
    field = "fg_encoded_default_value" if encoded else "default_value"
    default = node.value(field, "str", "0")
    try:
        fill = float(default or 0)
    except ValueError:
        node.skip_value(node.at(field), default, "a number")
        fill = 0.0
    if fill:
        table["fill_value"] = fill
    if not encoded:
        _normalizer(node, table)
    for field in ("embedding_dim", "embedding_name", "pooling", "separator", "trainable", "embedding_constraints"):
        if sequence and field == "separator":
            node.skip(field, "the sequence's sequence_delim separates the values of a row")
            continue
        node.skip(field, "used only with boundaries (a bucketized feature); this one is dense")
    node.used.add("value_dim")
    _common(node)
    out.dense.append(table)
    out.names[name] = [name]
    return [name]


def _normalizer(node: Node, table: dict[str, Any]) -> None:
    text = node.value("normalizer", "str")
    if not text:
        return
    options = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    if options.get("method") == "zscore":
        try:
            table["mean"] = float(options.get("mean", 0.0))
            table["std"] = float(options.get("standard_deviation", 1.0))
            return
        except ValueError:
            pass
    node.skip("normalizer", f"'{text}': the value is fed without it; precompute it into the column, or use "
                            "log1p, mean and std (tzrec-run help features)")
