"""The run's stages: built from ``[[train.stages]]``, registered in config order, checked
before a run, their state saved in checkpoints under their own names, and the train log
window they all read (see :mod:`tzrun.hookspecs`)."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any, Iterator, Mapping, Sequence

import attrs

from tzrun.config.schema import RunConfig
from tzrun.errors import PluginError
from tzrun.interfaces import TrainLog
from tzrun.kernel.registry import Registries
from tzrun.runner.checkpoint_blobs import unsaveable
from tzrun.runner.memory_use import device_peak_bytes, resident_bytes

__all__ = [
    "RunStages", "stage_names", "state_key", "check_stage_states", "TimedIterator", "LogWindow", "learning_rates",
    "param_group_tables",
    "seconds_since_process_start",
]


def stage_names(cfg: RunConfig) -> list[str]:
    """The name each ``[[train.stages]]`` entry's state is saved under: its ``type``, or
    ``type.i`` (its index in the list) when the list names that type more than once."""
    counts = Counter(c.name for c in cfg.train.stages)
    return [c.name if counts[c.name] == 1 else f"{c.name}.{i}" for i, c in enumerate(cfg.train.stages)]


#: The plugin name of a stage object is this prefix and its stage name.
_STAGE_PREFIX = "stage:"


class RunStages:
    """The stage objects of one run, registered on its plugin manager.

    pluggy calls the hookimpls registered last first, so the stages are registered in reverse:
    they are then called in the order the config lists them. ``unregister`` takes them off
    again (the plugin manager outlives the run in programmatic use).
    """

    def __init__(self, cfg: RunConfig, registries: Registries, pm: Any) -> None:
        self.pm = pm
        self.named: list[tuple[str, Any]] = []
        for i, (name, component) in enumerate(zip(stage_names(cfg), cfg.train.stages)):
            stage = registries["stage"].get(component.type, f"train.stages[{i}].type").build(component.config)
            self.named.append((name, stage))
        for name, stage in reversed(self.named):
            pm.register(stage, name=_STAGE_PREFIX + name)

    def state_dict(self) -> dict[str, Any]:
        """Each stage's ``state_dict()`` under its name (stages without one are left out)."""
        return {name: stage.state_dict() for name, stage in self.named if hasattr(stage, "state_dict")}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Give each stage the state saved under its name, if any."""
        for name, stage in self.named:
            if name in state and hasattr(stage, "load_state_dict"):
                stage.load_state_dict(state[name])

    def unregister(self) -> None:
        """Take the stages off the plugin manager."""
        for _, stage in self.named:
            if self.pm.is_registered(stage):
                self.pm.unregister(stage)


def state_key(plugin_name: str) -> str:
    """The key under which a checkpoint saves the state of plugin ``plugin_name``: a stage's
    under its stage name, another plugin's under its own name."""
    return plugin_name.removeprefix(_STAGE_PREFIX)


def check_stage_states(state: Mapping[str, Any]) -> None:
    """Check, before a checkpoint is written, that every stage's state (and what a plugin put in
    ``tzrun_before_checkpoint_save``'s ``state``) is what a checkpoint may hold: tensors,
    numbers, strings, bools, None, and lists, tuples and dicts of those
    (:func:`tzrun.runner.checkpoint_blobs.unsaveable`), which load back without running code.

    Raises:
        PluginError: naming the stage, what it holds that cannot be saved, and where.
    """
    for name, value in state.items():
        found = unsaveable(value, "state")
        if found:
            raise PluginError(
                f"stage '{name}': its checkpoint state holds {found}; a stage's state_dict() (and what a plugin puts "
                "in tzrun_before_checkpoint_save) may hold only tensors, numbers, strings, bools, None and lists, "
                "tuples and dicts of those, so that a checkpoint loads without running code (tzrec-run help checkpoint-trust)"
            )


def seconds_since_process_start() -> float | None:
    """Wall seconds since this process started (from ``/proc``; None where there is none)."""
    import os

    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


