"""TorchEasyRec's sequence groups as ``[[features.sequence]]`` groups.

A sequence group that the model reads (:attr:`Groups.sequences`: a ``SEQUENCE`` feature group of
``multi_tower_din``, or a ``sequence_groups`` entry with an encoder that has an equivalent)
becomes one ``[[features.sequence]]`` group of the same name:

* its sequence features (the sub-features of a ``sequence_feature``, named
  ``<sequence>__<feature>``, and ``sequence_id_feature``/``sequence_raw_feature`` with
  ``boundaries``) become its ``[[features.sequence.features]]``, with their ids, width and table;
* ``max_len`` and ``keep`` say what TorchEasyRec keeps of a row (:func:`truncation`): with an
  encoder's ``max_seq_length`` its first ``max_seq_length`` ids (``keep = "first"``); with
  ``fg_mode: FG_NONE`` and none, every id (``keep = "all"``, ``max_len`` the features'
  ``sequence_length``: a longer row is a bad row here, never cut); under a feature generator,
  its first ``sequence_length`` ids (``keep = "first"``). A ``multi_window_din_encoder`` reads
  a row's first ``sum(windows_len)`` ids, its windows counted from the first id: its group keeps
  those (``keep = "first"``, so the windows count from the same end). The note this writes says which;
* its dense sequences (a ``sequence_feature``'s ``raw_feature`` without ``boundaries``, a
  ``sequence_raw_feature`` without) become its ``[[features.sequence.dense]]``: their values
  follow the embeddings in the group's ``[B, max_len, D]`` view, as TorchEasyRec concatenates
  them, and they pair with no query feature (the query is zero-padded, as TorchEasyRec's DIN
  encoder pads it);
* its other features (the candidate's, which a DIN attends with) become its ``query``, one per
  id sequence feature and in order, as TorchEasyRec pairs them.

Each converted feature name of a member then stands for the group's name, so a model that reads
the TorchEasyRec group reads the sequence group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from tzrun_tools.convert.groups import Groups, SequenceGroupSpec
from tzrun_tools.convert.nodes import Finding, Findings

if TYPE_CHECKING:
    from tzrun_tools.convert.features import FeatureSet

__all__ = ["gather_sequences", "truncation"]

#: The encoder types that attend with the group's query.
_ATTENDING = ("target_attention", "multi_window_din", "simple_attention")

#: Keys of a sparse feature that a sequence feature has not (a sequence is not pooled here).
_POOLED_ONLY = ("pooling", "separator", "weight_column")


def gather_sequences(groups: Groups, feats: "FeatureSet", findings: Findings, encoded: bool = True) -> None:
    """Move the members of each sequence group the model reads into ``feats.sequence``;
    ``encoded``: the input holds the feature generator's output (``fg_mode: FG_NONE``)."""
    taken: dict[str, str] = {}
    for spec in groups.sequences.values():
        table = _group(spec, feats, taken, findings, encoded)
        if table is None:
            continue
        members = [f["name"] for f in table["features"] + table.get("dense", [])]
        for name in members:
            feats.dense_sequences.pop(name, None)
        feats.sparse = [f for f in feats.sparse if f["name"] not in members]
        feats.sequences.difference_update(members)
        feats.names.update((m, [spec.name]) for m in members)
        taken.update((m, spec.name) for m in members)
        feats.sequence.append(table)


