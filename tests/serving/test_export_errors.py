"""What `tzrec-run export` and the Predictor refuse, each with its exit code."""

from __future__ import annotations

import pytest

from tzrun.cli.main import main
from tzrun.errors import EXIT_CANT_WRITE, EXIT_CHECKPOINT
from tzrun.testing import tiny_config_text


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_config_text(tmp_path / "data", tmp_path / "run"), encoding="utf-8")
    return path


def test_export_without_a_checkpoint_names_the_model_dir(config, tmp_path, capsys):
    code = main(["export", str(config), "--checkpoint", "latest", "--out", str(tmp_path / "out")])
    assert code == EXIT_CHECKPOINT
    assert "no complete checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_out_dir_holding_other_files_is_refused(tmp_path):
    from tzrun.errors import WriteError
    from tzrun_serving.export import write_export

    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(WriteError, match="not a tzrec-run export") as error:
        write_export(out, {}, {})
    assert error.value.exit_code == EXIT_CANT_WRITE
    assert (out / "notes.txt").read_text() == "mine"


def test_the_predictor_refuses_an_export_without_its_marker(tmp_path):
    from tzrun.errors import CheckpointError
    from tzrun_serving import Predictor

    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match="not a complete export"):
        Predictor(tmp_path)


def test_exporting_on_the_best_metric_needs_one(config, capsys):
    from tzrun.errors import EXIT_CONFIG

    code = main(["check", str(config), "--no-plan", "--no-data", "--set", "export={on_best=true}"])
    assert code == EXIT_CONFIG
    assert "export.on_best: needs eval.best_metric" in capsys.readouterr().err
