"""``[[features.sequence]]`` resolved: each sequence as the id feature it amounts to, which tables
are looked up unpooled, and the checks only sequences need (torch-free, for ``check``).

A sequence that names the table of a ``[[features.sparse]]`` feature (its *owner*: the first
one naming it) takes the owner's id source, width, trainability, sparse optimizer and
constraints: the table is declared once. A table is looked up *unpooled* (in an
``EmbeddingCollection``) when a sequence or a group's ``query`` feature reads it; every feature
reading such a table is then unpooled too (one table lives in one collection).
"""

from __future__ import annotations

from typing import Any

from tzrun.config.features_schema import FeaturesConfig, SequenceFeatureConfig, SparseFeatureConfig
from tzrun.errors import ConfigProblem

__all__ = ["ID_KINDS", "DEFAULT_SEQUENCE_DIM", "table_name", "resolved_sequences", "id_features", "unpooled_tables",
           "check_sequences", "appended_item_problems"]

#: The keys that say how a feature's values become ids; exactly one is set.
ID_KINDS = ("num_buckets", "hash_bucket_size", "vocab", "vocab_file", "boundaries", "zch")

#: A sequence's ``embedding_dim`` when neither it nor its table's owner sets one.
DEFAULT_SEQUENCE_DIM = 16

#: The keys a sequence takes from its table's owner when it leaves them out.
_INHERITED = ("embedding_dim", "trainable", "sparse_optimizer", "embedding_constraints")


def table_name(feature: SparseFeatureConfig | SequenceFeatureConfig) -> str:
    """The table a feature reads (default ``<name>_emb``)."""
    return feature.table or f"{feature.name}_emb"


def _owners(cfg: FeaturesConfig) -> dict[str, tuple[int, SparseFeatureConfig]]:
    owners: dict[str, tuple[int, SparseFeatureConfig]] = {}
    for i, f in enumerate(cfg.sparse):
        owners.setdefault(table_name(f), (i, f))
    return owners


def resolved_sequences(cfg: FeaturesConfig) -> list[tuple[str, int, SparseFeatureConfig]]:
    """``(TOML path, group index, the feature as a [[features.sparse]] entry)`` of every
    sequence, in config order, with what it takes from its table's owner filled in."""
    owners = _owners(cfg)
    out = []
    for g, group in enumerate(cfg.sequence):
        for j, s in enumerate(group.features):
            owner = owners.get(table_name(s), (None, None))[1]
            # with an owner, the owner's keys hold (a contradiction is reported by _agreement)
            source = s if owner is None else owner
            ids = {k: getattr(source, k) for k in ID_KINDS}
            taken = {k: getattr(source, k) for k in _INHERITED}
            spec = SparseFeatureConfig(
                name=s.name, column=s.column or s.name, **ids, separator=group.separator,
                embedding_dim=DEFAULT_SEQUENCE_DIM if taken["embedding_dim"] is None else taken["embedding_dim"],
                table=table_name(s), pooling=owner.pooling if owner is not None else "sum",
                sparse_optimizer=taken["sparse_optimizer"],
                trainable=True if taken["trainable"] is None else taken["trainable"],
                embedding_constraints=taken["embedding_constraints"],
            )
            out.append((f"features.sequence[{g}].features[{j}]", g, spec))
    return out


def id_features(cfg: FeaturesConfig) -> dict[str, tuple[str, SparseFeatureConfig]]:
    """Every id feature by name, ``[[features.sparse]]`` and sequences alike:
    ``name -> (its TOML path, the feature as a [[features.sparse]] entry)``."""
    out = {f.name: (f"features.sparse[{i}]", f) for i, f in enumerate(cfg.sparse)}
    out.update({f.name: (path, f) for path, _, f in resolved_sequences(cfg)})
    return out


def unpooled_tables(cfg: FeaturesConfig) -> set[str]:
    """The tables looked up unpooled: read by a sequence or by a group's ``query`` feature."""
    sparse = {f.name: f for f in cfg.sparse}
    tables = {table_name(s) for group in cfg.sequence for s in group.features}
    tables |= {table_name(sparse[q]) for group in cfg.sequence for q in group.query if q in sparse}
    return tables


