"""The plugin manager of a run: one per run (and per test), never module-global.

Order (DESIGN.md): add hookspecs, block what ``[plugins] disable`` and ``TZRUN_DISABLE_PLUGINS``
name, load the ``tzrun`` entry-point group one entry point at a time (one that fails to import
is reported with its distribution and error and the rest still load; ``TZRUN_STRICT_PLUGINS=1``
makes that an error), register explicit ``plugins=``, then ``check_pending()``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import warnings
from typing import Any, Iterable, Sequence

import attrs
import pluggy

from tzrun import hookspecs
from tzrun.errors import PluginLoadError

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginLoadFailure",
    "PluginManager",
    "PluginInfo",
    "make_plugin_manager",
    "plugin_infos",
    "strict_plugins_from_env",
]

ENTRY_POINT_GROUP = "tzrun"
log = logging.getLogger(__name__)


@attrs.frozen
class PluginLoadFailure:
    """An entry point that could not be imported."""

    name: str
    distribution: str | None
    version: str | None
    error: str

    def __str__(self) -> str:
        dist = f" (from {self.distribution} {self.version})" if self.distribution else ""
        return f"plugin '{self.name}'{dist} failed to load: {self.error}"


class PluginManager(pluggy.PluginManager):
    """A pluggy manager that also remembers where each plugin came from and what failed.

    Attributes:
        load_failures: entry points that failed to import, in load order.
        strict: whether a failing plugin is an error rather than a warning.
    """

    def __init__(self, *, strict: bool = False) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.strict = strict
        self.load_failures: list[PluginLoadFailure] = []
        self._origins: dict[str, tuple[str | None, str | None]] = {}

    def register_with_origin(
        self, plugin: object, name: str | None, distribution: str | None, version: str | None
    ) -> str | None:
        """Register ``plugin`` and remember its distribution and version."""
        registered = self.register(plugin, name=name)
        if registered is not None:
            self._origins[registered] = (distribution, version)
        return registered

    def origin(self, plugin_name: str) -> tuple[str | None, str | None]:
        """The (distribution, version) a plugin was loaded from; ``(None, None)`` when it was
        registered programmatically."""
        return self._origins.get(plugin_name, (None, None))

    def describe(self, plugin_name: str) -> str:
        """``'name'`` or ``'name' (dist version)`` for error messages."""
        dist, version = self.origin(plugin_name)
        return f"'{plugin_name}' ({dist} {version})" if dist else f"'{plugin_name}'"


def strict_plugins_from_env(environ: dict[str, str] | None = None) -> bool:
    """Whether ``TZRUN_STRICT_PLUGINS`` asks for strict plugin loading."""
    value = (environ if environ is not None else os.environ).get("TZRUN_STRICT_PLUGINS", "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _disabled_from_env(environ: dict[str, str] | None) -> list[str]:
    value = (environ if environ is not None else os.environ).get("TZRUN_DISABLE_PLUGINS", "")
    return [name.strip() for name in value.split(",") if name.strip()]


def make_plugin_manager(
    *,
    disable: Iterable[str] = (),
    plugins: Sequence[object | tuple[str, object]] = (),
    load_entry_points: bool = True,
    strict: bool | None = None,
    environ: dict[str, str] | None = None,
) -> PluginManager:
    """Make a fresh plugin manager for one run.

    Args:
        disable: plugin names to block (entry-point names, e.g. ``"tzrun_plugins.stages"``);
            ``TZRUN_DISABLE_PLUGINS`` (comma-separated) adds to them.
        plugins: extra plugin objects to register, each an object or a ``(name, object)`` pair
            (the programmatic equivalent of an installed entry point).
        load_entry_points: load the installed ``tzrun`` entry-point group.
        strict: make a plugin that fails to import an error; ``None`` reads
            ``TZRUN_STRICT_PLUGINS``.
        environ: the environment to read (defaults to ``os.environ``).

    Returns:
        The manager, with ``check_pending()`` already passed.

    Raises:
        PluginLoadError: in strict mode, when an entry point fails to import.
        pluggy.PluginValidationError: when a plugin implements a hook that does not exist.
    """
    pm = PluginManager(strict=strict_plugins_from_env(environ) if strict is None else strict)
    for name in [*disable, *_disabled_from_env(environ)]:
        pm.set_blocked(name)
    if load_entry_points:
        _load_entry_points(pm)
    for item in plugins:
        name, obj = item if isinstance(item, tuple) else (None, item)
        pm.register_with_origin(obj, name, None, None)
    pm.check_pending()
    return pm


def _load_entry_points(pm: PluginManager) -> None:
    seen: set[str] = set()
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in seen or pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        seen.add(ep.name)
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else None
        dist_version = dist.version if dist is not None else None
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            failure = PluginLoadFailure(ep.name, dist_name, dist_version, f"{type(exc).__name__}: {exc}")
            if pm.strict:
                raise PluginLoadError(
                    f"{failure} (TZRUN_STRICT_PLUGINS is on; fix or uninstall "
                    f"{dist_name or ep.name}, or disable it with TZRUN_DISABLE_PLUGINS={ep.name})"
                ) from exc
            pm.load_failures.append(failure)
            warnings.warn(
                f"{failure}; the other plugins are loaded. Disable it with "
                f"TZRUN_DISABLE_PLUGINS={ep.name} or make this an error with TZRUN_STRICT_PLUGINS=1",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        pm.register_with_origin(plugin, ep.name, dist_name, dist_version)


@attrs.frozen
class PluginInfo:
    """What ``tzrec-run plugins`` shows for one plugin."""

    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]
    components: dict[str, tuple[str, ...]]

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        return attrs.asdict(self)


def plugin_infos(pm: PluginManager, registries: Any | None = None) -> list[PluginInfo]:
    """Describe every registered plugin: origin, hooks it implements, components it registered.

    Args:
        pm: the manager.
        registries: the :class:`tzrun.registry.Registries` collected from ``pm``, to list
            components per kind; without it, ``components`` is empty.
    """
    infos = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
        if plugin is None:  # blocked
            continue
        hooks = tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or ()))
        components: dict[str, tuple[str, ...]] = {}
        if registries is not None:
            for registry in registries.all():
                names = tuple(e.name for e in registry.entries() if e.plugin == name)
                if names:
                    components[registry.kind] = names
        dist, version = pm.origin(name)
        infos.append(PluginInfo(name, dist, version, hooks, components))
    return infos
