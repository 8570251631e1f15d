"""Label domains and derived labels, applied by the batch builder to each batch's label columns.

Every loss and metric declares the labels it accepts when it is registered (``labels=``):

- ``"binary"``: 0 or 1 (``binary_cross_entropy``, ``auc``, ...);
- ``"class_index"``: a whole number ``>= 0``, below ``num_classes`` when the component's
  options have a ``num_classes`` (``softmax_cross_entropy``);
- ``"non_negative"``: a number ``>= 0`` (a graded relevance, a count);
- ``"finite"``: any finite number (``l2``, ``mse``), which every label must be anyway.

The run needs, per label column, the strictest domain of the losses and metrics reading it
(:func:`strictest`); the builder checks each batch against it with a few vectorised numpy
comparisons. A derived label (``[[data.derived_labels]]``) is computed from its source
column: cast, then mapped, then compared (:func:`derive`), and is then checked like a column.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional, Sequence

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tzrun.errors import DataError
from tzrun.kernel.registry import LABEL_DOMAINS

__all__ = ["LABEL_DOMAINS", "LabelDomain", "strictest", "violations", "DerivedLabel", "derive", "label_sources"]

_WHAT = {
    "binary": "labels of 0 or 1",
    "class_index": "class indices (whole numbers >= 0{below})",
    "non_negative": "labels >= 0",
    "finite": "finite labels",
}


@attrs.frozen
class LabelDomain:
    """What one loss or metric needs of a label column.

    Attributes:
        domain: one of :data:`LABEL_DOMAINS`.
        needed_by: how messages name the component (``"losses[0] (binary_cross_entropy)"``).
        num_classes: the bound of ``"class_index"`` labels, when known.
    """

    domain: str
    needed_by: str
    num_classes: Optional[int] = None

    def describe(self) -> str:
        """``losses[0] (softmax_cross_entropy) needs class indices (...)``."""
        below = f" below {self.num_classes}" if self.num_classes else ""
        return f"{self.needed_by} needs {_WHAT[self.domain].format(below=below)}"

    def implies(self, other: "LabelDomain") -> bool:
        """Whether every label this domain accepts is accepted by ``other`` too."""
        if other.domain == "finite":
            return True
        if other.domain == "non_negative":
            return self.domain != "finite"
        if other.domain == "class_index":
            if self.domain == "binary":
                return other.num_classes is None or other.num_classes >= 2
            return self.domain == "class_index" and (
                other.num_classes is None or (self.num_classes is not None and self.num_classes <= other.num_classes))
        return self.domain == "binary"


def strictest(domains: Iterable[LabelDomain]) -> tuple[LabelDomain, ...]:
    """The domains a column must be checked against: those no other one implies (a column read
    by ``binary_cross_entropy`` and ``mse`` is checked for 0/1 only), ``"finite"`` left out (the
    builder checks every label for it)."""
    ordered = sorted((d for d in domains if d.domain != "finite"), key=lambda d: (-LABEL_DOMAINS.index(d.domain), d.num_classes or np.inf))
    kept: list[LabelDomain] = []
    for d in ordered:
        if not any(k.implies(d) for k in kept):
            kept.append(d)
    return tuple(kept)


def _outside(values: np.ndarray, domain: LabelDomain) -> np.ndarray:
    if domain.domain == "binary":
        return (values != 0.0) & (values != 1.0)
    if domain.domain == "non_negative":
        return values < 0.0
    outside = (values < 0.0) | (values != np.floor(values))
    if domain.num_classes:
        outside |= values >= domain.num_classes
    return outside


def violations(
    values: np.ndarray, domains: Sequence[LabelDomain]
) -> Iterable[tuple[LabelDomain, np.ndarray]]:
    """``(domain, mask of the rows outside it)`` for each domain some finite value of ``values``
    is outside of (NaN and infinite values are reported as such elsewhere)."""
    if not domains or not values.size:
        return
    finite = np.isfinite(values)
    for domain in domains:
        outside = _outside(values, domain) & finite
        if outside.any():
            yield domain, outside


@attrs.frozen
class DerivedLabel:
    """A label computed from another column (``[[data.derived_labels]]``): ``source`` is read,
    ``cast`` (``"float"`` parses text, ``"int"`` also truncates toward zero), then ``map``
    (keys are the source's values written as in TOML keys: ``"5"``, ``"click"``; an unmapped
    value takes ``default``, or is a bad value without one), then compared: ``source <op>
    value`` gives 1.0 or 0.0."""

    name: str
    source: str
    op: Optional[str] = None
    value: Optional[float] = None
    map: Optional[Mapping[str, float]] = None
    default: Optional[float] = None
    cast: Optional[str] = None

    @property
    def expression(self) -> str:
        """How messages name it: ``derived label 'clicked' (rating >= 4)``."""
        how = f"{self.source} {self.op} {self.value:g}" if self.op else f"from {self.source}"
        return f"derived label '{self.name}' ({how})"


_COMPARE: Mapping[str, Callable[[np.ndarray, float], np.ndarray]] = {
    ">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less, "==": np.equal, "!=": np.not_equal,
}


def label_sources(labels: Sequence[str], derived: Sequence[DerivedLabel]) -> list[str]:
    """The columns ``labels`` are read from: a derived label's source in its stead."""
    by_name = {d.name: d.source for d in derived}
    return [by_name.get(name, name) for name in labels]


