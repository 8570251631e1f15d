"""The core config schema: frozen attrs classes, one per TOML section.

Component sections (``type = "..."`` tables) are :class:`Component`s: the first pass keeps their
other keys raw; the second pass structures them into the config class the component's plugin
registered (see :mod:`tzrun.config.load`). Relative paths are relative to the working directory.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import attrs

from tzrun.config.base import Component, _in_unit_open, _non_negative, _positive
from tzrun.config.features_schema import (
    DenseFeatureConfig,
    EmbeddingConstraintsConfig,
    FeaturesConfig,
    SequenceDenseConfig,
    SequenceFeatureConfig,
    SequenceGroupConfig,
    SparseFeatureConfig,
    ZchConfig,
)
from tzrun.config.component_fields import (
    DenseOptimizerFields,
    EMAConfig,
    LossFields,
    MetricFields,
    PartFields,
    SparseOptimizerFields,
    TrainMetricFields,
)

__all__ = [
    "SEQUENCE_LENGTH",
    "Component",
    "SparseOptimizerFields",
    "DenseOptimizerFields",
    "PartFields",
    "EMAConfig",
    "GradScalerConfig",
    "DerivedLabelConfig",
    "GradClippingConfig",
    "CompileConfig",
    "EmbeddingConstraintsConfig",
    "LossFields",
    "MetricFields",
    "TrainMetricFields",
    "DataConfig",
    "DenseFeatureConfig",
    "SparseFeatureConfig",
    "ZchConfig",
    "SequenceDenseConfig",
    "SequenceFeatureConfig",
    "SequenceGroupConfig",
    "FeaturesConfig",
    "TrainConfig",
    "EvalConfig",
    "PluginsConfig",
    "RunConfig",
]

#: ``data.sample_cost``'s value for "a row costs its sequences' lengths" (the default; see :mod:`tzrun.data.cost`)
SEQUENCE_LENGTH = "sequence_length"


@attrs.frozen
class DerivedLabelConfig:
    """A ``[[data.derived_labels]]`` table: a label computed from another column when a batch is
    read, named in ``data.labels`` (and in a loss's or metric's ``label``) like a column.

    The source column is read, then ``cast``, then ``map``-ped, then compared with ``op`` and
    ``value`` (1.0 where the comparison holds, else 0.0); set ``op`` with ``value``, ``map``,
    ``cast``, or several of them.

    Attributes:
        name: the label's name (not a column of the data).
        source: the column it is computed from.
        op: ``">="``, ``">"``, ``"<="``, ``"<"``, ``"=="`` or ``"!="``: ``source <op> value``.
        value: the number ``op`` compares with.
        map: source values (as TOML keys: ``"5"``, ``"click"``) to label values.
        default: the label of a source value ``map`` does not hold (unset: such a row is a
            bad row, see ``data.on_bad_row``).
        cast: ``"float"`` reads a text column as numbers; ``"int"`` also truncates toward zero.
    """

    name: str
    source: str
    op: Optional[Literal[">=", ">", "<=", "<", "==", "!="]] = None
    value: Optional[float] = None
    map: Optional[dict[str, float]] = None
    default: Optional[float] = None
    cast: Optional[Literal["float", "int"]] = None


def _fraction(instance: Any, attribute: Any, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be between 0 and 1, got {value}", attribute)


@attrs.frozen
class DataConfig:
    """``[data]``: inputs, batching and labels.

    Attributes:
        train_input: training data: a file, a directory (the built-in readers search it
            recursively) or a glob (``**`` allowed).
        eval_input: evaluation data; unset means no evaluation.
        batch_size: rows per step on each rank (at least 1).
        eval_batch_size: rows per evaluation step on each rank (default: ``batch_size``).
        num_workers: DataLoader worker processes per rank (0 reads in the training process);
            each worker builds batches with one intra-op thread. The order of the batches depends
            on it (the same rows, another order). See docs/data.md, Reading in the training
            process or in workers.
        labels: label columns, in the order models see them (at least one); a name of
            ``derived_labels`` is computed from its source column.
        derived_labels: labels computed from another column (``[[data.derived_labels]]``,
            e.g. ``name = "clicked", source = "rating", op = ">=", value = 4``).
        sample_weight: a column of non-negative per-row loss and metric weights (default: all
            rows 1).
        reader: the reader component (default ``{ type = "parquet" }``).
        on_bad_row: a row with an id outside its table, an infinite dense value, a null, NaN
            or infinite label, a label outside what its losses and metrics accept (0/1 for
            ``binary_cross_entropy``), a null, NaN, infinite or negative sample weight, or a null group
            key stops the run with an error naming the file and column (``"error"``), or is
            dropped and counted in the logs (``"skip"``). NaN in a dense feature takes its
            ``fill_value``, like a null. So do a malformed line (wrong number of fields, a
            truncated last line, a quote that does not close on its line) and a field that does not parse as its column's type, for
            readers that isolate them (``csv``). A missing column or a column of the wrong
            type is always an error.
        max_bad_row_fraction: with ``on_bad_row = "skip"``, the run stops with an error at a
            checkpoint boundary where the training rows left out so far, over all ranks, are
            more than this fraction of the rows read (default 0.01); ``1`` never stops.
        shuffle_buffer_rows: shuffle training rows within windows of about this many rows
            (rounded down to whole batches, at least one batch) of each DataLoader worker's
            run, with a permutation drawn from ``train.seed``, the epoch and the window's
            position; 0 (default) reads rows in input order. Every row is still read exactly
            once per epoch, and resume stays exact. Evaluation input is never shuffled. See
            docs/data.md, Shuffling.
        prefetch_batches: with ``num_workers = 0``, a background thread of the training
            process reads and builds up to this many batches ahead, overlapping reading,
            decoding and hashing with the step (0: each batch is built when the loop asks for
            it). With workers, the DataLoader prefetches instead. On few cores this beats
            worker processes (no copies between processes, no process competing for the
            cores); see docs/data.md, Reading in the training process or in workers.
        reader_nice: how much lower the prefetch thread and the DataLoader workers run than
            the training step (their nice value is raised by this much, up to 19; Linux only;
            0 keeps the trainer's). On few cores the step's threads keep every core busy, and
            a reading thread that takes a core stalls the step's parallel regions at their
            barriers, costing about twice its CPU time; at a lower priority reading runs in
            the step's idle moments instead. See docs/data.md, Reading in the training
            process or in workers.
        batch_cost_size: cost-aware training batches: a batch closes when its rows' summed
            ``sample_cost`` would pass this (it still holds at most ``batch_size`` rows; a row
            costing more alone is a batch of its own, with a warning). Unset (default): batches
            of ``batch_size`` rows. Not with ``shuffle_buffer_rows``. See docs/data.md,
            Cost-aware batches.
        sample_cost: a row's cost under ``batch_cost_size``: a numeric column, or
            ``"sequence_length"`` (default): 1 plus the row's sequence lengths, each group's at
            most its ``max_len``.
        sampler: where a two-tower model's sampled negatives come from (``{ type =
            "negative", item_table = "...", ... }``; default: none, in-batch negatives only).
            Each batch, training and evaluation alike, carries that many sampled items after
            its own rows. See docs/retrieval.md.
    """

    train_input: str
    eval_input: Optional[str] = None
    batch_size: int = 1024
    eval_batch_size: Optional[int] = None
    num_workers: int = 0
    labels: tuple[str, ...] = ("label",)
    sample_weight: Optional[str] = None
    reader: Component = Component("parquet")
    on_bad_row: Literal["error", "skip"] = "error"
    max_bad_row_fraction: float = attrs.field(default=0.01, validator=_fraction)
    shuffle_buffer_rows: int = attrs.field(default=0, validator=_non_negative)
    prefetch_batches: int = attrs.field(default=2, validator=_non_negative)
    reader_nice: int = attrs.field(default=10, validator=attrs.validators.and_(attrs.validators.ge(0), attrs.validators.le(19)))
    sampler: Optional[Component] = None
    derived_labels: tuple[DerivedLabelConfig, ...] = ()
    batch_cost_size: Optional[int] = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    sample_cost: str = SEQUENCE_LENGTH


@attrs.frozen
class GradScalerConfig:
    """``[train.grad_scaler]``: dynamic loss scaling for ``mixed_precision = "fp16"``
    (``torch.amp.GradScaler``).

    Attributes:
        init_scale: the first scale factor.
        growth_factor: the scale is multiplied by it after ``growth_interval`` clean steps
            (above 1).
        backoff_factor: the scale is multiplied by it after a step with inf/NaN gradients
            (that step is skipped).
        growth_interval: clean steps between two growths.
    """

    init_scale: float = attrs.field(default=65536.0, validator=_positive)
    growth_factor: float = 2.0
    backoff_factor: float = attrs.field(default=0.5, validator=_in_unit_open)
    growth_interval: int = attrs.field(default=2000, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be above 1, got {self.growth_factor}")


@attrs.frozen
class GradClippingConfig:
    """``[train.grad_clipping]``: clipping of the dense gradients before each dense step.

    Sparse (embedding) gradients are clipped inside FBGEMM's kernel instead: see the
    ``gradient_clipping`` option of the sparse optimizers.

    Attributes:
        by: ``"norm"`` scales all dense gradients together so that their global norm is at
            most ``max_gradient``; ``"value"`` clamps each element to ``[-max_gradient, max_gradient]``.
        max_gradient: the bound.
        norm_type: the p of the p-norm (``inf`` for the max norm); only for ``by = "norm"``.
    """

    by: Literal["norm", "value"] = "norm"
    max_gradient: float = attrs.field(default=1.0, validator=_positive)
    norm_type: float = attrs.field(default=2.0, validator=_positive)


@attrs.frozen
class CompileConfig:
    """``[train.compile]``: compile the dense part of the model and the losses with
    ``torch.compile`` (TorchInductor), for training and evaluation.

    Every largest submodule of the model that holds no embedding collection, and every loss,
    is compiled in place (``nn.Module.compile``); the sharded embedding collections and the
    model's own ``forward`` glue stay eager. State dict keys and checkpoints are unchanged. See
    docs/optimizers.md, Compiling the dense part.

    Attributes:
        enabled: compile (default false: measured no faster on a 2-core CPU; see the docs).
        mode: ``torch.compile``'s mode.
        dynamic: ``torch.compile``'s ``dynamic`` (unset: static shapes first, dynamic after a
            shape changes, such as a shorter last batch).
    """

    enabled: bool = False
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    dynamic: Optional[bool] = None


@attrs.frozen
class TrainConfig:
    """``[train]``: the training loop.

    Attributes:
        sparse_optimizer: the embedding optimizer, fused into FBGEMM's kernels.
        dense_optimizer: the optimizer of every other parameter.
        num_steps: train this many steps (at least 1); set exactly one of ``num_steps`` and
            ``num_epochs``.
        num_epochs: train this many passes over ``data.train_input`` (at least 1).
        seed: seeds torch, numpy and Python's ``random`` on every rank.
        save_checkpoints_steps: also checkpoint and evaluate every N steps (0: only at the end).
        save_checkpoints_epochs: also checkpoint and evaluate at the end of every N-th epoch.
        keep_checkpoint_max: keep at most this many checkpoints, the newest (0: keep all); the
            best one (``eval.best_metric``) is never removed. See docs/checkpoints.md,
            Retention and the best checkpoint.
        async_checkpoint: write checkpoints behind training (DCP's ``async_save``): the state
            is copied to CPU memory at the step, then written while training goes on; the
            completion marker is still written last, one save at a time, and the run ends
            only once the last one is complete. Costs a copy of the checkpoint in host memory.
            See docs/checkpoints.md, Saving behind training.
        async_checkpoint_budget_gb: the most host memory (GiB, this host's ranks together) a
            save behind training may copy the state into; a checkpoint whose copy would need
            more is written synchronously instead (training waits for it), and the log says
            so. Unset: the memory the host has available at that step.
        on_nonfinite_loss: a NaN or infinite loss, or a gradient that is NaN, infinite or
            squares past float32 (Adam's and Adagrad's state would turn infinite), stops the
            run naming the step and the parameter (``"error"``), or its update is skipped and
            counted (``"skip"``); either way before it reaches a checkpoint. See
            docs/checkpoints.md, Non-finite losses and gradients.
        log_every_n_steps: the interval of the train log: every N steps the loop makes one
            record (mean loss, learning rates, samples/s, data wait, gradient norm) that the
            stages show, plot and write (one device sync per interval; see docs/stages.md).
        pipeline: the TorchRec train pipeline (default ``sparse_dist``).
        stages: loop stages, called in this order (default: ``progress`` and
            ``metrics_log``; ``[]`` for none; see docs/stages.md).
        loss_weighting: how the ``[[losses]]`` (each times its ``weight``) make the training
            loss: ``sum`` (default) or ``pareto`` (Pareto-efficient weights at every step; see
            docs/losses.md, Loss weighting). Evaluation always sums them.
        gradient_accumulation_steps: the dense optimizer steps once per this many batches,
            on the mean of their gradients; embeddings are still updated at every batch, with
            that batch's own (unscaled) gradient (see docs/optimizers.md, Gradient accumulation).
        mixed_precision: run the model and losses under ``torch.autocast`` in ``"bf16"`` or
            ``"fp16"`` (unset: float32).
        grad_scaler: dynamic loss scaling; only with ``mixed_precision = "fp16"``.
        grad_clipping: clip the dense gradients before each dense step.
        global_embedding_constraints: the sharding types and kernels the planner may choose for
            every table (a feature's ``embedding_constraints`` override the keys they set; see
            docs/plan.md, Constraints).
        tune_malloc: on Linux with glibc, keep freed memory in the process instead of handing it
            back to the kernel at every step (``mallopt``: ``M_MMAP_THRESHOLD`` 32 MiB,
            ``M_TRIM_THRESHOLD`` 1 GiB, ``M_TOP_PAD`` 64 MiB), in every rank; a setting given
            through glibc's own variables (``MALLOC_MMAP_THRESHOLD_``,
            ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``) is left alone; false keeps glibc's
            defaults. See :mod:`tzrun.runner.allocator`.
        cudnn_allow_tf32: set ``torch.backends.cudnn.allow_tf32`` (unset: torch's default).
        cuda_matmul_allow_tf32: set ``torch.backends.cuda.matmul.allow_tf32`` (unset: torch's
            default). Both only affect CUDA devices.
        rank_timeout_s: with several ranks, a rank whose heartbeat (written every few seconds
            by a thread of its own, also during a long step or save) is older than this many
            seconds is declared lost and the job ends, naming it (a frozen or vanished rank;
            see docs/howto/multi_process.md, When a rank fails). Only a process that is frozen as a
            whole stops beating, so the default of 60 s holds on every device; raise it where
            a host may pause longer (heavy swapping).
        compile: compile the dense part and the losses (``[train.compile]``; off by default).
        collective_timeout_s: how long a collective (an all-reduce, a barrier, the sparse
            all-to-all) may wait for the other ranks before it fails, naming this key: a step,
            an evaluation or a checkpoint save on one rank that takes longer than this while
            the others wait must raise it (torch's own default is 1800 s).
    """

    sparse_optimizer: Component
    dense_optimizer: Component
    num_steps: Optional[int] = None
    num_epochs: Optional[int] = None
    seed: int = 0
    save_checkpoints_steps: int = 0
    save_checkpoints_epochs: Optional[int] = None
    keep_checkpoint_max: int = 0
    async_checkpoint: bool = False
    async_checkpoint_budget_gb: Optional[float] = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    on_nonfinite_loss: Literal["error", "skip"] = "error"
    log_every_n_steps: int = 100
    pipeline: Component = Component("sparse_dist")
    stages: tuple[Component, ...] = (Component("progress"), Component("metrics_log"))
    loss_weighting: Component = Component("sum")
    gradient_accumulation_steps: int = 1
    mixed_precision: Optional[Literal["bf16", "fp16"]] = None
    grad_scaler: Optional[GradScalerConfig] = None
    grad_clipping: Optional[GradClippingConfig] = None
    global_embedding_constraints: Optional[EmbeddingConstraintsConfig] = None
    tune_malloc: bool = True
    cudnn_allow_tf32: Optional[bool] = None
    cuda_matmul_allow_tf32: Optional[bool] = None
    rank_timeout_s: float = attrs.field(default=60.0, validator=_positive)
    collective_timeout_s: float = attrs.field(default=300.0, validator=_positive)
    compile: CompileConfig = CompileConfig()


@attrs.frozen
class EvalConfig:
    """``[eval]``: evaluation passes.

    Attributes:
        num_steps: evaluate on at most this many batches per rank (default: the whole input).
        save_predictions: write what each rank evaluated (every model output,
            ``label/<column>``, ``weight`` and the ``group_by`` keys as ``group/<column>``) to
            ``model_dir/predictions/step-N/rank-R.parquet``.
        best_metric: the eval result (a metric name, or ``loss/<name>``) that picks the best
            checkpoint, recorded in ``model_dir/best.json`` (``tzrec-run evaluate --checkpoint
            best``; never pruned); needs ``data.eval_input``.
        best_mode: whether larger (``"max"``) or smaller (``"min"``) values of it are better.
    """

    num_steps: Optional[int] = None
    save_predictions: bool = False
    best_metric: Optional[str] = None
    best_mode: Literal["max", "min"] = "max"


@attrs.frozen
class PluginsConfig:
    """``[plugins]``: which installed plugins this run uses.

    Attributes:
        disable: plugin names not to load (as ``tzrec-run plugins`` shows them);
            ``TZRUN_DISABLE_PLUGINS`` (comma-separated) adds to it.
        strict: make every plugin problem an error with its full traceback (a plugin that
            fails to import, does not match the hookspecs, or registers something malformed),
            instead of a warning that disables that plugin; like ``--strict`` and
            ``TZRUN_STRICT_PLUGINS=1``.
    """

    disable: tuple[str, ...] = ()
    strict: bool = False


@attrs.frozen
class RunConfig:
    """A whole run, as one TOML file describes it.

    Attributes:
        model_dir: where checkpoints, results and logs go (``--model-dir`` overrides it).
        data: ``[data]``, the inputs, batching and labels.
        features: ``[features]``, the model's inputs.
        model: ``[model]``, the model component and its options.
        train: ``[train]``, the training loop, its optimizers, pipeline and stages.
        eval: ``[eval]``, evaluation passes and the best checkpoint.
        plugins: ``[plugins]``, which installed plugins this run uses.
        losses: ``[[losses]]``, summed (times their weights) into the training loss; at least
            one.
        metrics: ``[[metrics]]``, computed over all ranks at each evaluation (they need
            ``data.eval_input``).
        train_metrics: ``[[train_metrics]]``, computed on training batches over windows of
            ``decay_step`` steps and shown decayed in the train log lines.
    """

    model_dir: str
    data: DataConfig
    features: FeaturesConfig
    model: Component
    train: TrainConfig
    losses: tuple[Component, ...] = ()
    metrics: tuple[Component, ...] = ()
    train_metrics: tuple[Component, ...] = ()
    eval: EvalConfig = EvalConfig()
    plugins: PluginsConfig = PluginsConfig()
