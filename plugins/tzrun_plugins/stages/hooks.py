"""Registers the first-party loop stages."""

from __future__ import annotations

import tzrun
from tzrun_plugins.stages import early_stopping, metrics_log, mlflow_tracking, profiler, progress, tensorboard


@tzrun.hookimpl
def tzrun_register_stages(register: tzrun.RegisterStages) -> None:
    register("progress", config=progress.ProgressConfig, build=progress.build_progress,
             description="a progress bar on a terminal, periodic lines elsewhere (rank 0)")
    register("metrics_log", config=metrics_log.MetricsLogConfig, build=metrics_log.build_metrics_log,
             outputs=metrics_log.metrics_log_outputs,
             description="train log records and eval results appended to metrics.jsonl (rank 0)")
    register("tensorboard", config=tensorboard.TensorBoardConfig, build=tensorboard.build_tensorboard,
             outputs=tensorboard.tensorboard_outputs,
             description="TensorBoard scalars (loss, lr, metrics, perf, grad norm) and histograms (rank 0)")
    register("mlflow", config=mlflow_tracking.MLflowConfig, build=mlflow_tracking.build_mlflow,
             description="params (the resolved config), train logs, eval results and the checkpoint path "
                         "logged to an MLflow tracking server (rank 0)")
    register("profiler", config=profiler.ProfilerConfig, build=profiler.build_profiler,
             outputs=profiler.profiler_outputs,
             description="torch.profiler traces over a wait/warmup/active schedule")
    register("early_stopping", config=early_stopping.EarlyStoppingConfig, build=early_stopping.build_early_stopping,
             check=early_stopping.check_early_stopping,
             description="stop when an eval metric has not improved for `patience` evaluations")
