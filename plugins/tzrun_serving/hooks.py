"""Registers the way out of a run: the ``export`` and ``embedding_deltas`` stages, the ``export``
and ``ckpt apply-deltas`` commands, and the scorer of ``predict --export``."""

from __future__ import annotations

from typing import Any

import tzrun
from tzrun_serving import commands, embedding_deltas, export_stage


@tzrun.hookimpl
def tzrun_register_stages(register: tzrun.RegisterStages) -> None:
    register("export", config=export_stage.ExportConfig, build=export_stage.build_export,
             check=export_stage.check_export, outputs=export_stage.export_outputs,
             description="exports for serving of the best and/or final checkpoint, versioned under a `latest` "
                         "pointer (rank 0; also spelled [export])")
    register("embedding_deltas", config=embedding_deltas.EmbeddingDeltasConfig,
             build=embedding_deltas.build_embedding_deltas, outputs=embedding_deltas.embedding_deltas_outputs,
             description="every N steps, the embedding rows changed since the last dump (ckpt apply-deltas applies them)")


@tzrun.hookimpl
def tzrun_register_commands(register: tzrun.Register) -> None:
    register("export", config=commands.ExportOptions, build=commands.export,
             description="write a checkpoint as a torch.export program and a manifest of its inputs, for serving "
                         "(one process, no GPU; tzrec-run help serving)")
    register("ckpt apply_deltas", config=commands.ApplyDeltasOptions, build=commands.apply_deltas,
             description="a checkpoint's embedding tables plus the embedding_deltas dumps after it: the tables at "
                         "the last dump, saved as {table: tensor} with torch.save (loads with weights_only=True)")


@tzrun.hookimpl
def tzrun_open_export(path: str, on_bad_row: str) -> Any:
    from tzrun_serving.predictor import Predictor

    return Predictor(path, on_bad_row=on_bad_row)
