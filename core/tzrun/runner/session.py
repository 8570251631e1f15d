"""The one place that turns a checked config and a plugin manager into a run's parts.

Training (:class:`~tzrun.runner.trainer.Trainer`), ``tzrec-run evaluate``, ``plan``, ``check``
and :mod:`tzrun.testing` all take their parts from a :class:`Session`, so an option means the
same everywhere: the reader, the batch builder (``data.on_bad_row`` included), the feature
specs, the sharded model and its optimizers, the metrics, the stages and the train pipeline
are each made here and nowhere else.

The programmatic entry point is :meth:`Session.from_config` (a config path, ``--set``
overrides and extra plugins, like pytest's ``Config``): it reads and checks the config and
collects the components. Such a session has no process group and gives what needs none (the
:class:`~tzrun.runner.facts.RunFacts`, the config checks, the plan): that is what ``check``
and ``plan`` use. :meth:`Session.start` then joins the process group (every rank calls it) for
``train`` and ``evaluate``.

What follows from the config (input columns, label sources, resolved loss and metric slots,
feature specs) is worked out once, by the session's :attr:`Session.facts`, and read there by
preflight, the model builder, the planner, retention and evaluation.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import numpy as np
import torch

from tzrun.config.load import RawConfig, disabled_plugins, load_config, read_config, strict_plugins
from tzrun.config.schema import RunConfig
from tzrun.data.cost import SEQUENCE_LENGTH, BatchCost, SequenceCost
from tzrun.data.features import BatchBuilder, FeatureSpecs
from tzrun.data.input_check import DataReport, check_data
from tzrun.data.loader import RankInput
from tzrun.data.reader_bad_rows import read_columns
from tzrun.data.sampling import with_sampler
from tzrun.interfaces import EvalResult, RunContext
from tzrun.kernel.plugins import PluginManager, make_plugin_manager
from tzrun.kernel.registry import Registries, collect_registries
from tzrun.runner.allocator import tune_malloc
from tzrun.runner.build import Built, build_run
from tzrun.runner.distributed import DistInfo, init_distributed
from tzrun.runner.evaluate import evaluate
from tzrun.runner.facts import RunFacts
from tzrun.runner.position import Layout, ResumePoint, TrainData
from tzrun.runner.preflight import preflight
from tzrun.runner.slots import MetricSlot
from tzrun.runner.stages import RunStages
from tzrun.runner.train_metrics import TrainMetrics
from tzrun.runner.watchdog import start_watchdog
from tzrun.io.storage import as_path

__all__ = ["Session", "seed_everything", "rng_state", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy and torch (every rank the same)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's random number generator states (saved per rank in checkpoints), as plain
    data: numpy's key array as an int64 tensor, so that it loads with ``weights_only=True``."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    numpy = (name, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    return {"python": random.getstate(), "numpy": numpy, "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    name, key, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, key.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])


class Session:
    """A run's parts, each built once on first use.

    Make one from a config path with :meth:`from_config`. Collective members (every rank of
    the job must call them, in the same order, or none): :meth:`start`, :attr:`built` on first
    use (and so :meth:`pipeline` and :meth:`run_context` the first time), and :meth:`evaluate`.
    Everything else is local to the process.

    Args:
        cfg: the checked config.
        raw: the config as read (its source names the file in messages; saved with checkpoints).
        pm: the run's plugin manager (the configured stages join it for the run).
        registries: the components collected from ``pm``.
        info: this process in the job (set by :meth:`start`); None for a session that only
            checks or plans.
    """

    def __init__(self, cfg: RunConfig, raw: RawConfig, pm: PluginManager, registries: Registries,
                 info: DistInfo | None = None) -> None:
        self.cfg = cfg
        self.raw = raw
        self.pm = pm
        self.registries = registries
        #: what follows from the config, worked out once (torch-free)
        self.facts = RunFacts(cfg, registries)
        self._info = info
        #: what ``train.tune_malloc`` set (logged by the trainer)
        self.malloc_tuning: dict[str, int] = {}

    @classmethod
    def from_config(cls, path: str | Path, overrides: Sequence[str] = (),
                    plugins: Sequence[object | tuple[str, object]] = (), *, strict: bool = False) -> "Session":
        """Read the config at ``path``, make the run's plugin manager and check the config
        against its components: what ``tzrec-run`` does before any command. No process group
        is joined (see :meth:`start`).

        Args:
            path: the TOML file (local or on an object store).
            overrides: ``KEY=<TOML literal>`` overrides (``--set``), in order.
            plugins: plugin objects (or ``(name, object)`` pairs) to register besides the
                installed ones.
            strict: a plugin that fails to load is an error (``--strict``).

        Raises:
            ConfigError: with every problem at its TOML path.
        """
        return cls.from_raw(read_config(path, overrides), plugins, strict=strict)

    @classmethod
    def from_raw(cls, raw: RawConfig, plugins: Sequence[object | tuple[str, object]] = (), *,
                 strict: bool = False) -> "Session":
        """:meth:`from_config` of a config already read (e.g. with
        :func:`tzrun.config.load.parse_config` from a string)."""
        pm = make_plugin_manager(disable=disabled_plugins(raw), plugins=plugins,
                                 strict=True if strict or strict_plugins(raw) else None)
        registries = collect_registries(pm)
        return cls(load_config(raw, registries), raw, pm, registries)

    def start(self, *, probes: Collection[str] | None = None) -> "Session":
        """Check the config as a whole, tune the allocator, join the process group and seed
        the RNGs: the start of every command that trains or evaluates. Collective: every rank
        calls it. With several ranks, each starts its watchdog (:mod:`tzrun.runner.watchdog`).

        Args:
            probes: the component kinds the command builds, whose conformance is probed
                (:meth:`check`; None: every kind).

        Returns:
            This session, now with :attr:`info`.

        Raises:
            RuntimeError: when the session was started already.
        """
        if self._info is not None:
            raise RuntimeError("this Session is started already")
        self.check(probes=probes)
        tuned = tune_malloc() if self.cfg.train.tune_malloc else {}
        t = self.cfg.train
        self._info = init_distributed(t.collective_timeout_s)
        start_watchdog(self._info.rank, self._info.world_size, t.rank_timeout_s, t.collective_timeout_s)
        self.malloc_tuning = tuned
        seed_everything(t.seed)
        return self

    # -- what needs no process group -------------------------------------------------------------

    def check(self, *, probes: Collection[str] | None = None) -> None:
        """The checks that need the whole config (``tzrec-run check``; :meth:`start` runs them),
        probing the conformance of the components of the kinds in ``probes`` (None: every kind).

        Raises:
            ConfigError: with every problem at its TOML path.
        """
        preflight(self.facts, self.raw.source, probes)

    def check_data(self, require: bool = False) -> DataReport:
        """Read the schemas of the input files (metadata only) and check the columns the run
        reads against them (``tzrec-run check``; see :mod:`tzrun.data.input_check`).

        Args:
            require: an input path that does not exist is a problem even when no input exists.
        """
        return check_data(self.cfg, self.reader, self.specs, self.columns, self.facts.group_columns, require)

    @property
    def specs(self) -> FeatureSpecs:
        """The features: dense and sparse specs, embedding tables (vocabulary files read)."""
        return self.facts.specs

    @property
    def metric_slots(self) -> list[MetricSlot]:
        """The resolved ``[[metrics]]`` of evaluation."""
        return self.facts.metric_slots

    @property
    def info(self) -> DistInfo:
        """This process in the job.

        Raises:
            RuntimeError: for a session not made by :meth:`start`.
        """
        if self._info is None:
            raise RuntimeError("this Session has no process group: call session.start() (on every rank) first")
        return self._info

    @property
    def model_dir(self) -> Path:
        """Where the run writes."""
        return as_path(self.cfg.model_dir)

    # -- data ------------------------------------------------------------------------------------

    @functools.cached_property
    def reader(self) -> Any:
        """The configured reader (``data.reader``)."""
        r = self.cfg.data.reader
        return self.registries["reader"].get(r.type, "data.reader.type").build(r.config)

    @functools.cached_property
    def builder(self) -> Any:
        """Turns the reader's record batches into :class:`~tzrun.data.batch.Batch` es, with the
        run's labels, weights, group keys, ``data.on_bad_row`` and, with ``[data.sampler]``, the
        sampled items (or the sampler's rows)."""
        d = self.cfg.data
        f = self.facts
        builder = BatchBuilder(self.specs, d.labels, d.sample_weight, f.group_columns, on_bad_row=d.on_bad_row,
                               label_domains=f.label_domains, derived_labels=f.derived_labels)
        return with_sampler(builder, self.cfg, self.registries, self.info.rank)  # [data.sampler]: sampled items or rows

    @property
    def columns(self) -> list[str]:
        """Every input column a batch reads (:attr:`RunFacts.input_columns
        <tzrun.runner.facts.RunFacts.input_columns>`)."""
        return self.facts.input_columns

    def rank_input(self, path: str, batch_size: int, rows: Sequence[tuple[int, int]] | None = None,
                   shuffle_buffer_rows: int = 0, cost: BatchCost | None = None) -> RankInput:
        """This rank's share of the input at ``path``, read in batches of ``batch_size`` (cost-aware
        ones with ``cost``)."""
        d, info = self.cfg.data, self.info
        columns = read_columns(self.reader, self.columns, d.on_bad_row)  # + the reader's bad-row marks under "skip"
        return RankInput(self.reader, path, batch_size, d.num_workers, columns, self.builder, info.rank,
                         info.world_size, rows, shuffle_buffer_rows=shuffle_buffer_rows, seed=self.cfg.train.seed,
                         prefetch=d.prefetch_batches, nice=d.reader_nice, cost=cost)

    @functools.cached_property
    def batch_cost(self) -> BatchCost | None:
        """The cost-aware batching of the training input (``data.batch_cost_size``), or None."""
        d = self.cfg.data
        if d.batch_cost_size is None:
            return None
        if d.sample_cost != SEQUENCE_LENGTH:
            return BatchCost(d.batch_cost_size, d.sample_cost, column=d.sample_cost)
        sequences = tuple(SequenceCost(g.features[0].column or g.features[0].name, g.max_len, g.separator)
                          for g in self.cfg.features.sequence if g.features)
        return BatchCost(d.batch_cost_size, d.sample_cost, sequences=sequences)

    @functools.cached_property
    def eval_input(self) -> RankInput | None:
        """This rank's share of ``data.eval_input`` (None without one)."""
        d = self.cfg.data
        if d.eval_input is None:
            return None
        return self.rank_input(d.eval_input, d.eval_batch_size or d.batch_size)

    @property
    def whole_layout(self) -> Layout:
        """How a whole epoch of training data is read by this job."""
        d = self.cfg.data
        cost = None if d.batch_cost_size is None else (d.batch_cost_size, d.sample_cost)
        return Layout(self.info.world_size, d.num_workers, d.batch_size, batch_cost=cost)

    def train_data(self, start: ResumePoint | None = None) -> TrainData:
        """The training batches of the run from ``start`` (the beginning by default), planned
        epoch by epoch."""
        d, t = self.cfg.data, self.cfg.train

        def make_input(layout: Layout) -> RankInput:
            cost = None if layout.batch_cost is None else self.batch_cost
            return self.rank_input(d.train_input, layout.batch_size, layout.rows, d.shuffle_buffer_rows, cost)

        return TrainData(make_input, self.whole_layout, num_steps=t.num_steps, num_epochs=t.num_epochs,
                         start=start or ResumePoint.beginning(self.whole_layout))

    # -- the model and its training ------------------------------------------------------------

    @functools.cached_property
    def built(self) -> Built:
        """The sharded model, optimizers, schedules and update path. Collective on first use:
        every rank reads it first at the same point of the run."""
        return build_run(self.facts, self.info, self.raw.source)

    def pipeline(self) -> Any:
        """A fresh TorchRec train pipeline over the model (one per segment or evaluation)."""
        p = self.cfg.train.pipeline
        entry = self.registries["train_pipeline"].get(p.type, "train.pipeline.type")
        return entry.build(p.config, self.built.model, self.built.update, self.info.device)

    def train_metrics(self) -> TrainMetrics:
        """The ``[[train_metrics]]`` of the run on this rank."""
        return TrainMetrics(self.facts.train_metric_slots, self.registries, self.info.device)

    def stages(self) -> RunStages:
        """The configured ``[[train.stages]]``, built and registered on the run's manager."""
        return RunStages(self.cfg, self.registries, self.pm)

    def run_context(self, run_id: str = "") -> RunContext:
        """What lifecycle hooks receive as ``run`` (``run_id``: the model dir's run, when training)."""
        info, built = self.info, self.built
        return RunContext(config=self.cfg, model_dir=self.model_dir, run_id=run_id, rank=info.rank, world_size=info.world_size,
                          local_rank=info.local_rank, device=info.device, model=built.model, optimizer=built.optimizer,
                          global_batch_size=self.cfg.data.batch_size * info.world_size,
                          dense_parameters=built.update.named_dense_params)

    def evaluate(self, run: RunContext, step: int, record: Callable[[EvalResult], None]) -> EvalResult:
        """Evaluate the model at ``step``: one pass over ``data.eval_input`` (``eval.num_steps``
        batches at most) with the weights evaluation uses (the EMA averages when configured);
        rank 0 then hands the result to ``record``. Collective: every rank calls it.

        Args:
            run: what the lifecycle hooks see as ``run`` (its model is evaluated).
            step: the step the result is recorded at.
            record: writes the result (called on rank 0 only).

        Raises:
            RuntimeError: without ``data.eval_input``.
        """
        eval_input = self.eval_input
        if eval_input is None:
            raise RuntimeError("this run has no data.eval_input to evaluate on")
        with self.built.update.eval_weights():
            result = evaluate(run, eval_input.one_pass(self.cfg.eval.num_steps), self.metric_slots, self.registries,
                              self.pipeline, step)
        if run.is_rank0:
            record(result)
        return result
