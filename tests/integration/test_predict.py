"""``tzrec-run predict``: unlabelled rows scored by a checkpoint equal ``evaluate``'s saved
predictions, keep their order and kept columns on 2 ranks, bad rows are listed, a kill leaves
nothing that looks complete, and object-store input and output work."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, cli
from tests.warm_ranks import warm_cli
from tzrun.errors import EXIT_CANT_WRITE, EXIT_DATA
from tzrun.testing import tiny_config_text

pytestmark = pytest.mark.slow


def _unlabelled(source: Path, out: Path, *, bad_every: int = 0) -> Path:
    """``source``'s rows without their label, with ``rid`` (the row's number) added; with
    ``bad_every``, every such row's ``cat_0`` is outside its 1,000 buckets. Written in two files."""
    table = pq.read_table(source).drop_columns(["label"])
    table = table.append_column("rid", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    if bad_every:
        ids = table.column("cat_0").to_numpy().copy()
        ids[::bad_every] = 1_000_000
        table = table.set_column(table.schema.get_field_index("cat_0"), "cat_0", pa.array(ids))
    out.mkdir(parents=True)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), out / "a.parquet", row_group_size=300)
    pq.write_table(table.slice(half), out / "b.parquet", row_group_size=300)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, criteo_dir):
    """A tiny 4-step run whose final evaluation saved its predictions, with its config."""
    root = tmp_path_factory.mktemp("predict")
    config = root / "run.toml"
    config.write_text(tiny_config_text(criteo_dir, root / "run"))
    done = cli(["train", str(config), "--set", "eval.save_predictions=true"])
    assert done.returncode == 0, done.stderr[-3000:]
    return root, config, _unlabelled(criteo_dir / "eval", root / "unlabelled")