def _group(spec: SequenceGroupSpec, feats: "FeatureSet", taken: dict[str, str],
           findings: Findings, encoded: bool) -> Optional[dict[str, Any]]:
    """The ``[[features.sequence]]`` table of ``spec`` (``None`` when it has no sequence feature)."""
    where = f"model_config.feature_groups: sequence group '{spec.name}'"
    sparse = {f["name"]: f for f in feats.sparse}
    members = [n for n in spec.features if n in feats.sequences and n in sparse]
    dense = [n for n in spec.features if n in feats.dense_sequences and n not in taken]
    twice = [n for n in members if n in taken]
    if twice:
        findings.not_converted.append(Finding(where, (
            f"{', '.join(twice)} also in sequence group '{taken[twice[0]]}': a sequence feature belongs to one "
            "group here; declare a copy under another name")))
        members = [n for n in members if n not in twice]
    if not members:
        if dense:
            findings.not_converted.append(Finding(where, (
                f"{', '.join(dense)}: a group's values follow its ids here, and it has no id sequence; add one "
                "(e.g. the clicked items) to the group")))
        return None
    if spec.name in sparse or any(spec.name == f["name"] for f in feats.dense):
        findings.not_converted.append(Finding(where, (
            f"a feature is named '{spec.name}' too: a sequence group and a feature need different names here; "
            "rename the group")))
        return None
    table: dict[str, Any] = {"name": spec.name}
    _max_len(spec, [feats.lengths.get(n) or 0 for n in members + dense], encoded, table, findings, where)
    tables = {**sparse, **{n: feats.dense_sequences[n][1] for n in dense}}
    separators = list(dict.fromkeys(tables[n]["separator"] for n in members + dense if "separator" in tables[n]))
    if separators:
        table["separator"] = separators[0]
    if len(separators) > 1:
        findings.not_converted.append(Finding(where, (
            f"its features split their ids on {', '.join(repr(s) for s in separators)}: one separator per group "
            f"here ({separators[0]!r} written); store the columns with one")))
    query = [n for n in spec.features if n not in feats.sequences and n in sparse and n not in members]
    if spec.query and (spec.encoder is None or spec.encoder["type"] in _ATTENDING):
        _query(query, members, table, findings, where)
    table["features"] = [{"name": n, "column": sparse[n].get("column", n),
                          **{k: v for k, v in sparse[n].items() if k not in ("name", "column", *_POOLED_ONLY)}}
                         for n in members]
    if dense:
        table["dense"] = [{k: v for k, v in tables[n].items() if k != "separator"} for n in dense]
    return table


def _max_len(spec: SequenceGroupSpec, lengths: list[int], encoded: bool, table: dict[str, Any],
             findings: Findings, where: str) -> None:
    """``max_len`` and ``keep`` of ``table`` from its features' ``sequence_length`` (``lengths``)."""
    longest = max(lengths)
    if len(set(lengths) - {0}) > 1:
        findings.notes.append(Finding(where, (
            f"its features' sequence_length differ ({', '.join(str(n) for n in sorted(set(lengths)))}): the group "
            f"takes {longest}")))
    windows = spec.encoder is not None and spec.encoder["type"] == "multi_window_din"
    rule = truncation(longest, spec.max_seq_length, encoded,
                      "its multi_window_din_encoder's windows (counted from a row's first id)" if windows else
                      spec.cut_by)
    if rule is None:
        findings.not_converted.append(Finding(where, (
            "no sequence_length: TorchEasyRec keeps every id; set max_len of the group to the longest sequence "
            "with keep = \"all\" (or to the number of ids to keep, with keep = \"first\")")))
        return
    table["max_len"], table["keep"], why = rule
    findings.notes.append(Finding(where, f"max_len = {rule[0]}, keep = \"{rule[1]}\": {why}"))


def truncation(sequence_length: int, max_seq_length: int, encoded: bool,
               cut_by: str = "its encoder's max_seq_length") -> Optional[tuple[int, str, str]]:
    """``(max_len, keep, why)`` giving what TorchEasyRec keeps of a row of a sequence group whose
    features' ``sequence_length`` is ``sequence_length`` and whose encoder reads a row's first
    ``max_seq_length`` ids (0: all; ``cut_by`` says what cuts them), or ``None`` when nothing
    bounds a row here.

    With ``fg_mode: FG_NONE`` (``encoded``) TorchEasyRec truncates nothing but what an encoder's
    ``max_seq_length`` cuts (a row's first ids); under a feature generator, the generator cuts a
    row to ``sequence_length`` before that.
    """
    if encoded and max_seq_length:
        return max_seq_length, "first", (
            f"{cut_by} keeps a row's first {max_seq_length} ids, and with fg_mode FG_NONE "
            "nothing else truncates")
    if encoded and sequence_length:
        return sequence_length, "all", (
            "with fg_mode FG_NONE TorchEasyRec truncates no sequence (sequence_length only bounds what its feature "
            f"generator wrote); here a row is at most max_len ids wide, so a row longer than {sequence_length} is a "
            "bad row (data.on_bad_row), never cut: raise max_len if your data holds longer rows")
    if max_seq_length and (not sequence_length or max_seq_length < sequence_length):
        return max_seq_length, "first", (
            f"{cut_by} keeps a row's first {max_seq_length} ids (of at most the feature "
            "generator's sequence_length)")
    if not sequence_length:
        return None
    return sequence_length, "first", (
        f"a longer row keeps its first {sequence_length} ids (sequence_length), as TorchEasyRec's encoders keep "
        "the first ids; its feature generator is not run here, so the column holds the raw sequence")


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
