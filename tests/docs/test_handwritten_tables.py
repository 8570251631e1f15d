"""The option tables written by hand in ``docs/**/*.md`` agree with the code.

The reference pages (``reference/*.md``) are generated from the code and cannot drift; the guides
also carry tables of keys with their defaults, and those can. Two table shapes are checked:

* **key tables**: the first column is ``key`` or ``option`` and a column is ``default``. The table
  describes the config class named by its nearest preceding heading: a registered component
  (``### `parquet` ``, ``## deepfm``), a schema table in backticks (``[[features.dense]]``), or
  an entry of :data:`HEADING_TARGETS`. Each backticked key of the first cell must be a key of that
  class (or one the core reads from that kind's tables), and a literal default must equal the
  attrs default. A ``taken by`` column (sparse optimizers) names the components that take a key
  (``all but`` ones must not);
* **options tables**: the first column is ``type`` and a column is ``options (default)``. Each
  row names components of one kind; every ``key`` of the options cell must be one of their keys,
  and a literal in the parentheses after it, ``key`` (0.9, ...), must equal its default.

A default cell is a literal when it is a TOML value (``65536``, ``1e-8``, ``true``, ``"sum"``,
``[256, 128]``, ``{}``, in backticks or not), ``none``/``unset``/``—`` (None) or ``required``
(no default); anything else (`` `name` ``, "the type") is prose and not compared. A trailing
parenthetical (``1e-8 (> 0)``) is a note, not part of the value. A cell of several keys takes one
value for all of them or one per key (``1, 1, 3``).

Any other table with a ``default`` header must be in :data:`UNATTRIBUTED`, with the reason.
"""

from __future__ import annotations

import fnmatch
import math
import re
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Union

import attrs
import pytest

from tzrun.config.schema import Component, RunConfig
from tzrun.kernel.plugins import make_plugin_manager
from tzrun_tools.reference import COMPONENT_SLOTS
from tzrun_tools.reference.fields import field_hints, item_type, unwrap_optional
from tzrun.kernel.registry import KINDS, Registries, collect_registries

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

#: First-column spellings of a key table.
KEY_HEADERS = frozenset({"key", "option"})

#: What a key table documents when its nearest heading names no component and no
#: ``[schema.table]`` (or names one registered in two kinds), by (page, heading): a schema path
#: (``"train.grad_scaler"``), ``"<kind>:<name>"``, or ``"<kind>:*"`` for every component of a kind
#: (a ``taken by`` column then says which of them take each key).
HEADING_TARGETS: Mapping[tuple[str, str], str] = {
    ("stages.md", "`export`"): "stage:export",  # tzrun_serving's stage (its command of that name takes no TOML)
    ("optimizers.md", "Mixed precision and loss scaling"): "train.grad_scaler",
    ("optimizers.md", "Gradient clipping"): "train.grad_clipping",
    ("losses.md", "Losses"): "losses",
    ("sparse_optimizers.md", "Options"): "sparse_optimizer:*",
    # the same [[model.sequence_encoders]] table of dssm and mmoe (one class)
    ("models.md", "Sequence encoders (dssm, mmoe)"): "model:dssm",
    # the tdm section's two tables: the model's options and its sampler's
    ("models.md", "tdm"): "model:tdm",
    ("models.md", "The tdm sampler"): "sampler:tdm",
}

#: Tables with a ``default`` column that describe no config class of tzrec-run, by (page,
#: heading), with the reason. Keep it short: a new entry is a decision, not a workaround.
UNATTRIBUTED: Mapping[tuple[str, str], str] = {}

REQUIRED = attrs.NOTHING


class _Prose:
    """A default cell that is not a literal."""


PROSE = _Prose()
COMPUTED = object()  # an attrs default computed from the instance (Factory(takes_self=True))


@attrs.frozen
class Table:
    page: str
    line: int
    heading: str
    header: list[str]
    rows: list[tuple[int, list[str]]]

    def where(self, line: int | None = None) -> str:
        return f"docs/{self.page}:{line or self.line} (under {self.heading!r})"


@attrs.frozen
class Subject:
    """One documented component or schema table: the classes that hold its keys, and the keys the
    core reads from it without a class to take a default from (``type``)."""

    name: str
    label: str
    classes: tuple[type, ...]
    bare: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------- Markdown


