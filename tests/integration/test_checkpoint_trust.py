"""A checkpoint is data: loading never runs code from it. A crafted checkpoint, whose manifest
and marker the attacker recomputed (they prove integrity, not authenticity), is refused by
``evaluate``, ``train --resume``, ``train --init-from`` and ``ckpt inspect`` with one line
naming the file (exit 66), and the code it carries never runs."""

from __future__ import annotations

import io
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import tzrun
from tests.conftest import cli
from tests.integration.test_update_path import CONFIG, _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.errors import EXIT_CHECKPOINT, CheckpointError, PluginError, exit_code_of
from tzrun.io.files import write_atomic
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.manifest import describe_files, listed_files, manifest_bytes, marker_bytes, marker_state
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow


class _RunsCode:
    """Unpickled, it creates the file ``marker``: what a crafted checkpoint would do, less harmfully."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def _config(model_dir: Path, criteo_dir: Path, *overrides: str):
    registries = collect_registries(make_plugin_manager())
    raw = parse_config(CONFIG.format(model_dir=model_dir, train=criteo_dir / "train"), "run.toml",
                       [f'data.eval_input="{criteo_dir / "eval"}"', "train.num_steps=2", *overrides])
    return load_config(raw, registries), raw, registries


def _train(model_dir: Path, criteo_dir: Path, *overrides: str, plugins=(), **options):
    from tzrun.runner.trainer import train

    cfg, raw, registries = _config(model_dir, criteo_dir, *overrides)
    return train(Session(cfg, raw, make_plugin_manager(plugins=list(plugins)), registries), **options)


@pytest.fixture(scope="module")
def source(tmp_path_factory, criteo_dir):
    """One run of 2 steps: its checkpoint is ``step-2``."""
    model_dir = tmp_path_factory.mktemp("trust") / "run"
    _train(model_dir, criteo_dir)
    return model_dir


def _reseal(path: Path) -> None:
    """Recompute the manifest and the marker, as anyone who can write the directory can."""
    manifest = manifest_bytes(2, describe_files(path, listed_files(path)))
    write_atomic(path / "manifest.json", manifest)
    write_atomic(path / "COMPLETE", marker_bytes(2, manifest))


def _craft(source: Path, model_dir: Path, layer: str, marker: Path) -> Path:
    """A copy of ``source`` whose checkpoint runs code when loaded the trusting way: in DCP's
    ``.metadata`` (read with ``pickle.load``), in the stored value of the ``update`` entry
    (read by DCP's planner with ``torch.load(weights_only=False)``), or inside that value
    (the entry's own bytes, read by the trainer)."""
    shutil.copytree(source, model_dir)
    state = model_dir / "checkpoints" / "step-2" / "state"
    with open(state / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # our own, unmodified file
    if layer == "metadata":
        metadata.planner_data = _RunsCode(marker)
    else:
        payload = _RunsCode(marker)
        if layer == "entry":
            inner = io.BytesIO()
            torch.save(payload, inner)
            payload = inner.getvalue()
        value = io.BytesIO()
        torch.save(payload, value)
        key = next(k for k in metadata.storage_data if k.fqn.startswith("update."))
        info = metadata.storage_data[key]
        data = state / info.relative_path
        info.offset, info.length = data.stat().st_size, len(value.getvalue())
        with open(data, "ab") as f:  # appended: the other items keep their offsets
            f.write(value.getvalue())
    with open(state / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    _reseal(state.parent)
    return state.parent


def _assert_refused(error: pytest.ExceptionInfo, names: str, marker: Path) -> None:
    assert not marker.exists(), "the checkpoint's code ran"
    message = str(error.value)
    assert "\n" not in message and names in message and "refused" in message, message
    assert exit_code_of(error.value) == EXIT_CHECKPOINT


@pytest.mark.parametrize("layer", ["metadata", "value", "entry"])
def test_a_crafted_checkpoint_is_refused_by_evaluate_and_resume(source, criteo_dir, tmp_path, layer):
    from tzrun.runner.checkpoint_eval import evaluate_checkpoint

    marker = tmp_path / "ran"
    path = _craft(source, tmp_path / "run", layer, marker)
    names = str(path / "state" / ".metadata") if layer == "metadata" else f"{path / 'state'} entry 'update"
    cfg, raw, registries = _config(tmp_path / "run", criteo_dir)
    with pytest.raises(CheckpointError) as refused:
        evaluate_checkpoint(Session(cfg, raw, make_plugin_manager(), registries), "latest")
    _assert_refused(refused, names, marker)
    with pytest.raises(CheckpointError) as refused:
        _train(tmp_path / "run", criteo_dir, "train.num_steps=4", resume=True)
    _assert_refused(refused, names, marker)


def test_a_crafted_checkpoint_is_refused_by_init_from_inspect_and_the_cli(source, criteo_dir, tmp_path):
    from tzrun.runner.init_from import InitFrom

    marker = tmp_path / "ran"
    path = _craft(source, tmp_path / "crafted", "metadata", marker)
    with pytest.raises(CheckpointError) as refused:
        _train(tmp_path / "tuned", criteo_dir, init_from=InitFrom(str(path)))
    _assert_refused(refused, str(path / "state" / ".metadata"), marker)

    inspected = cli(["ckpt", "inspect", str(path)])
    assert not marker.exists() and inspected.returncode == EXIT_CHECKPOINT, inspected.stdout + inspected.stderr
    assert inspected.stderr.count("\n") == 1 and f"{path / 'state' / '.metadata'}: refused: it names builtins.exec" \
        in inspected.stderr, inspected.stderr
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(model_dir=tmp_path / "crafted", train=criteo_dir / "train"))
    eval_input = f'data.eval_input="{criteo_dir / "eval"}"'
    evaluated = cli(["evaluate", str(config), "--set", eval_input, "--checkpoint", str(path)])
    assert not marker.exists() and evaluated.returncode == EXIT_CHECKPOINT, evaluated.stderr[-3000:]
    errors = [line for line in evaluated.stderr.splitlines() if line.startswith("tzrec-run: ")]
    assert len(errors) == 1 and "refused: it names builtins.exec" in errors[0], evaluated.stderr[-3000:]


def test_inspect_shows_what_state_holds(source):
    shown = cli(["ckpt", "inspect", str(source / "checkpoints" / "step-2")])
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"\ncontents    \d+ tensors, 6 values: loop, model, rank\.\*, schedules, stages, train_metrics, "
                     r"update\n", shown.stdout), shown.stdout  # the values: each entry of tzrec-run's own


class _KeepsANumpyScalar:
    @tzrun.hookimpl
    def tzrun_before_checkpoint_save(self, run, step, state):
        state["keeper"] = {"best": np.float64(0.5)}


def test_a_stage_state_a_checkpoint_cannot_hold_is_named_when_saving(criteo_dir, tmp_path):
    with pytest.raises(PluginError, match=r"^stage 'keeper': its checkpoint state holds a numpy\.float64 at "
                                          r"state\['best'\]; a stage's state_dict\(\)"):
        _train(tmp_path / "run", criteo_dir, plugins=[("keeper", _KeepsANumpyScalar())])


def test_what_a_checkpoint_entry_may_hold():
    from tzrun.runner.checkpoint_blobs import unsaveable
    from tzrun.runner.session import rng_state

    admitted = {"rng": rng_state(), 3: [1, 2.5, "a", None, True, b"b", torch.ones(2), (torch.Size([2]), torch.int8)]}
    assert unsaveable(admitted) is None
    saved = io.BytesIO()
    torch.save(admitted, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)  # what unsaveable admits loads back as data
    assert loaded[3][:6] == admitted[3][:6] and loaded[3][7] == admitted[3][7] and torch.equal(loaded[3][6], torch.ones(2))
    assert loaded["rng"]["python"] == admitted["rng"]["python"]
    assert unsaveable({"a": [0, {"b": np.ones(2)}]}) == "a numpy.ndarray at state['a'][1]['b']"
    assert unsaveable({"f": print}, "stages") == "a builtin_function_or_method at stages['f']"
    assert unsaveable({(1, 2): 3}) == "a tuple key in state"


def test_the_rng_states_saved_as_plain_data_restore_every_stream_exactly():
    import random

    from tzrun.runner.session import rng_state, set_rng_state

    np.random.normal()  # numpy's state then holds a cached gaussian too
    saved = io.BytesIO()
    torch.save(rng_state(), saved)
    draws = (random.random(), np.random.normal(), np.random.random(), torch.rand(1).item())
    saved.seek(0)
    set_rng_state(torch.load(saved, weights_only=True))
    assert (random.random(), np.random.normal(), np.random.random(), torch.rand(1).item()) == draws


def test_the_metadata_allow_list_names_what_torch_has():
    import importlib

    from tzrun.runner.dcp_metadata import METADATA_CLASSES

    for module, names in METADATA_CLASSES.items():
        for name in names:
            assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_a_marker_written_before_manifests_is_not_a_complete_checkpoint(tmp_path):
    (tmp_path / "COMPLETE").write_text("step 8\n")  # what a pre-release tzrec-run wrote
    state, reason = marker_state(tmp_path)
    assert state == "incomplete" and "written by a pre-release tzrec-run before checkpoints had manifests" in reason
