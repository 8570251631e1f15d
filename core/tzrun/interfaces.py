"""The types that plugins receive and return: the public contract of each component kind.

Nothing here imports torch at module import time, so ``tzrec-run check`` and ``tzrec-run
plugins`` stay fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Mapping, Optional, Protocol, Sequence

import attrs

if TYPE_CHECKING:
    import pyarrow as pa

    from tzrun.config.schema import RunConfig

__all__ = [
    "Register",
    "RegisterLosses",
    "RegisterLossWeightings",
    "RegisterMetrics",
    "RegisterStages",
    "RegisterModels",
    "RegisterReaders",
    "SparseOptimizerSpec",
    "DenseFeature",
    "SparseFeature",
    "EmbeddingTable",
    "SequenceGroup",
    "ModelContext",
    "RowGroup",
    "Reader",
    "BAD_ROW_COLUMN",
    "BAD_ROW_SEPARATOR",
    "ItemSampler",
    "RunContext",
    "StepInfo",
    "TrainLog",
    "EvalResult",
]


class Register(Protocol):
    """The ``register`` callback of the registration hooks whose kinds take no kind-specific
    option: sparse and dense optimizers, lr schedules, train pipelines, samplers, commands (see
    :mod:`tzrun.hookspecs`). The other kinds have their own: :class:`RegisterLosses`,
    :class:`RegisterLossWeightings`, :class:`RegisterMetrics`, :class:`RegisterStages`,
    :class:`RegisterModels`, :class:`RegisterReaders`, so that a type checker refuses a
    misspelled keyword. Each one's keywords are the runtime's (``tzrun.kernel.registry.KINDS``):
    ``tests/plugin_kit/test_contract.py`` holds them equal."""

    def __call__(self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "") -> None: ...


class RegisterLosses(Protocol):
    """``register`` of ``tzrun_register_losses``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        prediction: str = "logits", group: Literal["none", "optional", "required"] = "none",
        labels: Optional[Literal["binary", "class_index", "non_negative", "finite"]] = None,
    ) -> None: ...


class RegisterLossWeightings(Protocol):
    """``register`` of ``tzrun_register_loss_weightings``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        check: Optional[Callable[..., Iterable[tuple[str, str]]]] = None,
    ) -> None: ...


class RegisterMetrics(Protocol):
    """``register`` of ``tzrun_register_metrics``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        prediction: str = "probs", group: Literal["none", "optional", "required"] = "none",
        labels: Optional[Literal["binary", "class_index", "non_negative", "finite"]] = None,
    ) -> None: ...


class RegisterStages(Protocol):
    """``register`` of ``tzrun_register_stages``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        check: Optional[Callable[..., Iterable[tuple[str, str]]]] = None,
        outputs: Optional[Callable[[Any], Sequence[str]]] = None,
    ) -> None: ...


class RegisterModels(Protocol):
    """``register`` of ``tzrun_register_models``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        outputs: Optional[Callable[[Any], Sequence[str]]] = None,
    ) -> None: ...


