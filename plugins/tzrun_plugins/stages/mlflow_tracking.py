"""The ``mlflow`` stage: the run's config, train log, evaluations and checkpoint path, logged to
an MLflow tracking server (rank 0 only).

What it logs, through MLflow's own client (``MlflowClient``, no global active run):

* params: the resolved config (``resolved_config.json``), flattened to ``data.batch_size``,
  ``train.stages.0.type``, ... (a fresh run only: MLflow params cannot change on a resume);
* metrics, at each train log (``train.log_every_n_steps``) with its step: ``loss``,
  ``loss/<name>``, ``loss_weight/<name>``, ``lr/<group>``, ``train_metric/<name>``, ``samples_per_s``,
  ``data_wait_fraction``, ``grad_norm`` (the values of the ``metrics.jsonl`` train record);
* metrics at each evaluation: ``eval/<name>`` (``eval/auc``, ``eval/loss/binary_cross_entropy``);
* tags: ``tzrun.model_dir``, ``tzrun.checkpoint`` (the newest complete checkpoint, updated at
  each boundary and at the end) and ``tzrun.best_checkpoint`` when ``eval.best_metric`` picks one.

The MLflow run's id is saved in each checkpoint, so a resumed run logs on into the same MLflow
run. A tracking server that fails (down, refusing, timing out) never ends training: the first
failure is one warning naming the tracking URI and the error, and the stage logs nothing more
in that run. Requests wait at most ``request_timeout`` seconds and are retried ``max_retries``
times (MLflow's ``MLFLOW_HTTP_REQUEST_TIMEOUT`` / ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, when the
environment does not set them).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
import urllib.parse
from typing import Any, Callable, Mapping, Optional

import attrs

import tzrun
from tzrun_plugins.stages._closing import ClosedAtTheEnd

__all__ = ["MLflowConfig", "MLflowStage", "build_mlflow", "flatten_params"]

log = logging.getLogger("tzrun.mlflow")

#: MLflow's limits: params per ``log_batch`` call, and characters of a param value
_PARAMS_PER_BATCH = 100
_MAX_PARAM_VALUE = 6000


@attrs.frozen
class MLflowConfig:
    """Options of the ``mlflow`` stage.

    Attributes:
        tracking_uri: the tracking server (``http://mlflow.example:5000``); default: MLflow's
            own choice (``MLFLOW_TRACKING_URI``, else its local default).
        experiment: the experiment's name, created when missing; default:
            ``MLFLOW_EXPERIMENT_NAME``, else MLflow's default experiment.
        run_name: the MLflow run's name; default: the model dir's name.
        tags: extra tags of the MLflow run.
        request_timeout: seconds one request to the server may take.
        max_retries: retries of a failed request before the stage gives up for the run.
    """

    tracking_uri: Optional[str] = None
    experiment: Optional[str] = None
    run_name: Optional[str] = None
    tags: dict[str, str] = attrs.field(factory=dict)
    request_timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    max_retries: int = attrs.field(default=2, validator=attrs.validators.ge(0))

    def __attrs_post_init__(self) -> None:
        # checked with the config (tzrec-run check too), before any training starts
        if importlib.util.find_spec("mlflow") is None:
            raise ValueError("the mlflow stage needs MLflow's client, which is not installed: "
                             "run `pip install 'tzrec-run[mlflow]'`")


def flatten_params(tree: Any, prefix: str = "") -> dict[str, str]:
    """``{"data.batch_size": "2048", "train.stages.0.type": "progress", ...}``: every leaf of a
    TOML-shaped tree, as MLflow params (strings; an array of tables is numbered, as MLflow keys
    allow no brackets; an empty table or array is ``{}``/``[]``)."""
    if isinstance(tree, Mapping) and tree:
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten_params(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(tree, list) and tree and all(isinstance(v, Mapping) for v in tree):
        return {k: v for i, item in enumerate(tree) for k, v in flatten_params(item, f"{prefix}.{i}").items()}
    return {prefix: json.dumps(tree) if isinstance(tree, (list, dict, bool)) or tree is None else str(tree)}


class MLflowStage(ClosedAtTheEnd):
    """Logs the run to MLflow on rank 0; a failing server is a warning, never a dead run."""

    def __init__(self, cfg: MLflowConfig) -> None:
        self.cfg = cfg
        self.client: Any = None
        self.run_id: str | None = None
        self.uri = ""
        self.checkpoint: str | None = None

    # -- state: the MLflow run a resumed run logs on into ----------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The MLflow run's id (empty before it exists, and on ranks other than 0)."""
        return {"run_id": self.run_id or ""}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.run_id = str(state.get("run_id") or "") or None

    # -- hooks ------------------------------------------------------------------------------

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if not run.is_rank0:
            return
        from mlflow.tracking import MlflowClient

        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(max(1, self.cfg.request_timeout))))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(self.cfg.max_retries))
        self.client = MlflowClient(tracking_uri=self.cfg.tracking_uri)
        self.uri = _shown(str(self.client.tracking_uri))
        self._call("start the run", lambda: self._start(run))

    @tzrun.hookimpl
    def tzrun_after_train_log(self, run: tzrun.RunContext, log: tzrun.TrainLog) -> None:
        values = {"loss": log.loss, "samples_per_s": log.samples_per_s, "data_wait_fraction": log.data_wait_fraction}
        values.update({f"loss/{k}": v for k, v in log.losses.items()})
        values.update({f"loss_weight/{k}": v for k, v in log.loss_weights.items()})
        values.update({f"lr/{k}": v for k, v in log.learning_rates.items()})
        values.update({f"train_metric/{k}": v for k, v in log.metrics.items()})
        if log.grad_norm is not None:
            values["grad_norm"] = log.grad_norm
        self._metrics(values, log.step)

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        self._metrics({f"eval/{k}": v for k, v in result.metrics.items()}, step)
        self._checkpoint(run, step)

    @tzrun.hookimpl
    def tzrun_after_train(self, run: tzrun.RunContext, step: int) -> None:
        self._checkpoint(run, step)
        best = tzrun.as_path(run.model_dir) / "best.json"
        if self.client is not None and best.is_file():
            checkpoint = json.loads(best.read_text()).get("checkpoint")
            if checkpoint:
                self._call("tag the best checkpoint",
                           lambda: self.client.set_tag(self.run_id, "tzrun.best_checkpoint", str(checkpoint)))
        self._end("FINISHED")

    @tzrun.hookimpl
    def tzrun_on_train_error(self, run: tzrun.RunContext, error: BaseException) -> None:
        self._end("FAILED")

    def close(self) -> None:
        self.client = None

    # -- the client, each call guarded --------------------------------------------------------

    def _start(self, run: tzrun.RunContext) -> None:
        if self.run_id is not None:  # resumed: the same MLflow run goes on
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.set_tag(self.run_id, "tzrun.resumed_at_step", str(run.start_step))
            return
        experiment_id = self._experiment_id()
        tags = {"tzrun.model_dir": str(run.model_dir), **self.cfg.tags}
        name = self.cfg.run_name or tzrun.as_path(run.model_dir).name
        self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        self._params(run)

    def _experiment_id(self) -> str:
        name = self.cfg.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            return "0"  # MLflow's default experiment
        found = self.client.get_experiment_by_name(name)
        return str(found.experiment_id if found is not None else self.client.create_experiment(name))

    def _params(self, run: tzrun.RunContext) -> None:
        from mlflow.entities import Param

        resolved = tzrun.as_path(run.model_dir) / "resolved_config.json"
        tree = json.loads(resolved.read_text())["config"] if resolved.is_file() else {}
        params = [Param(k, v[:_MAX_PARAM_VALUE]) for k, v in flatten_params(tree).items()]
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + _PARAMS_PER_BATCH])

    def _metrics(self, values: Mapping[str, float], step: int) -> None:
        if self.client is None or self.run_id is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items() if v is not None]
        self._call("log metrics", lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def _checkpoint(self, run: tzrun.RunContext, step: int) -> None:
        path = tzrun.as_path(run.model_dir) / "checkpoints" / f"step-{step}"
        if self.client is None or self.run_id is None or str(path) == self.checkpoint or not path.exists():
            return
        self.checkpoint = str(path)
        self._call("tag the checkpoint", lambda: self.client.set_tag(self.run_id, "tzrun.checkpoint", str(path)))

    def _end(self, status: str) -> None:
        if self.client is not None and self.run_id is not None:
            self._call("end the run", lambda: self.client.set_terminated(self.run_id, status=status))
        self.client = None

    def _call(self, what: str, call: Callable[[], Any]) -> None:
        """Run ``call``; on any failure warn once and stop logging for this run."""
        if self.client is None:
            return
        try:
            call()
        except Exception as exc:  # the server's failure must not end training
            self.client = None
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            log.warning("mlflow stage: could not %s at %s (%s: %s); training goes on, and this run logs nothing "
                        "more to MLflow", what, self.uri, type(exc).__name__, first[:300])
            log.debug("mlflow stage failure", exc_info=exc)


def _shown(uri: str) -> str:
    """``uri`` without the password of its user information (``http://me:***@host``)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def build_mlflow(cfg: MLflowConfig) -> MLflowStage:
    """An mlflow stage for one run."""
    return MLflowStage(cfg)
