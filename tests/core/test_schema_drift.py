"""Files whose schemas drift (nullability, integer and float widths) train together, also
within one batch that straddles them; a column of another kind is a DataError naming both files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tzrun.data.schemas import SchemaUnifier
from tzrun.errors import DataError
from tzrun.testing import run_tiny_training
from tzrun_tools.synth import synth_criteo

pytestmark = pytest.mark.slow


def _with(table: pa.Table, name: str, type_: pa.DataType, nullable: bool = True) -> pa.Table:
    index = table.schema.get_field_index(name)
    return table.set_column(index, pa.field(name, type_, nullable=nullable), table.column(name).cast(type_))


def _drifting_files(tmp_path: Path, incompatible: bool = False) -> Path:
    synth_criteo(tmp_path / "src", rows=3000, eval_rows=512, seed=0, rows_per_file=4096, row_group_size=1024)
    table = pq.read_table(next((tmp_path / "src" / "train").glob("*.parquet")))
    assert not table.schema.field("label").nullable and table.schema.field("cat_0").type == pa.int64()
    out = tmp_path / "drift"
    out.mkdir()
    a, b, c = table.slice(0, 1000), table.slice(1000, 1000), table.slice(2000, 1000)
    # b: label nullable (and wider), cat_0 int32, int_0 float64
    b = _with(_with(_with(b, "label", pa.int32()), "cat_0", pa.int32()), "int_0", pa.float64())
    # c: cat_5 nullable int32, int_0 float64, label int64 not null
    c = _with(_with(_with(c, "cat_5", pa.int32()), "int_0", pa.float64()), "label", pa.int64(), nullable=False)
    if incompatible:
        b = _with(b, "cat_0", pa.string())
    for name, part in zip("abc", (a, b, c)):
        pq.write_table(part, out / f"part-{name}.parquet", row_group_size=1000)
    assert len({pq.read_schema(p) for p in out.glob("*.parquet")}) == 3
    return out


def test_batches_straddling_files_with_drifting_schemas_train(tmp_path):
    drift = _drifting_files(tmp_path)
    # 768-row batches over files of 1,000 rows: steps 2 and 3 each hold rows of two files
    run = run_tiny_training(tmp_path, in_process=True, overrides=[
        f'data.train_input="{drift.as_posix()}"', "data.batch_size=768", "train.num_steps=4",
        f'data.eval_input="{(tmp_path / "src" / "eval").as_posix()}"',
    ])
    assert run.steps == 4 and 0.0 <= run.metrics["auc"] <= 1.0


def test_an_incompatible_column_names_both_files_the_column_and_the_types(tmp_path):
    drift = _drifting_files(tmp_path, incompatible=True)
    with pytest.raises(Exception, match=r"column 'cat_0' is int64 in \S*part-a\.parquet but string in \S*part-b\.parquet") as info:
        run_tiny_training(tmp_path, in_process=True, overrides=[
            f'data.train_input="{drift.as_posix()}"', "data.batch_size=768", "train.num_steps=4", "data.num_workers=0",
            f'data.eval_input="{(tmp_path / "src" / "eval").as_posix()}"',
        ])
    assert isinstance(info.value, DataError)
    assert "rewrite one of the files" in str(info.value)


def test_the_unified_schema_widens_and_casts():
    unifier = SchemaUnifier()
    narrow = pa.record_batch({"x": pa.array([1, 2], pa.int32()), "f": pa.array([0.5, 1.0], pa.float32())},
                             schema=pa.schema([pa.field("x", pa.int32(), nullable=False), pa.field("f", pa.float32())]))
    wide = pa.record_batch({"x": pa.array([3, None], pa.int64()), "f": pa.array([2.0, 3.0], pa.float64())})
    unifier.see(narrow.schema, "a.parquet")
    unifier.see(wide.schema, "b.parquet")
    table = unifier.table([narrow, wide])
    assert table.schema == pa.schema([pa.field("x", pa.int64()), pa.field("f", pa.float64())])
    assert table.column("x").to_pylist() == [1, 2, 3, None]
    with pytest.raises(DataError, match=r"column 'x' is int64 in b\.parquet but double in c\.parquet"):
        unifier.see(pa.schema([pa.field("x", pa.float64())]), "c.parquet")
