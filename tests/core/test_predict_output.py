"""How ``predict`` publishes its output (nothing looks complete before the end) and which model
outputs become columns; no model is trained here."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tzrun.errors import DataError, WriteError
from tzrun.runner.predict import OutputColumns
from tzrun.runner.predict_output import SUCCESS, PredictionSink

from tests.conftest import REPO

SKIPPED = pa.table({"row": pa.array([3], pa.int64()), "problem": ["cat_0: id outside [0, 10)"]})
NONE_SKIPPED = pa.table({"row": pa.array([], pa.int64()), "problem": pa.array([], pa.string())})


def test_a_directory_appears_only_whole_with_its_marker_and_is_not_replaced_silently(tmp_path):
    out = str(tmp_path / "scores")
    sink = PredictionSink(out, overwrite=False)
    sink.prepare()
    names = [sink.write_part(r, pa.table({"p": [float(r)] * 2})) for r in (0, 1)]
    assert sink.write_part(2, pa.table({"p": pa.array([], pa.float64())})) is None  # a rank with no rows
    assert not (tmp_path / "scores").exists()  # the parts are in scores.partial until the end
    sink.publish(names, SKIPPED, {"rows": 4})
    assert not (tmp_path / "scores.partial").exists()
    marker = json.loads((tmp_path / "scores" / SUCCESS).read_text())
    assert marker["parts"] == ["part-00000.parquet", "part-00001.parquet"] and marker["skipped_rows"] == 1
    assert pq.read_table(tmp_path / "scores").column("p").to_pylist() == [0.0, 0.0, 1.0, 1.0]
    assert pq.read_table(tmp_path / "scores" / "_skipped.parquet").column("row").to_pylist() == [3]
    with pytest.raises(WriteError, match="exists already; pass --overwrite"):
        PredictionSink(out, overwrite=False).prepare()
    again = PredictionSink(out, overwrite=True)
    again.prepare()
    again.publish([again.write_part(0, pa.table({"p": [9.0]}))], NONE_SKIPPED, {"rows": 1})
    assert pq.read_table(tmp_path / "scores").column("p").to_pylist() == [9.0]
    assert not (tmp_path / "scores" / "_skipped.parquet").exists()


def test_one_file_joins_the_parts_in_rank_order_and_a_leftover_staging_dir_is_cleared(tmp_path):
    (tmp_path / "s.parquet.partial").mkdir()
    (tmp_path / "s.parquet.partial" / "part-00007.parquet").write_bytes(b"a killed run's part")
    sink = PredictionSink(str(tmp_path / "s.parquet"), overwrite=False)
    sink.prepare()
    assert not (tmp_path / "s.parquet.partial" / "part-00007.parquet").exists()
    names = [sink.write_part(r, pa.table({"p": [float(r)]})) for r in (0, 1)]
    listing = sink.publish(names, SKIPPED, {"rows": 2})
    assert listing == str(tmp_path / "s.skipped.parquet")
    assert pq.read_table(tmp_path / "s.parquet").column("p").to_pylist() == [0.0, 1.0]
    assert not (tmp_path / "s.parquet.partial").exists()


def test_outputs_with_one_value_per_row_are_columns_and_vectors_only_when_asked():
    outputs = {"probs": torch.tensor([[0.5], [0.25], [0.0]]), "logits": torch.zeros(3),
               "similarity": torch.zeros(3, 3), "user_embedding": torch.ones(3, 2)}
    chosen = OutputColumns(())
    chosen.add(outputs, 2)  # a third, padding row is not a row
    assert list(chosen.table()) == ["probs", "logits"]
    assert chosen.table()["probs"].to_pylist() == [0.5, 0.25]
    vectors = OutputColumns(("user_embedding",))
    vectors.add(outputs, 3)
    assert vectors.table()["user_embedding"].to_pylist() == [[1.0, 1.0]] * 3
    with pytest.raises(DataError, match="--outputs nope: not an output of the model"):
        OutputColumns(("nope",)).add(outputs, 3)
    with pytest.raises(DataError, match="no output with one value per row"):
        OutputColumns(()).add({"similarity": torch.zeros(3, 3)}, 3)
    np.testing.assert_array_equal(chosen.table()["logits"].to_numpy(), np.zeros(2, np.float32))


def test_a_one_row_first_batch_does_not_make_a_similarity_matrix_a_column():
    """The columns come from what the model declares, not from the first batch's shapes: a
    [B, B] similarity of a one-row batch is [1, 1], like a score."""
    first = {"probs": torch.tensor([0.5]), "similarity": torch.zeros(1, 1), "user_embedding": torch.ones(1, 2)}
    later = {"probs": torch.tensor([0.25, 0.0, 1.0]), "similarity": torch.zeros(3, 3), "user_embedding": torch.ones(3, 2)}
    columns = OutputColumns((), per_row=("probs",))
    columns.add(first, 1)
    columns.add(later, 3)
    assert list(columns.table()) == ["probs"]
    assert columns.table()["probs"].to_pylist() == [0.5, 0.25, 0.0, 1.0]
    retrieval = OutputColumns((), per_row=())  # a retrieval model: similarities and embeddings only
    with pytest.raises(DataError, match="declares no output with one value per row"):
        retrieval.add({"similarity": torch.zeros(1, 1), "user_embedding": torch.ones(1, 2)}, 1)


def test_the_per_row_outputs_are_the_declared_scores_of_the_model():
    from tzrun.config.load import parse_config
    from tzrun.runner.predict import declared_per_row
    from tzrun.runner.session import Session
    from tzrun.testing import tiny_config_text

    session = Session.from_raw(parse_config(tiny_config_text("data", "run"), "<tiny>", []))
    assert declared_per_row(session.facts) == ("logits", "probs")
    dssm = Session.from_config(REPO / "examples" / "dssm_taobao.toml", [])
    assert declared_per_row(dssm.facts) == ()
