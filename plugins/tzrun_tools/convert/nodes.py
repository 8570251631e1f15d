"""A parsed protobuf message being converted, and the findings the conversion collects.

:class:`Node` hands out a message's fields as TOML values and remembers which were read, so that
every field nothing read is reported (:meth:`Node.rest`), never dropped.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional

from tzrun_tools.convert.prototext import Identifier

__all__ = ["Finding", "Findings", "Node"]


class Finding(NamedTuple):
    """A field of the TorchEasyRec config (its protobuf path) and what became of it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_MISSING = object()
_BOOLS = {"true": True, "True": True, "t": True, "false": False, "False": False, "f": False}


def _as_float(v: Any) -> float:
    if isinstance(v, Identifier) and v.lower() in ("inf", "infinity", "nan"):
        return float(v.lower().replace("infinity", "inf"))
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise ValueError("a number")


def _as_int(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    raise ValueError("an integer")


def _as_bool(v: Any) -> bool:
    if isinstance(v, Identifier) and v in _BOOLS:
        return _BOOLS[v]
    if v in (0, 1) and isinstance(v, int):
        return bool(v)
    raise ValueError("true or false")


def _as_str(v: Any) -> str:
    if isinstance(v, str):
        return str(v)
    raise ValueError("a string")


_KINDS: dict[str, Callable[[Any], Any]] = {"float": _as_float, "int": _as_int, "bool": _as_bool, "str": _as_str}


class Findings:
    """Every field not converted, and every note, in the order the conversion met them."""

    def __init__(self) -> None:
        self.not_converted: list[Finding] = []
        self.notes: list[Finding] = []


class Node:
    """A parsed message being converted: hands out its fields and remembers which were read."""

    def __init__(self, fields: Mapping[str, list[Any]], path: str, findings: Findings) -> None:
        self.fields, self.path, self.findings = fields, path, findings
        self.used: set[str] = set()
        self.reported: set[str] = set()

    def at(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.fields

    def values(self, name: str, kind: str) -> list[Any]:
        """Every value of a repeated scalar field (a wrong one is reported and left out)."""
        self.used.add(name)
        out = []
        for i, raw in enumerate(self.fields.get(name, ())):
            try:
                out.append(_KINDS[kind](raw))
            except ValueError as error:
                self.skip_value(f"{self.at(name)}[{i}]", raw, str(error))
        return out

    def value(self, name: str, kind: str, default: Any = None) -> Any:
        """The value of a scalar field (the last one, as protobuf keeps), or ``default``."""
        values = self.values(name, kind) if name in self.fields else []
        return values[-1] if values else default

    def skip_value(self, path: str, raw: Any, expected: str) -> None:
        self.findings.not_converted.append(Finding(path, f"expected {expected}, got {raw!r}"))

    def children(self, name: str) -> list["Node"]:
        self.used.add(name)
        raw = self.fields.get(name, [])
        out = []
        for i, item in enumerate(raw):
            path = f"{self.at(name)}[{i}]" if len(raw) > 1 else self.at(name)
            if isinstance(item, dict):
                out.append(Node(item, path, self.findings))
            else:
                self.skip_value(path, item, "a message")
        return out

    def child(self, name: str) -> Optional["Node"]:
        children = self.children(name)
        return children[-1] if children else None

    def indexed_children(self, name: str) -> list["Node"]:
        """Like :meth:`children`, with ``[i]`` in every path (for lists the user numbers)."""
        self.used.add(name)
        return [Node(item, f"{self.at(name)}[{i}]", self.findings)
                for i, item in enumerate(self.fields.get(name, [])) if isinstance(item, dict)]

    def which(self, names: Iterable[str]) -> Optional[str]:
        """The field of a oneof that is set (the last one, as protobuf keeps)."""
        present = [n for n in self.fields if n in set(names)]
        for extra in present[:-1]:
            self.skip(extra, "another field of the same oneof follows it, which protobuf keeps instead")
        return present[-1] if present else None

    def note(self, name: str, message: str) -> None:
        self.findings.notes.append(Finding(self.at(name), message))

    def skip(self, name: str, reason: str) -> None:
        """Report a field that is present as not converted (once, whether it was read or not)."""
        if name in self.fields and name not in self.reported:
            self.used.add(name)
            self.reported.add(name)
            self.findings.not_converted.append(Finding(self.at(name), reason))

    def rest(self, reason: str = "not a field tzrec-run convert knows; not converted") -> None:
        """Report every field that nothing read."""
        for name in self.fields:
            if name not in self.used:
                self.skip(name, reason)

    def copy(self, out: dict[str, Any], spec: Mapping[str, tuple[str, str]]) -> None:
        """Copy the fields of ``spec`` (proto name -> (TOML key, kind)) that are set."""
        for name, (key, kind) in spec.items():
            value = self.value(name, kind, _MISSING)
            if value is not _MISSING:
                out[key] = value
