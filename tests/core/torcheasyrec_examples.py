"""TorchEasyRec's ``examples/*.config``: small configs with their structure (written here: the same
messages, field names, feature kinds, groups and model blocks, with fewer features), and verbatim
copies of some (Apache-2.0), each marked as such."""

from __future__ import annotations

__all__ = ["DEEPFM_CRITEO", "DLRM_CRITEO", "MMOE_TAOBAO", "DSSM_TAOBAO", "MULTI_TOWER_DIN_TAOBAO", "MULTI_TOWER_TAOBAO",
           "PLE_TAOBAO", "DBMTL_TAOBAO", "MASKNET_CRITEO",
           "DCN_V2_CRITEO", "WUKONG_CRITEO", "PEPNET_TAOBAO", "DSSM_V2_TAOBAO", "MIND_TAOBAO",
           "ROCKET_LAUNCHING_CRITEO", "TDM_TAOBAO", "EXAMPLES"]

_TRAIN = """
train_input_path: "odps://{PROJECT}/tables/%(table)s_train"
eval_input_path: "odps://{PROJECT}/tables/%(table)s_eval"
model_dir: "experiments/%(name)s"
train_config {
    sparse_optimizer {
        adagrad_optimizer { lr: 0.001 }
        constant_learning_rate {}
    }
    dense_optimizer {
        adam_optimizer { lr: 0.001 }
        constant_learning_rate {}
    }
    num_epochs: %(epochs)d
}
eval_config { %(eval)s }
"""


def _head(name: str, table: str, epochs: int = 1, evaluation: str = "") -> str:
    return _TRAIN % {"name": name, "table": table, "epochs": epochs, "eval": evaluation}


def _criteo_features(expression: bool) -> str:
    out = []
    for i in range(2):
        extra = f'expression: "user:int_{i}" normalizer: "method=expression,expr=log(x+3)"' if expression else ""
        out.append(f'feature_configs {{ raw_feature {{ feature_name: "int_{i}" {extra} }} }}')
    for i, buckets in enumerate((40000000, 39060, 17295)):
        extra = f'expression: "user:cat_{i}"' if expression else ""
        out.append(f'feature_configs {{ id_feature {{ feature_name: "cat_{i}" {extra} num_buckets: {buckets} '
                   "embedding_dim: 16 } }")
    return "\n".join(out)


def _names(*names: str) -> str:
    return " ".join(f'feature_names: "{n}"' for n in names)


DEEPFM_CRITEO = _head("deepfm_criteo", "criteo", evaluation="num_steps: 100") + """
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_NONE
    label_fields: "label"
    num_workers: 8
}
""" + _criteo_features(expression=False) + f"""
model_config {{
    feature_groups {{ group_name: "wide" {_names("cat_0", "cat_1", "cat_2")} group_type: WIDE }}
    feature_groups {{ group_name: "fm" {_names("cat_0", "cat_1", "cat_2")} group_type: DEEP }}
    feature_groups {{ group_name: "deep" {_names("int_0", "int_1", "cat_0", "cat_1", "cat_2")} group_type: DEEP }}
    deepfm {{
        deep {{ hidden_units: [512, 256, 128] }}
        final {{ hidden_units: [64] }}
    }}
    metrics {{ auc {{}} }}
    losses {{ binary_cross_entropy {{}} }}
}}
"""

DLRM_CRITEO = _head("dlrm_criteo", "criteo", evaluation="num_steps: 100") + """
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "label"
    odps_data_quota_name: ""
    num_workers: 8
}
""" + _criteo_features(expression=True) + f"""
model_config {{
    feature_groups {{ group_name: "dense" {_names("int_0", "int_1")} group_type: DEEP }}
    feature_groups {{ group_name: "sparse" {_names("cat_0", "cat_1", "cat_2")} group_type: DEEP }}
    dlrm {{
      dense_mlp {{ hidden_units: 64 hidden_units: 16 }}
      final {{ hidden_units: 64 hidden_units: 32 }}
      arch_with_sparse: true
    }}
    num_class: 1
    metrics {{ auc {{}} }}
    losses {{ binary_cross_entropy {{}} }}
}}
"""

_TAOBAO_FEATURES = """
feature_configs { id_feature { feature_name: "user_id" expression: "user:user_id" num_buckets: 1141730 embedding_dim: 16 } }
feature_configs { id_feature { feature_name: "cms_segid" expression: "user:cms_segid" num_buckets: 98 embedding_dim: 16 } }
feature_configs { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id" num_buckets: 846812 embedding_dim: 16 } }
feature_configs { id_feature { feature_name: "cate_id" expression: "item:cate_id" num_buckets: 12961 embedding_dim: 16 } }
feature_configs {
    raw_feature {
        feature_name: "price"
        expression: "item:price"
        boundaries: [1.1, 2.2, 3.6, 5.2, 7.39]
        embedding_dim: 16
    }
}
feature_configs { id_feature { feature_name: "pid" expression: "context:pid" hash_bucket_size: 20 embedding_dim: 16 } }
"""

MMOE_TAOBAO = _head("mmoe_taobao", "taobao_multitask") + """
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    label_fields: "buy"
    num_workers: 8
}
""" + _TAOBAO_FEATURES + f"""
model_config {{
    feature_groups {{
        group_name: "all"
        {_names("user_id", "cms_segid", "pid", "adgroup_id", "cate_id", "price")}
        group_type: DEEP
    }}
    mmoe {{
        expert_mlp {{ hidden_units: [512, 256, 128] }}
        num_expert: 3
        task_towers {{
            tower_name: "ctr"
            label_name: "clk"
            mlp {{ hidden_units: [256, 128, 64] }}
            metrics {{ auc {{}} }}
            losses {{ binary_cross_entropy {{}} }}
        }}
        task_towers {{
            tower_name: "cvr"
            label_name: "buy"
            mlp {{ hidden_units: [256, 128, 64] }}
            metrics {{ auc {{ thresholds: 1000 }} }}
            losses {{ binary_cross_entropy {{}} }}
        }}
    }}
}}
"""

DSSM_TAOBAO = _head("dssm_taobao", "taobao_multitask_pos", epochs=8) + r"""
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    num_workers: 8
    negative_sampler {
        input_path: "odps://{PROJECT}/tables/taobao_ad_feature_gl_v1"
        num_sample: 1024
        attr_fields: "adgroup_id"
        attr_fields: "cate_id"
        attr_fields: "price"
        item_id_field: "adgroup_id"
        attr_delimiter: "\x02"
    }
}
""" + _TAOBAO_FEATURES + """
feature_configs {
    sequence_feature {
        sequence_name: "click_50_seq"
        sequence_length: 100
        sequence_delim: "|"
        features { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id" num_buckets: 846812 embedding_dim: 16 } }
        features { id_feature { feature_name: "cate_id" expression: "item:cate_id" num_buckets: 12961 embedding_dim: 16 } }
    }
}
""" + f"""
model_config {{
    feature_groups {{
        group_name: "user"
        {_names("user_id", "cms_segid", "pid")}
        sequence_groups {{
            group_name: "click_50_seq"
            {_names("click_50_seq__adgroup_id", "click_50_seq__cate_id")}
        }}
        sequence_encoders {{
            pooling_encoder {{ input: "click_50_seq" pooling_type: "mean" }}
        }}
        group_type: DEEP
    }}
    feature_groups {{ group_name: "item" {_names("adgroup_id", "cate_id", "price")} group_type: DEEP }}
    dssm {{
        user_tower {{ input: 'user' mlp {{ hidden_units: [512, 256, 128] }} }}
        item_tower {{ input: 'item' mlp {{ hidden_units: [512, 256, 128] }} }}
        output_dim: 64
    }}
    metrics {{ recall_at_k {{ top_k: 1 }} }}
    metrics {{ recall_at_k {{ top_k: 5 }} }}
    losses {{ softmax_cross_entropy {{}} }}
}}
"""

