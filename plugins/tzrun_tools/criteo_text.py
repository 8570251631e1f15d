"""The synthetic Criteo set in the public Criteo display-advertising text format.

``tzrec-run data synth criteo --format text`` writes what :func:`tzrun_tools.synth.synth_criteo`
writes, as tab-separated text without a header, one file per Parquet part
(``train/day_N.txt``, ``eval/day_N.txt``): the label, the 13 integer columns (an empty field for
a null) and the 26 categorical columns as 8-digit hexadecimal ids. Ids are mapped to hex with a
bijection of 32-bit integers (``id * 2654435761 mod 2**32``), so distinct ids stay distinct, the
strings look like Criteo's and nothing about the labels changes: the Bayes AUC of
``synth.json`` holds for the text files too.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["hex_id", "parquet_to_criteo_text"]

_GOLDEN = 2654435761


def hex_id(value: int) -> str:
    """The 8-digit hexadecimal string of id ``value`` (a bijection on 32-bit integers)."""
    return format((int(value) * _GOLDEN) % 2**32, "08x")


def parquet_to_criteo_text(parquet_dir: str | os.PathLike[str], text_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each ``part-NNNNN.parquet`` of ``parquet_dir`` (from ``synth_criteo``) as
    ``text_dir/day_N.txt`` in the Criteo text format; returns the files written."""
    import numpy as np
    import pyarrow.parquet as pq

    from tzrun_tools.synth import DENSE_COLUMNS, LABEL_COLUMN, SPARSE_COLUMNS

    text_dir = Path(text_dir)
    text_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for n, part in enumerate(sorted(Path(parquet_dir).glob("part-*.parquet"))):
        table = pq.read_table(part)
        columns = [[str(int(v)) for v in table.column(LABEL_COLUMN).to_numpy()]]
        for name in DENSE_COLUMNS:
            values = table.column(name).to_numpy(zero_copy_only=False)
            columns.append(["" if np.isnan(v) else str(int(v)) for v in values])
        for name in SPARSE_COLUMNS:
            ids = (table.column(name).to_numpy().astype(np.uint64) * np.uint64(_GOLDEN)) % np.uint64(2**32)
            columns.append([format(int(v), "08x") for v in ids])
        path = text_dir / f"day_{n}.txt"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="ascii") as f:
            for row in zip(*columns):
                f.write("\t".join(row) + "\n")
        os.replace(tmp, path)
        written.append(path)
    return written
