"""``tzrec-run convert`` of ``feature_configs`` and of the model: each feature kind and field, each of
the five models, what is reported, and that what is written passes the config check."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.torcheasyrec_examples import DLRM_CRITEO, DSSM_TAOBAO, MMOE_TAOBAO, MULTI_TOWER_DIN_TAOBAO
from tzrun_tools.convert import convert_pipeline_config
from tzrun.testing import load_config_text

HEAD = """
model_dir: "runs/x"
train_input_path: "data/train"
eval_input_path: "data/eval"
train_config { sparse_optimizer { sgd_optimizer { lr: 0.1 } } dense_optimizer { adam_optimizer { lr: 0.01 } } num_epochs: 1 }
data_config { dataset_type: ParquetDataset label_fields: "label" fg_mode: %s }
"""


def config(features: str, model: str, groups: str = "", fg_mode: str = "FG_DAG") -> str:
    """A pipeline config with these feature_configs, feature_groups and model message."""
    return (HEAD % fg_mode) + features + f"""
        model_config {{ {groups} {model} metrics {{ auc {{}} }} losses {{ binary_cross_entropy {{}} }} }}"""


def one(feature: str, fg_mode: str = "FG_DAG") -> Any:
    """Convert a config with one feature (in a DeepFM with a ``deep`` group and an id feature ``x``)."""
    name = feature.split('feature_name: "', 1)[1].split('"', 1)[0]
    features = f"feature_configs {{ {feature} }} " + (
        'feature_configs { id_feature { feature_name: "x" num_buckets: 10 embedding_dim: 8 } }' if name != "x" else "")
    groups = f'feature_groups {{ group_name: "deep" feature_names: "{name}" feature_names: "x" group_type: DEEP }}'
    return convert_pipeline_config(config(features, "deepfm { deep { hidden_units: [8] } }", groups, fg_mode), "t.config")


def reported(conversion: Any) -> dict[str, str]:
    """What was reported as not converted, but the fg_mode every FG_DAG config reports."""
    return {f.path: f.message for f in conversion.not_converted if f.path != "data_config.fg_mode"}


def noted(conversion: Any) -> dict[str, str]:
    return {f.path: f.message for f in conversion.notes}


def checked(conversion: Any, tzrun_pm: Any) -> None:
    """The converted TOML, exactly as written, passes the config check."""
    load_config_text(conversion.toml, tzrun_pm)


@pytest.mark.parametrize(("feature", "expected"), [
    ('id_feature { feature_name: "a" expression: "user:a" num_buckets: 100 embedding_dim: 8 }',
     {"name": "a", "num_buckets": 100, "embedding_dim": 8}),
    ('id_feature { feature_name: "a" expression: "user:uid" hash_bucket_size: 50 embedding_dim: 8 pooling: "mean" '
     'separator: "|" embedding_name: "shared" trainable: false }',
     {"name": "a", "column": "uid", "hash_bucket_size": 50, "embedding_dim": 8, "table": "shared", "pooling": "mean",
      "separator": "|", "trainable": False}),
    ('id_feature { feature_name: "a" vocab_list: ["x", "y"] embedding_dim: 8 }',
     {"name": "a", "vocab": ["x", "y"], "embedding_dim": 8}),
    ('id_feature { feature_name: "a" vocab_dict { key: "y" value: 3 } vocab_dict { key: "x" value: 2 } embedding_dim: 8 }',
     {"name": "a", "vocab": ["x", "y"], "embedding_dim": 8}),
    ('id_feature { feature_name: "a" vocab_file: "vocab.txt" embedding_dim: 8 }',
     {"name": "a", "vocab_file": "vocab.txt", "embedding_dim": 8}),
    ('id_feature { feature_name: "a" num_buckets: 10 embedding_dim: 8 embedding_constraints { sharding_types: "row_wise" } }',
     {"name": "a", "num_buckets": 10, "embedding_dim": 8, "embedding_constraints": {"sharding_types": ["row_wise"]}}),
    ('raw_feature { feature_name: "a" boundaries: [0.5, 1.5] embedding_dim: 8 }',
     {"name": "a", "boundaries": [0.5, 1.5], "embedding_dim": 8}),
    ('lookup_feature { feature_name: "a" map: "item:kv" key: "user:k" hash_bucket_size: 7 embedding_dim: 8 }',
     {"name": "a", "hash_bucket_size": 7, "embedding_dim": 8}),
    ('sequence_id_feature { feature_name: "a" sequence_delim: ";" sequence_length: 5 num_buckets: 9 embedding_dim: 8 }',
     {"name": "a", "num_buckets": 9, "embedding_dim": 8, "separator": ";"}),
])
def test_each_sparse_feature(feature, expected, tzrun_pm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vocab.txt").write_text("x\ny\n")  # the config check reads a vocab_file
    conversion = one(feature)
    assert conversion.tree["features"]["sparse"][0] == expected
    assert reported(conversion) == {}
    checked(conversion, tzrun_pm)


@pytest.mark.parametrize(("feature", "expected"), [
    ('raw_feature { feature_name: "a" expression: "user:a" }', {"name": "a"}),
    ('raw_feature { feature_name: "a" expression: "item:price" default_value: "-1" '
     'normalizer: "method=zscore,mean=2.5,standard_deviation=4" }',
     {"name": "a", "column": "price", "fill_value": -1.0, "mean": 2.5, "std": 4.0}),
    ('lookup_feature { feature_name: "a" map: "item:kv" key: "user:k" }', {"name": "a"}),
])
def test_each_dense_feature(feature, expected, tzrun_pm):
    conversion = one(feature)
    assert conversion.tree["features"]["dense"] == [expected]
    assert reported(conversion) == {}
    checked(conversion, tzrun_pm)


@pytest.mark.parametrize(("feature", "expected"), [
    ('id_feature { feature_name: "a" expression: "user:b" hash_bucket_size: 50 embedding_dim: 8 }', 50),
    ('id_feature { feature_name: "a" vocab_list: ["x", "y", "z"] embedding_dim: 8 }', 5),
    ('id_feature { feature_name: "a" vocab_list: ["x", "y", "z"] default_bucketize_value: 0 embedding_dim: 8 }', 3),
    ('id_feature { feature_name: "a" vocab_dict { key: "x" value: 2 } vocab_dict { key: "y" value: 6 } embedding_dim: 8 }', 7),
    ('raw_feature { feature_name: "a" boundaries: [1, 2, 3] normalizer: "method=log10" embedding_dim: 8 }', 4),
])
def test_fg_encoded_input_holds_ids_so_bucketized_features_become_their_table_size(feature, expected, tzrun_pm):
    conversion = one(feature, fg_mode="FG_NONE")
    assert conversion.tree["features"]["sparse"][0] == {"name": "a", "num_buckets": expected, "embedding_dim": 8}
    assert reported(conversion) == {}
    assert "a: the input holds the feature generator's ids" in noted(conversion)["feature_configs"]
    checked(conversion, tzrun_pm)


def test_fg_encoded_dense_values_are_already_normalized():
    conversion = one('raw_feature { feature_name: "a" normalizer: "method=expression,expr=log(x+3)" '
                     'fg_encoded_default_value: "-2" }', fg_mode="FG_NONE")
    assert conversion.tree["features"]["dense"] == [{"name": "a", "fill_value": -2.0}]
    assert reported(conversion) == {}


@pytest.mark.parametrize(("feature", "path", "says"), [
    ('raw_feature { feature_name: "a" normalizer: "method=expression,expr=log(x+3)" }',
     "raw_feature.normalizer", "the value is fed without it"),
    ('id_feature { feature_name: "a" num_buckets: 9 embedding_dim: 8 weighted: true }', "id_feature.weighted",
     "weight_column"),
    ('id_feature { feature_name: "a" num_buckets: 9 embedding_dim: 8 init_fn: "nn.init.zeros_" }', "id_feature.init_fn",
     "TorchRec's default"),
    ('id_feature { feature_name: "a" num_buckets: 9 embedding_dim: 8 default_value: "7" }', "id_feature.default_value",
     "gives no id here"),
    ('id_feature { feature_name: "a" num_buckets: 9 embedding_dim: 8 data_type: "FP16" }', "id_feature.data_type",
     "float32"),
    ('id_feature { feature_name: "a" num_buckets: 9 hash_bucket_size: 5 embedding_dim: 8 }', "id_feature.num_buckets",
     "hash_bucket_size is set too; TorchEasyRec uses that one"),
    ('id_feature { feature_name: "a" num_buckets: 9 embedding_dim: 8 brand_new_field: 1 }', "id_feature.brand_new_field",
     "not a field tzrec-run convert knows"),
])
def test_fields_without_equivalent_are_reported_and_the_feature_kept(feature, path, says):
    conversion = one(feature)
    assert says in reported(conversion)[f"feature_configs[0].{path}"]
    assert "a" in {f["name"] for kind in conversion.tree["features"].values() for f in kind}


@pytest.mark.parametrize(("feature", "says"), [
    ('combo_feature { feature_name: "a" expression: ["user:u", "item:i"] hash_bucket_size: 9 embedding_dim: 8 }',
     "tzrec-run has no feature generator: compute 'a' into a column"),
    ('id_feature { feature_name: "a" embedding_dim: 8 }', "set none of hash_bucket_size"),
    ('id_feature { feature_name: "a" num_buckets: 9 }', "no embedding_dim"),
    ('id_feature { feature_name: "a" embedding_dim: 8 dynamicemb { max_capacity: 100 } }', "dynamicemb: dynamic"),
    ('id_feature { feature_name: "a" num_buckets: 9 embedding_dim: 8 stub_type: true }', "stub feature"),
    ('raw_feature { feature_name: "a" value_dim: 4 }', "value_dim > 1"),
    ('id_feature { feature_name: "a" vocab_dict { key: "x" value: 2 } vocab_dict { key: "y" value: 2 } embedding_dim: 8 }',
     "set none of"),
])
def test_features_that_do_not_map_leave_a_placeholder_with_the_reason(feature, says, tzrun_pm):
    conversion = one(feature)
    assert any(says in message for message in reported(conversion).values()), reported(conversion)
    assert [f["name"] for f in conversion.tree["features"]["sparse"]] == ["x"]
    assert "# TODO: what is not converted" in conversion.toml and '# name = "a"' in conversion.toml
    checked(conversion, tzrun_pm)


def _sequences_built() -> bool:
    """Whether this checkout has sequence features and the din model (issue 25's other parts)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("tzrun.sequence", "tzrun_plugins.models.din"))


def checked_with_sequences(conversion: Any, tzrun_pm: Any) -> None:
    """:func:`checked`, for a conversion that writes [[features.sequence]] (skipped until those are built)."""
    if not _sequences_built():
        pytest.skip("needs [[features.sequence]] and the din model (branches i25-data, i25-models)")
    checked(conversion, tzrun_pm)


def _as_deepfm(text: str) -> str:
    """The DSSM example with a DeepFM over one group holding every feature (a model that reads no sequence)."""
    head, model = text.split("model_config {", 1)
    groups = ('feature_groups { group_name: "deep" ' + " ".join(f'feature_names: "{n}"' for n in (
        "user_id", "cms_segid", "pid", "adgroup_id", "cate_id", "price")) +
        ' sequence_groups { group_name: "click_50_seq" feature_names: "click_50_seq__adgroup_id" '
        'feature_names: "click_50_seq__cate_id" } '
        'sequence_encoders { pooling_encoder { input: "click_50_seq" pooling_type: "mean" } } group_type: DEEP }')
    return head + "model_config { " + groups + " deepfm { deep { hidden_units: [8] } final { hidden_units: [4] } } " \
        "metrics { auc {} } losses { binary_cross_entropy {} } }"


def test_a_model_that_reads_no_sequence_pools_them_as_its_encoder_says_and_shares_named_tables(tzrun_pm):
    conversion = convert_pipeline_config(_as_deepfm(DSSM_TAOBAO), "deepfm.config")
    sparse = {f["name"]: f for f in conversion.tree["features"]["sparse"]}
    assert "sequence" not in conversion.tree["features"]
    assert sparse["click_50_seq__adgroup_id"] == {"name": "click_50_seq__adgroup_id", "num_buckets": 846812,
                                                  "embedding_dim": 16, "pooling": "mean", "separator": "|"}
    assert "not truncated to 100 ids" in noted(conversion)["feature_configs[6].sequence_feature.sequence_length"]
    shared = _as_deepfm(DSSM_TAOBAO).replace(
        'features { id_feature { feature_name: "cate_id" expression: "item:cate_id" num_buckets: 12961 embedding_dim: 16',
        'features { id_feature { feature_name: "cate_id" expression: "item:cate_id" num_buckets: 12961 embedding_dim: 16 '
        'embedding_name: "cate_id_emb"')
    both = convert_pipeline_config(shared, "d.config")
    sparse = {f["name"]: f for f in both.tree["features"]["sparse"]}
    assert sparse["click_50_seq__cate_id"]["table"] == "cate_id_emb" and sparse["cate_id"]["pooling"] == "mean"
    assert any(f.path == "feature_configs" and f.message.startswith("cate_id: pooled with mean like the sequences "
                                                                    "sharing table 'cate_id_emb'") for f in both.notes)
    checked(conversion, tzrun_pm)
    checked(both, tzrun_pm)


def test_a_dssm_sequence_group_with_a_mean_pooling_encoder_becomes_a_truncated_sequence_group(tzrun_pm):
    conversion = convert_pipeline_config(DSSM_TAOBAO, "dssm.config")
    assert conversion.tree["features"]["sequence"] == [{
        "name": "click_50_seq", "max_len": 100, "keep": "first", "separator": "|", "features": [
            {"name": "click_50_seq__adgroup_id", "column": "click_50_seq__adgroup_id", "num_buckets": 846812,
             "embedding_dim": 16},
            {"name": "click_50_seq__cate_id", "column": "click_50_seq__cate_id", "num_buckets": 12961,
             "embedding_dim": 16}]}]
    assert not any(f["name"].startswith("click_50_seq") for f in conversion.tree["features"]["sparse"])
    assert conversion.tree["model"]["sequence_encoders"] == [{"sequence": "click_50_seq", "type": "mean"}]
    assert 'max_len = 100, keep = "first": a longer row keeps its first 100 ids' in \
        noted(conversion)["model_config.feature_groups: sequence group 'click_50_seq'"]
    assert "feature_configs[6].sequence_feature.sequence_length" not in noted(conversion)  # it is applied now
    checked_with_sequences(conversion, tzrun_pm)
    din = DSSM_TAOBAO.replace('pooling_encoder { input: "click_50_seq" pooling_type: "mean" }',
                              'din_encoder { attn_mlp { hidden_units: [8] } }')  # input: the group's only sequence
    din = din.replace('group_name: "click_50_seq"', 'group_name: "click_50_seq" feature_names: "adgroup_id"')  # a query
    refused = convert_pipeline_config(din, "din.config")
    assert "adgroup_id" in {f["name"] for f in refused.tree["features"]["sparse"]}
    assert "din_encoder over sequence group 'click_50_seq' has no equivalent here (this model's towers never see the " \
           "candidate: they encode a sequence with mean, self_attention or self_attention_tzrec)" in \
        reported(refused)["feature_configs[6].sequence_feature.features[0].id_feature"]
    assert not any(n.startswith("click_50_seq") for n in refused.tree["model"]["user_features"])
    checked(refused, tzrun_pm)


def test_multi_tower_din_becomes_din_with_a_sequence_group_whose_query_is_the_candidate(tzrun_pm):
    conversion = convert_pipeline_config(MULTI_TOWER_DIN_TAOBAO, "din.config")
    assert conversion.tree["model"] == {
        "type": "din",
        "towers": [{"features": ["user_id", "cms_segid", "adgroup_id", "cate_id", "brand", "price", "pid"],
                    "hidden_units": [512, 256, 128]}],
        "din_towers": [{"sequence": "seq", "attention_hidden_units": [256, 64]}],
        "final_hidden_units": [64]}
    (group,) = conversion.tree["features"]["sequence"]
    assert {k: v for k, v in group.items() if k != "features"} == {
        "name": "seq", "max_len": 100, "keep": "first", "separator": "|", "query": ["adgroup_id", "cate_id", "brand"]}
    assert [(f["name"], f["column"], f["num_buckets"]) for f in group["features"]] == [
        ("click_50_seq__adgroup_id", "click_50_seq__adgroup_id", 846812),
        ("click_50_seq__cate_id", "click_50_seq__cate_id", 12961), ("click_50_seq__brand", "click_50_seq__brand", 461498)]
    assert list(reported(conversion)) == ["train_input_path", "eval_input_path", "data_config.dataset_type"]
    checked_with_sequences(conversion, tzrun_pm)
    two = MULTI_TOWER_DIN_TAOBAO.replace('feature_names: "brand" feature_names: "click_50_seq__adgroup_id"',
                                         'feature_names: "click_50_seq__adgroup_id"')
    unpaired = convert_pipeline_config(two, "din.config")
    assert "model" not in unpaired.tree
    assert reported(unpaired)["model_config.feature_groups: sequence group 'seq'"].startswith(
        "2 query features (adgroup_id, cate_id) for 3 sequence features")
    assert "no sequence group with a query here" in reported(unpaired)["model_config.multi_tower_din.din_towers[0].input"]


def test_sequence_id_and_raw_features_and_id_features_with_a_sequence_length(tzrun_pm):
    features = (
        'feature_configs { id_feature { feature_name: "item" num_buckets: 50 embedding_dim: 8 } } '
        'feature_configs { raw_feature { feature_name: "price" boundaries: [1.0, 5.0] embedding_dim: 8 } } '
        'feature_configs { sequence_id_feature { feature_name: "clicks" sequence_length: 20 sequence_delim: "|" '
        'num_buckets: 50 embedding_dim: 8 } } '
        'feature_configs { sequence_raw_feature { feature_name: "prices" sequence_length: 20 sequence_delim: "|" '
        'boundaries: [1.0, 5.0] embedding_dim: 8 } } '
        'feature_configs { sequence_raw_feature { feature_name: "stay" sequence_length: 20 } } '
        'feature_configs { id_feature { feature_name: "views" sequence_length: 30 num_buckets: 50 embedding_dim: 8 } } ')
    groups = ('feature_groups { group_name: "all" feature_names: "item" feature_names: "price" '
              'sequence_groups { group_name: "clicked" feature_names: "item" feature_names: "price" '
              'feature_names: "clicks" feature_names: "prices" feature_names: "stay" } '
              'sequence_groups { group_name: "viewed" feature_names: "views" } '
              'sequence_encoders { din_encoder { input: "clicked" attn_mlp { hidden_units: [16] } } } '
              'sequence_encoders { pooling_encoder { input: "viewed" } } group_type: DEEP }')
    model = ('mmoe { expert_mlp { hidden_units: [8] } num_expert: 2 task_towers { tower_name: "ctr" label_name: '
             '"label" mlp { hidden_units: [4] } } }')
    conversion = convert_pipeline_config(config(features, model, groups), "m.config")
    sequences = {g["name"]: g for g in conversion.tree["features"]["sequence"]}
    assert sequences["viewed"] == {"name": "viewed", "max_len": 30, "keep": "first", "separator": ";", "features": [  # default delim
        {"name": "views", "column": "views", "num_buckets": 50, "embedding_dim": 8}]}
    clicked = sequences["clicked"]
    assert (clicked["max_len"], clicked["separator"]) == (20, "|")
    assert [f["name"] for f in clicked["features"]] == ["clicks", "prices"]
    assert clicked["features"][1]["boundaries"] == [1.0, 5.0]
    assert conversion.tree["model"]["sequence_encoders"] == [
        {"sequence": "clicked", "type": "target_attention", "attention_hidden_units": [16]},
        {"sequence": "viewed", "type": "mean"}]
    assert clicked["dense"] == [{"name": "stay", "column": "stay"}]  # a dense sequence of the group
    assert not any(path.startswith("feature_configs[4]") for path in reported(conversion))
    assert clicked["query"] == ["item", "price"]  # the candidate's features, paired in order with the id sequences
    checked_with_sequences(conversion, tzrun_pm)


def _mmoe_with_clicks(fg_mode: str, encoder: str, sequence_length: str = "sequence_length: 20") -> Any:
    """An mmoe whose sequence group 'clicked' (a candidate 'item' and its clicks) has ``encoder``."""
    features = ('feature_configs { id_feature { feature_name: "item" num_buckets: 50 embedding_dim: 8 } } '
                f'feature_configs {{ sequence_id_feature {{ feature_name: "clicks" {sequence_length} '
                'num_buckets: 50 embedding_dim: 8 } } ')
    groups = ('feature_groups { group_name: "all" feature_names: "item" sequence_groups { group_name: "clicked" '
              f'feature_names: "item" feature_names: "clicks" }} sequence_encoders {{ {encoder} }} group_type: DEEP }}')
    model = ('mmoe { expert_mlp { hidden_units: [8] } num_expert: 2 task_towers { tower_name: "ctr" label_name: '
             '"label" mlp { hidden_units: [4] } } }')
    return convert_pipeline_config(config(features, model, groups, fg_mode), "m.config")


DIN = 'din_encoder { input: "clicked" attn_mlp { hidden_units: [16] } %s }'
MEAN = 'pooling_encoder { input: "clicked" %s }'


@pytest.mark.parametrize(("fg_mode", "encoder", "max_len", "keep", "says"), [
    # FG_NONE: TorchEasyRec truncates nothing but an encoder's max_seq_length (a row's first ids)
    ("FG_NONE", DIN % "", 20, "all", "with fg_mode FG_NONE TorchEasyRec truncates no sequence"),
    ("FG_NONE", MEAN % "", 20, "all", "a row longer than 20 is a bad row (data.on_bad_row), never cut"),
    ("FG_NONE", DIN % "max_seq_length: 50", 50, "first", "its encoder's max_seq_length keeps a row's first 50 ids"),
    ("FG_NONE", MEAN % "max_seq_length: 5", 5, "first", "its encoder's max_seq_length keeps a row's first 5 ids"),
    # a feature generator cuts a row to sequence_length, then the encoder to max_seq_length
    ("FG_DAG", DIN % "", 20, "first", "a longer row keeps its first 20 ids (sequence_length)"),
    ("FG_DAG", DIN % "max_seq_length: 5", 5, "first", "keeps a row's first 5 ids"),
    ("FG_DAG", MEAN % "max_seq_length: 50", 20, "first", "a longer row keeps its first 20 ids"),
])
def test_convert_writes_what_torcheasyrec_keeps_of_a_row(fg_mode, encoder, max_len, keep, says, tzrun_pm):
    conversion = _mmoe_with_clicks(fg_mode, encoder)
    (group,) = conversion.tree["features"]["sequence"]
    assert (group["max_len"], group["keep"]) == (max_len, keep)
    note = noted(conversion)["model_config.feature_groups: sequence group 'clicked'"]
    assert note.startswith(f'max_len = {max_len}, keep = "{keep}": ') and says in note
    assert not any("max_seq_length" in path for path in reported(conversion))  # applied, not reported
    checked_with_sequences(conversion, tzrun_pm)


def test_a_sequence_without_any_bound_is_reported_with_both_ways_to_bound_it():
    conversion = _mmoe_with_clicks("FG_NONE", DIN % "", sequence_length="")
    (group,) = conversion.tree["features"]["sequence"]
    assert "max_len" not in group and "keep" not in group  # left for the user, as reported
    message = reported(conversion)["model_config.feature_groups: sequence group 'clicked'"]
    assert message.startswith("no sequence_length: TorchEasyRec keeps every id") and 'keep = \"all\"' in message
    bounded = _mmoe_with_clicks("FG_NONE", DIN % "max_seq_length: 7", sequence_length="")
    assert {k: bounded.tree["features"]["sequence"][0][k] for k in ("max_len", "keep")} == {"max_len": 7, "keep": "first"}


def test_features_in_no_group_are_left_out_and_reported():
    text = MMOE_TAOBAO.replace('feature_names: "pid"', "")
    conversion = convert_pipeline_config(text, "mmoe.config")
    assert "pid" not in {f["name"] for f in conversion.tree["features"]["sparse"]}
    assert reported(conversion)["feature_configs"].startswith("pid: in none of the feature groups, so TorchEasyRec's model does not read them")


# ----------------------------------------------------------------------------------------------
# models


def test_mmoe_tasks_are_named_after_the_towers_and_read_by_the_converted_losses(tzrun_pm):
    conversion = convert_pipeline_config(MMOE_TAOBAO.replace("num_expert: 3", "num_expert: 4 gate_mlp { hidden_units: 16 }"),
                                         "mmoe.config")
    assert conversion.tree["model"] == {
        "type": "mmoe", "num_experts": 4, "expert_hidden_units": [512, 256, 128], "gate_hidden_units": [16],
        "tasks": [{"name": "ctr", "hidden_units": [256, 128, 64]}, {"name": "cvr", "hidden_units": [256, 128, 64]}]}
    assert [loss["prediction"] for loss in conversion.tree["losses"]] == ["logits/ctr", "logits/cvr"]
    checked(conversion, tzrun_pm)


def test_dlrm_writes_torcheasyrecs_arch_with_sparse_default_and_notes_the_parts(tzrun_pm):
    conversion = convert_pipeline_config(DLRM_CRITEO.replace("arch_with_sparse: true", ""), "dlrm.config")
    assert conversion.tree["model"] == {"type": "dlrm", "dense_hidden_units": [64, 16], "top_hidden_units": [64, 32],
                                        "arch_with_sparse": True}
    moved = DLRM_CRITEO.replace('group_name: "sparse" feature_names: "cat_0"', 'group_name: "sparse"') \
        .replace('group_name: "dense" feature_names: "int_0"', 'group_name: "dense" feature_names: "int_0" feature_names: "cat_0"')
    assert "the interaction reads every id feature here, also cat_0 (not in group 'sparse')" in \
        noted(convert_pipeline_config(moved, "dlrm.config"))["model_config.feature_groups"]
    checked(conversion, tzrun_pm)


def test_dssm_writes_towers_similarity_and_temperature_with_torcheasyrecs_defaults(tzrun_pm):
    conversion = convert_pipeline_config(DSSM_TAOBAO, "dssm.config")
    assert conversion.tree["model"] == {
        "type": "dssm", "user_features": ["user_id", "cms_segid", "pid", "click_50_seq"],
        "user_hidden_units": [512, 256, 128], "item_features": ["adgroup_id", "cate_id", "price"],
        "item_hidden_units": [512, 256, 128], "output_dim": 64, "similarity": "inner_product", "temperature": 1.0,
        "sequence_encoders": [{"sequence": "click_50_seq", "type": "mean"}]}
    assert conversion.tree["losses"] == [{"type": "in_batch_softmax"}]
    assert "add [data.sampler] type" in reported(conversion)["data_config.negative_sampler"]
    assert "in-batch negatives" in noted(conversion)["model_config.dssm.in_batch_negative"]
    checked_with_sequences(conversion, tzrun_pm)
    euclid = convert_pipeline_config(DSSM_TAOBAO.replace("output_dim: 64", "output_dim: 64 similarity: EUCLID"), "d.config")
    assert "model" not in euclid.tree and "EUCLID" in reported(euclid)["model_config.dssm.similarity"]


def test_wide_and_deep_and_deepfm_options_and_mlp_fields_without_equivalent(tzrun_pm):
    features = ('feature_configs { id_feature { feature_name: "a" num_buckets: 9 embedding_dim: 8 } } '
                'feature_configs { raw_feature { feature_name: "b" } }')
    groups = ('feature_groups { group_name: "wide" feature_names: "a" group_type: WIDE } '
              'feature_groups { group_name: "deep" feature_names: "a" feature_names: "b" group_type: DEEP }')
    wide = convert_pipeline_config(config(features, 'wide_and_deep { deep { hidden_units: [16, 8] dropout_ratio: [0.1, 0.1] '
                                                    'activation: "nn.Tanh" use_bn: true } wide_embedding_dim: 8 '
                                                    'final { hidden_units: [4] } }', groups), "w.config")
    assert wide.tree["model"] == {"type": "wide_and_deep", "deep_hidden_units": [16, 8], "wide_embedding_dim": 8}
    said = reported(wide)
    for field in ("dropout_ratio", "activation", "use_bn"):
        assert "tzrec-run's MLPs" in said[f"model_config.wide_and_deep.deep.{field}"]
    assert "no final MLP here" in said["model_config.wide_and_deep.final"]
    checked(wide, tzrun_pm)
    deepfm = convert_pipeline_config(config(features, "deepfm { deep { hidden_units: [16] } }", groups), "d.config")
    assert deepfm.tree["model"] == {"type": "deepfm", "deep_hidden_units": [16], "final_hidden_units": []}
    checked(deepfm, tzrun_pm)


def test_batch_cost_size_and_sample_cost_field_become_cost_aware_batches(tzrun_pm):
    text = DSSM_TAOBAO.replace("num_workers: 8", 'num_workers: 8 batch_cost_size: 5000 sample_cost_field: "n_tokens"')
    conversion = convert_pipeline_config(text, "d.config")
    assert (conversion.tree["data"]["batch_cost_size"], conversion.tree["data"]["sample_cost"]) == (5000, "n_tokens")
    assert "at most batch_size = 8192 rows here" in noted(conversion)["data_config.batch_cost_size"]
    checked_with_sequences(conversion, tzrun_pm)
    by_length = convert_pipeline_config(DSSM_TAOBAO.replace("num_workers: 8", "num_workers: 8 batch_cost_size: 5000"),
                                        "d.config")
    assert "sample_cost" not in by_length.tree["data"]
    assert "1 + its sequences' lengths here" in noted(by_length)["data_config.batch_cost_size"]
    checked_with_sequences(by_length, tzrun_pm)
    unused = convert_pipeline_config(DSSM_TAOBAO.replace("num_workers: 8", 'num_workers: 8 sample_cost_field: "n"'), "d")
    assert "unused without batch_cost_size" in reported(unused)["data_config.sample_cost_field"]


@pytest.mark.parametrize(("encoder", "table", "max_len"), [
    ('multi_window_din_encoder { input: "clicked" windows_len: [1, 2, 3] attn_mlp { hidden_units: [16] activation: "Dice" } }',
     {"type": "multi_window_din", "window_lengths": [1, 2, 3], "attention_hidden_units": [16], "attention_activation": "dice"}, 6),
    ('simple_attention { input: "clicked" max_seq_length: 5 }', {"type": "simple_attention"}, 5),
    ('din_encoder { input: "clicked" attn_mlp { hidden_units: [16, 8] activation: "Dice" } }',
     {"type": "target_attention", "attention_hidden_units": [16, 8], "attention_activation": "dice"}, 20),
])
def test_the_attending_encoders_and_dice_convert_with_the_candidate_as_query(encoder, table, max_len, tzrun_pm):
    conversion = _mmoe_with_clicks("FG_DAG", encoder)
    (group,) = conversion.tree["features"]["sequence"]
    assert conversion.tree["model"]["sequence_encoders"] == [{"sequence": "clicked", **table}]
    assert (group["max_len"], group["keep"], group["query"]) == (max_len, "first", ["item"])
    assert not any("clicked" in path or "sequence_encoders" in path for path in reported(conversion))
    checked_with_sequences(conversion, tzrun_pm)


def test_multi_window_din_keeps_the_first_ids_its_windows_read_without_a_feature_generator(tzrun_pm):
    """TorchEasyRec's windows count from a row's first id: keep = "first" makes ours count from it too,
    and max_len = sum(windows_len) holds every id they read (FG_NONE truncates nothing)."""
    conversion = _mmoe_with_clicks("FG_NONE", 'multi_window_din_encoder { input: "clicked" windows_len: [2, 5] '
                                              'attn_mlp { hidden_units: [8] } }')
    (group,) = conversion.tree["features"]["sequence"]
    assert (group["max_len"], group["keep"]) == (7, "first")
    assert noted(conversion)["model_config.feature_groups: sequence group 'clicked'"].startswith(
        'max_len = 7, keep = "first": its multi_window_din_encoder\'s windows (counted from a row\'s first id) keeps '
        "a row's first 7 ids")
    checked_with_sequences(conversion, tzrun_pm)


def test_self_attention_encoder_becomes_self_attention_tzrec_in_any_sequence_model(tzrun_pm):
    conversion = _mmoe_with_clicks("FG_NONE", 'self_attention_encoder { input: "clicked" multihead_attn_dim: 16 '
                                              'num_heads: 4 dropout: 0.1 }')
    assert conversion.tree["model"]["sequence_encoders"] == [
        {"sequence": "clicked", "type": "self_attention_tzrec", "attention_dim": 16, "num_heads": 4, "dropout": 0.1}]
    (group,) = conversion.tree["features"]["sequence"]
    assert "query" not in group and group["keep"] == "all"  # it reads no candidate; FG_NONE truncates nothing
    checked_with_sequences(conversion, tzrun_pm)
    defaults = _mmoe_with_clicks("FG_NONE", 'self_attention_encoder { input: "clicked" }')
    assert defaults.tree["model"]["sequence_encoders"][0] == {
        "sequence": "clicked", "type": "self_attention_tzrec", "attention_dim": 512, "num_heads": 8}


def test_an_attention_mlp_s_other_activations_and_layers_are_reported():
    conversion = _mmoe_with_clicks("FG_DAG", 'din_encoder { input: "clicked" attn_mlp { hidden_units: [8] '
                                             'activation: "nn.PReLU" use_bn: true } }')
    said = reported(conversion)
    assert conversion.tree["model"]["sequence_encoders"] == [
        {"sequence": "clicked", "type": "target_attention", "attention_hidden_units": [8]}]
    assert any("an attention MLP's activation is relu or dice (Dice) here, not nn.PReLU" in m for m in said.values())
    assert any("batch normalization has no equivalent" in m for m in said.values())


def test_multi_tower_din_with_dice_keeps_it():
    dice = MULTI_TOWER_DIN_TAOBAO.replace("attn_mlp {", 'attn_mlp { activation: "Dice"', 1)
    assert dice != MULTI_TOWER_DIN_TAOBAO
    conversion = convert_pipeline_config(dice, "din.config")
    assert conversion.tree["model"]["din_towers"] == [
        {"sequence": "seq", "attention_hidden_units": [256, 64], "attention_activation": "dice"}]


def test_a_zch_feature_becomes_a_zch_table_and_its_lambda_filter_is_reported(tzrun_pm):
    conversion = one('id_feature { feature_name: "a" embedding_dim: 8 zch { zch_size: 1000 eviction_interval: 3 '
                     'distance_lfu { decay_exponent: 0.5 } threshold_filtering_func: "lambda x: x > 1" } }')
    sparse = {f["name"]: f for f in conversion.tree["features"]["sparse"]}
    assert sparse["a"]["zch"] == {"size": 1000, "eviction_interval": 3,
                                  "eviction_policy": {"type": "distance_lfu", "decay_exponent": 0.5}}
    assert "never evaluates" in reported(conversion)["feature_configs[0].id_feature.zch.threshold_filtering_func"]
    checked(conversion, tzrun_pm)
