"""Where ``tzrec-run predict`` writes, so that a half-written prediction set is never taken for a
whole one.

``--output`` ending in ``.parquet`` is one file; anything else is a directory of parts
(``part-00000.parquet``, one per rank that scored rows, in rank order: input order) with
``_SUCCESS`` (JSON: rows, skipped rows, parts, columns, what scored them) written last.

* A local directory is written under ``OUTPUT.partial/`` and renamed to ``OUTPUT`` once whole:
  ``OUTPUT`` never exists half-written.
* A directory on an object store (no rename there) is written in place; it is whole when
  ``_SUCCESS`` exists (one PUT, written last), as Spark and Hadoop jobs mark theirs.
* One file: each rank writes its part under ``OUTPUT.partial/``; rank 0 joins them into
  ``OUTPUT`` (a temporary file renamed, or one PUT on an object store) and removes the parts.

Rows left out under ``data.on_bad_row = "skip"`` are listed in ``_skipped.parquet`` (a
directory) or ``NAME.skipped.parquet`` next to ``NAME.parquet`` (one file): the input row number (0-based, in the
reader's order of the input's files) and the problem(s), written before the marker or file.
A leftover ``OUTPUT.partial/`` (a killed run) is removed by the next run.

Nothing but predict's own output is ever removed (:mod:`tzrun.io.owned`): a directory of
predictions (and its staging directory) carries the marker ``.tzrec-run-output``, written
before any part; ``--overwrite`` replaces only a directory with that marker holding only
parts, ``_SUCCESS`` and ``_skipped.parquet``, and only a single file (or its skipped-rows list)
whose Parquet schema metadata says ``tzrec-run: predictions``. Anything else (a user's
directory, a model dir, a checkpoint, the working directory) is refused with one line, with or
without ``--overwrite``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from tzrun.errors import WriteError
from tzrun.io.files import write_atomic
from tzrun.io.owned import (claim_output_dir, output_entries, read_output_marker, remove_owned, replaceable_entries,
                            write_output_marker)
from tzrun.io.storage import as_path, exists, is_remote, remove_tree

__all__ = ["SUCCESS", "SKIPPED", "OWNER_KEY", "PredictionSink", "skipped_path", "is_prediction_file", "is_our_parquet"]

#: The completion marker of a directory of predictions.
SUCCESS = "_SUCCESS"
#: The rows left out of a directory of predictions.
SKIPPED = "_skipped.parquet"


def skipped_path(output: str) -> Path:
    """Where the rows left out of ``output`` are listed."""
    if not _single(output):
        return as_path(output) / SKIPPED
    return as_path(output.rstrip("/").removesuffix(".parquet") + ".skipped.parquet")


def _single(output: str) -> bool:
    return output.rstrip("/").endswith(".parquet")


#: The schema metadata key that marks a Parquet file of predictions as tzrec-run's.
OWNER_KEY = b"tzrec-run"
_PART = re.compile(r"^part-\d{5}\.parquet$")


def _stamped(table: pa.Table) -> pa.Table:
    """``table`` with the schema metadata that marks it as a prediction file of ours."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), OWNER_KEY: b"predictions"})


def is_prediction_file(name: str) -> bool:
    """Whether ``name`` is one a directory of predictions holds (the marker aside)."""
    name = name.removeprefix(".").removesuffix(".tmp")
    return name in (SUCCESS, SKIPPED) or bool(_PART.match(name))


def is_our_parquet(path: Path) -> bool:
    """Whether the Parquet file ``path`` is one ``predict`` wrote (its schema's metadata says so)."""
    try:
        if is_remote(path):
            with path.open("rb") as f:
                schema = pq.read_schema(f)
        else:
            schema = pq.read_schema(path)
    except (OSError, ValueError, pa.ArrowException):
        return False
    return (schema.metadata or {}).get(OWNER_KEY) == b"predictions"


def _write_table(path: Path, table: pa.Table) -> None:
    table = _stamped(table)
    if is_remote(path):
        with path.open("wb") as f:  # one object, visible once its upload completes
            pq.write_table(table, f)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _adopt_earlier(path: Path) -> None:
    """Mark a complete directory of predictions that an earlier version wrote (no marker; only
    parts, ``_SUCCESS`` and ``_skipped.parquet``) as ours, so that ``--overwrite`` replaces it."""
    names = output_entries(path)
    if names and SUCCESS in names and read_output_marker(path) is None and all(is_prediction_file(n) for n in names):
        write_output_marker(path, "predictions")


