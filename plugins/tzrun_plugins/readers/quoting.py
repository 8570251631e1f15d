"""Lines of delimited text whose quoting does not close on the line.

The ``csv`` reader's rule: a line is a physical line (up to ``\\n``), and a quoted value may
hold the delimiter but not a line break. A line that ends inside a quoted value (a stray
``"`` at the start of a field, a value with a line break in it) is a bad line on its own, a
row with the reason ``"unbalanced quote"`` (or an error naming it): it is not handed to
pyarrow, whose parser would otherwise read on through the following lines as one value and
lose them (up to a whole group, a count that depended on where the groups and ranks' shares
began).

Whether a line ends inside quotes follows pyarrow's parser (``double_quote``, no escape
character): a quote opens a quoted value only at the start of a field; inside one, a run of
``2k`` quotes is ``k`` escaped quotes (``""``) and a run of odd length ends with the closing
quote; elsewhere a quote is an ordinary character (``5'11"``). Over the runs of quotes of a
line that is three moves on the state "inside quotes": a run of odd length at a field start
flips it, a run of odd length elsewhere clears it, any other run leaves it. So a line ends
inside quotes when it has an odd number of flipping runs after its last clearing one: numpy
work on the quote positions, nothing per line in Python.

The reader does not pay even that on a clean input: a run of rows with no quote is parsed as
before, and one with quotes is parsed as it is and kept when pyarrow made exactly one row of
each line (valid or malformed), its last line closes its quotes and it has no lone ``\\r``
(a line break to pyarrow); only otherwise, or when the parse fails, are its lines checked here.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["unclosed_rows", "ends_inside_quotes", "unclosed_quote_message"]

NEWLINE, CR = 10, 13


def unclosed_rows(data: bytes, buf: np.ndarray, starts: np.ndarray, delimiter: str, quote: str) -> np.ndarray:
    """The rows of a group that end inside a quoted value.

    Args:
        data, buf: the group's bytes, and the same as a ``uint8`` array; it starts at a row.
        starts: the byte offset of each row (a non-empty line) in ``buf``.
        delimiter, quote: the reader's; ``quote = ""`` turns quoting off (no row is returned).

    Returns:
        The 0-based indices of those rows, ascending.
    """
    if not quote or quote.encode() not in data:
        return np.zeros(0, np.int64)
    at = np.flatnonzero(buf == ord(quote))
    first = np.ones(at.size, bool)
    first[1:] = at[1:] != at[:-1] + 1
    run_at = at[first]
    length = np.diff(np.append(np.flatnonzero(first), at.size))
    before = buf[np.maximum(run_at - 1, 0)]
    field_start = (run_at == 0) | (before == ord(delimiter)) | (before == NEWLINE) | (before == CR)
    odd = length % 2 == 1
    flips, clears = odd & field_start, odd & ~field_start
    row = np.searchsorted(starts, run_at, side="right") - 1
    new_segment = clears.copy()
    new_segment[0] = True
    new_segment[1:] |= row[1:] != row[:-1]
    segment = np.cumsum(new_segment) - 1
    flips_in = np.bincount(segment, weights=flips, minlength=int(segment[-1]) + 1)
    last = np.ones(row.size, bool)
    last[:-1] = row[:-1] != row[1:]
    unclosed = flips_in[segment[last]] % 2 == 1
    return np.asarray(row[last][unclosed], dtype=np.int64)


def ends_inside_quotes(line: bytes, delimiter: str, quote: str) -> bool:
    """Whether the one line ``line`` ends inside a quoted value."""
    return bool(unclosed_rows(line, np.frombuffer(line, np.uint8), np.zeros(1, np.int64), delimiter, quote).size)


def unclosed_quote_message(path: str, line: bytes, number: int, names: Sequence[str], delimiter: str, quote: str) -> str:
    """The error for ``line``, line ``number`` of ``path``, which ends inside a quoted value."""
    field = _opening_field(line.rstrip(b"\r\n"), delimiter, quote)
    column = names[field] if field < len(names) else f"#{field + 1}"
    which = {'"': "double quote", "'": "single quote"}.get(quote, "quote character")
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    text = text if len(text) <= 120 else text[:117] + "..."
    return (
        f"{path}: line {number}, column '{column}': an unbalanced {which} ({quote}) opens a quoted value that does "
        f"not close on its line (a quoted value may hold the delimiter, not a line break; a quote inside one is "
        f"written twice): {text!r}; fix the quoting, or set data.on_bad_row = \"skip\" to leave such lines out"
    )


def _opening_field(line: bytes, delimiter: str, quote: str) -> int:
    """The 0-based field of ``line`` (one that ends inside quotes) whose quote does not close."""
    sep, mark = ord(delimiter), ord(quote)
    field, inside, opened, i = 0, False, 0, 0
    while i < len(line):
        c = line[i]
        if inside:
            if c == mark and i + 1 < len(line) and line[i + 1] == mark:
                i += 1
            elif c == mark:
                inside = False
        elif c == mark and (i == 0 or line[i - 1] == sep):
            inside, opened = True, field
        elif c == sep:
            field += 1
        i += 1
    return opened