def _agreement(path: str, s: SequenceFeatureConfig, owner_path: str, owner: SparseFeatureConfig) -> list[ConfigProblem]:
    """A sequence sharing its owner's table may repeat the owner's keys, never contradict them."""
    problems = []
    own_ids = {k: getattr(s, k) for k in ID_KINDS if getattr(s, k) is not None}
    if own_ids and own_ids != {k: getattr(owner, k) for k in ID_KINDS if getattr(owner, k) is not None}:
        key = next(iter(own_ids))
        problems.append(ConfigProblem(
            f"{path}.{key}", f"sequence '{s.name}' shares table '{table_name(s)}' with {owner_path} ('{owner.name}'), "
            f"which maps its values to ids otherwise; remove {', '.join(own_ids)} here (the table is declared once)"))
    for key in _INHERITED:
        mine, theirs = getattr(s, key), getattr(owner, key)
        if mine is not None and _plain(mine) != _plain(theirs):
            problems.append(ConfigProblem(
                f"{path}.{key}", f"sequence '{s.name}' shares table '{table_name(s)}' with {owner_path} ('{owner.name}'), "
                f"whose {key} differs; remove {key} here (the table is declared once) or make them agree"))
    return problems


def _plain(value: Any) -> Any:
    return (value.type, dict(value.raw)) if hasattr(value, "raw") else value


def check_sequences(cfg: FeaturesConfig) -> list[ConfigProblem]:
    """Problems of ``[[features.sequence]]`` that the id-feature checks do not see: lengths,
    queries, agreement with a shared table's owner, and unpooled features' limits."""
    problems: list[ConfigProblem] = []
    add = lambda path, msg: problems.append(ConfigProblem(path, msg))  # noqa: E731
    owners = _owners(cfg)
    sparse = {f.name: (i, f) for i, f in enumerate(cfg.sparse)}
    resolved = {spec.name: spec for _, _, spec in resolved_sequences(cfg)}
    for g, group in enumerate(cfg.sequence):
        path = f"features.sequence[{g}]"
        if group.max_len < 1:
            add(f"{path}.max_len", f"must be at least 1, got {group.max_len}")
        if not group.features:
            add(f"{path}.features", f"group '{group.name}': declare at least one [[features.sequence.features]]")
        for j, s in enumerate(group.features):
            owner = owners.get(table_name(s))
            if owner is not None:
                problems.extend(_agreement(f"{path}.features[{j}]", s, f"features.sparse[{owner[0]}]", owner[1]))
        if group.query and len(group.query) != len(group.features):
            add(f"{path}.query", f"group '{group.name}': name one query feature per sequence ({len(group.features)}), "
                                 f"in the order of its features, or none")
        for j, (q, s) in enumerate(zip(group.query, group.features)):
            if q not in sparse:
                add(f"{path}.query", f"'{q}' is not a [[features.sparse]] feature (query features are the candidate's)")
            elif sparse[q][1].embedding_dim != resolved[s.name].embedding_dim:
                add(f"{path}.query", f"query '{q}' has embedding_dim {sparse[q][1].embedding_dim} but sequence "
                                     f"'{s.name}' has {resolved[s.name].embedding_dim}; they must be equal")
    unpooled = unpooled_tables(cfg)
    for i, f in enumerate(cfg.sparse):
        if table_name(f) not in unpooled:
            continue
        if f.weight_column is not None:
            add(f"features.sparse[{i}].weight_column", f"feature '{f.name}' reads table '{table_name(f)}', which a sequence "
                                                       "or a query reads unpooled; unpooled lookups take no weights: remove it")
    return problems


def appended_item_problems(cfg: FeaturesConfig) -> list[ConfigProblem]:
    """The features a sampler that appends items (an ``ItemSampler``) cannot feed: those looked
    up unpooled (a sampler that expands rows feeds every feature)."""
    unpooled = unpooled_tables(cfg)
    return [ConfigProblem(f"features.sparse[{i}].table", f"feature '{f.name}' is looked up unpooled (table "
                                                         f"'{table_name(f)}' is read by a sequence or a query) and "
                                                         "data.sampler cannot feed sampled items' ids to it; "
                                                         "give it a table of its own")
            for i, f in enumerate(cfg.sparse) if table_name(f) in unpooled]

