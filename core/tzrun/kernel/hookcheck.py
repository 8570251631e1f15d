"""Checks of a plugin object's hook implementations against tzrec-run's hookspecs.

pluggy itself ignores a method that lacks the ``@tzrun.hookimpl`` marker, accepts a hook name
that has no hookspec, and complains about a wrong argument name only when the plugin is
registered, which for a stage is in the middle of a run. :func:`hook_problems` finds all three
at once, so that entry points are checked when they load and stages when ``tzrec-run check``
builds them.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Mapping

from tzrun import hookspecs
from tzrun.errors import did_you_mean

__all__ = ["hook_problems", "known_hooks", "suggest_hook"]

_PREFIX = f"{hookspecs.PROJECT_NAME}_"
_MARKER = f"{hookspecs.PROJECT_NAME}_impl"


def known_hooks() -> dict[str, tuple[str, ...]]:
    """Every hook tzrec-run defines, with the argument names its hookspec takes."""
    return dict(_known_hooks())


@functools.cache
def _known_hooks() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The hookspecs' names and arguments, read once (they are this module's import's)."""
    return tuple(
        (name, tuple(inspect.signature(fn).parameters))
        for name, fn in vars(hookspecs).items()
        if name.startswith(_PREFIX) and callable(fn) and hasattr(fn, f"{hookspecs.PROJECT_NAME}_spec")
    )


#: what other frameworks call an event (Lightning, Keras, HF Trainer), by the word of ours it means
_WORDS = {"fit": "train", "training": "train", "batch": "train_step", "step": "train_step", "train_batch": "train_step",
          "validation": "eval", "validate": "eval", "evaluation": "eval", "evaluate": "eval", "save": "checkpoint_save",
          "save_checkpoint": "checkpoint_save", "checkpoint": "checkpoint_save", "load": "checkpoint_load",
          "load_checkpoint": "checkpoint_load", "log": "train_log"}
#: events whose names no rule below maps
_SYNONYMS = {"on_exception": "on_train_error", "on_error": "on_train_error", "on_train_exception": "on_train_error",
             "on_train_failure": "on_train_error", "teardown": "after_train", "setup": "before_train"}


def _synonym(event: str, known: Mapping[str, tuple[str, ...]]) -> str | None:
    """The hook ``event`` (without the ``tzrun_`` prefix) means in another framework's words:
    ``on_X_end``/``after_X`` is our ``after_X``, ``on_X_start``/``on_X_begin`` our ``before_X``
    (or the other one, when only it exists: ``after_checkpoint_save`` is ``before_checkpoint_save``)."""
    if event in _SYNONYMS:
        return _PREFIX + _SYNONYMS[event]
    for head in ("on_", "after_", "before_"):
        if not event.startswith(head):
            continue
        rest, when = event[len(head):], head if head != "on_" else ""
        for tail, tail_when in (("_end", "after_"), ("_start", "before_"), ("_begin", "before_")):
            if rest.endswith(tail):
                rest, when = rest[:-len(tail)], when or tail_when
                break
        word = _WORDS.get(rest, rest)
        for side in dict.fromkeys([when or "after_", "after_", "before_"]):
            if f"{_PREFIX}{side}{word}" in known:
                return f"{_PREFIX}{side}{word}"
    return None


def suggest_hook(name: str, known: Mapping[str, tuple[str, ...]]) -> str | None:
    """The hook ``name`` most likely means: the one another framework's name for the event maps
    to (``tzrun_on_train_end`` is ``tzrun_after_train``), else the closest spelling."""
    event = name[len(_PREFIX):] if name.startswith(_PREFIX) else name
    return _synonym(event, known) or did_you_mean(name, known)


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
            guess = suggest_hook(hook, known)
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
