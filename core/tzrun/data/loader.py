"""One input of a run on one rank: its split, and passes over it as batches."""

from __future__ import annotations

import functools
import re
from typing import Any, Iterator, Sequence

from tzrun.data.cost import BatchCost, cost_split
from tzrun.data.dataset import BatchStream, Shuffle, consumed_rows, padded, resume_layout, split_rows, worker_runs
from tzrun.data.features import BatchBuilder
from tzrun.errors import TzrunError
from tzrun.interfaces import Reader

__all__ = ["ThreadPrefetcher", "RankInput"]


def _start_worker(worker_id: int, nice: int = 0) -> None:
    """How a data worker starts: it builds batches with a single intra-op thread (a forked
    worker inherits the trainer's thread count, and two OpenMP pools spinning on the same cores
    stall training: measured 63k -> 6k samples/s with one worker on 2 cores), runs ``nice``
    lower (``data.reader_nice``, :func:`lower_priority`), and lets go of the rank's network
    connections (:func:`release_inherited_connections`)."""
    import torch

    torch.set_num_threads(1)
    lower_priority(nice)
    release_inherited_connections()


def release_inherited_connections() -> int:
    """In a forked data worker: point every TCP socket inherited from the rank (its process
    group's connections to the other ranks, the job's store) at ``/dev/null``; returns how many.

    A worker never uses them, but while it holds them open a rank that is killed (SIGKILL, the
    OOM killer) is not seen to be gone: its peers' collectives get no end of file until its
    workers notice their parent died (measured: 9 s of a 2-rank job waiting before torchrun
    could restart it, with one worker a rank). The descriptors stay taken (``dup2`` of
    ``/dev/null``, not ``close``), so a stale object closing one later cannot close a file the
    worker opened since. Linux only (``/proc/self/fd``); elsewhere nothing is done."""
    import os
    import socket
    import stat

    try:
        descriptors = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    released = 0
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in descriptors:
            try:
                if fd == devnull or not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    continue
                sock = socket.socket(fileno=fd)
                tcp = sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM
                sock.detach()
            except OSError:
                continue
            if tcp:
                os.dup2(devnull, fd)
                released += 1
    finally:
        os.close(devnull)
    return released


def _fork_workers(loader: Any) -> Iterator[Any]:
    """Start ``loader``'s worker processes (a fork) with the garbage collector's objects frozen.

    A forked worker inherits every Python object of the trainer. If its garbage collector then
    frees one that wraps native state (a gloo process group left over from an earlier run in
    the same process, say), the native destructor runs in a process without the threads it
    waits for, and the worker hangs or crashes (seen in a long test process: a worker stuck in
    ``~ProcessGroupGloo``). Freezing them (``gc.freeze``) keeps the workers' collector off
    every inherited object, even one the worker itself stops referring to.

    The trainer collects first, so that garbage left by an earlier pass (an abandoned DataLoader
    iterator in a reference cycle, most likely) is finalized now and its workers shut down.
    Without it (tried, to save the collection's 0.25 s a pass in a large process), a SIGTERM to
    a 2-rank job killed a data worker and the rank failed with "DataLoader worker exited
    unexpectedly" (exit 70) instead of a checkpoint and exit 75, every time
    (tests/integration/test_launcher_signals.py).
    """
    import gc

    gc.collect()
    gc.freeze()
    try:
        return iter(loader)
    finally:
        gc.unfreeze()


_WORKER_ERROR = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)\.")


def _worker_errors_as_raised(batches: Iterator[Any]) -> Iterator[Any]:
    """``batches``, with a tzrec-run error from a DataLoader worker raised with its own message.

    torch re-raises a worker's exception in the trainer as the same type, but its message is
    "Caught DataError in DataLoader worker process 0." followed by the worker's traceback; the
    user needs the original message (which names the file and column), and which worker it was.
    """
    try:
        yield from batches
    except TzrunError as exc:
        text = str(exc)
        match = _WORKER_ERROR.match(text)
        if match is None:
            raise
        original = text.rsplit(f"{match.group(1)}: ", 1)[-1].strip()
        try:
            clean = type(exc)(f"{original} (in data worker {match.group(2)})")
        except TypeError:  # an error type built from more than a message: keep torch's
            raise exc from None
        raise clean from None


