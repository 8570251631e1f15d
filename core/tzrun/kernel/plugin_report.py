"""What ``tzrec-run plugins`` shows: every plugin with its origin and hooks, each component
with its one-line description and options (type, default), the names several plugins
register, and the plugins that were disabled or failed, with why."""

from __future__ import annotations

from typing import Any

import attrs

from tzrun.kernel.plugins import PluginManager, plugin_infos
from tzrun.kernel.registry import Entry, Registries

__all__ = ["component_options", "plugins_report", "format_plugins_report"]


def _type_text(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def component_options(entry: Entry) -> list[dict[str, Any]]:
    """The TOML options of a component: ``name``, ``type`` (as annotated), ``default`` (TOML
    text; None when the option is required)."""
    from tzrun.config.toml_text import default_value, toml_value

    options = []
    for field in attrs.fields(entry.config):
        value = default_value(field)
        if field.default is attrs.NOTHING:
            default = None
        else:
            default = "computed" if value is attrs.NOTHING else ("unset" if value is None else toml_value(value))
        options.append({"name": field.name, "type": _type_text(field.type), "default": default})
    return options


def _component(entry: Entry, clashing: bool, shadowed: bool) -> dict[str, Any]:
    return {
        "kind": entry.kind,
        "name": entry.name,
        "qualified": entry.qualified,
        "clashes": clashing,
        "shadowed": shadowed,
        "description": entry.description,
        "options": component_options(entry),
    }


def plugins_report(pm: PluginManager, registries: Registries) -> dict[str, Any]:
    """Everything ``tzrec-run plugins`` shows, as JSON-serializable data.

    Returns:
        ``{"plugins": [...], "clashes": [...], "shadowed": [...], "disabled": [...],
        "failed": [...]}``: per plugin its name, distribution, version, hooks, component names
        per kind (``components``) and each component's description and options (``details``);
        per clashing name the kind and the plugins registering it; per built-in name that
        third-party plugins register too, the kind, the built-in's plugin and the others'
        plugins, distributions and the ``distribution:name`` that picks each;
        the entry points the run disabled; the plugins that failed to load or were disabled
        for a broken registration.
    """
    clashes = {(r.kind, name): group for r in registries.all() for name, group in r.clashes().items()}
    shadowed = {(r.kind, name): pair for r in registries.all() for name, pair in r.shadowed().items()}
    plugins = []
    for info in plugin_infos(pm, registries):
        components = [
            _component(e, (e.kind, e.name) in clashes, not e.builtin and (e.kind, e.name) in shadowed)
            for r in registries.all() for e in r.entries() if e.plugin == info.name
        ]
        plugins.append({**info.to_json(), "details": components})
    return {
        "plugins": plugins,
        "clashes": [
            {"kind": kind, "name": name, "plugins": [e.plugin for e in group],
             "distributions": [e.distribution for e in group]}
            for (kind, name), group in sorted(clashes.items())
        ],
        "shadowed": [
            {"kind": kind, "name": name, "builtin": builtin.plugin, "plugins": [e.plugin for e in others],
             "distributions": [e.distribution for e in others], "picked_by": [e.picked_by for e in others]}
            for (kind, name), (builtin, others) in sorted(shadowed.items())
        ],
        "disabled": [d.to_json() for d in pm.disabled],
        "failed": [f.to_json() for f in pm.load_failures],
    }


def _option_text(option: dict[str, Any]) -> str:
    default = "required" if option["default"] is None else f"= {option['default']}"
    return f"{option['name']}: {option['type']} {default}"


def format_plugins_report(report: dict[str, Any], registries: Registries) -> str:
    """The human-readable listing of :func:`plugins_report`."""
    lines = []
    for plugin in report["plugins"]:
        origin = f"{plugin['distribution']} {plugin['version']}" if plugin["distribution"] else "registered in code"
        lines.append(f"{plugin['name']}  ({origin})")
        lines.append(f"  hooks: {', '.join(plugin['hooks'])}")
        for kind, names in plugin["components"].items():
            lines.append(f"  {registries[kind].plural}: {', '.join(names)}")
        for c in plugin["details"]:
            clash = f"  [clash: name it \"{c['qualified']}\"]" if c["clashes"] else ""
            lines.append(f"    {c['name']} ({registries[c['kind']].label}): {c['description'] or 'no description'}{clash}")
            if c["options"]:
                lines.append(f"      options: {'; '.join(_option_text(o) for o in c['options'])}")
    for clash in report["clashes"]:
        label = registries[clash["kind"]].label
        picks = " or ".join(f'type = "{p}:{clash["name"]}"' for p in clash["plugins"])
        lines.append(f"CLASH {label} '{clash['name']}' is registered by {', '.join(clash['plugins'])}: "
                     f"a config that names it must say which, with {picks}")
    for shadow in report["shadowed"]:
        label = registries[shadow["kind"]].label
        picks = " or ".join(f'type = "{p}"' for p in shadow["picked_by"])
        lines.append(f"SHADOWED {label} '{shadow['name']}' is registered by {', '.join(shadow['plugins'])} too: "
                     f"the bare name keeps meaning the built-in ({shadow['builtin']}); pick theirs with {picks}")
    for d in report["disabled"]:
        dist = f" (from {d['distribution']} {d['version']})" if d["distribution"] else ""
        lines.append(f"DISABLED {d['name']}{dist}: by {d['by']}")
    for f in report["failed"]:
        dist = f" (from {f['distribution']} {f['version']})" if f["distribution"] else ""
        lines.append(f"FAILED {f['name']}{dist} [{f['reason']}]: {f['error']}")
    return "\n".join(lines)
