"""Registers the first-party sparse and dense optimizers."""

from __future__ import annotations

import tzrun
from tzrun_plugins.optim import dense, sparse


@tzrun.hookimpl
def tzrun_register_sparse_optimizers(register: tzrun.Register) -> None:
    register("sgd", config=sparse.SparseSGDConfig, build=sparse.build_sgd,
             description="FBGEMM fused SGD (EXACT_SGD); CPU and CUDA")
    register("adagrad", config=sparse.SparseAdagradConfig, build=sparse.build_adagrad,
             description="FBGEMM fused Adagrad (EXACT_ADAGRAD); CPU and CUDA")
    register("rowwise_adagrad", config=sparse.SparseRowWiseAdagradConfig, build=sparse.build_rowwise_adagrad,
             description="FBGEMM fused row-wise Adagrad (EXACT_ROWWISE_ADAGRAD); CPU and CUDA")


@tzrun.hookimpl
def tzrun_register_dense_optimizers(register: tzrun.Register) -> None:
    register("sgd", config=dense.SGDConfig, build=dense.build_sgd, description="torch.optim.SGD")
    register("adam", config=dense.AdamConfig, build=dense.build_adam, description="torch.optim.Adam")
    register("adamw", config=dense.AdamWConfig, build=dense.build_adamw, description="torch.optim.AdamW")
    register("adagrad", config=dense.AdagradConfig, build=dense.build_adagrad, description="torch.optim.Adagrad")
