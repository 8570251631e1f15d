"""The docs' walkthrough (docs/howto/write_a_plugin.md), followed literally: ``tzrec-run
new-plugin`` writes a distribution; installed (as dist-info on ``PYTHONPATH``), its generated
tests pass, ``tzrec-run plugins`` lists it, and ``mypy --strict`` accepts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_kit.dists import tzrun_cli, write_distribution

KINDS = "dense_optimizer,lr_scheduler,loss,metric,stage"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("new_plugin")
    proc = tzrun_cli(["new-plugin", "tzrun-walkthrough", "--kind", KINDS, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    root = out / "tzrun-walkthrough"
    site = out / "site"
    site.mkdir()
    # what `pip install -e .` leaves behind: the distribution's metadata and its entry point
    write_distribution(site, "tzrun-walkthrough", "0.1.0", entry_points={"tzrun_walkthrough": "tzrun_walkthrough.hooks"},
                       requires=["tzrec-run>=0.1,<0.2"])
    (site / "tzrun_walkthrough").symlink_to(root / "src" / "tzrun_walkthrough", target_is_directory=True)
    return root, site


def _env(site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TZRUN_STRICT_PLUGINS", "TZRUN_DISABLE_PLUGINS")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def test_the_generated_plugin_is_listed_and_its_tests_pass(generated):
    root, site = generated
    listing = tzrun_cli(["plugins", "--strict"], site)
    assert listing.returncode == 0, listing.stderr
    assert "tzrun_walkthrough  (tzrun-walkthrough 0.1.0)" in listing.stdout
    for component in ("walkthrough_sgd", "walkthrough_warmup", "walkthrough_bce", "walkthrough_label_mean", "walkthrough_log"):
        assert f"    {component} (" in listing.stdout
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=root, env=_env(site),
                           capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert "7 passed" in tests.stdout
    assert "warning" not in tests.stdout.lower()  # tzrun.testing filters what an author cannot act on


def test_mypy_strict_accepts_the_generated_plugin(generated):
    root, site = generated
    env = {**_env(site), "MYPYPATH": str(root / "src")}
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(root.parent / ".mypy_cache"),
                           "src", "tests"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_mypy_strict_refuses_a_misspelled_register_keyword(generated):
    root, site = generated
    bad = root.parent / "bad_hooks.py"
    bad.write_text(
        "import attrs\nimport tzrun\n\n\n@attrs.frozen\nclass C:\n    k: int = 1\n\n\n"
        "@tzrun.hookimpl\ndef tzrun_register_metrics(register: tzrun.RegisterMetrics) -> None:\n"
        '    register("x", config=C, build=lambda cfg: None, predictions="probs")\n'
    )
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(root.parent / ".mypy_cache"), str(bad)],
                          cwd=root, env=_env(site), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and 'Unexpected keyword argument "predictions"' in proc.stdout, proc.stdout