def _cells(line: str) -> list[str]:
    """The cells of a table row (``\\|`` is a pipe inside a cell)."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _tables(path: Path) -> Iterator[Table]:
    """The tables of a page, each with its nearest preceding heading (fenced code ignored)."""
    page = path.relative_to(DOCS).as_posix()
    heading, fence, block = "", None, []

    def flush() -> Iterator[Table]:
        if len(block) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", block[1][1].replace(" ", "")):
            yield Table(page, block[0][0], heading, [c.lower() for c in _cells(block[0][1])],
                        [(n, _cells(text)) for n, text in block[2:]])
        block.clear()

    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if fence:
            fence = None if stripped.startswith(fence) else fence
            continue
        if stripped.startswith(("```", "~~~")):
            yield from flush()
            fence = stripped[:3]
            continue
        if stripped.startswith("|"):
            block.append((n, stripped))
            continue
        yield from flush()
        if re.match(r"#{1,6} ", stripped):
            heading = re.sub(r"\s*\{#[^}]*\}$", "", stripped.lstrip("#").strip())
    yield from flush()


def _spans(text: str) -> list[str]:
    """The code spans of a cell, in order."""
    return re.findall(r"`([^`]+)`", text)


def _split_top(text: str, seps: str = ",") -> list[str]:
    """``text`` split at ``seps`` outside brackets, braces, quotes and code spans."""
    parts, depth, quote, tick, start = [], 0, "", False, 0
    for i, ch in enumerate(text):
        if ch == "`":
            tick = not tick
        elif tick:
            continue
        elif quote:
            quote = "" if ch == quote and text[i - 1] != "\\" else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch in seps and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


# ---------------------------------------------------------------------------- values


def _literal(text: str) -> Any:
    """A default as written: a Python value, None, :data:`REQUIRED`, or :data:`PROSE`."""
    text = text.strip()
    if text.lower() in ("none", "unset", "—", "-"):
        return None
    if text.lower() == "required":
        return REQUIRED
    whole = re.fullmatch(r"`([^`]+)`", text)
    if whole:
        text = whole.group(1)
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return PROSE


def _defaults(cell: str, count: int) -> list[Any]:
    """The defaults a cell gives to ``count`` keys (one for all, or one each); prose as PROSE."""
    cell = cell.split(" (", 1)[0] if " (" in cell and not cell.startswith("(") else cell
    parts = _split_top(cell)
    if count > 1 and len(parts) == count:
        return [_literal(p) for p in parts]
    return [_literal(cell)] * count


def _same(doc: Any, code: Any) -> bool:
    if doc is REQUIRED or code is REQUIRED or doc is None or code is None or code is COMPUTED:
        return doc is code
    if isinstance(doc, bool) or isinstance(code, bool):
        return type(doc) is type(code) and doc == code
    if isinstance(doc, (int, float)) and isinstance(code, (int, float)):
        return doc == code or (math.isnan(doc) and math.isnan(code))
    if isinstance(doc, list) and isinstance(code, (list, tuple)):
        return len(doc) == len(code) and all(_same(d, c) for d, c in zip(doc, code))
    if isinstance(doc, dict) and isinstance(code, Mapping):
        return doc.keys() == code.keys() and all(_same(doc[k], code[k]) for k in doc)
    return type(doc) is type(code) and doc == code


def _shown(value: Any) -> str:
    names = {id(REQUIRED): "required", id(COMPUTED): "computed", id(None): "unset"}
    return names.get(id(value), repr(value))


def _code_default(field: attrs.Attribute) -> Any:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return COMPUTED if default.takes_self else default.factory()
    return default


# ---------------------------------------------------------------------------- the code side


def _attrs_target(hint: Any) -> Optional[type]:
    hint, _ = unwrap_optional(hint)
    hint = item_type(hint) or hint
    hint, _ = unwrap_optional(hint)
    return hint if isinstance(hint, type) and (attrs.has(hint) or hint is Component) else None


def _core_classes(kind: str) -> tuple[type, ...]:
    """The classes of the keys the core reads from a kind's tables (``LossFields``, ...)."""
    out: list[type] = []
    for slot in COMPONENT_SLOTS.values():
        if slot.kind == kind and slot.fields is not None and slot.fields not in out:
            out.append(slot.fields)
    return tuple(out)


def _component(registries: Registries, kind: str, name: str) -> Subject:
    entry = registries[kind].get(name, f"docs table of {kind}")
    return Subject(name, f"{KINDS[kind].label} `{name}`", (entry.config, *_core_classes(kind)),
                   KINDS[kind].reserved)


