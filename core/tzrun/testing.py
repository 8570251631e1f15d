"""Test helpers for tzrec-run and its plugin authors: an opt-in pytest plugin.

Enable it in a ``conftest.py`` with ``pytest_plugins = ["tzrun.testing"]``. It provides:

* the ``tzrun_pm`` fixture: a fresh plugin manager with the installed plugins loaded (never a
  shared one), and ``tzrun_pm_factory`` to make more with options;
* :func:`registered`: a context manager that registers a plugin on a manager for a block;
* :func:`load_config_text`: checks a TOML string through both passes, as ``tzrec-run check`` does;
* :func:`entry_points_of`: the ``tzrun`` entry points an installed distribution declares;
* :func:`check_component`: builds one of your components and runs the conformance checks
  ``tzrec-run check`` runs (an optimizer step, a metric's update/compute/merge, ...);
* :func:`assert_metric_rank_invariant`: a metric on N gloo ranks with the rows split equals
  its one-process value (:func:`metric_on_ranks` gives the N-rank value);
* warning filters for the deprecation notices raised inside torch, TorchRec and FBGEMM that a
  plugin author cannot act on (the same tzrec-run's own suite uses);
* :func:`run_tiny_training`: trains a tiny DeepFM for a few steps on synthetic data, with your
  component named in ``--set`` overrides, and returns the final evaluation: a smoke test of a
  plugin through the real training loop, in a fresh process (the default) or in this one.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import attrs
import pytest

from tzrun.config.load import load_config, parse_config
from tzrun.config.schema import RunConfig
from tzrun.kernel.plugins import ENTRY_POINT_GROUP, PluginManager, canonical_name, make_plugin_manager
from tzrun.kernel.registry import Registries, collect_registries
from tzrun.testing_checks import assert_metric_rank_invariant, check_component, metric_on_ranks

__all__ = [
    "WARNING_FILTERS",
    "pytest_configure",
    "check_component",
    "assert_metric_rank_invariant",
    "metric_on_ranks",
    "tzrun_pm",
    "tzrun_pm_factory",
    "registered",
    "load_config_text",
    "entry_points_of",
    "TINY_CONFIG",
    "TinyRun",
    "tiny_config_text",
    "run_tiny_training",
]


#: pytest ``filterwarnings`` lines for notices raised inside torch, TorchRec and FBGEMM that a
#: plugin author cannot act on; :func:`pytest_configure` adds them to every suite that enables
#: this plugin, so a plugin's ``pyproject.toml`` needs no copy.
WARNING_FILTERS = (
    "ignore::DeprecationWarning:torchrec.*",
    "ignore::FutureWarning:torchrec.*",
    "ignore::DeprecationWarning:fbgemm_gpu.*",
    "ignore::DeprecationWarning:torch.jit.*",
    "ignore::FutureWarning:torch.distributed.checkpoint.*",
    "ignore:.*dense_embedding_codegen_lookup_function:UserWarning",
    "ignore:Please use DTensor instead:FutureWarning",
)


def pytest_configure(config: pytest.Config) -> None:
    """Add :data:`WARNING_FILTERS` to the ``filterwarnings`` of the suite that enables this
    plugin (a test's own ``@pytest.mark.filterwarnings`` still takes precedence)."""
    for line in WARNING_FILTERS:
        config.addinivalue_line("filterwarnings", line)


@pytest.fixture
def tzrun_pm_factory() -> Callable[..., PluginManager]:
    """Make fresh plugin managers: ``tzrun_pm_factory(disable=..., plugins=..., strict=...,
    distributions=...)`` (the keyword arguments of :func:`tzrun.kernel.plugins.make_plugin_manager`)."""
    return make_plugin_manager


@pytest.fixture
def tzrun_pm() -> PluginManager:
    """A fresh plugin manager with the installed ``tzrun`` entry points loaded."""
    return make_plugin_manager()


@contextlib.contextmanager
def registered(pm: PluginManager, plugin: object, name: str | None = None) -> Iterator[str]:
    """Register ``plugin`` on ``pm`` for the ``with`` block; yields its plugin name."""
    plugin_name = pm.register(plugin, name=name)
    assert plugin_name is not None, f"plugin {name or plugin!r} is blocked"
    try:
        yield plugin_name
    finally:
        if pm.is_registered(plugin):  # a broken plugin is already disabled
            pm.unregister(plugin)


def load_config_text(
    text: str, pm: PluginManager | None = None, overrides: Iterable[str] = ()
) -> tuple[RunConfig, Registries]:
    """Check a TOML string through both passes against ``pm``'s components.

    Returns:
        The config and the registries it was checked against.

    Raises:
        ConfigError: with every problem, as ``tzrec-run check`` reports them.
    """
    pm = pm if pm is not None else make_plugin_manager()
    registries = collect_registries(pm)
    raw = parse_config(text, "<string>", overrides)
    return load_config(raw, registries), registries


def entry_points_of(distribution: str) -> list[importlib.metadata.EntryPoint]:
    """The ``tzrun`` entry points that ``distribution`` declares, as installed (empty when it
    is not installed): what tzrec-run will load, e.g. to assert that ``pip install -e .``
    registered yours."""
    wanted = canonical_name(distribution)
    return [
        ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None and canonical_name(ep.dist.metadata["Name"]) == wanted
    ]


#: The config :func:`run_tiny_training` starts from: DeepFM over one dense and three id
#: features of ``tzrun_tools.synth.synth_criteo`` data, 4 steps of 256 rows, then an
#: evaluation with ``auc``. ``cat_5`` (24 ids) and ``cat_8`` (3 ids) make good group keys.
TINY_CONFIG = """\
model_dir = "{model_dir}"

[data]
train_input = "{data_dir}/train"
eval_input = "{data_dir}/eval"
batch_size = 256
num_workers = 0
labels = ["label"]

[model]
type = "deepfm"
deep_hidden_units = [16, 8]
final_hidden_units = [8]
wide_embedding_dim = 4

[[losses]]
type = "binary_cross_entropy"

[[metrics]]
type = "auc"

[train]
num_steps = 4
seed = 3
stages = []
sparse_optimizer = {{ type = "sgd", lr = 0.1 }}
dense_optimizer = {{ type = "sgd", lr = 0.1 }}

[[features.dense]]
name = "int_0"
log1p = true

[[features.sparse]]
name = "cat_0"
num_buckets = 1000
embedding_dim = 8

[[features.sparse]]
name = "cat_5"
num_buckets = 24
embedding_dim = 8

[[features.sparse]]
name = "cat_8"
num_buckets = 3
embedding_dim = 8
"""


def tiny_config_text(data_dir: str | os.PathLike[str], model_dir: str | os.PathLike[str]) -> str:
    """:data:`TINY_CONFIG` pointed at ``data_dir`` (made by ``synth_criteo``) and ``model_dir``."""
    return TINY_CONFIG.format(data_dir=Path(data_dir).as_posix(), model_dir=Path(model_dir).as_posix())


@attrs.frozen
class TinyRun:
    """What :func:`run_tiny_training` returns.

    Attributes:
        model_dir: where the run wrote its checkpoints and ``eval_results.jsonl``.
        steps: the global step of the final evaluation.
        metrics: the final evaluation's values by name (metrics and ``loss/<name>``).
        plugins: the plugin set the last checkpoint recorded: one dict per plugin with its
            ``name``, ``distribution``, ``version``, ``hooks`` and ``components``.
        stdout, stderr: the training process's output (empty in process).
        model: the trained (sharded) model, in process only.
    """

    model_dir: Path
    steps: int
    metrics: Mapping[str, float]
    plugins: tuple[Mapping[str, Any], ...]
    stdout: str = ""
    stderr: str = ""
    model: Any = attrs.field(default=None, repr=False)

    def plugin(self, name: str) -> Mapping[str, Any]:
        """The recorded plugin called ``name`` (an entry-point name); KeyError if it was not loaded."""
        for info in self.plugins:
            if info["name"] == name:
                return info
        raise KeyError(f"plugin '{name}' is not in the run's plugin set: {[i['name'] for i in self.plugins]}")


def run_tiny_training(
    tmp_path: str | os.PathLike[str],
    *,
    overrides: Sequence[str] = (),
    plugins: Sequence[object | tuple[str, object]] = (),
    in_process: bool = False,
    data_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> TinyRun:
    """Train :data:`TINY_CONFIG` with ``overrides`` and return the final evaluation.

    Name your component in ``overrides`` (``tzrec-run train --set`` syntax), e.g.
    ``['train.dense_optimizer={type="lion", lr=0.001}']`` or
    ``['metrics=[{type="ndcg_at_k", k=5, group_by="cat_5"}]']``.

    By default the run is ``python -m tzrun train`` in a fresh process: exactly what a user
    runs, with the plugins found through the installed ``tzrun`` entry points (install your
    distribution first, e.g. ``pip install -e .``), and a process whose global state (the
    ``torch.distributed`` group, TorchRec's and FBGEMM's caches, the RNG seeds) is its own. It
    costs about 5 s, most of it importing torch and TorchRec.

    With ``in_process=True`` the run happens in the test process: faster (no second import of
    torch) and able to take plugin objects that are not installed (``plugins=``), and
    :attr:`TinyRun.model` is the trained model; but it creates (and then destroys) the default
    process group unless one exists, seeds the global RNGs, and leaves TorchRec's module-level
    state behind, so keep such tests away from tests that rely on those.

    Args:
        tmp_path: a fresh directory for the data (unless ``data_dir``) and the model dir.
        overrides: ``KEY=<TOML literal>`` overrides of the tiny config.
        plugins: plugin objects (or ``(name, object)`` pairs) to register besides the installed
            ones; in process only.
        in_process: train in this process instead of a fresh one.
        data_dir: a directory ``synth_criteo`` already wrote (to share data between runs);
            default: generate 4,096 train and 2,048 eval rows (seed 0) under ``tmp_path``.
        env: extra environment variables for the training process (e.g. ``PYTHONPATH``,
            ``TZRUN_STRICT_PLUGINS``); not with ``in_process``.
        timeout: seconds before the training process is killed.

    Returns:
        The run's final evaluation and recorded plugin set.

    Raises:
        AssertionError: when the training fails (with its output), so that a test shows why.
        ValueError: for ``plugins`` without ``in_process``, or ``env`` with it.
    """
    tmp = Path(tmp_path)
    if plugins and not in_process:
        raise ValueError("plugins= needs in_process=True: a fresh process only sees installed plugins")
    if env and in_process:
        raise ValueError("env= applies to the training process; with in_process=True set os.environ yourself")
    if data_dir is None:
        from tzrun_tools.synth import synth_criteo

        data_dir = tmp / "tiny_data"
        if not (data_dir / "synth.json").exists():
            synth_criteo(data_dir, rows=4096, eval_rows=2048, seed=0, rows_per_file=4096, row_group_size=1024)
    model_dir = tmp / "tiny_run"
    text = tiny_config_text(data_dir, model_dir)
    if in_process:
        return _train_in_process(text, model_dir, list(overrides), plugins)
    config = tmp / "tiny.toml"
    config.write_text(text, encoding="utf-8")
    command = [sys.executable, "-m", "tzrun", "train", str(config), "--overwrite"]
    for override in overrides:
        command += ["--set", override]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=tmp
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"tiny training failed (exit {proc.returncode}): {' '.join(command)}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
        )
    lines = (model_dir / "eval_results.jsonl").read_text(encoding="utf-8").splitlines()
    final = json.loads(lines[-1])
    step = int(final.pop("step"))
    final.pop("rows", None)
    return TinyRun(model_dir, step, final, _recorded_plugins(model_dir, step), proc.stdout, proc.stderr)


def _train_in_process(text: str, model_dir: Path, overrides: list[str], plugins: Sequence[Any]) -> TinyRun:
    import torch.distributed as dist

    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.session import Session
    from tzrun.runner.trainer import train

    session = Session.from_raw(parse_config(text, "<tiny>", overrides), plugins)
    created = not dist.is_initialized()
    try:
        result = train(session, overwrite=True)
    finally:
        if created:
            shutdown_distributed()
    assert result.eval is not None, "the tiny config evaluates; was data.eval_input overridden?"
    return TinyRun(
        model_dir, result.eval.step, dict(result.eval.metrics), _recorded_plugins(model_dir, result.steps), model=result.model
    )


def _recorded_plugins(model_dir: Path, step: int) -> tuple[Mapping[str, Any], ...]:
    meta = model_dir / "checkpoints" / f"step-{step}" / "meta.json"
    if not meta.exists():
        return ()
    return tuple(json.loads(meta.read_text(encoding="utf-8")).get("plugins", ()))
