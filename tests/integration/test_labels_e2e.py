"""Labels end to end on a MovieLens-like CSV the test writes (ratings 1 to 5, quoted titles,
``|``-separated genres): BCE on the raw rating stops at the first batch naming the column and
the fix; BCE on the derived label ``rating >= 4`` trains; a bad eval label at a checkpoint
boundary is named by file, line and column and that boundary's checkpoint is still written."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.integration.test_update_path import _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.errors import DataError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import MARKER, list_checkpoints
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

CONFIG = """
model_dir = "{model_dir}"

[data]
train_input = "{train}"
batch_size = 16
labels = ["clicked"]
reader = {{ type = "csv", column_types = {{ user_id = "int64", movie_id = "int64", rating = "float32", liked = "float32", age = "float32" }} }}

[[data.derived_labels]]
name = "clicked"
source = "rating"
op = ">="
value = 4

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
pipeline = {{ type = "base" }}
stages = []
sparse_optimizer = {{ type = "sgd", lr = 0.1 }}
dense_optimizer = {{ type = "sgd", lr = 0.1 }}

[[features.dense]]
name = "age"

[[features.sparse]]
name = "user_id"
num_buckets = 50
embedding_dim = 4

[[features.sparse]]
name = "movie_id"
num_buckets = 100
embedding_dim = 4

[[features.sparse]]
name = "genres"
hash_bucket_size = 64
separator = "|"
embedding_dim = 4
"""


def _ratings(path: Path, rows: int, seed: int, bad_line: int | None = None) -> Path:
    rng = random.Random(seed)
    lines = ['user_id,movie_id,rating,liked,age,title,genres']
    for _ in range(rows):
        genres = "|".join(rng.sample(["Action", "Comedy", "Drama", "Sci-Fi", "Romance"], 2))
        rating = rng.randint(1, 5)
        lines.append(f'{rng.randrange(50)},{rng.randrange(100)},{rating},{int(rating >= 4)},{rng.randint(18, 60)},'
                     f'"Movie, Part {rng.randrange(9)} (1999)",{genres}')
    if bad_line is not None:  # the 1-based line of the file: line 1 is the header
        fields = lines[bad_line - 1].split(",")
        fields[3] = "2"
        lines[bad_line - 1] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(tmp_path: Path, *overrides: str):
    from tzrun.runner.trainer import train

    registries = collect_registries(make_plugin_manager())
    tmp_path.mkdir(exist_ok=True)
    text = CONFIG.format(model_dir=tmp_path / "run", train=_ratings(tmp_path / "train.csv", 128, 1))
    raw = parse_config(text, "run.toml", list(overrides))
    return train(Session(load_config(raw, registries), raw, make_plugin_manager(), registries))


def test_bce_on_the_derived_label_trains_and_on_the_raw_rating_names_column_and_fix(tmp_path):
    result = _train(tmp_path)
    assert result.steps == 4 and (result.checkpoint / MARKER).exists()
    with pytest.raises(DataError) as caught:
        _train(tmp_path / "raw", 'data.labels=["rating"]', "data.derived_labels=[]")
    message = str(caught.value)
    assert f"{tmp_path / 'raw' / 'train.csv'}: line 2: column 'rating' has " in message
    assert "outside the binary domain" in message
    assert "losses[0] (binary_cross_entropy) needs labels of 0 or 1" in message
    assert '[[data.derived_labels]] (e.g. name = "clicked", source = "rating", op = ">=", value = 4)' in message
    assert not (tmp_path / "raw" / "run" / "checkpoints").exists() or not list_checkpoints(tmp_path / "raw" / "run")


def test_a_bad_eval_label_is_named_and_the_boundary_checkpoint_is_still_written(tmp_path):
    eval_csv = _ratings(tmp_path / "eval.csv", 40, 2, bad_line=23)
    with pytest.raises(DataError) as caught:
        _train(tmp_path, f'data.eval_input="{eval_csv}"', "train.num_steps=6", "train.save_checkpoints_steps=3",
               'metrics=[{type = "auc"}]', 'data.labels=["liked"]', "data.derived_labels=[]")
    message = str(caught.value)
    assert message.startswith(f"{eval_csv}: line 23: column 'liked' has 1 label(s) outside the binary domain")
    assert "(first: 2)" in message
    assert [step for step, _ in list_checkpoints(tmp_path / "run")] == [3]
    assert (tmp_path / "run" / "checkpoints" / "step-3" / MARKER).exists()
