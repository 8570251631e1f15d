"""The entry-point target: registers the components; imports nothing heavy."""

from __future__ import annotations

from typing import Any

import tzrun
from tzrun_contrib_optimizers import options


def _build_lion(cfg: options.LionConfig, params: Any) -> Any:
    from tzrun_contrib_optimizers.dense import build_lion

    return build_lion(cfg, params)


def _build_adabelief(cfg: options.AdaBeliefConfig, params: Any) -> Any:
    from tzrun_contrib_optimizers.dense import build_adabelief

    return build_adabelief(cfg, params)


def _build_inverse_sqrt(cfg: options.InverseSqrtConfig, optimizer: Any) -> Any:
    from tzrun_contrib_optimizers.schedules import build_inverse_sqrt

    return build_inverse_sqrt(cfg, optimizer)


def _build_ema_rowwise_adagrad(cfg: options.EmaRowWiseAdagradConfig) -> tzrun.SparseOptimizerSpec:
    from tzrun_contrib_optimizers.sparse import build_ema_rowwise_adagrad

    return build_ema_rowwise_adagrad(cfg)


@tzrun.hookimpl
def tzrun_register_dense_optimizers(register: tzrun.Register) -> None:
    register("lion", config=options.LionConfig, build=_build_lion,
             description="Lion: sign of an interpolated momentum (Chen et al. 2023)")
    register("adabelief", config=options.AdaBeliefConfig, build=_build_adabelief,
             description="AdaBelief: Adam scaled by the belief in the gradient (Zhuang et al. 2020)")


@tzrun.hookimpl
def tzrun_register_lr_schedulers(register: tzrun.Register) -> None:
    register("inverse_sqrt", config=options.InverseSqrtConfig, build=_build_inverse_sqrt,
             description="linear warmup, then lr * sqrt(timescale / steps) (fairseq's inverse_sqrt)")


@tzrun.hookimpl
def tzrun_register_sparse_optimizers(register: tzrun.Register) -> None:
    register("ema_rowwise_adagrad", config=options.EmaRowWiseAdagradConfig, build=_build_ema_rowwise_adagrad,
             description="FBGEMM fused row-wise Adagrad with an in-place EMA of each row's first half "
                         "into its second half (EMAINPLACE_ROWWISE_ADAGRAD); CPU and CUDA")
