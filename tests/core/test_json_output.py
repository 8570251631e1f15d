"""``--json`` on ``check`` and ``data synth`` (``train`` and ``evaluate``: tests/integration/
test_log_file.py): standard output is one JSON object with the fields docs/cli.md documents."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import EXAMPLE
from tzrun.cli.main import build_parser, main
from tzrun.cli.results import print_json
from tzrun.errors import EXIT_CONFIG, EXIT_USAGE


def test_check_json_carries_the_verdict_and_the_notes(capsys):
    assert main(["check", str(EXAMPLE), "--json", "--no-plan"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"config": str(EXAMPLE), "ok": True, "model": "deepfm", "dense_features": 13, "sparse_features": 26, "sequence_groups": 0,
                   "sparse_optimizer": "rowwise_adagrad", "dense_optimizer": "adam", "num_steps": None, "num_epochs": 1,
                   "data_checked": True, "plan_checked": False, "notes": out["notes"]}
    assert all(isinstance(note, str) for note in out["notes"])


def test_check_json_prints_nothing_on_standard_output_for_a_broken_config(capsys):
    assert main(["check", str(EXAMPLE), "--json", "--no-plan", "--set", "train.seed=\"x\""]) == EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.out == "" and "train.seed" in captured.err


def test_check_json_and_params_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["check", "c.toml", "--json", "--params"])
    assert exit_.value.code == EXIT_USAGE


@pytest.mark.parametrize("fmt", ["parquet", "text"])
def test_data_synth_json_is_the_report_with_dataset_and_format(tmp_path, capsys, fmt):
    out = tmp_path / "d"
    assert main(["data", "synth", "criteo", "--rows", "1200", "--eval-rows", "1000", "--out", str(out),
                 "--format", fmt, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dataset"] == "criteo" and report["format"] == fmt and report["out_dir"] == str(out)
    assert (report["train_rows"], report["eval_rows"], report["seed"]) == (1200, 1000, 0)
    assert 0.5 < report["bayes_auc"] < 1 and 0 < report["positive_rate"] < 1 and len(report["cardinalities"]) == 26
    assert json.loads((out / "synth.json").read_text())["bayes_auc"] == report["bayes_auc"]


def test_json_has_no_nan(capsys):
    print_json({"metrics": {"auc": math.nan, "loss": 0.5}, "rows": [math.inf]})
    assert json.loads(capsys.readouterr().out) == {"metrics": {"auc": None, "loss": 0.5}, "rows": [None]}


def test_torchruns_own_spelling_nproc_per_node_is_accepted_and_not_passed_on():
    from tzrun.runner.launch import with_our_spellings, without_launcher_options as _without_launcher_options

    def parse(*argv: str):
        return build_parser().parse_args(with_our_spellings(argv))

    for command in (["train", "c.toml"], ["evaluate", "c.toml", "--checkpoint", "latest"], ["check", "c.toml"]):
        assert parse(*command, "--nproc_per_node", "2").nproc_per_node == 2
        assert parse(*command, "--nproc_per_node=3").nproc_per_node == 3
        assert parse(*command, "--nproc", "4").nproc_per_node == 4  # argparse's abbreviation still works
    assert parse("train", "c.toml", "--max_restarts", "1").max_restarts == 1
    argv = with_our_spellings(["train", "c.toml", "--nproc_per_node", "2", "--max_restarts=1", "--json",
                               "--set", "train.seed=1"])
    assert argv == ["train", "c.toml", "--nproc-per-node", "2", "--max-restarts=1", "--json", "--set", "train.seed=1"]
    assert _without_launcher_options(argv) == ["train", "c.toml", "--json", "--set", "train.seed=1"]
