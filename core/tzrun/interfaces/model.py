"""What a model plugin builds from: its features, embedding tables and sequence groups
(:class:`ModelContext`), and how the tables train (:class:`SparseOptimizerSpec`, what a
sparse optimizer plugin returns). Import them from :mod:`tzrun.interfaces`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional

import attrs

__all__ = [
    "SparseOptimizerSpec",
    "DenseFeature",
    "SparseFeature",
    "EmbeddingTable",
    "SequenceGroup",
    "ModelContext",
]


@attrs.frozen
class SparseOptimizerSpec:
    """What a sparse optimizer plugin returns: applied by the core at sharding time.

    Attributes:
        optimizer_class: a torchrec optimizer class (``torchrec.optim.optimizers.SGD``,
            ``torchrec.optim.rowwise_adagrad.RowWiseAdagrad``, ...) that torchrec maps to an
            FBGEMM ``EmbOptimType`` when it fuses the update into the embedding kernels.
        kwargs: its keyword arguments (``lr``, ``eps``, ...), passed as FBGEMM fused params.
        fbgemm_type: the FBGEMM ``EmbOptimType`` name it maps to (``"EXACT_ROWWISE_ADAGRAD"``).
        cpu_supported: whether FBGEMM's CPU kernels fuse this optimizer.
        initial_accumulator_value: the starting value of the optimizer's ``momentum1`` state
            (Adagrad's sum of squares); the core writes it into FBGEMM's state after sharding.
        torch_fallback: for an optimizer FBGEMM cannot fuse on CPU, ``fallback(params)``
            returns the equivalent ``torch.optim.Optimizer`` that trains the table
            data-parallel when the user opts in (``cpu_policy = "data_parallel"``); None when
            there is no equivalent.
    """

    optimizer_class: type
    kwargs: Mapping[str, Any]
    fbgemm_type: str
    cpu_supported: bool = True
    initial_accumulator_value: float = 0.0
    torch_fallback: Optional[Callable[[Iterable[Any]], Any]] = None


@attrs.frozen
class DenseFeature:
    """A float input column, fed to the model in ``batch.dense`` (in config order): nulls
    and NaN take ``fill_value``, then ``log(1 + max(x, 0))`` if ``log1p``, then
    ``(x - mean) / std``."""

    name: str
    column: str
    fill_value: float = 0.0
    log1p: bool = False
    mean: float = 0.0
    std: float = 1.0


@attrs.frozen
class SparseFeature:
    """A categorical id input column, fed to the model as one key of ``batch.sparse``.

    Exactly one way of turning values into ids is set: ``num_buckets`` (integer ids in
    ``[0, num_buckets)``), ``hash_bucket_size`` (strings hashed with FNV-1a 64 into that many
    buckets, integers taken modulo it), ``vocab`` (token ``vocab[i]`` is id ``i + 1``, any
    other token id 0), ``boundaries`` (a number ``x`` is id ``#{b in boundaries: b <= x}``) or
    ``zch_size`` (collision-free ids: every value becomes a 63-bit raw id that TorchRec's
    managed-collision module maps to one of ``zch_size`` rows, see docs/zch.md).

    Attributes:
        separator: a string column holds several values per row, split on it.
        weight_column: the column of per-id weights (a list column parallel to ``column``,
            or a string split on ``separator``), fed as the KeyedJaggedTensor's weights.
        pooling: how the feature's ids of a row are pooled, ``"sum"`` or ``"mean"``, as
            configured (its table's pooling can differ: see :attr:`EmbeddingTable.weighted`).
    """

    name: str
    column: str
    table: str
    num_buckets: int | None = None
    hash_bucket_size: int | None = None
    vocab: tuple[str, ...] | None = None
    boundaries: tuple[float, ...] | None = None
    separator: str | None = None
    weight_column: str | None = None
    pooling: str = "sum"
    zch_size: int | None = None

    @property
    def num_embeddings(self) -> int:
        """Rows of the embedding table this feature needs."""
        if self.zch_size is not None:
            return self.zch_size
        if self.vocab is not None:
            return len(self.vocab) + 1
        if self.boundaries is not None:
            return len(self.boundaries) + 1
        return int(self.num_buckets if self.num_buckets is not None else self.hash_bucket_size)


@attrs.frozen
class EmbeddingTable:
    """An embedding table and the sparse features that look it up.

    Attributes:
        weighted: the batch's KeyedJaggedTensor carries per-id weights for this table's
            features: look it up with an ``EmbeddingBagCollection`` built with
            ``is_weighted=True`` (see :attr:`ModelContext.is_weighted`). When any feature of a
            run has a ``weight_column``, every table is weighted and summed: features without
            weights get weight 1, and a ``mean``-pooled feature gets ``w / len`` of its row, so
            the weighted sum is its (weighted) mean; :attr:`pooling` is then ``"sum"``.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    pooling: str = "sum"
    weighted: bool = False


@attrs.frozen
class SequenceGroup:
    """A ``[[features.sequence]]`` group: aligned id sequences of one behaviour, fed unpooled as
    keys of ``batch.sequence`` (see :mod:`tzrun.sequence` for the padded ``[B, L, D]`` view).

    Attributes:
        name: the group's name.
        max_len: the longest sequence a row carries (what a longer input row kept is ``keep``).
        features: the aligned sequences (each a key of ``batch.sequence``); ``separator`` is
            the group's and ``pooling`` means nothing here.
        query: the names of the candidate's ``[[features.sparse]]`` features, one per entry of
            ``features`` (same widths), or ``()``.
        keep: the group's truncation rule: ``"last"`` (a longer input row kept its last
            ``max_len`` ids; a row's last id is its most recent), ``"first"`` (its first
            ``max_len``; a row's first id is its most recent) or ``"all"`` (no row was longer;
            a row's last id is its most recent).
        dense: the numeric sequences aligned with ``features`` (``[[features.sequence.dense]]``),
            normalised as a :class:`DenseFeature` is; ``batch.sequence_dense[name]`` carries them
            as ``[B, max_len, len(dense)]``, and the group's ``[B, max_len, D]`` view ends with them.
    """

    name: str
    max_len: int
    features: tuple[SparseFeature, ...]
    query: tuple[str, ...] = ()
    keep: str = "last"
    dense: tuple[DenseFeature, ...] = ()

    @property
    def recent_first(self) -> bool:
        """Whether a row's first id is its most recent (``keep = "first"``)."""
        return self.keep == "first"


@attrs.frozen
class ModelContext:
    """What a model plugin's ``build(cfg, ctx)`` receives.

    Attributes:
        dense_features: float features, in the column order of ``batch.dense``.
        sparse_features: every ``[[features.sparse]]`` feature; those of
            :meth:`unpooled_sparse_features` are keys of ``batch.sequence``, the others of
            ``batch.sparse``.
        tables: the pooled embedding tables (an ``EmbeddingBagCollection``'s: see
            :meth:`embedding_bag_configs`).
        embedding_device: device to build embedding collections on (``meta``: TorchRec's
            sharding materializes them on the right rank).
        labels: label names, in the order of ``batch.labels``' keys.
        sequence_groups: the ``[[features.sequence]]`` groups (``()`` without sequences).
        sequence_tables: the tables looked up unpooled (an ``EmbeddingCollection``'s: see
            :meth:`embedding_configs`): every table a sequence or a group's query reads.
    """

    dense_features: tuple[DenseFeature, ...]
    sparse_features: tuple[SparseFeature, ...]
    tables: tuple[EmbeddingTable, ...]
    embedding_device: Any
    labels: tuple[str, ...]
    sequence_groups: tuple[SequenceGroup, ...] = ()
    sequence_tables: tuple[EmbeddingTable, ...] = ()

    def unpooled_sparse_features(self) -> tuple[str, ...]:
        """The ``[[features.sparse]]`` features whose table is looked up unpooled (it is shared
        with a sequence, or the feature is a query): keys of ``batch.sequence``, not of
        ``batch.sparse``; get their pooled embedding with
        :meth:`tzrun.sequence.SequenceFeatures.pooled`."""
        unpooled = {name for t in self.sequence_tables for name in t.feature_names}
        return tuple(f.name for f in self.sparse_features if f.name in unpooled)

    def embedding_configs(self) -> list[Any]:
        """TorchRec ``EmbeddingConfig``s for :attr:`sequence_tables`, ready for an
        ``EmbeddingCollection(tables=..., device=ctx.embedding_device)`` (TorchRec wants one
        width per collection: :class:`tzrun.sequence.SequenceEmbeddings` builds one per width)."""
        from torchrec import EmbeddingConfig

        return [
            EmbeddingConfig(
                name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                feature_names=list(t.feature_names),
            )
            for t in self.sequence_tables
        ]

    @property
    def is_weighted(self) -> bool:
        """Whether ``batch.sparse`` carries weights (some feature has a ``weight_column``):
        pass it as ``EmbeddingBagCollection(..., is_weighted=ctx.is_weighted)``. The weights
        then cover every key, so a collection over any subset of the tables is weighted too."""
        return any(t.weighted for t in self.tables)

    def embedding_bag_configs(self) -> list[Any]:
        """TorchRec ``EmbeddingBagConfig``s for :attr:`tables`, ready for an
        ``EmbeddingBagCollection(tables=..., device=ctx.embedding_device)``."""
        from torchrec import EmbeddingBagConfig, PoolingType

        return [
            EmbeddingBagConfig(
                name=t.name,
                num_embeddings=t.num_embeddings,
                embedding_dim=t.embedding_dim,
                feature_names=list(t.feature_names),
                pooling=PoolingType[t.pooling.upper()],
            )
            for t in self.tables
        ]
