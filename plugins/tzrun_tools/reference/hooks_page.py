"""``reference/hooks.md``: every hookspec of :mod:`tzrun.hookspecs`, in the order it defines them."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from tzrun import hookspecs, interfaces
from tzrun_tools.reference.config_page import GENERATED, kind_page
from tzrun_tools.reference.docstrings import code_span, docstring_markdown
from tzrun_tools.reference.fields import Written, toml_value
from tzrun.kernel.registry import KINDS

__all__ = ["hooks_reference"]


def _hookspecs() -> list[tuple[str, Callable[..., Any], Mapping[str, Any]]]:
    marker = f"{hookspecs.hookspec.project_name}_spec"
    return [(name, fn, getattr(fn, marker)) for name, fn in vars(hookspecs).items()
            if inspect.isfunction(fn) and isinstance(getattr(fn, marker, None), dict)]


def _signature(name: str, fn: Callable[..., Any], skip_self: bool = False) -> str:
    sig = inspect.signature(fn)
    params = [p.replace(annotation=Written(p.annotation)) if isinstance(p.annotation, str) else p
              for p in sig.parameters.values() if not (skip_self and p.name == "self")]
    ret = sig.return_annotation
    sig = sig.replace(parameters=params, return_annotation=Written(ret) if isinstance(ret, str) else ret)
    return f"def {name}{sig}"


def hooks_reference() -> str:
    """The hook reference page (``reference/hooks.md``), as Markdown.

    The module docstring of :mod:`tzrun.hookspecs` (the training loop as pseudocode), the
    ``register`` callback and what it accepts per kind, then every hookspec (every function
    carrying pluggy's ``HookspecMarker`` options for tzrec-run's project name) in definition
    order, registration hooks (those taking ``register``) first, each with its signature as
    written, its ``firstresult``/``historic`` options when set, and its docstring.
    """
    specs = _hookspecs()
    names = {name for name, _, _ in specs}

    def link(target: str) -> str | None:
        short = target.rsplit(".", 1)[-1]
        return f"#{short}" if short in names else None

    out = [GENERATED, "# Hooks\n",
           "Generated from `tzrun.hookspecs`: its module docstring (the training loop with every hook in "
           "place), the `register` callback, then every hookspec in the order the module defines them.\n",
           "## Overview {#overview}\n", docstring_markdown(hookspecs.__doc__, link=link) + "\n"]
    call = interfaces.Register.__call__
    out += ["## The register callback {#register}\n",
            docstring_markdown(interfaces.Register.__doc__) + "\n",
            f"```python\n{_signature('register', call, skip_self=True)}\n```\n",
            "Keyword options per kind, and the keys tzrec-run reads itself from the kind's tables "
            "(a component's config class must not declare them):\n",
            "| Kind | Hook | Extra `register` options (default) | Keys read by tzrec-run |\n| --- | --- | --- | --- |"]
    for kind in KINDS.values():
        extras = ", ".join(f"{code_span(k)} ({code_span(toml_value(v)) if v is not None else 'none'})"
                           for k, v in kind.extras.items()) or "none"
        reserved = ", ".join(code_span(k) for k in sorted(kind.reserved))
        out.append(f"| [{kind.plural}]({kind_page(kind.key)}) | [{code_span(kind.hook)}](#{kind.hook}) | {extras} | {reserved} |")
    groups = [
        ("Registration hooks", "registration-hooks", lambda fn: "register" in inspect.signature(fn).parameters),
        ("Lifecycle hooks", "lifecycle-hooks", lambda fn: "register" not in inspect.signature(fn).parameters),
    ]
    for title, anchor, member in groups:
        out.append(f"\n## {title} {{#{anchor}}}\n")
        for name, fn, opts in specs:
            if not member(fn):
                continue
            out.append(f"### {name} {{#{name}}}\n")
            out.append(f"```python\n{_signature(name, fn)}\n```\n")
            flags = [flag for flag in ("firstresult", "historic") if opts.get(flag)]
            if flags:
                out.append("pluggy options: " + ", ".join(code_span(f) for f in flags) + ".\n")
            out.append(docstring_markdown(fn.__doc__, link=link) + "\n")
    return "\n".join(out)
