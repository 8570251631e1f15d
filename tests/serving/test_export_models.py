"""Every shipped model exports, and the exported program gives what the model's own (TorchRec)
forward gives on the same raw rows, through the Predictor's transforms.

In process and without training: the model is built on the CPU with its initial weights (the
checkpoint path is covered by tests/serving/test_export_cli.py). Bound: max |exported - eager|
<= 1e-5 (float32; observed 0 on CPU).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tzrun

from tests.conftest import REPO

#: example -> its data set (the examples of tests/integration/test_models.py, each model once or more)
EXAMPLES = {
    "deepfm_criteo": "criteo",
    "dlrm_criteo": "criteo",
    "wide_and_deep_criteo": "criteo",
    "dcn_v2_criteo": "criteo",
    "dcn_v1_criteo": "criteo",
    "mask_net_criteo": "criteo",
    "wukong_criteo": "criteo",
    "rocket_launching_criteo": "criteo",
    "deepfm_criteo_text": "criteo_text",
    "mmoe_taobao": "taobao",
    "ple_taobao": "taobao",
    "pepnet_taobao": "taobao",
    "dbmtl_taobao": "taobao",
    "dssm_taobao": "taobao",
    "dssm_v2_taobao": "taobao",
    "mind_taobao": "taobao",
    "tdm_taobao": "taobao",
    "din_taobao": "taobao",
    "multi_tower_taobao": "taobao",
    "dssm_taobao+sequence": "taobao",
    "mmoe_taobao+sequence": "taobao",
    "mmoe_taobao+multi_window_din": "taobao",
    "mmoe_taobao+simple_attention": "taobao",
    "mmoe_taobao+self_attention_tzrec": "taobao",
    "din_taobao+dice": "taobao",
    "din_taobao+dense_sequence": "taobao",
    "mmoe_taobao+dense_sequence": "taobao",
}
BOUND = 1e-5
#: the target-attention sequence of examples/din_taobao.toml (its candidate ad as the query)
CLICK_SEQ = '''
[[features.sequence]]
name = "click_seq"
max_len = 7
query = ["adgroup_id"]

[[features.sequence.features]]
name = "click_seq__adgroup_id"
column = "click_50_seq"
table = "adgroup_id_emb"
'''
#: a dense sequence of click_seq: each clicked ad's category id read as a number (log1p, standardized)
DENSE_SEQ = '''
[[features.sequence.dense]]
name = "click_seq__cate"
column = "click_50_seq__cate_id"
log1p = true
mean = 3.0
std = 2.0
'''
#: the shipped examples with a [[features.sequence]] group of their own (its first feature click_seq__adgroup_id)
SEQUENCE_EXAMPLES = ("din_taobao", "dssm_v2_taobao", "mind_taobao", "tdm_taobao")
#: mmoe_taobao's [[model.sequence_encoders]] table of each "mmoe_taobao+<variant>"
MMOE_ENCODERS = {
    "sequence": 'type = "target_attention"\n',
    "multi_window_din": 'type = "multi_window_din"\nwindow_lengths = [1, 2, 3]\nattention_activation = "dice"\n',
    "simple_attention": 'type = "simple_attention"\n',
    "self_attention_tzrec": 'type = "self_attention_tzrec"\nattention_dim = 16\nnum_heads = 4\n',
}
#: "<example>+<variant>": the example with a sequence group and a [[model.sequence_encoders]] table
SEQUENCE_VARIANTS = {
    "dssm_taobao+sequence": lambda text: text.replace(
        "[[features.sparse]]\nname = \"click_50_seq\"\nnum_buckets = 6000\nembedding_dim = 16\ntable = \"adgroup_id_emb\"\n"
        "pooling = \"mean\"\n", CLICK_SEQ.replace('query = ["adgroup_id"]\n', "")).replace(
        '"click_50_seq", "user_pv_7d"', '"click_seq", "user_pv_7d"').replace(
        "[[losses]]", '[[model.sequence_encoders]]\nsequence = "click_seq"\ntype = "self_attention"\nnum_heads = 2\n'
        "feedforward_dim = 16\n\n[[losses]]", 1),
    **{f"mmoe_taobao+{variant}": (lambda text, encoder=encoder: text.replace(
        "[[losses]]", f'[[model.sequence_encoders]]\nsequence = "click_seq"\n{encoder}\n[[losses]]', 1) + CLICK_SEQ)
       for variant, encoder in MMOE_ENCODERS.items()},
    "mmoe_taobao+dense_sequence": lambda text: text.replace(
        "[[losses]]", '[[model.sequence_encoders]]\nsequence = "click_seq"\ntype = "target_attention"\n\n[[losses]]', 1)
        + CLICK_SEQ + DENSE_SEQ,
}
#: "<example>+<variant>": the example with --set overrides
OVERRIDE_VARIANTS = {
    "din_taobao+dice": ['model.din_towers=[{sequence = "click_seq", attention_activation = "dice"}]'],
    "din_taobao+dense_sequence": ['features.sequence[0].dense=[{name = "click_seq__cate", column = "click_50_seq__cate_id", '
                                  'log1p = true, mean = 3.0, std = 2.0}]'],
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tzrun_tools.criteo_text import parquet_to_criteo_text
    from tzrun_tools.synth import synth_criteo
    from tzrun_tools.synth_taobao import synth_taobao

    root = tmp_path_factory.mktemp("export_zoo")
    synth_criteo(root / "criteo", rows=256, eval_rows=300, seed=1, rows_per_file=256, row_group_size=300)
    synth_taobao(root / "taobao", rows=256, eval_rows=300, seed=1, rows_per_file=256, row_group_size=300)
    parquet_to_criteo_text(root / "criteo" / "eval", root / "criteo_text" / "eval")
    return {"criteo": root / "criteo", "taobao": root / "taobao", "criteo_text": root / "criteo_text"}


def _session(example: str, data: Path, model_dir: Path):
    from tzrun.runner.session import Session

    sets = [f'data.train_input="{data / "eval"}"', f'data.eval_input="{data / "eval"}"', f'model_dir="{model_dir}"']
    base, _, variant = example.partition("+")
    if base in SEQUENCE_EXAMPLES:
        sets.append("features.sequence[0].max_len=7")  # shorter than some rows: the truncation is exported too
    if example == "dssm_taobao+sequence":  # the other truncation rule: the predictor keeps each row's first 7 ids
        sets.append('features.sequence[0].keep="first"')
    config = REPO / "examples" / f"{base}.toml"
    sets += OVERRIDE_VARIANTS.get(example, [])
    if example in SEQUENCE_VARIANTS:
        text = config.read_text()
        changed = SEQUENCE_VARIANTS[example](text)
        assert changed.count("[[features.sequence]]") == 1 and changed.count("sequence_encoders") == 1, example
        config = model_dir.parent / f"{base}_{variant}.toml"
        config.write_text(changed)
    session = Session.from_config(config, sets)
    assert bool(session.specs.sequence_groups) == (bool(variant) or base in SEQUENCE_EXAMPLES), example
    return session


def _rows(session, path: Path):
    """The eval rows as the run's reader gives them (raw columns)."""
    import pyarrow as pa

    reader = session.reader
    groups = reader.row_groups(str(path))
    batches = [b for g in groups for b in reader.read(g, 0, g.num_rows, session.columns)]
    return pa.Table.from_batches(batches)


