"""Checks across keys of the core schema that types alone cannot express."""

from __future__ import annotations

import math
from collections import defaultdict

from tzrun.config.schema import SEQUENCE_LENGTH, RunConfig, SparseFeatureConfig
from tzrun.config.sequences import ID_KINDS, check_sequences, resolved_sequences
from tzrun.config.vocab import check_vocab, read_vocab_file
from tzrun.errors import ConfigProblem

__all__ = ["check_run_config", "FBGEMM_DIM_MULTIPLE"]

#: FBGEMM's fused table-batched embedding kernels need embedding widths in multiples of 4.
FBGEMM_DIM_MULTIPLE = 4


#: Table names TorchRec's EmbeddingBagCollection cannot hold (its ModuleDict's own methods).
_RESERVED_TABLE_NAMES = frozenset({"items", "keys", "values"})


def check_run_config(cfg: RunConfig) -> list[ConfigProblem]:
    """Every cross-key problem of a structured config, each with its TOML path."""
    problems: list[ConfigProblem] = []
    add = lambda path, msg: problems.append(ConfigProblem(path, msg))  # noqa: E731

    train, data = cfg.train, cfg.data
    if (train.num_steps is None) == (train.num_epochs is None):
        add("train.num_steps and train.num_epochs", "set exactly one")
    for key in ("num_steps", "num_epochs"):
        value = getattr(train, key)
        if value is not None and value < 1:
            add(f"train.{key}", f"must be at least 1, got {value}")
    if train.save_checkpoints_steps < 0:
        add("train.save_checkpoints_steps", "must be 0 (only at the end) or a positive interval")
    if train.save_checkpoints_epochs is not None and train.save_checkpoints_epochs < 1:
        add("train.save_checkpoints_epochs", "must be at least 1 (leave it unset for no per-epoch checkpoints)")
    if train.keep_checkpoint_max < 0:
        add("train.keep_checkpoint_max", "must be 0 (keep all) or more")
    if train.log_every_n_steps < 1:
        add("train.log_every_n_steps", "must be at least 1")
    if data.batch_size < 1:
        add("data.batch_size", f"must be at least 1, got {data.batch_size}")
    if data.eval_batch_size is not None and data.eval_batch_size < 1:
        add("data.eval_batch_size", f"must be at least 1, got {data.eval_batch_size}")
    if data.num_workers < 0:
        add("data.num_workers", "must be 0 or more")
    if data.batch_cost_size is not None and data.shuffle_buffer_rows > 0:
        add("data.batch_cost_size", "cost-aware batches are planned in input order and not shuffled; set "
                                    "data.shuffle_buffer_rows = 0 (shuffle the files instead) or remove data.batch_cost_size")
    if data.batch_cost_size is not None and data.sample_cost == SEQUENCE_LENGTH and not cfg.features.sequence:
        add("data.sample_cost", "'sequence_length' sums the row's [[features.sequence]] lengths, and there are none; "
                                "name a numeric column as the cost, or declare the sequences")
    if not data.labels:
        add("data.labels", "name at least one label column")
    problems.extend(_check_derived_labels(cfg))
    if cfg.eval.num_steps is not None and cfg.eval.num_steps < 1:
        add("eval.num_steps", "must be at least 1 (leave it unset to evaluate the whole input)")
    if not cfg.losses:
        add("losses", 'name at least one loss, e.g. [[losses]] type = "binary_cross_entropy"')
    if cfg.metrics and data.eval_input is None:
        add("data.eval_input", "metrics are configured but there is no eval input")

    id_features = [(f"features.sparse[{i}]", f) for i, f in enumerate(cfg.features.sparse)]
    id_features += [(path, f) for path, _, f in resolved_sequences(cfg.features)]
    for path, feature in id_features:
        table = feature.table or f"{feature.name}_emb"
        if table in _RESERVED_TABLE_NAMES:
            where = f"{path}.table" if feature.table else f"{path}.name"
            add(where, f"the table name '{table}' clashes with a method of TorchRec's embedding collections "
                       f"({', '.join(sorted(_RESERVED_TABLE_NAMES))} cannot be table names); name the table otherwise")

    names: dict[str, str] = {}
    for group in ("dense", "sparse"):
        for i, feature in enumerate(getattr(cfg.features, group)):
            path = f"features.{group}[{i}]"
            if feature.name in names:
                add(f"{path}.name", f"'{feature.name}' is already the name of {names[feature.name]}")
            names.setdefault(feature.name, path)
    for g, group in enumerate(cfg.features.sequence):
        entries = [(f"features.sequence[{g}]", group.name)]
        entries += [(f"features.sequence[{g}].features[{j}]", f.name) for j, f in enumerate(group.features)]
        entries += [(f"features.sequence[{g}].dense[{j}]", f.name) for j, f in enumerate(group.dense)]
        for path, name in entries:
            if name in names:
                add(f"{path}.name", f"'{name}' is already the name of {names[name]}")
            names.setdefault(name, path)
    problems.extend(check_sequences(cfg.features))
    if not names:
        add("features", "declare at least one [[features.dense]] or [[features.sparse]]")

    if train.gradient_accumulation_steps < 1:
        add("train.gradient_accumulation_steps", f"must be at least 1 (1: no accumulation), got {train.gradient_accumulation_steps}")
    if train.grad_scaler is not None and train.mixed_precision != "fp16":
        add(
            "train.grad_scaler",
            "loss scaling is for fp16 gradients; set train.mixed_precision = \"fp16\" or remove [train.grad_scaler]",
        )

    tables: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    updates: dict[str, list[tuple[str, object]]] = defaultdict(list)
    constraints: dict[str, list[tuple[str, object]]] = defaultdict(list)
    poolings: dict[str, list[tuple[str, str]]] = defaultdict(list)
    owned = {f.table or f"{f.name}_emb" for f in cfg.features.sparse}
    for path, feature in id_features:
        table = feature.table or f"{feature.name}_emb"
        if path.startswith("features.sequence") and table in owned:
            # what it takes from the table's owner is checked there (and agreement in check_sequences)
            tables[table].append((path, _table_size(feature), feature.embedding_dim))
            updates[table].append((path, _update(feature)))
            constraints[table].append((path, feature.embedding_constraints))
            continue
        kinds = [k for k in _ID_KINDS if getattr(feature, k) is not None]
        if len(kinds) != 1:
            given = f" (given: {', '.join(kinds)})" if kinds else ""
            add(path, f"feature '{feature.name}': set exactly one of {', '.join(_ID_KINDS)}{given}")
        for key in ("num_buckets", "hash_bucket_size"):
            value = getattr(feature, key)
            if value is not None and value < 1:
                add(f"{path}.{key}", f"must be at least 1, got {value}")
        problems.extend(_check_id_source(feature, path))
        dim = feature.embedding_dim
        if dim < 1 or dim % FBGEMM_DIM_MULTIPLE:
            lower = max(FBGEMM_DIM_MULTIPLE, dim - dim % FBGEMM_DIM_MULTIPLE)
            add(
                f"{path}.embedding_dim",
                f"feature '{feature.name}': {dim} is not a positive multiple of {FBGEMM_DIM_MULTIPLE} "
                f"(FBGEMM's fused embedding kernels need one); use {lower} or {lower + FBGEMM_DIM_MULTIPLE}",
            )
        size = _table_size(feature)
        tables[table].append((path, size, dim))
        if path.startswith("features.sparse"):
            poolings[table].append((path, feature.pooling))
        if not feature.trainable and feature.sparse_optimizer is not None:
            add(f"{path}.sparse_optimizer", f"feature '{feature.name}' has trainable = false: its table is never updated; remove sparse_optimizer")
        updates[table].append((path, _update(feature)))
        constraints[table].append((path, feature.embedding_constraints))
    for table, users in tables.items():
        if len({(size, dim) for _, size, dim in users}) > 1:
            where = ", ".join(p for p, _, _ in users)
            add(
                users[-1][0] + ".table",
                f"features sharing table '{table}' ({where}) must agree on its size and embedding_dim",
            )
    for table, users in poolings.items():
        if len({p for _, p in users}) > 1:
            where = ", ".join(p for p, _ in users)
            add(users[-1][0] + ".pooling", f"features sharing table '{table}' ({where}) must agree on pooling")
    for table, users in updates.items():
        if len({repr(u) for _, u in users}) > 1:
            where = ", ".join(p for p, _ in users)
            add(
                users[-1][0] + ".table",
                f"features sharing table '{table}' ({where}) must agree on trainable and sparse_optimizer",
            )
    for table, users in constraints.items():
        if len({c for _, c in users}) > 1:
            where = ", ".join(p for p, _ in users)
            add(
                users[-1][0] + ".embedding_constraints",
                f"features sharing table '{table}' ({where}) must agree on embedding_constraints (set the same on each, or none)",
            )
    return problems