def _schema_subject(path: str) -> Subject:
    """The subject of a schema table (``train.grad_scaler``, ``features.dense``, ``losses``)."""
    cls: type = RunConfig
    walked: list[str] = []
    for part in path.split("."):
        fields = attrs.fields_dict(cls)
        assert part in fields, f"{'.'.join(walked) or 'the top level'} has no key {part!r} ({path!r})"
        walked.append(part)
        target = _attrs_target(field_hints(cls)[part])
        assert target is not None, f"{'.'.join(walked)} is not a table"
        if target is Component:
            slot = COMPONENT_SLOTS[".".join(walked)]
            assert slot.fields is not None and ".".join(walked) == path, f"{path}: a component's own options"
            bare = KINDS[slot.kind].reserved - set(slot.omit)
            return Subject(path, f"`{path}`", (slot.fields,), frozenset(bare))
        cls = target
    return Subject(path, f"`{path}`", (cls,))


def _find(subject: Subject, key: str) -> Union[attrs.Attribute, str, None]:
    """The attrs field of ``key`` (``tasks[i].name`` walks into ``tasks``), ``"bare"`` for a key
    the core reads without a class, or None when the subject has no such key."""
    parts = [re.sub(r"\[[^\]]*\]$", "", p) for p in key.split(".")]
    for cls in subject.classes:
        field: Optional[attrs.Attribute] = None
        current: Optional[type] = cls
        for part in parts:
            if current is None or not attrs.has(current) or part not in attrs.fields_dict(current):
                field = None
                break
            field = attrs.fields_dict(current)[part]
            current = _attrs_target(field_hints(current)[part])
        if field is not None:
            return field
    return "bare" if len(parts) == 1 and parts[0] in subject.bare else None


def _check_key(subjects: list[Subject], key: str, doc: Any, where: str, every: bool = True) -> list[str]:
    """Problems of one documented key and default against ``subjects`` (each must have the key
    when ``every``, else at least one)."""
    problems, found = [], 0
    for subject in subjects:
        field = _find(subject, key)
        if field is None:
            if every:
                problems.append(f"{where}: `{key}` is not a key of {subject.label}")
            continue
        found += 1
        if isinstance(field, str) or doc is PROSE:
            continue
        code = _code_default(field)
        if not _same(doc, code):
            problems.append(f"{where}: `{key}` of {subject.label} defaults to {_shown(code)}, "
                            f"the table says {_shown(doc)}")
    if not every and not found:
        problems.append(f"{where}: `{key}` is a key of none of {', '.join(s.label for s in subjects)}")
    return problems


# ---------------------------------------------------------------------------- attribution


def _heading_subjects(table: Table, registries: Registries) -> Optional[list[Subject]]:
    """What a key table documents, from its heading; None when the heading names nothing."""
    target = HEADING_TARGETS.get((table.page, table.heading))
    if target is not None:
        if ":" in target:
            kind, name = target.split(":")
            return [_component(registries, kind, n) for n in (registries[kind] if name == "*" else [name])]
        return [_schema_subject(target)]
    spans = _spans(table.heading)
    schema = [s for s in spans if re.fullmatch(r"\[\[?[\w.]+\]\]?", s)]
    if schema:
        return [_schema_subject(s.strip("[]")) for s in schema]
    subjects = []
    for name in spans or [table.heading]:
        kinds = [k for k in KINDS if name in registries[k]]
        assert len(kinds) <= 1, (
            f"{table.where()}: {name!r} is a {' and a '.join(kinds)}; say which in HEADING_TARGETS")
        subjects += [_component(registries, kinds[0], name)] if kinds else []
    return subjects or None


def _options_kind(table: Table, registries: Registries) -> str:
    """The one kind that holds every component an options table names in its first column."""
    names = {n for _, row in table.rows for n in _spans(row[0])}
    kinds = [k for k in KINDS if names and all(n in registries[k] for n in names)]
    assert len(kinds) == 1, (
        f"{table.where()}: the types {sorted(names)} are registered together in "
        f"{kinds or 'no kind'}; an options table must name components of exactly one kind")
    return kinds[0]


# ---------------------------------------------------------------------------- the checks


@pytest.fixture(scope="module")
def registries() -> Registries:
    return collect_registries(make_plugin_manager())


@pytest.fixture(scope="module")
def default_tables() -> list[Table]:
    """Every table of the docs with a ``default`` column (``default``, ``options (default)``)."""
    tables = [t for path in sorted(DOCS.rglob("*.md")) for t in _tables(path)]
    return [t for t in tables if any(re.search(r"\bdefault\b", h) for h in t.header)]


def _is_key_table(table: Table) -> bool:
    return table.header[0] in KEY_HEADERS and "default" in table.header


def _is_options_table(table: Table) -> bool:
    return table.header[0] == "type" and "options (default)" in table.header


