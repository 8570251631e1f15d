"""The core config schema: frozen attrs classes, one per TOML section.

Component sections (``type = "..."`` tables) are :class:`Component`s: the first pass keeps their
other keys raw; the second pass structures them into the config class the component's plugin
registered (see :mod:`tzrun.config.load`). Relative paths are relative to the working directory.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Optional

import attrs

__all__ = [
    "Component",
    "OptimizerFields",
    "LossFields",
    "MetricFields",
    "DataConfig",
    "DenseFeatureConfig",
    "SparseFeatureConfig",
    "FeaturesConfig",
    "TrainConfig",
    "EvalConfig",
    "PluginsConfig",
    "RunConfig",
]


@attrs.frozen
class Component:
    """A ``{ type = "name", ...options }`` table.

    Attributes:
        type: the registered name of the component.
        raw: every other key of the table, as TOML gave it.
        config: the plugin's options instance (set by the second pass).
        fields: the core-read keys of the table, structured (set by the second pass):
            :class:`OptimizerFields`, :class:`LossFields` or :class:`MetricFields`.
    """

    type: str
    raw: Mapping[str, Any] = attrs.field(factory=dict)
    config: Any = None
    fields: Any = None


@attrs.frozen
class OptimizerFields:
    """Keys of an optimizer table that tzrec-run reads itself.

    Attributes:
        lr_schedule: the schedule of this optimizer's learning rate (default ``constant``).
    """

    lr_schedule: Optional[Component] = None


@attrs.frozen
class LossFields:
    """Keys of a ``[[losses]]`` table that tzrec-run reads itself.

    Attributes:
        name: the loss's name in logs and results (default: its type).
        label: the label column it is computed against (default: the first of ``data.labels``).
        prediction: the model output it consumes (default: what the loss registered).
        weight: its factor in the total loss.
    """

    name: Optional[str] = None
    label: Optional[str] = None
    prediction: Optional[str] = None
    weight: float = 1.0


@attrs.frozen
class MetricFields:
    """Keys of a ``[[metrics]]`` table that tzrec-run reads itself (see :class:`LossFields`)."""

    name: Optional[str] = None
    label: Optional[str] = None
    prediction: Optional[str] = None


@attrs.frozen
class DataConfig:
    """``[data]``: inputs, batching and labels.

    Attributes:
        train_input: training data: a file, a directory or a glob.
        eval_input: evaluation data; unset means no evaluation.
        batch_size: rows per step on each rank.
        eval_batch_size: rows per evaluation step on each rank (default: ``batch_size``).
        num_workers: DataLoader worker processes per rank (0 reads in the training process).
        labels: label columns, in the order models see them.
        sample_weight: a column of per-row loss and metric weights (default: all rows 1).
        reader: the reader component (default ``{ type = "parquet" }``).
    """

    train_input: str
    eval_input: Optional[str] = None
    batch_size: int = 1024
    eval_batch_size: Optional[int] = None
    num_workers: int = 0
    labels: tuple[str, ...] = ("label",)
    sample_weight: Optional[str] = None
    reader: Component = Component("parquet")


@attrs.frozen
class DenseFeatureConfig:
    """``[[features.dense]]``: a float input.

    Attributes:
        name: the feature's name.
        column: its input column (default: ``name``).
        fill_value: the value of a missing (null) entry.
        log1p: feed ``log(1 + max(x, 0))`` instead of ``x`` (for counts).
    """

    name: str
    column: Optional[str] = None
    fill_value: float = 0.0
    log1p: bool = False


@attrs.frozen
class SparseFeatureConfig:
    """``[[features.sparse]]``: a categorical id input with an embedding table.

    Attributes:
        name: the feature's name (its key in the batch's KeyedJaggedTensor).
        column: its input column (default: ``name``).
        num_buckets: integer ids in ``[0, num_buckets)``; set this or ``hash_bucket_size``.
        hash_bucket_size: strings hashed with FNV-1a 64 into this many buckets (integers
            are taken modulo it).
        embedding_dim: the embedding width; a multiple of 4 (FBGEMM's fused kernels need it).
        table: the embedding table's name; features naming one table share it (default:
            ``<name>_emb``).
        pooling: how a multi-id row is pooled, ``sum`` or ``mean``.
    """

    name: str
    column: Optional[str] = None
    num_buckets: Optional[int] = None
    hash_bucket_size: Optional[int] = None
    embedding_dim: int = 16
    table: Optional[str] = None
    pooling: Literal["sum", "mean"] = "sum"


@attrs.frozen
class FeaturesConfig:
    """``[features]``: the model's inputs."""

    dense: tuple[DenseFeatureConfig, ...] = ()
    sparse: tuple[SparseFeatureConfig, ...] = ()


@attrs.frozen
class TrainConfig:
    """``[train]``: the training loop.

    Attributes:
        sparse_optimizer: the embedding optimizer, fused into FBGEMM's kernels.
        dense_optimizer: the optimizer of every other parameter.
        num_steps: train this many steps (set this or ``num_epochs``).
        num_epochs: train this many passes over ``data.train_input``.
        seed: seeds torch, numpy and Python's ``random`` on every rank.
        save_checkpoints_steps: also checkpoint and evaluate every N steps (0: only at the end).
        log_every_n_steps: the interval of train log lines (stages may have their own).
        pipeline: the TorchRec train pipeline (default ``sparse_dist``).
        stages: loop stages, in order (default: one ``progress`` stage).
    """

    sparse_optimizer: Component
    dense_optimizer: Component
    num_steps: Optional[int] = None
    num_epochs: Optional[int] = None
    seed: int = 0
    save_checkpoints_steps: int = 0
    log_every_n_steps: int = 100
    pipeline: Component = Component("sparse_dist")
    stages: tuple[Component, ...] = (Component("progress"),)


@attrs.frozen
class EvalConfig:
    """``[eval]``: evaluation passes.

    Attributes:
        num_steps: evaluate on at most this many batches per rank (default: the whole input).
        save_predictions: write each rank's eval predictions and labels to
            ``model_dir/predictions/step-N/rank-R.parquet``.
    """

    num_steps: Optional[int] = None
    save_predictions: bool = False


@attrs.frozen
class PluginsConfig:
    """``[plugins]``: which installed plugins this run uses.

    Attributes:
        disable: plugin names not to load (as ``tzrec-run plugins`` shows them).
    """

    disable: tuple[str, ...] = ()


@attrs.frozen
class RunConfig:
    """A whole run, as one TOML file describes it.

    Attributes:
        model_dir: where checkpoints, results and logs go (``--model-dir`` overrides it).
        data, features, model, train, eval, plugins: the sections.
        losses: ``[[losses]]``, summed (times their weights) into the training loss.
        metrics: ``[[metrics]]``, computed over all ranks at each evaluation.
    """

    model_dir: str
    data: DataConfig
    features: FeaturesConfig
    model: Component
    train: TrainConfig
    losses: tuple[Component, ...] = ()
    metrics: tuple[Component, ...] = ()
    eval: EvalConfig = EvalConfig()
    plugins: PluginsConfig = PluginsConfig()