MULTI_TOWER_DIN_TAOBAO = _head("multi_tower_din_taobao", "taobao_multitask_sample_v1") + """
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    num_workers: 8
}
""" + _TAOBAO_FEATURES + """
feature_configs { id_feature { feature_name: "brand" expression: "item:brand" num_buckets: 461498 embedding_dim: 16 } }
feature_configs {
    sequence_feature {
        sequence_name: "click_50_seq"
        sequence_length: 100
        sequence_delim: "|"
        features { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id" num_buckets: 846812 embedding_dim: 16 } }
        features { id_feature { feature_name: "cate_id" expression: "item:cate_id" num_buckets: 12961 embedding_dim: 16 } }
        features { id_feature { feature_name: "brand" expression: "item:brand" num_buckets: 461498 embedding_dim: 16 } }
    }
}
""" + f"""
model_config {{
    feature_groups {{
        group_name: "deep"
        {_names("user_id", "cms_segid", "adgroup_id", "cate_id", "brand", "price", "pid")}
        group_type: DEEP
    }}
    feature_groups {{
        group_name: "seq"
        {_names("adgroup_id", "cate_id", "brand", "click_50_seq__adgroup_id", "click_50_seq__cate_id",
                "click_50_seq__brand")}
        group_type: SEQUENCE
    }}
    multi_tower_din {{
        towers {{ input: 'deep' mlp {{ hidden_units: [512, 256, 128] }} }}
        din_towers {{ input: 'seq' attn_mlp {{ hidden_units: [256, 64] }} }}
        final {{ hidden_units: [64] }}
    }}
    metrics {{ auc {{}} }}
    losses {{ binary_cross_entropy {{}} }}
}}
"""

MULTI_TOWER_TAOBAO = _head("multi_tower_taobao", "taobao_multitask_sample_v1") + """
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    num_workers: 8
}
""" + _TAOBAO_FEATURES + f"""
model_config {{
    feature_groups {{
        group_name: "user"
        {_names("user_id", "cms_segid", "pid")}
        group_type: DEEP
    }}
    feature_groups {{
        group_name: "item"
        {_names("adgroup_id", "cate_id", "price")}
        group_type: DEEP
    }}
    multi_tower {{
        towers {{ input: 'user' mlp {{ hidden_units: [512, 256, 128] }} }}
        towers {{ input: 'item' mlp {{ hidden_units: [512, 256, 128] }} }}
        final {{ hidden_units: [64] }}
    }}
    metrics {{ auc {{}} }}
    losses {{ binary_cross_entropy {{}} }}
}}
"""

#: TorchEasyRec's examples/ple_taobao.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
PLE_TAOBAO = """train_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_v1_train"
eval_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_v1/ds=20170513"
model_dir: "experiments/ple_taobao"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
}
eval_config {
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    label_fields: "buy"
    num_workers: 8
}
feature_configs {
    id_feature {
        feature_name: "user_id"
        expression: "user:user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_segid"
        expression: "user:cms_segid"
        num_buckets: 98
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        expression: "user:cms_group_id"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        expression: "user:final_gender_code"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        expression: "user:age_level"
        num_buckets: 8
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        expression: "user:pvalue_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        expression: "user:shopping_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        expression: "user:occupation"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        expression: "user:new_user_class_level"
        num_buckets: 6
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        expression: "item:adgroup_id"
        num_buckets: 846812
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        expression: "item:cate_id"
        num_buckets: 12961
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        expression: "item:campaign_id"
        num_buckets: 423438
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        expression: "item:customer"
        num_buckets: 255877
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        expression: "item:brand"
        num_buckets: 461498
        embedding_dim: 16
    }
}
feature_configs {
    raw_feature {
        feature_name: "price"
        expression: "item:price"
        boundaries: [1.1, 2.2, 3.6, 5.2, 7.39, 9.5, 10.5, 12.9, 15, 17.37, 19, 20, 23.8, 25.8, 28, 29.8, 31.5, 34, 36, 38, 39, 40, 45, 48, 49, 51.6, 55.2, 58, 59, 63.8, 68, 69, 72, 78, 79, 85, 88, 90, 97.5, 98, 99, 100, 108, 115, 118, 124, 128, 129, 138, 139, 148, 155, 158, 164, 168, 171.8, 179, 188, 195, 198, 199, 216, 228, 238, 248, 258, 268, 278, 288, 298, 299, 316, 330, 352, 368, 388, 398, 399, 439, 478, 499, 536, 580, 599, 660, 699, 780, 859, 970, 1080, 1280, 1480, 1776, 2188, 2798, 3680, 5160, 8720]
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        expression: "context:pid"
        hash_bucket_size: 20
        embedding_dim: 16
    }
}
model_config {
    feature_groups {
        group_name: "all"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
    }
    ple {
        extraction_networks {
            network_name: "layer1"
            expert_num_per_task: 2
            share_num: 2
            task_expert_net {
                hidden_units: [1024, 512, 256]
            }
            share_expert_net {
                hidden_units: [1024, 512, 256]
            }
        }
         extraction_networks {
            network_name: "layer2"
            expert_num_per_task: 3
            share_num: 3
            task_expert_net {
                hidden_units: [256, 128, 64]
            }
            share_expert_net {
                hidden_units: [256, 128, 64]
            }
        }
         extraction_networks {
            network_name: "layer3"
            expert_num_per_task: 4
            share_num: 4
            task_expert_net {
                hidden_units: [128, 64, 32]
            }
            share_expert_net {
                hidden_units: [128, 64, 32]
            }
        }

        task_towers {
            tower_name: "ctr"
            label_name: "clk"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {}
            }
            losses {
                binary_cross_entropy {}
            }
        }
        task_towers {
            tower_name: "cvr"
            label_name: "buy"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {
                    thresholds: 1000
                }
            }
            losses {
                binary_cross_entropy {}
            }
        }
    }

}
"""

