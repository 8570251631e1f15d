"""The plugin manager of a run: one per run (and per test), never module-global.

Order (DESIGN.md): add hookspecs, block what ``[plugins] disable`` and ``TZRUN_DISABLE_PLUGINS``
name, load the ``tzrun`` entry-point group one entry point at a time, register explicit
``plugins=``, then ``check_pending()``.

An entry point is rejected, with a warning that names it and its distribution (an error when
``TZRUN_STRICT_PLUGINS=1``), and the others still load, when

* its distribution requires a ``tzrec-run`` version this one is not (it is not even imported);
* it fails to import;
* its hooks do not match the hookspecs (:func:`tzrun.kernel.hookcheck.hook_problems`): an unknown
  hook, a wrong argument name, a method named ``tzrun_*`` without the ``@tzrun.hookimpl`` marker.

:func:`tzrun.kernel.registry.collect_registries` applies the same rule to a plugin whose registration
hook raises or registers something malformed: the plugin is disabled (every component it
registered and its lifecycle hooks) with a warning naming it and the fix, and the others load.
In strict mode (``--strict``, ``[plugins] strict = true``, ``TZRUN_STRICT_PLUGINS=1``) each such
warning is an error instead, with the full traceback of its cause.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import logging
import os
import re
import traceback
import warnings
from typing import Any, Collection, Iterable, Literal, Sequence

import attrs
import pluggy

from tzrun import __version__, hookspecs
from tzrun.errors import PluginLoadError
from tzrun.kernel.hookcheck import hook_problems

__all__ = [
    "CORE_DISTRIBUTION",
    "ENTRY_POINT_GROUP",
    "call_lifecycle",
    "canonical_name",
    "DisabledPlugin",
    "PluginLoadFailure",
    "PluginManager",
    "PluginInfo",
    "make_plugin_manager",
    "pinned_requirements",
    "plugin_infos",
    "report_failure",
    "strict_plugins_from_env",
]

ENTRY_POINT_GROUP = "tzrun"
#: The distribution name a plugin's dependency specifier names to state the versions it supports.
CORE_DISTRIBUTION = "tzrec-run"
log = logging.getLogger(__name__)

FailureReason = Literal["import", "incompatible", "hook_api", "registration"]


@attrs.frozen
class PluginLoadFailure:
    """An entry point that was not loaded.

    Attributes:
        name: the entry point's name (what ``TZRUN_DISABLE_PLUGINS`` takes).
        distribution, version: the distribution that declares it.
        error: what went wrong, in words.
        reason: ``"import"`` (importing it raised), ``"incompatible"`` (its distribution
            requires another tzrec-run version), ``"hook_api"`` (its hookimpls do not match
            tzrec-run's hookspecs) or ``"registration"`` (a registration hook raised or
            registered something malformed; the plugin was disabled).
    """

    name: str
    distribution: str | None
    version: str | None
    error: str
    reason: FailureReason = "import"

    def __str__(self) -> str:
        dist = f" (from {self.distribution} {self.version})" if self.distribution else ""
        verb = {"import": "failed to load", "registration": "was disabled"}.get(self.reason, "was rejected")
        return f"plugin '{self.name}'{dist} {verb}: {self.error}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        return attrs.asdict(self)


@attrs.frozen
class DisabledPlugin:
    """An installed entry point that was not loaded because the run disabled it.

    Attributes:
        name: the entry point's name.
        distribution, version: the distribution that declares it.
        by: what disabled it (``"TZRUN_DISABLE_PLUGINS"`` or ``"--disable / [plugins] disable"``).
    """

    name: str
    distribution: str | None
    version: str | None
    by: str

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        return attrs.asdict(self)


class PluginManager(pluggy.PluginManager):
    """A pluggy manager that also remembers where each plugin came from and what failed.

    Attributes:
        load_failures: plugins that were not loaded or were disabled for an error, in order.
        disabled: installed entry points the run disabled.
        strict: whether a failing plugin is an error rather than a warning.
    """

    def __init__(self, *, strict: bool = False) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.strict = strict
        self.load_failures: list[PluginLoadFailure] = []
        self.disabled: list[DisabledPlugin] = []
        self.disabled_by: dict[str, str] = {}
        self._origins: dict[str, tuple[str | None, str | None]] = {}

    def register_with_origin(
        self, plugin: object, name: str | None, distribution: str | None, version: str | None
    ) -> str | None:
        """Register ``plugin`` and remember its distribution and version."""
        registered = self.register(plugin, name=name)
        if registered is not None:
            self._origins[registered] = (distribution, version)
        return registered

    def forget(self, plugin: object) -> None:
        """Unregister ``plugin`` and its origin."""
        name = self.get_name(plugin)
        self.unregister(plugin)
        self._origins.pop(name or "", None)

    def origin(self, plugin_name: str) -> tuple[str | None, str | None]:
        """The (distribution, version) a plugin was loaded from; ``(None, None)`` when it was
        registered programmatically."""
        return self._origins.get(plugin_name, (None, None))

    def describe(self, plugin_name: str) -> str:
        """``'name'`` or ``'name' (dist version)`` for error messages."""
        dist, version = self.origin(plugin_name)
        return f"'{plugin_name}' ({dist} {version})" if dist else f"'{plugin_name}'"


def call_lifecycle(pm: PluginManager, name: str, *, skip: Collection[object] = (), **kwargs: Any) -> None:
    """Call lifecycle hook ``name`` on every plugin that implements it, in pluggy's order, with
    each plugin's failure isolated: a hookimpl that raises is named in a warning and its plugin
    is unregistered for the rest of the run, while the others go on (in ``tzrun_after_train``,
    when nothing is left to go on, the warning says so and the run ends as usual). In strict mode
    (``TZRUN_STRICT_PLUGINS=1``) the error propagates instead.

    Wrapper hookimpls (``wrapper=True``, or the old ``hookwrapper=True``) wrap the call through
    pluggy itself, around every other hookimpl, each of which runs isolated inside them. A
    wrapper that raises is disabled the same way; the hookimpls it kept from running then run
    without it, so that each runs once.

    Only ``Exception`` is caught: ``KeyboardInterrupt`` and ``SystemExit`` always propagate.

    Args:
        pm: the run's plugin manager.
        name: the hook.
        skip: plugin objects not to call this time.
        **kwargs: the hook's arguments.
    """
    impls = [impl for impl in getattr(pm.hook, name).get_hookimpls() if impl.plugin not in skip]
    inner = [impl for impl in impls if not _is_wrapper(impl)]
    wrappers = [impl for impl in impls if _is_wrapper(impl)]
    called: list[Any] = []
    calls = [_isolated(pm, name, impl, kwargs, called) for impl in inner]
    around = pm.subset_hook_caller(name, remove_plugins=[*skip, *(impl.plugin for impl in inner)])
    try:
        around.call_extra(calls, kwargs)  # pluggy calls them last to first, like its own hookimpls
    except Exception as exc:
        culprit = _raised_in(exc, wrappers)
        if pm.strict or culprit is None:
            raise
        _disable(pm, name, culprit, exc, kwargs)
        for impl, call in reversed(list(zip(inner, calls))):
            if impl not in called:
                call()


def _is_wrapper(impl: Any) -> bool:
    return bool(impl.wrapper or impl.hookwrapper)


def _isolated(pm: PluginManager, name: str, impl: Any, kwargs: dict[str, Any], called: list[Any]) -> Any:
    """A call of the (non-wrapper) hookimpl ``impl`` with ``kwargs`` that disables its plugin
    when it raises; it takes no arguments, so that pluggy passes it none."""

    def call() -> None:
        called.append(impl)
        try:
            impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
        except Exception as exc:
            if pm.strict:
                raise
            _disable(pm, name, impl, exc, kwargs)

    return call


def _raised_in(exc: BaseException, wrappers: Sequence[Any]) -> Any:
    """The wrapper hookimpl of ``wrappers`` whose code raised ``exc`` last (None: none did)."""
    codes = {_code(impl.function): impl for impl in wrappers}
    culprit = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        culprit = codes.get(frame.f_code, culprit)
    return culprit


def _code(function: Any) -> Any:
    function = inspect.unwrap(getattr(function, "__func__", function))
    return getattr(function, "__code__", None)


def _disable(pm: PluginManager, name: str, impl: Any, exc: Exception, kwargs: dict[str, Any]) -> None:
    """Name the plugin of ``impl``, which raised ``exc`` in hook ``name`` (called with
    ``kwargs``), in a warning and unregister it; a write failure in the model dir ends the run
    instead."""
    _raise_write_failure(exc, kwargs)
    plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
    goes_on = ("training is over and its checkpoints are written, so the run ends as usual" if name == "tzrun_after_train"
               else "it is disabled for the rest of this run and training goes on")
    warnings.warn(
        f"plugin {pm.describe(plugin_name)} raised in {name}: {type(exc).__name__}: {exc}; {goes_on} "
        "(TZRUN_STRICT_PLUGINS=1 makes this an error)",
        RuntimeWarning,
        stacklevel=2,
    )
    log.warning("plugin %s raised in %s and is disabled for this run", plugin_name, name, exc_info=exc)
    if pm.is_registered(impl.plugin):
        pm.unregister(impl.plugin)
def _raise_write_failure(exc: Exception, kwargs: dict[str, Any]) -> None:
    """A hook that could not write into the model dir (a full disk, a read-only dir: the
    ``metrics_log`` stage appending to ``metrics.jsonl``, say) ends the run with a named
    :class:`~tzrun.errors.WriteError` instead of disabling its plugin: the run could not save
    a checkpoint either."""
    model_dir = getattr(kwargs.get("run"), "model_dir", None)
    if model_dir is None:
        return
    from tzrun.io.write_errors import named_write_error

    named = named_write_error(exc, model_dir)
    if named is not None:
        raise named from None


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
    distributions: Iterable[str] | None = None,
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
        distributions: load only the entry points of these distributions (e.g.
            ``["tzrec-run"]`` for the built-ins alone, whatever else is installed); ``None``
            loads every one.
        strict: make a plugin that cannot be loaded an error; ``None`` reads
            ``TZRUN_STRICT_PLUGINS``.
        environ: the environment to read (defaults to ``os.environ``).

    Returns:
        The manager, with ``check_pending()`` already passed.

    Raises:
        PluginLoadError: in strict mode, when an entry point fails to import, requires another
            tzrec-run version, or does not match the hookspecs.
        pluggy.PluginValidationError: when a plugin passed in ``plugins`` implements a hook
            that does not exist.
    """
    pm = PluginManager(strict=strict_plugins_from_env(environ) if strict is None else strict)
    for names, by in ((disable, "--disable / [plugins] disable"), (_disabled_from_env(environ), "TZRUN_DISABLE_PLUGINS")):
        for name in names:
            pm.set_blocked(name)
            pm.disabled_by.setdefault(name, by)
    if load_entry_points:
        _load_entry_points(pm, None if distributions is None else {canonical_name(d) for d in distributions})
    for item in plugins:
        name, obj = item if isinstance(item, tuple) else (None, item)
        pm.register_with_origin(obj, name, None, None)
    pm.check_pending()
    return pm


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them (``tzrec_run`` is ``tzrec-run``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _load_entry_points(pm: PluginManager, distributions: set[str] | None) -> None:
    seen: set[str] = set()
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in seen or pm.has_plugin(ep.name):
            continue
        seen.add(ep.name)
        dist = getattr(ep, "dist", None)
        dist_name, dist_version, unsupported = _distribution_facts(dist)
        if distributions is not None and (dist_name is None or canonical_name(dist_name) not in distributions):
            continue
        if pm.is_blocked(ep.name):
            pm.disabled.append(DisabledPlugin(ep.name, dist_name, dist_version, pm.disabled_by.get(ep.name, "pm.set_blocked")))
            continue

        def reject(error: str, reason: FailureReason, cause: BaseException | None = None) -> None:
            report_failure(pm, PluginLoadFailure(ep.name, dist_name, dist_version, error, reason), cause)

        if unsupported is not None:
            reject(unsupported, "incompatible")
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            reject(f"{type(exc).__name__}: {exc}", "import", exc)
            continue
        same = pm.get_name(plugin)
        if same is not None:
            warnings.warn(
                f"entry point '{ep.name}' ({dist_name} {dist_version}) names the same plugin as '{same}'; "
                f"it is loaded once, as '{same}'",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        problems = hook_problems(plugin, ep.value)
        if problems:
            reject("; ".join(problems), "hook_api")
            continue
        try:
            pm.register_with_origin(plugin, ep.name, dist_name, dist_version)
        except pluggy.PluginValidationError as exc:
            reject(f"its hooks do not match tzrec-run {__version__}'s hookspecs: {exc}".replace("\n", "; "), "hook_api", exc)


_FIXES = {
    "import": "fix or uninstall {who}",
    "incompatible": "install a version of {who} made for tzrec-run {version}, or uninstall it",
    "hook_api": "fix its hooks as said (or install a version of {who} made for tzrec-run {version})",
    "registration": "fix its registration as said, or uninstall {who}",
}


def report_failure(pm: PluginManager, failure: PluginLoadFailure, cause: BaseException | None = None) -> None:
    """The one rule for a broken plugin: record ``failure`` and warn, naming the plugin and
    the fix, while the other plugins load; in strict mode raise it instead, with the full
    traceback of ``cause``.

    Raises:
        PluginLoadError: in strict mode.
    """
    fix = _FIXES[failure.reason].format(who=failure.distribution or failure.name, version=__version__)
    disable = f'[plugins] disable = ["{failure.name}"] (or TZRUN_DISABLE_PLUGINS={failure.name})'
    if pm.strict:
        trace = ""
        if cause is not None:
            trace = "\n" + "".join(traceback.format_exception(type(cause), cause, cause.__traceback__)).rstrip()
        raise PluginLoadError(f"{failure} (strict plugin mode is on; {fix}, or disable it with {disable}){trace}") from cause
    pm.load_failures.append(failure)
    warnings.warn(
        f"{failure}; the other plugins are loaded. To silence this, {fix}, or disable it with {disable}; "
        "--strict (or [plugins] strict = true, or TZRUN_STRICT_PLUGINS=1) makes it an error",
        RuntimeWarning,
        stacklevel=5,  # the caller of make_plugin_manager
    )


def _distribution_facts(dist: importlib.metadata.Distribution | None) -> tuple[str | None, str | None, str | None]:
    """``dist``'s name, version and why it cannot run on this tzrec-run (or None each).

    Parsed once per process for each content of its ``METADATA`` (several entry points share
    a distribution, and a Session is made many times in one process: parsing took most of
    :func:`make_plugin_manager`'s time); a distribution reinstalled meanwhile has other text."""
    if dist is None:
        return None, None, None
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if text is None:  # not the usual layout: read through importlib.metadata each time
        return dist.metadata["Name"], dist.version, _unsupported_core(dist.requires)
    return _parsed_facts(text)


@functools.lru_cache(maxsize=256)
def _parsed_facts(text: str) -> tuple[str | None, str | None, str | None]:
    import email

    message = email.message_from_string(text)
    return message["Name"], message["Version"], _unsupported_core(message.get_all("Requires-Dist"))


def _unsupported_core(requires: Sequence[str] | None) -> str | None:
    """Why a distribution with these ``Requires-Dist`` lines cannot run on this tzrec-run (its
    ``tzrec-run`` requirement excludes ``__version__``), or None. One that does not name
    tzrec-run is accepted."""
    if not requires:
        return None
    from packaging.requirements import InvalidRequirement, Requirement

    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if canonical_name(requirement.name) != CORE_DISTRIBUTION:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # only under an extra, or on another platform
        if not requirement.specifier.contains(__version__, prereleases=True):
            return f"it supports {CORE_DISTRIBUTION}{requirement.specifier}, and this is tzrec-run {__version__}"
    return None


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
        registries: the :class:`tzrun.kernel.registry.Registries` collected from ``pm``, to list
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


def pinned_requirements(pm: PluginManager) -> list[str]:
    """``name==version`` of every distribution that provides a loaded plugin, sorted by name.

    This is what ``tzrec-run plugins --freeze`` prints: a requirements file that reinstalls
    the plugin set of this environment. Plugins registered in code have no distribution and
    are left out.
    """
    pins: dict[str, str] = {}
    for name, plugin in pm.list_name_plugin():
        dist, version = pm.origin(name)
        if plugin is not None and dist:
            pins.setdefault(canonical_name(dist), f"{dist}=={version}")
    return [pins[key] for key in sorted(pins)]
