"""Tests for tzrun.data.hashing: FNV-1a 64-bit over Arrow string/binary arrays."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from tzrun.data.hashing import fnv1a_64, hash_to_buckets


def ref_fnv1a_64(data: bytes) -> int:
    """Pure-Python reference FNV-1a 64-bit."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return h


def _to_bytes(value: str | bytes | None) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else value.encode("utf-8")


def _expected(values: list) -> np.ndarray:
    return np.array([ref_fnv1a_64(_to_bytes(v)) for v in values], dtype=np.uint64)


def _random_unicode(rng: random.Random, max_len: int) -> str:
    # Mix of 1-, 2-, 3- and 4-byte UTF-8 code points.
    pools = [(0x20, 0x7E), (0xA0, 0x7FF), (0x800, 0xD7FF), (0x10000, 0x1F9FF)]
    chars = []
    for _ in range(rng.randint(0, max_len)):
        lo, hi = rng.choice(pools)
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", 0xCBF29CE484222325), ("a", 0xAF63DC4C8601EC8C), ("foobar", 0x85944171F73967E8)],
)
def test_published_vectors(value: str, expected: int) -> None:
    out = fnv1a_64(pa.array([value]))
    assert out.dtype == np.uint64
    assert int(out[0]) == expected
    assert ref_fnv1a_64(value.encode()) == expected


def test_published_vectors_in_one_array() -> None:
    out = fnv1a_64(pa.array(["", "a", "foobar"]))
    assert out.tolist() == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0x85944171F73967E8]


def test_matches_reference_on_random_unicode() -> None:
    rng = random.Random(1234)
    values = [_random_unicode(rng, 40) for _ in range(3000)]
    np.testing.assert_array_equal(fnv1a_64(pa.array(values)), _expected(values))


def test_equal_lengths_fast_path() -> None:
    values = [f"{i:08x}" for i in range(0, 5000 * 7919, 7919)]
    np.testing.assert_array_equal(fnv1a_64(pa.array(values)), _expected(values))


def test_one_long_value_among_short_ones() -> None:
    rng = random.Random(7)
    values = [_random_unicode(rng, 6) for _ in range(2000)]
    values[17] = "x" * 10_000 + "é"
    np.testing.assert_array_equal(fnv1a_64(pa.array(values)), _expected(values))


def test_sliced_array() -> None:
    rng = random.Random(99)
    values = [_random_unicode(rng, 12) for _ in range(40)]
    arr = pa.array(values).slice(3, 10)
    assert arr.offset == 3
    np.testing.assert_array_equal(fnv1a_64(arr), _expected(values[3:13]))


def test_sliced_array_with_nulls() -> None:
    values = ["a", None, "bc", "", None, "foobar", "zz", None, "q"]
    arr = pa.array(values).slice(1, 6)
    np.testing.assert_array_equal(fnv1a_64(arr), _expected(values[1:7]))


def test_chunked_array() -> None:
    rng = random.Random(5)
    chunks = [[_random_unicode(rng, 10) for _ in range(n)] for n in (7, 0, 31, 1)]
    chunked = pa.chunked_array([pa.array(c, type=pa.string()) for c in chunks])
    flat = [v for c in chunks for v in c]
    np.testing.assert_array_equal(fnv1a_64(chunked), _expected(flat))


def test_chunked_array_of_slices() -> None:
    values = [f"v{i}" for i in range(50)]
    base = pa.array(values)
    chunked = pa.chunked_array([base.slice(5, 10), base.slice(30, 3)])
    np.testing.assert_array_equal(fnv1a_64(chunked), _expected(values[5:15] + values[30:33]))


def test_empty_inputs() -> None:
    assert fnv1a_64(pa.array([], type=pa.string())).shape == (0,)
    assert fnv1a_64(pa.chunked_array([], type=pa.string())).shape == (0,)
    assert hash_to_buckets(pa.array([], type=pa.string()), 10).dtype == np.int64


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_all_supported_types_agree(typ: pa.DataType) -> None:
    rng = random.Random(11)
    values = [_random_unicode(rng, 15) for _ in range(300)] + [None, ""]
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        arr = pa.array([None if v is None else v.encode() for v in values], type=typ)
    else:
        arr = pa.array(values, type=typ)
    np.testing.assert_array_equal(fnv1a_64(arr), _expected(values))
    np.testing.assert_array_equal(fnv1a_64(arr.slice(100, 150)), _expected(values[100:250]))


def test_raw_binary_bytes() -> None:
    values = [bytes(range(256)), b"\x00", b"\xff\xfe", b""]
    np.testing.assert_array_equal(fnv1a_64(pa.array(values, type=pa.binary())), _expected(values))


