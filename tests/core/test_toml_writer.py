"""One TOML writer (``tzrun.runner.records.toml_literal``): what it writes reads back as the same
value, for the resolved config and for the defaults the reference and ``plugins`` show."""

from __future__ import annotations

import math
import sys

import pytest

from tzrun.runner.records import toml_literal
from tzrun_tools.reference.fields import toml_value

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.mark.parametrize("value", [
    {"a b": 1, "c.d": [1.5, "s\"q"], "e": {}}, [True, False], -7, 1e-8, "ünï\ncode", {"nested": {"x": [1, 2]}},
])
def test_both_writers_write_toml_that_reads_back(value):
    assert tomllib.loads(f"x = {toml_literal(value)}")["x"] == value
    assert tomllib.loads(f"x = {toml_value(value)}")["x"] == value


def test_non_finite_floats_and_tuples():
    assert math.isinf(tomllib.loads(f"x = {toml_value(float('-inf'))}")["x"])
    assert toml_value((1, 2)) == "[1, 2]" and toml_value(None) == "None"