def _check_key_table(table: Table, subjects: list[Subject]) -> tuple[list[str], int]:
    col = table.header.index("default")
    taken_col = table.header.index("taken by") if "taken by" in table.header else None
    every = taken_col is None
    problems, checked = [], 0
    for line, row in table.rows:
        where = table.where(line)
        keys = _spans(row[0])
        if not keys:
            problems.append(f"{where}: no `key` in the first cell {row[0]!r}")
            continue
        for key, doc in zip(keys, _defaults(row[col], len(keys))):
            checked += 1
            problems += _check_key(subjects, key, doc, where, every)
            if taken_col is not None:
                problems += _check_taken_by(subjects, key, row[taken_col], where)
    return problems, checked


def _check_taken_by(subjects: list[Subject], key: str, cell: str, where: str) -> list[str]:
    """A ``taken by`` cell: the components it names take the key (``all but`` ones do not)."""
    by_name = {s.name: s for s in subjects}
    problems = []
    for pattern in _spans(cell):
        matched = fnmatch.filter(by_name, pattern)
        if not matched:
            problems.append(f"{where}: taken by `{pattern}`, which names no registered component")
        for name in matched:
            has = _find(by_name[name], key) is not None
            if has == cell.startswith("all but"):
                problems.append(f"{where}: `{key}` is {'' if has else 'not '}a key of `{name}`, "
                                f"the taken-by cell says {cell!r}")
    return problems


def _option_defaults(cell: str) -> Iterator[tuple[str, Any]]:
    """The ``key`` (default, note) pairs of an options cell; a key without parentheses gives PROSE.
    Code spans inside parentheses are notes, not keys."""
    depth, i = 0, 0
    while i < len(cell):
        ch = cell[i]
        if ch == "`":
            end = cell.index("`", i + 1)
            span = cell[i + 1:end]
            i = end + 1
            if depth:
                continue
            rest = cell[i:].lstrip()
            if rest.startswith("("):
                yield span, _literal(_split_top(rest[1:], ",;:)")[0])
            else:
                yield span, PROSE
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        i += 1


def test_every_default_table_is_attributed(registries: Registries, default_tables: list[Table]) -> None:
    """A table with a ``default`` column is a key or options table with a known subject, or is
    allowlisted; every allowlist and HEADING_TARGETS entry still matches a table."""
    problems = []
    for table in default_tables:
        listed = (table.page, table.heading) in UNATTRIBUTED
        if _is_options_table(table):
            _options_kind(table, registries)
        elif not _is_key_table(table):
            if not listed:
                problems.append(f"{table.where()}: header {table.header} has a default column but its first "
                                f"column is not one of {sorted(KEY_HEADERS)}; rename it or add the table to "
                                "UNATTRIBUTED")
        elif _heading_subjects(table, registries) is None and not listed:
            problems.append(f"{table.where()}: the heading names no registered component and no "
                            "`[schema.table]`; add the heading to HEADING_TARGETS, or the table to UNATTRIBUTED "
                            "with the reason")
    headings = {(t.page, t.heading) for t in default_tables}
    for name, listing in (("UNATTRIBUTED", UNATTRIBUTED), ("HEADING_TARGETS", HEADING_TARGETS)):
        problems += [f"{name}: {k} matches no table with a default column" for k in listing if k not in headings]
    assert not problems, "\n".join(problems)


def test_key_tables_match_the_config_classes(registries: Registries, default_tables: list[Table]) -> None:
    problems, tables, rows = [], 0, 0
    for table in default_tables:
        if not _is_key_table(table) or (table.page, table.heading) in UNATTRIBUTED:
            continue
        subjects = _heading_subjects(table, registries)
        if subjects is None:
            continue  # reported by test_every_default_table_is_attributed
        found, checked = _check_key_table(table, subjects)
        problems += found
        tables, rows = tables + 1, rows + checked
    assert tables >= 20 and rows >= 90, f"only {tables} key tables, {rows} keys found: is the parser broken?"
    assert not problems, "\n".join(problems)


def test_options_tables_match_the_config_classes(registries: Registries, default_tables: list[Table]) -> None:
    problems, tables, keys = [], 0, 0
    for table in default_tables:
        if not _is_options_table(table) or (table.page, table.heading) in UNATTRIBUTED:
            continue
        kind = _options_kind(table, registries)
        col = table.header.index("options (default)")
        tables += 1
        for line, row in table.rows:
            where = table.where(line)
            subjects = [_component(registries, kind, n) for n in _spans(row[0])]
            for key, doc in _option_defaults(row[col]):
                if key in registries[kind] or not re.fullmatch(r"[A-Za-z_]\w*", key):
                    continue  # "as `adam`", or a formula
                keys += 1
                problems += _check_key(subjects, key, doc, where)
    assert tables >= 5 and keys >= 50, f"only {tables} options tables, {keys} keys found: is the parser broken?"
    assert not problems, "\n".join(problems)
