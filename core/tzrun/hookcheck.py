"""Checks of a plugin object's hook implementations against tzrec-run's hookspecs.

pluggy itself ignores a method that lacks the ``@tzrun.hookimpl`` marker, accepts a hook name
that has no hookspec, and complains about a wrong argument name only when the plugin is
registered, which for a stage is in the middle of a run. :func:`hook_problems` finds all three
at once, so that entry points are checked when they load and stages when ``tzrec-run check``
builds them.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from tzrun import hookspecs
from tzrun.errors import did_you_mean

__all__ = ["hook_problems", "known_hooks"]

_PREFIX = f"{hookspecs.PROJECT_NAME}_"
_MARKER = f"{hookspecs.PROJECT_NAME}_impl"


def known_hooks() -> dict[str, tuple[str, ...]]:
    """Every hook tzrec-run defines, with the argument names its hookspec takes."""
    return {
        name: tuple(inspect.signature(fn).parameters)
        for name, fn in vars(hookspecs).items()
        if name.startswith(_PREFIX) and callable(fn) and hasattr(fn, f"{hookspecs.PROJECT_NAME}_spec")
    }


def _required_arguments(fn: Callable[..., Any]) -> list[str]:
    """The arguments pluggy passes by name: those without a default (``self`` excluded for a
    bound method)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                       inspect.Parameter.KEYWORD_ONLY)
    ]


def _members(plugin: object) -> list[tuple[str, Any]]:
    """``(attribute, value)`` of every callable that is marked or named like a hook; for a
    module, only the functions it defines itself."""
    module = plugin.__name__ if inspect.ismodule(plugin) else None
    found = []
    for attr in sorted(dir(plugin)):
        if attr.startswith("__"):
            continue
        try:
            value = getattr(plugin, attr)
        except Exception:  # a property that raises is not a hook
            continue
        if not callable(value) or inspect.isclass(value):
            continue
        marked = getattr(value, _MARKER, None) is not None
        if not marked and not attr.startswith(_PREFIX):
            continue
        if module is not None and not marked and getattr(value, "__module__", module) != module:
            continue
        found.append((attr, value))
    return found


def hook_problems(plugin: object, where: str, known: Mapping[str, tuple[str, ...]] | None = None) -> list[str]:
    """What is wrong with ``plugin``'s hook implementations, one sentence each.

    Args:
        plugin: a module, class instance or any object with hookimpls.
        where: how the sentences name the plugin (``"plugin 'x' (tzrun-x 1.0)"``).
        known: the hooks and their argument names (default: :func:`known_hooks`).

    Returns:
        One message per problem: a method named ``tzrun_*`` without the marker, an unknown
        hook (with a did-you-mean), an argument the hookspec does not have. Empty when all is well.
    """
    known = known_hooks() if known is None else known
    problems = []
    for attr, fn in _members(plugin):
        opts = getattr(fn, _MARKER, None)
        if opts is None:
            problems.append(
                f"{where}: {attr} has no @tzrun.hookimpl marker, so tzrec-run never calls it; "
                f"mark it with @tzrun.hookimpl (or rename it if it is not meant as a hook)"
            )
            continue
        hook = (opts.get("specname") if isinstance(opts, dict) else None) or attr
        if hook not in known:
            if isinstance(opts, dict) and opts.get("optionalhook"):
                continue
            guess = did_you_mean(hook, known)
            hint = f"did you mean {guess}?" if guess else "the hooks are listed in tzrun.hookspecs"
            problems.append(f"{where}: unknown hook {hook} ({hint})")
            continue
        wrong = [a for a in _required_arguments(fn) if a not in known[hook]]
        if wrong:
            problems.append(
                f"{where}: wrong argument(s) {', '.join(repr(a) for a in wrong)} in {hook}: "
                f"its hookspec takes {', '.join(known[hook])} (a hookimpl may take any of them, by name)"
            )
    return problems
