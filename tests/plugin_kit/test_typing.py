"""Plugins type-check against tzrun's public API (``py.typed``): ``mypy --strict`` passes on the
first-party plugins (``plugins/tzrun_plugins``, ``plugins/tzrun_serving``), ``contrib_optimizers`` and
``contrib_metrics``, on a plugin made from the template (``tzrec-run new-plugin``, as the docs'
walkthrough makes it: test_new_plugin.py), and on the typed registration that
``docs/plugin_authors.md`` shows (a stage with ``check=`` and ``outputs=``, a loss weighting with
``check=``), while a wrong keyword there, or in a metric's registration, is an error.

One mypy run (cache in a temporary directory) checks all of it, under the repository's mypy
configuration, which the template's equals (a test says so); the tests read its report.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugin_kit.dists import generate_plugin
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries

REPO = Path(__file__).resolve().parents[2]
CHECKED = ["plugins/tzrun_plugins", "plugins/tzrun_serving", "contrib_optimizers/src", "contrib_metrics/src"]
_BLOCK = re.compile(r"<!-- typed-registration -->\n```python\n(?P<code>.*?)^```", re.M | re.S)


def documented_registration() -> str:
    """The typed registration example of ``docs/plugin_authors.md``."""
    found = _BLOCK.search((REPO / "docs" / "plugin_authors.md").read_text())
    assert found, "docs/plugin_authors.md lost its <!-- typed-registration --> python block"
    return found["code"]


@pytest.fixture(scope="module")
def snippets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("typed")
    good = documented_registration()
    assert "outputs=slack_outputs" in good and "check=check_fixed" in good
    paths = {"good": root / "doc_registration.py", "bad": root / "doc_registration_typo.py"}
    paths["good"].write_text(good)
    paths["bad"].write_text(good.replace("outputs=slack_outputs", "output=slack_outputs"))
    return paths


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """A plugin made by ``tzrec-run new-plugin`` (the walkthrough's kinds), and beside it a
    module that misspells a keyword of a metric's registration."""
    root, _ = generate_plugin(tmp_path_factory.mktemp("new_plugin"))
    (root / "bad_hooks.py").write_text(
        "import attrs\nimport tzrun\n\n\n@attrs.frozen\nclass C:\n    k: int = 1\n\n\n"
        "@tzrun.hookimpl\ndef tzrun_register_metrics(register: tzrun.RegisterMetrics) -> None:\n"
        '    register("x", config=C, build=lambda cfg: None, predictions="probs")\n'
    )
    return root


@pytest.fixture(scope="module")
def mypy_report(snippets, generated, tmp_path_factory) -> str:
    import os

    plugin = [str(generated / "src" / "tzrun_walkthrough"), str(generated / "tests"), str(generated / "bad_hooks.py")]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path_factory.mktemp("mypy_cache")),
         *CHECKED, str(snippets["good"]), str(snippets["bad"]), *plugin],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "MYPYPATH": str(generated / "src")},
    )
    assert proc.returncode in (0, 1), proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout


def errors(report: str) -> list[str]:
    return [line for line in report.splitlines() if ": error:" in line]


def test_mypy_strict_accepts_the_plugins_and_the_contrib_distributions(mypy_report, snippets, generated):
    ours = [e for e in errors(mypy_report)
            if snippets["bad"].name not in e and snippets["good"].name not in e and str(generated) not in e]
    assert not ours, "\n".join(ours)


def test_mypy_strict_accepts_the_generated_plugin(mypy_report, generated):
    found = [e for e in errors(mypy_report) if str(generated) in e and "bad_hooks.py" not in e]
    assert not found, "\n".join(found)
    assert f"{generated}/src/tzrun_walkthrough" not in mypy_report, mypy_report[-4000:]  # (no note about it either)


def test_mypy_strict_refuses_a_misspelled_metric_register_keyword(mypy_report, generated):
    bad = [e for e in errors(mypy_report) if "bad_hooks.py" in e]
    assert len(bad) == 1 and 'Unexpected keyword argument "predictions"' in bad[0], mypy_report[-4000:]


def test_the_templates_mypy_settings_are_the_repositorys():
    """So that the one run above, under the repository's settings, is the check a plugin's
    author runs in the generated distribution."""
    import tomllib

    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    template = (REPO / "plugins" / "tzrun_tools" / "templates" / "plugin" / "pyproject.toml.tmpl").read_text()
    theirs = tomllib.loads("[tool.mypy]" + template.split("[tool.mypy]", 1)[1])["tool"]["mypy"]
    assert theirs == ours


def test_mypy_strict_accepts_the_documented_typed_registration(mypy_report, snippets):
    assert not [e for e in errors(mypy_report) if snippets["good"].name in e], mypy_report[-4000:]


def test_mypy_strict_refuses_a_misspelled_register_keyword(mypy_report, snippets):
    bad = [e for e in errors(mypy_report) if snippets["bad"].name in e]
    assert len(bad) == 1 and 'Unexpected keyword argument "output"' in bad[0], mypy_report[-4000:]


def test_the_documented_registration_is_what_the_run_accepts(snippets):
    spec = importlib.util.spec_from_file_location("tzrun_doc_registration", snippets["good"])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pm = make_plugin_manager(load_entry_points=False, plugins=[("doc_registration", module)], strict=True)
    registries = collect_registries(pm)
    assert registries["stage"].get("slack_on_eval", "train.stages[0].type").extras["outputs"] is module.slack_outputs
    assert registries["loss_weighting"].get("fixed", "train.loss_weighting.type").extras["check"] is module.check_fixed
