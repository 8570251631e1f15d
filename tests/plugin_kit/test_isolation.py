"""Failure isolation, duplicates and compatibility, from the outside: throwaway distributions on
``PYTHONPATH`` and the ``tzrec-run`` command in a fresh process, as a user meets them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugin_kit.dists import config_file, tzrun_cli, write_distribution
from tzrun.errors import EXIT_CONFIG

FINE_OPTIMIZER = """
    import attrs, tzrun

    @attrs.frozen
    class Config:
        lr: float

    def build(cfg, params):
        import torch
        return torch.optim.SGD(params, lr=cfg.lr)

    @tzrun.hookimpl
    def tzrun_register_dense_optimizers(register):
        register("{name}", config=Config, build=build)
"""


def optimizer_module(name: str) -> str:
    return FINE_OPTIMIZER.replace("{name}", name)


def uses(optimizer: str) -> list[str]:
    return ["--set", f'train.dense_optimizer={{type="{optimizer}", lr=0.1}}']


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    path = tmp_path / "site"
    path.mkdir()
    return path


def test_a_plugin_that_fails_to_import_is_named_and_the_others_work(site_dir, tmp_path):
    write_distribution(site_dir, "tzrun-flaky", "2.0", entry_points={"flaky": "flaky_mod"},
                       modules={"flaky_mod": "raise ImportError('needs libfoo')\n"})
    write_distribution(site_dir, "tzrun-sturdy", entry_points={"sturdy": "sturdy_mod"},
                       modules={"sturdy_mod": optimizer_module("sturdy_sgd")})
    config = str(config_file(tmp_path))

    proc = tzrun_cli(["check", config, *uses("sturdy_sgd")], site_dir)
    assert proc.returncode == 0, proc.stderr
    assert "plugin 'flaky' (from tzrun-flaky 2.0) failed to load: ImportError: needs libfoo" in proc.stderr
    assert "TZRUN_DISABLE_PLUGINS=flaky" in proc.stderr and "TZRUN_STRICT_PLUGINS=1" in proc.stderr

    listing = json.loads(tzrun_cli(["plugins", "--json"], site_dir).stdout)
    assert listing["failed"] == [{"name": "flaky", "distribution": "tzrun-flaky", "version": "2.0",
                                  "error": "ImportError: needs libfoo", "reason": "import"}]
    assert {"sturdy", "tzrun_plugins.optim"} <= {p["name"] for p in listing["plugins"]}

    strict = tzrun_cli(["check", config], site_dir, {"TZRUN_STRICT_PLUGINS": "1"})
    assert strict.returncode == EXIT_CONFIG
    assert "tzrec-run: plugin 'flaky' (from tzrun-flaky 2.0) failed to load: ImportError: needs libfoo" in strict.stderr
    assert "strict plugin mode is on" in strict.stderr
    assert "Traceback (most recent call last)" in strict.stderr and 'flaky_mod.py", line 1' in strict.stderr

    disabled = tzrun_cli(["check", config], site_dir, {"TZRUN_STRICT_PLUGINS": "1", "TZRUN_DISABLE_PLUGINS": "flaky"})
    assert disabled.returncode == 0 and disabled.stderr == "", disabled.stderr


def test_a_registration_hook_that_raises_is_named_and_the_rest_work(site_dir, tmp_path):
    write_distribution(site_dir, "tzrun-raiser", entry_points={"raiser": "raiser_mod"}, modules={"raiser_mod": optimizer_module("raiser_sgd") + """
    @tzrun.hookimpl
    def tzrun_register_metrics(register):
        register("half_done", config=Config, build=build)
        raise RuntimeError("boom")
    """})
    config = str(config_file(tmp_path))

    proc = tzrun_cli(["check", config], site_dir)
    assert proc.returncode == 0, proc.stderr  # every other plugin still works
    assert ("plugin 'raiser' (from tzrun-raiser 1.0) was disabled: its tzrun_register_metrics raised RuntimeError: boom; "
            "the other plugins are loaded") in proc.stderr
    for component in ('metrics=[{type="half_done", lr=1.0}]', 'train.dense_optimizer={type="raiser_sgd", lr=0.1}'):
        half = tzrun_cli(["check", config, "--set", component], site_dir)
        assert half.returncode == EXIT_CONFIG and "unknown " in half.stderr  # the whole plugin is disabled

    strict = tzrun_cli(["check", config], site_dir, {"TZRUN_STRICT_PLUGINS": "1"})
    assert strict.returncode == EXIT_CONFIG and "its tzrun_register_metrics raised RuntimeError: boom" in strict.stderr
    assert "Traceback (most recent call last)" in strict.stderr


def test_a_distribution_for_another_tzrec_run_version_is_rejected_without_being_imported(site_dir, tmp_path):
    marker = tmp_path / "imported"
    write_distribution(site_dir, "tzrun-future", "3.0", entry_points={"future": "future_mod"}, requires=["tzrec-run>=0.2"],
                       modules={"future_mod": f"open({str(marker)!r}, 'w').close()\n" + optimizer_module("future_sgd")})
    write_distribution(site_dir, "tzrun-current", "1.0", entry_points={"current": "current_mod"},
                       requires=["tzrec_run>=0.1,<0.2", 'tzrec-run>=9; extra == "docs"', "attrs"],
                       modules={"current_mod": optimizer_module("current_sgd")})
    config = str(config_file(tmp_path))

    proc = tzrun_cli(["check", config, *uses("current_sgd")], site_dir)
    assert proc.returncode == 0, proc.stderr  # a compatible range (and a requirement only under an extra) loads
    assert "plugin 'future' (from tzrun-future 3.0) was rejected: it supports tzrec-run>=0.2, and this is tzrec-run 0.1.0" in proc.stderr
    assert "install a version of tzrun-future made for tzrec-run 0.1.0, or uninstall it" in proc.stderr
    assert not marker.exists()
    rejected = tzrun_cli(["check", config, *uses("future_sgd")], site_dir)
    assert rejected.returncode == EXIT_CONFIG and "unknown dense optimizer 'future_sgd'" in rejected.stderr

    failed = json.loads(tzrun_cli(["plugins", "--json"], site_dir).stdout)["failed"]
    assert [(f["name"], f["reason"]) for f in failed] == [("future", "incompatible")]
    strict = tzrun_cli(["check", config], site_dir, {"TZRUN_STRICT_PLUGINS": "1"})
    assert strict.returncode == EXIT_CONFIG and "plugin 'future' (from tzrun-future 3.0) was rejected" in strict.stderr


@pytest.mark.parametrize(
    ("hook", "expected"),
    [
        ("def tzrun_register_optimizers(register):",
         "old_mod: unknown hook tzrun_register_optimizers (did you mean tzrun_register_"),
        ("def tzrun_register_metrics(register, registry):",
         "old_mod: wrong argument(s) 'registry' in tzrun_register_metrics: its hookspec takes register"),
    ],
    ids=["unknown_hook", "other_arguments"],
)
def test_a_plugin_for_another_hook_api_is_rejected_whole(site_dir, tmp_path, hook, expected):
    write_distribution(site_dir, "tzrun-old", "0.0.1", entry_points={"old": "old_mod"}, modules={"old_mod": optimizer_module("old_sgd") + f"""
    @tzrun.hookimpl
    {hook}
        pass
    """})
    config = str(config_file(tmp_path))
    proc = tzrun_cli(["check", config, *uses("old_sgd")], site_dir)
    assert proc.returncode == EXIT_CONFIG  # none of its hooks is used, not even the ones that match
    assert "unknown dense optimizer 'old_sgd'" in proc.stderr
    assert f"plugin 'old' (from tzrun-old 0.0.1) was rejected: {expected}" in proc.stderr
    assert tzrun_cli(["check", config], site_dir).returncode == 0  # the rest work
    strict = tzrun_cli(["check", config], site_dir, {"TZRUN_STRICT_PLUGINS": "1"})
    assert strict.returncode == EXIT_CONFIG and expected in strict.stderr


def test_a_lifecycle_hook_that_raises_is_named_disabled_and_training_goes_on(site_dir, tmp_path):
    from tzrun_tools.synth import synth_criteo
    from tzrun.testing import tiny_config_text

    write_distribution(site_dir, "tzrun-shaky-stage", entry_points={"shaky": "shaky_mod"}, modules={"shaky_mod": """
    import tzrun

    @tzrun.hookimpl
    def tzrun_after_train_step(run, step):
        if step.step == 2:
            raise RuntimeError("the dashboard is down")
    """})
    data = tmp_path / "data"
    synth_criteo(data, rows=4096, eval_rows=2048, seed=0, rows_per_file=4096, row_group_size=1024)
    config = tmp_path / "run.toml"
    config.write_text(tiny_config_text(data, tmp_path / "run"))

    proc = tzrun_cli(["train", str(config)], site_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("plugin 'shaky' (tzrun-shaky-stage 1.0) raised in tzrun_after_train_step: RuntimeError: the dashboard is down; "
            "it is disabled for the rest of this run") in proc.stderr
    assert "trained 4 steps" in proc.stdout

    strict = tzrun_cli(["train", str(config), "--set", f'model_dir="{tmp_path / "strict"}"'], site_dir,
                       {"TZRUN_STRICT_PLUGINS": "1"})
    assert strict.returncode != 0 and "RuntimeError: the dashboard is down" in strict.stderr