_ID_KINDS = ID_KINDS


def _update(feature: SparseFeatureConfig) -> tuple[bool, object]:
    """How a feature's table is updated, comparable across the features sharing it."""
    optimizer = None if feature.sparse_optimizer is None else (feature.sparse_optimizer.type, dict(feature.sparse_optimizer.raw))
    return feature.trainable, optimizer


def _check_derived_labels(cfg: RunConfig) -> list[ConfigProblem]:
    """``[[data.derived_labels]]``: each says how it is computed, once, and is used."""
    problems: list[ConfigProblem] = []
    seen: set[str] = set()
    used = set(cfg.data.labels)
    for i, d in enumerate(cfg.data.derived_labels):
        path = f"data.derived_labels[{i}]"
        if (d.op is None) != (d.value is None):
            problems.append(ConfigProblem(f"{path}.{'value' if d.op else 'op'}",
                                          'set op and value together, e.g. op = ">=", value = 4'))
        if d.op is None and d.value is None and d.map is None and d.cast is None:
            problems.append(ConfigProblem(path, 'say how the label is computed: op and value, map, or cast'))
        if d.default is not None and d.map is None:
            problems.append(ConfigProblem(f"{path}.default", "default is the label of a value a map does not hold: set map"))
        if d.name in seen:
            problems.append(ConfigProblem(f"{path}.name", f"'{d.name}' is derived twice; give each a name of its own"))
        seen.add(d.name)
        if d.name not in used:
            problems.append(ConfigProblem(f"{path}.name", f"'{d.name}' is not used: name it in data.labels"))
    return problems


