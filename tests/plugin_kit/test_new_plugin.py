"""The docs' walkthrough (docs/howto/write_a_plugin.md), followed literally: ``tzrec-run
new-plugin`` writes a distribution; installed (as dist-info on ``PYTHONPATH``), its generated
tests pass and ``tzrec-run plugins`` lists it. ``mypy --strict`` accepts it in the suite's one
mypy run (test_typing.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_kit.dists import generate_plugin, tzrun_cli


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return generate_plugin(tmp_path_factory.mktemp("new_plugin"))


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