def lower_priority(nice: int) -> None:
    """Raise the calling thread's nice value by ``nice`` (Linux; elsewhere, or without the right
    to, nothing happens): the reading thread or worker then yields the CPU to the training
    step's threads when they compete for the cores.

    On few cores the step's intra-op threads keep every core busy, and when a reading thread
    takes one of them, the step's parallel regions wait at their barriers for the thread it
    displaced: reading costs the step about twice its own CPU time. A lower priority lets
    reading run in the step's idle moments instead (``benchmarks/input_pipeline.py``).
    """
    import os
    import sys
    import threading

    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()  # on Linux, a thread's nice value is its own
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError:
        pass


def _produce(inner: Iterator[Any], items: Any, stop: Any, nice: int = 0) -> None:
    """The prefetch thread: put ``("item", x)`` for each item of ``inner``, then ``("done",
    None)`` or ``("error", e)``; give up as soon as ``stop`` is set. It holds no reference to
    the :class:`ThreadPrefetcher`, so dropping that stops the thread. It first lowers its own
    priority by ``nice`` (:func:`lower_priority`)."""
    import queue

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    lower_priority(nice)
    try:
        for item in inner:
            if not put(("item", item)):
                return
        put(("done", None))
    except BaseException as error:  # handed to the consumer
        put(("error", error))


class ThreadPrefetcher:
    """Runs ``inner`` on a background thread, up to ``depth`` items ahead, and yields its items
    in order (``data.prefetch_batches`` with ``num_workers = 0``).

    Reading and building a batch (Arrow decoding, hashing, numpy) mostly runs outside the GIL,
    so it overlaps with the training step instead of adding to it, without the copies and the
    extra process of a DataLoader worker. An exception in ``inner`` is raised by ``next`` in
    the consuming thread. :meth:`close`, or dropping the iterator, stops the thread within
    0.1 s (a pass cut short, by ``eval.num_steps`` say, leaves no thread behind).
    """

    def __init__(self, inner: Iterator[Any], depth: int, nice: int = 0) -> None:
        import queue
        import threading

        self._queue: Any = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_produce, args=(inner, self._queue, self._stop, nice),
                                        name="tzrun-prefetch", daemon=True)
        self._thread.start()

    def __iter__(self) -> "ThreadPrefetcher":
        return self

    def __next__(self) -> Any:
        kind, value = self._queue.get()
        if kind == "item":
            return value
        self._stop.set()
        if kind == "done":
            raise StopIteration
        raise value

    def close(self) -> None:
        """Stop the background thread (it ends within 0.1 s)."""
        self._stop.set()

    def __del__(self) -> None:
        self._stop.set()


