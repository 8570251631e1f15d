"""``model_config.feature_groups``: which features each group reads, and how sequences are pooled.

TorchEasyRec's models read their inputs by group (``deep``, ``wide``, ``fm``, a DSSM tower's
``input``); tzrec-run's models read every feature (DSSM: the features each tower names). The
groups are read first, because a sequence's pooling is set by the encoder over its group.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from tzrun.tools.convert.nodes import Node

__all__ = ["Group", "Groups", "read_groups"]

_ENCODERS = ("din_encoder", "simple_attention", "pooling_encoder", "multi_window_din_encoder",
             "self_attention_encoder")


class Group(NamedTuple):
    """One feature group: its name, type (``DEEP``, ``WIDE``, ``SEQUENCE``, ...) and features,
    the features of its sequence groups included."""

    name: str
    type: str
    features: list[str]


class Groups:
    """The feature groups, and the pooling of each sequence feature an encoder pools.

    Attributes:
        groups: the groups by name, in file order.
        pooling: feature name -> ``"sum"`` or ``"mean"``, set by a ``pooling_encoder``.
        refused: feature name -> why it cannot be converted (an encoder with no equivalent).
    """

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.pooling: dict[str, str] = {}
        self.refused: dict[str, str] = {}

    def features(self, name: Optional[str] = None) -> list[str]:
        """The features of group ``name`` (of every group when ``None``), each once, in order."""
        chosen = self.groups.values() if name is None else [self.groups[name]] if name in self.groups else []
        return list(dict.fromkeys(f for group in chosen for f in group.features))


def read_groups(model: Node) -> Groups:
    """Read ``feature_groups`` of ``model`` (``model_config``)."""
    out = Groups()
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
        for encoder in node.indexed_children("sequence_encoders"):
            _encoder(encoder, sequences, out)
        node.skip("embedding_name_suffix", "independent tables per group have no equivalent: set table on the "
                                           "features instead")
        node.rest()
        out.groups[name] = Group(name, kind, features)
    return out


def _encoder(node: Node, sequences: dict[str, list[str]], out: Groups) -> None:
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
    if kind != "pooling_encoder":
        encoder.used.update(encoder.fields)
        reason = (f"the {kind} over sequence group '{source}' has no equivalent (tzrec-run pools a sequence with "
                  "sum or mean)")
        node.skip(kind, reason)
        out.refused.update((f, reason) for f in members)
        return
    pooling = encoder.value("pooling_type", "str", "mean")
    if encoder.value("max_seq_length", "int", 0):
        encoder.skip("max_seq_length", "sequences are not truncated here; every id of a row is pooled")
    encoder.values("name", "str")  # a label only: each sequence feature is pooled on its own here
    encoder.rest()
    if pooling not in ("sum", "mean"):
        encoder.skip_value(encoder.at("pooling_type"), pooling, "'sum' or 'mean'")
        return
    out.pooling.update((f, pooling) for f in members)
