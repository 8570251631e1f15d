"""``tzrec-run convert`` of a ``raw_feature`` inside a ``sequence_feature`` (and of a
``sequence_raw_feature``): a dense sequence of the group that reads it, with its default and
normalizer, or with ``boundaries`` an id sequence; the DIN tower that reads it is kept, and
each converted config passes the check."""

from __future__ import annotations

from tests.core.test_convert_features import checked, config, noted, reported
from tests.core.torcheasyrec_examples import MULTI_TOWER_DIN_TAOBAO
from tzrun_tools.convert import convert_pipeline_config

BRAND = ('        features { id_feature { feature_name: "brand" expression: "item:brand" num_buckets: 461498 '
         'embedding_dim: 16 } }\n')


def _din(raw: str, fg_mode: str = "FG_DAG", in_group: bool = True) -> str:
    """The multi_tower_din example with ``raw`` (a raw_feature) in its click sequence, read by the DIN
    tower (or, without ``in_group``, by no group)."""
    text = MULTI_TOWER_DIN_TAOBAO.replace(BRAND, BRAND + f"        features {{ {raw} }}\n")
    if in_group:
        text = text.replace('feature_names: "click_50_seq__brand"',
                            'feature_names: "click_50_seq__brand" feature_names: "click_50_seq__price"')
    return text.replace("fg_mode: FG_DAG", f"fg_mode: {fg_mode}")


def test_a_raw_feature_of_a_sequence_becomes_a_dense_sequence_and_the_din_tower_stays(tzrun_pm):
    raw = ('raw_feature { feature_name: "price" expression: "item:price" default_value: "-1" '
           'normalizer: "method=zscore,mean=10,standard_deviation=4" }')
    conversion = convert_pipeline_config(_din(raw), "din.config")
    (group,) = conversion.tree["features"]["sequence"]
    assert group["dense"] == [{"name": "click_50_seq__price", "column": "click_50_seq__price", "fill_value": -1.0,
                               "mean": 10.0, "std": 4.0}]
    assert [f["name"] for f in group["features"]] == ["click_50_seq__adgroup_id", "click_50_seq__cate_id",
                                                      "click_50_seq__brand"]
    assert group["query"] == ["adgroup_id", "cate_id", "brand"]  # the values pair with no query feature
    assert conversion.tree["model"]["din_towers"] == [{"sequence": "seq", "attention_hidden_units": [256, 64]}]
    assert not any("price" in path or "price" in message for path, message in reported(conversion).items())
    checked(conversion, tzrun_pm)


def test_under_fg_none_the_column_holds_normalised_values(tzrun_pm):
    raw = 'raw_feature { feature_name: "price" expression: "item:price" normalizer: "method=zscore,mean=10" }'
    conversion = convert_pipeline_config(_din(raw, "FG_NONE"), "din.config")
    (group,) = conversion.tree["features"]["sequence"]
    assert group["dense"] == [{"name": "click_50_seq__price", "column": "click_50_seq__price"}]
    checked(conversion, tzrun_pm)


def test_a_raw_feature_of_a_sequence_with_boundaries_is_an_id_sequence(tzrun_pm):
    raw = 'raw_feature { feature_name: "price" expression: "item:price" boundaries: [1.0, 5.0] embedding_dim: 16 }'
    text = _din(raw).replace('feature_names: "brand" feature_names: "click_50_seq__adgroup_id"',
                             'feature_names: "brand" feature_names: "price" feature_names: "click_50_seq__adgroup_id"')
    conversion = convert_pipeline_config(text, "din.config")
    (group,) = conversion.tree["features"]["sequence"]
    assert "dense" not in group
    assert group["features"][3] == {"name": "click_50_seq__price", "column": "click_50_seq__price",
                                    "boundaries": [1.0, 5.0], "embedding_dim": 16}
    assert group["query"] == ["adgroup_id", "cate_id", "brand", "price"]  # an id sequence pairs with a query feature
    encoded = convert_pipeline_config(text.replace("fg_mode: FG_DAG", "fg_mode: FG_NONE"), "din.config")
    assert encoded.tree["features"]["sequence"][0]["features"][3]["num_buckets"] == 3
    checked(conversion, tzrun_pm)
    checked(encoded, tzrun_pm)


def test_a_dense_sequence_no_sequence_group_reads_is_reported(tzrun_pm):
    raw = 'raw_feature { feature_name: "price" expression: "item:price" }'
    conversion = convert_pipeline_config(_din(raw, in_group=False), "din.config")
    assert "dense" not in conversion.tree["features"]["sequence"][0]
    assert reported(conversion)["feature_configs[7].sequence_feature.features[3].raw_feature"].startswith(
        "a sequence of values in no sequence group the model reads")
    checked(conversion, tzrun_pm)


def test_a_sequence_raw_feature_in_an_mmoe_sequence_group(tzrun_pm):
    features = ('feature_configs { id_feature { feature_name: "item" num_buckets: 50 embedding_dim: 8 } } '
                'feature_configs { sequence_id_feature { feature_name: "clicks" sequence_length: 20 sequence_delim: "|" '
                'num_buckets: 50 embedding_dim: 8 } } '
                'feature_configs { sequence_raw_feature { feature_name: "gaps" sequence_length: 20 sequence_delim: "|" '
                'normalizer: "method=zscore,mean=1,standard_deviation=2" } } ')
    groups = ('feature_groups { group_name: "all" feature_names: "item" sequence_groups { group_name: "clicked" '
              'feature_names: "item" feature_names: "clicks" feature_names: "gaps" } sequence_encoders { din_encoder '
              '{ input: "clicked" attn_mlp { hidden_units: [16] } } } group_type: DEEP }')
    model = ('mmoe { expert_mlp { hidden_units: [8] } num_expert: 2 task_towers { tower_name: "ctr" label_name: '
             '"label" mlp { hidden_units: [4] } } }')
    conversion = convert_pipeline_config(config(features, model, groups), "m.config")
    (group,) = conversion.tree["features"]["sequence"]
    assert {k: v for k, v in group.items() if k != "features"} == {
        "name": "clicked", "max_len": 20, "keep": "first", "separator": "|", "query": ["item"],
        "dense": [{"name": "gaps", "column": "gaps", "mean": 1.0, "std": 2.0}]}
    assert "sequence group 'clicked'" in "".join(noted(conversion))
    checked(conversion, tzrun_pm)
