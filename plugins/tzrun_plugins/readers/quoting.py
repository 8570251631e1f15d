"""Lines of delimited text whose quoting does not close on the line.

The ``csv`` reader's rule: a line is a physical line (up to ``\\n``), and a quoted value may
hold the delimiter but not a line break. A line that ends inside a quoted value (a stray
``"`` at the start of a field, a value with a line break in it) is a bad line on its own:
it is not handed to pyarrow, whose parser would otherwise read on through the following lines
as one value and lose them (a whole group's worth, a count that depended on where the groups
and the ranks' shares began).

Whether a line ends inside quotes follows pyarrow's parser (``double_quote``, no escape
character): a quote opens a quoted value only at the start of a field; inside one, a run of
quotes of even length is that many halves of ``""`` (literal quotes) and a run of odd length
closes the value; elsewhere a quote is an ordinary character. Over the runs of a line that is
three moves on the state "inside quotes": a run at a field start of odd length flips it, a run
elsewhere of odd length clears it, any other run leaves it. So a line ends inside quotes when,
after its last clearing run, it has an odd number of flipping runs: numpy work on the quote
positions of a group, nothing per line, and nothing at all for a group without a quote.
"""

from __future__ import annotations

import numpy as np

__all__ = ["unclosed_rows", "opening_field"]

_NEWLINE, _CR = 10, 13


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
    field_start = (run_at == 0) | (before == ord(delimiter)) | (before == _NEWLINE) | (before == _CR)
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
    return row[last][unclosed].astype(np.int64)


def opening_field(line: bytes, delimiter: str, quote: str) -> int:
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
