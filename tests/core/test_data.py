"""The data layer: row splits across ranks and workers, Arrow -> Batch, and its errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig, SparseFeatureConfig
from tzrun.data.dataset import BatchStream, padded, split_rows
from tzrun.data.features import BatchBuilder, feature_specs
from tzrun.data.hashing import hash_to_buckets
from tzrun.data.loader import RankInput
from tzrun.errors import DataError
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader


@pytest.fixture
def numbered(tmp_path: Path) -> Path:
    """Three Parquet files, uneven row groups, 1,003 rows whose `row` column numbers them."""
    start = 0
    for i, (rows, group) in enumerate([(400, 150), (3, 2), (600, 256)]):
        table = pa.table({"row": np.arange(start, start + rows, dtype=np.int64)})
        pq.write_table(table, tmp_path / f"part-{i}.parquet", row_group_size=group)
        start += rows
    return tmp_path


def _rows_builder(table: pa.Table, source: str) -> list[int]:
    return table.column("row").to_pylist()


@pytest.mark.parametrize(("world_size", "workers", "batch_size"), [(1, 1, 64), (2, 2, 100), (3, 2, 7), (2, 3, 1000)])
def test_every_row_is_read_exactly_once_across_ranks_and_workers(numbered, world_size, workers, batch_size):
    reader = ParquetReader(ParquetConfig())
    groups = reader.row_groups(str(numbered))
    seen: list[int] = []
    steps = set()
    for rank in range(world_size):
        split = split_rows(groups, rank, world_size, batch_size)
        steps.add(split.steps)
        stream = BatchStream(reader, split, batch_size, ["row"], _rows_builder)
        batches = [b for w in range(workers) for b in stream.iter_worker(w, workers)]
        assert len(batches) == split.num_batches
        assert all(len(b) == batch_size for b in batches[:-1] if len(b))  # only a worker's last may be short
        rank_rows = [r for b in batches for r in b]
        assert len(rank_rows) == split.num_rows
        seen.extend(rank_rows)
    assert sorted(seen) == list(range(1003))
    assert len(steps) == 1  # every rank agrees on the number of steps


def test_ranks_differ_by_at_most_one_row(numbered):
    groups = ParquetReader(ParquetConfig()).row_groups(str(numbered))
    sizes = [split_rows(groups, r, 4, 10).num_rows for r in range(4)]
    assert sum(sizes) == 1003 and max(sizes) - min(sizes) <= 1


def test_short_ranks_are_padded_to_the_common_step_count():
    out = list(padded(iter([1, 2]), 4, lambda: 0))
    assert out == [1, 2, 0, 0]


def test_reader_errors_name_the_path(tmp_path):
    reader = ParquetReader(ParquetConfig())
    with pytest.raises(DataError, match=rf"{tmp_path}: no input files found"):
        reader.row_groups(str(tmp_path))
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: not a readable Parquet file"):
        reader.row_groups(str(tmp_path))


def test_missing_column_names_file_and_column(numbered):
    reader = ParquetReader(ParquetConfig())
    group = reader.row_groups(str(numbered))[0]
    with pytest.raises(DataError, match=r"part-0\.parquet: column\(s\) 'label' missing \(the file has: row\)"):
        list(reader.read(group, 0, 10, ["row", "label"]))


FEATURES = FeaturesConfig(
    dense=(DenseFeatureConfig("d0", fill_value=-1.0), DenseFeatureConfig("d1", log1p=True)),
    sparse=(
        SparseFeatureConfig("c0", num_buckets=10),
        SparseFeatureConfig("s0", hash_bucket_size=1000, embedding_dim=8),
        SparseFeatureConfig("m0", num_buckets=10, table="c0_emb"),
    ),
)


def _table(**overrides):
    columns = {
        "d0": pa.array([1.5, None, 3.0], pa.float32()),
        "d1": pa.array([0, 9, 99], pa.int64()),
        "c0": pa.array([3, None, 9], pa.int64()),
        "s0": pa.array(["a", "bb", None]),
        "m0": pa.array([[1, 2], [], None], pa.list_(pa.int64())),
        "label": pa.array([1, 0, 1], pa.int8()),
    }
    columns.update(overrides)
    return pa.table(columns)


def test_batch_from_arrow_has_the_expected_tensors():
    specs = feature_specs(FEATURES)
    assert [t.name for t in specs.tables] == ["c0_emb", "s0_emb"]  # m0 shares c0's table
    assert specs.tables[0].feature_names == ("c0", "m0")
    batch = BatchBuilder(specs, ["label"], None)(_table(), "mem")
    assert torch.allclose(batch.dense, torch.tensor([[1.5, 0.0], [-1.0, np.log1p(9)], [3.0, np.log1p(99)]], dtype=torch.float32))
    jt = batch.sparse.to_dict()
    assert jt["c0"].lengths().tolist() == [1, 0, 1] and jt["c0"].values().tolist() == [3, 9]
    expected = hash_to_buckets(pa.array(["a", "bb"]), 1000).tolist()
    assert jt["s0"].lengths().tolist() == [1, 1, 0] and jt["s0"].values().tolist() == expected
    assert jt["m0"].lengths().tolist() == [2, 0, 0] and jt["m0"].values().tolist() == [1, 2]
    assert batch.labels["label"].tolist() == [1.0, 0.0, 1.0]
    assert batch.weights.tolist() == [1.0, 1.0, 1.0] and batch.num_rows == 3


def test_padding_batch_has_zero_weight_and_no_ids():
    batch = BatchBuilder(feature_specs(FEATURES), ["label"], None).padding()
    assert batch.num_rows == 0 and batch.weights.tolist() == [0.0]
    assert batch.sparse.values().numel() == 0 and batch.sparse.stride() == 1


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"c0": pa.array([3, 10, 1], pa.int64())}, r"f\.parquet: column 'c0' \(feature 'c0'\): id 10 is outside \[0, 10\)"),
        ({"c0": pa.array(["x", "y", "z"])}, r"column 'c0' \(feature 'c0'\) has type string; num_buckets needs integer ids"),
        ({"d0": pa.array(["x", "y", "z"])}, r"column 'd0' has type string; expected a number"),
        ({"label": pa.array([1, None, 0], pa.int8())}, r"column 'label' has 1 null value\(s\)"),
    ],
)
def test_malformed_data_names_file_and_column(overrides, match):
    builder = BatchBuilder(feature_specs(FEATURES), ["label"], None)
    with pytest.raises(DataError, match=match):
        builder(_table(**overrides), "f.parquet")


def test_missing_feature_column_names_the_file():
    builder = BatchBuilder(feature_specs(FEATURES), ["label"], None)
    with pytest.raises(DataError, match=r"f\.parquet: column 's0' is missing"):
        builder(_table().drop_columns(["s0"]), "f.parquet")


def test_rank_input_with_dataloader_workers_reads_all_rows(numbered, tmp_path):
    features = FeaturesConfig(dense=(DenseFeatureConfig("row"),))
    builder = BatchBuilder(feature_specs(features), ["row"], None)
    seen = []
    for rank in range(2):
        rank_input = RankInput(ParquetReader(ParquetConfig()), str(numbered), 64, 2, ["row"], builder, rank, 2)
        batches = list(rank_input.one_pass())
        assert len(batches) == rank_input.steps
        seen.extend(int(v) for b in batches for v in b.labels["row"][: b.num_rows].tolist())
    assert sorted(seen) == list(range(1003))


def _rows_of(batches):
    return [[int(v) for v in b.labels["row"][: b.num_rows].tolist()] for b in batches]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(("workers", "batch_size"), [(0, 64), (2, 64), (3, 100), (2, 1000)])
def test_a_pass_resumed_at_step_k_yields_what_the_whole_pass_yields_from_k(numbered, workers, batch_size):
    """The DataLoader interleaves its workers' batch runs; a resumed pass must continue that
    exact order (bit-identical resume), whatever k, including past the short worker's end."""
    features = FeaturesConfig(dense=(DenseFeatureConfig("row"),))
    builder = BatchBuilder(feature_specs(features), ["row"], None)
    rank_input = RankInput(ParquetReader(ParquetConfig()), str(numbered), batch_size, workers, ["row"], builder, 0, 1)
    whole = _rows_of(rank_input.one_pass())
    assert sorted(r for b in whole for r in b) == list(range(1003))
    if workers > 1 and batch_size == 64:
        assert whole[1][0] != whole[0][-1] + 1  # the workers' runs really interleave
    for k in range(len(whole) + 1):
        assert _rows_of(rank_input.one_pass(start=k)) == whole[k:], k
        consumed = rank_input.consumed(k)
        assert sorted(r for a, b in consumed for r in range(a, b)) == sorted(r for b in whole[:k] for r in b)


