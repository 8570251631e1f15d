"""``reference/config.md``: every key of the core schema, walked from ``RunConfig``.

Keys come in attrs field order (as the classes declare them); a field holding components is
documented through its :data:`COMPONENT_SLOTS` entry, which names its kind.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs

from tzrun.config.schema import Component
from tzrun_tools.reference.docstrings import attribute_docs, code_span, doc_cell, docstring_markdown, inline_markdown, table_cell
from tzrun_tools.reference.fields import (
    TABLE_HEAD,
    default_value,
    field_default_cell,
    field_hints,
    field_type_cell,
    item_type,
    table_row,
    toml_value,
    unwrap_optional,
)
from tzrun.config.slots import COMPONENT_SLOTS, Slot
from tzrun.kernel.registry import KINDS

__all__ = ["GENERATED", "Slot", "COMPONENT_SLOTS", "SchemaWalker", "kind_page", "class_intro", "config_markdown"]


GENERATED = "<!-- Generated from the code by tzrun_tools.reference at docs build time; do not edit. -->\n\n"


@attrs.define
class _Section:
    anchor: str
    title: str
    intro: list[str]
    rows: list[str]


def kind_page(kind: str) -> str:
    """The reference page of a component kind, relative to ``reference/``."""
    return f"{kind}.md"


def _kind_link(kind: str, plural: bool = False) -> str:
    label = KINDS[kind].plural if plural else KINDS[kind].label
    return f"[{label}]({kind_page(kind)})"


class SchemaWalker:
    """Walks the attrs classes from :class:`RunConfig`, one section per table."""

    def __init__(self) -> None:
        self.sections: list[_Section] = []

    def table(self, cls: type, path: str, display: str, title: str, intro: list[str],
              head_rows: list[str] | None = None, omit: Mapping[str, str] | None = None) -> None:
        anchor = path or "top-level"
        section = _Section(anchor, title, intro, list(head_rows or []))
        self.sections.append(section)
        docs, hints = attribute_docs(cls), field_hints(cls)
        later: list[Callable[[], None]] = []
        for field in attrs.fields(cls):
            if omit and field.name in omit:
                continue
            key_path = f"{path}.{field.name}" if path else field.name
            key_display = f"{display}.{field.name}" if display else field.name
            hint, _ = unwrap_optional(hints[field.name])
            doc = doc_cell(docs.get(field.name, ""))
            item = item_type(hint)
            target = item if item is not None else hint
            is_array = item is not None
            if target is Component:
                slot = COMPONENT_SLOTS.get(key_path)
                if slot is None:
                    raise ValueError(
                        f"{cls.__qualname__}.{field.name} ({key_path}) holds components but "
                        "tzrun_tools.reference.COMPONENT_SLOTS does not say which kind; add it there"
                    )
                kind = _kind_link(slot.kind)
                type_cell = f"{'array of tables' if is_array else 'table'}: {kind}"
                see = f" See [{code_span(_header(key_path, is_array))}](#{key_path})."
                section.rows.append(table_row(key_display, type_cell, field_default_cell(field), doc + see))
                later.append(lambda f=field, p=key_path, d=key_display, s=slot, a=is_array: self.component(f, p, d, s, a))
            elif isinstance(target, type) and attrs.has(target):
                see = f" See [{code_span(_header(key_path, is_array))}](#{key_path})."
                section.rows.append(table_row(key_display, field_type_cell(field, hint), field_default_cell(field), doc + see))
                later.append(lambda t=target, p=key_path, d=key_display, a=is_array: self.table(
                    t, p, d + ("[]" if a else ""), _header(p, a), class_intro(t)))
            else:
                section.rows.append(table_row(key_display, field_type_cell(field, hint), field_default_cell(field), doc))
        for step in later:
            step()

    def component(self, field: Any, path: str, display: str, slot: Slot, is_array: bool) -> None:
        kind = KINDS[slot.kind]
        display = display + ("[]" if is_array else "")
        intro = [
            f"A component table: `type` names one of the {_kind_link(slot.kind, plural=True)}, and the "
            f"table's other keys are the options of that {kind.label}, listed on its page."
        ]
        default = default_value(field)
        type_default = (code_span(toml_value(default.type)) if isinstance(default, Component) and not is_array
                        else "required")
        head = [table_row(f"{display}.type", "string", type_default, table_cell(f"the registered name of the {kind.label}."))]
        if slot.fields is None:
            self.sections.append(_Section(path, _header(path, is_array), intro, head))
            return
        intro.append(inline_markdown(f"tzrec-run itself reads the keys below from this table ({code_span(slot.fields.__name__)})."))
        for name, why in slot.omit.items():
            intro.append(inline_markdown(f"``{name}`` is refused here: {why}."))
        self.table(slot.fields, path, display, _header(path, is_array), intro, head, slot.omit)


def _header(path: str, is_array: bool) -> str:
    return f"[[{path}]]" if is_array else f"[{path}]"


def class_intro(cls: type) -> list[str]:
    """The docstring of ``cls`` as Markdown paragraphs for a section's intro (none when it has none)."""
    text = docstring_markdown(cls.__doc__)
    return [text] if text else []


def config_markdown(walker: SchemaWalker) -> str:
    """``reference/config.md``: a section per table the walker visited."""
    out = [
        GENERATED,
        "# Configuration keys\n",
        "Every key of the core TOML schema (`tzrun.config.schema`), generated from the code. "
        "A key path with `[]` is a key of every item of an array of tables (`--set` takes an "
        "index: `features.sparse[0].num_buckets=100`). A component table's own options depend on its "
        "`type` and are listed on the page of its kind (see [the reference index](index.md)). "
        "Unknown keys are errors.\n",
    ]
    for section in walker.sections:
        out.append(f"## {code_span(section.title) if section.anchor != 'top-level' else section.title} {{#{section.anchor}}}\n")
        out.extend(f"{p}\n" for p in section.intro)
        if section.rows:
            out.append(TABLE_HEAD)
            out.extend(section.rows)
            out.append("")
    return "\n".join(out)
