"""Registers the first-party sparse and dense optimizers."""

from __future__ import annotations

import tzrun
from tzrun_plugins.optim import dense, sparse


@tzrun.hookimpl
def tzrun_register_sparse_optimizers(register: tzrun.Register) -> None:
    cuda_only = 'CUDA only (CPU: cpu_policy = "data_parallel")'
    register("sgd", config=sparse.SparseSGDConfig, build=sparse.build_sgd,
             description="FBGEMM fused SGD (EXACT_SGD); CPU and CUDA")
    register("adagrad", config=sparse.SparseAdagradConfig, build=sparse.build_adagrad,
             description="FBGEMM fused Adagrad (EXACT_ADAGRAD); CPU and CUDA")
    register("rowwise_adagrad", config=sparse.SparseRowWiseAdagradConfig, build=sparse.build_rowwise_adagrad,
             description="FBGEMM fused row-wise Adagrad (EXACT_ROWWISE_ADAGRAD); CPU and CUDA")
    register("adam", config=sparse.SparseAdamConfig, build=sparse.build_adam,
             description=f"FBGEMM fused Adam (ADAM); {cuda_only}")
    register("lamb", config=sparse.SparseLambConfig, build=sparse.build_lamb,
             description=f"FBGEMM fused LAMB (LAMB); {cuda_only}")
    register("lars_sgd", config=sparse.SparseLarsSGDConfig, build=sparse.build_lars_sgd,
             description=f"FBGEMM fused LARS SGD (LARS_SGD); {cuda_only}")
    register("partial_rowwise_adam", config=sparse.SparsePartialRowWiseAdamConfig, build=sparse.build_partial_rowwise_adam,
             description=f"FBGEMM fused partial row-wise Adam (PARTIAL_ROWWISE_ADAM); {cuda_only}")
    register("partial_rowwise_lamb", config=sparse.SparsePartialRowWiseLambConfig, build=sparse.build_partial_rowwise_lamb,
             description=f"FBGEMM fused partial row-wise LAMB (PARTIAL_ROWWISE_LAMB); {cuda_only}")


@tzrun.hookimpl
def tzrun_register_dense_optimizers(register: tzrun.Register) -> None:
    register("sgd", config=dense.SGDConfig, build=dense.build_sgd, description="torch.optim.SGD")
    register("adagrad", config=dense.AdagradConfig, build=dense.build_adagrad, description="torch.optim.Adagrad")
    register("adam", config=dense.AdamConfig, build=dense.build_adam, description="torch.optim.Adam")
    register("adamw", config=dense.AdamWConfig, build=dense.build_adamw, description="torch.optim.AdamW")
    register("rmsprop", config=dense.RMSpropConfig, build=dense.build_rmsprop, description="torch.optim.RMSprop")
    register("adadelta", config=dense.AdadeltaConfig, build=dense.build_adadelta, description="torch.optim.Adadelta")
