"""Registries of named components, collected from a plugin manager.

Each registration hookimpl is called on its own with a ``register`` callback bound to its plugin,
so every :class:`Entry` records which plugin (and distribution, version) made it. The result is
immutable; there is no global registry.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping

import attrs

from tzrun.errors import AmbiguousComponentError, PluginError, UnknownComponentError
from tzrun.kernel.plugins import CORE_DISTRIBUTION, PluginLoadFailure, PluginManager, canonical_name, report_failure

__all__ = ["LABEL_DOMAINS", "KINDS", "Kind", "Entry", "Registry", "Registries", "collect_registries", "shadow_notes"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: A command's name may be two words: the second a sub-command of the group the first names.
_COMMAND_NAME = re.compile(r"^[a-z][a-z0-9_]*( [a-z][a-z0-9_]*)?$")

#: what a loss or metric may declare with ``register(..., labels=...)``, from the least to the
#: most demanding (see :mod:`tzrun.data.labels`)
LABEL_DOMAINS = ("finite", "non_negative", "class_index", "binary")


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
            Kind("loss", "tzrun_register_losses", "loss", "losses", {"prediction": "logits", "group": "none", "labels": None,
                                                                  "reads": None},
                 frozenset({"type", "name", "label", "prediction", "weight", "group_by"})),
            Kind("loss_weighting", "tzrun_register_loss_weightings", "loss weighting", "loss weightings", {"check": None}),
            Kind("metric", "tzrun_register_metrics", "metric", "metrics", {"prediction": "probs", "group": "none", "labels": None},
                 frozenset({"type", "name", "label", "prediction", "group_by"})),
            Kind("train_pipeline", "tzrun_register_train_pipelines", "train pipeline", "train pipelines"),
            Kind("stage", "tzrun_register_stages", "stage", "stages", {"check": None, "outputs": None}),
            Kind("model", "tzrun_register_models", "model", "models", {"outputs": None}),
            Kind("reader", "tzrun_register_readers", "reader", "readers", {"check": None}),
            Kind("sampler", "tzrun_register_samplers", "sampler", "samplers", {"expands_rows": False, "check": None}),
            Kind("eviction_policy", "tzrun_register_eviction_policies", "eviction policy", "eviction policies"),
            Kind("admission_filter", "tzrun_register_admission_filters", "admission filter", "admission filters"),
            Kind("command", "tzrun_register_commands", "command", "commands"),
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

    def shown(self) -> str:
        """``'plugin' (distribution version)``, how messages name where it comes from."""
        return f"'{self.plugin}' ({self.distribution} {self.version})" if self.distribution else f"'{self.plugin}'"

    @property
    def qualified(self) -> str:
        """``plugin:name``: the name that picks this entry even when others share its name."""
        return f"{self.plugin}:{self.name}"

    @property
    def builtin(self) -> bool:
        """Whether tzrec-run itself ships it (a first-party ``tzrun_plugins`` component)."""
        return self.distribution is not None and canonical_name(self.distribution) == CORE_DISTRIBUTION

    @property
    def picked_by(self) -> str:
        """``distribution:name`` (``plugin:name`` when registered in code): how a config picks it."""
        return f"{self.distribution}:{self.name}" if self.distribution else self.qualified


class Registry:
    """The components of one kind, by name. Read-only once collected.

    Built-in names are stable: when a third-party plugin registers a name tzrec-run's own
    plugins register, the bare name keeps meaning the built-in (installing a plugin never
    changes what a config means), and the third-party one is *shadowed*: picked only by a
    qualified name. A name that several third-party plugins register (and no built-in) is a
    *clash*: it is kept, shown by ``tzrec-run plugins``, and is an error only for a config that
    names it without saying which plugin's it means. ``"plugin:name"`` (the plugin's
    entry-point name, e.g. ``"tzrun_contrib_optimizers:lion"``) or ``"distribution:name"``
    (``"tzrun-contrib-optimizers:lion"``) picks one, clash or not.
    """

    def __init__(self, kind: Kind, entries: Iterable[Entry]) -> None:
        self.kind = kind.key
        self.label = kind.label
        self.plural = kind.plural
        by_name: dict[str, list[Entry]] = {}
        for entry in entries:
            by_name.setdefault(entry.name, []).append(entry)
        self._all = MappingProxyType({n: tuple(by_name[n]) for n in sorted(by_name)})

    def names(self) -> list[str]:
        """Registered names, sorted (a clashing name once)."""
        return list(self._all)

    def entries(self) -> list[Entry]:
        """Registered entries, sorted by name (every plugin's entry of a clashing name)."""
        return [e for group in self._all.values() for e in group]

    def clashes(self) -> dict[str, tuple[Entry, ...]]:
        """The names several plugins register and a bare name cannot pick (no built-in among
        them), with each plugin's entry."""
        return {name: group for name, group in self._all.items() if len(group) > 1 and _builtin(group) is None}

    def shadowed(self) -> dict[str, tuple[Entry, tuple[Entry, ...]]]:
        """The built-in names that third-party plugins register too: the built-in entry (what
        the bare name means) and the others (picked by ``distribution:name``)."""
        shadowed = {}
        for name, group in self._all.items():
            builtin = _builtin(group)
            if builtin is not None and len(group) > 1:
                shadowed[name] = (builtin, tuple(e for e in group if e is not builtin))
        return shadowed

    def __contains__(self, name: object) -> bool:
        return name in self._all

    def __iter__(self) -> Iterator[str]:
        return iter(self._all)

    def __len__(self) -> int:
        return len(self._all)

    def get(self, name: str, path: str) -> Entry:
        """The entry ``name`` means: a registered name, or ``"qualifier:name"`` with the plugin
        or distribution that registered it.

        Args:
            name: the component name from the config.
            path: the TOML path it was read from, for the error.

        Raises:
            UnknownComponentError: listing the available names and a did-you-mean.
            AmbiguousComponentError: when several plugins, none of them built in, register
                ``name``; it lists them and the qualified names that pick one. (A built-in
                shares its name with third-party plugins: the bare name is the built-in.)
        """
        qualifier, _, bare = name.rpartition(":")
        group = self._all.get(bare)
        if group is None:
            raise UnknownComponentError(self.label, name, path, self._all) from None
        if qualifier:
            picked = [e for e in group if qualifier == e.plugin or (
                e.distribution is not None and canonical_name(qualifier) == canonical_name(e.distribution))]
            if len(picked) != 1:
                offered = [f"{e.plugin}:{bare}" for e in group]
                raise UnknownComponentError(self.label, name, path, offered) from None
            return picked[0]
        if len(group) > 1:
            builtin = _builtin(group)
            if builtin is not None:
                return builtin
            raise AmbiguousComponentError(self.label, bare, path, [(e.plugin, e.shown()) for e in group])
        return group[0]


def _builtin(group: Iterable[Entry]) -> Entry | None:
    """The built-in entry of ``group`` (None when there is none)."""
    return next((e for e in group if e.builtin), None)


def shadow_notes(components: Iterable[tuple[str, str, str]], registries: Registries) -> list[str]:
    """One line per built-in name the config names bare that a third-party plugin registers too.

    Args:
        components: ``(TOML path, kind, type)`` of every component the config names.
        registries: the run's registries.

    Returns:
        Lines such as ``metrics[1].type: 'calibration' is the built-in metric; the one
        'tzrun_calib' (tzrun-calib 1.0) registers is type = "tzrun-calib:calibration"``, each
        shadowed name once.
    """
    notes, seen = [], set()
    for path, kind, name in components:
        shadowed = registries[kind].shadowed().get(name)
        if shadowed is None or (kind, name) in seen:
            continue
        seen.add((kind, name))
        others = " and ".join(f"the one {e.shown()} registers is type = \"{e.picked_by}\"" for e in shadowed[1])
        notes.append(f"{path}.type: '{name}' is the built-in {registries[kind].label}; {others}")
    return notes


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

    One rule for a plugin whose registration is broken (its hook raises, or it registers a
    malformed name, options class or keyword): the plugin is disabled (its components in every
    kind and its lifecycle hooks) with a warning that names it and the fix, recorded in
    ``pm.load_failures``, and the other plugins' components are collected; in strict mode it is
    an error with the full traceback. Two plugins registering one name are not an error here:
    see :meth:`Registry.get`.

    Args:
        pm: the run's plugin manager.

    Returns:
        Immutable registries, one per kind.

    Raises:
        PluginLoadError: in strict mode (``pm.strict``), for a broken plugin.
    """
    collected: dict[str, list[Entry]] = {key: [] for key in KINDS}
    broken: dict[str, tuple[str, BaseException]] = {}
    for kind in KINDS.values():
        for impl in getattr(pm.hook, kind.hook).get_hookimpls():  # registration order
            plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
            if plugin_name in broken:
                continue
            dist, version = pm.origin(plugin_name)
            register = _Registrar(kind, plugin_name, dist, version, pm)
            try:
                impl.function(register=register)
            except PluginError as exc:
                broken[plugin_name] = (str(exc), exc)
            except Exception as exc:
                broken[plugin_name] = (f"its {kind.hook} raised {type(exc).__name__}: {exc}", exc)
            else:
                collected[kind.key].extend(register.added)
    for plugin_name, (error, exc) in broken.items():
        dist, version = pm.origin(plugin_name)
        plugin = pm.get_plugin(plugin_name)
        if plugin is not None:
            pm.forget(plugin)
        report_failure(pm, PluginLoadFailure(plugin_name, dist, version, error, "registration"), exc)
    registries = {
        key: Registry(KINDS[key], [e for e in entries if e.plugin not in broken]) for key, entries in collected.items()
    }
    return Registries(MappingProxyType(registries))


class _Registrar:
    """The ``register`` callback handed to one hookimpl for one kind."""

    def __init__(
        self,
        kind: Kind,
        plugin: str,
        distribution: str | None,
        version: str | None,
        pm: PluginManager,
    ) -> None:
        self._kind, self._plugin = kind, plugin
        self._dist, self._version = distribution, version
        self._pm = pm
        self.added: list[Entry] = []

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
        pattern = _COMMAND_NAME if kind.key == "command" else _NAME
        if not isinstance(name, str) or not pattern.match(name):
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
        if extras.get("labels") is not None and extras["labels"] not in LABEL_DOMAINS:
            raise PluginError(
                f"plugin {who} registered {kind.label} '{name}' with labels={extras['labels']!r}; "
                f"use one of {', '.join(map(repr, LABEL_DOMAINS))} (or leave it unset)"
            )
        if any(e.name == name for e in self.added):
            raise PluginError(f"plugin {who} registered {kind.label} '{name}' twice: register each name once")
        self.added.append(Entry(
            kind=kind.key,
            name=name,
            config=config,
            build=build,
            description=description,
            plugin=self._plugin,
            distribution=self._dist,
            version=self._version,
            extras=MappingProxyType({**kind.extras, **extras}),
        ))