def _model(session):
    from tzrun.interfaces import ModelContext

    specs, cfg = session.specs, session.cfg
    ctx = ModelContext(specs.dense, specs.sparse, specs.tables, torch.device("cpu"), tuple(cfg.data.labels),
                       specs.sequence_groups, specs.sequence_tables)
    torch.manual_seed(0)
    return session.registries["model"].get(cfg.model.type, "model.type").build(cfg.model.config, ctx).eval()


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_every_shipped_model_exports_and_matches_its_eager_forward(example, datasets, tmp_path):
    import copy

    from tzrun.data.features import BatchBuilder
    from tzrun_serving import Predictor
    from tzrun_serving.export import export_model, write_export
    from tzrun_serving.manifest import manifest_of

    data = datasets[EXAMPLES[example]]
    session = _session(example, data, tmp_path / "run")
    model = _model(session)
    entry = session.registries["model"].get(session.cfg.model.type, "model.type")
    outputs = list(entry.extras["outputs"](session.cfg.model.config))
    exported = export_model(copy.deepcopy(model), session.specs, outputs)
    write_export(tmp_path / "export", exported, manifest_of(session.facts, list(exported), {"step": 0}))

    table = _rows(session, data / "eval")
    with torch.no_grad():
        eager = model(BatchBuilder(session.specs, (), None)(table, "eval"))
    names = {p.name for p in exported}
    if example.startswith(("dssm", "mind")):
        assert names == {"user_tower", "item_tower"}  # retrieval: two towers, each alone
        cfg = session.cfg.model.config
        features = {p.name: set(p.features) for p in exported}
        history = {cfg.history} if example.startswith("mind") else set()  # mind's behaviour sequence
        assert features == {"user_tower": set(cfg.user_features) | history, "item_tower": set(cfg.item_features)}
    else:
        assert names == {"model"}
    if example.startswith("rocket_launching"):  # serving runs the light net: its outputs and weights alone
        (program, ep), = exported.items()
        assert program.outputs == ("logits", "probs") and ep.state_dict
        assert not any("booster" in k for k in ep.state_dict) and any("light" in k for k in ep.state_dict)
    if example in ("din_taobao+dice", "mmoe_taobao+multi_window_din"):  # Dice's running statistics are exported
        (program, ep), = exported.items()
        assert any(k.endswith("mlp.1.running_var") for k in ep.state_dict), list(ep.state_dict)
    if session.specs.sequence_groups:  # the sequences are inputs, longer lists truncated to max_len as in training
        inputs = [i["name"] for p in manifest_of(session.facts, list(exported), {})["programs"].values() for i in p["inputs"]]
        assert "sequence_lengths" in inputs and "sequence_ids/click_seq__adgroup_id" in inputs
        longest = max(len(v) for v in table["click_50_seq"].to_pylist() if v)
        assert longest > session.specs.sequence_groups[0].max_len
        manifest = manifest_of(session.facts, list(exported), {})["features"]["sequence"][0]
        assert manifest["keep"] == ("first" if example == "dssm_taobao+sequence" else "last")
        if example.endswith("+dense_sequence"):  # the dense sequence is an input, its transform in the manifest
            assert "sequence_dense/click_seq" in inputs
            assert manifest["dense"] == [{"name": "click_seq__cate", "column": "click_50_seq__cate_id", "fill_value": 0.0,
                                          "log1p": True, "mean": 3.0, "std": 2.0}]
    compared = 0
    predictors = {}  # each program loaded once (a load is about 2 s of torch.export.load here)
    for program in exported:
        predictor = predictors[program.name] = Predictor(tmp_path / "export", program=program.name)
        got = predictor.predict(table, batch_size=128)  # several batches: sizes differ from the traced ones
        # the manifest says which outputs are one value per row ("batch"), whatever a batch's size
        assert predictor.per_row_outputs() == [n for n in program.outputs if eager[n].dim() == 1]
        for name in program.outputs:
            want = eager[name].float().numpy()
            assert got[name].shape == want.shape
            np.testing.assert_allclose(got[name], want, rtol=BOUND, atol=BOUND)
            compared += 1
    assert compared >= 1
    if example == "din_taobao":  # a sequence model runs with torch alone too
        from tests.serving.test_export_cli import _fresh_venv_runs_the_export

        _fresh_venv_runs_the_export(tmp_path / "export", table.slice(0, 64), tmp_path)
    _one_row_and_a_row_without_ids(model, session, table, predictors[sorted(names)[0]])


