"""Where a run stands in its training data, and the plan of the epochs still to train.

A checkpoint records the data position: the epoch, the steps done in it, the layout the epoch
was read with (world size, DataLoader workers, batch size, and the rows of a resumed partial
epoch) and the global row intervals every rank had consumed in it. Batches a train pipeline
had prefetched but not trained on are not consumed: they are read again after a resume.

On resume with the same layout, the epoch continues exactly where it stopped, batch for batch
in the same order (:meth:`tzrun.data.loader.RankInput.one_pass` with ``start``), so the resumed
run is bit-identical to an uninterrupted one. With another layout (more or fewer ranks,
workers, another batch size) the rows of the epoch not consumed yet are shared out across the
new ranks as a partial epoch: every row is still trained on exactly once per epoch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional

import attrs

from tzrun.data.dataset import merge_intervals, subtract_intervals

__all__ = ["Layout", "EpochRun", "DataPosition", "ResumePoint", "plan_epochs", "checkpoint_boundaries", "TrainData"]

Interval = tuple[int, int]


@attrs.frozen
class Layout:
    """How an epoch is read; the same layout reproduces the same batches in the same order.

    Attributes:
        world_size: ranks.
        num_workers: DataLoader workers per rank.
        batch_size: rows per batch per rank.
        rows: the global row intervals of a partial (resumed) epoch; None for a whole epoch.
        batch_cost: ``(data.batch_cost_size, data.sample_cost)`` of cost-aware batches; None:
            batches of ``batch_size`` rows.
    """

    world_size: int
    num_workers: int
    batch_size: int
    rows: Optional[tuple[Interval, ...]] = None
    batch_cost: Optional[tuple[int, str]] = None

    def to_json(self) -> dict[str, Any]:
        out = {"world_size": self.world_size, "num_workers": self.num_workers, "batch_size": self.batch_size,
               "rows": None if self.rows is None else [list(i) for i in self.rows]}
        if self.batch_cost is not None:
            out["batch_cost"] = list(self.batch_cost)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Layout":
        rows, cost = data.get("rows"), data.get("batch_cost")
        return cls(int(data["world_size"]), int(data["num_workers"]), int(data["batch_size"]),
                   None if rows is None else tuple((int(a), int(b)) for a, b in rows),
                   None if cost is None else (int(cost[0]), str(cost[1])))


@attrs.frozen
class DataPosition:
    """The position saved in a checkpoint (``meta.json["data"]``).

    Attributes:
        epoch: the current epoch (0-based).
        step_in_epoch: steps of that epoch already trained.
        layout: the layout that epoch is read with.
        consumed: the global row intervals of that epoch consumed by all ranks.
        total_rows: rows of the training input.
    """

    epoch: int
    step_in_epoch: int
    layout: Layout
    consumed: tuple[Interval, ...]
    total_rows: int

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "layout": self.layout.to_json(),
                "consumed_rows": [list(i) for i in self.consumed], "total_rows": self.total_rows}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "DataPosition":
        return cls(int(data["epoch"]), int(data["step_in_epoch"]), Layout.from_json(data["layout"]),
                   tuple((int(a), int(b)) for a, b in data["consumed_rows"]), int(data["total_rows"]))


@attrs.frozen
class EpochRun:
    """One epoch (or the rest of one) in the plan of a run.

    Attributes:
        epoch: its index.
        layout: how it is read.
        start: the step of the epoch to start at (same layout: the position saved).
        steps: steps of the whole epoch under ``layout``.
        first_step: the global step number its first trained batch gets, minus one.
    """

    epoch: int
    layout: Layout
    start: int
    steps: int
    first_step: int

    @property
    def last_step(self) -> int:
        """The global step number of its last batch."""
        return self.first_step + self.steps - self.start


@attrs.frozen
class ResumePoint:
    """Where a run starts in its data: the global step, the epoch, the layout that epoch is
    read with and the step of the epoch to start at.

    Attributes:
        step: training steps already done.
        epoch: the epoch to continue (0-based).
        layout: how that epoch is read (a partial epoch's rows after a change of layout).
        in_epoch: steps of that epoch already done under ``layout``.
    """

    step: int
    epoch: int
    layout: Layout
    in_epoch: int

    @classmethod
    def beginning(cls, whole: Layout) -> "ResumePoint":
        """The start of a fresh run."""
        return cls(0, 0, whole, 0)

    @classmethod
    def after(cls, step: int, saved: DataPosition, whole: Layout) -> "ResumePoint":
        """Where a run resumed at ``step`` continues, given the position its checkpoint saved
        and the layout this job reads whole epochs with (:func:`resume_layout_for`)."""
        layout, in_epoch = resume_layout_for(saved, whole)
        return cls(step, saved.epoch, layout, in_epoch)


def resume_layout_for(saved: DataPosition, current: Layout) -> tuple[Layout, int]:
    """The layout and start step of the epoch a resumed run continues: the saved one (exact
    continuation) when nothing about the reading changed, otherwise a partial epoch over the
    rows not consumed yet, from its first step."""
    same = attrs.evolve(current, rows=saved.layout.rows) == saved.layout
    if same:
        return saved.layout, saved.step_in_epoch
    epoch_rows = list(saved.layout.rows) if saved.layout.rows is not None else [(0, saved.total_rows)]
    return attrs.evolve(current, rows=tuple(_minus(epoch_rows, merge_intervals(saved.consumed)))), 0


def _minus(rows: list[Interval], taken: list[Interval]) -> list[Interval]:
    """``rows`` (in order) without the sorted, merged ``taken``, in one sweep: a partial epoch's
    rows and a shuffled epoch's consumed rows are thousands of intervals each."""
    import bisect

    ends = [b for _, b in taken]
    out: list[Interval] = []
    for a, b in rows:
        at, i = a, bisect.bisect_right(ends, a)
        while i < len(taken) and taken[i][0] < b:
            x, y = taken[i]
            if x > at:
                out.append((at, x))
            at, i = max(at, y), i + 1
        if at < b:
            out.append((at, b))
    return out


def plan_epochs(
    *,
    num_steps: int | None,
    num_epochs: int | None,
    start_step: int,
    start_epoch: int,
    start_layout: Layout,
    start_in_epoch: int,
    whole_layout: Layout,
    steps_of: Callable[[Layout], int],
) -> list[EpochRun]:
    """The epochs still to train, from global step ``start_step``.

    Args:
        num_steps / num_epochs: the run's length (one of them is set).
        start_step: steps already trained.
        start_epoch, start_layout, start_in_epoch: the epoch to continue and where.
        whole_layout: the layout of every later epoch.
        steps_of: steps of an epoch under a layout.
    """
    plan: list[EpochRun] = []
    step, epoch, layout, start = start_step, start_epoch, start_layout, start_in_epoch
    while True:
        if num_epochs is not None and epoch >= num_epochs:
            break
        if num_steps is not None and step >= num_steps:
            break
        steps = steps_of(layout)
        todo = steps - start
        if num_steps is not None:
            todo = min(todo, num_steps - step)
        if todo > 0:
            plan.append(EpochRun(epoch, layout, start, start + todo, step))
            step += todo
        if steps == 0 and layout.rows is None:
            break  # an input without rows (the reader reports it before this)
        epoch, layout, start = epoch + 1, whole_layout, 0
    return plan


def checkpoint_boundaries(start: int, total: int, every: int, epoch_ends: list[int], by_epoch: int | None) -> list[int]:
    """The steps after ``start`` where a checkpoint (and an evaluation) is due."""
    points = set(range(every, total, every)) if every else set()
    if by_epoch:
        points.update(end for i, end in enumerate(epoch_ends, 1) if i % by_epoch == 0)
    points.add(total)
    return sorted(p for p in points if start < p <= total)


class TrainData:
    """The training batches of a run, epoch after epoch, resumable at any step.

    Args:
        make_input: builds a rank's input for a layout (a
            :class:`~tzrun.data.loader.RankInput`).
        whole: the layout of every whole epoch.
        num_steps / num_epochs: the run's length (one of them is set).
        start: where the run starts.
    """

    def __init__(self, make_input: Callable[[Layout], Any], whole: Layout, *, num_steps: int | None,
                 num_epochs: int | None, start: ResumePoint) -> None:
        self.make_input = make_input
        self.whole = whole
        self.start = start
        self._inputs: dict[Layout, Any] = {}
        self.plan = plan_epochs(
            num_steps=num_steps, num_epochs=num_epochs, start_step=start.step, start_epoch=start.epoch,
            start_layout=start.layout, start_in_epoch=start.in_epoch, whole_layout=whole,
            steps_of=lambda layout: self.input_for(layout).steps,
        )

    @property
    def steps_per_epoch(self) -> int:
        """Steps of a whole epoch."""
        return int(self.input_for(self.whole).steps)

    def input_for(self, layout: Layout) -> Any:
        """The (cached) rank input of a layout."""
        if layout not in self._inputs:
            self._inputs[layout] = self.make_input(layout)
        return self._inputs[layout]

    @property
    def total(self) -> int:
        """The global step number of the last batch."""
        return self.plan[-1].last_step if self.plan else 0

    def epoch_ends(self) -> list[int]:
        """Global steps that end an epoch (whole or partial)."""
        return [r.last_step for r in self.plan if r.steps == self.input_for(r.layout).steps]

    def where(self, step: int) -> tuple[EpochRun, int]:
        """The epoch run holding global step ``step`` (1-based) and the step's index in its
        epoch (1-based)."""
        for run in self.plan:
            if run.first_step < step <= run.last_step:
                return run, run.start + step - run.first_step
        raise IndexError(step)

    def batches(self, from_step: int = 0) -> Iterator[Any]:
        """Every batch after global step ``from_step``, across epochs.

        Where the input reads ahead on a thread (``data.prefetch_batches`` without DataLoader
        workers), one thread reads for the whole run and starts now: the first batches are read
        while the run finishes setting up, and each epoch's first ones while the previous epoch
        ends, not on a step's time. The batches are the same either way."""
        from tzrun.data.loader import ThreadPrefetcher

        passes = [(run, self.input_for(run.layout)) for run in self.plan if run.last_step > from_step]
        first = passes[0][1] if passes else None  # every rank input reads with the run's data.* settings
        if first is not None and first.num_workers == 0 and first.prefetch > 0:
            return ThreadPrefetcher(_batches_of(passes, from_step, read_ahead=False), first.prefetch, first.nice)
        return _batches_of(passes, from_step, read_ahead=True)

    def position(self, step: int, gather: Callable[[list[Interval]], list[Interval]]) -> DataPosition:
        """The data position after global step ``step`` (collective through ``gather``, which
        returns the union of every rank's intervals)."""
        run, in_epoch = self.where(step)
        rank_input = self.input_for(run.layout)
        if in_epoch >= rank_input.steps:  # the epoch is done: the next one starts
            return DataPosition(run.epoch + 1, 0, self._whole_layout(run), (), rank_input.total_rows)
        consumed = gather(rank_input.consumed(in_epoch, epoch=run.epoch))
        if run.layout.rows is not None:  # a resumed partial epoch: the rows before it were consumed too
            consumed = [*consumed, *subtract_intervals(rank_input.total_rows, run.layout.rows)]
        return DataPosition(run.epoch, in_epoch, run.layout, tuple(merge_intervals(consumed)), rank_input.total_rows)

    def _whole_layout(self, run: EpochRun) -> Layout:
        return attrs.evolve(run.layout, rows=None)


def _batches_of(passes: list[tuple[EpochRun, Any]], from_step: int, *, read_ahead: bool) -> Iterator[Any]:
    """The batches of :meth:`TrainData.batches`: each epoch run's pass through its rank input
    (made beforehand), after ``from_step``; each pass reads ahead on its own with ``read_ahead``."""
    for run, rank_input in passes:
        start = run.start + max(0, from_step - run.first_step)
        yield from rank_input.one_pass(max_steps=run.steps, start=start, epoch=run.epoch, read_ahead=read_ahead)
