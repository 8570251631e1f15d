"""The ``[[features.dense]]`` and ``[[features.sparse]]`` sections of the core config schema
(part of :mod:`tzrun.config.schema`, which :class:`~tzrun.config.schema.RunConfig` assembles)."""

from __future__ import annotations

from typing import Any, Literal, Optional

import attrs

from tzrun.config.base import Component, _non_empty_text, _positive
from tzrun.errors import did_you_mean

__all__ = ["DenseFeatureConfig", "EmbeddingConstraintsConfig", "ZchConfig", "SparseFeatureConfig", "SequenceFeatureConfig",
           "SequenceDenseConfig", "SequenceGroupConfig", "FeaturesConfig", "SHARDING_TYPES", "COMPUTE_KERNELS"]


@attrs.frozen
class DenseFeatureConfig:
    """``[[features.dense]]``: a float input.

    The model sees ``(f(x) - mean) / std`` where ``x`` is the value (``fill_value`` when null
    or NaN) and ``f`` is ``log(1 + max(x, 0))`` with ``log1p``, the identity otherwise.

    Attributes:
        name: the feature's name.
        column: its input column, of integers, floats or bools (default: ``name``).
        fill_value: the value of a missing (null or NaN) entry.
        log1p: feed ``log(1 + max(x, 0))`` instead of ``x`` (for counts).
        mean: subtracted after ``log1p`` (standardization; default 0).
        std: divides after ``mean`` (standardization; default 1; must be positive).
    """

    name: str
    column: Optional[str] = None
    fill_value: float = 0.0
    log1p: bool = False
    mean: float = 0.0
    std: float = attrs.field(default=1.0, validator=_positive)


#: Sharding types a table may be given (TorchRec's names). ``data_parallel`` is not one: TorchRec
#: trains a data-parallel table with the dense optimizer, not the configured sparse one.
SHARDING_TYPES = ("table_wise", "row_wise", "table_row_wise", "column_wise", "table_column_wise")

#: FBGEMM compute kernels a table may run on: ``fused`` (weights in the rank's device memory),
#: ``fused_uvm`` (in host memory, read through unified memory) and ``fused_uvm_caching`` (in host
#: memory with a cache of the hot rows in device memory). The last two exist only on CUDA.
COMPUTE_KERNELS = ("fused", "fused_uvm", "fused_uvm_caching")


def _choices(allowed: tuple[str, ...]) -> Any:
    def check(instance: Any, attribute: Any, value: Optional[tuple[str, ...]]) -> None:
        if value is None:
            return
        if not value:
            raise ValueError(f"must name at least one of {', '.join(allowed)} (or be left out)", attribute)
        for name in value:
            if name == "data_parallel":
                raise ValueError("data_parallel is not offered: TorchRec would train the table with the dense "
                                 "optimizer instead of the sparse one", attribute)
            if name not in allowed:
                guess = did_you_mean(name, allowed)
                hint = f"; did you mean '{guess}'?" if guess else ""
                raise ValueError(f"unknown '{name}' (choose from {', '.join(allowed)}{hint})", attribute)

    return check


@attrs.frozen
class EmbeddingConstraintsConfig:
    """What TorchRec's sharding planner may choose for a table (its ``ParameterConstraints``):
    ``train.global_embedding_constraints`` for every table, a feature's ``embedding_constraints``
    for the tables it reads (overriding the global keys it sets). See docs/plan.md, Constraints.

    Attributes:
        sharding_types: the sharding types to choose from (default ``table_wise``,
            ``row_wise``, ``table_row_wise``); also ``column_wise`` and ``table_column_wise``.
        compute_kernels: the FBGEMM kernels to choose from (default ``fused``); on CUDA also
            ``fused_uvm`` and ``fused_uvm_caching`` (tables bigger than device memory).
    """

    sharding_types: Optional[tuple[str, ...]] = attrs.field(default=None, validator=_choices(SHARDING_TYPES))
    compute_kernels: Optional[tuple[str, ...]] = attrs.field(default=None, validator=_choices(COMPUTE_KERNELS))


