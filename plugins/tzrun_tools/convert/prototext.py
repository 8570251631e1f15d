"""Protobuf text format, read without a schema.

TorchEasyRec's ``.proto`` files are not installed here, so :func:`parse_text_proto` reads the text
without them: every message becomes a dict from field name to the list of its values, in file
order (a field given once is a list of one). Scalars are ``int``, ``float``, ``str`` (quoted
strings) and :class:`Identifier` (bare words: enum values, ``true``/``false``).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Optional

from tzrun.errors import ProtoTextError

__all__ = ["Identifier", "parse_text_proto"]


class Identifier(str):
    """A bare word of protobuf text format: an enum value, ``true``, ``inf``, ..."""


_TOKEN = re.compile(
    r"""(?P<space>[ \t\r\n\f\v]+|\#[^\n]*)
      | (?P<number>0[xX][0-9A-Fa-f]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<string>["'])
      | (?P<punct>[:{}<>\[\],;\-./])""",
    re.VERBOSE,
)
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
                   "\\": "\\", "'": "'", '"': '"', "?": "?"}
_ESCAPE_DIGITS = {"x": (r"[0-9A-Fa-f]{1,2}", 16), "u": (r"[0-9A-Fa-f]{4}", 16), "U": (r"[0-9A-Fa-f]{8}", 16)}


class _Token(NamedTuple):
    kind: str  # number, ident, string, punct, eof
    text: str
    value: Any
    line: int
    column: int

    def shown(self) -> str:
        return "the end of the file" if self.kind == "eof" else repr(self.text)


def _tokens(text: str, source: str) -> list[_Token]:
    out: list[_Token] = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        column = pos - line_start + 1
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ProtoTextError(source, line, column, f"unexpected character {text[pos]!r}")
        kind, raw = match.lastgroup, match.group()
        if kind == "space":
            line += raw.count("\n")
            if "\n" in raw:
                line_start = pos + raw.rindex("\n") + 1
            pos = match.end()
            continue
        if kind == "string":
            value, end = _string(text, pos, source, line, line_start)
            out.append(_Token("string", text[pos:end], value, line, column))
            pos = end
            continue
        end = match.end()
        if kind == "number":
            if end < len(text) and (text[end].isalnum() or text[end] == "_"):
                raise ProtoTextError(source, line, column, f"invalid number {raw + text[end]!r}...")
            out.append(_Token("number", raw, _number(raw), line, column))
        else:
            out.append(_Token(kind, raw, raw, line, column))
        pos = end
    out.append(_Token("eof", "", None, line, pos - line_start + 1))
    return out


def _number(raw: str) -> int | float:
    if raw[:2] in ("0x", "0X"):
        return int(raw, 16)
    if raw[-1] in "fF" and not raw.startswith(("0x", "0X")):
        return float(raw[:-1])
    if any(c in raw for c in ".eE"):
        return float(raw)
    if len(raw) > 1 and raw[0] == "0":
        return int(raw, 8)
    return int(raw)


def _string(text: str, start: int, source: str, line: int, line_start: int) -> tuple[str, int]:
    """The decoded string literal at ``text[start]`` (a quote) and the index after it."""
    quote, pos, out = text[start], start + 1, []
    while True:
        if pos >= len(text) or text[pos] == "\n":
            raise ProtoTextError(source, line, start - line_start + 1, "unterminated string")
        c = text[pos]
        if c == quote:
            return "".join(out), pos + 1
        if c != "\\":
            out.append(c)
            pos += 1
            continue
        e = text[pos + 1: pos + 2]
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            pos += 2
        elif e in _ESCAPE_DIGITS or e.isdigit() and e < "8":
            pattern, base = _ESCAPE_DIGITS.get(e, ("[0-7]{1,3}", 8))
            digits = re.compile(pattern).match(text, pos + (1 if base == 8 else 2))
            if digits is None:
                raise ProtoTextError(source, line, pos - line_start + 1, f"invalid escape '\\{e}'")
            out.append(chr(int(digits.group(), base)))
            pos = digits.end()
        else:
            raise ProtoTextError(source, line, pos - line_start + 1, f"unknown escape '\\{e}' in a string")


class _Parser:
    def __init__(self, tokens: list[_Token], source: str) -> None:
        self.tokens, self.source, self.i = tokens, source, 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def fail(self, token: _Token, message: str) -> ProtoTextError:
        return ProtoTextError(self.source, token.line, token.column, message)

    def is_punct(self, *texts: str) -> bool:
        return self.peek().kind == "punct" and self.peek().text in texts

    def message(self, opener: Optional[_Token]) -> dict[str, list[Any]]:
        close = None if opener is None else ("}" if opener.text == "{" else ">")
        fields: dict[str, list[Any]] = {}
        while True:
            token = self.peek()
            if token.kind == "eof":
                if opener is None:
                    return fields
                raise self.fail(token, f"expected '{close}' to close the message opened at line "
                                       f"{opener.line}, column {opener.column}")
            if close is not None and self.is_punct(close):
                self.take()
                return fields
            name = self.field_name()
            fields.setdefault(name, []).extend(self.field_values(name))
            if self.is_punct(",", ";"):
                self.take()

    def field_name(self) -> str:
        token = self.take()
        if token.kind == "ident":
            return token.text
        if token.kind == "punct" and token.text == "[":  # an extension or Any type URL
            parts = []
            while not self.is_punct("]"):
                part = self.take()
                if part.kind not in ("ident", "punct") or part.text in "[]{}<>:,;":
                    raise self.fail(part, f"expected an extension name, got {part.shown()}")
                parts.append(part.text)
            self.take()
            return "[" + "".join(parts) + "]"
        raise self.fail(token, f"expected a field name, got {token.shown()}")

    def field_values(self, name: str) -> list[Any]:
        colon = self.is_punct(":")
        if colon:
            self.take()
        if self.is_punct("{", "<"):
            return [self.message(self.take())]
        if self.is_punct("["):
            return self.list_values()
        if not colon:
            raise self.fail(self.peek(), f"expected ':' or '{{' after the field name '{name}', got {self.peek().shown()}")
        return [self.scalar()]

    def list_values(self) -> list[Any]:
        self.take()
        values: list[Any] = []
        if self.is_punct("]"):
            self.take()
            return values
        while True:
            values.append(self.message(self.take()) if self.is_punct("{", "<") else self.scalar())
            token = self.take()
            if token.kind == "punct" and token.text == "]":
                return values
            if not (token.kind == "punct" and token.text == ","):
                raise self.fail(token, f"expected ',' or ']' in a list, got {token.shown()}")

    def scalar(self) -> Any:
        token = self.take()
        if token.kind == "string":
            value = token.value
            while self.peek().kind == "string":  # adjacent literals concatenate
                value += self.take().value
            return value
        if token.kind == "number":
            return token.value
        if token.kind == "ident":
            return Identifier(token.text)
        if token.kind == "punct" and token.text == "-":
            nxt = self.take()
            if nxt.kind == "number":
                return -nxt.value
            if nxt.kind == "ident" and nxt.text.lower() in ("inf", "infinity", "nan"):
                return -float(nxt.text.lower().replace("infinity", "inf"))
            raise self.fail(nxt, f"expected a number after '-', got {nxt.shown()}")
        raise self.fail(token, f"expected a value, got {token.shown()}")


def parse_text_proto(text: str, source: str = "<string>") -> dict[str, list[Any]]:
    """Read protobuf text format without a schema.

    Args:
        text: the text (``#`` comments, ``name: value``, ``name { ... }`` or ``name < ... >``,
            ``name: [a, b]`` lists, optional ``,``/``;`` separators).
        source: the file name shown in errors.

    Returns:
        Each message as a dict from field name to the list of its values (repeated fields and
        list syntax alike); nested messages are such dicts.

    Raises:
        ProtoTextError: naming ``source``, the line and the column of the first problem.
    """
    return _Parser(_tokens(text, source), source).message(None)

