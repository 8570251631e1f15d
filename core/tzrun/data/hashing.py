"""Stable, vectorized string hashing for categorical features.

Categorical string features are mapped to embedding rows by hashing each string into
``hash_bucket_size`` buckets. The mapping must never change between processes, runs,
machines or Python versions (a model trained today must look up the same rows when it is
served next year), so Python's built-in ``hash()`` (salted per process for ``str``) cannot
be used. This module uses **FNV-1a 64-bit** over the raw bytes of each value:

.. code-block:: text

    h = 0xcbf29ce484222325                      # offset basis
    for byte in value:                          # UTF-8 bytes for strings
        h = ((h ^ byte) * 0x100000001b3) % 2**64  # xor, then multiply by the FNV prime

and the bucket of a value is ``h % num_buckets``. Known test vectors: ``""`` ->
``0xcbf29ce484222325``, ``"a"`` -> ``0xaf63dc4c8601ec8c``, ``"foobar"`` ->
``0x85944171f73967e8``.

The implementation works directly on an Arrow array's offsets and data buffers with numpy
(no Python loop over values). Values are processed byte position by byte position,
vectorized across all values. When every value has the same length (hex ids, fixed-width
codes) the data buffer is one ``(n, length)`` block and byte position ``j`` is its column
``j``. Otherwise the values are ordered by length (longest first) once, so at byte position
``j`` the values still having a ``j``-th byte form a contiguous prefix of that order; their
bytes are gathered into one padded block when lengths are alike, or read position by position
when a few values are much longer than the rest. The total work is therefore proportional to
the total number of bytes plus a small constant per byte position of the longest value, so a
single very long value among many short ones stays cheap.

Null values are hashed like the empty string ``""`` (that is, to the offset basis). Callers
that want a different treatment of nulls (a dedicated bucket, dropping the row, ...) must
fill or filter them before hashing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["FNV1A_64_OFFSET_BASIS", "FNV1A_64_PRIME", "fnv1a_64", "hash_to_buckets", "is_hashable"]

FNV1A_64_OFFSET_BASIS: int = 0xCBF29CE484222325
"""FNV-1a 64-bit offset basis: the hash of the empty byte string."""

FNV1A_64_PRIME: int = 0x100000001B3
"""FNV 64-bit prime, multiplied in after xor-ing each byte."""


def is_hashable(typ: pa.DataType) -> bool:
    """Whether :func:`fnv1a_64` hashes values of ``typ``: a variable-size string or binary type
    with int32/int64 offsets."""
    return (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    )


def _fnv1a_64_array(arr: pa.Array) -> np.ndarray:
    """Hash one (possibly sliced) string/binary Arrow array.

    Args:
        arr: A ``string``, ``large_string``, ``binary`` or ``large_binary`` array.

    Returns:
        ``uint64`` array of FNV-1a 64-bit hashes, one per value, nulls hashed as ``""``.
    """
    n = len(arr)
    out = np.full(n, FNV1A_64_OFFSET_BASIS, dtype=np.uint64)
    if n == 0:
        return out

    is_large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offset_dtype = np.int64 if is_large else np.int32
    _, offsets_buf, data_buf = arr.buffers()
    # The offsets buffer of a sliced array still starts at the parent's first value:
    # ``arr.offset`` says where this array's n + 1 offsets begin.
    offsets = np.frombuffer(offsets_buf, dtype=offset_dtype, count=arr.offset + n + 1)[arr.offset :]
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    if arr.null_count > 0:
        # Arrow allows a null slot to span non-empty bytes; force it to hash like "".
        is_null = arr.is_null().to_numpy(zero_copy_only=False)
        lengths[is_null] = 0

    max_len = int(lengths.max())
    if max_len == 0:
        return out
    data = np.frombuffer(data_buf, dtype=np.uint8)

    prime = np.uint64(FNV1A_64_PRIME)
    if int(lengths.min()) == max_len:
        # Every value has max_len bytes (no nulls among them): Arrow's offsets are then evenly
        # spaced, so the bytes form one (n, max_len) block and column j holds every j-th byte.
        first = int(starts[0])
        block = data[first : first + n * max_len].reshape(n, max_len)
        with np.errstate(over="ignore"):
            for j in range(max_len):
                np.bitwise_xor(out, block[:, j], out=out)
                np.multiply(out, prime, out=out)  # uint64 multiplication wraps modulo 2**64
        return out

    # Order values longest first, so values with at least j + 1 bytes are a prefix.
    # A stable sort of 16-bit keys is a radix sort (O(n)); most categorical values are short.
    key_dtype = np.int16 if max_len < 2**15 else np.int64
    order = np.argsort((-lengths).astype(key_dtype), kind="stable")
    starts_sorted = starts[order]
    lengths_sorted = lengths[order]
    # active_counts[j] = number of values whose length is > j.
    # -lengths_sorted is ascending; the values with -len < -j (len > j) form its prefix.
    active_counts = np.searchsorted(-lengths_sorted, -np.arange(max_len, dtype=np.int64), side="left")

    h = np.full(n, FNV1A_64_OFFSET_BASIS, dtype=np.uint64)
    total_bytes = int(lengths.sum())
    with np.errstate(over="ignore"):
        if n * max_len <= 4 * total_bytes + 16 * n:
            # Lengths are alike: gather the bytes into an (n, max_len) block in one call (the
            # tail of a short value holds other bytes, but only active prefixes are read).
            index = starts_sorted[:, None] + np.arange(max_len, dtype=np.int64)
            np.minimum(index, data.size - 1, out=index)
            block = data[index]
            for j in range(max_len):
                k = int(active_counts[j])
                hk = h[:k]
                np.bitwise_xor(hk, block[:k, j], out=hk)
                np.multiply(hk, prime, out=hk)
        else:
            # A few long values among short ones: walk byte positions over the active prefix.
            pos = starts_sorted.copy()
            byte = np.empty(n, dtype=np.uint8)
            for j in range(max_len):
                k = int(active_counts[j])
                hk = h[:k]
                bk = byte[:k]
                data.take(pos[:k], out=bk)
                np.bitwise_xor(hk, bk, out=hk)
                np.multiply(hk, prime, out=hk)
                pos[:k] += 1

    out[order] = h
    return out


def fnv1a_64(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """FNV-1a 64-bit hash of every value of a string or binary Arrow array.

    Strings are hashed over their UTF-8 bytes (Arrow stores them as UTF-8), binary values
    over their raw bytes. The result is stable across processes, runs, machines and
    library versions. Null values hash like the empty string (to the offset basis
    ``0xcbf29ce484222325``); fill or filter nulls first for any other behaviour.

    Args:
        values: A ``string``, ``large_string``, ``binary`` or ``large_binary``
            ``pa.Array`` (sliced arrays are fine) or a ``pa.ChunkedArray`` of one of those
            types.

    Returns:
        A ``np.uint64`` array with one hash per value, in order.

    Raises:
        TypeError: If ``values`` is not an Arrow array of a supported type.

    Example:
        >>> hex(int(fnv1a_64(pa.array(["foobar"]))[0]))
        '0x85944171f73967e8'
    """
    if isinstance(values, pa.ChunkedArray):
        if not is_hashable(values.type):
            raise TypeError(f"fnv1a_64 supports string/large_string/binary/large_binary arrays, got {values.type}")
        if values.num_chunks == 0:
            return np.empty(0, dtype=np.uint64)
        return np.concatenate([_fnv1a_64_array(chunk) for chunk in values.chunks])
    if isinstance(values, pa.Array):
        if not is_hashable(values.type):
            raise TypeError(f"fnv1a_64 supports string/large_string/binary/large_binary arrays, got {values.type}")
        return _fnv1a_64_array(values)
    raise TypeError(f"fnv1a_64 expects a pyarrow Array or ChunkedArray, got {type(values).__name__}")


def hash_to_buckets(values: pa.Array | pa.ChunkedArray, num_buckets: int) -> np.ndarray:
    """Map every value to a bucket in ``[0, num_buckets)`` as ``fnv1a_64(value) % num_buckets``.

    Args:
        values: Same as for :func:`fnv1a_64` (nulls land in the bucket of ``""``).
        num_buckets: The number of buckets (the embedding table's ``hash_bucket_size``);
            a positive integer below ``2**63``.

    Returns:
        A ``np.int64`` array of bucket ids, one per value.

    Raises:
        TypeError: If ``values`` is of an unsupported type.
        ValueError: If ``num_buckets`` is not a positive integer below ``2**63``.
    """
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, (int, np.integer)):
        raise ValueError(f"num_buckets must be a positive integer, got {num_buckets!r}")
    if not 0 < int(num_buckets) < 2**63:
        raise ValueError(f"num_buckets must be in [1, 2**63), got {num_buckets}")
    hashes = fnv1a_64(values)
    return (hashes % np.uint64(num_buckets)).astype(np.int64)