def _at_least(minimum: int) -> Any:
    def check(instance: Any, attribute: Any, value: int) -> None:
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}", attribute)

    return check


@attrs.frozen
class ZchConfig:
    """``zch = { size = ..., ... }`` on an id feature: collision-free ids (TorchEasyRec's ``zch``,
    TorchRec's managed collision). Every distinct id gets a row of its own while the table has
    room; every ``eviction_interval`` steps the ids seen since the last eviction compete with
    the table's ids by the eviction policy's score, and a new id enters only if an admission
    filter (when set) lets it. An id not (or not yet) in the table reads a shared miss row. See
    docs/zch.md.

    Attributes:
        size: the table's rows (TorchEasyRec's ``zch_size``); a multiple of the world size
            (the table is sharded row-wise, one slice per rank; each slice keeps one row for
            ids it does not hold).
        eviction_interval: steps between evictions (and admissions).
        eviction_policy: ``{ type = "lfu" }`` (the default), ``lru`` or ``distance_lfu`` with
            their options, or a plugin's (``tzrec-run plugins``).
        admission: which new ids may enter at an eviction, ``{ type = "threshold",
            min_count = 2 }`` or a plugin's; unset: every id may.
    """

    size: int = attrs.field(validator=_at_least(2), metadata={"missing": "zch needs size = <the table's rows>, e.g. size = 100000"})
    eviction_interval: int = attrs.field(default=5, validator=_at_least(1))
    eviction_policy: Component = Component("lfu")
    admission: Optional[Component] = None


@attrs.frozen
class SparseFeatureConfig:
    """``[[features.sparse]]``: a categorical id input with an embedding table.

    Set exactly one of ``num_buckets``, ``hash_bucket_size``, ``vocab``, ``vocab_file``,
    ``boundaries`` and ``zch``: it says how the column's values become ids, and how many rows the table
    has. Features that share a table must agree on its size, ``embedding_dim``, ``pooling``,
    ``trainable``, ``sparse_optimizer`` and ``embedding_constraints``. The hash, the
    out-of-vocabulary id, the boundary convention and weights: see docs/data.md, Id features.

    Attributes:
        name: the feature's name (its key in the batch's KeyedJaggedTensor).
        column: its input column (default: ``name``): integers or strings, or a list of either
            (several ids per row); a null, or a null inside a list, gives no id.
        num_buckets: integer ids in ``[0, num_buckets)``, used as they are (pieces split on
            ``separator`` are parsed as base-10 integers); an id outside is a bad row (see
            ``data.on_bad_row``).
        hash_bucket_size: strings hashed with FNV-1a 64 over their UTF-8 bytes into this many
            buckets (integers are taken modulo it).
        vocab: tokens; token ``vocab[i]`` is id ``i + 1`` and any other token id 0 (the
            out-of-vocabulary bucket); the table has ``len(vocab) + 1`` rows. Integer columns
            are matched by their decimal text.
        vocab_file: a UTF-8 text file with one token per line (empty lines ignored), read
            like ``vocab``; relative to the working directory.
        boundaries: a numeric column bucketized: ``x`` is id ``#{b in boundaries: b <= x}``
            (``numpy.searchsorted(boundaries, x, side="right")``); strictly increasing; the
            table has ``len(boundaries) + 1`` rows.
        zch: collision-free ids (:class:`ZchConfig`): every value (an integer, or a string
            hashed with FNV-1a 64) keeps a row of its own while it is frequent enough; the
            table has ``zch.size`` rows.
        separator: a string column holds several values per row separated by it
            (``"a|b|c"``); empty pieces are ignored. List columns need none.
        weight_column: a column of per-id weights parallel to ``column`` (a list column, or
            a string split on ``separator``, with as many values as ids in every row), fed as
            the KeyedJaggedTensor's weights; not ``column`` itself.
        embedding_dim: the embedding width; a positive multiple of 4 (FBGEMM's fused kernels
            need it).
        table: the embedding table's name; features naming one table share it and must agree
            on its size and width (default: ``<name>_emb``). ``items``, ``keys`` and ``values``
            cannot be table names.
        pooling: how a multi-id row is pooled, ``sum`` or ``mean``.
        sparse_optimizer: this feature's table's own sparse optimizer (default:
            ``train.sparse_optimizer``; see docs/sparse_optimizers.md). It takes no
            ``lr_schedule``: it shares that of ``train.sparse_optimizer``, applied to its own
            ``lr``. Features sharing a table must agree; a frozen feature takes none.
        trainable: false freezes the table: it runs fused SGD with lr 0, so its rows never
            change.
        embedding_constraints: the sharding types and kernels the planner may choose for this
            feature's tables (see :class:`EmbeddingConstraintsConfig`); the keys it sets
            override those of ``train.global_embedding_constraints``. Features sharing a table
            must agree.
    """

    name: str
    column: Optional[str] = None
    num_buckets: Optional[int] = None
    hash_bucket_size: Optional[int] = None
    vocab: Optional[tuple[str, ...]] = None
    vocab_file: Optional[str] = attrs.field(default=None, validator=_non_empty_text)
    boundaries: Optional[tuple[float, ...]] = None
    zch: Optional[ZchConfig] = None
    separator: Optional[str] = attrs.field(default=None, validator=_non_empty_text)
    weight_column: Optional[str] = attrs.field(default=None, validator=_non_empty_text)
    embedding_dim: int = 16
    table: Optional[str] = None
    pooling: Literal["sum", "mean"] = "sum"
    sparse_optimizer: Optional[Component] = None
    trainable: bool = True
    embedding_constraints: Optional[EmbeddingConstraintsConfig] = None


