"""``tzrec-run`` subcommands that plugins register (``tzrun_register_commands``).

A command is an attrs class of options and a function: each field becomes an argument of the
command's parser (see :func:`tzrun.hookspecs.tzrun_register_commands`), the parsed values are
structured into the class, and ``build(options)`` runs. The plugin manager is made only when
the command line names a command tzrec-run does not ship (or asks for the list), so the
built-in commands start as fast as before.
"""

from __future__ import annotations

import argparse
import logging
import types
import typing
from typing import Any, Sequence

import attrs

__all__ = ["plugin_commands", "add_plugin_commands", "run_plugin_command", "names_no_command_of_ours", "command_of"]

log = logging.getLogger("tzrun")

_ENTRY = "_tzrun_plugin_command"


def plugin_commands() -> list[Any]:
    """The registered commands (registry entries), from the installed plugins."""
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    return list(collect_registries(make_plugin_manager())["command"].entries())


def add_plugin_commands(sub: Any, entries: Sequence[Any], builtin: Sequence[str]) -> None:
    """Add a parser per command of ``entries`` to the subparsers ``sub``; a command whose name is
    one of ``builtin`` (or taken by another plugin's) is left out with a warning naming it. A
    name of two words (``"ckpt apply_deltas"``) is a sub-command of that command group."""
    taken = set(builtin)
    for entry in entries:
        group, _, leaf = entry.name.rpartition(" ")
        target, name = sub, leaf.replace("_", "-")
        if group:
            target = _group(sub, group.replace("_", "-"))
            if target is None:
                log.warning("plugin %s registers the command '%s' in the group '%s', which tzrec-run does not have; "
                            "it is left out", entry.shown(), name, group)
                continue
        shown = f"{group.replace('_', '-')} {name}" if group else name
        if shown in taken or (group and name in target.choices):
            log.warning("plugin %s registers the command '%s', which tzrec-run or another plugin already has; "
                        "it is left out (rename it)", entry.shown(), shown)
            continue
        taken.add(shown)
        try:
            attrs.resolve_types(entry.config)  # string annotations (from __future__ import annotations) to types
        except Exception:  # noqa: BLE001 - an annotation that does not resolve: its field takes a string
            pass
        parser = target.add_parser(name, help=f"{entry.description or name} [plugin {entry.plugin}]")
        for field in attrs.fields(entry.config):
            _add_option(parser, field)
        parser.set_defaults(**{_ENTRY: entry})


def _group(sub: Any, name: str) -> Any:
    """The subparsers of the command group ``name`` of ``sub`` (None when there is none)."""
    parser = sub.choices.get(name)
    if parser is None or parser._subparsers is None:
        return None
    return next(a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))


def _add_option(parser: argparse.ArgumentParser, field: Any) -> None:
    """One argument for an attrs field (see :func:`tzrun.hookspecs.tzrun_register_commands`)."""
    kind = _plain(field.type)
    helptext = field.metadata.get("help")
    shown = {"metavar": field.metadata["metavar"]} if "metavar" in field.metadata else {}
    if field.metadata.get("positional"):
        parser.add_argument(field.name, type=kind if kind in (int, float) else None, help=helptext,
                            **({"nargs": "?", "default": field.default} if field.default is not attrs.NOTHING else {}),
                            **shown)
        return
    flag = field.metadata.get("flag") or "--" + field.name.replace("_", "-")
    required = field.default is attrs.NOTHING
    if kind is bool:
        parser.add_argument(flag, dest=field.name, action="store_true" if not field.default else "store_false", help=helptext)
    elif kind is tuple:
        parser.add_argument(flag, dest=field.name, action="append", required=required, help=helptext, **shown)
    else:
        default = None if required or isinstance(field.default, attrs.Factory) else field.default  # type: ignore[arg-type]
        parser.add_argument(flag, dest=field.name, type=kind if kind in (int, float) else None, required=required,
                            default=default, help=helptext, **shown)


def _plain(annotation: Any) -> Any:
    """``int``, ``float``, ``bool``, ``tuple`` or ``str`` for a field's annotation (``X | None`` is ``X``)."""
    if isinstance(annotation, str):
        annotation = {"int": int, "float": float, "bool": bool}.get(annotation.split("|")[0].strip(),
                                                                    tuple if annotation.startswith("tuple") else str)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        origin = typing.get_origin(annotation)
    if annotation is tuple or origin is tuple:
        return tuple
    return annotation if annotation in (int, float, bool) else str


def run_plugin_command(args: argparse.Namespace) -> int | None:
    """Run the plugin command ``args`` names (None when they name none)."""
    entry = getattr(args, _ENTRY, None)
    if entry is None:
        return None
    values = {}
    for field in attrs.fields(entry.config):
        value = getattr(args, field.name)
        if value is None and field.default is not attrs.NOTHING:
            continue  # an option left out: the class's default
        values[field.name] = tuple(value) if isinstance(value, list) else value
    code = entry.build(entry.config(**values))
    return 0 if code is None else int(code)


def names_no_command_of_ours(parser: argparse.ArgumentParser, argv: Sequence[str]) -> bool:
    """Whether ``argv`` names a command tzrec-run does not ship, or none (``--help``), or a
    sub-command a group of ours does not have (``ckpt apply-deltas``): then the plugins'
    commands are loaded, and only then."""
    sub = next(a for a in parser._subparsers._group_actions)  # type: ignore[union-attr]
    words = _words(argv)
    if not words or words[0] not in sub.choices:
        return True
    group = _group(sub, words[0])
    return group is not None and (len(words) < 2 or words[1] not in group.choices)


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is neither an option nor the value of
    ``--log-level`` (the one global option that takes a value)."""
    words = _words(argv)
    return words[0] if words else None


def _words(argv: Sequence[str]) -> list[str]:
    """The words of ``argv`` that are neither options nor the value of ``--log-level``."""
    return [token for i, token in enumerate(argv)
            if not token.startswith("-") and (i == 0 or argv[i - 1] != "--log-level")]
