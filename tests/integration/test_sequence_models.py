"""The sequence models train end to end through `tzrec-run train` on `data synth taobao`'s
`click_50_seq`: the shipped DIN example (and with Dice in its attention MLP), DSSM with its user
tower's sequence encoded by self-attention, and mmoe with the encoders taken from TorchEasyRec
(multi_window_din with Dice, simple_attention, self_attention_tzrec; every encoder is covered in
process too: tests/plugins/test_sequence_models.py).

Small data and small layers: these runs check that the models build, shard, trace under
TorchRec's TrainPipelineSparseDist, train and evaluate, not how well they learn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli, REPO

pytestmark = pytest.mark.slow

#: examples/dssm_taobao.toml's mean-pooled click sequence, replaced by a sequence group
POOLED_SEQUENCE = '''[[features.sparse]]
name = "click_50_seq"
num_buckets = 6000
embedding_dim = 16
table = "adgroup_id_emb"
pooling = "mean"
'''
SEQUENCE_GROUP = '''[[model.sequence_encoders]]
sequence = "click_seq"
type = "self_attention"
num_heads = 2
feedforward_dim = 16

[[features.sequence]]
name = "click_seq"
max_len = 20

[[features.sequence.features]]
name = "click_seq__adgroup_id"
column = "click_50_seq"
table = "adgroup_id_emb"
'''


@pytest.fixture(scope="module")
def taobao(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tzrun_tools.synth_taobao import synth_taobao

    root = tmp_path_factory.mktemp("seq_taobao")
    synth_taobao(root, rows=2048, eval_rows=1024, seed=1, rows_per_file=1024, row_group_size=512)
    return root


def _train(config: Path, data: Path, model_dir: Path, *overrides: str) -> dict:
    sets = [f'data.train_input="{data / "train"}"', f'data.eval_input="{data / "eval"}"', f'model_dir="{model_dir}"',
            "data.batch_size=256", "data.eval_batch_size=512", "data.num_workers=0", *overrides]
    proc = cli(["train", str(config), *[a for s in sets for a in ("--set", s)]])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])


def test_the_din_example_trains(taobao, tmp_path):
    result = _train(REPO / "examples" / "din_taobao.toml", taobao, tmp_path / "run",
                    "model.towers=[{hidden_units=[16]}]", 'model.din_towers=[{sequence="click_seq", attention_hidden_units=[8]}]',
                    "model.final_hidden_units=[8]")
    assert result["step"] == 8 and result["rows"] == 1024  # 2,048 rows at 256 per step; every eval row once
    assert 0.0 <= result["auc"] <= 1.0 and result["loss/binary_cross_entropy"] > 0.0


def test_dssm_with_a_self_attention_sequence_encoder_trains(taobao, tmp_path):
    text = (REPO / "examples" / "dssm_taobao.toml").read_text()
    assert POOLED_SEQUENCE in text and '"click_50_seq", "user_pv_7d"' in text
    text = text.replace(POOLED_SEQUENCE, SEQUENCE_GROUP).replace('"click_50_seq", "user_pv_7d"', '"click_seq", "user_pv_7d"')
    config = tmp_path / "dssm_seq.toml"
    config.write_text(text)
    result = _train(config, taobao, tmp_path / "run", "model.user_hidden_units=[16]", "model.item_hidden_units=[16]",
                    "model.output_dim=8", "train.num_epochs=1")
    assert result["step"] == 8
    assert 0.0 <= result["recall_at_50"] <= 1.0 and result["loss/in_batch_softmax"] > 0.0


def test_din_whose_id_features_are_all_queries_trains_in_bf16_and_exports(taobao, tmp_path):
    """The defaults users get (the sparse_dist pipeline) with the options they turn on together
    (bf16, gradient accumulation, a sequence group), and an export of a program that reads no
    pooled id feature (its only one is the group's query)."""
    import re

    import pyarrow.parquet as pq

    from tzrun.cli.main import main
    from tzrun_serving import Predictor

    text = (REPO / "examples" / "din_taobao.toml").read_text()
    blocks = re.split(r"(?=^\[\[features\.)", text, flags=re.M)
    config = tmp_path / "din_queries_only.toml"
    config.write_text("".join(b for b in blocks if not b.startswith("[[features.sparse]]") or 'name = "adgroup_id"' in b))
    small = ["model.towers=[{hidden_units=[16]}]", 'model.din_towers=[{sequence="click_seq", attention_hidden_units=[8]}]',
             "model.final_hidden_units=[8]"]
    result = _train(config, taobao, tmp_path / "run", *small, 'train.mixed_precision="bf16"',
                    "train.gradient_accumulation_steps=2")
    assert result["step"] == 8 and 0.0 <= result["auc"] <= 1.0
    sets = [a for s in [f'model_dir="{tmp_path / "run"}"', *small] for a in ("--set", s)]
    assert main(["export", str(config), "--checkpoint", "latest", "--out", str(tmp_path / "export"), *sets]) == 0
    predictor = Predictor(tmp_path / "export")
    rows = pq.read_table(taobao / "eval").slice(0, 7)
    probs = predictor.predict(rows)["probs"]
    assert probs.shape == (7,) and ((probs > 0) & (probs < 1)).all()
    assert abs(predictor.predict(rows.slice(0, 1))["probs"][0] - probs[0]) <= 1e-6  # one row: the batch dimension is free


#: three groups over the same clicks, one per encoder TorchEasyRec has and tzrec-run had not
TORCHEASYREC_ENCODERS = '''
[[model.sequence_encoders]]
sequence = "windows"
type = "multi_window_din"
window_lengths = [1, 2, 4]
attention_hidden_units = [8]
attention_activation = "dice"

[[model.sequence_encoders]]
sequence = "dot"
type = "simple_attention"

[[model.sequence_encoders]]
sequence = "projected"
type = "self_attention_tzrec"
attention_dim = 16
num_heads = 4
''' + "".join(f'''
[[features.sequence]]
name = "{name}"
max_len = 10
query = ["adgroup_id"]

[[features.sequence.features]]
name = "{name}__adgroup_id"
column = "click_50_seq"
table = "adgroup_id_emb"
''' for name in ("windows", "dot", "projected"))


def test_mmoe_with_torcheasyrecs_encoders_trains(taobao, tmp_path):
    config = tmp_path / "mmoe_encoders.toml"
    config.write_text((REPO / "examples" / "mmoe_taobao.toml").read_text() + TORCHEASYREC_ENCODERS)
    result = _train(config, taobao, tmp_path / "run", "model.expert_hidden_units=[16]", "model.num_experts=2",
                    "model.tasks[0].hidden_units=[8]", "model.tasks[1].hidden_units=[8]", "train.num_epochs=1")
    assert result["step"] == 8 and result["rows"] == 1024
    assert 0.0 <= result["ctr_auc"] <= 1.0 and result["loss/ctr_bce"] > 0.0


def test_din_with_dice_trains(taobao, tmp_path):
    result = _train(REPO / "examples" / "din_taobao.toml", taobao, tmp_path / "run",
                    "model.towers=[{hidden_units=[16]}]", "model.final_hidden_units=[8]",
                    'model.din_towers=[{sequence="click_seq", attention_hidden_units=[8, 4], attention_activation="dice"}]')
    assert result["step"] == 8 and 0.0 <= result["auc"] <= 1.0 and result["loss/binary_cross_entropy"] > 0.0