class RankInput:
    """This rank's share of an input.

    Args:
        reader: the run's reader.
        input_path: the input (file, directory or glob).
        batch_size: rows per batch on this rank.
        num_workers: DataLoader workers (0: read in this process).
        columns: columns to read.
        builder: Arrow -> Batch conversion.
        rank, world_size: this process in the job.
        rows: the global row intervals to read (a resumed partial epoch; default: all).
        shuffle_buffer_rows: ``data.shuffle_buffer_rows`` (0: no shuffle); see
            :class:`~tzrun.data.dataset.Shuffle`.
        seed: ``train.seed``, which picks the shuffle's permutations.
        prefetch: with ``num_workers = 0``, how many batches a background thread builds
            ahead (:class:`ThreadPrefetcher`; 0: each batch is built when asked for).
        nice: how much lower the prefetch thread or the workers run (``data.reader_nice``).
        cost: cost-aware batches (``data.batch_cost_size``, :mod:`tzrun.data.cost`; not with a
            shuffle); None: batches of ``batch_size`` rows.

    Raises:
        DataError: when the input has no files or rows.
    """

    def __init__(
        self,
        reader: Reader,
        input_path: str,
        batch_size: int,
        num_workers: int,
        columns: Sequence[str],
        builder: BatchBuilder,
        rank: int,
        world_size: int,
        rows: Sequence[tuple[int, int]] | None = None,
        shuffle_buffer_rows: int = 0,
        seed: int = 0,
        prefetch: int = 0,
        nice: int = 0,
        cost: BatchCost | None = None,
    ) -> None:
        from tzrun.errors import DataError

        groups = reader.row_groups(input_path)
        self.total_rows = sum(g.num_rows for g in groups)
        if self.total_rows == 0:
            raise DataError(f"{input_path}: the input has no rows")
        if cost is not None:
            self.split = cost_split(groups, rank, world_size, batch_size, rows, reader, cost)
        else:
            self.split = split_rows(groups, rank, world_size, batch_size, rows)
        self.shuffle = Shuffle.of(shuffle_buffer_rows, batch_size, seed)
        if cost is not None and self.shuffle is not None:
            raise ValueError("cost-aware batches are not shuffled (data.batch_cost_size with data.shuffle_buffer_rows)")
        self.stream = BatchStream(reader, self.split, batch_size, columns, builder, self.shuffle)
        self.builder = builder
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.nice = nice

    @property
    def steps(self) -> int:
        """Steps of one pass, the same on every rank."""
        return self.split.steps

    @property
    def runs(self) -> list[tuple[int, int]]:
        """The batch run of each reading worker (one run when reading in this process)."""
        workers = max(1, min(self.num_workers, self.split.num_batches)) if self.num_workers else 1
        return worker_runs(self.split.num_batches, workers)

    def consumed(self, done: int, epoch: int = 0) -> list[tuple[int, int]]:
        """The global row intervals this rank has consumed after ``done`` steps of pass
        ``epoch`` (the epoch matters only with a shuffle)."""
        return consumed_rows(self.split.rows, self.batch_size, self.split.num_rows, self.runs, done, self.shuffle, epoch,
                             self.split.bounds)

    def one_pass(self, max_steps: int | None = None, start: int = 0, epoch: int = 0,
                 read_ahead: bool = True) -> Iterator[Any]:
        """One pass from step ``start`` on, as exactly ``min(steps, max_steps) - start``
        batches (``max_steps`` counts from the start of the pass): this rank's rows, then
        weight-0 padding batches if other ranks have more. The batches are the ones an
        uninterrupted pass with the same ``num_workers`` yields from step ``start``, in the same
        order (workers read contiguous shares of the batches and are taken in turn, so the
        order depends on ``num_workers``). ``epoch`` picks the shuffle's permutations (pass the same one to
        :meth:`consumed`). ``read_ahead=False`` leaves out the prefetch thread (for a caller
        that reads ahead across passes itself)."""
        from torch.utils.data import DataLoader

        steps = self.steps if max_steps is None else min(self.steps, max_steps)
        runs = self.runs
        remaining, order = resume_layout(runs, start)
        if self.num_workers == 0:
            batches: Iterator[Any] = self.stream.iter_run(*remaining[0], origin=runs[0][0], epoch=epoch)
            if self.prefetch > 0 and read_ahead:
                batches = ThreadPrefetcher(batches, self.prefetch, self.nice)
        else:
            loader = DataLoader(
                self.stream.torch_dataset([remaining[w] for w in order], [runs[w][0] for w in order], epoch),
                batch_size=None,
                num_workers=len(order),
                worker_init_fn=functools.partial(_start_worker, nice=self.nice),
            )
            batches = _worker_errors_as_raised(_fork_workers(loader))
        return padded(batches, max(0, steps - start), self.builder.padding)
