"""Typed errors of tzrec-run.

Every error a user can cause carries where (file, TOML path, plugin, data column) and what to do.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

__all__ = [
    "EXIT_OK",
    "EXIT_USAGE",
    "EXIT_DATA",
    "EXIT_CHECKPOINT",
    "EXIT_INSTALL",
    "EXIT_RANK_LOST",
    "EXIT_INTERNAL",
    "EXIT_CANT_WRITE",
    "EXIT_STOPPED_BY_SIGNAL",
    "EXIT_CONFIG",
    "EXIT_INTERRUPTED",
    "EXIT_BROKEN_PIPE",
    "exit_code_of",
    "TzrunError",
    "ConfigError",
    "ConfigProblem",
    "ProtoTextError",
    "PluginError",
    "PluginLoadError",
    "DuplicateRegistrationError",
    "ComponentLookupError",
    "UnknownComponentError",
    "AmbiguousComponentError",
    "ConformanceError",
    "DataError",
    "DataCheckError",
    "BadRowError",
    "NonFiniteLossError",
    "NonFinitePredictionError",
    "CheckpointError",
    "IncompleteCheckpointError",
    "WriteError",
    "StorageError",
    "PlanError",
    "RecordNotWrittenError",
    "MissingDependencyError",
    "did_you_mean",
]


# The exit codes of every tzrec-run command, sysexits-style (README, "Exit codes"; ``tzrec-run
# help exit-codes``). Each TzrunError class carries its code as ``exit_code``; exit_code_of maps.
#: The command did what it was asked.
EXIT_OK = 0
#: The command line is wrong (an unknown option, a missing argument, flags that do not go together).
EXIT_USAGE = 64  # EX_USAGE
#: The data is wrong: a bad row or label, input files whose columns do not fit the config, a
#: non-finite loss or prediction computed from it.
EXIT_DATA = 65  # EX_DATAERR
#: A checkpoint cannot be used: missing, incomplete, damaged, written for another model, or none
#: matches what was asked for (``ckpt inspect`` of a damaged one exits with it too).
EXIT_CHECKPOINT = 66  # EX_NOINPUT
#: ``install-stack`` could not install a package: its index cannot be reached, holds no build of
#: the pinned release for this Python and platform, or pip failed (one line says which, and what to do).
EXIT_INSTALL = 68  # EX_NOHOST
#: A rank of a job stopped responding for ``train.rank_timeout_s`` (a frozen process or host),
#: or the job's store stopped answering; every rank ends with it. Also the launcher's code when
#: torchrun, the job's agent under ``--nproc-per-node``, was killed (it ends the ranks left).
EXIT_RANK_LOST = 69  # EX_UNAVAILABLE
#: An internal error: anything not raised on purpose (a traceback is printed).
EXIT_INTERNAL = 70  # EX_SOFTWARE
#: The run's output cannot be written: a full disk, a read-only model dir, a model dir
#: another live run holds (``run.lock``), or one on a store whose run lock cannot be exclusive.
EXIT_CANT_WRITE = 73  # EX_CANTCREAT
#: Stopped by SIGTERM, SIGHUP, SIGUSR1 or Ctrl-C after writing a checkpoint: rerun with ``--resume``.
EXIT_STOPPED_BY_SIGNAL = 75  # EX_TEMPFAIL
#: The config or the environment is wrong: TOML, unknown names or options, a rejected plugin,
#: a misused model dir or checkpoint flag, a config no sharding plan fits, a bad torch stack.
EXIT_CONFIG = 78  # EX_CONFIG
#: A second Ctrl-C (or one outside training): stopped at once, 128 + SIGINT as a shell reports it.
EXIT_INTERRUPTED = 130
#: The reader of standard output went away (``tzrec-run ... | head``): 128 + SIGPIPE, as a
#: command killed by SIGPIPE reports it in a shell; no traceback.
EXIT_BROKEN_PIPE = 141


class TzrunError(Exception):
    """Base class of every error raised on purpose by tzrec-run.

    Attributes:
        exit_code: the exit code of a command this error stops (:func:`exit_code_of`); a
            subclass (a plugin's own, too) sets the one that fits.
        printed: set once the command line has printed it (rank 0 of a job of several ranks
            prints its own failure before the other ranks hear of it: once they have, the
            launcher may end rank 0 at any moment).
    """

    exit_code: int = EXIT_CONFIG
    printed: bool = False


def exit_code_of(error: BaseException) -> int:
    """The exit code of a command (and of every rank of a job) stopped by ``error``.

    A :class:`TzrunError` gives its class's ``exit_code``; a ``SystemExit`` its own code;
    Ctrl-C :data:`EXIT_INTERRUPTED`; a closed standard output :data:`EXIT_BROKEN_PIPE`;
    anything else :data:`EXIT_INTERNAL`.
    """
    if isinstance(error, TzrunError):
        return int(error.exit_code)
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else (EXIT_OK if code is None else 1)
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, BrokenPipeError):
        return EXIT_BROKEN_PIPE
    return EXIT_INTERNAL


class ConfigProblem:
    """One problem found in a config: the TOML path it concerns and a message."""

    __slots__ = ("path", "message")

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    def __repr__(self) -> str:
        return f"ConfigProblem({self.path!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfigProblem) and (self.path, self.message) == (
            other.path,
            other.message,
        )

    def __hash__(self) -> int:
        return hash((self.path, self.message))


class ConfigError(TzrunError):
    """A config has one or more problems; all of them are listed, one line each.

    Attributes:
        source: the config file (or ``"<string>"``) the problems were found in.
        problems: every problem found, in the order they were found.
    """

    def __init__(self, source: str, problems: Sequence[ConfigProblem]) -> None:
        self.source = source
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{source}: {n} problem{'s' if n != 1 else ''}"
        super().__init__("\n".join([head, *(f"  {p}" for p in self.problems)]))


class ProtoTextError(TzrunError):
    """Protobuf text (a TorchEasyRec config given to ``tzrec-run convert``) that cannot be read;
    the message names the file, line and column.

    Attributes:
        source: the file name (or ``"<string>"``).
        line: the line of the problem, from 1.
        column: its column, from 1.
    """

    def __init__(self, source: str, line: int, column: int, message: str) -> None:
        self.source, self.line, self.column = source, line, column
        super().__init__(f"{source}:{line}:{column}: {message}")


class PluginError(TzrunError):
    """A plugin misbehaved (bad registration, failing hook) or could not be loaded."""


class PluginLoadError(PluginError):
    """An entry point of the ``tzrun`` group could not be loaded (strict mode only): it failed
    to import, its distribution requires another tzrec-run version, or its hooks do not match
    the hookspecs."""


class DuplicateRegistrationError(PluginError):
    """Two plugins registered the same component name in one kind."""

    def __init__(
        self, kind: str, name: str, first: str, second: str, first_shown: str = "", second_shown: str = ""
    ) -> None:
        self.kind, self.name, self.first, self.second = kind, name, first, second
        super().__init__(
            f"{kind} '{name}' is registered twice: by plugin {first_shown or repr(first)} and by plugin "
            f"{second_shown or repr(second)}. Disable one of them with [plugins] disable = [\"{second}\"] "
            f"in the config or TZRUN_DISABLE_PLUGINS={second}."
        )


class ComponentLookupError(TzrunError):
    """A component name in the config does not pick exactly one registered component.

    Attributes:
        path: the TOML path the name was read from.
    """

    path: str


class UnknownComponentError(ComponentLookupError):
    """A component name in the config is not registered by any plugin."""

    def __init__(self, kind: str, name: str, path: str, available: Iterable[str]) -> None:
        self.kind, self.name, self.path = kind, name, path
        self.available = sorted(available)
        super().__init__(f"{path}: {unknown_component_message(kind, name, self.available)}")


class AmbiguousComponentError(ComponentLookupError):
    """A component name in the config is registered by several plugins and the config does not
    say which one it means. The message lists them and the qualified names that pick one.

    Attributes:
        candidates: ``(plugin, shown)`` per plugin registering the name, ``shown`` being
            ``'plugin' (distribution version)``.
    """

    def __init__(self, kind: str, name: str, path: str, candidates: Sequence[tuple[str, str]]) -> None:
        self.kind, self.name, self.path = kind, name, path
        self.candidates = list(candidates)
        by = " and ".join(shown for _, shown in self.candidates)
        picks = " or ".join(f'type = "{plugin}:{name}"' for plugin, _ in self.candidates)
        super().__init__(
            f"{path}: {kind} '{name}' is registered by {len(self.candidates)} plugins: {by}; "
            f"say which one with {picks}"
        )


class ConformanceError(TzrunError):
    """A component does not do what its kind requires (``tzrec-run check``'s conformance
    checks, :func:`tzrun.testing.check_component`); each problem names the plugin, the
    component and the rule."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class DataError(TzrunError):
    """Input data does not match the config: names the file and the column."""

    exit_code = EXIT_DATA


class DataCheckError(DataError):
    """``tzrec-run check`` found input files that do not fit the config (missing or mistyped
    columns, files whose schemas disagree, input paths that do not exist); one line each.

    Attributes:
        source: the config file.
        problems: one line per problem, each starting with the file concerned.
    """

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{source}: {n} data problem{'s' if n != 1 else ''} (from the input files' schemas; --no-data skips this check)"
        super().__init__("\n".join([head, *(f"  {p}" for p in self.problems)]))


class BadRowError(DataError):
    """A bad value in a row of a batch (``data.on_bad_row = "error"``). The input stream
    that built the batch names the row's file and line (or row) in its stead.

    Attributes:
        batch_row: the position of the first bad row in the batch.
        detail: the message after the file's name.
    """

    def __init__(self, message: str, batch_row: int = 0, detail: str = "") -> None:
        super().__init__(message)  # message alone: torch re-raises a DataLoader worker's error so
        self.batch_row, self.detail = batch_row, detail or message


class NonFiniteLossError(TzrunError):
    """A training step's loss or gradient was not finite (``train.on_nonfinite_loss =
    "error"``); raised before any checkpoint holds its effects."""

    exit_code = EXIT_DATA


class NonFinitePredictionError(TzrunError):
    """An evaluation met NaN or infinite predictions (a diverged model): names the step, the
    output and the metric; raised before the evaluation's result is recorded."""

    exit_code = EXIT_DATA


class CheckpointError(TzrunError):
    """A checkpoint cannot be used: a file is missing, truncated or corrupted, it was written
    for another model, or none matches what was asked for. Names the file and an earlier
    checkpoint to use instead, when there is one."""

    exit_code = EXIT_CHECKPOINT


class IncompleteCheckpointError(CheckpointError, FileNotFoundError):
    """A directory is not a complete checkpoint (no completion marker: its save was interrupted)."""


class WriteError(TzrunError):
    """A file of the run cannot be written: its disk is full, the model dir is read-only or
    not writable. Names the path, the reason and the fix; checkpoints completed before it stay
    usable (a checkpoint's completion marker is written last)."""

    exit_code = EXIT_CANT_WRITE


class RecordNotWrittenError(WriteError):
    """A result was computed but its record could not be written (``tzrec-run evaluate`` into
    a read-only or full model dir). ``result`` holds what was computed, to be shown anyway."""

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """Return the closest candidate to ``name``, or None when nothing is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_component_message(kind: str, name: str, available: Sequence[str]) -> str:
    """The one-line message for an unknown component name (without its TOML path)."""
    listed = ", ".join(available) if available else "none registered"
    msg = f"unknown {kind} '{name}' (available: {listed}"
    guess = did_you_mean(name, available)
    if guess is not None:
        msg += f"; did you mean '{guess}'?"
    return msg + ")"


class StorageError(TzrunError):
    """A path names a store this installation cannot open (a URL scheme whose fsspec
    implementation is not installed: the message names the path and the extra to install; a
    store that refuses to list it: credentials, endpoint, network), or a place on a store that
    does not exist (a model dir in a missing bucket)."""


class PlanError(TzrunError):
    """The run does not fit where it is to run: TorchRec's sharding planner places its tables on
    no rank (``train``, ``check``), or on CPU its tables need more memory than the host has
    available. One line with the numbers and what would help."""


class MissingDependencyError(TzrunError):
    """A package a command needs is not installed (torch, FBGEMM, TorchRec, or an extra's); the
    one-line message names it and the one command that installs it (:mod:`tzrun.stack`)."""