@attrs.frozen
class SequenceFeatureConfig:
    """``[[features.sequence.features]]``: one id sequence of a sequence group, looked up unpooled.

    The keys mean what they mean on ``[[features.sparse]]`` (no ``pooling`` or
    ``weight_column``: a sequence is not pooled). When its ``table`` is also a
    ``[[features.sparse]]`` feature's, the sequence takes that feature's id source
    (``num_buckets`` ... ``boundaries``), ``embedding_dim``, ``trainable``, ``sparse_optimizer``
    and ``embedding_constraints`` (the table is declared once); any of them it sets itself must
    agree. Otherwise it sets exactly one id source, and ``embedding_dim`` defaults to 16.

    Attributes:
        name: the sequence's name (its key in ``batch.sequence``).
        column: its input column (default: ``name``): a list of integers or strings, or a
            string split on the group's ``separator``; a null row is an empty sequence.
        num_buckets: integer ids in ``[0, num_buckets)`` (as on ``[[features.sparse]]``).
        hash_bucket_size: values hashed with FNV-1a 64 into this many buckets.
        vocab: tokens; ``vocab[i]`` is id ``i + 1``, any other token id 0.
        vocab_file: a UTF-8 file of tokens, one per line, read like ``vocab``.
        boundaries: numbers bucketized, ``id = #{b in boundaries: b <= x}``.
        zch: collision-free ids (as on ``[[features.sparse]]``).
        embedding_dim: the embedding width, a positive multiple of 4 (default: the owner's,
            else 16).
        table: the embedding table's name (default: ``<name>_emb``); naming a
            ``[[features.sparse]]`` feature's table shares it.
        sparse_optimizer: this table's own sparse optimizer (default: the owner's, else
            ``train.sparse_optimizer``).
        trainable: false freezes the table (default: the owner's, else true).
        embedding_constraints: what the sharding planner may choose for the table (default:
            the owner's).
    """

    name: str
    column: Optional[str] = None
    num_buckets: Optional[int] = None
    hash_bucket_size: Optional[int] = None
    vocab: Optional[tuple[str, ...]] = None
    vocab_file: Optional[str] = attrs.field(default=None, validator=_non_empty_text)
    boundaries: Optional[tuple[float, ...]] = None
    zch: Optional[ZchConfig] = None
    embedding_dim: Optional[int] = None
    table: Optional[str] = None
    sparse_optimizer: Optional[Component] = None
    trainable: Optional[bool] = None
    embedding_constraints: Optional[EmbeddingConstraintsConfig] = None


