"""Shared fixtures: tzrun's own pytest plugin, a small synthetic Criteo set, the run helpers
(``run_cli`` in a child process, ``cli`` in this one)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import Iterator

import pytest

# tests.s3_server: the loopback S3 server fixtures of the remote-storage tests
pytest_plugins = ["tzrun.testing", "tests.s3_server"]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "deepfm_criteo.toml"


#: seconds per test file in a recent run (scripts/test_durations.py writes it from the junit XML)
DURATIONS = REPO / "tests" / "durations.json"
#: a file the durations do not list yet counts as this heavy (it may launch ranks)
NEW_FILE_SECONDS = 30.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heaviest files first, so that pytest-xdist's workers (``--dist loadfile
    --no-loadscope-reorder``, scripts/test.sh) end together instead of one of them running a
    minute-long file alone at the end; within a file, the order is kept."""
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}

    def weight(item: pytest.Item) -> float:
        try:
            path = item.path.resolve().relative_to(REPO).as_posix()
        except ValueError:
            return 0.0
        return seconds.get(path, NEW_FILE_SECONDS)

    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-weight(item), str(item.path), order[id(item)]))


@pytest.fixture(scope="session")
def criteo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic Criteo-like dataset (shared by the whole session; read-only)."""
    from tzrun_tools.synth import synth_criteo

    out = tmp_path_factory.mktemp("criteo")
    synth_criteo(out, rows=12_000, eval_rows=3_001, seed=7, rows_per_file=5_000, row_group_size=2_000)
    return out


def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this test session shared by all of pytest-xdist's workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository's wheel (``pip wheel --no-deps --no-build-isolation``), built once per
    test session: the first test that asks builds it, under a file lock that the others wait on."""
    import fcntl

    shared = session_dir(tmp_path_factory)
    dist = shared / "wheel"
    with open(shared / "wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheels = sorted(dist.glob("tzrec_run-*.whl"))
        if not wheels:
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                                    "-w", str(dist), str(REPO)], capture_output=True, text=True, timeout=600)
            assert built.returncode == 0, built.stderr
            wheels = sorted(dist.glob("tzrec_run-*.whl"))
        assert len(wheels) == 1, wheels
        return wheels[0]


def example_overrides(criteo_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    """``--set`` overrides that point the DeepFM example at ``criteo_dir`` with small steps."""
    return [
        f'data.train_input="{criteo_dir / "train"}"',
        f'data.eval_input="{criteo_dir / "eval"}"',
        f'model_dir="{model_dir}"',
        "data.batch_size=1024",
        "data.eval_batch_size=1024",
        "data.num_workers=0",
        "model.deep_hidden_units=[32, 16]",
        "model.final_hidden_units=[16]",
        "train.log_every_n_steps=4",
        *extra,
    ]


def run_cli(args: list[str], *, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tzrun ARGS`` and return the finished process (output captured)."""
    # a native crash prints the Python stacks of every thread (shown by the failing assertion)
    full_env = {**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tzrun", *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO
    )


def cli(args: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``tzrec-run ARGS`` in this process, through the CLI's entry function, and return
    what ``run_cli`` would: the exit code, standard output and standard error (log lines
    included, formatted as rank 0's). For the tests where a child process adds nothing: the
    CLI's parsing, errors and exit codes are the same; what differs is only the interpreter's
    start (about 6 s of imports here). Tests of signals, launchers, ``os._exit`` paths, import
    isolation and several ranks use ``run_cli``."""
    from tzrun.cli.main import main
    from tzrun.errors import exit_code_of

    out, err = io.StringIO(), io.StringIO()
    with _environment(env), _on_path(*(env or {}).get("PYTHONPATH", "").split(os.pathsep)), _logging_to(err), contextlib.chdir(REPO), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _warnings_printed():
        try:
            code = main(args)
        except SystemExit as error:  # argparse: --help, --version, usage errors
            code = error.code if isinstance(error.code, int) else 0 if error.code is None else 1
            if isinstance(error.code, str):
                print(error.code, file=sys.stderr)
        except Exception as error:  # noqa: BLE001 - as console_main: the traceback, then the exit code
            traceback.print_exc()
            code = exit_code_of(error)
    return subprocess.CompletedProcess(["tzrec-run", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _environment(env: dict[str, str] | None) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _on_path(*directories: str | Path) -> Iterator[None]:
    """``directories`` first on ``sys.path`` (as ``PYTHONPATH`` puts them in a child process:
    the distributions there are installed, entry points included), and what was imported from
    them forgotten afterwards, since the next test's throwaway plugins may reuse module names."""
    added = [str(d) for d in directories if d and str(d) not in sys.path]
    sys.path[:0] = added
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for directory in added:
            sys.path.remove(directory)
            for name, module in list(sys.modules.items()):
                if str(getattr(module, "__file__", None) or "").startswith(directory + os.sep):
                    del sys.modules[name]
        importlib.invalidate_caches()


@contextlib.contextmanager
def _warnings_printed() -> Iterator[None]:
    """Warnings printed to standard error under Python's default filters, as in a process of
    its own (pytest records them instead)."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.showwarning = _print_warning
        yield


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _logging_to(stream: io.StringIO) -> Iterator[None]:
    """The CLI's log lines into ``stream`` (under pytest the root logger already has handlers,
    so the CLI's ``logging.basicConfig`` adds none); the loggers' levels are restored after."""
    from tzrun.runner.log_file import DATE_FORMAT, log_format, redact_record

    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(log_format(0), DATE_FORMAT))
    handler.addFilter(redact_record)
    root = logging.getLogger()
    names = ["tzrun", "torchrec.distributed.planner", "torchrec.distributed.train_pipeline",
             "torchrec.distributed.utils", "torchrec.distributed.model_parallel"]
    levels = {name: logging.getLogger(name).level for name in names}
    root_level = root.level
    root.setLevel(logging.WARNING)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(root_level)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
