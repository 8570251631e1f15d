"""Scattered rows (a resumed shuffled epoch's rows not consumed yet) read once per row group,
keeping only the wanted rows (issue 20, point 4)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from tzrun.data.dataset import Segment
from tzrun.data.pieces import group_pieces, read_pieces
from tzrun.interfaces import RowGroup
from tzrun_plugins.readers.parquet import ParquetConfig, ParquetReader


def _file(tmp_path, rows=20_000):
    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"x": pa.array(range(rows), pa.int64()), "pad": pa.array([b"p" * 64] * rows)}),
                   path, row_group_size=rows)
    return RowGroup(str(path), 0, rows)


def test_every_other_row_is_read_in_one_pass_with_its_origin(tmp_path):
    group = _file(tmp_path)
    segments = [Segment(group, r, r + 1) for r in range(0, 20_000, 2)]
    calls = []

    class Counting(ParquetReader):
        def read(self, *args, **kwargs):
            calls.append(args[1:3])
            return super().read(*args, **kwargs)

    reader = Counting(ParquetConfig(batch_rows=4096))
    pieces = list(group_pieces(segments, 10, 5_010))  # rows 10.. of the rank: group rows 20, 22, ...
    assert [g for g, _ in pieces] == [group] and len(pieces[0][1]) == 5_000
    out = list(read_pieces(reader, group, pieces[0][1], ["x"], lambda schema, path: None))
    assert calls == [(20, 10_019)]  # one read for 5,000 pieces
    assert [v for b, _, _ in out for v in b.column(0).to_pylist()] == list(range(20, 10_020, 2))
    assert [(r.start, r.num_rows) for _, _, r in out] == [(x, 1) for x in range(20, 10_020, 2)]


def test_a_few_wanted_rows_do_not_keep_their_decoded_batch_alive(tmp_path):
    group = _file(tmp_path)
    segments = [Segment(group, r, r + 1) for r in range(0, 20_000, 1_000)]
    reader = ParquetReader(ParquetConfig(batch_rows=20_000))
    (_, pieces), = group_pieces(segments, 0, 20)
    out = list(read_pieces(reader, group, pieces, ["x", "pad"], lambda schema, path: None))
    assert [b.column(0)[0].as_py() for b, _, _ in out] == list(range(0, 20_000, 1_000))
    held = {id(buf): buf.size for b, _, _ in out for col in b.columns for buf in col.buffers() if buf is not None}
    assert sum(held.values()) < 20 * 200  # 20 rows copied out, not 20,000 rows of 64-byte strings
