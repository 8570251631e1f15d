"""Sparse (embedding) optimizers: declarative specs that torchrec fuses into FBGEMM's kernels.

FBGEMM's CPU kernels fuse SGD, Adagrad and row-wise Adagrad; these three run everywhere.
"""

from __future__ import annotations

import attrs

from tzrun import SparseOptimizerSpec

__all__ = [
    "SparseSGDConfig",
    "SparseAdagradConfig",
    "SparseRowWiseAdagradConfig",
    "build_sgd",
    "build_adagrad",
    "build_rowwise_adagrad",
]

_positive = attrs.validators.gt(0.0)
_non_negative = attrs.validators.ge(0.0)


@attrs.frozen
class SparseSGDConfig:
    """Options of sparse ``sgd`` (FBGEMM ``EXACT_SGD``): ``w -= lr * g`` on the touched rows.

    Attributes:
        lr: learning rate.
    """

    lr: float = attrs.field(validator=_non_negative)


@attrs.frozen
class SparseAdagradConfig:
    """Options of sparse ``adagrad`` (FBGEMM ``EXACT_ADAGRAD``): an accumulator per element.

    Attributes:
        lr: learning rate.
        eps: added to the root of the accumulator.
    """

    lr: float = attrs.field(validator=_non_negative)
    eps: float = attrs.field(default=1e-8, validator=_positive)


@attrs.frozen
class SparseRowWiseAdagradConfig:
    """Options of sparse ``rowwise_adagrad`` (FBGEMM ``EXACT_ROWWISE_ADAGRAD``): one accumulator
    per embedding row (the mean of the squared gradient over the row), so the optimizer state
    is one float per row instead of one per element.

    Attributes:
        lr: learning rate.
        eps: added to the root of the accumulator.
        weight_decay: L2 weight decay on the touched rows.
    """

    lr: float = attrs.field(validator=_non_negative)
    eps: float = attrs.field(default=1e-8, validator=_positive)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)


def build_sgd(cfg: SparseSGDConfig) -> SparseOptimizerSpec:
    """The spec of fused SGD."""
    from torchrec.optim.optimizers import SGD

    return SparseOptimizerSpec(SGD, {"lr": cfg.lr}, "EXACT_SGD")


def build_adagrad(cfg: SparseAdagradConfig) -> SparseOptimizerSpec:
    """The spec of fused Adagrad."""
    from torchrec.optim.optimizers import Adagrad

    return SparseOptimizerSpec(Adagrad, {"lr": cfg.lr, "eps": cfg.eps}, "EXACT_ADAGRAD")


def build_rowwise_adagrad(cfg: SparseRowWiseAdagradConfig) -> SparseOptimizerSpec:
    """The spec of fused row-wise Adagrad."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    kwargs = {"lr": cfg.lr, "eps": cfg.eps}
    if cfg.weight_decay:
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

        kwargs.update(weight_decay=cfg.weight_decay, weight_decay_mode=WeightDecayMode.L2)
    return SparseOptimizerSpec(RowWiseAdagrad, kwargs, "EXACT_ROWWISE_ADAGRAD")
