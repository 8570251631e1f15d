"""Registries of named components, collected from a plugin manager.

Each registration hookimpl is called on its own with a ``register`` callback bound to its plugin,
so every :class:`Entry` records which plugin (and distribution, version) made it. The result is
immutable; there is no global registry.
"""

from __future__ import annotations

import re
import warnings
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

import attrs

from tzrun.errors import DuplicateRegistrationError, PluginError, UnknownComponentError
from tzrun.plugins import PluginManager

__all__ = ["KINDS", "Kind", "Entry", "Registry", "Registries", "collect_registries"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@attrs.frozen
class Kind:
    """A component kind: its hook, its human name, and what ``register`` accepts for it.

    Attributes:
        key: the kind's key (``"dense_optimizer"``).
        hook: the registration hook's name.
        label: how errors name it (``"dense optimizer"``).
        plural: the same in the plural.
        extras: keyword arguments of ``register`` specific to this kind, with defaults.
        reserved: TOML keys the core reads from this kind's tables; a config class must not
            declare fields with these names.
    """

    key: str
    hook: str
    label: str
    plural: str
    extras: Mapping[str, Any] = attrs.field(factory=dict)
    reserved: frozenset[str] = frozenset({"type"})


KINDS: Mapping[str, Kind] = MappingProxyType(
    {
        k.key: k
        for k in (
            Kind("sparse_optimizer", "tzrun_register_sparse_optimizers", "sparse optimizer", "sparse optimizers",
                 reserved=frozenset({"type", "lr_schedule", "cpu_policy"})),
            Kind("dense_optimizer", "tzrun_register_dense_optimizers", "dense optimizer", "dense optimizers",
                 reserved=frozenset({"type", "lr_schedule", "parts", "ema", "pattern"})),
            Kind("lr_scheduler", "tzrun_register_lr_schedulers", "lr schedule", "lr schedules"),
            Kind("loss", "tzrun_register_losses", "loss", "losses", {"prediction": "logits", "group": "none"},
                 frozenset({"type", "name", "label", "prediction", "weight", "group_by"})),
            Kind("metric", "tzrun_register_metrics", "metric", "metrics", {"prediction": "probs", "group": "none"},
                 frozenset({"type", "name", "label", "prediction", "group_by"})),
            Kind("train_pipeline", "tzrun_register_train_pipelines", "train pipeline", "train pipelines"),
            Kind("stage", "tzrun_register_stages", "stage", "stages", {"check": None}),
            Kind("model", "tzrun_register_models", "model", "models", {"outputs": None}),
            Kind("reader", "tzrun_register_readers", "reader", "readers", {"check": None}),
            Kind("sampler", "tzrun_register_samplers", "sampler", "samplers"),
        )
    }
)


@attrs.frozen
class Entry:
    """One registered component.

    Attributes:
        kind: its kind key.
        name: its TOML name.
        config: the attrs class its TOML options are structured into.
        build: the callable that builds it (signature per kind, see :mod:`tzrun.hookspecs`).
        description: one line for ``tzrec-run plugins``.
        plugin: the name of the plugin that registered it.
        distribution, version: where that plugin came from (None when registered in code).
        extras: the kind-specific registration options (``prediction`` for losses, ...).
    """

    kind: str
    name: str
    config: type
    build: Callable[..., Any]
    description: str
    plugin: str
    distribution: str | None
    version: str | None
    extras: Mapping[str, Any]


class Registry:
    """The components of one kind, by name. Read-only once collected."""

    def __init__(self, kind: Kind, entries: Mapping[str, Entry]) -> None:
        self.kind = kind.key
        self.label = kind.label
        self.plural = kind.plural
        self._entries = MappingProxyType(dict(sorted(entries.items())))

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return list(self._entries)

    def entries(self) -> list[Entry]:
        """Registered entries, sorted by name."""
        return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str, path: str) -> Entry:
        """The entry called ``name``.

        Args:
            name: the component name from the config.
            path: the TOML path it was read from, for the error.

        Raises:
            UnknownComponentError: listing the available names and a did-you-mean.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownComponentError(self.label, name, path, self._entries) from None


@attrs.frozen
class Registries:
    """Every kind's registry, as collected from one plugin manager."""

    by_kind: Mapping[str, Registry]

    def __getitem__(self, kind: str) -> Registry:
        return self.by_kind[kind]

    def all(self) -> list[Registry]:
        """Every registry, in :data:`KINDS` order."""
        return [self.by_kind[k] for k in KINDS]