#: TorchEasyRec's examples/masknet_criteo.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
MASKNET_CRITEO = """train_input_path: ""
eval_input_path: ""
model_dir: ""
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.0001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.0001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
    save_checkpoints_epochs: 1
}
eval_config {

}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "label"
    num_workers: 8
}

feature_configs {
    raw_feature {
        feature_name: "int_0"
        embedding_dim: 16
        expression: "user:int_0"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_1"
        embedding_dim: 16
        expression: "user:int_1"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_2"
        embedding_dim: 16
        expression: "user:int_2"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_3"
        embedding_dim: 16
        expression: "user:int_3"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_4"
        embedding_dim: 16
        expression: "user:int_4"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_5"
        embedding_dim: 16
        expression: "user:int_5"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_6"
        embedding_dim: 16
        expression: "user:int_6"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_7"
        embedding_dim: 16
        expression: "user:int_7"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_8"
        embedding_dim: 16
        expression: "user:int_8"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_9"
        embedding_dim: 16
        expression: "user:int_9"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_10"
        embedding_dim: 16
        expression: "user:int_10"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_11"
        embedding_dim: 16
        expression: "user:int_11"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_12"
        embedding_dim: 16
        expression: "user:int_12"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_0"
        hash_bucket_size: 40000000
        embedding_dim: 16
        expression: "item:cat_0"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_1"
        hash_bucket_size: 39060
        embedding_dim: 16
        expression: "item:cat_1"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_2"
        hash_bucket_size: 17295
        embedding_dim: 16
        expression: "item:cat_2"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_3"
        hash_bucket_size: 7424
        embedding_dim: 16
        expression: "item:cat_3"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_4"
        hash_bucket_size: 20265
        embedding_dim: 16
        expression: "item:cat_4"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_5"
        hash_bucket_size: 3
        embedding_dim: 16
        expression: "item:cat_5"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_6"
        hash_bucket_size: 7122
        embedding_dim: 16
        expression: "item:cat_6"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_7"
        hash_bucket_size: 1543
        embedding_dim: 16
        expression: "item:cat_7"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_8"
        hash_bucket_size: 63
        embedding_dim: 16
        expression: "item:cat_8"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_9"
        hash_bucket_size: 40000000
        embedding_dim: 16
        expression: "item:cat_9"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_10"
        hash_bucket_size: 3067956
        embedding_dim: 16
        expression: "item:cat_10"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_11"
        hash_bucket_size: 405282
        embedding_dim: 16
        expression: "item:cat_11"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_12"
        hash_bucket_size: 10
        embedding_dim: 16
        expression: "item:cat_12"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_13"
        hash_bucket_size: 2209
        embedding_dim: 16
        expression: "item:cat_13"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_14"
        hash_bucket_size: 11938
        embedding_dim: 16
        expression: "item:cat_14"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_15"
        hash_bucket_size: 155
        embedding_dim: 16
        expression: "item:cat_15"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_16"
        hash_bucket_size: 4
        embedding_dim: 16
        expression: "item:cat_16"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_17"
        hash_bucket_size: 976
        embedding_dim: 16
        expression: "item:cat_17"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_18"
        hash_bucket_size: 14
        embedding_dim: 16
        expression: "item:cat_18"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_19"
        hash_bucket_size: 40000000
        embedding_dim: 16
        expression: "item:cat_19"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_20"
        hash_bucket_size: 40000000
        embedding_dim: 16
        expression: "item:cat_20"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_21"
        hash_bucket_size: 40000000
        embedding_dim: 16
        expression: "item:cat_21"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_22"
        hash_bucket_size: 590152
        embedding_dim: 16
        expression: "item:cat_22"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_23"
        hash_bucket_size: 12973
        embedding_dim: 16
        expression: "item:cat_23"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_24"
        hash_bucket_size: 108
        embedding_dim: 16
        expression: "item:cat_24"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_25"
        hash_bucket_size: 36
        embedding_dim: 16
        expression: "item:cat_25"
    }
}

model_config {
    feature_groups {
        group_name: "all_features"
        feature_names: "cat_0"
        feature_names: "cat_1"
        feature_names: "cat_2"
        feature_names: "cat_3"
        feature_names: "cat_4"
        feature_names: "cat_5"
        feature_names: "cat_6"
        feature_names: "cat_7"
        feature_names: "cat_8"
        feature_names: "cat_9"
        feature_names: "cat_10"
        feature_names: "cat_11"
        feature_names: "cat_12"
        feature_names: "cat_13"
        feature_names: "cat_14"
        feature_names: "cat_15"
        feature_names: "cat_16"
        feature_names: "cat_17"
        feature_names: "cat_18"
        feature_names: "cat_19"
        feature_names: "cat_20"
        feature_names: "cat_21"
        feature_names: "cat_22"
        feature_names: "cat_23"
        feature_names: "cat_24"
        feature_names: "cat_25"
        feature_names: "int_0"
        feature_names: "int_1"
        feature_names: "int_2"
        feature_names: "int_3"
        feature_names: "int_4"
        feature_names: "int_5"
        feature_names: "int_6"
        feature_names: "int_7"
        feature_names: "int_8"
        feature_names: "int_9"
        feature_names: "int_10"
        feature_names: "int_11"
        feature_names: "int_12"
        group_type: DEEP
    }

    mask_net {
        mask_net_module{
            n_mask_blocks: 3
            mask_block {
                reduction_ratio: 3
                hidden_dim: 512
            }
            use_parallel: true
            top_mlp {
                hidden_units: [256, 128, 64]

            }
        }
    }
    metrics {
        auc {}
    }

    losses {
        binary_cross_entropy {}
    }
}
"""

#: TorchEasyRec keeps its dcn_v2_criteo.config off the repository (docs/source/models/dcn_v2.md links it on
#: OSS): examples/masknet_criteo.config with its model block replaced by that page's dcn_v2 block, verbatim.
DCN_V2_CRITEO = MASKNET_CRITEO.replace('''    mask_net {
        mask_net_module{
            n_mask_blocks: 3
            mask_block {
                reduction_ratio: 3
                hidden_dim: 512
            }
            use_parallel: true
            top_mlp {
                hidden_units: [256, 128, 64]

            }
        }
    }
''', """    dcn_v2 {
        backbone {
            hidden_units: 512
            hidden_units: 256
            hidden_units: 128
        }
        cross {
            cross_num: 2
            low_rank: 32
        }
        deep {
            hidden_units: 512
            hidden_units: 256
        }
        final {
            hidden_units: 128
            hidden_units: 32
        }
    }
""")

