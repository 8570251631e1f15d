"""The ``csv`` reader: delimited text files (CSV, TSV, the Criteo text format) through pyarrow.

One line is one row (quoted fields may hold the delimiter, not a line break); empty lines are
skipped. Text has no row groups of its own, so the reader makes them: when an input is
listed, each file is scanned once for line breaks (a sequential read at disk speed, with
numpy, a few MiB at a time) and every ``rows_per_group`` rows start a group, whose byte offset
is kept in memory, in the reader (DataLoader workers inherit it). Reading rows ``[start,
stop)`` of a group reads that group's bytes only and parses them ``batch_rows`` rows at a time,
so memory stays bounded by one group whatever the file sizes. Nothing is written next to the
data. The scan is redone when a file's size or modification time changes between listing and
reading (then reading stops with an error: the rows would not be the listed ones). Files may be
URLs (``s3://``, ``gs://``, ...): the scan then streams each file once, and a read fetches the
byte range of its group only (for an object, its ETag stands for the modification time).

Every column has a declared type (``column_types``, else ``default_type``): types are never
inferred, because a guess made from one block of rows can differ from the guess for another
(a hexadecimal id made only of digits reads as an integer). Fields in ``null_values`` (by
default only the empty field) are nulls, strings included.

A line with the wrong number of fields, a line that ends inside a quoted value (a stray
quote, a quoted line break: see :mod:`tzrun_plugins.readers.quoting`), or a field that does not
parse as its column's type, is an error naming the file, the line (and the column); under
``data.on_bad_row = "skip"`` it is a bad row the core leaves out and counts (see
:mod:`tzrun_plugins.readers.bad_lines`), that line alone, however the input is split.
"""

from __future__ import annotations

from typing import Any, Iterator, Literal, Mapping, Sequence

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from tzrun import BAD_ROW_COLUMN, RowGroup, list_files
from tzrun.errors import DataError
from tzrun_plugins.readers.bad_lines import UNBALANCED_QUOTE, convert_fields, with_bad_rows, with_rows_left_out
from tzrun_plugins.readers.inputs import open_input, read_range, stamp as file_stamp
from tzrun_plugins.readers.quoting import CR, NEWLINE, ends_inside_quotes, unclosed_quote_message, unclosed_rows

__all__ = ["CsvConfig", "CsvReader", "build_csv", "COLUMN_TYPES"]