def collect_registries(pm: PluginManager) -> Registries:
    """Call every registration hookimpl on its own and collect what it registers.

    Args:
        pm: the run's plugin manager.

    Returns:
        Immutable registries, one per kind.

    Raises:
        DuplicateRegistrationError: when two plugins register one name in one kind.
        PluginError: when a registration is malformed, or when a hook raises and
            ``pm.strict`` is on (otherwise the failing plugin is skipped with a warning).
    """
    registries: dict[str, Registry] = {}
    for kind in KINDS.values():
        entries: dict[str, Entry] = {}
        caller = getattr(pm.hook, kind.hook)
        for impl in caller.get_hookimpls():  # registration order
            plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
            dist, version = pm.origin(plugin_name)
            register = _Registrar(kind, plugin_name, dist, version, entries, pm)
            try:
                impl.function(register=register)
            except (DuplicateRegistrationError, PluginError):
                raise
            except Exception as exc:
                message = (
                    f"plugin {pm.describe(plugin_name)} raised in {kind.hook}: "
                    f"{type(exc).__name__}: {exc}"
                )
                if pm.strict:
                    raise PluginError(message) from exc
                warnings.warn(f"{message}; its {kind.plural} are skipped", RuntimeWarning, stacklevel=2)
                register.rollback()
        registries[kind.key] = Registry(kind, entries)
    return Registries(MappingProxyType(registries))


class _Registrar:
    """The ``register`` callback handed to one hookimpl for one kind."""

    def __init__(
        self,
        kind: Kind,
        plugin: str,
        distribution: str | None,
        version: str | None,
        entries: dict[str, Entry],
        pm: PluginManager,
    ) -> None:
        self._kind, self._plugin = kind, plugin
        self._dist, self._version = distribution, version
        self._entries, self._pm = entries, pm
        self._added: list[str] = []

    def __call__(
        self,
        name: str,
        *,
        config: type,
        build: Callable[..., Any],
        description: str = "",
        **extras: Any,
    ) -> None:
        kind, who = self._kind, self._pm.describe(self._plugin)
        if not isinstance(name, str) or not _NAME.match(name):
            raise PluginError(f"plugin {who} registered {kind.label} {name!r}: names are lower_snake")
        if not (isinstance(config, type) and attrs.has(config)):
            raise PluginError(
                f"plugin {who} registered {kind.label} '{name}' with config={config!r}: "
                "config must be an attrs class (use @attrs.frozen)"
            )
        clash = kind.reserved & {f.name for f in attrs.fields(config)}
        if clash:
            raise PluginError(
                f"plugin {who} registered {kind.label} '{name}' whose config declares "
                f"{sorted(clash)}: those keys are read by tzrec-run itself; rename the fields"
            )
        if not callable(build):
            raise PluginError(f"plugin {who} registered {kind.label} '{name}' with a build that is not callable")
        unknown = set(extras) - set(kind.extras)
        if unknown:
            allowed = ", ".join(kind.extras) or "none"
            raise PluginError(
                f"plugin {who} registered {kind.label} '{name}' with unknown option(s) "
                f"{sorted(unknown)} (allowed for {kind.label}s: {allowed})"
            )
        if "group" in extras and extras["group"] not in ("none", "optional", "required"):
            raise PluginError(
                f"plugin {who} registered {kind.label} '{name}' with group={extras['group']!r}; "
                "use \"none\", \"optional\" or \"required\""
            )
        if name in self._entries:
            first = self._entries[name]
            raise DuplicateRegistrationError(
                kind.label, name, first.plugin, self._plugin,
                self._pm.describe(first.plugin), self._pm.describe(self._plugin),
            )
        self._entries[name] = Entry(
            kind=kind.key,
            name=name,
            config=config,
            build=build,
            description=description,
            plugin=self._plugin,
            distribution=self._dist,
            version=self._version,
            extras=MappingProxyType({**kind.extras, **extras}),
        )
        self._added.append(name)

    def rollback(self) -> None:
        """Forget what this hookimpl registered before it raised."""
        for name in self._added:
            self._entries.pop(name, None)
        self._added.clear()
