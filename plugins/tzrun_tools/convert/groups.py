"""``model_config.feature_groups``: which features each group reads, and how sequences are encoded.

TorchEasyRec's models read their inputs by group (``deep``, ``wide``, ``fm``, a DSSM tower's
``input``); tzrec-run's models read every feature (DSSM: the features each tower names). The
groups are read first, because a sequence's encoding is set by the encoder over its group.

For a model that reads sequence groups (``dssm``, ``dssm_v2``, ``mmoe``, ``ple``, ``dbmtl``, ``pepnet``, ``multi_tower_din``), a ``SEQUENCE``
feature group and each ``sequence_groups`` entry with an encoder become a ``[[features.sequence]]``
group (:mod:`tzrun_tools.convert.sequences`) with a ``[[model.sequence_encoders]]`` table:
``pooling_encoder`` (mean) as ``mean``, ``din_encoder`` as ``target_attention``,
``multi_window_din_encoder`` as ``multi_window_din``, ``simple_attention`` as itself and
``self_attention_encoder`` as ``self_attention_tzrec`` (the encoders that attend with the candidate
only where the model's towers see it); otherwise a sequence is pooled as a bag, as before.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from tzrun_tools.convert.nodes import Node

__all__ = ["Group", "SequenceGroupSpec", "Groups", "read_groups", "attention_mlp"]

#: The models that read ``[[features.sequence]]`` groups, and whether their towers may attend
#: with a query (``target_attention``).
SEQUENCE_MODELS = {"dssm": False, "dssm_v2": False, "mmoe": True, "ple": True, "dbmtl": True, "pepnet": True, "multi_tower_din": True,
                   "tdm": True}

_ENCODERS = ("din_encoder", "simple_attention", "pooling_encoder", "multi_window_din_encoder",
             "self_attention_encoder")


class Group(NamedTuple):
    """One feature group: its name, type (``DEEP``, ``WIDE``, ``SEQUENCE``, ...) and features,
    the features of its sequence groups included."""

    name: str
    type: str
    features: list[str]


class SequenceGroupSpec(NamedTuple):
    """A TorchEasyRec sequence group: its name, its features (sequence features and, for a query,
    candidate features), the ``[[model.sequence_encoders]]`` table of its encoder (``None``:
    a ``SEQUENCE`` feature group, which a DIN tower reads), the encoder's ``max_seq_length``
    (0: none; the encoder keeps a row's first ``max_seq_length`` ids), ``query``: whether the
    group needs the candidate's features (``False`` for MIND's history, which its capsules read
    without one), and ``cut_by``: what keeps those ids, as the notes say."""

    name: str
    features: list[str]
    encoder: Optional[dict[str, Any]]
    max_seq_length: int = 0
    query: bool = True
    cut_by: str = "its encoder's max_seq_length"


class Groups:
    """The feature groups, and the pooling of each sequence feature an encoder pools.

    Attributes:
        groups: the groups by name, in file order.
        pooling: feature name -> ``"sum"`` or ``"mean"``, set by a ``pooling_encoder``.
        refused: feature name -> why it cannot be converted (an encoder with no equivalent).
        sequences: the sequence groups that become ``[[features.sequence]]`` groups, by name.
    """

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.pooling: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        self.sequences: dict[str, SequenceGroupSpec] = {}

    def features(self, name: Optional[str] = None) -> list[str]:
        """The features of group ``name`` (of every group when ``None``), each once, in order."""
        chosen = self.groups.values() if name is None else [self.groups[name]] if name in self.groups else []
        return list(dict.fromkeys(f for group in chosen for f in group.features))


def read_groups(model: Node, model_name: Optional[str] = None) -> Groups:
    """Read ``feature_groups`` of ``model`` (``model_config``), whose model oneof is ``model_name``."""
    out = Groups()
    attends = SEQUENCE_MODELS.get(model_name or "")
    for node in model.indexed_children("feature_groups"):
        name = node.value("group_name", "str", "")
        features = node.values("feature_names", "str")
        sequences: dict[str, list[str]] = {}
        for seq in node.indexed_children("sequence_groups"):
            seq_name = seq.value("group_name", "str", "")
            sequences[seq_name] = seq.values("feature_names", "str")
            features += sequences[seq_name]
            seq.skip("embedding_name_suffix", "independent tables per group have no equivalent: set table on the "
                                              "features instead")
            seq.rest()
        kind = node.value("group_type", "str", "DEEP")
        if kind in ("SEQUENCE", "JAGGED_SEQUENCE"):
            sequences[name] = node.values("feature_names", "str")
            if kind == "SEQUENCE" and model_name in ("multi_tower_din", "mind"):
                out.sequences[name] = SequenceGroupSpec(name, sequences[name], None, query=model_name != "mind")
            elif kind == "SEQUENCE" and model_name == "tdm":  # its windows read a row's first sum(windows_len) ids
                out.sequences[name] = SequenceGroupSpec(name, sequences[name], None, sum(_tdm_windows(model)),
                                                        cut_by="tdm's multiwindow_din (its windows counted from a "
                                                               "row's first id)")
        for encoder in node.indexed_children("sequence_encoders"):
            _encoder(encoder, sequences, out, attends)
        node.skip("embedding_name_suffix", "independent tables per group have no equivalent: set table on the "
                                           "features instead")
        node.rest()
        out.groups[name] = Group(name, kind, features)
    return out


def _encoder(node: Node, sequences: dict[str, list[str]], out: Groups, attends: Optional[bool]) -> None:
    """One ``sequence_encoders`` entry. ``attends``: the model reads sequence groups and may attend
    with a query (``None``: it reads no sequence group, so a sequence is pooled as a bag)."""
    kind = node.which(_ENCODERS)
    encoder = node.child(kind) if kind is not None else None
    node.rest()
    if kind is None:
        return
    encoder = encoder or Node({}, node.at(kind), node.findings)
    source = encoder.value("input", "str", "")
    if not source and len(sequences) == 1:  # TorchEasyRec takes the group's only sequence
        source = next(iter(sequences))
    members = sequences.get(source, [])
    cut = encoder.value("max_seq_length", "int", 0)  # a sequence group's max_len and keep (convert.sequences)
    table = _ATTENDING[kind](encoder) if kind in _ATTENDING and attends else None
    if kind == "self_attention_encoder" and attends is not None:
        table = _self_attention(encoder)
    if table is not None:
        if kind == "multi_window_din_encoder":  # its windows read a row's first sum(windows_len) ids
            cut = sum(table["window_lengths"])
        out.sequences[source] = SequenceGroupSpec(source, members, table, cut)
        return
    if kind != "pooling_encoder":
        encoder.used.update(encoder.fields)
        reason = (f"the {kind} over sequence group '{source}' has no equivalent here" + (
            " (tzrec-run pools a sequence with sum or mean)" if attends is None else
            " (this model's towers never see the candidate: they encode a sequence with mean, self_attention or "
            "self_attention_tzrec)"))
        node.skip(kind, reason)
        out.refused.update((f, reason) for f in members)
        return
    pooling = encoder.value("pooling_type", "str", "mean")
    grouped = pooling == "mean" and attends is not None
    if cut and not grouped:
        encoder.skip("max_seq_length", "sequences are not truncated here; every id of a row is pooled")
    encoder.values("name", "str")  # a label only: each sequence feature is pooled on its own here
    encoder.rest()
    if pooling not in ("sum", "mean"):
        encoder.skip_value(encoder.at("pooling_type"), pooling, "'sum' or 'mean'")
        return
    out.pooling.update((f, pooling) for f in members)
    if grouped:
        out.sequences[source] = SequenceGroupSpec(source, members, {"type": "mean"}, cut)


def _tdm_windows(model: Node) -> list[int]:
    """``tdm.multiwindow_din.windows_len`` of ``model`` (``model_config``), read without using it
    (the model's conversion reports it)."""
    tdm = model.fields.get("tdm", [{}])[-1]
    windin = tdm.get("multiwindow_din", [{}])[-1] if isinstance(tdm, dict) else {}
    windows = windin.get("windows_len", []) if isinstance(windin, dict) else []
    return [int(w) for w in windows if isinstance(w, int) or str(w).isdigit()]


def attention_mlp(node: Node, name: str = "attn_mlp") -> dict[str, Any]:
    """The options of an attention MLP message (``attn_mlp``): ``attention_hidden_units`` and,
    for ``activation: "Dice"``, ``attention_activation``; its other fields are reported."""
    table: dict[str, Any] = {}
    attn = node.child(name)
    if attn is None:
        return table
    units = attn.values("hidden_units", "int")
    if units:
        table["attention_hidden_units"] = units
    activation = attn.value("activation", "str", "nn.ReLU").strip()
    if activation == "Dice":
        table["attention_activation"] = "dice"
    elif activation != "nn.ReLU":
        attn.skip("activation", f"an attention MLP's activation is relu or dice (Dice) here, not {activation}")
    if any(attn.values("dropout_ratio", "float")):
        attn.skip("dropout_ratio", "dropout has no equivalent in tzrec-run's attention MLPs")
    for flag, reason in (("use_bn", "batch normalization"), ("use_ln", "layer normalization")):
        if attn.value(flag, "bool", False):
            attn.skip(flag, f"{reason} has no equivalent in tzrec-run's attention MLPs")
    if attn.value("bias", "bool", True) is False:
        attn.skip("bias", "tzrec-run's attention MLP layers always have a bias")
    attn.rest()
    return table


def _din_encoder(encoder: Node) -> dict[str, Any]:
    """A ``din_encoder`` as a ``target_attention`` encoder table."""
    table: dict[str, Any] = {"type": "target_attention", **attention_mlp(encoder)}
    encoder.values("name", "str")  # a label only
    encoder.rest()
    return table


def _multi_window_din(encoder: Node) -> dict[str, Any]:
    """A ``multi_window_din_encoder`` as a ``multi_window_din`` encoder table."""
    windows = encoder.values("windows_len", "int")
    table: dict[str, Any] = {"type": "multi_window_din", "window_lengths": windows, **attention_mlp(encoder)}
    encoder.values("name", "str")
    encoder.rest()
    return table


def _simple_attention(encoder: Node) -> dict[str, Any]:
    """A ``simple_attention`` encoder table."""
    encoder.values("name", "str")
    encoder.rest()
    return {"type": "simple_attention"}


def _self_attention(encoder: Node) -> dict[str, Any]:
    """A ``self_attention_encoder`` as a ``self_attention_tzrec`` encoder table (TorchEasyRec's
    defaults written out: ours for ``num_heads`` is the same, 8)."""
    table: dict[str, Any] = {"type": "self_attention_tzrec",
                             "attention_dim": encoder.value("multihead_attn_dim", "int", 512),
                             "num_heads": encoder.value("num_heads", "int", 8)}
    dropout = encoder.value("dropout", "float", 0.0)
    if dropout:
        table["dropout"] = dropout
    encoder.values("name", "str")
    encoder.rest()
    return table


#: the encoders that attend with the candidate, for a model whose towers see it
_ATTENDING = {"din_encoder": _din_encoder, "multi_window_din_encoder": _multi_window_din,
              "simple_attention": _simple_attention}
