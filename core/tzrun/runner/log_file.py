"""The run's log file in its model dir, ``logs/train.log``: what rank 0 logs, and every rank's
warnings and errors, in the format of the terminal's lines (with the date and the rank).

A :class:`LogFile` is a :class:`logging.FileHandler` on the root logger for the time
:func:`log_file` is entered (the trainer enters it once the model dir is claimed), so it gets
exactly the records the terminal gets. It appends: a resumed run continues its story in the same
file; ``--overwrite`` removes ``logs/`` with the other outputs of the earlier run. An error that
ends the run is written into it before it is closed (a one-line message for a
:class:`~tzrun.errors.TzrunError`, the traceback for anything else), and so is another rank's
failure that the watchdog announces (:func:`record_in_log_files`).

On a local (or shared) disk every rank appends to the one file; each record is one ``write``
of a file opened for appending. On an object store (``s3://``...), which has no append, each rank
writes a local file and uploads it whole: rank 0 to ``logs/train.log``, another rank to
``logs/train.rank-N.log`` (only when it logged anything); after a record at most every
:data:`UPLOAD_EVERY_S` seconds and when the file is closed, including by :func:`logging.shutdown`
on the way out of a process that a failure ends. A resumed run on a store first downloads the
earlier file, to append to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from tzrun.errors import TzrunError
from tzrun.io.storage import filesystem, is_remote, redact_url

__all__ = ["LOG_DIR", "LOG_FILE", "DATE_FORMAT", "UPLOAD_EVERY_S", "LogFile", "log_file", "log_format",
           "redact_record", "record_in_log_files"]

#: The model dir's folder of logs (``--overwrite`` removes it) and rank 0's file in it.
LOG_DIR = "logs"
LOG_FILE = f"{LOG_DIR}/train.log"
#: The date and time of each line, the terminal's and the file's (local time).
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
#: On an object store: the least seconds between two uploads of the file while the run goes.
UPLOAD_EVERY_S = 60.0


def log_format(rank: int) -> str:
    """The format of a log line of ``rank`` (the terminal's and the file's)."""
    return f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s"


def redact_record(record: logging.LogRecord) -> bool:
    """Show a log line, and its exception, with every URL's password redacted (a handler filter)."""
    record.msg, record.args = redact_url(record.getMessage()), None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redact_url(record.exc_text)
    return True


class LogFile(logging.FileHandler):
    """Appends the records it handles to this rank's log file of ``model_dir`` (see the module doc).

    Args:
        model_dir: the run's model dir (a local path or a URL).
        rank: this process's rank.
    """

    def __init__(self, model_dir: Any, rank: int) -> None:
        self.rank = rank
        self.remote = is_remote(model_dir)
        name = LOG_FILE if rank == 0 or not self.remote else f"{LOG_DIR}/train.rank-{rank}.log"
        self.target = f"{str(model_dir).rstrip('/')}/{name}"
        self._uploaded_at = time.monotonic()
        if self.remote:
            handle, local = tempfile.mkstemp(prefix=f"tzrun-log-rank{rank}-", suffix=".log")
            os.close(handle)
            self._download(local)
        else:
            local = os.fspath(Path(self.target))
            Path(local).parent.mkdir(parents=True, exist_ok=True)
        self._written_from = os.path.getsize(local) if os.path.exists(local) else 0
        super().__init__(local, mode="a", encoding="utf-8")
        self.setFormatter(logging.Formatter(log_format(rank), DATE_FORMAT))
        self.addFilter(redact_record)

    def _download(self, local: str) -> None:
        """Start from the store's earlier file, if any (a resumed run appends to it)."""
        fs, inner = filesystem(self.target)
        if fs.exists(inner):
            fs.get_file(inner, local)

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if self.remote and time.monotonic() - self._uploaded_at >= UPLOAD_EVERY_S:
            self.upload()

    def upload(self) -> None:
        """Copy the local file to the store, whole (on a store; a record since the file was
        opened, or rank 0's file, which always exists). A failure is one line on standard error:
        a log must not end the run."""
        self._uploaded_at = time.monotonic()
        if not self.remote or not os.path.exists(self.baseFilename):
            return
        if self.rank != 0 and os.path.getsize(self.baseFilename) == self._written_from:
            return
        try:
            fs, inner = filesystem(self.target)
            fs.put_file(self.baseFilename, inner)
        except Exception as error:  # noqa: BLE001 - a log that cannot be uploaded is not the run's failure
            import sys

            print(f"tzrec-run: could not upload the log to {redact_url(self.target)}: "
                  f"{type(error).__name__}: {redact_url(str(error))[:200]}", file=sys.stderr)

    def record_error(self, error: BaseException) -> None:
        """Write the error that ends the run (a traceback unless it is a :class:`TzrunError`)."""
        text = str(error).strip()
        if not isinstance(error, TzrunError):
            text = f"{type(error).__name__}: {text}" if text else type(error).__name__
        exc_info = None if isinstance(error, TzrunError) else (type(error), error, error.__traceback__)
        self.write_line(f"the run failed: {text}", exc_info)

    def write_line(self, message: str, exc_info: Any = None) -> None:
        """Write ``message`` as an error line of this rank (not through a logger: the terminal
        has it already)."""
        self.handle(logging.makeLogRecord({"name": "tzrun", "levelno": logging.ERROR, "levelname": "ERROR",
                                           "msg": message, "exc_info": exc_info}))

    def close(self) -> None:
        """Close the file; on a store, upload it a last time and remove the local copy."""
        super().close()
        if self.remote and os.path.exists(self.baseFilename):
            self.upload()
            os.unlink(self.baseFilename)


@contextlib.contextmanager
def log_file(model_dir: Any, rank: int) -> Iterator[LogFile]:
    """Log into the model dir's log file (see the module doc) while the block runs; an error
    that leaves the block is written into the file first."""
    handler = LogFile(model_dir, rank)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    except BaseException as error:
        if not (isinstance(error, SystemExit) and not error.code):
            handler.record_error(error)
        raise
    finally:
        root.removeHandler(handler)
        handler.close()


def record_in_log_files(message: str) -> None:
    """Write ``message`` (another rank's failure, as rank 0 announces it) into the log files
    the root logger has open."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LogFile):
            handler.write_line(message)
