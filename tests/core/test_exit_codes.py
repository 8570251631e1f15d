"""Exit codes (sysexits-style, one mapping for one rank and for every rank of a job), usage
errors, internal errors, a closed standard output and ``--log-level`` (docs/cli.md)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tzrun import errors
from tzrun.cli import commands
from tzrun.cli import main as cli
from tzrun.errors import (EXIT_CANT_WRITE, EXIT_CHECKPOINT, EXIT_CONFIG, EXIT_DATA, EXIT_INTERNAL, EXIT_USAGE,
                          exit_code_of)


@pytest.mark.parametrize(("error", "code"), [
    (errors.ConfigError("a.toml", [errors.ConfigProblem("train.lr", "expected a float")]), EXIT_CONFIG),
    (errors.UnknownComponentError("dense optimizer", "adma", "train.dense_optimizer.type", ["adam"]), EXIT_CONFIG),
    (errors.PluginLoadError("plugin 'x' was rejected"), EXIT_CONFIG),
    (errors.DuplicateRegistrationError("metric", "auc", "a", "b"), EXIT_CONFIG),
    (errors.TzrunError("a.toml: the model dir holds checkpoints; pass --resume or --overwrite"), EXIT_CONFIG),
    (errors.DataCheckError("a.toml", ["part-0.parquet: column 'x' missing"]), EXIT_DATA),
    (errors.BadRowError("part-0.csv, line 3, column 'I1': 'abc' is not a number"), EXIT_DATA),
    (errors.NonFiniteLossError("loss is nan at step 3"), EXIT_DATA),
    (errors.CheckpointError("step-4: state/.metadata is truncated"), EXIT_CHECKPOINT),
    (errors.IncompleteCheckpointError("step-4 has no COMPLETE marker"), EXIT_CHECKPOINT),
    (errors.WriteError("run: cannot write: Read-only file system (EROFS)"), EXIT_CANT_WRITE),
    (errors.RecordNotWrittenError("eval_results.jsonl: cannot write"), EXIT_CANT_WRITE),
    (RuntimeError("a bug"), EXIT_INTERNAL),
    (KeyboardInterrupt(), 130),
    (BrokenPipeError(), 141),
])
def test_each_kind_of_error_has_its_exit_code(error, code):
    assert exit_code_of(error) == code


def test_a_model_dir_another_run_holds_cannot_be_written():
    from tzrun.runner.run_lock import ModelDirLockedError

    assert exit_code_of(ModelDirLockedError("run: is in use by another run")) == EXIT_CANT_WRITE


def test_a_plugins_own_error_class_picks_its_code():
    class VocabMissing(errors.DataError):
        pass

    class Custom(errors.TzrunError):
        exit_code = EXIT_CHECKPOINT

    assert exit_code_of(VocabMissing("vocab.txt: missing")) == EXIT_DATA
    assert exit_code_of(Custom("x")) == EXIT_CHECKPOINT


def _documented_codes(text: str) -> dict[int, str]:
    return {int(code): name for code, name in re.findall(r"^\| (\d+) \| `(EXIT_\w+)` \|", text, re.M)}


def test_the_documented_tables_are_the_constants():
    constants = {getattr(errors, n): n for n in dir(errors) if n.startswith("EXIT_")}
    assert _documented_codes((REPO / "docs" / "cli.md").read_text()) == constants
    assert _documented_codes((REPO / "core" / "tzrun" / "help" / "exit-codes.md").read_text()) == constants
    readme = (REPO / "README.md").read_text()
    table = readme.split("| code | meaning |", 1)[1].split("\n\n", 1)[0]
    assert {int(c) for c in re.findall(r"^\s*\| (\d+) \|", table, re.M)} == set(constants)


def test_a_usage_error_exits_64_with_argparses_message(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["train"])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: tzrec-run train") and "tzrec-run train: error: the following arguments are required: config" in err
    with pytest.raises(SystemExit) as exited:
        cli.main(["trian"])
    assert exited.value.code == EXIT_USAGE and "invalid choice: 'trian'" in capsys.readouterr().err


def test_flags_that_do_not_go_together_are_a_usage_error(capsys):
    assert cli.main(["data", "synth", "taobao", "--rows", "10", "--out", "x", "--format", "text"]) == EXIT_USAGE
    assert "--format text is for criteo only" in capsys.readouterr().err


def test_an_internal_error_prints_its_traceback_and_exits_70(monkeypatch, capsys):
    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setitem(commands.COMMANDS, "env", broken)
    monkeypatch.setattr(sys, "argv", ["tzrec-run", "env"])
    with pytest.raises(SystemExit) as exited:
        cli.console_main()
    assert exited.value.code == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError: a bug" in err


def test_a_closed_stdout_ends_the_command_quietly_with_141():
    """``tzrec-run env --json | head -0``: the reader is gone before anything is written."""
    proc = subprocess.Popen([sys.executable, "-m", "tzrun", "env", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    proc.stdout.close()  # before the child has written anything: its write fails with EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == errors.EXIT_BROKEN_PIPE, err
    assert err == "", err


@pytest.fixture
def tzrun_logger():
    logger = logging.getLogger("tzrun")
    level = logger.level
    yield logger
    logger.setLevel(level)


@pytest.mark.parametrize(("argv", "env", "rank", "level"), [
    (["help"], None, "0", logging.INFO),
    (["help"], None, "1", logging.WARNING),
    (["--log-level", "debug", "help"], None, "1", logging.DEBUG),
    (["--log-level", "info", "help"], None, "1", logging.WARNING),  # info stays rank 0's
    (["--log-level", "error", "help"], None, "0", logging.ERROR),
    (["check", "x.toml", "--log-level", "warning", "--no-data"], None, "0", logging.WARNING),
    (["help"], "DEBUG", "0", logging.DEBUG),
    (["--log-level", "error", "help"], "debug", "0", logging.ERROR),  # the option wins
])
def test_log_level_sets_tzruns_loggers(argv, env, rank, level, tzrun_logger, monkeypatch, capsys):
    monkeypatch.setenv("RANK", rank)
    if env is None:
        monkeypatch.delenv(cli.LOG_LEVEL_ENV, raising=False)
    else:
        monkeypatch.setenv(cli.LOG_LEVEL_ENV, env)
    monkeypatch.setitem(commands.COMMANDS, "check", lambda args: 0)
    assert cli.main(argv) == 0
    assert tzrun_logger.level == level


def test_an_unknown_log_level_in_the_environment_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv(cli.LOG_LEVEL_ENV, "loud")
    assert cli.main(["help"]) == EXIT_USAGE
    assert "TZRUN_LOG_LEVEL='loud': expected one of debug, info, warning, error" in capsys.readouterr().err


def test_nproc_per_node_passes_the_log_level_to_every_rank(monkeypatch):
    from tzrun.runner import launch

    started = {}
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(launch, "run_torchrun", lambda command, env, world: started.update(command=command) or 0)
    assert cli.main(["--log-level", "debug", "train", "x.toml", "--nproc-per-node", "2"]) == 0
    assert started["command"][-5:] == ["tzrun", "--log-level", "debug", "train", "x.toml"]


@pytest.mark.parametrize(("argv", "command"), [
    (["train", "a.toml"], "train"), (["--log-level", "debug", "evaluate", "a.toml"], "evaluate"),
    (["--log-level=info", "check", "a.toml"], "check"), (["--version"], None),
])
def test_the_command_is_found_after_global_options(argv, command):
    """``train`` and ``evaluate`` end with ``os._exit`` (see console_main): a global option
    before them must not hide them."""
    assert cli._command_of(argv) == command