#: TorchEasyRec's examples/dbmtl_taobao.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
DBMTL_TAOBAO = """train_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_v1_train"
eval_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_v1/ds=20170513"
model_dir: "experiments/dbmtl_taobao"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
}
eval_config {
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    label_fields: "buy"
    num_workers: 8
}
feature_configs {
    id_feature {
        feature_name: "user_id"
        expression: "user:user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_segid"
        expression: "user:cms_segid"
        num_buckets: 98
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        expression: "user:cms_group_id"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        expression: "user:final_gender_code"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        expression: "user:age_level"
        num_buckets: 8
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        expression: "user:pvalue_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        expression: "user:shopping_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        expression: "user:occupation"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        expression: "user:new_user_class_level"
        num_buckets: 6
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        expression: "item:adgroup_id"
        num_buckets: 846812
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        expression: "item:cate_id"
        num_buckets: 12961
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        expression: "item:campaign_id"
        num_buckets: 423438
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        expression: "item:customer"
        num_buckets: 255877
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        expression: "item:brand"
        num_buckets: 461498
        embedding_dim: 16
    }
}
feature_configs {
    raw_feature {
        feature_name: "price"
        expression: "item:price"
        boundaries: [1.1, 2.2, 3.6, 5.2, 7.39, 9.5, 10.5, 12.9, 15, 17.37, 19, 20, 23.8, 25.8, 28, 29.8, 31.5, 34, 36, 38, 39, 40, 45, 48, 49, 51.6, 55.2, 58, 59, 63.8, 68, 69, 72, 78, 79, 85, 88, 90, 97.5, 98, 99, 100, 108, 115, 118, 124, 128, 129, 138, 139, 148, 155, 158, 164, 168, 171.8, 179, 188, 195, 198, 199, 216, 228, 238, 248, 258, 268, 278, 288, 298, 299, 316, 330, 352, 368, 388, 398, 399, 439, 478, 499, 536, 580, 599, 660, 699, 780, 859, 970, 1080, 1280, 1480, 1776, 2188, 2798, 3680, 5160, 8720]
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        expression: "context:pid"
        hash_bucket_size: 20
        embedding_dim: 16
    }
}
model_config {
    feature_groups {
        group_name: "all"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
    }
    dbmtl {
        bottom_mlp {
            hidden_units: [512]
        }

        # expert_mlp {
        #     hidden_units: [512, 256, 128]
        # }
        # num_expert: 3

        task_towers {
            tower_name: "ctr"
            label_name: "clk"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {}
            }
            losses {
                binary_cross_entropy {}
            }
        }
        task_towers {
            tower_name: "cvr"
            label_name: "buy"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {
                    thresholds: 1000
                }
            }
            losses {
                binary_cross_entropy {}
            }
            relation_tower_names: "ctr"
            relation_mlp {
                hidden_units: [64]
            }
        }
    }
}
"""

#: TorchEasyRec's examples/wukong_criteo.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
#: Its dense_mlp ends at 128 while the embeddings are 16 wide, which TorchEasyRec's WuKong refuses at build.
WUKONG_CRITEO = """train_input_path: "odps://{PROJECT}/tables/criteo_terabyte_train_hashed_v1"
eval_input_path: "odps://{PROJECT}/tables/criteo_terabyte_val_test_hashed_v1"
model_dir: "experiments/wukong_criteo"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
}
eval_config {
    num_steps: 100
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "label"
    odps_data_quota_name: ""
    num_workers: 8
}
feature_configs {
    raw_feature {
        feature_name: "int_0"
        expression: "user:int_0"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_1"
        expression: "user:int_1"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_2"
        expression: "user:int_2"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_3"
        expression: "user:int_3"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_4"
        expression: "user:int_4"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_5"
        expression: "user:int_5"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_6"
        expression: "user:int_6"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_7"
        expression: "user:int_7"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_8"
        expression: "user:int_8"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_9"
        expression: "user:int_9"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_10"
        expression: "user:int_10"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_11"
        expression: "user:int_11"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_12"
        expression: "user:int_12"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_0"
        expression: "user:cat_0"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_1"
        expression: "user:cat_1"
        num_buckets: 39060
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_2"
        expression: "user:cat_2"
        num_buckets: 17295
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_3"
        expression: "user:cat_3"
        num_buckets: 7424
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_4"
        expression: "user:cat_4"
        num_buckets: 20265
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_5"
        expression: "user:cat_5"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_6"
        expression: "user:cat_6"
        num_buckets: 7122
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_7"
        expression: "user:cat_7"
        num_buckets: 1543
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_8"
        expression: "user:cat_8"
        num_buckets: 63
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_9"
        expression: "user:cat_9"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_10"
        expression: "user:cat_10"
        num_buckets: 3067956
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_11"
        expression: "user:cat_11"
        num_buckets: 405282
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_12"
        expression: "user:cat_12"
        num_buckets: 10
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_13"
        expression: "user:cat_13"
        num_buckets: 2209
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_14"
        expression: "user:cat_14"
        num_buckets: 11938
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_15"
        expression: "user:cat_15"
        num_buckets: 155
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_16"
        expression: "user:cat_16"
        num_buckets: 4
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_17"
        expression: "user:cat_17"
        num_buckets: 976
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_18"
        expression: "user:cat_18"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_19"
        expression: "user:cat_19"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_20"
        expression: "user:cat_20"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_21"
        expression: "user:cat_21"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_22"
        expression: "user:cat_22"
        num_buckets: 590152
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_23"
        expression: "user:cat_23"
        num_buckets: 12973
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_24"
        expression: "user:cat_24"
        num_buckets: 108
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_25"
        expression: "user:cat_25"
        num_buckets: 36
        embedding_dim: 16
    }
}
model_config {
    feature_groups {
        group_name: "dense"
        feature_names: "int_0"
        feature_names: "int_1"
        feature_names: "int_2"
        feature_names: "int_3"
        feature_names: "int_4"
        feature_names: "int_5"
        feature_names: "int_6"
        feature_names: "int_7"
        feature_names: "int_8"
        feature_names: "int_9"
        feature_names: "int_10"
        feature_names: "int_11"
        feature_names: "int_12"
        group_type: DEEP
    }
    feature_groups {
        group_name: "sparse"
        feature_names: "cat_0"
        feature_names: "cat_1"
        feature_names: "cat_2"
        feature_names: "cat_3"
        feature_names: "cat_4"
        feature_names: "cat_5"
        feature_names: "cat_6"
        feature_names: "cat_7"
        feature_names: "cat_8"
        feature_names: "cat_9"
        feature_names: "cat_10"
        feature_names: "cat_11"
        feature_names: "cat_12"
        feature_names: "cat_13"
        feature_names: "cat_14"
        feature_names: "cat_15"
        feature_names: "cat_16"
        feature_names: "cat_17"
        feature_names: "cat_18"
        feature_names: "cat_19"
        feature_names: "cat_20"
        feature_names: "cat_21"
        feature_names: "cat_22"
        feature_names: "cat_23"
        feature_names: "cat_24"
        feature_names: "cat_25"
        group_type: DEEP
    }
    wukong {
      dense_mlp {
        hidden_units: 512
        hidden_units: 256
        hidden_units: 128
      }
      wukong_layers {
        lcb_feature_num: 16
        fmb_feature_num: 16
        compressed_feature_num: 24
        feature_num_mlp {
          hidden_units: 512
        }
      }
      wukong_layers {
        lcb_feature_num: 16
        fmb_feature_num: 16
        compressed_feature_num: 24
        feature_num_mlp {
          hidden_units: 512
        }
      }
      final {
        hidden_units: 512
        hidden_units: 64
      }
    }
    num_class: 1
    metrics {
        auc {}
    }
    losses {
        binary_cross_entropy {}
    }
}
"""

