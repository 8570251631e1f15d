"""No step waits for the device: between two train logs, tzrec-run's own code never calls what
makes the host wait for a CUDA device (``Tensor.item``, ``bool()``, ``float()``, ``int()``,
``tolist()``, ``numpy()``, ``cpu()``) on the training thread. On CPU nothing waits, so the test
counts the calls themselves, made from a frame of ``tzrun`` or ``tzrun_plugins``.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

import tzrun
import tzrun_plugins
from tests.integration.test_update_path import CONFIG, _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.trainer import train
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

SYNCING = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu")
OURS = tuple(str(Path(m.__file__).parent) for m in (tzrun, tzrun_plugins))
#: The stop-signal agreement reads a CPU tensor of its own gloo group: on CUDA too it is no device sync.
HOST_ONLY = (str(Path(tzrun.__file__).parent / "runner" / "signals.py"),)
LOG_EVERY = 5
STEPS = 12  # one segment: its end (the checkpoint boundary) may sync, like a train log


class SyncCounter:
    """Counts syncing calls per phase: ``step`` (between two train logs) or ``log``."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.calls: list[tuple[int, str, str]] = []
        self.step = 0

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        self.step = step.step
        if 2 <= step.step < STEPS:  # the first step traces the model and fills the pipeline
            self.phase = "log" if step.step % LOG_EVERY == 0 else "step"
        else:
            self.phase = None

    @tzrun.hookimpl
    def tzrun_after_train_log(self, run, log):
        self.phase = "step"

    @tzrun.hookimpl
    def tzrun_after_train(self, run, step):
        self.phase = None

    def counting(self, name, original):
        main = threading.main_thread()

        def call(tensor, *args, **kwargs):
            if self.phase == "step" and threading.current_thread() is main:
                caller = sys._getframe(1)
                where = caller.f_code.co_filename
                if where.startswith(OURS) and not where.startswith(HOST_ONLY):
                    self.calls.append((self.step, name, f"{where}:{caller.f_lineno}"))
            return original(tensor, *args, **kwargs)

        return call


@pytest.mark.parametrize("options", [
    (),
    ("train.gradient_accumulation_steps=2", 'train.grad_clipping={by = "norm", max_gradient = 1.0}',
     "train.dense_optimizer.ema={decay = 0.9}"),
], ids=["defaults", "accumulation-clipping-ema"])
def test_no_step_between_two_train_logs_syncs_with_the_device(tmp_path, criteo_dir, monkeypatch, options):
    counter = SyncCounter()
    for name in SYNCING:
        monkeypatch.setattr(torch.Tensor, name, counter.counting(name, getattr(torch.Tensor, name)))
    pm = make_plugin_manager(plugins=[("syncs", counter)])
    registries = collect_registries(pm)
    raw = parse_config(CONFIG.format(model_dir=tmp_path / "run", train=criteo_dir / "train"), "<test>", [
        f"train.num_steps={STEPS}", "train.save_checkpoints_steps=0", f"train.log_every_n_steps={LOG_EVERY}",
        'train.stages=[{type = "progress"}, {type = "metrics_log"}]', 'train.pipeline={type = "sparse_dist"}',
        *options,
    ])
    result = train(Session(load_config(raw, registries), raw, pm, registries))
    assert result.steps == STEPS and counter.step == STEPS
    assert counter.calls == []
