"""Uninstalling a contrib distribution makes its names unknown, with tzrec-run's usual error:
the TOML path, the names still available, and a did-you-mean among them."""

from __future__ import annotations

from tests.plugin_kit.dists import config_file, tzrun_cli, tzrun_cli_without
from tzrun.errors import EXIT_CONFIG

DENSE = "train.dense_optimizer.type: unknown dense optimizer"


def test_uninstalling_contrib_optimizers_makes_its_names_unknown(tmp_path):
    config = str(config_file(tmp_path))
    lion = ["check", config, "--set", 'train.dense_optimizer={type="lion", lr=0.001}']
    typo = ["check", config, "--set", 'train.dense_optimizer={type="adabelif", lr=0.001}']

    installed = tzrun_cli(lion)
    assert installed.returncode == 0, f"tzrun-contrib-optimizers must be installed (scripts/setup.sh): {installed.stderr}"
    assert "did you mean 'adabelief'?" in tzrun_cli(typo).stderr

    gone = tzrun_cli_without(["tzrun-contrib-optimizers"], lion, tmp_path)
    assert gone.returncode == EXIT_CONFIG
    assert f"{DENSE} 'lion' (available: adadelta, adagrad, adam, adamw, rmsprop, sgd)" in gone.stderr
    gone_typo = tzrun_cli_without(["tzrun-contrib-optimizers"], typo, tmp_path / "again")
    assert f"{DENSE} 'adabelif' (available: adadelta, adagrad, adam, adamw, rmsprop, sgd; did you mean 'adadelta'?)" in gone_typo.stderr
    freeze = tzrun_cli_without(["tzrun-contrib-optimizers"], ["plugins", "--freeze"], tmp_path / "freeze")
    assert "tzrun-contrib-optimizers" not in freeze.stdout and "tzrun-contrib-metrics==" in freeze.stdout


def test_uninstalling_contrib_metrics_makes_its_names_unknown(tmp_path):
    config = str(config_file(tmp_path))
    ndcg = ["check", config, "--set", 'metrics=[{type="ndcg_at_k", k=5, group_by="cat_5"}]']
    assert tzrun_cli(ndcg).returncode == 0
    gone = tzrun_cli_without(["tzrun-contrib-metrics"], ndcg, tmp_path)
    assert gone.returncode == EXIT_CONFIG
    assert "metrics[0].type: unknown metric 'ndcg_at_k' (available: " in gone.stderr
    assert "average_precision" not in gone.stderr and "copc" not in gone.stderr
