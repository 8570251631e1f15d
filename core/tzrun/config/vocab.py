"""Vocabularies of categorical features: inline lists or files of one token per line.

Token ``vocab[i]`` maps to id ``i + 1``; id 0 is the out-of-vocabulary bucket (every token not
in the vocabulary), so a vocabulary of ``n`` tokens needs a table of ``n + 1`` rows and ids
stay put when tokens are appended. This module imports nothing heavy: ``tzrec-run check``
uses it to size tables.
"""

from __future__ import annotations

from typing import Sequence

from tzrun.io.storage import open_file

__all__ = ["OOV_ID", "read_vocab_file", "check_vocab"]

#: The id of every token that is not in a feature's vocabulary.
OOV_ID = 0


def read_vocab_file(path: str) -> tuple[str, ...]:
    """The tokens of a vocabulary file (a local path or a URL): one per line, UTF-8, in order.

    A trailing ``\\n`` or ``\\r\\n`` ends each line; nothing else is stripped, and empty
    lines are ignored.

    Raises:
        OSError: when the file cannot be read.
        StorageError: for a URL whose scheme is not installed.
        UnicodeDecodeError: when it is not UTF-8.
    """
    with open_file(path, "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    return tuple(line[:-1] if line.endswith("\r") else line for line in lines if line not in ("", "\r"))


def check_vocab(tokens: Sequence[str]) -> str | None:
    """What is wrong with a vocabulary (None when nothing is): it must hold at least one
    token and no token twice."""
    if not tokens:
        return "the vocabulary has no tokens"
    seen: set[str] = set()
    for token in tokens:
        if token in seen:
            return f"token {token!r} appears twice"
        seen.add(token)
    return None