class RegisterReaders(Protocol):
    """``register`` of ``tzrun_register_readers``."""

    def __call__(
        self, name: str, *, config: type[Any], build: Callable[..., Any], description: str = "",
        check: Optional[Callable[..., Iterable[tuple[str, str]]]] = None,
    ) -> None: ...


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
    other token id 0) or ``boundaries`` (a number ``x`` is id ``#{b in boundaries: b <= x}``).

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

    @property
    def num_embeddings(self) -> int:
        """Rows of the embedding table this feature needs."""
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
        max_len: the longest sequence a row carries: a longer input row kept its last
            ``max_len`` ids (the end of a list is its most recent entry).
        features: the aligned sequences (each a key of ``batch.sequence``); ``separator`` is
            the group's and ``pooling`` means nothing here.
        query: the names of the candidate's ``[[features.sparse]]`` features, one per entry of
            ``features`` (same widths), or ``()``.
    """

    name: str
    max_len: int
    features: tuple[SparseFeature, ...]
    query: tuple[str, ...] = ()


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


@attrs.frozen
class RowGroup:
    """A readable unit of an input: a row group of a Parquet file, say.

    Attributes:
        path: the file it belongs to (named in errors).
        index: its index within the file.
        num_rows: how many rows it holds.
    """

    path: str
    index: int
    num_rows: int


#: The column a reader that sets ``isolates_bad_rows = True`` is asked for (among ``columns``)
#: under ``data.on_bad_row = "skip"``: see :class:`Reader`.
BAD_ROW_COLUMN = "__tzrun_bad_row__"
#: Separates the reasons of a row with several problems in :data:`BAD_ROW_COLUMN` (a reader
#: joins them with it; the core counts each reason).
BAD_ROW_SEPARATOR = "; "


class Reader(Protocol):
    """What a reader plugin's ``build(cfg)`` returns.

    Two more methods are optional; ``tzrec-run check`` uses them to check the input files'
    columns before a run (a reader without them is skipped there, with a note):

    * ``files(input_path) -> Sequence[str]``: the files of ``input_path``, in the order
      :meth:`row_groups` reads them, from a listing only (raises ``DataError`` naming the path
      when it matches nothing);
    * ``schema(path) -> pyarrow.Schema | None``: the columns of one file and the types
      :meth:`read` gives them, from metadata only (a Parquet footer, a CSV header line), or
      None for a file of which nothing is read (no rows); raises ``DataError`` naming the file
      when it cannot be read.

    Bad rows a reader can isolate (a malformed line, a field that does not parse as its
    column's type): with ``data.on_bad_row = "error"`` it raises ``DataError`` naming the file,
    the line and the column. A reader whose object has ``isolates_bad_rows = True`` is asked,
    under ``"skip"``, for the string column :data:`BAD_ROW_COLUMN` among ``columns``; it then
    keeps such a row in its place (nulls in its other columns) and gives the reason in that
    column (``"malformed line"``, ``"I1: not a number"``), null for a good row. The core leaves
    those rows out and counts them by reason, like the bad values it finds itself.
    """

    def row_groups(self, input_path: str) -> Sequence[RowGroup]:
        """Every row group of ``input_path`` (a file, a directory or a glob), in a stable
        order that is the same on every rank. Raises ``DataError`` naming the path when it
        matches nothing or cannot be read."""

    def read(
        self, group: RowGroup, start: int, stop: int, columns: Sequence[str]
    ) -> Iterator[pa.RecordBatch]:
        """Rows ``[start, stop)`` of ``group``, only ``columns``, as record batches in order.
        Raises ``DataError`` naming the file and the column when a column is missing.

        A reader may also have ``describe_row(group, row) -> str``: how an error names row
        ``row`` of ``group`` (``"line 151"``); without it errors say ``"row R of row group G"``."""


class ItemSampler(Protocol):
    """What a sampler plugin's ``build(cfg)`` returns (``[data.sampler]``): an item table and a
    way to draw negatives from it. The core encodes the table's feature columns once, with the
    run's ``[features]`` (those whose input column the table has), and appends the drawn items
    to every batch (see :mod:`tzrun.data.sampling`)."""

    @property
    def source(self) -> str:
        """The item table's file, named in errors."""

    @property
    def items(self) -> pa.Table:
        """One row per item; the columns are named like the input's (an id column and the
        item-side feature columns), and every other column is ignored."""

    @property
    def num_negatives(self) -> int:
        """Items drawn per batch."""

    def sample(self, rng: Any, batch: pa.Table) -> Any:
        """The rows of :attr:`items` drawn for one batch: an int64 numpy array of
        :attr:`num_negatives` row indices. ``rng`` is the batch's ``numpy.random.Generator``
        (seeded by the core from the run's seed, the rank, the pass and the step), the only
        source of randomness a sampler may use, so that a resumed run draws the same items.
        ``batch`` holds the batch's input rows of positive sample weight (its positives; no
        rows for a padding batch), for a sampler that leaves them out."""


@attrs.define
class RunContext:
    """What lifecycle hooks receive: the run, as one rank sees it.

    Attributes:
        config: the resolved run config.
        model_dir: where this run writes.
        run_id: the run's id (its model dir's ``.tzrec-run`` marker: new for a fresh run or
            ``--overwrite``, kept by ``--resume``); an output written outside the checkpoints
            (an export, a dump) records it, so that it is never taken for another run's.
            Empty outside training.
        rank, world_size, local_rank: this process in the job.
        device: the torch device of this rank.
        model: the (DistributedModelParallel) model.
        optimizer: the combined optimizer (sparse fused + dense).
        global_batch_size: rows per step over all ranks.
        stop_requested: set by a stage to end training at the next checkpoint boundary (the
            ranks agree there: any rank asking stops all).
        stop_reason: why, in a few words, for the log and the run's result (set it with
            ``stop_requested``).
        total_steps: the step the run ends at if nothing stops it early.
        steps_per_epoch: training steps in one pass over the data.
        start_step: the step the run (re)starts from (0 for a fresh run).
        dense_parameters: the parameters the dense optimizers train, by name (embedding
            tables are updated inside backward by their fused optimizers and are not here).
    """

    config: RunConfig
    model_dir: Path
    rank: int
    world_size: int
    local_rank: int
    device: Any
    model: Any = None
    optimizer: Any = None
    global_batch_size: int = 0
    stop_requested: bool = False
    stop_reason: str = ""
    total_steps: int = 0
    steps_per_epoch: int = 0
    start_step: int = 0
    dense_parameters: Mapping[str, Any] = attrs.field(factory=dict)
    run_id: str = ""

    @property
    def is_rank0(self) -> bool:
        """True on the process that writes shared outputs and logs at INFO."""
        return self.rank == 0


@attrs.define
class StepInfo:
    """One training step as lifecycle hooks see it.

    Attributes:
        step: global step number, starting at 1 for the first step of the run.
        epoch: 0-based data pass.
        loss: the step's total loss; an unsynchronized tensor (``.item()`` syncs).
        losses: each named loss, unsynchronized tensors.
        rows: rows of this step on this rank, padding excluded.
        learning_rates: the learning rate this step used, per optimizer ("sparse", "dense",
            "dense.parts[0]", ...).
        metrics: the decayed ``[[train_metrics]]`` values so far, by name (empty before the
            first window closes).
    """

    step: int
    epoch: int
    loss: Any
    losses: Mapping[str, Any]
    rows: int
    learning_rates: Mapping[str, float]
    metrics: Mapping[str, float] = attrs.field(factory=dict)


@attrs.frozen
class TrainLog:
    """One train log record, made every ``train.log_every_n_steps`` steps from the steps since
    the previous one (the window), identical for every stage that receives it.

    Values are this rank's own: no collective is issued to make them (``samples_per_s``
    scales this rank's rate by the world size).

    Attributes:
        step: the global step at the end of the window.
        epoch: the data pass of that step.
        steps: steps in the window.
        loss: the mean total loss over the window.
        losses: each named loss, mean over the window.
        learning_rates: the learning rate the last step used, per param group: the optimizer's
            key (``sparse``, ``dense``, ``dense.parts[0]``), with ``/<i>`` added when it has
            several groups.
        metrics: the decayed ``[[train_metrics]]`` values at the last step.
        samples_per_s: training rows per second over all ranks in the window.
        data_wait_fraction: the part of the window's wall time the loop spent waiting for
            the next batch (0: the input never held training back).
        grad_norm: the L2 norm of the dense parameters' gradients of the last dense update
            (embedding tables update inside backward and expose no gradient), or None.
        seconds: wall time of the window.
        time: when the record was made (seconds since the epoch).
        loss_weights: the weight of each loss, mean over the window, when the loss weighting
            computes them (``[train.loss_weighting] type = "pareto"``); empty otherwise.
        skipped_rows: input rows ``data.on_bad_row = "skip"`` left out on this rank since the
            process started (rows the train pipeline read ahead included).
        skipped_reasons: those rows per reason (``"malformed line"``, ``"I1: not a number"``,
            ``"label: NaN"``); a row with several problems counts under each.
        rss_bytes: this process's resident memory when the record was made (None where the
            system has no ``/proc``).
        device_memory_bytes: the most memory torch's CUDA allocator reserved on this rank's
            device during the window; None without a CUDA device.
    """

    step: int
    epoch: int
    steps: int
    loss: float
    losses: Mapping[str, float]
    learning_rates: Mapping[str, float]
    metrics: Mapping[str, float]
    samples_per_s: float
    data_wait_fraction: float
    grad_norm: Optional[float]
    seconds: float
    time: float
    loss_weights: Mapping[str, float] = attrs.field(factory=dict)
    skipped_rows: int = 0
    skipped_reasons: Mapping[str, int] = attrs.field(factory=dict)
    rss_bytes: Optional[int] = None
    device_memory_bytes: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (what ``metrics_log`` writes, with ``"kind": "train"``)."""
        return attrs.asdict(self)


@attrs.frozen
class EvalResult:
    """The values of an evaluation pass, over all ranks' rows.

    Attributes:
        step: the global step evaluated.
        metrics: every metric and ``loss/<name>``, by name.
        rows: eval rows over all ranks (padding excluded).
        seconds: wall time of the pass on this rank, metric computation included.
    """

    step: int
    metrics: Mapping[str, float]
    rows: int
    seconds: float = 0.0
