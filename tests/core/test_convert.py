"""``tzrec-run convert``: the schema-less protobuf text parser, the mapping of every TorchEasyRec
optimizer, schedule, metric, loss and train_config field, what is reported as not converted, and
that TorchEasyRec's examples (small copies written by tests/core/torcheasyrec_examples.py) convert
into files that pass ``tzrec-run check`` unedited. Features and models: test_convert_features.py."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, cli
from tests.core.torcheasyrec_examples import DEEPFM_CRITEO, EXAMPLES
from tzrun.cli.main import main
from tzrun.errors import EXIT_CONFIG
from tzrun_tools.convert import Identifier, ProtoTextError, convert_pipeline_config, parse_text_proto
from tzrun.runner.records import emit_toml
from tzrun.testing import load_config_text


def pipeline(train: str = "", model: str = "", data: str = "", extra: str = "") -> str:
    """A small valid pipeline config; ``train`` and ``model`` add fields to their messages."""
    return f"""
        model_dir: "runs/x"
        train_config {{
            sparse_optimizer {{ sgd_optimizer {{ lr: 0.1 }} }}
            dense_optimizer {{ adam_optimizer {{ lr: 0.01 }} }}
            num_epochs: 1
            {train}
        }}
        data_config {{ dataset_type: ParquetDataset label_fields: "label" {data} }}
        model_config {{ deepfm {{}} {model} }}
        {extra}
    """


def convert(text: str):  # noqa: ANN201
    return convert_pipeline_config(text, "test.config")


def not_converted(conversion: Any) -> dict[str, str]:
    return {f.path: f.message for f in conversion.not_converted}


def notes(conversion: Any) -> dict[str, str]:
    return {f.path: f.message for f in conversion.notes}


def merged_onto(tree: dict[str, Any], example: str) -> dict[str, Any]:
    """The docs' convention: tables merge key by key; any other value replaces the base's."""
    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(base)
        for key, value in over.items():
            both = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merge(out[key], value) if both else copy.deepcopy(value)
        return out

    base = tomllib.loads((REPO / "examples" / example).read_text())
    if "num_steps" in tree.get("train", {}):
        del base["train"]["num_epochs"]
    return merge(base, tree)


def toml_text(tree: dict[str, Any]) -> str:
    lines: list[str] = []
    emit_toml(lines, tree, "", "", {})
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# the parser


def test_parser_reads_nested_messages_repeated_fields_and_both_delimiters():
    parsed = parse_text_proto("""
        a { b: 1 c < d: "x" > }
        a: { b: 2; }
        e: ENUM_VALUE, f: true
        g [ {h: 1}, {h: 2} ]
    """)
    assert parsed == {
        "a": [{"b": [1], "c": [{"d": ["x"]}]}, {"b": [2]}],
        "e": ["ENUM_VALUE"], "f": ["true"],
        "g": [{"h": [1]}, {"h": [2]}],
    }
    assert isinstance(parsed["e"][0], Identifier) and not isinstance(parsed["a"][0]["c"][0]["d"][0], Identifier)


def test_parser_reads_list_syntax_into_the_same_list_as_repeated_fields():
    parsed = parse_text_proto("x: 1 x: [2, 3] x: [] y: [-1.5, 1e3, .5, 0x1F, 017, 2.5f, -inf, nan]")
    assert parsed["x"] == [1, 2, 3]
    y = parsed["y"]
    assert y[:6] == [-1.5, 1000.0, 0.5, 31, 15, 2.5] and [type(v) for v in y[:6]] == [float, float, float, int, int, float]
    assert y[6] == -math.inf and y[7] == "nan"


def test_parser_skips_comments_and_decodes_strings():
    parsed = parse_text_proto(r"""
        # a comment line
        s: "tab\there" 'single "quoted"'   # adjacent literals concatenate
        t: "\x02\101\u00e9\'\"\\\n"
        u: "has # no comment"
    """)
    assert parsed == {"s": ['tab\theresingle "quoted"'], "t": ["\x02A\u00e9'\"\\\n"], "u": ["has # no comment"]}


@pytest.mark.parametrize(("text", "line", "column", "message"), [
    ("a {\n  b: 1\n", 3, 1, "expected '}' to close the message opened at line 1, column 3"),
    ("a: 1\nb 2", 2, 3, "expected ':' or '{' after the field name 'b'"),
    ("a: [1, 2\nb: 3", 2, 1, "expected ',' or ']' in a list"),
    ('a: "abc\nb: 1', 1, 4, "unterminated string"),
    ('a: "\\q"', 1, 5, "unknown escape '\\q'"),
    ("a: 1\n  b: @", 2, 6, "unexpected character '@'"),
    ("a: }", 1, 4, "expected a value, got '}'"),
    ("a: 12ab", 1, 4, "invalid number"),
    ("}", 1, 1, "expected a field name, got '}'"),
])
def test_parse_errors_name_the_file_line_and_column(text, line, column, message):
    with pytest.raises(ProtoTextError) as caught:
        parse_text_proto(text, "pipeline.config")
    assert (caught.value.line, caught.value.column) == (line, column)
    assert str(caught.value).startswith(f"pipeline.config:{line}:{column}: ")
    assert message in str(caught.value)


# ----------------------------------------------------------------------------------------------
# optimizers and schedules


@pytest.mark.parametrize(("proto", "expected"), [
    ("sgd_optimizer { lr: 0.1 gradient_clipping: true max_gradient: 2 }",
     {"type": "sgd", "lr": 0.1, "gradient_clipping": True, "max_gradient": 2.0}),
    ("adagrad_optimizer { lr: 0.01 initial_accumulator_value: 0.1 }",
     {"type": "adagrad", "lr": 0.01, "initial_accumulator_value": 0.1}),
    ("adam_optimizer { lr: 0.001 beta1: 0.8 beta2: 0.99 weight_decay: 0.01 }",
     {"type": "adam", "lr": 0.001, "beta1": 0.8, "beta2": 0.99, "weight_decay": 0.01}),
    ("lars_sgd_optimizer { lr: 0.1 momentum: 0.5 weight_decay: 0.001 }",
     {"type": "lars_sgd", "lr": 0.1, "momentum": 0.5, "weight_decay": 0.001}),
    ("lamb_optimizer { lr: 0.1 beta1: 0.5 }", {"type": "lamb", "lr": 0.1, "beta1": 0.5}),
    ("partial_rowwise_lamb_optimizer { lr: 0.1 beta2: 0.9 }", {"type": "partial_rowwise_lamb", "lr": 0.1, "beta2": 0.9}),
    ("partial_rowwise_adam_optimizer { lr: 0.1 weight_decay: 0.1 }",
     {"type": "partial_rowwise_adam", "lr": 0.1, "weight_decay": 0.1}),
    ("rowwise_adagrad_optimizer { lr: 0.05 }", {"type": "rowwise_adagrad", "lr": 0.05}),
    ("rowwise_adagrad_optimizer { lr: 0.05 weight_decay: 0.01 weight_decay_mode: L2 }",
     {"type": "rowwise_adagrad", "lr": 0.05, "weight_decay": 0.01, "weight_decay_mode": "l2"}),
    ("rowwise_adagrad_optimizer { lr: 0.05 weight_decay: 0.01 weight_decay_mode: DECOUPLE }",
     {"type": "rowwise_adagrad", "lr": 0.05, "weight_decay": 0.01, "weight_decay_mode": "decoupled"}),
    ("sgd_optimizer {}", {"type": "sgd", "lr": 0.002}),
])
def test_each_sparse_optimizer(proto, expected, tzrun_pm):
    text = pipeline().replace("sparse_optimizer { sgd_optimizer { lr: 0.1 } }", f"sparse_optimizer {{ {proto} }}")
    conversion = convert(text)
    assert conversion.tree["train"]["sparse_optimizer"] == expected
    assert not_converted(conversion) == {}
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


def test_sparse_optimizer_notes_defaults_gpu_kernels_and_ignored_weight_decay():
    lr = convert(pipeline().replace("sgd_optimizer { lr: 0.1 }", "sgd_optimizer {}"))
    assert "TorchEasyRec's default 0.002" in notes(lr)["train_config.sparse_optimizer.sgd_optimizer.lr"]
    adam = convert(pipeline().replace("sgd_optimizer { lr: 0.1 }", "adam_optimizer { lr: 0.1 }"))
    assert 'cpu_policy = "data_parallel"' in notes(adam)["train_config.sparse_optimizer.adam_optimizer"]
    none = convert(pipeline().replace("sgd_optimizer { lr: 0.1 }", "rowwise_adagrad_optimizer { lr: 0.1 weight_decay: 0.5 }"))
    assert none.tree["train"]["sparse_optimizer"] == {"type": "rowwise_adagrad", "lr": 0.1}
    assert "weight_decay_mode NONE" in notes(none)["train_config.sparse_optimizer.rowwise_adagrad_optimizer.weight_decay"]


@pytest.mark.parametrize("name", ["adadelta_optimizer", "rmsprop_optimizer"])
def test_sparse_optimizers_without_a_fused_kernel_are_reported(name):
    conversion = convert(pipeline().replace("sgd_optimizer { lr: 0.1 }", f"{name} {{ lr: 0.1 }}"))
    assert "sparse_optimizer" not in conversion.tree["train"]
    assert "no fused" in not_converted(conversion)[f"train_config.sparse_optimizer.{name}"]


@pytest.mark.parametrize(("proto", "expected"), [
    ("sgd_optimizer { lr: 0.1 }", {"type": "sgd", "lr": 0.1, "momentum": 0.9}),
    ("sgd_optimizer { lr: 0.1 momentum: 0 weight_decay: 0.1 dampening: 0.1 nesterov: false fused: true }",
     {"type": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.1, "dampening": 0.1, "nesterov": False, "fused": True}),
    ("adagrad_optimizer { lr: 0.1 weight_decay: 0.1 initial_accumulator_value: 0.1 eps: 1e-8 }",
     {"type": "adagrad", "lr": 0.1, "weight_decay": 0.1, "eps": 1e-8, "initial_accumulator_value": 0.1}),
    ("adam_optimizer { lr: 0.1 beta1: 0.8 beta2: 0.9 eps: 1e-6 amsgrad: true }",
     {"type": "adam", "lr": 0.1, "beta1": 0.8, "beta2": 0.9, "eps": 1e-6, "amsgrad": True}),
    ("adamw_optimizer { lr: 0.1 }", {"type": "adamw", "lr": 0.1, "weight_decay": 0.0}),
    ("adamw_optimizer { lr: 0.1 weight_decay: 0.05 }", {"type": "adamw", "lr": 0.1, "weight_decay": 0.05}),
    ("adadelta_optimizer { lr: 1 }", {"type": "adadelta", "lr": 1.0, "rho": 0.95}),
    ("rmsprop_optimizer { lr: 0.01 alpha: 0.9 eps: 1e-7 weight_decay: 0.1 }",
     {"type": "rmsprop", "lr": 0.01, "alpha": 0.9, "eps": 1e-7, "weight_decay": 0.1}),
])
def test_each_dense_optimizer_with_torcheasyrec_defaults_written_out(proto, expected, tzrun_pm):
    conversion = convert(pipeline().replace("adam_optimizer { lr: 0.01 }", proto))
    assert conversion.tree["train"]["dense_optimizer"] == expected
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


@pytest.mark.parametrize(("proto", "expected"), [
    ("constant_learning_rate {}", None),
    ("exponential_decay_learning_rate { decay_size: 100 decay_factor: 0.5 staircase: false warmup_learning_rate: 0.001 "
     "warmup_size: 10 min_learning_rate: 0.0001 by_epoch: true }",
     {"type": "exponential_decay", "decay_size": 100, "decay_factor": 0.5, "staircase": False,
      "warmup_learning_rate": 0.001, "warmup_size": 10, "min_learning_rate": 0.0001, "by_epoch": True}),
    ("manual_step_learning_rate { schedule_sizes: [100, 200] learning_rates: [0.01, 0.001] by_epoch: false }",
     {"type": "manual_step", "by_epoch": False, "schedule_sizes": [101, 201], "learning_rates": [0.01, 0.001]}),
    ("manual_step_learning_rate { schedule_sizes: 100 schedule_sizes: 200 learning_rates: [0.01, 0.001] warmup: true }",
     {"type": "manual_step", "warmup": True, "schedule_sizes": [100, 201], "learning_rates": [0.01, 0.001]}),
    ("cosine_annealing_learning_rate { T_max: 1000 min_learning_rate: 0.0001 warmup_size: 5 }",
     {"type": "cosine_annealing", "T_max": 1000, "min_learning_rate": 0.0001, "warmup_size": 5}),
    ("cosine_annealing_warm_restarts_learning_rate { T_0: 100 T_mult: 2 warmup_learning_rate: 0.01 warmup_size: 3 }",
     {"type": "cosine_annealing_warm_restarts", "T_0": 100, "T_mult": 2, "warmup_learning_rate": 0.01, "warmup_size": 3}),
])
def test_each_schedule_on_both_optimizers(proto, expected, tzrun_pm):
    text = pipeline().replace("sgd_optimizer { lr: 0.1 }", f"sgd_optimizer {{ lr: 0.1 }} {proto}")
    text = text.replace("adam_optimizer { lr: 0.01 }", f"adam_optimizer {{ lr: 0.01 }} {proto}")
    conversion = convert(text)
    for name in ("sparse_optimizer", "dense_optimizer"):
        assert conversion.tree["train"][name].get("lr_schedule") == expected
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


def test_manual_step_shift_is_noted_and_a_zero_decay_size_is_reported():
    text = pipeline().replace("sgd_optimizer { lr: 0.1 }", "sgd_optimizer { lr: 0.1 } manual_step_learning_rate { "
                              "schedule_sizes: [10] learning_rates: [0.01] }")
    text = text.replace("adam_optimizer { lr: 0.01 }", "adam_optimizer { lr: 0.01 } exponential_decay_learning_rate {}")
    conversion = convert(text)
    assert "[10] written as [11]" in notes(conversion)["train_config.sparse_optimizer.manual_step_learning_rate.schedule_sizes"]
    assert "lr_schedule" not in conversion.tree["train"]["dense_optimizer"]
    assert "ZeroDivisionError" in not_converted(conversion)[
        "train_config.dense_optimizer.exponential_decay_learning_rate.decay_size"]


def test_part_optimizers_ema_and_eval_ema(tzrun_pm):
    dense = r"""adam_optimizer { lr: 0.01 }
        cosine_annealing_learning_rate { T_max: 100 }
        part_optimizers { regex_pattern: "final\\..*" sgd_optimizer { lr: 0.1 momentum: 0.5 }
                          manual_step_learning_rate { schedule_sizes: 5 learning_rates: 0.01 } }
        param_optimizers { regex_pattern: "deep\\..*" adagrad_optimizer { lr: 0.2 }
                           param_learning_rate { constant_learning_rate {} } }
        ema { decay: 0.99 }"""
    text = pipeline(extra="eval_config { use_dense_ema: false }").replace("adam_optimizer { lr: 0.01 }", dense)
    conversion = convert(text)
    assert conversion.tree["train"]["dense_optimizer"] == {
        "type": "adam", "lr": 0.01, "lr_schedule": {"type": "cosine_annealing", "T_max": 100},
        "parts": [
            {"pattern": "final\\..*", "type": "sgd", "lr": 0.1, "momentum": 0.5,
             "lr_schedule": {"type": "manual_step", "schedule_sizes": [6], "learning_rates": [0.01]}},
            {"pattern": "deep\\..*", "type": "adagrad", "lr": 0.2},
        ],
        "ema": {"decay": 0.99, "use_for_eval": False},
    }
    assert "first wins" in notes(conversion)["train_config.dense_optimizer.part_optimizers[0].regex_pattern"]
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


# ----------------------------------------------------------------------------------------------
# train_config, eval_config, data_config, export_config


def test_train_config_fields(tzrun_pm):
    train = """num_steps: 500 save_checkpoints_steps: 100 keep_checkpoint_max: 2 log_step_count_steps: 10
        cudnn_allow_tf32: false cuda_matmul_allow_tf32: true mixed_precision: "FP16"
        grad_scaler { init_scale: 1024 growth_factor: 4 backoff_factor: 0.25 growth_interval: 50 }
        gradient_accumulation_steps: 4
        grad_clipping { clipping_type: "Value" max_gradient: 3 }
        global_embedding_constraints { sharding_types: ["row_wise", "data_parallel"] compute_kernels: ["fused", "dense"] }
        use_tensorboard: true tensorboard_summaries: ["loss", "gradient"] is_profiling: true"""
    conversion = convert(pipeline(train).replace("num_epochs: 1", ""))
    tree = conversion.tree["train"]
    del tree["sparse_optimizer"], tree["dense_optimizer"]
    assert tree == {
        "num_steps": 500, "save_checkpoints_steps": 100, "keep_checkpoint_max": 2, "log_every_n_steps": 10,
        "cudnn_allow_tf32": False, "cuda_matmul_allow_tf32": True, "mixed_precision": "fp16",
        "grad_scaler": {"init_scale": 1024.0, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 50},
        "gradient_accumulation_steps": 4,
        "grad_clipping": {"by": "value", "max_gradient": 3.0},
        "global_embedding_constraints": {"sharding_types": ["row_wise"], "compute_kernels": ["fused"]},
        "stages": [{"type": "progress"}, {"type": "metrics_log"}, {"type": "tensorboard", "histograms_every_n_steps": 10},
                   {"type": "profiler", "wait": 1, "warmup": 1, "active": 10, "repeat": 1,
                    "record_shapes": True, "profile_memory": True, "with_stack": True}],
    }
    assert "'data_parallel' is not offered" in not_converted(conversion)["train_config.global_embedding_constraints.sharding_types"]
    assert "'dense' is not offered" in not_converted(conversion)["train_config.global_embedding_constraints.compute_kernels"]
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


def test_train_config_defaults_that_differ_are_written_out_and_epochs_win():
    defaults = convert(pipeline())
    assert defaults.tree["train"]["save_checkpoints_steps"] == 1000
    assert [s["type"] for s in defaults.tree["train"]["stages"]] == ["progress", "metrics_log", "tensorboard"]
    assert {"train_config.save_checkpoints_steps", "train_config.use_tensorboard"} <= set(notes(defaults))
    off = convert(pipeline("use_tensorboard: false save_checkpoints_epochs: 2 save_checkpoints_steps: 10 "
                           'tensorboard_summaries: "parameter"'))
    assert "stages" not in off.tree["train"] and off.tree["train"]["save_checkpoints_epochs"] == 2
    assert "save_checkpoints_steps" not in off.tree["train"]
    assert set(not_converted(off)) >= {"train_config.save_checkpoints_steps", "train_config.tensorboard_summaries"}


@pytest.mark.parametrize(("field", "says"), [
    ('fine_tune_checkpoint: "old/model.ckpt-100"', "--init-from"),
    ('fine_tune_ckpt_param_map: "map.txt"', "--init-map"),
    ("save_checkpoints_timestamp_interval: 3600", "event-time"),
    ("save_checkpoints_timestamps: [1700000000]", "event-time"),
    ("save_checkpoints_timestamp_quorum: 0.5", "event-time"),
    ("delta_embedding_dump_config { dump_interval_steps: 10 }", "no equivalent"),
    ('mixed_precision: "BF16" grad_scaler {}', "only with mixed_precision FP16"),
    ('tensorboard_summaries: "gradient_norm"', "per-parameter gradient norms"),
    ("some_future_field: 3", "not a field tzrec-run convert knows"),
])
def test_train_config_fields_without_equivalent_are_reported(field, says):
    conversion = convert(pipeline(field))
    name = field.split()[0].rstrip(":")
    if name == "mixed_precision":
        name = "grad_scaler"
    assert says in not_converted(conversion)[f"train_config.{name}"]


def test_data_eval_and_export_config(tzrun_pm):
    text = pipeline(
        model="metrics { auc {} } losses { binary_cross_entropy {} }",
        data='batch_size: 512 eval_batch_size: 2048 num_workers: 2 label_fields: "click" sample_weight_fields: ["w", "v"] '
             'shuffle: true fg_mode: FG_DAG negative_sampler { num_sample: 8 }',
        extra='train_input_path: "data/train/*.parquet" eval_input_path: "data/eval" '
              'eval_config { num_steps: 20 log_step_count_steps: 5 } '
              'export_config { exporter_type: "best" best_exporter_metric: "binary_cross_entropy" '
              'metric_larger_is_better: false mixed_precision: "BF16" }',
    )
    conversion = convert(text)
    assert conversion.tree["data"] == {
        "train_input": "data/train/*.parquet", "eval_input": "data/eval", "batch_size": 512, "eval_batch_size": 2048,
        "num_workers": 2, "labels": ["label", "click"], "sample_weight": "w", "reader": {"type": "parquet"},
    }
    assert conversion.tree["eval"] == {"num_steps": 20, "best_metric": "loss/binary_cross_entropy", "best_mode": "min"}
    reported = not_converted(conversion)
    assert set(reported) >= {"data_config.sample_weight_fields", "data_config.shuffle", "data_config.fg_mode",
                             "data_config.negative_sampler", "eval_config.log_step_count_steps",
                             "export_config.mixed_precision"}
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


def test_csv_and_odps_inputs(tzrun_pm):
    csv = convert(pipeline(data='delimiter: "\\t" input_fields { input_name: "label" input_type: INT32 } '
                                'input_fields { input_name: "tags" input_type: ARRAY_STRING } '
                                'input_fields_str: "price:DOUBLE;uid:BIGINT"').replace("ParquetDataset", "CsvDataset"))
    assert csv.tree["data"]["reader"] == {
        "type": "csv", "delimiter": "\t", "header": False, "column_names": ["label", "tags", "price", "uid"],
        "column_types": {"label": "int32", "price": "float64", "uid": "int64"},
    }
    assert "'tags' is ARRAY_STRING" in not_converted(csv)["data_config.input_fields"]
    header = convert(pipeline(data='with_header: true input_fields { input_name: "label" input_type: INT64 }')
                     .replace("ParquetDataset", "CsvDataset"))
    assert header.tree["data"]["reader"] == {"type": "csv", "header": True, "column_types": {"label": "int64"}}
    for conversion in (csv, header):
        load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)
    odps = convert(pipeline(extra='train_input_path: "odps://p/tables/t"').replace("dataset_type: ParquetDataset", ""))
    assert odps.tree["data"]["train_input"] == "odps://p/tables/t" and "reader" not in odps.tree["data"]
    assert "kept as data.train_input, which check does not read): export the data to Parquet" in \
        not_converted(odps)["train_input_path"]
    assert "OdpsDataset" in not_converted(odps)["data_config.dataset_type"]


# ----------------------------------------------------------------------------------------------
# metrics and losses


@pytest.mark.parametrize(("proto", "expected"), [
    ("auc {}", {"type": "auc"}),
    ("auc { thresholds: 1000 }", {"type": "auc"}),
    ("recall_at_k {}", {"type": "recall_at_k", "name": "recall_at_5", "k": 5}),
    ("recall_at_k { top_k: 1 }", {"type": "recall_at_k", "name": "recall_at_1", "k": 1}),
    ("mean_absolute_error {}", {"type": "mae"}),
    ("mean_squared_error {}", {"type": "mse"}),
    ("accuracy { threshold: 0.7 }", {"type": "accuracy", "threshold": 0.7}),
    ('grouped_auc { grouping_key: "user_id" }', {"type": "grouped_auc", "group_by": "user_id"}),
    ("xauc {}", {"type": "xauc", "ties": "wrong"}),
    ("xauc { sample_ratio: 0.01 max_pairs: 1000 }", {"type": "xauc", "ties": "wrong"}),
    ("xauc { in_batch: true }", {"type": "xauc", "mode": "in_batch", "ties": "wrong", "averaging": "per_batch"}),
    ('grouped_xauc { grouping_key: "user_id" max_pairs_per_group: 10 }',
     {"type": "grouped_xauc", "group_by": "user_id", "ties": "wrong"}),
    ("normalized_entropy { eta: 1e-6 }", {"type": "normalized_entropy", "eps": 1e-6}),
])
def test_each_metric(proto, expected, tzrun_pm):
    conversion = convert(pipeline(model=f"metrics {{ {proto} }}"))
    assert conversion.tree["metrics"] == [expected]
    assert not_converted(conversion) == {}
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


def test_approximate_metrics_become_exact_with_a_note():
    conversion = convert(pipeline(model="metrics { auc {} } metrics { auc { thresholds: 1000 } } metrics { xauc {} }"))
    assert [m.get("name", m["type"]) for m in conversion.tree["metrics"]] == ["auc", "auc_2", "xauc"]
    said = notes(conversion)
    assert "binned over 200 thresholds (add thresholds = 200" in said["model_config.metrics[0].auc"]
    assert "binned over 1000 thresholds" in said["model_config.metrics[1].auc.thresholds"]
    assert "exact XAUC" in said["model_config.metrics[2].xauc"]
    assert 'ties = "wrong"' in said["model_config.metrics[2].xauc"]


@pytest.mark.parametrize(("proto", "says"), [
    ("multiclass_auc {}", "no multi-class AUC"),
    ("accuracy { top_k: 3 }", "top-k accuracy"),
])
def test_metrics_without_equivalent_are_reported(proto, says):
    conversion = convert(pipeline(model=f"metrics {{ {proto} }}"))
    name = proto.split()[0]
    path = f"model_config.metrics[0].{name}" + ("" if name == "multiclass_auc" else ".top_k")
    assert says in not_converted(conversion)[path]


def test_train_metrics_keep_their_decay(tzrun_pm):
    conversion = convert(pipeline(model="train_metrics { auc {} decay_rate: 0.8 decay_step: 50 } "
                                        "train_metrics { mean_absolute_error {} }"))
    assert conversion.tree["train_metrics"] == [{"type": "auc", "decay_rate": 0.8, "decay_step": 50}, {"type": "mae"}]
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


@pytest.mark.parametrize(("proto", "expected"), [
    ("binary_cross_entropy {}", {"type": "binary_cross_entropy"}),
    ("binary_cross_entropy { label_smoothing: 0.1 }", {"type": "binary_cross_entropy", "label_smoothing": 0.1}),
    ("softmax_cross_entropy { label_smoothing: 0.1 }", {"type": "softmax_cross_entropy", "num_classes": 3, "label_smoothing": 0.1}),
    ("l2_loss {}", {"type": "l2"}),
    ('jrc_loss { session_name: "session_id" alpha: 0.3 }', {"type": "jrc", "alpha": 0.3, "group_by": "session_id"}),
    ("binary_focal_loss { gamma: 1.5 alpha: 0.25 }", {"type": "binary_focal", "gamma": 1.5, "alpha": 0.25}),
])
def test_each_loss(proto, expected, tzrun_pm):
    conversion = convert(pipeline(model=f"num_class: 3 losses {{ {proto} }}"))
    assert conversion.tree["losses"] == [expected]
    assert set(not_converted(conversion)) == {"model_config.num_class"}  # deepfm has one logit
    load_config_text(toml_text(merged_onto(conversion.tree, "deepfm_criteo.toml")), tzrun_pm)


def test_semantic_id_losses_and_model_level_options_are_reported():
    conversion = convert(pipeline(model="losses { recon_loss {} } kd {}"))
    reported = not_converted(conversion)
    assert "RQ-VAE" in reported["model_config.losses[0].recon_loss"]
    assert "distillation" in reported["model_config.kd"]
    assert "model_config" not in reported and conversion.tree["model"]["type"] == "deepfm"


def test_task_towers_name_read_and_weigh_per_task():
    model = """mmoe { task_towers { tower_name: "ctr" label_name: "clk" weight: 2.0 sample_weight_name: "w"
                                    metrics { auc {} } metrics { recall_at_k { top_k: 3 } }
                                    losses { binary_cross_entropy {} } train_metrics { auc {} } }
                      task_towers { tower_name: "dur" label_name: "time" metrics { mean_squared_error {} }
                                    losses { l2_loss {} } } }"""
    conversion = convert(pipeline().replace("deepfm {}", model))
    assert conversion.tree["losses"] == [
        {"type": "binary_cross_entropy", "name": "binary_cross_entropy_ctr", "prediction": "logits/ctr", "label": "clk", "weight": 2.0},
        {"type": "l2", "name": "l2_dur", "prediction": "logits/dur", "label": "time"},
    ]
    assert conversion.tree["metrics"] == [
        {"type": "auc", "name": "auc_ctr", "prediction": "probs/ctr", "label": "clk"},
        {"type": "recall_at_k", "name": "recall_at_3_ctr", "prediction": "similarity/ctr", "label": "clk", "k": 3},
        {"type": "mse", "name": "mse_dur", "prediction": "logits/dur", "label": "time"},
    ]
    assert conversion.tree["train_metrics"] == [{"type": "auc", "name": "auc_ctr", "prediction": "probs/ctr", "label": "clk"}]
    assert "data.sample_weight" in not_converted(conversion)["model_config.mmoe.task_towers[0].sample_weight_name"]


def _mmoe_towers(*towers: tuple[str, str, str]) -> str:
    """An mmoe with one binary_cross_entropy tower per ``(name, label, extra fields)``."""
    return "mmoe { " + " ".join(
        f'task_towers {{ tower_name: "{name}" label_name: "{label}" losses {{ binary_cross_entropy {{}} }} {extra} }}'
        for name, label, extra in towers) + " }"


def test_pareto_loss_weighting_converts_with_each_towers_minimum_on_its_losses(tzrun_pm):
    from tzrun.runner.preflight import preflight
    from tzrun.runner.facts import RunFacts

    model = _mmoe_towers(("ctr", "click", "pareto_min_loss_weight: 0.4"), ("cvr", "buy", ""))
    conversion = convert(pipeline().replace("deepfm {}", model + " use_pareto_loss_weight: true"))
    assert conversion.tree["train"]["loss_weighting"] == {"type": "pareto", "min_weights": {"binary_cross_entropy_ctr": 0.4}}
    assert "loss-weighting" in notes(conversion)["model_config.use_pareto_loss_weight"]
    assert not [p for p in not_converted(conversion) if "pareto" in p]
    # the skeleton's [model] has no experts: the example's model and features stand in for it
    training_parts = {k: v for k, v in conversion.tree.items() if k not in ("model", "features")}
    cfg, registries = load_config_text(toml_text(merged_onto(training_parts, "mmoe_taobao.toml")), tzrun_pm)
    preflight(RunFacts(cfg, registries), "converted")  # the minimum names a loss of the converted config

    three = convert(pipeline().replace("deepfm {}", _mmoe_towers(("a", "click", ""), ("b", "buy", ""), ("c", "buy", ""))
                                       + " use_pareto_loss_weight: true"))
    assert three.tree["train"]["loss_weighting"] == {"type": "pareto", "solver": "pe_ltr"}  # TorchEasyRec's weights


def test_a_pareto_minimum_without_pareto_weighting_is_noted_and_unused():
    conversion = convert(pipeline().replace("deepfm {}", _mmoe_towers(("ctr", "click", "pareto_min_loss_weight: 0.4"))))
    assert "loss_weighting" not in conversion.tree["train"]
    assert "unused without use_pareto_loss_weight" in notes(conversion)["model_config"]


def test_matching_models_use_in_batch_negatives(tzrun_pm):
    model = "metrics { recall_at_k { top_k: 1 } } metrics { recall_at_k { top_k: 5 } } losses { softmax_cross_entropy {} }"
    conversion = convert(pipeline(model=model).replace("deepfm {}", "dssm { output_dim: 64 }"))
    assert conversion.tree["losses"] == [{"type": "in_batch_softmax"}]
    assert conversion.tree["metrics"] == [
        {"type": "recall_at_k", "name": "recall_at_1", "k": 1, "in_batch": True},
        {"type": "recall_at_k", "name": "recall_at_5", "k": 5, "in_batch": True},
    ]
    assert "in_batch_softmax" in notes(conversion)["model_config.losses[0].softmax_cross_entropy"]
    best = convert(pipeline(model=model, extra='export_config { exporter_type: "best" best_exporter_metric: "recall@5" }')
                   .replace("deepfm {}", "dssm {}"))
    assert best.tree["eval"] == {"best_metric": "recall_at_5", "best_mode": "max"}
    load_config_text(toml_text(merged_onto(conversion.tree, "dssm_taobao.toml")), tzrun_pm)


def test_an_unknown_best_exporter_metric_and_unknown_fields_are_reported_with_their_path():
    conversion = convert(pipeline(extra='export_config { exporter_type: "best" best_exporter_metric: "gauc" } '
                                        "mystery { a: 1 }").replace("num_epochs: 1", "num_epochs: 1 train_oddity: 2"))
    reported = not_converted(conversion)
    assert "'gauc' is none of the converted eval results" in reported["export_config.best_exporter_metric"]
    assert "not a field tzrec-run convert knows" in reported["mystery"]
    assert "not a field tzrec-run convert knows" in reported["train_config.train_oddity"]


# ----------------------------------------------------------------------------------------------
# TorchEasyRec's own examples, end to end


def test_deepfm_criteo_example_converts_exactly():
    conversion = convert(DEEPFM_CRITEO)
    assert conversion.tree == {
        "model_dir": "experiments/deepfm_criteo",
        "data": {"train_input": "odps://{PROJECT}/tables/criteo_train", "eval_input": "odps://{PROJECT}/tables/criteo_eval",
                 "batch_size": 8192, "num_workers": 8, "labels": ["label"]},
        "model": {"type": "deepfm", "deep_hidden_units": [512, 256, 128], "final_hidden_units": [64]},
        "train": {"num_epochs": 1, "save_checkpoints_steps": 1000,
                  "sparse_optimizer": {"type": "adagrad", "lr": 0.001},
                  "dense_optimizer": {"type": "adam", "lr": 0.001},
                  "stages": [{"type": "progress"}, {"type": "metrics_log"}, {"type": "tensorboard"}]},
        "eval": {"num_steps": 100},
        "losses": [{"type": "binary_cross_entropy"}],
        "metrics": [{"type": "auc"}],
        "features": {"dense": [{"name": "int_0"}, {"name": "int_1"}],
                     "sparse": [{"name": "cat_0", "num_buckets": 40000000, "embedding_dim": 16},
                                {"name": "cat_1", "num_buckets": 39060, "embedding_dim": 16},
                                {"name": "cat_2", "num_buckets": 17295, "embedding_dim": 16}]},
    }
    assert list(not_converted(conversion)) == ["train_input_path", "eval_input_path", "data_config.dataset_type"]
    assert tomllib.loads(conversion.toml) == conversion.tree
    header = conversion.toml.split("\nmodel_dir")[0]
    assert all(line.startswith("#") for line in header.splitlines())
    assert "TODO" not in conversion.toml


def _convert_with_cli(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return cli(["convert", str(config), "--out", str(out)])


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return cli(["check", str(path)])


def test_convert_never_imports_torch(tmp_path):
    """``tzrec-run convert`` runs where torch is not installed yet (a fresh machine's first step)."""
    config = tmp_path / "deepfm_criteo.config"
    config.write_text(EXAMPLES["deepfm_criteo"])
    code = ("import sys; from tzrun.cli.main import main; code = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, "convert", str(config), "--out", str(tmp_path / "out.toml")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


#: The examples written for a GPU cluster: Criteo Terabyte's 40M-row tables do not fit this host's memory (check's
#: memory estimate refuses them on CPU); tdm_taobao's sparse Adam has no FBGEMM CPU kernel.
_GPU_EXAMPLES = {"wukong_criteo", "rocket_launching_criteo", "tdm_taobao"}

#: The examples whose conversion reads sequence groups (``[[features.sequence]]``, the din model).
_SEQUENCE_EXAMPLES = {"dssm_taobao", "dssm_v2_taobao", "mind_taobao", "multi_tower_din_taobao", "dbmtl_taobao_seq"}


def _sequences_built() -> bool:
    """Whether this checkout has sequence features and the din model (issue 25's other parts)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("tzrun.sequence", "tzrun_plugins.models.din"))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_torcheasyrec_example_converts_into_a_file_that_passes_check_unedited(name, tmp_path):
    if name in _SEQUENCE_EXAMPLES and not _sequences_built():
        pytest.skip("needs [[features.sequence]] and the din model (branches i25-data, i25-models)")
    config = tmp_path / f"{name}.config"
    config.write_text(EXAMPLES[name])
    out = tmp_path / f"{name}.toml"
    proc = _convert_with_cli(config, out)
    assert proc.returncode == 0, proc.stderr
    if 'train_input_path: ""' in EXAMPLES[name]:  # given on TorchEasyRec's command line: here by --set
        assert f"wrote {out}" in proc.stderr and "  model_dir: unset (TorchEasyRec's --model_dir gives it)" in proc.stderr
        check = cli(["check", str(out), "--device", "cuda", "--set", f'model_dir="{tmp_path / "run"}"',  # Criteo's
                     "--set", 'data.train_input="data/train"', "--set", 'data.eval_input="data/eval"'])  # tables
    else:
        assert f"wrote {out}" in proc.stderr
        if "odps://" in EXAMPLES[name]:  # MaxCompute tables: tdm_taobao's Parquet files convert
            assert "field(s) not converted:\n  train_input_path: " in proc.stderr
        check = cli(["check", str(out), "--device", "cuda"]) if name in _GPU_EXAMPLES else _check(out)
    assert check.returncode == 0, check.stderr
    base = name.removesuffix("_seq").removesuffix("_jrc").rsplit("_", 1)[0]  # dbmtl_taobao_seq: dbmtl
    model = {"multi_tower_din": "din", "masknet": "mask_net"}.get(base, base)
    assert f"{out}: ok (model {model};" in check.stdout


def test_a_model_that_is_not_converted_leaves_a_placeholder_and_check_asks_for_it(tmp_path):
    text = DEEPFM_CRITEO.replace("deepfm {", "rocket_launching { feature_based_distillation: true }  unused {")
    conversion = convert(text)
    assert "model" not in conversion.tree and len(conversion.tree["features"]["sparse"]) == 3
    assert not_converted(conversion)["model_config"] == (
        "rocket_launching, unused: the model is not converted; write [model] (tzrec-run help models)")
    assert "# TODO: what is not converted" in conversion.toml and "# type = \"...\"" in conversion.toml
    out = tmp_path / "converted.toml"
    out.write_text(conversion.toml)
    check = _check(out)
    assert check.returncode != 0 and "model" in check.stderr


def test_cli_exits_with_the_config_error_code_on_a_parse_error_or_a_missing_file(tmp_path, capsys):
    bad = tmp_path / "bad.config"
    bad.write_text("train_config {\n  num_steps: 10\n")
    assert main(["convert", str(bad)]) == EXIT_CONFIG
    assert f"{bad}:3:1: expected '}}' to close the message opened at line 1, column 14" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.config")]) == EXIT_CONFIG
    assert "missing.config: cannot read the file: No such file or directory" in capsys.readouterr().err
    good = tmp_path / "deepfm_criteo.config"
    good.write_text(DEEPFM_CRITEO)
    assert main(["convert", str(good)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("# Converted from the TorchEasyRec config deepfm_criteo.config")
    assert "3 field(s) not converted:" in captured.err


def test_the_worked_example_of_the_migration_page_is_what_convert_writes(tmp_path):
    page = (REPO / "docs" / "migration.md").read_text()
    example = page.split("## A worked example", 1)[1]
    proto = example.split("```protobuf\n", 1)[1].split("```", 1)[0]
    shown = example.split("```toml\n", 1)[1].split("```", 1)[0]
    assert convert_pipeline_config(proto, "mmoe.config").toml == shown
    out = tmp_path / "mmoe.toml"
    out.write_text(shown)
    check = _check(out)
    assert check.returncode == 0, check.stderr
    lines = check.stdout.splitlines()  # then a note on the data, which depends on what this checkout holds
    assert lines[0] == f"{out}: ok (model mmoe; 1 dense and 4 id features; sparse rowwise_adagrad, dense sgd; 2 epochs)"


def test_the_din_worked_example_of_the_migration_page_is_what_convert_writes_and_passes_check(tmp_path):
    if not _sequences_built():
        pytest.skip("needs [[features.sequence]] and the din model (branches i25-data, i25-models)")
    page = (REPO / "docs" / "migration.md").read_text()
    example = page.split("## A worked example: DIN over a click sequence", 1)[1]
    proto = example.split("```protobuf\n", 1)[1].split("```", 1)[0]
    shown = example.split("```toml\n", 1)[1].split("```", 1)[0]
    assert convert_pipeline_config(proto, "din.config").toml == shown
    assert 'type = "din"' in shown and 'query = ["adgroup_id", "cate_id"]' in shown and "max_len = 50" in shown
    out = tmp_path / "din.toml"
    out.write_text(shown)
    check = _check(out)
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith(f"{out}: ok (model din;")


def test_tdm_converts_with_its_tree_sampler_a_binary_loss_and_the_windows_first_ids():
    conversion = convert(EXAMPLES["tdm_taobao"])
    tree = conversion.tree
    assert tree["data"]["sampler"] == {
        "type": "tdm", "tree": "data/init_tree/nodes.parquet", "item_id": "adgroup_id",
        "layer_num_sample": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 17, 23, 30, 34, 82, 200],
        "attr_fields": ["cate_id", "campaign_id", "customer", "brand", "price"]}
    model = tree["model"]
    assert model["type"] == "tdm" and model["history"] == "seq"
    assert model["features"] == ["user_id", "cms_segid", "cms_group_id", "final_gender_code", "age_level", "pvalue_level",
                                 "shopping_level", "occupation", "new_user_class_level", "pid", "campaign_id",
                                 "customer", "price"]
    assert (model["windows_len"], model["attention_hidden_units"], model["attention_activation"]) == (
        [1, 1, 1, 2, 2, 2, 5, 6, 10, 20], [36], "prelu")
    assert (model["final_hidden_units"], model["final_batch_norm"]) == ([256, 128, 64, 32], True)
    (group,) = tree["features"]["sequence"]
    assert group["query"] == ["adgroup_id", "cate_id", "brand"]
    assert (group["max_len"], group["keep"]) == (50, "first")  # the windows read a row's first 50 ids
    assert [loss["type"] for loss in tree["losses"]] == ["binary_cross_entropy"]  # num_class 2: one logit
    said = {**not_converted(conversion), **notes(conversion)}
    assert "write it with tzrec-run tdm-tree" in said["data_config.tdm_sampler.item_input_path"]
    assert "Parquet node table" in said["data_config.tdm_sampler.attr_delimiter"]