#: TorchEasyRec's examples/pepnet_taobao.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
#: Its towers are per domain (``domain_input_name``, ``task_domain_num``), which tzrec-run's pepnet does not have.
PEPNET_TAOBAO = """train_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_v1_train"
eval_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_v1/ds=20170513"
model_dir: "experiments/pepnet_taobao"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
}
eval_config {
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    label_fields: "buy"
    label_fields: "occupation"
    num_workers: 8
}
feature_configs {
    id_feature {
        feature_name: "user_id"
        expression: "user:user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_segid"
        expression: "user:cms_segid"
        num_buckets: 98
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        expression: "user:cms_group_id"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        expression: "user:final_gender_code"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        expression: "user:age_level"
        num_buckets: 8
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        expression: "user:pvalue_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        expression: "user:shopping_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        expression: "user:occupation"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        expression: "user:new_user_class_level"
        num_buckets: 6
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        expression: "item:adgroup_id"
        num_buckets: 846812
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        expression: "item:cate_id"
        num_buckets: 12961
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        expression: "item:campaign_id"
        num_buckets: 423438
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        expression: "item:customer"
        num_buckets: 255877
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        expression: "item:brand"
        num_buckets: 461498
        embedding_dim: 16
    }
}
feature_configs {
    raw_feature {
        feature_name: "price"
        expression: "item:price"
        boundaries: [1.1, 2.2, 3.6, 5.2, 7.39, 9.5, 10.5, 12.9, 15, 17.37, 19, 20, 23.8, 25.8, 28, 29.8, 31.5, 34, 36, 38, 39, 40, 45, 48, 49, 51.6, 55.2, 58, 59, 63.8, 68, 69, 72, 78, 79, 85, 88, 90, 97.5, 98, 99, 100, 108, 115, 118, 124, 128, 129, 138, 139, 148, 155, 158, 164, 168, 171.8, 179, 188, 195, 198, 199, 216, 228, 238, 248, 258, 268, 278, 288, 298, 299, 316, 330, 352, 368, 388, 398, 399, 439, 478, 499, 536, 580, 599, 660, 699, 780, 859, 970, 1080, 1280, 1480, 1776, 2188, 2798, 3680, 5160, 8720]
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        expression: "context:pid"
        hash_bucket_size: 20
        embedding_dim: 16
    }
}
model_config {
    feature_groups {
        group_name: "all"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
    }
    feature_groups {
        group_name: "domain"
        feature_names: "occupation"
        group_type: DEEP
    }
    feature_groups {
        group_name: "uia"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "new_user_class_level"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
    }
    pepnet {
        domain_input_name: 'occupation'
        task_domain_num: 3
        ppnet_hidden_units: [512, 256]
        ppnet_dropout_ratio: [0.1, 0.1]
        task_towers {
            tower_name: "ctr"
            label_name: "clk"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {}
            }
            losses {
                binary_cross_entropy {}
            }
        }
        task_towers {
            tower_name: "cvr"
            label_name: "buy"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {
                    thresholds: 1000
                }
            }
            losses {
                binary_cross_entropy {}
            }
            task_space_indicator_label: "clk"
            in_task_space_weight: 1
            out_task_space_weight: 0
        }
    }
}
"""

#: TorchEasyRec's examples/dssm_v2_taobao.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
#: Its dssm_taobao.config with ``force_base_data_group: true`` and the ``dssm_v2`` model.
DSSM_V2_TAOBAO = r"""train_input_path: "odps://{PROJECT}/tables/taobao_multitask_pos_sample_v1_train"
eval_input_path: "odps://{PROJECT}/tables/taobao_multitask_pos_sample_v1/ds=20170513"
model_dir: "experiments/dssm_taobao"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 8
}
eval_config {
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    num_workers: 8
    force_base_data_group: true
    negative_sampler {
        input_path: "odps://{PROJECT}/tables/taobao_ad_feature_gl_v1"
        num_sample: 1024
        attr_fields: "adgroup_id"
        attr_fields: "cate_id"
        attr_fields: "campaign_id"
        attr_fields: "customer"
        attr_fields: "brand"
        attr_fields: "price"
        item_id_field: "adgroup_id"
        attr_delimiter: "\x02"
    }
}
feature_configs {
    id_feature {
        feature_name: "user_id"
        expression: "user:user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_segid"
        expression: "user:cms_segid"
        num_buckets: 98
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        expression: "user:cms_group_id"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        expression: "user:final_gender_code"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        expression: "user:age_level"
        num_buckets: 8
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        expression: "user:pvalue_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        expression: "user:shopping_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        expression: "user:occupation"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        expression: "user:new_user_class_level"
        num_buckets: 6
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        expression: "item:adgroup_id"
        num_buckets: 846812
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        expression: "item:cate_id"
        num_buckets: 12961
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        expression: "item:campaign_id"
        num_buckets: 423438
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        expression: "item:customer"
        num_buckets: 255877
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        expression: "item:brand"
        num_buckets: 461498
        embedding_dim: 16
    }
}
feature_configs {
    raw_feature {
        feature_name: "price"
        expression: "item:price"
        boundaries: [1.1, 2.2, 3.6, 5.2, 7.39, 9.5, 10.5, 12.9, 15, 17.37, 19, 20, 23.8, 25.8, 28, 29.8, 31.5, 34, 36, 38, 39, 40, 45, 48, 49, 51.6, 55.2, 58, 59, 63.8, 68, 69, 72, 78, 79, 85, 88, 90, 97.5, 98, 99, 100, 108, 115, 118, 124, 128, 129, 138, 139, 148, 155, 158, 164, 168, 171.8, 179, 188, 195, 198, 199, 216, 228, 238, 248, 258, 268, 278, 288, 298, 299, 316, 330, 352, 368, 388, 398, 399, 439, 478, 499, 536, 580, 599, 660, 699, 780, 859, 970, 1080, 1280, 1480, 1776, 2188, 2798, 3680, 5160, 8720]
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        expression: "context:pid"
        hash_bucket_size: 20
        embedding_dim: 16
    }
}
feature_configs {
    sequence_feature {
        sequence_name: "click_50_seq"
        sequence_length: 100
        sequence_delim: "|"
        features {
            id_feature {
                feature_name: "adgroup_id"
                expression: "item:adgroup_id"
                num_buckets: 846812
                embedding_dim: 16
            }
        }
        features {
            id_feature {
                feature_name: "cate_id"
                expression: "item:cate_id"
                num_buckets: 12961
                embedding_dim: 16
            }
        }
        features {
            id_feature {
                feature_name: "brand"
                expression: "item:brand"
                num_buckets: 461498
                embedding_dim: 16
            }
        }
    }
}
model_config {
    feature_groups {
        group_name: "user"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        sequence_groups {
            group_name: "click_50_seq"
            feature_names: "click_50_seq__adgroup_id"
            feature_names: "click_50_seq__cate_id"
            feature_names: "click_50_seq__brand"
        }
        sequence_encoders {
            pooling_encoder {
                input: "click_50_seq"
                pooling_type: "mean"
            }
        }
        group_type: DEEP
    }
    feature_groups {
        group_name: "item"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
    }
    dssm_v2 {
        user_tower {
            input: 'user'
            mlp {
                hidden_units: [512, 256, 128]
            }
        }
        item_tower {
            input: 'item'
            mlp {
                hidden_units: [512, 256, 128]
            }
        }
        output_dim: 64
    }
    metrics {
        recall_at_k {
            top_k: 1
        }
    }
    metrics {
        recall_at_k {
            top_k: 5
        }
    }
    losses {
        softmax_cross_entropy {}
    }
}
"""