def _predict(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = ["predict", str(config), "--checkpoint", "latest", *args]
    return warm_cli(command, timeout=timeout) if "--nproc-per-node" in args else cli(command)


def test_predict_equals_evaluates_saved_predictions_on_unlabelled_rows(trained):
    root, config, unlabelled = trained
    out = root / "scores"
    done = _predict(config, "--input", str(unlabelled), "--output", str(out), "--keep-columns", "rid,cat_0")
    assert done.returncode == 0, done.stderr[-3000:]
    said = re.search(r"^predicted 3001 rows with \S+ into \S+ in ([\d.]+) s \(([\d,]+) rows/s; the checkpoint's "
                     r"restore took ([\d.]+) s before\)$", done.stdout, re.M)
    assert said, done.stdout  # the rate counts the scoring, not the restore before it
    seconds, rate = float(said[1]), int(said[2].replace(",", ""))
    assert 3001 / (seconds + 0.05) <= rate <= 3001 / max(seconds - 0.05, 1e-3) + 1  # seconds shown to 0.1
    saved = pq.read_table(root / "run" / "predictions" / "step-4" / "rank-0.parquet")
    scores = pq.read_table(out)
    assert scores.column_names == ["logits", "probs", "rid", "cat_0"]
    assert scores.column("probs").type == pa.float32()
    np.testing.assert_array_equal(scores.column("probs").to_numpy(), saved.column("probs").to_numpy())
    np.testing.assert_array_equal(scores.column("logits").to_numpy(), saved.column("logits").to_numpy())
    np.testing.assert_array_equal(scores.column("rid").to_numpy(), np.arange(3001))
    marker = json.loads((out / "_SUCCESS").read_text())
    assert marker["rows"] == 3001 and marker["parts"] == ["part-00000.parquet"] and marker["skipped_rows"] == 0
    assert not (root / "scores.partial").exists()

    again = _predict(config, "--input", str(unlabelled), "--output", str(out))
    assert again.returncode == EXIT_CANT_WRITE and "exists already; pass --overwrite" in again.stderr


@pytest.mark.multiproc
def test_two_ranks_score_their_shares_into_one_ordered_file(trained):
    root, config, unlabelled = trained
    one, two = root / "one.parquet", root / "two.parquet"
    assert _predict(config, "--input", str(unlabelled), "--output", str(one), "--keep-columns", "rid").returncode == 0
    done = _predict(config, "--input", str(unlabelled), "--output", str(two), "--keep-columns", "rid,int_0",
                    "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = pq.read_table(one), pq.read_table(two)
    assert b.column_names == ["logits", "probs", "rid", "int_0"]
    np.testing.assert_array_equal(b.column("rid").to_numpy(), np.arange(3001))  # input order across the ranks
    np.testing.assert_allclose(b.column("probs").to_numpy(), a.column("probs").to_numpy(), rtol=0, atol=1e-6)
    source = pa.concat_tables([pq.read_table(p) for p in sorted(unlabelled.glob("*.parquet"))])
    assert b.column("int_0").equals(source.column("int_0"))
    assert not (root / "two.parquet.partial").exists()


def test_bad_rows_are_listed_by_input_row_not_shifted(trained, criteo_dir, tmp_path):
    root, config, _ = trained
    bad = _unlabelled(criteo_dir / "eval", tmp_path / "bad", bad_every=97)
    out = tmp_path / "scores"
    done = _predict(config, "--input", str(bad), "--output", str(out), "--keep-columns", "rid",
                    "--set", 'data.on_bad_row="skip"')
    assert done.returncode == 0, done.stderr[-3000:]
    expected_bad = np.arange(0, 3001, 97)
    assert f"left out {expected_bad.size} bad row(s)" in done.stdout
    listed = pq.read_table(out / "_skipped.parquet")
    np.testing.assert_array_equal(listed.column("row").to_numpy(), expected_bad)
    assert set(listed.column("problem").to_pylist()) == {"cat_0: id outside [0, 1000)"}
    scores = pq.read_table(out)
    np.testing.assert_array_equal(scores.column("rid").to_numpy(), np.setdiff1d(np.arange(3001), expected_bad))
    assert json.loads((out / "_SUCCESS").read_text())["skipped_rows"] == expected_bad.size

    stopped = _predict(config, "--input", str(bad), "--output", str(tmp_path / "stopped"))
    assert stopped.returncode == EXIT_DATA
    assert "a.parquet: row 0 (counting from 0): column 'cat_0' (feature 'cat_0'): id 1000000 is outside" in stopped.stderr
    assert not (tmp_path / "stopped").exists()


def test_a_kill_during_predict_leaves_nothing_that_looks_complete(trained, tmp_path):
    root, config, unlabelled = trained
    big = tmp_path / "big"
    big.mkdir()
    table = pa.concat_tables([pq.read_table(unlabelled)] * 20)
    pq.write_table(table, big / "rows.parquet", row_group_size=5000)
    out = tmp_path / "scores"
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tzrun", "predict", str(config), "--checkpoint", "latest",
                             "--input", str(big), "--output", str(out), "--set", "data.eval_batch_size=64"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    staging = tmp_path / "scores.partial"
    deadline = time.monotonic() + 120
    while not staging.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert staging.exists(), proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not out.exists()  # only OUTPUT.partial, which no reader takes for the output
    done = _predict(config, "--input", str(unlabelled), "--output", str(out))  # the next run clears the leftover
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "_SUCCESS").exists() and not staging.exists()


def test_predict_reads_and_writes_an_object_store(trained, s3_bucket):
    root, config, unlabelled = trained
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.put(str(unlabelled), f"{s3_bucket.removeprefix('s3://')}/in", recursive=True)
    done = _predict(config, "--input", f"{s3_bucket}/in", "--output", f"{s3_bucket}/out", "--keep-columns", "rid")
    assert done.returncode == 0, done.stderr[-3000:]
    base = s3_bucket.removeprefix("s3://")
    assert fs.exists(f"{base}/out/_SUCCESS")
    with fs.open(f"{base}/out/part-00000.parquet", "rb") as f:
        np.testing.assert_array_equal(pq.read_table(f).column("rid").to_numpy(), np.arange(3001))


def test_predict_with_the_export_agrees_with_the_checkpoint(trained, criteo_dir, tmp_path):
    root, config, unlabelled = trained
    export = tmp_path / "export"
    made = cli(["export", str(config), "--checkpoint", "latest", "--out", str(export)])
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "scores.parquet"
    done = cli(["predict", str(config), "--export", str(export), "--input", str(unlabelled), "--output", str(out),
                    "--keep-columns", "rid"])
    assert done.returncode == 0, done.stderr[-3000:]
    saved = pq.read_table(root / "run" / "predictions" / "step-4" / "rank-0.parquet")
    scores = pq.read_table(out)
    assert scores.column_names == ["logits", "probs", "rid"]
    np.testing.assert_array_equal(scores.column("rid").to_numpy(), np.arange(3001))
    # the exported program's bound against the training model's forward: 1e-6 (float32 resolution)
    np.testing.assert_allclose(scores.column("probs").to_numpy(), saved.column("probs").to_numpy(), rtol=0, atol=1e-6)

    bad = _unlabelled(criteo_dir / "eval", tmp_path / "bad", bad_every=97)
    skipped = cli(["predict", str(config), "--export", str(export), "--input", str(bad), "--output",
                       str(tmp_path / "bad.parquet"), "--keep-columns", "rid", "--set", 'data.on_bad_row="skip"'])
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    listed = pq.read_table(tmp_path / "bad.skipped.parquet")
    np.testing.assert_array_equal(listed.column("row").to_numpy(), np.arange(0, 3001, 97))
    assert set(listed.column("problem").to_pylist()) == {"cat_0: id outside [0, 1000)"}
    kept = pq.read_table(tmp_path / "bad.parquet").column("rid").to_numpy()
    np.testing.assert_array_equal(kept, np.setdiff1d(np.arange(3001), np.arange(0, 3001, 97)))


def test_csv_rows_with_a_malformed_line_are_scored_and_the_line_listed(trained, tmp_path):
    root, config, unlabelled = trained
    table = pq.read_table(unlabelled).slice(0, 600)
    csv = tmp_path / "rows"
    csv.mkdir()
    columns = ["int_0", "cat_0", "cat_5", "cat_8", "rid"]
    lines = [",".join(columns)]
    for i, row in enumerate(table.select(columns).to_pylist()):
        lines.append("1,2,3,4,5,6,7" if i == 10 else ",".join("" if row[c] is None else str(row[c]) for c in columns))
    (csv / "rows.csv").write_text("\n".join(lines) + "\n")
    reader = 'data.reader={type="csv", column_types={int_0="float32", cat_0="int64", cat_5="int64", cat_8="int64", rid="int64"}}'
    out = tmp_path / "scores"
    done = _predict(config, "--input", str(csv), "--output", str(out), "--keep-columns", "rid",
                    "--set", reader, "--set", 'data.on_bad_row="skip"')
    assert done.returncode == 0, done.stderr[-3000:]
    listed = pq.read_table(out / "_skipped.parquet").to_pylist()
    assert [r["row"] for r in listed] == [10] and "malformed" in listed[0]["problem"]
    scores = pq.read_table(out)
    np.testing.assert_array_equal(scores.column("rid").to_numpy(), np.delete(np.arange(600), 10))
    saved = pq.read_table(root / "run" / "predictions" / "step-4" / "rank-0.parquet")  # the same rows, from Parquet
    np.testing.assert_allclose(scores.column("probs").to_numpy(), np.delete(saved.column("probs").to_numpy()[:600], 10),
                               rtol=0, atol=1e-6)
