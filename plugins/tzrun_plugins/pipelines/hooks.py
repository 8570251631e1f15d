"""Registers the first-party TorchRec train pipelines."""

from __future__ import annotations

from typing import Any

import attrs

import tzrun


@attrs.frozen
class BasePipelineConfig:
    """``base`` (``TrainPipelineBase``) has no options."""


@attrs.frozen
class SparseDistPipelineConfig:
    """``sparse_dist`` (``TrainPipelineSparseDist``) has no options."""


def build_base(cfg: BasePipelineConfig, model: Any, optimizer: Any, device: Any) -> Any:
    """TorchRec's ``TrainPipelineBase``: one batch at a time, no overlap."""
    from torchrec.distributed.train_pipeline import TrainPipelineBase

    return TrainPipelineBase(model, optimizer, device)


def build_sparse_dist(cfg: SparseDistPipelineConfig, model: Any, optimizer: Any, device: Any) -> Any:
    """TorchRec's ``TrainPipelineSparseDist``: overlaps the next batch's copy and input
    all-to-all with the current step."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    return TrainPipelineSparseDist(model, optimizer, device, execute_all_batches=True)


@tzrun.hookimpl
def tzrun_register_train_pipelines(register: tzrun.Register) -> None:
    register("base", config=BasePipelineConfig, build=build_base,
             description="torchrec TrainPipelineBase (no overlap)")
    register("sparse_dist", config=SparseDistPipelineConfig, build=build_sparse_dist,
             description="torchrec TrainPipelineSparseDist (default)")
