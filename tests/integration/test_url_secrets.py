"""A password written into a URL (``scheme://user:password@host/...``) is shown and recorded
nowhere: not in an error, a log line, nor any file a run writes into its model dir (the run
records, a checkpoint's ``meta.json`` and DCP's ``.metadata``, the run lock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli, EXAMPLE
from tests.integration.test_update_path import CONFIG, _process_group  # noqa: F401
from tzrun.io.storage import redact_url
from tzrun.runner.session import Session

SECRET = "hunter2pw"
ROOT = f"memory://analyst:{SECRET}@store"


def test_check_names_a_data_url_without_its_password() -> None:
    proc = cli(["check", str(EXAMPLE), "--require-data", "--set", f'data.train_input="{ROOT}/missing/train"'])
    assert proc.returncode != 0
    assert "memory://analyst:***@store/missing/train: data.train_input does not exist" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


def test_a_log_line_and_its_exception_show_no_password() -> None:
    code = (
        "import logging; from tzrun.cli.logs import setup_logging; setup_logging(); log = logging.getLogger('tzrun.x'); "
        f"log.warning('model_dir %s', '{ROOT}/run')\n"
        f"try:\n    raise OSError('cannot reach {ROOT}/run')\nexcept OSError:\n    log.exception('failed')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "model_dir memory://analyst:***@store/run" in proc.stderr
    assert "OSError: cannot reach memory://analyst:***@store/run" in proc.stderr
    assert SECRET not in proc.stderr


@pytest.mark.slow
def test_a_run_with_a_password_in_its_urls_records_none(criteo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    from tzrun.config.load import load_config, parse_config
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries
    from tzrun.runner.trainer import train

    fs = fsspec.filesystem("memory")
    root = f"{ROOT}/{os.getpid()}"
    for name in os.listdir(criteo_dir / "train"):
        fs.put(str(criteo_dir / "train" / name), f"{root}/data/{name}".split("://", 1)[1])
    model_dir = f"{root}/run"
    monkeypatch.setattr(sys, "argv", ["tzrec-run", "train", "run.toml", "--model-dir", model_dir])  # env.json, run.lock
    registries = collect_registries(make_plugin_manager())
    raw = parse_config(CONFIG.format(model_dir=model_dir, train=f"{root}/data"), "run.toml",
                       ["train.num_steps=2", "train.save_checkpoints_steps=2"])
    result = train(Session(load_config(raw, registries), raw, make_plugin_manager(), registries))
    assert result.steps == 2
    written = fs.find(model_dir.split("://", 1)[1])
    assert any(key.endswith("/env.json") for key in written) and any(key.endswith("/.metadata") for key in written)
    leaks = [key.rsplit("/run/", 1)[1] for key in written if SECRET.encode() in fs.cat(key)]
    assert not leaks, f"the password is written into {leaks}"
    fs.rm(root.split("://", 1)[1], recursive=True)


def test_a_recorded_config_still_matches_the_config_whose_password_it_left_out() -> None:
    from tzrun.runner.records import config_differences

    now = {"model": {"type": "deepfm"}, "features": {"sparse": [{"name": "c", "vocab_file": f"{ROOT}/vocab.txt"}]}}
    saved = json.loads(redact_url(json.dumps(now)))  # as resolved_config.json and meta.json hold it
    assert SECRET not in json.dumps(saved)
    assert config_differences(saved, now) == []