@attrs.frozen
class SequenceDenseConfig(DenseFeatureConfig):
    """``[[features.sequence.dense]]``: a numeric sequence of a sequence group, one value per id
    of the group's sequences (a price, a time gap per clicked item): TorchEasyRec's
    ``raw_feature`` inside a ``sequence_feature`` without ``boundaries``.

    Each value becomes ``(f(x) - mean) / std`` as on ``[[features.dense]]``; the group's padded
    ``[B, max_len, D]`` view carries the group's dense sequences after its embeddings, in config
    order (see :mod:`tzrun.sequence`). A bucketized numeric sequence (``boundaries``) is an id
    sequence: declare it under ``[[features.sequence.features]]``.

    Attributes:
        name: the sequence's name.
        column: its input column (default: ``name``): a list of numbers, or a string split on
            the group's ``separator``; a null row is an empty sequence. Every row has as many
            values as the group's id sequences have ids (else it is a bad row).
        fill_value: the value of a null or NaN entry inside a row.
        log1p: feed ``log(1 + max(x, 0))`` instead of ``x``.
        mean: subtracted after ``log1p`` (default 0).
        std: divides after ``mean`` (default 1; must be positive).
    """


@attrs.frozen
class SequenceGroupConfig:
    """``[[features.sequence]]``: aligned id sequences of one behaviour (the clicked items, their
    categories, their brands), looked up unpooled through a sharded ``EmbeddingCollection``.

    Attributes:
        name: the group's name (models refer to it).
        max_len: the longest sequence a row carries (the width of the padded ``[B, max_len, D]``
            view). TorchEasyRec's ``sequence_length``.
        keep: what a row longer than ``max_len`` keeps: ``"last"`` (the default) its last
            ``max_len`` ids, a list's end being its most recent entry; ``"first"`` its first
            ``max_len`` ids, a list's start being its most recent entry (TorchEasyRec's encoders'
            ``max_seq_length``); ``"all"``: it is never truncated, a longer row is a bad row
            (``data.on_bad_row``), and a list's end is its most recent entry.
        separator: a string column holds the ids separated by it (``"1;2;3"``); empty pieces
            are ignored. List columns need none.
        query: the candidate's ``[[features.sparse]]`` features, one per entry of
            ``features`` and in that order (target attention's query); may be empty.
        features: the group's id sequences; every row has the same length in each (a row
            where they differ is a bad row, see ``data.on_bad_row``).
        dense: the group's numeric sequences, aligned with its id sequences (truncated by the
            same ``keep``), fed after the embeddings in the group's ``[B, max_len, D]`` view.
    """

    name: str
    max_len: int
    features: tuple[SequenceFeatureConfig, ...] = ()
    dense: tuple[SequenceDenseConfig, ...] = ()
    separator: Optional[str] = attrs.field(default=None, validator=_non_empty_text)
    query: tuple[str, ...] = ()
    keep: Literal["last", "first", "all"] = "last"


@attrs.frozen
class FeaturesConfig:
    """``[features]``: the model's inputs.

    Attributes:
        dense: ``[[features.dense]]``, the float inputs, in the order models see them.
        sparse: ``[[features.sparse]]``, the categorical id inputs, each with an embedding table.
        sequence: ``[[features.sequence]]``, groups of aligned id sequences, looked up unpooled.
    """

    dense: tuple[DenseFeatureConfig, ...] = ()
    sparse: tuple[SparseFeatureConfig, ...] = ()
    sequence: tuple[SequenceGroupConfig, ...] = ()