def derive(
    column: pa.Array, label: DerivedLabel, source: str, found: Callable[[str, np.ndarray, Callable[[int], str]], None]
) -> tuple[np.ndarray, np.ndarray | None]:
    """The float32 values of a derived label and its null mask (``None`` when none) from its
    source ``column``; unparsable or unmapped values are reported through ``found`` (see
    :meth:`tzrun.data.columns.BadRows.found`) and become NaN.

    Raises:
        DataError: naming ``source`` (the file), when the column's type does not fit.
    """
    nulls = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None
    if label.cast is not None:
        column = _cast(column, label, found)
    if label.map is not None:
        values = _mapped(column, label, source, found)
    else:
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type)):
            raise DataError(f"{source}: column '{label.source}' ({label.expression}) has type {column.type}; "
                            'expected a number: set cast = "float" on the derived label to parse text')
        values = np.array(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64, copy=True)
    if label.op is not None and label.value is not None:
        known = ~np.isnan(values)
        result = _COMPARE[label.op](values, label.value).astype(np.float32)
        result[~known] = np.nan
        return result, nulls
    return values.astype(np.float32), nulls


def _cast(column: pa.Array, label: DerivedLabel, found: Callable[..., None]) -> pa.Array:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = pc.utf8_trim_whitespace(column)
        number = pc.match_substring_regex(text, r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$").fill_null(True)
        unparsable = ~number.to_numpy(zero_copy_only=False)
        if unparsable.any():
            first = text.filter(pa.array(unparsable))[0].as_py()
            found(f"{label.source}: not a number", unparsable,
                  lambda n: f"column '{label.source}' ({label.expression}, cast = \"{label.cast}\") has {n} value(s) "
                  f"that are not numbers (first: {first!r}); fix the data")
            text = pc.if_else(pa.array(unparsable), pa.scalar(None, text.type), text)
        column = text.cast(pa.float64())
    else:
        column = column.cast(pa.float64())
    if label.cast == "int":
        column = pc.trunc(column)
    return column


def _mapped(column: pa.Array, label: DerivedLabel, source: str, found: Callable[..., None]) -> np.ndarray:
    """Each value's entry in the map (NaN for a null, and for an unmapped value without a
    default, reported)."""
    assert label.map is not None
    keys = list(label.map)
    missing = len(keys)
    targets = np.array([*label.map.values(), np.nan if label.default is None else label.default], dtype=np.float64)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        index = pc.index_in(column.cast(pa.string()), value_set=pa.array(keys, pa.string()))
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type):
        try:
            numbers = [float(k) for k in keys]
        except ValueError:
            bad = next(k for k in keys if not _is_number(k))
            raise DataError(f"{source}: column '{label.source}' holds numbers but the map of {label.expression} has "
                            f"the key {bad!r}; write the keys as the column's numbers (\"1\", \"5\")") from None
        index = pc.index_in(column.cast(pa.float64()), value_set=pa.array(numbers, pa.float64()))
    else:
        raise DataError(f"{source}: column '{label.source}' ({label.expression}) has type {column.type}; "
                        "a map needs numbers or strings")
    at = np.array(index.fill_null(missing).to_numpy(zero_copy_only=False), dtype=np.int64)
    values = targets[at]
    nulls = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else np.zeros(len(column), bool)
    values[nulls] = np.nan
    unmapped = (at == missing) & ~nulls
    if label.default is None and unmapped.any():
        first = column.filter(pa.array(unmapped))[0].as_py()
        found(f"{label.source}: not in map", unmapped,
              lambda n: f"column '{label.source}' ({label.expression}) has {n} value(s) the map does not hold "
              f"(first: {first!r}; the map holds {', '.join(map(repr, keys))}); add them to the map or set a default")
    return values


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