def _one_row_and_a_row_without_ids(model, session, table, predictor) -> None:
    """A batch of one row, and a row whose id columns are all null (no ids at all), run
    through the program (the traced example had neither)."""
    import pyarrow as pa

    from tzrun.data.features import BatchBuilder

    row = table.slice(0, 1)
    sparse = {f.column for f in session.specs.sparse} | {f.weight_column for f in session.specs.sparse if f.weight_column}
    sparse |= {f.column for g in session.specs.sequence_groups for f in (*g.features, *g.dense)}
    empty = pa.table({n: pa.nulls(1, row.schema.field(n).type) if n in sparse else row[n] for n in row.column_names})
    for rows in (row, empty):
        with torch.no_grad():
            want = model(BatchBuilder(session.specs, (), None)(rows, "x"))
        got = predictor.predict(rows)
        for name in predictor.outputs:
            np.testing.assert_allclose(got[name], want[name].float().numpy(), rtol=BOUND, atol=BOUND)


class _ThirdPartyModels:
    """A model plugin written against the public API only, declaring no outputs, reading one
    feature's pooled embedding by key and the collection's values."""

    @staticmethod
    def build(cfg, ctx):
        from torch import nn
        from torchrec import EmbeddingBagCollection

        class Scorer(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ebc = EmbeddingBagCollection(tables=ctx.embedding_bag_configs(), is_weighted=ctx.is_weighted,
                                                  device=ctx.embedding_device)
                width = sum(t.embedding_dim * len(t.feature_names) for t in ctx.tables)
                self.linear = nn.Linear(width + len(ctx.dense_features), 1)

            def forward(self, batch):
                pooled = self.ebc(batch.sparse)
                first = pooled[ctx.sparse_features[0].name]
                x = torch.cat([batch.dense, pooled.values()], dim=1)
                return {"score": self.linear(x).squeeze(-1) + first.sum(dim=1)}

        return Scorer()

    @tzrun.hookimpl
    def tzrun_register_models(self, register):
        import attrs

        @attrs.frozen
        class ScorerConfig:
            pass

        register("scorer", config=ScorerConfig, build=self.build, description="a third party's model")


def test_a_third_party_model_exports_through_the_public_api(datasets, tmp_path):
    """Nothing in export knows the model: its outputs are what its forward returns."""
    import copy

    from tzrun.config.load import parse_config
    from tzrun.data.features import BatchBuilder
    from tzrun.runner.session import Session
    from tzrun_serving import Predictor
    from tzrun_serving.export import export_model, write_export
    from tzrun_serving.manifest import manifest_of
    from tzrun.testing import tiny_config_text

    plugin = _ThirdPartyModels()
    text = tiny_config_text(datasets["criteo"], tmp_path / "run")
    overrides = ['model={type="scorer"}', 'losses=[{type="binary_cross_entropy", prediction="score"}]',
                 'metrics=[{type="auc", prediction="score"}]']
    session = Session.from_raw(parse_config(text, "<tiny>", overrides), [("third_party", plugin)])
    model = _model(session)
    exported = export_model(copy.deepcopy(model), session.specs, [])
    assert [p.outputs for p in exported] == [("score",)]
    write_export(tmp_path / "export", exported, manifest_of(session.facts, list(exported), {"step": 0}))
    table = _rows(session, datasets["criteo"] / "eval")
    with torch.no_grad():
        want = model(BatchBuilder(session.specs, (), None)(table, "eval"))["score"].numpy()
    np.testing.assert_allclose(Predictor(tmp_path / "export").predict(table)["score"], want, rtol=BOUND, atol=BOUND)
    assert Predictor(tmp_path / "export").per_row_outputs() == ["score"]  # declared by no one: the traced shape
    _bad_rows_are_reported_in_place(tmp_path / "export", table)


def _bad_rows_are_reported_in_place(export, table) -> None:
    """An id outside num_buckets: an error naming the column, or under "skip" the row left out
    (scored rows keep their input indices; predict gives NaN in its place)."""
    import pyarrow as pa

    from tzrun.errors import DataError
    from tzrun_serving import Predictor

    rows = table.slice(0, 5)
    cat_5 = rows["cat_5"].to_pylist()
    cat_5[2] = 999  # cat_5 has num_buckets = 24
    bad = rows.set_column(rows.schema.get_field_index("cat_5"), "cat_5", pa.array(cat_5, rows.schema.field("cat_5").type))
    with pytest.raises(DataError, match="cat_5"):
        Predictor(export).predict(bad)
    skipping = Predictor(export, on_bad_row="skip")
    scored = skipping.score(bad)
    assert scored.rows.tolist() == [0, 1, 3, 4] and scored.skipped.rows == 1
    good = Predictor(export).predict(rows)["score"]
    np.testing.assert_allclose(scored.outputs["score"], good[[0, 1, 3, 4]], rtol=BOUND, atol=BOUND)  # 4 rows, not 5
    predicted = skipping.predict(bad)["score"]
    assert np.isnan(predicted[2])
    np.testing.assert_allclose(np.delete(predicted, 2), good[[0, 1, 3, 4]], rtol=BOUND, atol=BOUND)
