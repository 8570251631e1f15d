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


def test_export_as_a_table_and_in_train_stages_too_is_refused(config, capsys):
    """``[export]`` is the export stage: listing it in ``train.stages`` as well would export each
    checkpoint twice."""
    from tzrun.errors import EXIT_CONFIG

    code = main(["check", str(config), "--no-plan", "--no-data", "--set", "export={at_end=true}",
                 "--set", 'train.stages+=[{type = "export", at_end = true}]'])
    assert code == EXIT_CONFIG
    assert "export: configures the 'export' stage, which train.stages lists too; keep one of the two" in \
        capsys.readouterr().err
    assert main(["check", str(config), "--no-plan", "--no-data", "--set", "export={at_end=true}"]) == 0


def test_without_the_serving_plugin_export_is_unknown_and_predict_export_says_why(config, tmp_path, capsys,
                                                                                  monkeypatch):
    """The way out of a run is a plugin: disabled, ``export`` is not a command, and ``predict
    --export`` fails in one line naming the plugin (the core never imports it)."""
    from tzrun.errors import EXIT_CONFIG, EXIT_USAGE, PluginError

    monkeypatch.setenv("TZRUN_DISABLE_PLUGINS", "tzrun_serving")
    with pytest.raises(SystemExit) as usage:
        main(["export", str(config), "--out", str(tmp_path / "out")])
    assert usage.value.code == EXIT_USAGE and "invalid choice: 'export'" in capsys.readouterr().err
    code = main(["predict", str(config), "--export", str(tmp_path / "exports"), "--input", str(tmp_path / "data"),
                 "--output", str(tmp_path / "scores.parquet")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == PluginError.exit_code and len(err) == 1
    assert "no installed plugin reads exports" in err[0] and "tzrun_serving" in err[0]
    assert not (tmp_path / "scores.parquet").exists()
    code = main(["check", str(config), "--no-plan", "--no-data", "--set", "export={at_end=true}"])
    assert code == EXIT_CONFIG and "export: unknown key" in (err := capsys.readouterr().err)
    assert "nor does an installed plugin register a stage 'export'" in err
