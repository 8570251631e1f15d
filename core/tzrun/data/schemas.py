"""Record batches from files whose schemas drift, made into one table.

Files written at different times often differ slightly: a column nullable in one file and not
null in another, an ``int32`` that became an ``int64``, a ``float`` that became a ``double``.
Such schemas are *compatible*: :class:`SchemaUnifier` widens its schema with
``pyarrow.unify_schemas(..., promote_options="permissive")`` as files arrive and casts every
record batch of a batch to it, so a batch may straddle the files. A column whose kind differs
(text in one file, integers in another; integers vs floats; lists vs scalars) is
*incompatible*: a :class:`~tzrun.errors.DataError` names both files, the column and both types.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.types as pat

from tzrun.errors import DataError

__all__ = ["SchemaUnifier", "type_kind"]


def type_kind(t: pa.DataType) -> str:
    """What must agree between two files' types of one column for them to be unified:
    ``"int"``, ``"float"``, ``"text"``, ``"list<...>"`` of those, or the type itself."""
    if pat.is_dictionary(t):
        return type_kind(t.value_type)
    if pat.is_integer(t):
        return "int"
    if pat.is_floating(t):
        return "float"
    if pat.is_string(t) or pat.is_large_string(t):
        return "text"
    if pat.is_list(t) or pat.is_large_list(t):
        return f"list<{type_kind(t.value_type)}>"
    return str(t)


def _shown(t: pa.DataType) -> pa.DataType:
    """The type as the file has it (text read as a dictionary shows as its values' type)."""
    return t.value_type if pat.is_dictionary(t) else t


class SchemaUnifier:
    """The widest schema seen so far of one stream's record batches, and the file each
    column's type came from (named in errors)."""

    def __init__(self) -> None:
        self.schema: pa.Schema | None = None
        self._origin: dict[str, str] = {}

    def see(self, schema: pa.Schema, path: str) -> None:
        """Fold in the schema of a record batch read from ``path``.

        Raises:
            DataError: naming both files, the column and both types, when a column's kind
                differs from what earlier files had.
        """
        if self.schema is None:
            self.schema = schema
            self._origin = {name: path for name in schema.names}
            return
        if schema.equals(self.schema):
            return
        for field in schema:
            index = self.schema.get_field_index(field.name)
            if index < 0:
                self._origin[field.name] = path
                continue
            known = self.schema.field(index).type
            if type_kind(known) != type_kind(field.type) and not (pat.is_null(known) or pat.is_null(field.type)):
                raise DataError(
                    f"column {field.name!r} is {_shown(known)} in {self._origin[field.name]} but {_shown(field.type)} in {path}: "
                    "the files' schemas are incompatible; rewrite one of the files so that the column has "
                    "one kind of type (nullability and integer or float widths may differ)"
                )
        try:
            unified = pa.unify_schemas([self.schema, schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(
                f"{path}: its schema cannot be unified with {', '.join(sorted(set(self._origin.values())))}: {exc}; "
                "rewrite the files with one schema"
            ) from None
        for field in unified:
            if field.name in schema.names and not self.schema.field(field.name).type.equals(field.type):
                self._origin[field.name] = path
        self.schema = unified

    def table(self, parts: Sequence[pa.RecordBatch]) -> pa.Table:
        """``parts`` as one table, each cast to :attr:`schema` where it differs (every part must
        have been :meth:`see`-n)."""
        if not parts or all(p.schema.equals(parts[0].schema) for p in parts[1:]):
            return pa.Table.from_batches(parts)
        assert self.schema is not None
        schema = pa.schema([self.schema.field(name) for name in parts[0].schema.names])
        return pa.Table.from_batches(
            [p if p.schema.equals(schema) else p.cast(schema) for p in parts], schema=schema
        )
