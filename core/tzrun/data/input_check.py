"""``tzrec-run check`` on the input files: their columns, from metadata only.

For each input of the run (``data.train_input``, ``data.eval_input``) the reader lists the files
and reads each one's schema (a Parquet footer, a CSV header line: no rows), and every column
the run reads is checked in every file:

* it is there (else ``<file>: column 'cat_3' missing (did you mean 'cat3'?)``);
* its kind of type is the same in every file of the input (the kinds of
  :func:`tzrun.data.schemas.type_kind`; nullability and integer or float widths may differ,
  as at run time);
* its type suits its use: numbers for a dense feature, a label or a sample weight (a list of
  numbers for a dense sequence, unless its group splits text); integer ids
  for ``num_buckets``; strings or integers for ``hash_bucket_size``, ``vocab`` and a
  ``group_by`` key.

The same problem in many files is one line, naming the first file and how many more have it.
An input path that does not exist is a problem when another input of the config exists, or
when the caller requires the data (``--require-data``); otherwise the data is taken to be not
reachable from here and only a note says so. Inputs on an object store (``s3://``, ``gs://``,
...) are listed and their schemas read the same way, by byte-range reads of each file's footer
or first line. At most ``max_files`` files of an input are read
(evenly spread over its files, first and last included).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs
import pyarrow as pa
import pyarrow.types as pat

from tzrun.config.schema import DataConfig
from tzrun.data.features import FeatureSpecs
from tzrun.data.hashing import is_hashable
from tzrun.data.schemas import type_kind
from tzrun.errors import DataError, StorageError, did_you_mean

__all__ = ["ColumnUse", "DataReport", "column_uses", "check_inputs", "check_data", "MAX_FILES"]

#: Files of one input whose schemas ``check`` reads at most.
MAX_FILES = 1000


@attrs.frozen
class ColumnUse:
    """What the run does with a column, and which element types that takes.

    Attributes:
        column: the input column.
        what: how messages name the use (``"dense feature 'price'"``).
        accepts: element kinds that fit: ``"int"``, ``"float"``, ``"bool"``, ``"text"``.
        fix: what to do when the column's type does not fit.
        lists: a list of such elements fits too (several values per row).
    """

    column: str
    what: str
    accepts: frozenset[str]
    fix: str
    lists: bool = False


@attrs.frozen
class DataReport:
    """What the data check found.

    Attributes:
        problems: one line each, starting with the file (or input path) concerned.
        notes: what was checked or skipped, one line each.
    """

    problems: list[str]
    notes: list[str]


_NUMBERS = frozenset({"int", "float", "bool"})
_IDS = frozenset({"int", "text"})


def column_uses(specs: FeatureSpecs, data: DataConfig, groups: Sequence[str], derived: Sequence[str]) -> list[ColumnUse]:
    """The type needs of the run's columns (a column may have several).

    Args:
        specs: the run's features.
        data: ``[data]`` (its labels and sample weight).
        groups: the ``group_by`` key columns.
        derived: the names of derived labels (their sources take any type the derivation reads).
    """
    uses = [ColumnUse(f.column, f"dense feature '{f.name}'", _NUMBERS, "cast the column to numbers") for f in specs.dense]
    id_features = [(f, f"feature '{f.name}'") for f in specs.sparse]
    id_features += [(f, f"sequence '{f.name}' of group '{g.name}'") for g in specs.sequence_groups for f in g.features]
    for f, what in id_features:
        if f.separator is not None:
            continue  # text is split and parsed per value: the values tell, not the type
        if f.hash_bucket_size is not None:
            uses.append(ColumnUse(f.column, f"{what} (hash_bucket_size)", _IDS, "hash a column of strings or integers", True))
        elif f.vocab is not None:
            uses.append(ColumnUse(f.column, f"{what} (vocab)", _IDS, "use strings or integers", True))
        elif f.boundaries is not None:
            uses.append(ColumnUse(f.column, f"{what} (boundaries)", frozenset({"int", "float", "text"}), "use numbers", True))
        else:
            uses.append(ColumnUse(
                f.column, f"{what} (num_buckets)", frozenset({"int"}),
                f"declare integer ids (a csv column is text unless data.reader.column_types = {{ {f.column} = \"int64\" }}), "
                "or use hash_bucket_size or vocab", True))
    uses += [ColumnUse(f.column, f"dense sequence '{f.name}' of group '{g.name}'", _NUMBERS, "use a list of numbers", True)
             for g in specs.sequence_groups if g.features and g.features[0].separator is None for f in g.dense]
    uses += [ColumnUse(name, f"label '{name}'", _NUMBERS, "use numbers, or a [[data.derived_labels]] entry")
             for name in data.labels if name not in derived]
    if data.sample_weight:
        uses.append(ColumnUse(data.sample_weight, "data.sample_weight", _NUMBERS, "use numbers"))
    uses += [ColumnUse(g, "a group_by key", _IDS, "use strings or integers") for g in groups]
    return uses


def _element_kind(t: pa.DataType, list_ok: bool) -> str | None:
    """``"int"``, ``"float"``, ``"bool"`` or ``"text"`` for a scalar (or, ``list_ok``, a list
    of scalars) of ``t``; None for anything else."""
    if pat.is_dictionary(t):
        return _element_kind(t.value_type, list_ok)
    if list_ok and (pat.is_list(t) or pat.is_large_list(t)):
        return _element_kind(t.value_type, False)
    if pat.is_integer(t):
        return "int"
    if pat.is_floating(t):
        return "float"
    if pat.is_boolean(t):
        return "bool"
    return "text" if is_hashable(t) else None


def _shown(t: pa.DataType) -> str:
    return str(t.value_type if pat.is_dictionary(t) else t)


class _Findings:
    """Problems keyed by their text after the file; each shown once, with its first file."""

    def __init__(self) -> None:
        self._first: dict[str, str] = {}
        self._more: dict[str, int] = {}

    def add(self, path: str, message: str) -> None:
        if message in self._first:
            self._more[message] = self._more.get(message, 0) + 1
        else:
            self._first[message] = path

    def lines(self) -> list[str]:
        out = []
        for message, path in self._first.items():
            more = self._more.get(message, 0)
            out.append(f"{path}: {message}" + (f" (and in {more} more file{'s' if more > 1 else ''})" if more else ""))
        return out


def _sample(files: Sequence[str], limit: int) -> list[str]:
    if len(files) <= limit:
        return list(files)
    if limit == 1:
        return [files[0]]
    return [files[round(i * (len(files) - 1) / (limit - 1))] for i in range(limit)]


def _check_files(reader: Any, files: Sequence[str], columns: Sequence[str], uses: Sequence[ColumnUse],
                 found: _Findings) -> None:
    """Read each file's schema and report what does not fit (see the module docstring)."""
    first: dict[str, tuple[str, pa.DataType]] = {}
    for path in files:
        try:
            schema = reader.schema(path)
        except DataError as exc:
            found.add(path, str(exc).removeprefix(f"{path}: "))
            continue
        if schema is None:
            continue
        names = schema.names
        for column in columns:
            if column not in names:
                guess = did_you_mean(column, names)
                found.add(path, f"column '{column}' missing" + (f" (did you mean '{guess}'?)" if guess else
                                                                f" (the file has {len(names)} columns)"))
                continue
            t = schema.field(column).type
            if column not in first or pat.is_null(first[column][1]):
                first[column] = (path, t)
            elif not pat.is_null(t) and type_kind(t) != type_kind(first[column][1]):
                origin, known = first[column]
                found.add(path, f"column '{column}' is {_shown(t)} here but {_shown(known)} in {origin}: the files' "
                                "schemas are incompatible; rewrite the files so that the column has one kind of type")
    for use in uses:
        if use.column not in first or pat.is_null(first[use.column][1]):
            continue
        path, t = first[use.column]
        if _element_kind(t, use.lists) not in use.accepts:
            found.add(path, f"column '{use.column}' is {_shown(t)}, which {use.what} cannot read; {use.fix}")


