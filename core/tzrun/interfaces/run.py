"""What lifecycle hooks and stages receive: the run as one rank sees it (:class:`RunContext`),
each training step (:class:`StepInfo`), each train log record (:class:`TrainLog`) and each
evaluation (:class:`EvalResult`). Import them from :mod:`tzrun.interfaces`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import attrs

if TYPE_CHECKING:
    from tzrun.config.schema import RunConfig

__all__ = ["RunContext", "StepInfo", "TrainLog", "EvalResult"]


@attrs.define
class RunContext:
    """What lifecycle hooks receive: the run, as one rank sees it.

    Attributes:
        config: the resolved run config.
        model_dir: where this run writes.
        run_id: the run's id (its model dir's ``.tzrec-run`` marker: new for a fresh run or
            ``--overwrite``, kept by ``--resume``); an output written outside the checkpoints
            (an export, a dump) records it, so that it is never taken for another run's.
            Empty outside training.
        rank, world_size, local_rank: this process in the job.
        device: the torch device of this rank.
        model: the (DistributedModelParallel) model.
        optimizer: the combined optimizer (sparse fused + dense).
        global_batch_size: rows per step over all ranks.
        stop_requested: set by a stage to end training at the next checkpoint boundary (the
            ranks agree there: any rank asking stops all).
        stop_reason: why, in a few words, for the log and the run's result (set it with
            ``stop_requested``).
        total_steps: the step the run ends at if nothing stops it early.
        steps_per_epoch: training steps in one pass over the data.
        start_step: the step the run (re)starts from (0 for a fresh run).
        dense_parameters: the parameters the dense optimizers train, by name (embedding
            tables are updated inside backward by their fused optimizers and are not here).
    """

    config: RunConfig
    model_dir: Path
    rank: int
    world_size: int
    local_rank: int
    device: Any
    model: Any = None
    optimizer: Any = None
    global_batch_size: int = 0
    stop_requested: bool = False
    stop_reason: str = ""
    total_steps: int = 0
    steps_per_epoch: int = 0
    start_step: int = 0
    dense_parameters: Mapping[str, Any] = attrs.field(factory=dict)
    run_id: str = ""

    @property
    def is_rank0(self) -> bool:
        """True on the process that writes shared outputs and logs at INFO."""
        return self.rank == 0


@attrs.define
class StepInfo:
    """One training step as lifecycle hooks see it.

    Attributes:
        step: global step number, starting at 1 for the first step of the run.
        epoch: 0-based data pass.
        loss: the step's total loss; an unsynchronized tensor (``.item()`` syncs).
        losses: each named loss, unsynchronized tensors.
        rows: rows of this step on this rank, padding excluded.
        learning_rates: the learning rate this step used, per optimizer ("sparse", "dense",
            "dense.parts[0]", ...).
        metrics: the decayed ``[[train_metrics]]`` values so far, by name (empty before the
            first window closes).
    """

    step: int
    epoch: int
    loss: Any
    losses: Mapping[str, Any]
    rows: int
    learning_rates: Mapping[str, float]
    metrics: Mapping[str, float] = attrs.field(factory=dict)


@attrs.frozen
class TrainLog:
    """One train log record, made every ``train.log_every_n_steps`` steps from the steps since
    the previous one (the window), identical for every stage that receives it.

    Values are this rank's own: no collective is issued to make them (``samples_per_s``
    scales this rank's rate by the world size).

    Attributes:
        step: the global step at the end of the window.
        epoch: the data pass of that step.
        steps: steps in the window.
        loss: the mean total loss over the window.
        losses: each named loss, mean over the window.
        learning_rates: the learning rate the last step used, per param group: the optimizer's
            key (``sparse``, ``dense``, ``dense.parts[0]``), with ``/<i>`` added when it has
            several groups.
        metrics: the decayed ``[[train_metrics]]`` values at the last step.
        samples_per_s: training rows per second over all ranks in the window.
        data_wait_fraction: the part of the window's wall time the loop spent waiting for
            the next batch (0: the input never held training back).
        grad_norm: the L2 norm of the dense parameters' gradients of the last dense update
            (embedding tables update inside backward and expose no gradient), or None.
        seconds: wall time of the window.
        time: when the record was made (seconds since the epoch).
        loss_weights: the weight of each loss, mean over the window, when the loss weighting
            computes them (``[train.loss_weighting] type = "pareto"``); empty otherwise.
        skipped_rows: input rows ``data.on_bad_row = "skip"`` left out on this rank since the
            process started (rows the train pipeline read ahead included).
        skipped_reasons: those rows per reason (``"malformed line"``, ``"I1: not a number"``,
            ``"label: NaN"``); a row with several problems counts under each.
        rss_bytes: this process's resident memory when the record was made (None where the
            system has no ``/proc``).
        device_memory_bytes: the most memory torch's CUDA allocator reserved on this rank's
            device during the window; None without a CUDA device.
        zch: per ``zch`` table (docs/zch.md), what this rank's slice of it counted in the
            window: ``ids_seen`` (ids looked up, repeats counted), ``misses`` (of them, those
            that read the miss row: not admitted yet, or evicted), ``miss_share``, ``admitted``
            (ids the window's evictions gave a row they did not hold before), ``evicted`` (ids
            that lost their row at them), and at the window's end ``rows_in_use`` (rows
            holding an id) and ``occupancy`` (``rows_in_use`` over the slice's rows); empty
            without ``zch``.
    """

    step: int
    epoch: int
    steps: int
    loss: float
    losses: Mapping[str, float]
    learning_rates: Mapping[str, float]
    metrics: Mapping[str, float]
    samples_per_s: float
    data_wait_fraction: float
    grad_norm: Optional[float]
    seconds: float
    time: float
    loss_weights: Mapping[str, float] = attrs.field(factory=dict)
    skipped_rows: int = 0
    skipped_reasons: Mapping[str, int] = attrs.field(factory=dict)
    rss_bytes: Optional[int] = None
    device_memory_bytes: Optional[int] = None
    zch: Mapping[str, Mapping[str, float]] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (what ``metrics_log`` writes, with ``"kind": "train"``)."""
        return attrs.asdict(self)


@attrs.frozen
class EvalResult:
    """The values of an evaluation pass, over all ranks' rows.

    Attributes:
        step: the global step evaluated.
        metrics: every metric and ``loss/<name>``, by name.
        rows: eval rows over all ranks (padding excluded).
        seconds: wall time of the pass on this rank, metric computation included.
    """

    step: int
    metrics: Mapping[str, float]
    rows: int
    seconds: float = 0.0
