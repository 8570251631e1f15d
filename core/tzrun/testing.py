"""Test helpers for tzrec-run and its plugin authors: an opt-in pytest plugin.

Enable it in a ``conftest.py`` with ``pytest_plugins = ["tzrun.testing"]``. It provides:

* the ``tzrun_pm`` fixture: a fresh plugin manager with the installed plugins loaded (never a
  shared one), and ``tzrun_pm_factory`` to make more with options;
* :func:`registered`: a context manager that registers a plugin on a manager for a block;
* :func:`load_config_text`: checks a TOML string through both passes, as ``tzrec-run check`` does.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

import pytest

from tzrun.config.load import load_config, parse_config
from tzrun.config.schema import RunConfig
from tzrun.plugins import PluginManager, make_plugin_manager
from tzrun.registry import Registries, collect_registries

__all__ = ["tzrun_pm", "tzrun_pm_factory", "registered", "load_config_text"]


@pytest.fixture
def tzrun_pm_factory() -> Callable[..., PluginManager]:
    """Make fresh plugin managers: ``tzrun_pm_factory(disable=..., plugins=..., strict=...)``
    (the keyword arguments of :func:`tzrun.plugins.make_plugin_manager`)."""
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