def test_remaining_rows_are_shared_out_across_a_new_world_size(numbered):
    """After an interruption, the rows not consumed yet are read exactly once by however many
    ranks resume."""
    from tzrun.data.dataset import merge_intervals, subtract_intervals

    features = FeaturesConfig(dense=(DenseFeatureConfig("row"),))
    builder = BatchBuilder(feature_specs(features), ["row"], None)
    reader = ParquetReader(ParquetConfig())
    consumed = []
    for rank in range(2):  # two ranks, 2 workers each, interrupted after 3 steps
        rank_input = RankInput(reader, str(numbered), 64, 2, ["row"], builder, rank, 2)
        consumed.extend(rank_input.consumed(3))
    remaining = subtract_intervals(1003, merge_intervals(consumed))
    seen = [r for a, b in merge_intervals(consumed) for r in range(a, b)]
    for rank in range(3):  # resumed on three ranks
        rank_input = RankInput(reader, str(numbered), 64, 1, ["row"], builder, rank, 3, rows=remaining)
        seen.extend(r for b in _rows_of(rank_input.one_pass()) for r in b)
    assert sorted(seen) == list(range(1003))


def test_thread_prefetcher_keeps_the_order_and_raises_the_producers_error():
    from tzrun.data.loader import ThreadPrefetcher

    assert list(ThreadPrefetcher(iter(range(100)), 3)) == list(range(100))

    def failing():
        yield 1
        raise ValueError("bad.parquet: column 'x' is missing")

    prefetched = ThreadPrefetcher(failing(), 2)
    assert next(prefetched) == 1
    with pytest.raises(ValueError, match="column 'x' is missing"):
        next(prefetched)

    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    stopped = ThreadPrefetcher(endless(), 2)
    assert next(stopped) == 0
    stopped.close()
    stopped._thread.join(timeout=5)
    assert not stopped._thread.is_alive() and len(produced) <= 5  # bounded: it never ran ahead of depth

    dropped = ThreadPrefetcher(endless(), 2)
    thread = dropped._thread
    assert next(dropped) == 0
    del dropped  # a pass cut short: dropping the iterator ends the thread
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_prefetched_pass_yields_the_same_batches_as_a_plain_one(tmp_path):
    import torch

    from tzrun.config.schema import DenseFeatureConfig, FeaturesConfig, SparseFeatureConfig
    from tzrun.data.features import BatchBuilder, feature_specs
    from tzrun.data.loader import RankInput
    from tzrun_tools.synth import synth_criteo
    from tzrun_plugins.readers.parquet import ParquetConfig, build_parquet

    synth_criteo(tmp_path, rows=3000, eval_rows=1000, seed=3, rows_per_file=1000, row_group_size=500)
    specs = feature_specs(FeaturesConfig(dense=(DenseFeatureConfig("int_0", log1p=True),),
                                         sparse=(SparseFeatureConfig("cat_0", num_buckets=1000),)))
    builder = BatchBuilder(specs, ("label",), None, ())
    columns = specs.columns(("label",), None)

    def batches(prefetch: int, start: int):
        rank_input = RankInput(build_parquet(ParquetConfig()), str(tmp_path / "train"), 256, 0, columns, builder, 0, 1,
                               prefetch=prefetch)
        return [(b.dense.clone(), b.sparse.values().clone()) for b in rank_input.one_pass(start=start)]

    for start in (0, 5):
        plain, prefetched = batches(0, start), batches(3, start)
        assert len(plain) == len(prefetched) == 12 - start
        for (d1, s1), (d2, s2) in zip(plain, prefetched):
            assert torch.equal(d1, d2) and torch.equal(s1, s2)


