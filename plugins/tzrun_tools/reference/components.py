"""The configuration reference: ``reference/config.md``, a ``reference/<kind>.md`` page per kind
listing its components and their options, and the ``reference/index.md`` of kinds.

Kinds come in :data:`tzrun.kernel.registry.KINDS` order, components sorted by name (the registries' order).
"""

from __future__ import annotations

from typing import Mapping

import attrs

from tzrun.config.schema import Component, RunConfig
from tzrun.kernel.plugins import CORE_DISTRIBUTION, canonical_name
from tzrun_tools.reference.config_page import (
    COMPONENT_SLOTS,
    GENERATED,
    SchemaWalker,
    class_intro,
    config_markdown,
    kind_page,
)
from tzrun_tools.reference.docstrings import attribute_docs, code_span, doc_cell, docstring_markdown, inline_markdown
from tzrun_tools.reference.fields import (
    TABLE_HEAD,
    field_default_cell,
    field_hints,
    field_type_cell,
    item_type,
    table_row,
    unwrap_optional,
)
from tzrun.kernel.registry import KINDS, Entry, Registries, Registry

__all__ = ["config_reference"]


def _option_rows(cls: type, prefix: str = "") -> list[str]:
    rows = []
    docs, hints = attribute_docs(cls), field_hints(cls)
    for field in attrs.fields(cls):
        hint, _ = unwrap_optional(hints[field.name])
        item = item_type(hint)
        target = item if item is not None else hint
        rows.append(table_row(prefix + field.name, field_type_cell(field, hint), field_default_cell(field),
                         doc_cell(docs.get(field.name, ""))))
        if isinstance(target, type) and attrs.has(target) and target is not Component:
            rows.extend(_option_rows(target, f"{prefix}{field.name}{'[]' if item is not None else ''}."))
    return rows


def _origin(entry: Entry) -> str:
    plugin = code_span(entry.plugin)
    if entry.distribution is None:
        return f"Provided by plugin {plugin}, registered in code (no distribution)."
    dist = f"{code_span(entry.distribution)} {entry.version}"
    if canonical_name(entry.distribution) == CORE_DISTRIBUTION:
        return f"Provided by plugin {plugin} from {dist} (first-party, built in)."
    return f"Provided by plugin {plugin} from {dist}: a third-party plugin, installed where these docs were built."


def _extras(entry: Entry) -> list[str]:
    extras = dict(entry.extras)
    lines = []
    if "prediction" in extras:
        lines.append(f"Reads the model output {code_span(str(extras['prediction']))} unless its table sets `prediction`.")
    group = extras.get("group")
    if group == "required":
        lines.append("Groups rows: its table must set `group_by` (the column of the group key).")
    elif group == "optional":
        lines.append("Groups rows when its table sets `group_by` (optional).")
    elif group == "none":
        lines.append("Takes no `group_by`.")
    if extras.get("check") is not None:
        lines.append("Checks its options against the whole config (`tzrec-run check` and before training).")
    if extras.get("outputs") is not None:
        try:  # on an instance with no option set: reading one raises AttributeError
            outputs = extras["outputs"](object.__new__(entry.config))
        except Exception:
            lines.append("Its outputs depend on its options (see its documentation).")
        else:
            lines.append("Outputs: " + ", ".join(code_span(str(o)) for o in outputs) + ".")
    return lines


def _component(entry: Entry) -> str:
    out = [f"## {entry.name} {{#{entry.name.replace(' ', '-')}}}\n"]
    if entry.description:
        out.append(inline_markdown(entry.description) + "\n")
    out.append(_origin(entry) + f" Config class: {code_span(entry.config.__module__ + '.' + entry.config.__qualname__)}.\n")
    body = docstring_markdown(entry.config.__doc__)
    if body:
        out.append(body + "\n")
    extras = _extras(entry)
    if extras:
        out.append(" ".join(extras) + "\n")
    rows = _option_rows(entry.config)
    if rows:
        out.append(TABLE_HEAD.replace("| Key |", "| Option |"))
        out.extend(rows)
        out.append("")
    else:
        out.append("No options besides `type`.\n")
    return "\n".join(out)


def _slots_of(kind: str, titles: Mapping[str, str]) -> list[str]:
    return [f"[{code_span(titles[p])}](config.md#{p})" for p, s in COMPONENT_SLOTS.items() if s.kind == kind]


def _kind_page_text(registry: Registry, titles: Mapping[str, str]) -> str:
    kind = KINDS[registry.kind]
    title = kind.plural[0].upper() + kind.plural[1:]
    title = title.replace("Lr ", "LR ")  # "lr schedules" reads "LR schedules" as a title
    out = [GENERATED, f"# {title}\n"]
    hook = f"[{code_span(kind.hook)}](hooks.md#{kind.hook})"
    out.append(
        f"Every {kind.label} registered through {hook} by the plugins installed where these docs were "
        "built, sorted by name; `tzrec-run plugins` lists those of your environment. "
        f"A config names one by `type` in {', '.join(_slots_of(kind.key, titles))}.\n"
    )
    entries = registry.entries()
    if not entries:
        out.append(f"No {kind.label} is registered.\n")
    out.extend(_component(e) for e in entries)
    return "\n".join(out)


def _index_page(registries: Registries) -> str:
    out = [GENERATED, "# Reference\n",
           "Generated from the code at docs build time: the keys of the core schema, every hook, and "
           "every component registered by the plugins installed where the docs were built.\n",
           "- [Configuration keys](config.md): every key of the core TOML schema.",
           "- [Hooks](hooks.md): every hookspec, with the training loop that calls them.", ""]
    out.append("| Kind | Components |\n| --- | --- |")
    for registry in registries.all():
        kind = KINDS[registry.kind]
        names = ", ".join(f"[{code_span(n)}]({kind_page(kind.key)}#{n.replace(' ', '-')})" for n in registry.names())
        out.append(f"| [{kind.plural}]({kind_page(kind.key)}) | {names or 'none'} |")
    return "\n".join(out) + "\n"


def config_reference(registries: Registries) -> dict[str, str]:
    """The configuration reference pages, as Markdown.

    Args:
        registries: the components to document (``collect_registries`` on a fresh manager).

    Returns:
        Page path relative to the docs directory -> Markdown: ``reference/index.md``,
        ``reference/config.md`` (every core key) and ``reference/<kind>.md`` per kind.

    Raises:
        ValueError: when the schema has a component field that :data:`COMPONENT_SLOTS` lacks.
    """
    walker = SchemaWalker()
    walker.table(RunConfig, "", "", "Top-level keys", class_intro(RunConfig))
    titles = {s.anchor: s.title for s in walker.sections}
    pages = {"reference/index.md": _index_page(registries), "reference/config.md": config_markdown(walker)}
    for registry in registries.all():
        pages[f"reference/{kind_page(registry.kind)}"] = _kind_page_text(registry, titles)
    return pages
