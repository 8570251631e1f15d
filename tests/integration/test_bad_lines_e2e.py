"""Malformed lines and unparsable fields of a CSV the test writes, end to end: under
``data.on_bad_row = "skip"`` they are left out and counted by reason in the log and in
``metrics.jsonl``; under ``"error"`` the first one is named by file and line; more of them than
``data.max_bad_row_fraction`` stops the run naming the fraction, the reasons and the option."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from tests.integration.test_update_path import _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.errors import DataError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

CONFIG = """
model_dir = "{model_dir}"

[data]
train_input = "{train}"
batch_size = 16
labels = ["label"]
reader = {{ type = "csv", column_types = {{ label = "float32", int_3 = "int64", f1 = "float32" }} }}

[model]
type = "deepfm"
deep_hidden_units = [8]
final_hidden_units = [4]
wide_embedding_dim = 4

[[losses]]
type = "binary_cross_entropy"

[train]
num_steps = 4
seed = 3
log_every_n_steps = 2
save_checkpoints_steps = 4
pipeline = {{ type = "base" }}
stages = [{{ type = "metrics_log" }}]
sparse_optimizer = {{ type = "sgd", lr = 0.1 }}
dense_optimizer = {{ type = "sgd", lr = 0.1 }}

[[features.dense]]
name = "f1"

[[features.sparse]]
name = "int_3"
num_buckets = 50
embedding_dim = 4

[[features.sparse]]
name = "cat"
hash_bucket_size = 64
embedding_dim = 4
"""

TRUNCATED, TOO_MANY, NOT_A_NUMBER = 64, 20, 41  # 1-based lines of the file (line 1 is the header)


def _csv(path: Path) -> Path:
    """64 rows: line 20 has a field too many, line 41 a non-numeric int_3, and the last line
    (64, no line break) is cut off after its second field."""
    rng = random.Random(5)
    lines = ["label,int_3,f1,cat"]
    for _ in range(63):
        lines.append(f"{rng.randint(0, 1)},{rng.randrange(50)},{rng.random():.3f},{rng.choice('abcdef') * 3}")
    lines[TOO_MANY - 1] += ",extra"
    fields = lines[NOT_A_NUMBER - 1].split(",")
    lines[NOT_A_NUMBER - 1] = ",".join([fields[0], "abc", *fields[2:]])
    path.write_text("\n".join(lines) + "\n1,7")  # the truncated last line
    return path


def _train(tmp_path: Path, *overrides: str):
    from tzrun.runner.trainer import train

    registries = collect_registries(make_plugin_manager())
    tmp_path.mkdir(exist_ok=True)
    text = CONFIG.format(model_dir=tmp_path / "run", train=_csv(tmp_path / "train.csv"))
    raw = parse_config(text, "run.toml", list(overrides))
    return train(Session(load_config(raw, registries), raw, make_plugin_manager(), registries))


def test_skip_trains_and_counts_each_bad_line_by_reason_in_the_log_and_metrics_jsonl(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tzrun"):
        result = _train(tmp_path, 'data.on_bad_row="skip"', "data.max_bad_row_fraction=0.1")
    assert result.steps == 4
    logged = [r.getMessage() for r in caplog.records if "bad rows left out" in r.getMessage()]
    assert logged and logged[-1].endswith("at step 4: 3 rows (malformed line: 2, int_3: not an integer: 1)")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train_records] == [2, 4]
    assert train_records[-1]["skipped_rows"] == 3
    assert train_records[-1]["skipped_reasons"] == {"malformed line": 2, "int_3: not an integer": 1}


def test_error_names_the_file_and_the_first_bad_line(tmp_path):
    with pytest.raises(DataError) as caught:
        _train(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'train.csv'}: line {TOO_MANY} has 5 field(s), expected 4")


def test_error_names_line_and_column_of_an_unparsable_field(tmp_path):
    csv = _csv(tmp_path / "train.csv")
    lines = csv.read_text().split("\n")
    lines[TOO_MANY - 1] = lines[TOO_MANY - 1].removesuffix(",extra")
    csv.write_text("\n".join(lines[:-1]) + "\n")
    from tzrun_plugins.readers.delimited import CsvConfig, CsvReader

    reader = CsvReader(CsvConfig(column_types={"label": "float32", "int_3": "int64", "f1": "float32"}))
    group = reader.row_groups(str(csv))[0]
    with pytest.raises(DataError, match=rf"^{csv}: line {NOT_A_NUMBER}: column 'int_3' is declared int64 but holds"):
        list(reader.read(group, 0, group.num_rows, ["label", "int_3"]))


def test_more_bad_rows_than_max_bad_row_fraction_stops_the_run_naming_fraction_reasons_and_option(tmp_path):
    with pytest.raises(DataError) as caught:
        _train(tmp_path, 'data.on_bad_row="skip"')  # default 0.01; 3 of 64 rows are bad
    message = str(caught.value)
    assert message.startswith("4.69% of the training rows read so far were bad and left out (3 of 64, all ranks; "
                              "malformed line: 2, int_3: not an integer: 1)")
    assert "more than data.max_bad_row_fraction = 0.01" in message
    assert "raise data.max_bad_row_fraction" in message
