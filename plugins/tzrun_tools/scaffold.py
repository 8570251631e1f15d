"""``tzrec-run new-plugin``: write a plugin distribution whose tests pass out of the box.

The templates are package data (``tzrun_tools/templates/plugin/``), so this works from a wheel. Each
kind's template (``<kind>.tmpl``) has four sections, ``#--- options``, ``#--- hooks``,
``#--- module`` and ``#--- test``, assembled into ``options.py``, ``hooks.py``,
``<kind>.py`` and ``tests/test_components.py``.
"""

from __future__ import annotations

import re
import string
from importlib import resources
from pathlib import Path
from typing import Sequence

from tzrun import __version__
from tzrun.errors import TzrunError

__all__ = ["TEMPLATE_KINDS", "new_plugin"]

#: The kinds ``new-plugin --kind`` can write an example of.
TEMPLATE_KINDS = ("dense_optimizer", "lr_scheduler", "loss", "metric", "stage")
_SECTION = re.compile(r"^#--- (options|hooks|module|test)\n", re.M)


def _template(name: str) -> str:
    return resources.files("tzrun_tools").joinpath("templates", "plugin", name).read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    parts = _SECTION.split(text)
    return {parts[i]: parts[i + 1].strip("\n") + "\n" for i in range(1, len(parts), 2)}


def _names(name: str) -> tuple[str, str, str]:
    """(distribution, import package, component prefix) for ``name`` (``acme``, ``tzrun-acme``
    or ``tzrun_acme``)."""
    thing = re.sub(r"^tzrun[-_]", "", name.strip().lower()).replace("-", "_")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", thing):
        raise TzrunError(f"new-plugin: '{name}' is not a valid plugin name; use lower_snake or kebab-case, e.g. acme-metrics")
    return f"tzrun-{thing.replace('_', '-')}", f"tzrun_{thing}", thing


def new_plugin(name: str, kinds: Sequence[str], out: Path) -> list[Path]:
    """Write distribution ``tzrun-<name>`` into ``out/tzrun-<name>`` with one example
    component per kind, its entry point, ``py.typed`` and tests that use
    :func:`tzrun.testing.check_component`.

    Args:
        name: the plugin's name (``acme``, ``tzrun-acme``).
        kinds: kinds of :data:`TEMPLATE_KINDS`.
        out: the directory to write the distribution's directory into.

    Returns:
        The files written.

    Raises:
        TzrunError: for an unknown kind, a bad name, or a directory that exists.
    """
    unknown = [k for k in kinds if k not in TEMPLATE_KINDS]
    if unknown or not kinds:
        raise TzrunError(f"new-plugin: --kind takes some of {', '.join(TEMPLATE_KINDS)} (got {', '.join(kinds) or 'none'})")
    dist, package, prefix = _names(name)
    root = Path(out) / dist
    if root.exists():
        raise TzrunError(f"new-plugin: {root} exists; remove it or pass another --out")
    major, minor = (int(x) for x in __version__.split(".")[:2])
    values = {
        "dist": dist, "package": package, "prefix": prefix, "Prefix": prefix.title().replace("_", ""),
        "core_minor": f"{major}.{minor}", "core_next": f"{major}.{minor + 1}",
        "components": ", ".join(kinds).replace("_", " "),
    }
    sections = [_sections(string.Template(_template(f"{k}.tmpl")).substitute(values)) for k in kinds]

    def render(template: str) -> str:
        return string.Template(_template(template)).substitute(values)

    files = {
        root / "pyproject.toml": render("pyproject.toml.tmpl"),
        root / "src" / package / "__init__.py": f'"""{dist}: tzrec-run components."""\n',
        root / "src" / package / "py.typed": "",
        root / "src" / package / "options.py": render("options.py.tmpl") + "".join("\n\n" + s["options"] for s in sections),
        root / "src" / package / "hooks.py": render("hooks.py.tmpl") + "".join("\n\n" + s["hooks"] for s in sections),
        root / "tests" / "conftest.py": 'pytest_plugins = ["tzrun.testing"]\n',
        root / "tests" / "test_components.py": render("test_head.py.tmpl") + "".join("\n\n" + s["test"] for s in sections),
    }
    for kind, s in zip(kinds, sections):
        files[root / "src" / package / f"{kind}.py"] = s["module"]
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return sorted(files)