def _table_size(feature: SparseFeatureConfig) -> int:
    """Rows of the feature's table (0 when its id source is broken: reported elsewhere)."""
    if feature.num_buckets is not None:
        return feature.num_buckets
    if feature.hash_bucket_size is not None:
        return feature.hash_bucket_size
    if feature.vocab is not None:
        return len(feature.vocab) + 1
    if feature.boundaries is not None:
        return len(feature.boundaries) + 1
    if feature.zch is not None:
        return feature.zch.size
    if feature.vocab_file is not None:
        try:
            return len(read_vocab_file(feature.vocab_file)) + 1
        except (OSError, UnicodeDecodeError):
            return 0
    return 0


def _check_id_source(feature: SparseFeatureConfig, path: str) -> list[ConfigProblem]:
    """Problems of a feature's vocabulary, boundaries, separator and weights."""
    problems = []
    if feature.vocab is not None:
        wrong = check_vocab(feature.vocab)
        if wrong:
            problems.append(ConfigProblem(f"{path}.vocab", f"feature '{feature.name}': {wrong}"))
    if feature.vocab_file is not None:
        try:
            tokens = read_vocab_file(feature.vocab_file)
        except OSError as exc:
            problems.append(ConfigProblem(f"{path}.vocab_file", f"cannot read {feature.vocab_file}: {exc.strerror or exc}"))
        except UnicodeDecodeError as exc:
            problems.append(ConfigProblem(f"{path}.vocab_file", f"{feature.vocab_file} is not UTF-8 text: {exc.reason} at byte {exc.start}"))
        else:
            wrong = check_vocab(tokens)
            if wrong:
                problems.append(ConfigProblem(f"{path}.vocab_file", f"{feature.vocab_file}: {wrong}"))
    if feature.boundaries is not None:
        b = feature.boundaries
        if not b:
            problems.append(ConfigProblem(f"{path}.boundaries", "give at least one boundary"))
        elif any(not math.isfinite(x) for x in b):
            problems.append(ConfigProblem(f"{path}.boundaries", "boundaries must be finite numbers"))
        elif any(x >= y for x, y in zip(b, b[1:])):
            problems.append(ConfigProblem(f"{path}.boundaries", f"must be strictly increasing, got {list(b)}"))
    if feature.weight_column is not None and feature.weight_column == (feature.column or feature.name):
        problems.append(ConfigProblem(f"{path}.weight_column", "must be another column than the feature's ids"))
    return problems