def _exists(path: str) -> bool:
    """Whether ``path`` names something (a URL: an object or a prefix of objects); a store
    that cannot answer counts as existing, so that the reader's own error is the one shown."""
    from tzrun.io.storage import exists

    try:
        return exists(path)
    except Exception:  # credentials, network: the listing's error says which
        return True


def check_inputs(reader: Any, inputs: Mapping[str, str], columns: Sequence[str], uses: Sequence[ColumnUse],
                 require: bool = False, max_files: int | None = None) -> DataReport:
    """Check the files of ``inputs`` (TOML key -> path) against what the run reads.

    Args:
        reader: the configured reader (with the optional ``files`` and ``schema`` of
            :class:`tzrun.interfaces.Reader`; without them nothing is checked and a note says so).
        inputs: ``{"data.train_input": path, ...}``.
        columns: every column the run reads.
        uses: the type needs of the columns (:func:`column_uses`).
        require: an input path that does not exist is a problem even when no input exists.
        max_files: files of one input read at most (default :data:`MAX_FILES`).

    Returns:
        The problems and notes (see the module docstring).
    """
    if not (callable(getattr(reader, "files", None)) and callable(getattr(reader, "schema", None))):
        return DataReport([], [f"data not checked: reader {type(reader).__name__} cannot list files or read a file's "
                               "schema (it has no files()/schema() methods)"])
    listed: dict[str, list[str]] = {}
    absent: list[str] = []
    problems: list[str] = []
    unopenable: dict[str, str] = {}  # a URL whose store this installation cannot open (odps://, ...)
    for key, path in inputs.items():
        try:
            listed[key] = list(reader.files(path))
        except StorageError as exc:
            absent.append(key)
            unopenable[key] = str(exc)
        except DataError as exc:
            if _exists(path):
                problems.append(str(exc))
            else:
                absent.append(key)
    if absent and not listed and not problems and not require:
        shown = ", ".join(f"{key} '{inputs[key]}'" for key in absent if key not in unopenable)
        notes = [f"data not checked: {shown} not found here (--require-data makes this an error)"] if shown else []
        notes += [f"data not checked: {key}: {reason} (--require-data makes this an error)" for key, reason in unopenable.items()]
        return DataReport([], notes)
    problems += [unopenable.get(key, f"{inputs[key]}: {key} does not exist (no file, directory or glob match)")
                 for key in absent]
    notes = []
    found = _Findings()
    for key, files in listed.items():
        checked = _sample(files, MAX_FILES if max_files is None else max_files)
        _check_files(reader, checked, columns, uses, found)
        part = f"{len(checked)} of {len(files)} files (evenly spread)" if len(checked) < len(files) else f"{len(files)} file(s)"
        notes.append(f"data: {key}: schemas of {part} read")
    return DataReport(problems + found.lines(), notes)


def check_data(cfg: Any, reader: Any, specs: FeatureSpecs, columns: Sequence[str], groups: Sequence[str],
               require: bool = False) -> DataReport:
    """:func:`check_inputs` for a run's config: its inputs, columns and their uses.

    Args:
        cfg: the checked :class:`~tzrun.config.schema.RunConfig`.
        reader: the configured reader.
        specs: the run's features.
        columns: every column the run reads.
        groups: the ``group_by`` key columns.
        require: see :func:`check_inputs`.
    """
    d = cfg.data
    inputs = {"data.train_input": d.train_input}
    if d.eval_input is not None:
        inputs["data.eval_input"] = d.eval_input
    derived = [x.name for x in d.derived_labels]
    return check_inputs(reader, inputs, columns, column_uses(specs, d, groups, derived), require)
