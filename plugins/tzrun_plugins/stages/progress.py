"""The ``progress`` stage: a live progress bar on a terminal, plain periodic lines elsewhere.

Rank 0 only. While the bar is shown, log records reach the terminal above it
(:class:`LogThroughBar`), so lines and bar never mix, and the train lines the bar stands for
are logged for the model dir's log file only. Numbers come from the loop's train log
(``tzrun_after_train_log``, every ``train.log_every_n_steps`` steps), so the per-step hook only
moves the bar: it never reads a tensor.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Any, Literal

import attrs

import tzrun
from tzrun_plugins.stages._closing import ClosedAtTheEnd

__all__ = ["ProgressConfig", "ProgressStage", "build_progress", "format_train_log", "format_memory", "LogThroughBar"]

log = logging.getLogger("tzrun.progress")


@attrs.frozen
class ProgressConfig:
    """Options of the ``progress`` stage.

    Attributes:
        mode: ``"auto"`` (a bar when standard error is a terminal, lines otherwise), ``"bar"``
            or ``"lines"``. Lines come every ``train.log_every_n_steps`` steps.
    """

    mode: Literal["auto", "bar", "lines"] = "auto"


def _eta(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(max(seconds, 0))))


def format_memory(record: tzrun.TrainLog) -> str:
    """The memory part of a line: ``mem=1.23GiB`` (resident), with ``device_mem=...`` (the
    window's peak reserved on the CUDA device) where there is one; empty when neither is known."""
    parts = [f"{name}={value / 2**30:.2f}GiB" for name, value in
             (("mem", record.rss_bytes), ("device_mem", record.device_memory_bytes)) if value is not None]
    return " ".join(parts)


def format_zch(record: tzrun.TrainLog) -> str:
    """The ``zch`` part of a line, per table: the share of the window's lookups that read the
    miss row, the occupancy, the ids admitted to a row and those evicted from one
    (``zch/user_emb=miss 3.1% occ 97.0% adm 14 ev 12``); empty without ``zch``."""
    return "  ".join(f"zch/{table}=miss {100 * c['miss_share']:.1f}% occ {100 * c['occupancy']:.1f}% "
                     f"adm {c.get('admitted', 0):.0f} ev {c['evicted']:.0f}" for table, c in record.zch.items())


def format_train_log(record: tzrun.TrainLog, total_steps: int) -> str:
    """One plain progress line: step, epoch, mean loss, train metrics, learning rates,
    samples/s, data wait, memory, the ``zch`` tables' counts and the time left at the window's pace."""
    metrics = "".join(f"  {k}={v:.5f}" for k, v in record.metrics.items())
    lrs = " ".join(f"lr/{k}={v:.6g}" for k, v in record.learning_rates.items())
    per_step = record.seconds / max(record.steps, 1)
    eta = _eta(per_step * (total_steps - record.step))
    memory, zch = format_memory(record), format_zch(record)
    return (f"step {record.step}/{total_steps} epoch {record.epoch}  loss={record.loss:.5f}{metrics}  {lrs}  "
            f"samples/s={record.samples_per_s:.0f}  data_wait={100 * record.data_wait_fraction:.1f}%  "
            f"{memory + '  ' if memory else ''}{zch + '  ' if zch else ''}eta {eta}")


class ProgressStage(ClosedAtTheEnd):
    """Shows how far training is: a tqdm bar or log lines (see the module doc)."""

    def __init__(self, cfg: ProgressConfig) -> None:
        self.cfg = cfg
        self.bar: Any = None
        self.log_through_bar: LogThroughBar | None = None

    @tzrun.hookimpl
    def tzrun_before_train(self, run: tzrun.RunContext) -> None:
        if not run.is_rank0:
            return
        use_bar = self.cfg.mode == "bar" or (self.cfg.mode == "auto" and sys.stderr.isatty())
        if use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=run.total_steps, initial=run.start_step, unit="step", dynamic_ncols=True,
                            desc="train", file=sys.stderr)
            self.log_through_bar = LogThroughBar(self.bar)

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run: tzrun.RunContext, step: tzrun.StepInfo) -> None:
        if self.bar is not None:
            self.bar.update(1)

    @tzrun.hookimpl
    def tzrun_after_train_log(self, run: tzrun.RunContext, log: tzrun.TrainLog) -> None:
        if not run.is_rank0:
            return
        if self.bar is not None:
            memory = {"mem": f"{log.rss_bytes / 2**30:.2f}GiB"} if log.rss_bytes is not None else {}
            self.bar.set_postfix(epoch=log.epoch, loss=f"{log.loss:.4f}", samples_s=f"{log.samples_per_s:.0f}",
                                 data_wait=f"{100 * log.data_wait_fraction:.0f}%", **memory, refresh=False)
            # the bar shows it on the terminal; the model dir's log file gets the line
            _log_line(format_train_log(log, run.total_steps), terminal=False)
        else:
            _log_line(format_train_log(log, run.total_steps))

    @tzrun.hookimpl
    def tzrun_after_eval(self, run: tzrun.RunContext, step: int, result: tzrun.EvalResult) -> None:
        if not run.is_rank0:
            return
        values = "  ".join(f"{k}={v:.6f}" for k, v in result.metrics.items())
        rate = f" in {result.seconds:.1f} s ({result.rows / result.seconds:,.0f} rows/s)" if result.seconds > 0 else ""
        line = f"eval at step {step} over {result.rows} rows{rate}: {values}"
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        _log_line(line, terminal=self.bar is None)  # with a bar, for the log file only

    def close(self) -> None:
        if self.log_through_bar is not None:
            self.log_through_bar.restore()
            self.log_through_bar = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class _BarStream:
    """A stream for a terminal log handler while a bar is shown: each line is written above the
    bar (``tqdm.write``), which is then drawn again, so log lines never break into it."""

    def __init__(self, bar: Any, stream: Any) -> None:
        self.bar, self.stream = bar, stream

    def write(self, text: str) -> None:
        self.bar.write(text.rstrip("\n"), file=self.stream)

    def flush(self) -> None:
        self.stream.flush()


class LogThroughBar:
    """While a bar is shown, the root logger's terminal handlers (those writing to standard
    error or output) write through the bar, and skip the records the bar already shows (the
    train lines, which still reach the log file); :meth:`restore` gives them their stream back.
    The handlers keep their format and filters (tqdm's ``logging_redirect_tqdm`` replaces the
    handler and drops its filters, which redact passwords)."""

    def __init__(self, bar: Any) -> None:
        self.saved: list[tuple["logging.StreamHandler[Any]", Any]] = []
        for handler in logging.getLogger().handlers:
            if (type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.stdout)):
                self.saved.append((handler, handler.setStream(_BarStream(bar, handler.stream))))
                handler.addFilter(_on_terminal)

    def restore(self) -> None:
        for handler, stream in self.saved:
            handler.setStream(stream)
            handler.removeFilter(_on_terminal)
        self.saved = []


#: The attribute of a log record that the terminal's handlers skip while a bar is shown.
NOT_ON_TERMINAL = "tzrun_not_on_terminal"


def _log_line(line: str, terminal: bool = True) -> None:
    log.info("%s", line, extra={} if terminal else {NOT_ON_TERMINAL: True})


def _on_terminal(record: logging.LogRecord) -> bool:
    return not getattr(record, NOT_ON_TERMINAL, False)


def build_progress(cfg: ProgressConfig) -> ProgressStage:
    """A progress stage for one run."""
    return ProgressStage(cfg)