#: TorchEasyRec's examples/rocket_launching_criteo.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
ROCKET_LAUNCHING_CRITEO = """train_input_path: "odps://{PROJECT}/tables/criteo_terabyte_train_hashed_v1"
eval_input_path: "odps://{PROJECT}/tables/criteo_terabyte_val_test_hashed_v1"
model_dir: "experiments/rocket_launch_criteo"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
}
eval_config {
    num_steps: 100
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    odps_data_quota_name: ""
    label_fields: "label"
    num_workers: 8
}
feature_configs {
    raw_feature {
        feature_name: "int_0"
        expression: "user:int_0"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_1"
        expression: "user:int_1"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_2"
        expression: "user:int_2"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_3"
        expression: "user:int_3"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_4"
        expression: "user:int_4"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_5"
        expression: "user:int_5"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_6"
        expression: "user:int_6"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_7"
        expression: "user:int_7"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_8"
        expression: "user:int_8"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_9"
        expression: "user:int_9"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_10"
        expression: "user:int_10"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_11"
        expression: "user:int_11"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    raw_feature {
        feature_name: "int_12"
        expression: "user:int_12"
        normalizer: "method=expression,expr=log(x+3)"
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_0"
        expression: "user:cat_0"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_1"
        expression: "user:cat_1"
        num_buckets: 39060
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_2"
        expression: "user:cat_2"
        num_buckets: 17295
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_3"
        expression: "user:cat_3"
        num_buckets: 7424
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_4"
        expression: "user:cat_4"
        num_buckets: 20265
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_5"
        expression: "user:cat_5"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_6"
        expression: "user:cat_6"
        num_buckets: 7122
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_7"
        expression: "user:cat_7"
        num_buckets: 1543
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_8"
        expression: "user:cat_8"
        num_buckets: 63
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_9"
        expression: "user:cat_9"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_10"
        expression: "user:cat_10"
        num_buckets: 3067956
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_11"
        expression: "user:cat_11"
        num_buckets: 405282
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_12"
        expression: "user:cat_12"
        num_buckets: 10
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_13"
        expression: "user:cat_13"
        num_buckets: 2209
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_14"
        expression: "user:cat_14"
        num_buckets: 11938
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_15"
        expression: "user:cat_15"
        num_buckets: 155
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_16"
        expression: "user:cat_16"
        num_buckets: 4
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_17"
        expression: "user:cat_17"
        num_buckets: 976
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_18"
        expression: "user:cat_18"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_19"
        expression: "user:cat_19"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_20"
        expression: "user:cat_20"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_21"
        expression: "user:cat_21"
        num_buckets: 40000000
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_22"
        expression: "user:cat_22"
        num_buckets: 590152
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_23"
        expression: "user:cat_23"
        num_buckets: 12973
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_24"
        expression: "user:cat_24"
        num_buckets: 108
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cat_25"
        expression: "user:cat_25"
        num_buckets: 36
        embedding_dim: 16
    }
}
model_config {
    feature_groups {
        group_name: "deep"
        feature_names: "int_0"
        feature_names: "int_1"
        feature_names: "int_2"
        feature_names: "int_3"
        feature_names: "int_4"
        feature_names: "int_5"
        feature_names: "int_6"
        feature_names: "int_7"
        feature_names: "int_8"
        feature_names: "int_9"
        feature_names: "int_10"
        feature_names: "int_11"
        feature_names: "int_12"
        feature_names: "cat_0"
        feature_names: "cat_1"
        feature_names: "cat_2"
        feature_names: "cat_3"
        feature_names: "cat_4"
        feature_names: "cat_5"
        feature_names: "cat_6"
        feature_names: "cat_7"
        feature_names: "cat_8"
        feature_names: "cat_9"
        feature_names: "cat_10"
        feature_names: "cat_11"
        feature_names: "cat_12"
        feature_names: "cat_13"
        feature_names: "cat_14"
        feature_names: "cat_15"
        feature_names: "cat_16"
        feature_names: "cat_17"
        feature_names: "cat_18"
        feature_names: "cat_19"
        feature_names: "cat_20"
        feature_names: "cat_21"
        feature_names: "cat_22"
        feature_names: "cat_23"
        feature_names: "cat_24"
        feature_names: "cat_25"
        group_type: DEEP
    }
    rocket_launching {
        booster_mlp {
            hidden_units: [256, 128, 64, 32]
        }
        light_mlp {
            hidden_units: [96, 64, 32]
        }
        feature_based_distillation: true
    }
    num_class: 2
    metrics {
        auc {}
    }
    losses {
        softmax_cross_entropy {}
    }
}
"""