class TimedIterator:
    """Wraps the batch stream: the time spent in ``next`` is time the loop waited for data."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self.inner = inner
        self.waited = 0.0

    def __iter__(self) -> "TimedIterator":
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.waited += time.perf_counter() - start


def learning_rates(optimizers: Mapping[str, Any]) -> dict[str, float]:
    """The learning rate of every param group: the optimizer's key, with ``/<group>`` when it
    has several (see :func:`param_group_tables`)."""
    out: dict[str, float] = {}
    for key, opt in optimizers.items():
        groups = opt.param_groups
        if len(groups) == 1:
            out[key] = float(groups[0]["lr"])
        else:
            out.update({f"{key}/{label}": float(g["lr"]) for label, g in zip(_group_labels(opt), groups)})
    return out


def param_group_tables(optimizers: Mapping[str, Any]) -> dict[str, list[str]]:
    """What each param group of an optimizer with several holds, by the name
    :func:`learning_rates` gives it (``sparse/deep_ebc``): the tables (or parameters) in it.

    TorchRec's fused sparse optimizer has one param group per embedding module (DeepFM's
    ``deep_ebc`` and ``wide_ebc``); a group is named after the module its parameters share,
    or by its index where the parameters' names do not tell the groups apart.
    """
    out: dict[str, list[str]] = {}
    for key, opt in optimizers.items():
        if len(opt.param_groups) > 1:
            for label, names in zip(_group_labels(opt), _group_param_names(opt)):
                out[f"{key}/{label}"] = [_table_of(n) for n in names] if names else []
    return out


def _group_param_names(opt: Any) -> list[list[str] | None]:
    """The parameter names of each param group (None where a parameter has no name)."""
    params = getattr(opt, "params", None)  # a TorchRec KeyedOptimizer names its parameters
    by_id = {id(v): k for k, v in params.items()} if isinstance(params, Mapping) else {}
    out: list[list[str] | None] = []
    for group in opt.param_groups:
        names = [by_id.get(id(p)) for p in group["params"]]
        out.append(None if not names or None in names else [n for n in names if n is not None])
    return out


_WRAPPERS = {"model", "module", "_dmp_wrapped_module"}
_COLLECTIONS = {"embedding_bags", "embeddings"}


def _group_labels(opt: Any) -> list[str]:
    """A name per param group: the module its parameters share (``deep_ebc``), else its index."""
    labels = []
    for names in _group_param_names(opt):
        if names is None:
            return [str(i) for i in range(len(opt.param_groups))]
        common = os.path.commonprefix([n.rsplit(".", 1)[0].split(".") for n in names])  # element-wise
        labels.append(".".join(p for p in common if p not in _WRAPPERS and p not in _COLLECTIONS))
    if "" in labels or len(set(labels)) != len(labels):
        return [str(i) for i in range(len(labels))]
    return labels


def _table_of(name: str) -> str:
    """The table of an embedding parameter's name (``model.deep_ebc.embedding_bags.cat_0_emb.weight``
    is ``cat_0_emb``); the name itself for any other parameter."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in _COLLECTIONS:
            return parts[i + 1]
    return name


@attrs.define
class LogWindow:
    """The steps since the last train log: losses summed on the device (no sync per step),
    rows, training wall time (evaluation and checkpoints excluded) and data wait."""

    data: TimedIterator
    world_size: int
    steps: int = 0
    rows: int = 0
    loss_sum: Any = None
    losses_sum: dict[str, Any] = attrs.field(factory=dict)
    weights_sum: dict[str, Any] = attrs.field(factory=dict)
    seconds: float = 0.0
    _clock: float = 0.0
    _waited_at_start: float = 0.0
    #: this rank's bad-row counts so far (``data.on_bad_row = "skip"``), copied into each record
    skipped: Any = None

    def resume_clock(self) -> None:
        """Start timing (at the start of each segment: the time between segments is not
        training time)."""
        self._clock = time.perf_counter()

    def add(self, loss: Any, losses: Mapping[str, Any], rows: int, loss_weights: Mapping[str, Any] | None = None) -> None:
        """One step: its (detached) loss tensors, rows and loss weights, if any (on the hot
        path: device adds only)."""
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        for sums, values in ((self.losses_sum, losses), (self.weights_sum, loss_weights or {})):
            for name, value in values.items():
                previous = sums.get(name)
                sums[name] = value if previous is None else previous + value
        self.rows += rows
        self.steps += 1
        now = time.perf_counter()
        self.seconds += now - self._clock
        self._clock = now

    def close(self, step: int, epoch: int, lrs: Mapping[str, float], metrics: Mapping[str, float],
              dense_params: Sequence[Any], zch: Mapping[str, Mapping[str, float]] | None = None) -> TrainLog:
        """The record of the window (one sync for the losses), and a new window; ``zch``: the
        window's counts of the ``zch`` tables (:func:`tzrun.runner.zch.zch_counters`)."""
        import torch

        steps = max(self.steps, 1)
        waited = self.data.waited - self._waited_at_start
        grads = [p.grad for p in dense_params if p.grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else None
        seconds = max(self.seconds, 1e-9)
        record = TrainLog(
            step=step,
            epoch=epoch,
            steps=self.steps,
            loss=float(self.loss_sum) / steps if self.loss_sum is not None else float("nan"),
            losses={k: float(v) / steps for k, v in self.losses_sum.items()},
            learning_rates=dict(lrs),
            metrics=dict(metrics),
            samples_per_s=self.rows * self.world_size / seconds,
            data_wait_fraction=min(1.0, waited / seconds),
            grad_norm=grad_norm,
            seconds=self.seconds,
            time=time.time(),
            loss_weights={k: float(v) / steps for k, v in self.weights_sum.items()},
            skipped_rows=self.skipped.rows if self.skipped is not None else 0,
            skipped_reasons=dict(self.skipped.problems) if self.skipped is not None else {},
            rss_bytes=resident_bytes(),
            device_memory_bytes=device_peak_bytes(),
            zch=dict(zch or {}),
        )
        self.steps, self.rows, self.loss_sum, self.losses_sum, self.weights_sum, self.seconds = 0, 0, None, {}, {}, 0.0
        self._waited_at_start = self.data.waited
        return record
