"""The layering rules of the core (shared/DESIGN.md, "Layout"), checked on every import
statement, function-local ones included: the plugin kernel never imports the tools or the
first-party plugins, ``config`` never imports ``data`` or the runner, the runner's modules
import each other without a circle, the core never imports the way out of a run (the
``tzrun_serving`` plugin), and the plugins import only tzrec-run's public API."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core" / "tzrun"
PLUGINS = CORE.parents[1] / "plugins"

#: The public API: ``tzrun`` itself (its ``__all__``), and the public modules that
#: docs/plugin_authors.md names. Everything else below ``tzrun`` is internal.
PUBLIC = {"tzrun", "tzrun.errors", "tzrun.hookspecs", "tzrun.sequence", "tzrun.checkpoints", "tzrun.outputs",
          "tzrun.batching"}

#: package (below tzrun) -> the modules it must never import
RULES = {
    "kernel": ("tzrun_tools", "tzrun_plugins", "tzrun.runner", "tzrun.cli"),
    "config": ("tzrun.data", "tzrun.runner", "tzrun_tools", "tzrun_serving", "tzrun_plugins"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", sorted(RULES))
def test_a_layer_never_imports_what_sits_above_it(package):
    broken = [f"{path.relative_to(CORE.parent)}:{line} imports {module}"
              for path in sorted((CORE / package).rglob("*.py")) for line, module in _imports(path)
              if any(module == banned or module.startswith(banned + ".") for banned in RULES[package])]
    assert broken == []


def test_the_runners_modules_import_each_other_without_a_circle():
    edges = {path.stem: {module.split(".")[2] for _, module in _imports(path) if module.startswith("tzrun.runner.")}
             for path in (CORE / "runner").glob("*.py")}
    circles = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(edges.get(path[-1], ())):
            if nxt == path[0]:
                circles.append(" -> ".join([*path, nxt]))
            elif nxt not in path and nxt > path[0]:  # each circle once, from its smallest module
                walk([*path, nxt])

    for start in sorted(edges):
        walk([start])
    assert circles == []


def test_the_core_never_imports_the_way_out_of_a_run():
    assert not (CORE / "serving").exists() and not (CORE / "deltas.py").exists()
    broken = [f"{path.relative_to(CORE.parent)}:{line} imports {module}"
              for path in sorted(CORE.rglob("*.py")) for line, module in _imports(path)
              if module == "tzrun_serving" or module.startswith("tzrun_serving.")]
    assert broken == []


@pytest.mark.parametrize("package", ["tzrun_plugins", "tzrun_serving"])
def test_the_plugins_import_only_the_public_api(package):
    broken = [f"{path.relative_to(PLUGINS)}:{line} imports {module}"
              for path in sorted((PLUGINS / package).rglob("*.py")) for line, module in _imports(path)
              if (module == "tzrun" or module.startswith("tzrun.")) and module not in PUBLIC]
    assert broken == []