def test_nulls_hash_like_empty_string() -> None:
    out = fnv1a_64(pa.array([None, "", "a", None]))
    assert out.tolist() == [0xCBF29CE484222325, 0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0xCBF29CE484222325]
    assert pa.array([None, "x"]).null_count == 1
    buckets = hash_to_buckets(pa.array([None, ""]), 1000)
    assert buckets[0] == buckets[1]


def test_null_slot_spanning_bytes_is_still_empty() -> None:
    # Build a string array by hand whose null slot covers non-empty bytes ("abc").
    validity = pa.py_buffer(np.packbits(np.array([1, 0, 1], dtype=bool), bitorder="little").tobytes())
    offsets = pa.py_buffer(np.array([0, 1, 4, 6], dtype=np.int32).tobytes())
    data = pa.py_buffer(b"xabcyz")
    arr = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, data], null_count=1)
    assert arr.to_pylist() == ["x", None, "yz"]
    np.testing.assert_array_equal(fnv1a_64(arr), _expected(["x", None, "yz"]))


def test_hash_to_buckets_range_and_definition() -> None:
    rng = random.Random(3)
    values = [_random_unicode(rng, 20) for _ in range(2000)]
    arr = pa.array(values)
    for num_buckets in (1, 2, 7, 1000, 2**31 - 1, 2**62 + 3):
        buckets = hash_to_buckets(arr, num_buckets)
        assert buckets.dtype == np.int64
        assert buckets.min() >= 0 and buckets.max() < num_buckets
        assert buckets.tolist() == [ref_fnv1a_64(v.encode()) % num_buckets for v in values]
    # All buckets of a small table get used.
    assert len(np.unique(hash_to_buckets(arr, 16))) == 16


@pytest.mark.parametrize("bad", [0, -3, 2**63, 1.5, True, "10"])
def test_hash_to_buckets_rejects_bad_bucket_count(bad: object) -> None:
    with pytest.raises(ValueError, match="num_buckets"):
        hash_to_buckets(pa.array(["a"]), bad)  # type: ignore[arg-type]


def test_unsupported_types_rejected() -> None:
    with pytest.raises(TypeError):
        fnv1a_64(pa.array([1, 2, 3]))
    with pytest.raises(TypeError):
        fnv1a_64(pa.chunked_array([pa.array([1.0])]))
    with pytest.raises(TypeError):
        fnv1a_64(["a", "b"])  # type: ignore[arg-type]


def test_stability_hard_coded_values() -> None:
    # Values computed once with ref_fnv1a_64 and frozen here: a change in any of them
    # silently remaps every trained embedding row, so they must never change.
    expected = {
        "": 0xCBF29CE484222325,
        "a": 0xAF63DC4C8601EC8C,
        "foobar": 0x85944171F73967E8,
        "user_id=12345": 0x73F57C8E0A8739F8,
        "北京": 0x9AA1E75CF0257D61,
        "café 🍰": 0x67CE107C3BFE189F,
    }
    for value, hash_value in expected.items():
        assert ref_fnv1a_64(value.encode()) == hash_value
    out = fnv1a_64(pa.array(list(expected)))
    assert out.tolist() == list(expected.values())
    assert hash_to_buckets(pa.array(list(expected)), 1_000_003).tolist() == [
        v % 1_000_003 for v in expected.values()
    ]


def test_same_buckets_in_other_processes_whatever_their_hash_seed() -> None:
    """A fresh interpreter (another PYTHONHASHSEED, so another ``hash()``) computes the same
    buckets: what a model trained in one run looks up in the next."""
    import json
    import os
    import subprocess
    import sys

    values = ["68fd1e64", "", "ünïcödé", "a" * 300, "05db9164"]
    script = (
        "import json, sys, pyarrow as pa\n"
        "from tzrun.data.hashing import hash_to_buckets\n"
        "print(json.dumps(hash_to_buckets(pa.array(json.loads(sys.argv[1])), 1000003).tolist()))\n"
    )
    here = hash_to_buckets(pa.array(values), 1000003).tolist()
    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", script, json.dumps(values)],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert json.loads(out.stdout) == here
    assert here == [ref_fnv1a_64(v.encode()) % 1000003 for v in values]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([f"{i * 2654435761 % 2**32:08x}" for i in range(1000)], id="equal-lengths-block"),
        pytest.param([f"{i:x}" for i in range(1000)] + [None, ""], id="alike-lengths-gathered"),
        pytest.param(["a"] * 500 + ["x" * 5000] + ["bc"] * 500, id="one-long-value-walked"),
    ],
)
def test_each_layout_matches_the_reference_whole_and_sliced(values: list) -> None:
    arr = pa.array(values, pa.string())
    np.testing.assert_array_equal(fnv1a_64(arr), _expected(values))
    for start, stop in ((1, 999), (17, 18), (500, 1001)):
        np.testing.assert_array_equal(fnv1a_64(arr.slice(start, stop - start)), _expected(values[start:stop]))
