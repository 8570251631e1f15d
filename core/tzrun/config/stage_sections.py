"""A stage configured by a top-level table of its own name: ``[export]`` is the ``export`` stage,
as if ``[[train.stages]]`` listed ``{ type = "export", ... }`` last.

A top-level table that the core schema does not know and that names a registered stage is
moved into ``train.stages`` before the config is structured; problems with its options are
then reported at the table's own path (``export.on_best``), not at ``train.stages[N]``. The
core knows no stage's fields: whichever plugin registers the stage checks them.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import attrs

from tzrun.errors import ConfigProblem

__all__ = ["stage_sections", "listed_twice", "section_path", "in_sections"]


def stage_sections(data: Mapping[str, Any], stages: Any, schema: type) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with each top-level table that names a stage of the registry ``stages`` (and no
    field of ``schema``) appended to ``train.stages``; and where each went:
    ``{"train.stages[N]": "<table>"}``."""
    known = {f.name for f in attrs.fields(schema)}
    moved = [key for key, value in data.items() if key not in known and isinstance(value, dict) and key in stages]
    if not moved:
        return dict(data), {}
    out = {k: v for k, v in data.items() if k not in moved}
    train = copy.copy(out.get("train")) if isinstance(out.get("train"), dict) else None
    if train is None:
        return dict(data), {}  # no [train] table: the schema reports it, with the table still unknown
    listed = list(train.get("stages") or ()) if isinstance(train.get("stages", []), list) else None
    if listed is None:
        return dict(data), {}
    where = {}
    for key in moved:
        where[f"train.stages[{len(listed)}]"] = key
        listed.append({"type": key, **data[key]})
    train["stages"] = listed
    out["train"] = train
    return out, where


def listed_twice(data: Mapping[str, Any], where: Mapping[str, str]) -> list[ConfigProblem]:
    """A stage configured by a table of its own (``[export]``) that ``train.stages`` lists as
    well: two of them would run (two exports of each checkpoint), which no one writes on purpose."""
    train = data.get("train")
    listed = train.get("stages") if isinstance(train, dict) else None
    types = {s.get("type") for s in listed if isinstance(s, dict)} if isinstance(listed, list) else set()
    return [ConfigProblem(key, f"configures the '{key}' stage, which train.stages lists too; keep one of the two")
            for key in where.values() if key in types]


def section_path(path: str, where: Mapping[str, str]) -> str:
    """``path`` with a moved stage's ``train.stages[N]`` prefix spelled as its table."""
    for prefix, key in where.items():
        if path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "["):
            return key + path[len(prefix):]
    return path


def in_sections(problems: list[ConfigProblem], where: Mapping[str, str], data: Mapping[str, Any]) -> list[ConfigProblem]:
    """``problems`` at the paths their tables were written at; an unknown top-level table is
    said to be no installed stage's either (its plugin may be disabled or not installed)."""
    out = []
    for p in problems:
        path = section_path(p.path, where)
        if "." not in path and "[" not in path and isinstance(data.get(path), dict) and p.message.startswith("unknown key"):
            out.append(ConfigProblem(path, f"{p.message}; nor does an installed plugin register a stage '{path}' "
                                           "(is its plugin disabled or not installed? tzrec-run plugins lists them)"))
        else:
            out.append(ConfigProblem(path, p.message))
    return out