class _FailingRows(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield torch.zeros(1)
        raise DataError("part-0.parquet: column 'cat_3' is declared int64 but holds 'x'; fix the data")


def test_a_data_error_in_a_worker_process_keeps_its_own_message():
    """torch re-raises a worker's error as 'Caught DataError in DataLoader worker process 0.' plus
    a traceback; the run shows the original message, naming the file and column, and the worker."""
    from tzrun.data.loader import _fork_workers, _worker_errors_as_raised

    loader = torch.utils.data.DataLoader(_FailingRows(), batch_size=None, num_workers=1)
    batches = _worker_errors_as_raised(_fork_workers(loader))
    assert next(batches).shape == (1,)
    with pytest.raises(DataError) as info:
        next(batches)
    assert str(info.value) == (
        "part-0.parquet: column 'cat_3' is declared int64 but holds 'x'; fix the data (in data worker 0)"
    )


class _Finalized:
    """Part of a garbage cycle once nothing else refers to it; its finalizer records the
    process that ran it."""

    def __init__(self, log: str) -> None:
        self.log, self.me = log, self

    def __del__(self) -> None:
        import os

        with open(self.log, "a") as out:
            out.write(f"{os.getpid()}\n")


#: what the trainer refers to when the workers fork (a worker drops its reference)
_INHERITED: list = []


class _DroppingRows(torch.utils.data.IterableDataset):
    def __iter__(self):
        import gc

        _INHERITED.clear()  # the cycle is unreachable in this worker now
        yield torch.tensor([gc.collect()])


def test_a_worker_never_finalizes_what_it_inherited(tmp_path):
    """A forked data worker's collector leaves the trainer's objects alone, even one the worker
    stops referring to (a worker once hung in an inherited ProcessGroupGloo's destructor); the
    trainer finalizes it when it lets go of it."""
    import gc
    import os

    from tzrun.data.loader import _fork_workers

    log = tmp_path / "finalized"
    _INHERITED.append(_Finalized(str(log)))
    try:
        loader = torch.utils.data.DataLoader(_DroppingRows(), batch_size=None, num_workers=1)
        assert len(list(_fork_workers(loader))) == 1  # the worker ran a full collection
        assert not log.exists()  # and did not finalize the cycle
    finally:
        _INHERITED.clear()
    gc.collect()
    assert log.read_text() == f"{os.getpid()}\n"


def _own_nice() -> int:
    import os
    import threading

    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class _NiceRows(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield torch.tensor([_own_nice()])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_reader_nice_lowers_the_prefetch_thread_and_the_workers_but_not_the_trainer():
    """data.reader_nice: reading yields the cores to the training step's threads."""
    import functools

    from tzrun.data.loader import ThreadPrefetcher, _start_worker

    trainer = _own_nice()
    seen = list(ThreadPrefetcher((_own_nice() for _ in range(2)), depth=1, nice=5))
    assert seen == [min(19, trainer + 5)] * 2
    assert _own_nice() == trainer
    loader = torch.utils.data.DataLoader(_NiceRows(), batch_size=None, num_workers=1,
                                         worker_init_fn=functools.partial(_start_worker, nice=3))
    assert [int(x) for x in loader] == [min(19, trainer + 3)]
    assert list(ThreadPrefetcher((_own_nice() for _ in range(1)), depth=1, nice=0)) == [trainer]


class _InheritedDescriptors(torch.utils.data.IterableDataset):
    """What a worker's descriptors ``fds`` point at (``/proc/self/fd``)."""

    def __init__(self, fds):
        self.fds = fds

    def __iter__(self):
        yield [os.readlink(f"/proc/self/fd/{fd}") for fd in self.fds]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/fd is Linux's")
def test_a_data_worker_lets_go_of_the_ranks_tcp_connections_but_keeps_its_other_sockets():
    """A worker holding a killed rank's connections to its peers kept them from seeing it gone
    (a 2-rank job waited 9 s before torchrun could restart it): each inherited TCP socket now
    points at /dev/null in the worker; the rank's own stay connected, a Unix socket stays."""
    import functools
    import socket

    from tzrun.data.loader import _start_worker

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    local, other = socket.socketpair()
    try:
        fds = [client.fileno(), server.fileno(), local.fileno()]
        loader = torch.utils.data.DataLoader(_InheritedDescriptors(fds), batch_size=None, num_workers=1,
                                             worker_init_fn=functools.partial(_start_worker, nice=0))
        (seen,) = list(loader)
        assert seen[:2] == ["/dev/null", "/dev/null"] and seen[2].startswith("socket:")
        client.sendall(b"x")  # the rank's connection is its own still
        assert accepted.recv(1) == b"x"
    finally:
        for sock in (client, server, accepted, local, other):
            sock.close()


@pytest.mark.parametrize("shuffle", [0, 700])
def test_strings_read_as_dictionaries_give_the_same_batches_as_strings_read_one_by_one(tmp_path, shuffle):
    """ParquetConfig.dictionary_strings: hashed ids come from each row group's dictionary
    (hashed once, cached across its batches); every other use of a string column decodes it.
    Batches straddle row groups and files, whose dictionaries differ; nulls give no id."""
    from tzrun.config.schema import SparseFeatureConfig
    from tzrun.data.loader import RankInput
    from tzrun_plugins.readers.parquet import build_parquet

    rng = np.random.default_rng(5)
    for part, rows in enumerate((1300, 777)):
        words = [None if rng.random() < 0.1 else f"w{int(rng.integers(0, 60)):02d}" for _ in range(rows)]
        pq.write_table(pa.table({
            "h": pa.array(words),                                                      # hashed: the dictionary path
            "hb": pa.array([None if w is None else w.encode() for w in words], pa.binary()),
            "v": pa.array(words),                                                      # vocab: decoded
            "multi": pa.array([None if w is None else f"{w}|x{w[-1]}" for w in words]),  # separator: decoded
            "session": pa.array([f"s{i % 37}" for i in range(rows)]),                 # group key: decoded
            "label": pa.array(rng.integers(0, 2, rows), pa.int8()),
        }), tmp_path / f"part-{part}.parquet", row_group_size=300)
    specs = feature_specs(FeaturesConfig(sparse=(
        SparseFeatureConfig("h", hash_bucket_size=97, embedding_dim=8),
        SparseFeatureConfig("hb", hash_bucket_size=1 << 40, embedding_dim=8),
        SparseFeatureConfig("v", vocab=("w01", "w02", "w03"), embedding_dim=8),
        SparseFeatureConfig("multi", hash_bucket_size=50, separator="|", embedding_dim=8),
    )))
    builder = BatchBuilder(specs, ("label",), None, ("session",))
    columns = specs.columns(("label",), None, ("session",))

    def batches(dictionary: bool):
        reader = build_parquet(ParquetConfig(dictionary_strings=dictionary))
        rank_input = RankInput(reader, str(tmp_path), 256, 0, columns, builder, 0, 1, shuffle_buffer_rows=shuffle)
        return [(b.sparse.values().clone(), b.sparse.lengths().clone(), b.groups["session"].clone(), b.labels["label"])
                for b in rank_input.one_pass()]

    read_one_by_one, read_as_dictionaries = batches(False), batches(True)
    assert len(read_one_by_one) == 9
    for plain, encoded in zip(read_one_by_one, read_as_dictionaries):
        assert all(torch.equal(a, b) for a, b in zip(plain, encoded))
    reader = build_parquet(ParquetConfig())
    first = next(reader.read(reader.row_groups(str(tmp_path))[0], 0, 300, ["h", "label"]))
    assert pa.types.is_dictionary(first.schema.field("h").type)  # the path under test is taken


def test_a_runs_read_ahead_starts_at_once_and_crosses_epoch_ends(numbered):
    """The training batches are read ahead on one thread for the whole run: the first ones
    before any is asked for, and an epoch's first while the previous epoch's last are still
    unconsumed; the batches are those of the plain passes, epoch after epoch."""
    import threading
    import time

    from tzrun.runner.position import Layout, ResumePoint, TrainData

    features = FeaturesConfig(dense=(DenseFeatureConfig("row"),))
    plain = BatchBuilder(feature_specs(features), ["row"], None)
    built: list[int] = []
    first_built = threading.Event()

    def builder(table, source):
        built.append(table.column("row")[0].as_py())
        first_built.set()
        return plain(table, source)

    builder.padding = plain.padding
    whole = Layout(1, 0, 500)  # 1,003 rows: 3 batches an epoch

    def data(prefetch: int) -> TrainData:
        def make(layout):
            return RankInput(ParquetReader(ParquetConfig()), str(numbered), 500, 0, ["row"], builder, 0, 1,
                             rows=layout.rows, prefetch=prefetch)
        return TrainData(make, whole, num_steps=None, num_epochs=2, start=ResumePoint.beginning(whole))

    expected = _rows_of(data(0).batches())
    assert [b[0] for b in expected] == [0, 500, 1000] * 2
    built.clear()
    first_built.clear()
    batches = data(2).batches()
    assert first_built.wait(10)  # read before the first next()
    taken = [next(batches) for _ in range(2)]  # two of epoch 0's three batches
    deadline = time.monotonic() + 10
    while len(built) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert built[:4] == [0, 500, 1000, 0]  # epoch 1's first batch is built before epoch 0 ends
    assert _rows_of([*taken, *batches]) == expected
