"""TorchEasyRec's sequence groups as ``[[features.sequence]]`` groups.

A sequence group that the model reads (:attr:`Groups.sequences`: a ``SEQUENCE`` feature group of
``multi_tower_din``, or a ``sequence_groups`` entry with a ``pooling_encoder`` (mean) or a
``din_encoder``) becomes one ``[[features.sequence]]`` group of the same name:

* its sequence features (the sub-features of a ``sequence_feature``, named
  ``<sequence>__<feature>``, and ``sequence_id_feature``/``sequence_raw_feature`` with
  ``boundaries``) become its ``[[features.sequence.features]]``, with their ids, width and table;
* ``max_len`` is their ``sequence_length`` (here a longer sequence keeps its last ``max_len`` ids,
  a list's end being the most recent: the note this writes says so);
* its other features (the candidate's, which a DIN attends with) become its ``query``, one per
  sequence feature and in order, as TorchEasyRec pairs them.

Each converted feature name of a member then stands for the group's name, so a model that reads
the TorchEasyRec group reads the sequence group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from tzrun_tools.convert.groups import Groups, SequenceGroupSpec
from tzrun_tools.convert.nodes import Finding, Findings

if TYPE_CHECKING:
    from tzrun_tools.convert.features import FeatureSet

__all__ = ["gather_sequences"]

#: Keys of a sparse feature that a sequence feature has not (a sequence is not pooled here).
_POOLED_ONLY = ("pooling", "separator", "weight_column")


def gather_sequences(groups: Groups, feats: "FeatureSet", findings: Findings) -> None:
    """Move the members of each sequence group the model reads into ``feats.sequence``."""
    taken: dict[str, str] = {}
    for spec in groups.sequences.values():
        table = _group(spec, feats, taken, findings)
        if table is None:
            continue
        members = [f["name"] for f in table["features"]]
        feats.sparse = [f for f in feats.sparse if f["name"] not in members]
        feats.sequences.difference_update(members)
        feats.names.update((m, [spec.name]) for m in members)
        taken.update((m, spec.name) for m in members)
        feats.sequence.append(table)


def _group(spec: SequenceGroupSpec, feats: "FeatureSet", taken: dict[str, str],
           findings: Findings) -> Optional[dict[str, Any]]:
    """The ``[[features.sequence]]`` table of ``spec`` (``None`` when it has no sequence feature)."""
    where = f"model_config.feature_groups: sequence group '{spec.name}'"
    sparse = {f["name"]: f for f in feats.sparse}
    members = [n for n in spec.features if n in feats.sequences and n in sparse]
    twice = [n for n in members if n in taken]
    if twice:
        findings.not_converted.append(Finding(where, (
            f"{', '.join(twice)} also in sequence group '{taken[twice[0]]}': a sequence feature belongs to one "
            "group here; declare a copy under another name")))
        members = [n for n in members if n not in twice]
    if not members:
        return None
    if spec.name in sparse or any(spec.name == f["name"] for f in feats.dense):
        findings.not_converted.append(Finding(where, (
            f"a feature is named '{spec.name}' too: a sequence group and a feature need different names here; "
            "rename the group")))
        return None
    table: dict[str, Any] = {"name": spec.name}
    _max_len(spec, members, feats, table, findings, where)
    separators = list(dict.fromkeys(sparse[n]["separator"] for n in members if "separator" in sparse[n]))
    if separators:
        table["separator"] = separators[0]
    if len(separators) > 1:
        findings.not_converted.append(Finding(where, (
            f"its features split their ids on {', '.join(repr(s) for s in separators)}: one separator per group "
            f"here ({separators[0]!r} written); store the columns with one")))
    query = [n for n in spec.features if n not in feats.sequences and n in sparse and n not in members]
    if spec.encoder is None or spec.encoder["type"] == "target_attention":
        _query(query, members, table, findings, where)
    table["features"] = [{"name": n, "column": sparse[n].get("column", n),
                          **{k: v for k, v in sparse[n].items() if k not in ("name", "column", *_POOLED_ONLY)}}
                         for n in members]
    return table


def _max_len(spec: SequenceGroupSpec, members: list[str], feats: "FeatureSet", table: dict[str, Any],
             findings: Findings, where: str) -> None:
    lengths = sorted({feats.lengths.get(n) or 0 for n in members})
    if lengths[-1] == 0:
        findings.not_converted.append(Finding(where, (
            "no sequence_length: TorchEasyRec keeps every id; set max_len of the group to the longest sequence "
            "(or the number of most recent ids to keep)")))
        return
    table["max_len"] = max(lengths)
    if len(lengths) > 1:
        findings.notes.append(Finding(where, (
            f"its features' sequence_length differ ({', '.join(str(n) for n in lengths)}): the group keeps "
            f"{max(lengths)} ids of each")))
    findings.notes.append(Finding(where, (
        f"max_len = {max(lengths)} (sequence_length): a longer sequence keeps its last {max(lengths)} ids here, "
        "a list's end being the most recent; store each sequence oldest first")))


def _query(query: list[str], members: list[str], table: dict[str, Any], findings: Findings, where: str) -> None:
    if not query:
        findings.not_converted.append(Finding(where, (
            "no candidate features to attend with: add the candidate's features (one per sequence feature, in "
            "order) as the group's query")))
    elif len(query) != len(members):
        findings.not_converted.append(Finding(where, (
            f"{len(query)} query features ({', '.join(query)}) for {len(members)} sequence features: here each "
            "sequence feature has one query feature, in order; set the group's query by hand")))
    else:
        table["query"] = query