#: TorchEasyRec's examples/mind_taobao.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
MIND_TAOBAO = r"""train_input_path: "odps://{PROJECT}/tables/taobao_multitask_pos_sample_v1_train"
eval_input_path: "odps://{PROJECT}/tables/taobao_multitask_pos_sample_v1/ds=20170513"
model_dir: "experiments/dssm_taobao"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 2
}
eval_config {
}
data_config {
    batch_size: 2048
    dataset_type: OdpsDataset
    fg_mode: FG_DAG
    label_fields: "clk"
    num_workers: 8
    negative_sampler {
        input_path: "odps://{PROJECT}/tables/taobao_ad_feature_gl_v1"
        num_sample: 1024
        num_eval_sample: 1024
        attr_fields: "adgroup_id"
        attr_fields: "cate_id"
        attr_fields: "campaign_id"
        attr_fields: "customer"
        attr_fields: "brand"
        attr_fields: "price"
        item_id_field: "adgroup_id"
        attr_delimiter: "\x02"
    }
}
feature_configs {
    id_feature {
        feature_name: "user_id"
        expression: "user:user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
     id_feature {
         feature_name: "cms_segid"
         expression: "user:cms_segid"
         num_buckets: 98
         embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        expression: "user:cms_group_id"
        num_buckets: 14
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        expression: "user:final_gender_code"
        num_buckets: 3
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        expression: "user:age_level"
        num_buckets: 8
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        expression: "user:pvalue_level"
        num_buckets: 5
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        expression: "user:shopping_level"
        num_buckets: 5
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        expression: "user:occupation"
        num_buckets: 3
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        expression: "user:new_user_class_level"
        num_buckets: 6
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        expression: "item:adgroup_id"
        num_buckets: 846812
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        expression: "item:cate_id"
        num_buckets: 12961
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        expression: "item:campaign_id"
        num_buckets: 423438
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        expression: "item:customer"
        num_buckets: 255877
        embedding_dim: 8
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        expression: "item:brand"
        num_buckets: 461498
        embedding_dim: 8
    }
}
feature_configs {
    raw_feature {
        feature_name: "price"
        expression: "item:price"
        boundaries: [1.1, 2.2, 3.6, 5.2, 7.39, 9.5, 10.5, 12.9, 15, 17.37, 19, 20, 23.8, 25.8, 28, 29.8, 31.5, 34, 36, 38, 39, 40, 45, 48, 49, 51.6, 55.2, 58, 59, 63.8, 68, 69, 72, 78, 79, 85, 88, 90, 97.5, 98, 99, 100, 108, 115, 118, 124, 128, 129, 138, 139, 148, 155, 158, 164, 168, 171.8, 179, 188, 195, 198, 199, 216, 228, 238, 248, 258, 268, 278, 288, 298, 299, 316, 330, 352, 368, 388, 398, 399, 439, 478, 499, 536, 580, 599, 660, 699, 780, 859, 970, 1080, 1280, 1480, 1776, 2188, 2798, 3680, 5160, 8720]
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        expression: "context:pid"
        hash_bucket_size: 20
        embedding_dim: 16
    }
}



feature_configs {
    sequence_id_feature {
        feature_name: "click_50_seq__adgroup_id"
        sequence_length: 50
        sequence_delim: "|"
        expression: "user:click_50_seq__adgroup_id"
        embedding_dim: 16
        num_buckets: 846812
    }
}
feature_configs {
    sequence_id_feature {
        feature_name: "click_50_seq__cate_id"
        sequence_length: 50
        sequence_delim: "|"
        expression: "user:click_50_seq__cate_id"
        embedding_dim: 8
        num_buckets: 12961
    }
}

feature_configs {
    sequence_id_feature {
        feature_name: "click_50_seq__brand"
        sequence_length: 50
        sequence_delim: "|"
        expression: "user:click_50_seq__brand"
        embedding_dim: 8
        num_buckets: 461498
    }
}

model_config {
    feature_groups {
        group_name: "user"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        group_type: DEEP
    }
    feature_groups {
        group_name: "item"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
    }
    feature_groups {
        group_name: "hist"
        feature_names: "click_50_seq__adgroup_id"
        feature_names: "click_50_seq__cate_id"
        feature_names: "click_50_seq__brand"
        group_type: SEQUENCE
    }
    mind{
        user_tower{
            input: 'user'
            history_input: 'hist'
            user_mlp {
                hidden_units: [256, 128]
                dropout_ratio: 0.2
            }
            hist_seq_mlp {
                hidden_units: [256, 128]
                bias: false
                dropout_ratio: 0.2
            }
            capsule_config {
                max_k: 8
                num_iters: 3
                max_seq_len: 50
                high_dim: 64
                squash_pow: 0.2
                const_caps_num: false
                routing_logits_stddev: 1
                routing_logits_scale: 20
            }
            concat_mlp {
                hidden_units: [256, 128]
                bias: false
                dropout_ratio: 0.2
            }
        }
        item_tower{
            input: 'item'
            mlp {
                hidden_units: [256, 128]
                dropout_ratio: 0.2
            }
        }

        output_dim: 32
        simi_pow: 20
        in_batch_negative: false
        similarity: COSINE
        temperature: 0.01

    }
    metrics {
        recall_at_k {
            top_k: 1
        }
    }
    metrics {
        recall_at_k {
            top_k: 5
        }
    }
    losses {
        softmax_cross_entropy {}
    }
}
"""

#: TorchEasyRec's examples/dbmtl_taobao_seq.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
DBMTL_TAOBAO_SEQ = """train_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_bucketized_train"
eval_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_bucketized_v1/ds=20170513"
model_dir: "experiments/taobao/dbmtl_seq"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
}
eval_config {
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_NONE
    label_fields: "clk"
    label_fields: "buy"
    num_workers: 8
}
feature_configs {
    id_feature {
        feature_name: "user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_segid"
        num_buckets: 98
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        num_buckets: 8
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        num_buckets: 6
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        num_buckets: 846812
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        num_buckets: 12961
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        num_buckets: 423438
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        num_buckets: 255877
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        num_buckets: 461498
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "price"
        num_buckets: 101
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        num_buckets: 2
        embedding_dim: 16
    }
}
feature_configs {
    sequence_feature {
        sequence_name: "click_50_seq",
        sequence_length: 100
        sequence_delim: "|"
        features {
            id_feature {
                feature_name: "adgroup_id"
                num_buckets: 846812
                embedding_dim: 16
            }
        }
        features {
            id_feature {
                feature_name: "cate_id"
                num_buckets: 12961
                embedding_dim: 16
            }
        }
        features {
            id_feature {
                feature_name: "brand"
                num_buckets: 461498
                embedding_dim: 16
            }
        }
    }
}
model_config {
    feature_groups {
        group_name: "all"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
        sequence_groups {
            group_name: "click_50_seq"
            feature_names: "adgroup_id"
            feature_names: "cate_id"
            feature_names: "brand"
            feature_names: "click_50_seq__adgroup_id"
            feature_names: "click_50_seq__cate_id"
            feature_names: "click_50_seq__brand"
        }
        sequence_encoders {
            din_encoder {
                attn_mlp {
                    hidden_units: [32, 8]
                }
            }
        }
        # sequence_encoders {
        #     simple_attention {
        #     }
        # }
    }
    dbmtl {
        bottom_mlp {
            hidden_units: [512]
        }

        # expert_mlp {
        #     hidden_units: [512, 256, 128]
        # }
        # num_expert: 3

        task_towers {
            tower_name: "ctr"
            label_name: "clk"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {}
            }
            losses {
                binary_cross_entropy {}
            }
        }
        task_towers {
            tower_name: "cvr"
            label_name: "buy"
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {
                    thresholds: 10000
                }
            }
            losses {
                binary_cross_entropy {}
            }
            relation_tower_names: "ctr"
            relation_mlp {
                hidden_units: [64]
            }
        }
    }

}
"""

#: TorchEasyRec's examples/dbmtl_taobao_jrc.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
DBMTL_TAOBAO_JRC = """train_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_bucketized_train_jrc"
eval_input_path: "odps://{PROJECT}/tables/taobao_multitask_sample_bucketized_v1/ds=20170513"
model_dir: "experiments/taobao/dbmtl_jrc"
train_config {
    sparse_optimizer {
        adagrad_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 1
}
eval_config {
}
data_config {
    batch_size: 8192
    dataset_type: OdpsDataset
    fg_mode: FG_NONE
    label_fields: "clk"
    label_fields: "buy"
    num_workers: 8
}
feature_configs {
    id_feature {
        feature_name: "user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_segid"
        num_buckets: 98
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        num_buckets: 8
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        num_buckets: 6
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        num_buckets: 846812
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        num_buckets: 12961
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        num_buckets: 423438
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        num_buckets: 255877
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        num_buckets: 461498
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "price"
        num_buckets: 101
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        num_buckets: 2
        embedding_dim: 16
    }
}
model_config {
    feature_groups {
        group_name: "all"
        feature_names: "user_id"
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        feature_names: "adgroup_id"
        feature_names: "cate_id"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "brand"
        feature_names: "price"
        group_type: DEEP
    }
    dbmtl {
        bottom_mlp {
            hidden_units: [512]
        }
        task_towers {
            tower_name: "ctr"
            label_name: "clk"
            num_class: 2
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {}
            }
            losses {
                jrc_loss {
                    session_name: "user_id"
                }
            }
        }
        task_towers {
            tower_name: "cvr"
            label_name: "buy"
            num_class: 2
            mlp {
                hidden_units: [256, 128, 64]
            }
            metrics {
                auc {
                    thresholds: 10000
                }
            }
            losses {
                jrc_loss {
                    session_name: "user_id"
                }
            }
            relation_tower_names: "ctr"
            relation_mlp {
                hidden_units: [64]
            }
        }
    }

}
"""