#: The names ``column_types`` and ``default_type`` accept, and their Arrow types.
COLUMN_TYPES: Mapping[str, pa.DataType] = {
    "string": pa.string(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
}

_SCAN_BYTES = 8 << 20
_COMPRESSED = (".gz", ".bz2", ".zst", ".xz", ".lz4", ".zip")


def _compressed_hint(seen: Sequence[str]) -> str:
    """For a directory of compressed text: why ``suffixes`` does not help."""
    if not any(name.endswith(_COMPRESSED) for name in seen):
        return ""
    return (
        "; but compressed files are not read even then: the csv reader splits files at byte offsets, "
        "which a compressed stream does not have, so decompress them first"
    )


class _RanOn(Exception):
    """pyarrow read a quoted value on past the end of its line (see :meth:`CsvReader._parse_rows`)."""


def _known_types(instance: Any, attribute: Any, value: Mapping[str, str]) -> None:
    for column, name in value.items():
        if name not in COLUMN_TYPES:
            raise ValueError(
                f"column '{column}': unknown type {name!r} (choose from {', '.join(COLUMN_TYPES)})", attribute
            )


def _one_char(instance: Any, attribute: Any, value: str) -> None:
    if len(value) != 1 or value in "\r\n":
        raise ValueError(f'must be one character other than a line break (e.g. "," or "\\t"), got {value!r}', attribute)


def _quote(instance: Any, attribute: Any, value: str) -> None:
    if len(value) > 1 or value in ("\r", "\n"):
        raise ValueError(f'must be one character, or "" for no quoting; got {value!r}', attribute)


@attrs.frozen
class CsvConfig:
    """Options of the ``csv`` reader.

    Attributes:
        delimiter: the field separator, one character (``"\\t"`` for tab-separated files).
        header: the first line of each file names its columns.
        column_names: the columns, in file order, when ``header = false`` (required then,
            refused otherwise).
        column_types: the type of each named column: ``string``, ``int8``, ``int16``,
            ``int32``, ``int64``, ``float32``, ``float64`` or ``bool``.
        default_type: the type of the columns ``column_types`` does not name.
        null_values: fields that are nulls (default: only the empty field).
        quote_char: the quoting character; ``""`` turns quoting off.
        rows_per_group: rows of the groups the input is split into (the unit of reading;
            memory holds about one group's bytes).
        batch_rows: rows parsed at a time.
        suffixes: file endings read when the input is a directory.
    """

    delimiter: str = attrs.field(default=",", validator=_one_char)
    header: bool = True
    column_names: tuple[str, ...] = ()
    column_types: Mapping[str, str] = attrs.field(factory=dict, validator=_known_types)
    default_type: Literal["string", "int8", "int16", "int32", "int64", "float32", "float64", "bool"] = "string"
    null_values: tuple[str, ...] = ("",)
    quote_char: str = attrs.field(default='"', validator=_quote)
    rows_per_group: int = attrs.field(default=65536, validator=attrs.validators.gt(0))
    batch_rows: int = attrs.field(default=65536, validator=attrs.validators.gt(0))
    suffixes: tuple[str, ...] = (".csv", ".tsv", ".txt")

    def __attrs_post_init__(self) -> None:
        fields = attrs.fields(CsvConfig)
        if not self.header and not self.column_names:
            raise ValueError("name the columns in file order when header = false, e.g. column_names = [\"label\", \"I1\"]", fields.column_names)
        if self.header and self.column_names:
            raise ValueError("the header names the columns: remove column_names, or set header = false", fields.column_names)
        seen: set[str] = set()
        for name in self.column_names:
            if name in seen:
                raise ValueError(f"column '{name}' appears twice", fields.column_names)
            seen.add(name)
        unknown = [c for c in self.column_types if self.column_names and c not in seen]
        if unknown:
            raise ValueError(f"column(s) {', '.join(repr(c) for c in unknown)} are not in column_names", fields.column_types)


def check_columns(cfg: CsvConfig, columns: Sequence[str]) -> list[tuple[str, str]]:
    """``tzrec-run check``: a headerless file has only ``column_names``; a run that reads another
    column would fail at its first read."""
    if cfg.header:
        return []
    missing = [c for c in columns if c not in cfg.column_names]
    if not missing:
        return []
    return [("column_names", f"the run reads column(s) {', '.join(repr(c) for c in missing)}, which column_names "
                             f"does not name (it has {len(cfg.column_names)}: {', '.join(cfg.column_names[:6])}"
                             f"{', ...' if len(cfg.column_names) > 6 else ''}); add them, or fix [features]/[data]")]


@attrs.frozen
class _FileIndex:
    """Where the groups of one file start.

    Attributes:
        names: the file's columns.
        stamp: ``(size, version)`` when it was scanned (see :func:`~tzrun_plugins.readers.inputs.stamp`).
        offsets: byte offset of each group's first row, then the end of the data.
        lines: 1-based line number of each group's first row.
        rows: rows of each group.
    """

    names: tuple[str, ...]
    stamp: tuple[int, Any]
    offsets: np.ndarray
    lines: np.ndarray
    rows: np.ndarray


def _row_starts(buf: np.ndarray, base: int, line_start: int, prev_byte: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows (non-empty lines) that end in ``buf``, which starts at byte ``base``.

    Args:
        line_start: the byte offset where the line running into ``buf`` began.
        prev_byte: the byte before ``buf`` (for a ``\\r\\n`` split across reads).

    Returns:
        ``(starts, line_index, next_line_start)``: the byte offset of each row that ends in
        ``buf``, the index among the lines ending in ``buf`` of each, and where the line
        running past ``buf`` begins.
    """
    ends = np.flatnonzero(buf == NEWLINE).astype(np.int64)
    if not ends.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), line_start
    starts = np.empty(ends.size, np.int64)
    starts[0] = line_start
    starts[1:] = ends[:-1] + 1 + base
    ends += base
    length = ends - starts
    before = np.where(ends - 1 >= base, buf[np.maximum(ends - 1 - base, 0)], prev_byte)
    empty = (length == 0) | ((length == 1) & (before == CR))
    keep = np.flatnonzero(~empty)
    return starts[keep], keep, int(ends[-1] + 1)


def _is_row(data: bytes) -> bool:
    return data not in (b"", b"\r")


class CsvReader:
    """Lists and reads delimited text files (see :class:`tzrun.Reader` and the module docstring)."""

    #: malformed lines and unparsable fields are isolated under ``data.on_bad_row = "skip"``
    isolates_bad_rows = True

    def __init__(self, cfg: CsvConfig) -> None:
        self.cfg = cfg
        self._index: dict[str, _FileIndex] = {}

    def row_groups(self, input_path: str) -> list[RowGroup]:
        """Every group of ``rows_per_group`` rows of every file of ``input_path``, files in
        sorted order (each file scanned once per reader).

        Raises:
            DataError: when nothing matches, a file cannot be read or is compressed.
        """
        groups: list[RowGroup] = []
        for path in list_files(input_path, self.cfg.suffixes, _compressed_hint):
            index = self._scan(path)
            groups.extend(RowGroup(path, i, int(n)) for i, n in enumerate(index.rows))
        return groups

    def files(self, input_path: str) -> list[str]:
        """The files of ``input_path`` in reading order, from the listing only (no scan).

        Raises:
            DataError: when nothing matches.
        """
        return list_files(input_path, self.cfg.suffixes, _compressed_hint)

    def schema(self, path: str) -> pa.Schema | None:
        """The columns of ``path`` (its header line, or ``column_names``) with their declared
        types, reading the file's first line only; None for a file with no line (nothing of it
        is read).

        Raises:
            DataError: when the file cannot be read, is compressed, or its header is not one.
        """
        try:
            with open_input(path) as f:
                if f.read(2) == b"\x1f\x8b":
                    raise DataError(f"{path}: is gzip-compressed; the csv reader reads plain text (decompress it first)")
                f.seek(0)
                line = f.readline()
                while line and not _is_row(line.rstrip(b"\n")):
                    line = f.readline()
        except OSError as exc:
            raise DataError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        if not line:
            return None
        names = self._header(path, line) if self.cfg.header else self.cfg.column_names
        cfg = self.cfg
        return pa.schema([(n, COLUMN_TYPES[cfg.column_types.get(n, cfg.default_type)]) for n in names])

    def read(self, group: RowGroup, start: int, stop: int, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Rows ``[start, stop)`` of ``group``, only ``columns``, ``batch_rows`` at a time.

        Raises:
            DataError: naming the file (and column, line) for a missing column, a field that
                is not of its column's type, a line with the wrong number of fields, or a
                file that cannot be read or changed since it was listed.
        """
        index = self._index.get(group.path) or self._scan(group.path)
        skip = BAD_ROW_COLUMN in columns
        columns = [c for c in columns if c != BAD_ROW_COLUMN]
        missing = [c for c in columns if c not in index.names]
        if missing:
            raise DataError(
                f"{group.path}: column(s) {', '.join(repr(c) for c in missing)} missing "
                f"(the file has: {', '.join(index.names)}); fix [features]/[data] or data.reader"
            )
        try:
            if file_stamp(group.path) != index.stamp:
                raise DataError(f"{group.path}: the file changed after it was listed; restart the run on stable data")
            data, buf, starts = _group_rows(group, index)
        except OSError as exc:
            raise DataError(f"{group.path}: cannot be read: {exc.strerror or exc}") from None
        if starts.size != group.num_rows:
            raise DataError(f"{group.path}: the file changed after it was listed; restart the run on stable data")
        bounds = np.append(starts, len(data))
        first_line = int(index.lines[group.index])
        line_of = _line_numbers(buf, starts, first_line)
        for lo in range(start, stop, self.cfg.batch_rows):
            hi = min(stop, lo + self.cfg.batch_rows)
            yield from self._parse_rows(data, buf, bounds, lo, hi, index.names, columns, group.path, line_of, skip).to_batches()

    def _parse_rows(
        self, data: bytes, buf: np.ndarray, bounds: np.ndarray, lo: int, hi: int, names: Sequence[str],
        columns: Sequence[str], path: str, line_of: np.ndarray, skip: bool,
    ) -> pa.Table:
        """Rows ``[lo, hi)`` of a group, each line on its own (see
        :mod:`~tzrun_plugins.readers.quoting`): a run with a quote is parsed as it is and kept when
        pyarrow made one row of each line, else parsed again around its lines that end inside
        quotes."""
        piece, lines = data[int(bounds[lo]) : int(bounds[hi])], line_of[lo:hi]
        quote, delimiter = self.cfg.quote_char, self.cfg.delimiter
        if not quote or quote.encode() not in piece:
            return self._parse(piece, names, columns, path, lines, skip)
        try:
            last = data[int(bounds[hi - 1]) : int(bounds[hi])]
            if b"\r" in piece and piece.count(b"\r") != piece.count(b"\r\n") or ends_inside_quotes(last, delimiter, quote):
                raise _RanOn  # a lone \r is a line break to pyarrow; the last line would run to the end
            return self._parse(piece, names, columns, path, lines, skip, whole_lines=True)
        except (_RanOn, DataError) as exc:
            out = lo + unclosed_rows(piece, buf[int(bounds[lo]) : int(bounds[hi])], bounds[lo:hi] - bounds[lo], delimiter, quote)
            if out.size:
                return self._parse_around(data, bounds, lo, hi, out, names, columns, path, line_of, skip)
            if isinstance(exc, DataError):
                raise
            return self._parse(piece, names, columns, path, lines, skip)

    def _parse_around(
        self, data: bytes, bounds: np.ndarray, lo: int, hi: int, out: np.ndarray, names: Sequence[str],
        columns: Sequence[str], path: str, line_of: np.ndarray, skip: bool,
    ) -> pa.Table:
        """Rows ``[lo, hi)`` of a group whose rows ``out`` end inside a quoted value: the others
        are parsed without them, and each of them is a bad row of its own (``skip``) or an error
        naming its line, column and quote."""
        if not skip:
            first = int(out[0])
            if first > lo:  # a problem on an earlier line is reported first
                self._parse(data[int(bounds[lo]) : int(bounds[first])], names, columns, path, line_of[lo:first])
            line = data[int(bounds[first]) : int(bounds[first + 1])]
            raise DataError(unclosed_quote_message(path, line, int(line_of[first]), names, self.cfg.delimiter, self.cfg.quote_char))
        keep = np.setdiff1d(np.arange(lo, hi), out)
        begins, ends = np.append(lo, out + 1), np.append(out, hi)
        piece = b"".join(data[int(bounds[a]) : int(bounds[b])] for a, b in zip(begins, ends) if a < b)
        table = self._parse(piece, names, columns, path, line_of[keep], skip)
        return with_rows_left_out(table, hi - lo, out - lo, UNBALANCED_QUOTE)

    def describe_row(self, group: RowGroup, row: int) -> str:
        """``line N``: the 1-based line of row ``row`` of ``group`` (named in errors)."""
        index = self._index.get(group.path) or self._scan(group.path)
        _, buf, starts = _group_rows(group, index)
        return f"line {int(_line_numbers(buf, starts[row : row + 1], int(index.lines[group.index]))[0])}"

    def _parse(
        self, piece: bytes, names: Sequence[str], columns: Sequence[str], path: str, lines: np.ndarray,
        skip: bool = False, whole_lines: bool = False,
    ) -> pa.Table:
        """Parse one run of rows; ``lines`` are their 1-based line numbers (for errors). With
        ``skip``, bad rows stay as null rows with their reasons in ``BAD_ROW_COLUMN``.

        Raises:
            _RanOn: with ``whole_lines``, when pyarrow did not make one row of each line.
        """
        types = {c: COLUMN_TYPES[self.cfg.column_types.get(c, self.cfg.default_type)] for c in columns}
        if not piece:  # every line of the run ends inside quotes
            table = pa.schema([(c, types[c]) for c in columns]).empty_table()
            return with_bad_rows(table, 0, [], {}) if skip else table
        invalid: list[Any] = []
        reasons: dict[int, list[str]] = {}
        try:
            try:
                table = self._read(piece, names, columns, types, invalid, skip)
            except pa.ArrowInvalid:
                if not skip:
                    raise
                invalid.clear()  # a field that does not parse: read the block again as text
                table = self._read(piece, names, columns, {c: pa.string() for c in columns}, invalid, skip)
                table, reasons = convert_fields(table, types)
        except pa.ArrowInvalid as exc:
            raise DataError(self._explain(str(exc), invalid, names, path, lines, types)) from None
        if whole_lines and table.num_rows + len(invalid) != len(lines):
            raise _RanOn
        if not skip:
            return table
        return with_bad_rows(table, len(lines), [(row.number or 0) - 1 for row in invalid], reasons)

    def _read(
        self, piece: bytes, names: Sequence[str], columns: Sequence[str], types: Mapping[str, pa.DataType],
        invalid: list[Any], skip: bool,
    ) -> pa.Table:
        """pyarrow's parse of ``piece``; a malformed line is appended to ``invalid``, and left
        out (``skip``) or an error."""
        cfg = self.cfg

        def on_invalid(row: Any) -> str:
            invalid.append(row)
            return "skip" if skip else "error"

        return pacsv.read_csv(
            pa.py_buffer(piece),
            read_options=pacsv.ReadOptions(column_names=list(names), use_threads=False, block_size=max(len(piece), 1 << 20)),
            parse_options=pacsv.ParseOptions(
                delimiter=cfg.delimiter,
                quote_char=cfg.quote_char or False,
                invalid_row_handler=on_invalid,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=list(columns),
                null_values=list(cfg.null_values),
                strings_can_be_null=True,
                quoted_strings_can_be_null=True,
            ),
        )

    def _explain(
        self, message: str, invalid: list[Any], names: Sequence[str], path: str, lines: np.ndarray, types: Mapping[str, pa.DataType]
    ) -> str:
        """A pyarrow parse or conversion error, as the file, line and column it is about."""
        import re

        def line(row_number: int) -> str:
            return f"line {int(lines[row_number - 1])}" if 0 < row_number <= len(lines) else "a line"

        if invalid:
            row = invalid[0]
            text = row.text if len(row.text) <= 120 else row.text[:117] + "..."
            return (
                f"{path}: {line(row.number or 0)} has {row.actual_columns} field(s), expected {row.expected_columns} "
                f"separated by {self.cfg.delimiter!r}: {text!r}; fix the line, or data.reader's delimiter/column_names"
            )
        found = re.search(r"column #(\d+): Row #(\d+): CSV conversion error to (\w+): (.*)", message)
        if found:
            column = names[int(found.group(1))] if int(found.group(1)) < len(names) else f"#{found.group(1)}"
            return (
                f"{path}: {line(int(found.group(2)))}: column '{column}' is declared {_type_name(types.get(column))} "
                f"but holds {found.group(4)}; fix the data or data.reader.column_types"
            )
        return f"{path}: cannot be parsed as delimited text: {message}"

    def _scan(self, path: str) -> _FileIndex:
        """Index ``path`` (see the module docstring), once per reader."""
        try:
            stamp = file_stamp(path)
            cached = self._index.get(path)
            if cached is not None and cached.stamp == stamp:
                return cached
            index = self._scan_file(path, stamp)
        except OSError as exc:
            raise DataError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        self._index[path] = index
        return index

    def _scan_file(self, path: str, stamp: tuple[int, Any]) -> _FileIndex:
        cfg = self.cfg
        per_group = cfg.rows_per_group
        offsets: list[int] = []
        lines: list[int] = []
        rows, lines_before = 0, 0
        names: tuple[str, ...] | None = None if cfg.header else tuple(cfg.column_names)
        base, line_start, prev = 0, 0, 0
        with open_input(path) as f:
            head = f.read(2)
            if head == b"\x1f\x8b":
                raise DataError(f"{path}: is gzip-compressed; the csv reader reads plain text (decompress it first)")
            f.seek(0)
            while True:
                chunk = f.read(_SCAN_BYTES)
                if not chunk:
                    break
                buf = np.frombuffer(chunk, np.uint8)
                starts, which, next_start = _row_starts(buf, base, line_start, prev)
                line_numbers = lines_before + which + 1
                if names is None and starts.size:
                    f.seek(int(starts[0]))
                    names = self._header(path, f.readline())
                    f.seek(base + len(chunk))
                    starts, line_numbers = starts[1:], line_numbers[1:]
                at = rows + np.arange(starts.size)
                first = at % per_group == 0
                offsets.extend(int(x) for x in starts[first])
                lines.extend(int(x) for x in line_numbers[first])
                rows += starts.size
                lines_before += int(np.count_nonzero(buf == NEWLINE))
                base += len(chunk)
                line_start, prev = next_start, int(buf[-1])
            size = base
            f.seek(line_start)
            tail = f.read()
        if _is_row(tail):
            if names is None:
                names = self._header(path, tail)
            else:
                if rows % per_group == 0:
                    offsets.append(line_start)
                    lines.append(lines_before + 1)
                rows += 1
        if names is None:
            names = ()  # an empty file: no header, no rows
        counts = np.full(len(offsets), per_group, np.int64)
        if offsets:
            counts[-1] = rows - per_group * (len(offsets) - 1)
        return _FileIndex(names, stamp, np.array(offsets + [size], np.int64), np.array(lines, np.int64), counts)

    def _header(self, path: str, line: bytes) -> tuple[str, ...]:
        """The column names of a header line."""
        import csv

        try:
            text = line.decode("utf-8-sig").rstrip("\r\n")  # "-sig": a UTF-8 BOM is not part of the first name
            quoting = {"quotechar": self.cfg.quote_char} if self.cfg.quote_char else {"quoting": csv.QUOTE_NONE}
            names = tuple(n.strip() for n in next(csv.reader([text], delimiter=self.cfg.delimiter, **quoting)))
        except (UnicodeDecodeError, csv.Error, StopIteration) as exc:
            raise DataError(f"{path}: line 1 is not a header of {self.cfg.delimiter!r}-separated names: {exc}") from None
        unknown = [c for c in self.cfg.column_types if c not in names]
        if unknown:
            raise DataError(
                f"{path}: data.reader.column_types names column(s) {', '.join(repr(c) for c in unknown)} "
                f"that the header does not have (the file has: {', '.join(names)})"
            )
        return names


def _group_rows(group: RowGroup, index: _FileIndex) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The bytes of ``group`` (one read), as an array too, and where each of its rows starts."""
    data = read_range(group.path, int(index.offsets[group.index]), int(index.offsets[group.index + 1]))
    buf = np.frombuffer(data, np.uint8)
    starts, _, tail = _row_starts(buf, 0, 0, 0)
    if _is_row(data[tail:]):
        starts = np.append(starts, tail)
    return data, buf, starts


def _line_numbers(buf: np.ndarray, starts: np.ndarray, first_line: int) -> np.ndarray:
    """1-based line numbers of the rows starting at ``starts`` of a group read into ``buf``."""
    breaks = np.flatnonzero(buf == NEWLINE)
    return first_line + np.searchsorted(breaks, starts, side="left")


def _type_name(typ: pa.DataType | None) -> str:
    for name, known in COLUMN_TYPES.items():
        if known == typ:
            return name
    return str(typ)


def build_csv(cfg: CsvConfig) -> CsvReader:
    """The reader."""
    return CsvReader(cfg)
