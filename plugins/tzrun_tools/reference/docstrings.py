"""Class docstrings as documentation: the Google-style ``Attributes:`` section, and RST as Markdown.

Key documentation comes from the ``Attributes:`` section of each class docstring (or, failing
that, an attribute docstring below the field), inherited along the class's MRO.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import Callable

import attrs

__all__ = [
    "parse_attributes",
    "attribute_docs",
    "docstring_problems",
    "docstring_markdown",
    "code_span",
    "inline_markdown",
    "table_cell",
    "doc_cell",
]

_ENTRY = re.compile(r"^(?P<names>[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?:\([^)]*\))?\s*:(?:\s+(?P<text>.*))?$")


def _attribute_entries(doc: str | None) -> list[tuple[str, str]]:
    """``(name, text)`` per name of the ``Attributes:`` section, in order, duplicates kept."""
    lines = inspect.cleandoc(doc or "").splitlines()
    entries: list[tuple[list[str], list[str]]] = []
    base: int | None = None
    entry_indent: int | None = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if base is None:
            if line.strip() == "Attributes:":
                base, entry_indent = indent, None
            continue
        if not line.strip():
            if entries:
                entries[-1][1].append("")
            continue
        if indent <= base:
            break
        match = _ENTRY.match(line.strip())
        if entry_indent is None:
            entry_indent = indent
        if indent <= entry_indent and match:
            names = [n.strip() for n in match.group("names").split(",")]
            entries.append((names, [match.group("text") or ""]))
        elif entries:
            entries[-1][1].append(line.strip())
    out = []
    for names, text in entries:
        paragraphs = " ".join(line or "\0" for line in text).split("\0")
        joined = " \n".join(" ".join(p.split()) for p in paragraphs if p.strip())
        out.extend((name, joined) for name in names)
    return out


def parse_attributes(doc: str | None) -> dict[str, str]:
    """The Google-style ``Attributes:`` section of a docstring, by attribute name.

    An entry is ``name: text`` (or ``a, b: text`` for several names, or ``name (type): text``)
    at the section's first indentation; more indented lines continue it, and a blank line
    inside an entry starts a new paragraph (kept as ``" \\n"``). The section ends at a line
    indented no deeper than ``Attributes:``. A name documented twice keeps its first text.

    Args:
        doc: a docstring, as ``__doc__`` gives it.

    Returns:
        The text of every documented attribute, continuation lines joined with spaces.
    """
    docs: dict[str, str] = {}
    for name, text in _attribute_entries(doc):
        docs.setdefault(name, text)
    return docs


def _field_docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right after a field's annotated assignment), the
    other convention Sphinx reads; some plugins document their options this way."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            paragraphs = inspect.cleandoc(after.value.value).split("\n\n")
            docs[node.target.id] = " \n".join(" ".join(p.split()) for p in paragraphs if p.strip())
    return docs


def attribute_docs(cls: type) -> dict[str, str]:
    """The documentation of every attribute of ``cls``: its ``Attributes:`` section (see
    :func:`parse_attributes`), else an attribute docstring below the field, each name taken
    from the nearest class of the MRO that documents it."""
    docs: dict[str, str] = {}
    for klass in cls.__mro__:
        if klass is object:
            continue
        own = {**_field_docstrings(klass), **parse_attributes(klass.__dict__.get("__doc__"))}
        for name, text in own.items():
            docs.setdefault(name, text)
    return docs


def docstring_problems(cls: type) -> list[str]:
    """What is wrong with the ``Attributes:`` docs of an attrs class.

    Returns:
        One line per field without a doc (inherited docs count), per name documented twice in
        the class's own docstring, and per documented name that is not a field.
    """
    qualname = f"{cls.__module__}.{cls.__qualname__}"
    fields = [f.name for f in attrs.fields(cls)]
    docs = attribute_docs(cls)
    problems = [f"{qualname}.{name}: no doc in the Attributes: section" for name in fields if not docs.get(name)]
    own = [name for name, _ in _attribute_entries(cls.__dict__.get("__doc__"))]
    problems += [f"{qualname}.{name}: documented twice" for name in dict.fromkeys(own) if own.count(name) > 1]
    problems += [f"{qualname}.{name}: documented but not a field" for name in dict.fromkeys(own) if name not in fields]
    return problems


_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`~?([^`]+)`")
_CODE = re.compile(r"``(.+?)``|`([^`]+)`", re.S)


def code_span(text: str) -> str:
    """``text`` on one line as a Markdown code span (a double-backtick one when it holds a backtick)."""
    text = " ".join(text.split())
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def inline_markdown(text: str, link: Callable[[str], str | None] | None = None) -> str:
    """Inline RST (``code``, :role:`target`) as Markdown; text outside code keeps no raw HTML."""

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        url = link(target) if link else None
        return f"[{code_span(target)}]({url})" if url else f"``{target}``"

    text = _ROLE.sub(role, text)
    out, pos = [], 0
    for match in _CODE.finditer(text):
        out.append(_plain(text[pos:match.start()]))
        out.append(code_span(match.group(1) or match.group(2)))
        pos = match.end()
    out.append(_plain(text[pos:]))
    return "".join(out)


def _plain(text: str) -> str:
    text = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)
    return re.sub(r"(?m)^(\s*)#", r"\1\\#", text)


def table_cell(text: str) -> str:
    """Markdown for a table cell: one line, ``|`` escaped outside code spans (Python-Markdown's
    tables do not split inside code spans, and show a backslash there literally)."""
    text = text.replace(" \n", "<br>").replace("\n", " ")
    out, pos = [], 0
    for match in re.finditer(r"(`+).+?\1", text):
        out.append(text[pos:match.start()].replace("|", "\\|"))
        out.append(match.group(0))
        pos = match.end()
    out.append(text[pos:].replace("|", "\\|"))
    return "".join(out).strip()


def doc_cell(text: str) -> str:
    """Documentation text (inline RST) as a Markdown table cell."""
    return table_cell(inline_markdown(text))


def docstring_markdown(doc: str | None, *, link: Callable[[str], str | None] | None = None,
                       drop_sections: tuple[str, ...] = ("Attributes:",)) -> str:
    """A docstring as Markdown.

    RST literal blocks (a paragraph ending in ``::`` and the indented block after it) become
    fenced code blocks, ````code```` becomes ```code```, ``:role:`target``` becomes code (or a
    link where ``link(target)`` returns a URL), and the Google-style sections named in
    ``drop_sections`` are left out (they are rendered as tables elsewhere).

    Args:
        doc: a docstring, as ``__doc__`` gives it.
        link: maps a role's target to a URL, or None for plain code.
        drop_sections: section headers whose indented body is dropped.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    blocks: list[str] = []
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            blocks.append(inline_markdown("\n".join(paragraph), link))
            paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if line.strip() in drop_sections:
            flush()
            i += 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                i += 1
            continue
        if not line.strip():
            flush()
            i += 1
            continue
        if line.rstrip().endswith("::"):
            intro = line.rstrip()[:-2]
            paragraph.append(intro.rstrip() if intro.endswith(" ") or not intro.strip() else intro + ":")
            flush()
            i += 1
            literal: list[str] = []
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                literal.append(lines[i])
                i += 1
            code = inspect.cleandoc("\n".join(literal))
            blocks.append(f"```text\n{code}\n```")
            continue
        paragraph.append(line.strip())
        i += 1
    flush()
    return "\n\n".join(b for b in blocks if b.strip())
