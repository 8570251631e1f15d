"""What ``tzrec-run data synth --like CONFIG`` writes, worked out from a checked config's facts: one
:class:`ColumnPlan` per input column (the features reading it agree on how it is drawn), one
:class:`LabelPlan` per label, and the retrieval item table a ``[data.sampler]`` reads.

The facts are the run's own (:class:`tzrun.runner.facts.RunFacts`: the resolved feature specs,
label domains, derived labels, ``group_by`` columns), so the data fits the config exactly as
``train`` reads it. A column several features read is drawn once, by the feature that constrains it
most (``num_buckets`` with the fewest ids, then ``hash_bucket_size``, ``boundaries``, dense, ``vocab``);
the others must accept what it draws, or the plan is refused with a :class:`SynthLikeError`
naming both TOML paths.
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

from tzrun.errors import EXIT_CONFIG, TzrunError

__all__ = ["SynthLikeError", "ColumnPlan", "LabelPlan", "ItemTablePlan", "SynthPlan", "plan_synth"]

#: The ids of a column no feature bounds (a sampler's item id, a ``group_by`` key) are in ``[0, this)``.
FREE_IDS = 100_000

#: Most ids in a multi-valued (``separator`` or ``weight_column``) id column's row.
MULTI_VALUED_MAX = 3

_RANK = {"num_buckets": 0, "hash": 0, "boundaries": 1, "dense": 2, "vocab": 3, "weights": 4}
_ACCEPTS = {  # owner's kind -> the kinds of other readers that can read what it draws
    "num_buckets": {"num_buckets", "hash", "vocab", "dense", "boundaries"},
    "boundaries": {"boundaries", "dense"},
    "dense": {"dense", "boundaries"},
    "vocab": {"vocab", "hash"},
    "weights": {"weights"},
}


class SynthLikeError(TzrunError):
    """``data synth --like`` cannot draw data for a config: one line naming the config, the TOML
    path and the fix."""

    exit_code = EXIT_CONFIG


@attrs.frozen
class ColumnPlan:
    """How one input column is drawn.

    Attributes:
        column: the column's name.
        path: the TOML path of the feature (or key) that decides how it is drawn.
        kind: ``"num_buckets"`` (integer ids, also for ``hash_bucket_size``), ``"vocab"``
            (tokens), ``"boundaries"`` (numbers spread over the buckets), ``"dense"`` (floats),
            ``"weights"`` (per-id weights of :attr:`lengths_of`).
        shape: ``"scalar"``, ``"list"`` or ``"joined"`` (a string split on :attr:`separator`).
        num_ids: the ids drawn are in ``[0, num_ids)`` (vocab: ``len(vocab) + 1``, id 0 the
            out-of-vocabulary token).
        group: the sequence group whose lengths a sequence column takes.
        lengths_of: the id column whose row lengths a ``weights`` column follows.
    """

    column: str
    path: str
    kind: str
    shape: str = "scalar"
    separator: Optional[str] = None
    num_ids: int = 0
    vocab: Optional[tuple[str, ...]] = None
    boundaries: Optional[tuple[float, ...]] = None
    log1p: bool = False
    mean: float = 0.0
    std: float = 1.0
    group: Optional[int] = None
    max_len: int = 0
    lengths_of: Optional[str] = None


@attrs.frozen
class LabelPlan:
    """One label: the column written (a derived label's source), and what its losses and metrics
    accept (``"binary"``, ``"class_index"`` below ``num_classes``, ``"non_negative"``, ``"finite"``)."""

    name: str
    column: str
    domain: str
    num_classes: Optional[int] = None
    derived: Any = None  # tzrun.data.labels.DerivedLabel
    path: str = "data.labels"
    from_feature: bool = False


@attrs.frozen
class ItemTablePlan:
    """The item table of ``[data.sampler]`` (``item_table``): its id column, the item-side
    columns it holds (one value per item), and its popularity weight column, if any."""

    item_id: str
    columns: tuple[str, ...]
    weight: Optional[str] = None


@attrs.frozen
class SynthPlan:
    """Everything ``data synth --like`` writes: the columns in order, the labels, the
    sample-weight column (when not a label), and the sampler's item table."""

    columns: tuple[ColumnPlan, ...]
    labels: tuple[LabelPlan, ...]
    sample_weight: Optional[str] = None
    item_table: Optional[ItemTablePlan] = None


@attrs.frozen
class _Reader:
    path: str
    kind: str
    shape: str
    spec: Any  # a SparseFeature or DenseFeature
    group: Optional[int] = None
    max_len: int = 0
    separator: Optional[str] = None  # a dense sequence's (its group's)


def _id_kind(spec: Any) -> str:
    if spec.vocab is not None:
        return "vocab"
    if spec.boundaries is not None:
        return "boundaries"
    return "num_buckets" if spec.num_buckets is not None else "hash"


def _readers(specs: Any) -> dict[str, list[_Reader]]:
    """Every feature reading each column, by column, in config order (sequences first)."""
    found: dict[str, list[_Reader]] = {}
    for g, group in enumerate(specs.sequence_groups):
        for j, f in enumerate(group.features):
            shape = "joined" if f.separator else "list"
            found.setdefault(f.column, []).append(
                _Reader(f"features.sequence[{g}].features[{j}]", _id_kind(f), shape, f, g, group.max_len))
        separator = group.features[0].separator if group.features else None
        for j, d in enumerate(group.dense):
            found.setdefault(d.column, []).append(_Reader(f"features.sequence[{g}].dense[{j}]", "dense",
                                                          "joined" if separator else "list", d, g, group.max_len, separator))
    for i, f in enumerate(specs.sparse):
        shape = "joined" if f.separator else ("list" if f.weight_column else "scalar")
        found.setdefault(f.column, []).append(_Reader(f"features.sparse[{i}]", _id_kind(f), shape, f))
        if f.weight_column:
            found.setdefault(f.weight_column, []).append(
                _Reader(f"features.sparse[{i}].weight_column", "weights", shape, f))
    for i, d in enumerate(specs.dense):
        found.setdefault(d.column, []).append(_Reader(f"features.dense[{i}]", "dense", "scalar", d))
    return found


def _owner(column: str, readers: list[_Reader], source: str) -> _Reader:
    """The reader that decides how ``column`` is drawn; the others must accept its draws."""
    def rank(r: _Reader) -> tuple[int, int]:
        ids = r.spec.num_embeddings if r.kind in ("num_buckets", "hash") else 0
        return _RANK[r.kind], ids

    owner = min(readers, key=rank)
    owned = "num_buckets" if owner.kind == "hash" else owner.kind
    for other in readers:
        kind = "num_buckets" if other.kind == "hash" else other.kind
        if other.shape != owner.shape:
            raise SynthLikeError(f"{source}: {other.path}: reads column '{column}' as a {other.shape} value and "
                                 f"{owner.path} as a {owner.shape} one; data synth --like draws one column for both, "
                                 "so give one of them its own column")
        if kind not in _ACCEPTS[owned] or (other.group is not None and other.group != owner.group):
            raise SynthLikeError(f"{source}: {other.path}: reads column '{column}' ({other.kind}) that {owner.path} "
                                 f"({owner.kind}) also reads, and no value fits both; give one of them its own column")
    return owner


def _column_plan(column: str, r: _Reader) -> ColumnPlan:
    spec = r.spec
    common: dict[str, Any] = {"column": column, "path": r.path, "shape": r.shape, "group": r.group, "max_len": r.max_len}
    if r.kind == "dense":
        return ColumnPlan(kind="dense", log1p=spec.log1p, mean=spec.mean, std=spec.std, separator=r.separator, **common)
    if r.kind == "weights":
        return ColumnPlan(kind="weights", separator=spec.separator, lengths_of=spec.column, **common)
    kind = "num_buckets" if r.kind == "hash" else r.kind
    return ColumnPlan(kind=kind, separator=spec.separator, num_ids=spec.num_embeddings, vocab=spec.vocab,
                      boundaries=spec.boundaries, **common)


def _label_plans(facts: Any, columns: dict[str, ColumnPlan], source: str) -> list[LabelPlan]:
    """Each label: a column of its own, or a feature's column read as a label too (as a domain
    column TorchEasyRec keeps among the labels); a label nothing reads is drawn as 0/1."""
    derived = {d.name: (i, d) for i, d in enumerate(facts.derived_labels)}
    plans = []
    for k, name in enumerate(facts.cfg.data.labels):
        domains = facts.label_domains.get(name, ())
        domain = domains[0] if domains else None
        i, d = derived.get(name, (None, None))
        path = f"data.derived_labels[{i}]" if d is not None else f"data.labels[{k}]"
        column = d.source if d is not None else name
        feature = columns.get(column)
        if feature is not None:
            _check_feature_label(feature, domain, path, source)
        kind = domain.domain if domain else ("finite" if feature is not None else "binary")
        plans.append(LabelPlan(name, column, kind, domain.num_classes if domain else None, d, path,
                               from_feature=feature is not None))
    return plans


def _check_feature_label(feature: ColumnPlan, domain: Any, path: str, source: str) -> None:
    """A feature's column read as a label: numbers its losses and metrics accept.

    Raises:
        SynthLikeError: it is not, so no value fits both.
    """
    numeric = feature.shape == "scalar" and feature.kind in ("num_buckets", "dense", "boundaries")
    ids = feature.num_ids if feature.kind == "num_buckets" else None
    fits = numeric and (domain is None or domain.domain == "finite" or (ids is not None and (
        domain.domain == "non_negative" or (domain.domain == "binary" and ids <= 2)
        or (domain.domain == "class_index" and (domain.num_classes is None or ids <= domain.num_classes)))))
    if not fits:
        raise SynthLikeError(f"{source}: {path}: label column '{feature.column}' is also read by {feature.path}, "
                             f"and what that feature reads does not fit {domain.describe() if domain else 'a label'}; "
                             "give the label its own column")


def _item_table(facts: Any, columns: dict[str, ColumnPlan]) -> Optional[ItemTablePlan]:
    """The item table a ``[data.sampler]`` with an ``item_table`` file reads: its ``item_id``
    column, and the scalar columns of the model's ``item_features`` (a two-tower model's item
    tower), so the sampled items carry every feature of that tower."""
    sampler = facts.cfg.data.sampler
    options: Any = getattr(sampler, "config", None)
    if sampler is None or not getattr(options, "item_table", None) or not getattr(options, "item_id", None):
        return None
    specs = facts.specs
    by_name = {f.name: f.column for f in (*specs.sparse, *specs.dense)}
    names = getattr(getattr(facts.cfg.model, "config", None), "item_features", None) or ()
    item_columns = [by_name[n] for n in names if n in by_name]
    kept = tuple(c for c in dict.fromkeys(item_columns) if c != options.item_id and columns[c].shape == "scalar")
    return ItemTablePlan(options.item_id, kept, getattr(options, "weight", None))


def plan_synth(facts: Any, source: str) -> SynthPlan:
    """The columns, labels and item table of data shaped like the config of ``facts``.

    Args:
        facts: the config's :class:`~tzrun.runner.facts.RunFacts` (a checked config).
        source: the config's file, named in errors.

    Raises:
        SynthLikeError: two features read one column in ways no value fits.
    """
    readers = _readers(facts.specs)
    columns = {c: _column_plan(c, _owner(c, rs, source)) for c, rs in readers.items()}
    labels = _label_plans(facts, columns, source)
    weight = facts.cfg.data.sample_weight
    label_columns = {label.column for label in labels}
    extra = [*facts.group_columns, weight] if weight and weight not in label_columns else list(facts.group_columns)
    for i, column in enumerate(c for c in dict.fromkeys(extra) if c not in columns and c not in label_columns):
        kind = "weights" if column == weight else "num_buckets"
        columns[column] = ColumnPlan(column, "data.sample_weight" if column == weight else "group_by", kind,
                                     num_ids=FREE_IDS)
    items = _item_table(facts, columns)
    if items is not None and items.item_id not in columns:
        columns[items.item_id] = ColumnPlan(items.item_id, "data.sampler.item_id", "num_buckets", num_ids=FREE_IDS)
    sample_weight = weight if weight and weight not in label_columns else None
    return SynthPlan(tuple(columns.values()), tuple(labels), sample_weight, items)