class PredictionSink:
    """The output of one ``predict`` (see the module docstring).

    Args:
        output: ``--output``.
        overwrite: replace a complete output that is there already.
    """

    def __init__(self, output: str, overwrite: bool) -> None:
        self.output = output.rstrip("/") if not is_remote(output) else output
        self.overwrite = overwrite
        self.single = _single(output)
        self.staging = as_path(self.output + ".partial")
        self.final = as_path(self.output)
        # where the parts go: in place for a directory on an object store
        self.parts = self.final if (not self.single and is_remote(output)) else self.staging

    def prepare(self) -> None:
        """Refuse an output that is not ours, or one of ours without ``overwrite``; clear what a
        killed run left (rank 0, before any rank writes). Only files ``predict`` writes are
        ever removed (:mod:`tzrun.io.owned`; a single file is ours when its Parquet schema says
        so).

        Raises:
            WriteError: naming the output, what it holds and the fix; nothing is changed then.
        """
        if self.single:
            for path in (self.final, skipped_path(self.output)):
                self._check_file(path)
        elif self.parts != self.final:  # a local directory: replaced at the end, whole
            _adopt_earlier(self.final)
            replaceable_entries(self.final, "predictions", is_prediction_file, flag="--output", overwrite=self.overwrite)
        if self.parts != self.final:
            left = output_entries(self.staging)
            if left and read_output_marker(self.staging) is None and all(is_prediction_file(n) for n in left):
                remove_owned(self.staging, left)  # parts a killed run of an earlier version left, before markers
            claim_output_dir(self.staging, "predictions", is_prediction_file, flag="--output's staging directory")
        else:  # in place on an object store: no longer complete from here on
            _adopt_earlier(self.final)
            claim_output_dir(self.final, "predictions", is_prediction_file, flag="--output", overwrite=self.overwrite)

    def _check_file(self, path: Path) -> None:
        if not exists(path):
            return
        if not is_remote(path) and Path(path).is_dir():
            raise WriteError(f"--output {self.output}: {path} is a directory; name a .parquet file that does not exist")
        if not is_our_parquet(path):
            raise WriteError(f"--output {self.output}: {path} exists and is not a prediction file tzrec-run wrote; "
                             "nothing was changed: name another --output")
        if not self.overwrite:
            raise WriteError(f"--output {self.output}: {path} exists already; pass --overwrite to replace it, or another --output")

    def part(self, rank: int) -> Path:
        """Where rank ``rank`` writes its rows."""
        return self.parts / f"part-{rank:05d}.parquet"

    def write_part(self, rank: int, table: pa.Table) -> str | None:
        """Write this rank's rows (none written for no rows); returns the part's name or None."""
        if table.num_rows == 0:
            return None
        path = self.part(rank)
        table = _stamped(table)
        if is_remote(path):
            with path.open("wb") as f:
                pq.write_table(table, f)
        else:
            pq.write_table(table, path)
        return path.name

    def publish(self, parts: Sequence[str], skipped: pa.Table, record: Mapping[str, Any]) -> str:
        """Make the output whole (rank 0, after every rank wrote its part); returns where the
        skipped rows are listed, or "" for none."""
        listing = ""
        if self.single:
            listing = self._publish_file(parts, skipped)
        else:
            if skipped.num_rows:
                _write_table(self.parts / SKIPPED, skipped)
                listing = str(self.final / SKIPPED)
            marker = {**record, "parts": list(parts), "skipped_rows": skipped.num_rows}
            write_atomic(self.parts / SUCCESS, json.dumps(marker, indent=2).encode())
            if self.parts != self.final:
                old = replaceable_entries(self.final, "predictions", is_prediction_file, flag="--output")
                if old:  # ours (checked again): only its own files go
                    remove_owned(self.final, old)
                    os.rmdir(self.final)
                os.replace(self.staging, self.final)
        return listing

    def _publish_file(self, parts: Sequence[str], skipped: pa.Table) -> str:
        tables = [pq.read_table(self.parts / name) if not is_remote(self.parts) else _read_remote(self.parts / name)
                  for name in parts]
        whole = pa.concat_tables(tables) if tables else pa.table({})
        listing = skipped_path(self.output)
        if skipped.num_rows:
            _write_table(listing, skipped)
        elif exists(listing):
            listing.unlink()
        _write_table(self.final, whole)
        remove_tree(self.staging)
        return str(listing) if skipped.num_rows else ""


def _read_remote(path: Path) -> pa.Table:
    with path.open("rb") as f:
        return pq.read_table(f)