#: TorchEasyRec's examples/tdm_taobao.config, copied verbatim (Apache-2.0, Alibaba Group; commit 54cac31).
TDM_TAOBAO = """train_input_path:"data/taobao_data_recall_train_transformed/*.parquet"
eval_input_path:"data/taobao_data_recall_eval_transformed/*.parquet"
model_dir:"experiments/tdm_taobao"
train_config {
    sparse_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    dense_optimizer {
        adam_optimizer {
            lr: 0.001
        }
        constant_learning_rate {
        }
    }
    num_epochs: 2
    log_step_count_steps: 1
    save_checkpoints_steps: 100000
}
eval_config {
}
data_config {
    batch_size: 32
    dataset_type: ParquetDataset
    fg_mode: FG_NONE
    label_fields: "clk"
    num_workers: 10
    tdm_sampler {
        item_input_path: 'data/init_tree/node_table.txt'
        edge_input_path: 'data/init_tree/edge_table.txt'
        predict_edge_input_path: 'data/init_tree/predict_edge_table.txt'
        attr_fields: "cate_id"
        attr_fields: "campaign_id"
        attr_fields: "customer"
        attr_fields: "brand"
        attr_fields: "price"
        item_id_field: "adgroup_id"
        layer_num_sample: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 17, 23, 30, 34, 82, 200]
        attr_delimiter : ','
    }

}
feature_configs {
    id_feature {
        feature_name: "user_id"
        expression: "user:user_id"
        num_buckets: 1141730
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_segid"
        expression: "user:cms_segid"
        num_buckets: 98
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "cms_group_id"
        expression: "user:cms_group_id"
        num_buckets: 14
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "final_gender_code"
        expression: "user:final_gender_code"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "age_level"
        expression: "user:age_level"
        num_buckets: 8
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pvalue_level"
        expression: "user:pvalue_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "shopping_level"
        expression: "user:shopping_level"
        num_buckets: 5
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "occupation"
        expression: "user:occupation"
        num_buckets: 3
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "new_user_class_level"
        expression: "user:new_user_class_level"
        num_buckets: 6
        embedding_dim: 16
    }
}
feature_configs {
    sequence_id_feature {
        feature_name: 'click_50_seq__adgroup_id'
        sequence_length: 50
        sequence_delim: ';'
        expression: 'user:click_50_seq__adgroup_id'
        embedding_dim: 16
        num_buckets: 1895387
        embedding_name: 'item_emb'
    }
}
feature_configs {
    sequence_id_feature {
        feature_name: 'click_50_seq__cate_id'
        sequence_length: 50
        sequence_delim: ';'
        expression: 'user:click_50_seq__cate_id'
        embedding_dim: 16
        num_buckets: 12961
        embedding_name: 'cate_emb'
    }
}
feature_configs {
    sequence_id_feature {
        feature_name: 'click_50_seq__brand'
        sequence_length: 50
        sequence_delim: ';'
        expression: 'user:click_50_seq__brand'
        embedding_dim: 16
        num_buckets: 461498
        embedding_name: 'brand_emb'
    }
}
feature_configs {
    id_feature {
        feature_name: "adgroup_id"
        expression: "item:adgroup_id"
        num_buckets: 1895387
        embedding_dim: 16
        embedding_name: 'item_emb'
    }
}
feature_configs {
    id_feature {
        feature_name: "cate_id"
        expression: "item:cate_id"
        num_buckets: 12961
        embedding_dim: 16
        embedding_name: 'cate_emb'
    }
}
feature_configs {
    id_feature {
        feature_name: "campaign_id"
        expression: "item:campaign_id"
        num_buckets: 423438
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "customer"
        expression: "item:customer"
        num_buckets: 255877
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "brand"
        expression: "item:brand"
        num_buckets: 461498
        embedding_dim: 16
        embedding_name: 'brand_emb'
    }
}
feature_configs {
    id_feature {
        feature_name: "price"
        expression: "item:price"
        num_buckets: 100
        embedding_dim: 16
    }
}
feature_configs {
    id_feature {
        feature_name: "pid"
        expression: "context:pid"
        hash_bucket_size: 20
        embedding_dim: 16
    }
}
model_config {
    feature_groups {
        group_name: 'seq'
        feature_names: 'click_50_seq__adgroup_id'
        feature_names: 'click_50_seq__cate_id'
        feature_names: 'click_50_seq__brand'
        feature_names: 'adgroup_id'
        feature_names: 'cate_id'
        feature_names: 'brand'
        group_type : SEQUENCE
    }
    feature_groups {
        group_name: 'user'
        feature_names: 'user_id'
        feature_names: "cms_segid"
        feature_names: "cms_group_id"
        feature_names: "final_gender_code"
        feature_names: "age_level"
        feature_names: "pvalue_level"
        feature_names: "shopping_level"
        feature_names: "occupation"
        feature_names: "new_user_class_level"
        feature_names: "pid"
        group_type: DEEP
    }
    feature_groups {
        group_name: "item"
        feature_names: "campaign_id"
        feature_names: "customer"
        feature_names: "price"
        group_type: DEEP
    }
    tdm {
        multiwindow_din {
            windows_len: [1,1,1,2,2,2,5,6,10,20]
            attn_mlp {
                hidden_units: [36]
                activation: 'nn.PReLU'
            }
        }
        final {
            hidden_units: [256, 128, 64, 32]
            use_bn: True
        }
    }

    num_class: 2
    metrics{
        auc {}
    }
    losses{
        softmax_cross_entropy{}
    }
}
"""

#: name -> config text, as TorchEasyRec names the example.
EXAMPLES = {"deepfm_criteo": DEEPFM_CRITEO, "dlrm_criteo": DLRM_CRITEO, "mmoe_taobao": MMOE_TAOBAO,
            "dssm_taobao": DSSM_TAOBAO, "multi_tower_din_taobao": MULTI_TOWER_DIN_TAOBAO,
            "multi_tower_taobao": MULTI_TOWER_TAOBAO, "dcn_v2_criteo": DCN_V2_CRITEO,
            "masknet_criteo": MASKNET_CRITEO, "ple_taobao": PLE_TAOBAO, "dbmtl_taobao": DBMTL_TAOBAO,
            "wukong_criteo": WUKONG_CRITEO, "pepnet_taobao": PEPNET_TAOBAO,
            "dssm_v2_taobao": DSSM_V2_TAOBAO, "rocket_launching_criteo": ROCKET_LAUNCHING_CRITEO,
            "mind_taobao": MIND_TAOBAO, "dbmtl_taobao_seq": DBMTL_TAOBAO_SEQ, "dbmtl_taobao_jrc": DBMTL_TAOBAO_JRC,
            "tdm_taobao": TDM_TAOBAO}
