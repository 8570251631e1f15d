"""The command line: help, plugin listing, and that light commands do not import torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import cli, REPO
from tzrun.errors import EXIT_CONFIG


def test_help_lists_the_commands():
    proc = cli(["--help"])
    assert proc.returncode == 0
    for command in ("train", "check", "plugins", "data"):
        assert command in proc.stdout


def test_plugins_json_lists_first_party_plugins_and_their_components():
    proc = cli(["plugins", "--json"])
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    by_name = {p["name"]: p for p in listing["plugins"]}
    assert by_name["tzrun_plugins.optim"]["distribution"] == "tzrec-run"
    assert by_name["tzrun_plugins.optim"]["components"]["sparse_optimizer"] == [
        "adagrad", "adam", "lamb", "lars_sgd", "partial_rowwise_adam", "partial_rowwise_lamb", "rowwise_adagrad", "sgd"
    ]
    assert by_name["tzrun_plugins.metrics"]["components"] == {"metric": [
        "accuracy", "auc", "calibration", "grouped_auc", "grouped_xauc", "hit_rate_at_k", "log_loss", "mae", "mse", "normalized_entropy", "recall_at_k", "relative_l1", "rmse", "unique_ratio", "xauc",
    ]}
    assert by_name["tzrun_plugins.stages"]["hooks"] == ["tzrun_register_stages"]
    assert listing["failed"] == []


def test_plugins_does_not_import_torch():
    # check does since the component checks run each named component on a tiny input
    code = (
        "import sys; from tzrun.cli.main import main; "
        "main(['plugins']); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr


def test_check_params_prints_what_each_part_and_table_gets():
    from tests.conftest import EXAMPLE

    part = 'train.dense_optimizer.parts=[{type="sgd", lr=0.1, pattern="deep\\\\..*"}]'
    proc = cli(["check", str(EXAMPLE), "--params", "--set", part, "--set", "features.sparse[0].trainable=false"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "dense (adam): 4 parameter(s)\n  final.0.weight [64, 84]\n" in out
    assert "dense.parts[0] (sgd, pattern 'deep\\..*'): 6 parameter(s)\n  deep.0.weight [256, 429]\n" in out
    assert "  cat_0_emb [1000, 16]: frozen\n" in out
    assert "  cat_1_emb [500, 16]: EXACT_ROWWISE_ADAGRAD from train.sparse_optimizer\n" in out


def test_check_params_reports_a_parameter_in_two_parts():
    from tests.conftest import EXAMPLE

    parts = 'train.dense_optimizer.parts=[{type="sgd", lr=0.1, pattern="deep\\\\..*"}, {type="sgd", lr=0.1, pattern=".*bias"}]'
    proc = cli(["check", str(EXAMPLE), "--params", "--set", parts])
    assert proc.returncode != 0
    assert "train.dense_optimizer.parts[1].pattern: parameter 'deep.0.bias' is matched by parts[0] ('deep\\..*') and parts[1] ('.*bias')" in proc.stderr


@pytest.mark.parametrize("rank, info_shown", [("0", True), ("1", False)])
def test_info_comes_from_rank_0_and_warnings_from_every_rank_with_the_rank(rank, info_shown):
    code = (
        "import logging; from tzrun.cli.main import _setup_logging; _setup_logging(); "
        "log = logging.getLogger('tzrun.progress'); log.info('step line'); log.warning('careful')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "RANK": rank})
    assert proc.returncode == 0, proc.stderr
    assert f"WARNING [rank {rank}] tzrun.progress: careful" in proc.stderr
    assert ("INFO [rank 0] tzrun.progress: step line" in proc.stderr) == info_shown
    assert "step line" not in proc.stderr or info_shown


def test_nproc_per_node_splits_the_cpus_between_the_ranks_unless_omp_num_threads_is_set(monkeypatch):
    """torchrun sets OMP_NUM_THREADS=1 for several ranks when it is unset; the launcher sets the
    per-rank split first, so a large host is not left with one thread per rank."""
    from tzrun.runner import launch
    from tzrun.runner.launch import launch_environment

    monkeypatch.setattr(launch, "available_cpus", lambda: 16)
    assert launch_environment({"PATH": "/bin"}, 4) == {"PATH": "/bin", "OMP_NUM_THREADS": "4"}
    assert launch_environment({}, 32)["OMP_NUM_THREADS"] == "1"
    assert launch_environment({"OMP_NUM_THREADS": "7"}, 4)["OMP_NUM_THREADS"] == "7"


def test_check_params_decides_fused_sparse_optimizers_for_the_device_it_is_told(capsys):
    """On CPU FBGEMM fuses only sgd and the two adagrads: check --params refuses adam there,
    naming the config file (not a section) and the TOML path; --device cuda accepts it."""
    from tests.conftest import EXAMPLE
    from tzrun.cli.main import main

    adam = 'train.sparse_optimizer={type="adam", lr=0.01}'
    assert main(["check", str(EXAMPLE), "--params", "--device", "cpu", "--set", adam]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"tzrec-run: {EXAMPLE}: 1 problem\n  train.sparse_optimizer.type: sparse optimizer 'adam' (FBGEMM ADAM) has no FBGEMM CPU kernel" in err
    assert main(["check", str(EXAMPLE), "--params", "--device", "cuda", "--set", adam]) == 0
    out = capsys.readouterr().out
    assert "cat_0_emb [" in out and "ADAM from train.sparse_optimizer" in out


def test_a_models_own_config_error_names_the_config_file(capsys):
    """Errors a model plugin raises while it is built carry its section; the user sees the file."""
    from tests.conftest import EXAMPLE
    from tzrun.cli.main import main

    assert main(["check", str(EXAMPLE), "--params", "--set", "model.wide_embedding_dim=6"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"tzrec-run: {EXAMPLE}: 1 problem\n  model.wide_embedding_dim: 6 is not a multiple of 4" in err
