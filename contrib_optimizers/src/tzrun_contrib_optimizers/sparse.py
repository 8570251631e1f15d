"""The sparse optimizer ``ema_rowwise_adagrad``: a spec that TorchRec fuses into FBGEMM as
``EMAINPLACE_ROWWISE_ADAGRAD`` (update rule in
:class:`~tzrun_contrib_optimizers.options.EmaRowWiseAdagradConfig`).

TorchRec has no optimizer class for this FBGEMM type; its sharders take the type from an
explicit ``optimizer`` entry of the fused parameters, next to the class (row-wise Adagrad)
that describes the optimizer state to TorchRec's planner. FBGEMM's CPU kernels run it.
"""

from __future__ import annotations

from tzrun import SparseOptimizerSpec
from tzrun_contrib_optimizers.options import EmaRowWiseAdagradConfig

__all__ = ["FBGEMM_TYPE", "build_ema_rowwise_adagrad"]

FBGEMM_TYPE = "EMAINPLACE_ROWWISE_ADAGRAD"


def build_ema_rowwise_adagrad(cfg: EmaRowWiseAdagradConfig) -> SparseOptimizerSpec:
    """The spec of fused row-wise Adagrad with the in-place EMA."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.tbe.config.optimizer_config import EmainplaceModeDefinition
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    kwargs = {
        "lr": cfg.lr,
        "eps": cfg.eps,
        "optimizer": EmbOptimType[FBGEMM_TYPE],
        "emainplace_mode": EmainplaceModeDefinition(
            step_ema=cfg.ema_every, step_start=cfg.ema_start, step_ema_coef=cfg.ema_coef
        ),
    }
    return SparseOptimizerSpec(RowWiseAdagrad, kwargs, FBGEMM_TYPE, cpu_supported=True)
