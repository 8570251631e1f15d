"""Errors a user causes end with one line naming the file and the fix, and the documented exit
code; never with an internal error's traceback (issue 27, point 7 and 9)."""

from __future__ import annotations

import re
import warnings

import pytest

import tzrun
from tests.conftest import cli, run_cli
from tzrun.cli import main as cli_main
from tzrun.errors import EXIT_CANT_WRITE, EXIT_CHECKPOINT, EXIT_CONFIG, WriteError, exit_code_of
from tzrun.testing import tiny_config_text


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("tzrec-run: ")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.fixture
def tiny_config(tmp_path):
    """The tiny config, for commands that read no data (its data dir does not exist)."""
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_config_text(tmp_path / "data", tmp_path / "run"))
    return path


# -- a damaged best.json ------------------------------------------------------------------------


def test_a_damaged_best_json_stops_a_resume_with_one_line_and_exit_66(tmp_path):
    from tzrun.runner.retention import read_best

    trained = tzrun.testing.run_tiny_training(tmp_path, overrides=["train.num_steps=2"])
    best = trained.model_dir / "best.json"
    best.write_text('{"step": 2, "metric": "auc", "val')  # cut short, as by a full disk
    with pytest.raises(tzrun.errors.CheckpointError, match=r"best\.json: damaged \(JSONDecodeError"):
        read_best(trained.model_dir)
    proc = cli(["train", str(tmp_path / "tiny.toml"), "--resume"])
    assert proc.returncode == EXIT_CHECKPOINT
    line = _one_line(proc.stderr)
    assert f"{best}: damaged (JSONDecodeError: " in line and "remove it" in line
    best.write_text('{"step": 2}')  # JSON, but not a record of the best checkpoint
    with pytest.raises(tzrun.errors.CheckpointError, match=r"best\.json: damaged \(no field 'metric'\)"):
        read_best(trained.model_dir)
    listed = cli(["ckpt", "ls", str(trained.model_dir)])  # the listing still works, without a best
    assert listed.returncode == 0 and "step-2" in listed.stdout


# -- TOML that is not UTF-8 or nests too deeply ----------------------------------------------


def test_a_config_that_is_not_utf8_names_its_line_and_byte(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'model_dir = "run"\n# caf\xe9 au lait\n')
    assert cli_main.main(["check", str(path), "--no-data"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        f"tzrec-run: {path}: 1 problem",
        "  not valid TOML: line 2, column 6 (byte 23): 0xe9 is not UTF-8, and a TOML file must be; save it as UTF-8 "
        "(e.g. iconv -f latin1 -t utf-8)",
    ]


def test_a_config_nested_too_deeply_is_a_config_error(tmp_path, capsys):
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    assert cli_main.main(["check", str(path), "--no-data"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(f"tzrec-run: {path}: 1 problem\n")
    assert "nested too deeply" in err and len(err.splitlines()) == 2
    assert cli_main.main(["check", str(path), "--no-data", "--set", "a=" + "[" * 5000 + "]" * 5000]) == EXIT_CONFIG
    assert "Traceback" not in capsys.readouterr().err


# -- what the sharding planner cannot place --------------------------------------------------


def test_check_refuses_a_batch_no_plan_can_place(tiny_config, capsys):
    code = cli_main.main(["check", str(tiny_config), "--no-data", "--device", "cpu", "--set", "data.batch_size=1000000000"])
    assert code == EXIT_CONFIG
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"tzrec-run: {tiny_config}: no sharding plan fits 1 ranks (1 per host, 1 host), cpu")
    assert "a smaller batch (data.batch_size; now 1000000000)" in line
    assert cli_main.main(["check", str(tiny_config), "--no-data", "--no-plan", "--set", "data.batch_size=1000000000"]) == 0


def test_train_maps_the_planners_error_to_one_line(tiny_config):
    proc = cli(["train", str(tiny_config), "--set", "data.batch_size=1000000000"])
    assert proc.returncode == EXIT_CONFIG
    line = _one_line(proc.stderr)
    assert line.startswith(f"tzrec-run: {tiny_config}: no sharding plan fits 1 ranks") and "data.batch_size" in line


# -- tables this host cannot hold (CPU) --------------------------------------------------------


def test_check_on_cpu_refuses_tables_the_hosts_available_memory_cannot_hold(tiny_config, capsys, monkeypatch):
    from tzrun.runner import host_memory

    monkeypatch.setattr(host_memory, "host_memory", lambda: host_memory.HostMemory(8 << 30, 20 << 10))
    assert cli_main.main(["check", str(tiny_config), "--no-data", "--device", "cpu"]) == EXIT_CONFIG
    line = _one_line(capsys.readouterr().err)
    # cat_0: 1,000 x 8 float32 rows (31.25 KiB) and its wide table 1,000 x 4; SGD keeps no state
    assert line.startswith(f"tzrec-run: {tiny_config}: the embedding tables and their sparse optimizer state need "
                           "0.0 GiB on this host (its CPU rank; the biggest is cat_0_emb, 0.0 GiB), which has 8.0 GiB "
                           "of memory, 0.0 GiB of it available")
    total, biggest, size = host_memory.table_bytes(*_tiny_tables(tiny_config), world_size=1)
    assert (biggest, size) == ("cat_0_emb", 1000 * 8 * 4) and total == (1000 + 24 + 3) * (8 + 4) * 4
    monkeypatch.setattr(host_memory, "host_memory", lambda: host_memory.HostMemory(8 << 30, 1 << 30))
    assert cli_main.main(["check", str(tiny_config), "--no-data", "--device", "cpu"]) == 0


#: cat_0's table at 20M rows on the meta device: 20,000,000 x (8 + 4 wide) float32 = 915.5 MiB
BIG = ("--set", "features.sparse[0].num_buckets=20000000", "--set", "train.async_checkpoint=true")
GIB = 1 << 30


@pytest.mark.parametrize(("budget", "available", "copied"), [(None, 2.5, True), ("0.5", 2.5, False), ("2", 1.6, None)],
                         ids=["copy-fits-the-host", "copy-over-its-budget", "copy-over-the-host"])
def test_check_names_the_peak_host_memory_with_a_checkpoint_and_refuses_what_the_host_cannot_hold(
        tiny_config, capsys, monkeypatch, budget, available, copied):
    """Training holds the tables (0.9 GiB here) and torch itself (0.5 GiB a rank); a checkpoint
    behind training copies the state too, unless the copy exceeds its budget (then the save is
    synchronous, and a load holds five 64 MiB blocks at most)."""
    from tzrun.runner import host_memory

    monkeypatch.setattr(host_memory, "host_memory", lambda: host_memory.HostMemory(8 * GIB, int(available * GIB)))
    extra = () if budget is None else ("--set", f"train.async_checkpoint_budget_gb={budget}")
    code = cli_main.main(["check", str(tiny_config), "--no-data", "--device", "cpu", *BIG, *extra])
    out, err = capsys.readouterr()
    line = (out if copied is not None else _one_line(err)).splitlines()[-1 if copied is not None else 0]
    parts = re.search(r"dense part ([\d.]+) MiB; checkpoint ([\d.]+) MiB \(([^)]*\)?)\); torch and TorchRec loaded "
                      r"512\.00 MiB; activations, batches in flight and data workers not counted", line)
    assert parts, line
    held, checkpoint, how = float(parts[1]), float(parts[2]), parts[3]
    assert 915.5 <= held < 917  # the tables (SGD keeps no state), the small ones, buffers and the dense part
    if copied is False:
        assert code == 0 and checkpoint == 320.0  # a load's 64 MiB blocks: 4 hashing, 1 copied
        assert how.startswith("written synchronously from the live tables: the copy behind training, 0.89 GiB, "
                              "would exceed train.async_checkpoint_budget_gb = 0.5")
        return
    assert 915.5 <= checkpoint <= held and how == "a copy of each rank's state, written behind training"
    total = (held + checkpoint + 512) / 1024
    if copied:
        assert code == 0 and line.endswith(f"this host has {available:.2f} GiB available")
        assert f"about {total:.2f} GiB" in line
        return
    assert code == EXIT_CONFIG
    assert line.startswith(f"tzrec-run: {tiny_config}: peak host memory, the fullest host (1 rank): about {total:.2f} GiB")
    assert line.endswith("; this host has 8.00 GiB of memory, 1.60 GiB of it available: the run would be killed for "
                         "memory. Use fewer rows (num_buckets, hash_bucket_size), a smaller embedding_dim, a sparse "
                         "optimizer with less state, fewer ranks per host (--nproc-per-node), train.async_checkpoint "
                         "off or a train.async_checkpoint_budget_gb, or more hosts")


def _tiny_tables(config):
    import torch

    from tzrun.cli.commands import prepare
    from tzrun.runner.sharding import prepare_sharding

    setup = prepare_sharding(prepare(str(config), []).facts, world_size=1, local_world_size=1,
                             device=torch.device("cpu"))
    return setup.embedding_modules, setup.updates


def test_train_on_cpu_refuses_tables_no_host_holds(tiny_config):
    proc = run_cli(["train", str(tiny_config), "--set", "features.sparse[0].num_buckets=1000000000000"],
                   env={"CUDA_VISIBLE_DEVICES": ""})  # on CPU, also where there is a GPU
    assert proc.returncode == EXIT_CONFIG
    line = _one_line(proc.stderr)
    assert line.startswith(f"tzrec-run: {tiny_config}: the embedding tables and their sparse optimizer state need "
                           "44703.5 GiB on this host (its CPU rank; the biggest is cat_0_emb, 29802.3 GiB)")


# -- a storage failure during a checkpoint save --------------------------------------------------


def test_a_store_error_inside_dcps_failure_is_a_write_error():
    from botocore.exceptions import EndpointConnectionError
    from torch.distributed.checkpoint.api import CheckpointException

    from tzrun.io.write_errors import named_save_error

    gone = EndpointConnectionError(endpoint_url="http://127.0.0.1:9/bucket/run/checkpoints/step-4/state/__0_0.distcp")
    error = CheckpointException("save failed", {0: (gone, None), 1: (gone, None)})
    named = named_save_error(error, "s3://bucket/run", "checkpoint step-4")
    assert isinstance(named, WriteError) and exit_code_of(named) == EXIT_CANT_WRITE
    assert str(named) == (
        's3://bucket/run: cannot write checkpoint step-4: EndpointConnectionError: Could not connect to the endpoint '
        'URL: "http://127.0.0.1:9/bucket/run/checkpoints/step-4/state/__0_0.distcp"; check that the store is '
        "reachable (endpoint, credentials, network) and has room, then rerun with --resume: the checkpoints "
        "completed before it are intact")
    assert named_save_error(RuntimeError("a bug"), "s3://bucket/run", "checkpoint step-4") is None


# -- small ones ----------------------------------------------------------------------------------


def test_log_level_is_accepted_after_every_command(tmp_path, capsys):
    assert cli_main.main(["ckpt", "ls", str(tmp_path / "none"), "--log-level", "debug"]) == EXIT_CHECKPOINT
    assert _one_line(capsys.readouterr().err) == f"tzrec-run: {tmp_path / 'none'}: no such model dir"
    assert cli_main.main(["help", "exit-codes", "--log-level", "warning"]) == 0


def test_a_failure_in_after_train_does_not_say_training_goes_on():
    from tzrun.kernel.plugins import call_lifecycle, make_plugin_manager

    class Uploader:
        @tzrun.hookimpl
        def tzrun_after_train(self, run, step):
            raise RuntimeError("the bucket is gone")

    pm = make_plugin_manager(plugins=[("uploader", Uploader())])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call_lifecycle(pm, "tzrun_after_train", run=None, step=4)
    (message,) = [str(w.message) for w in caught if "uploader" in str(w.message)]
    assert "training goes on" not in message
    assert "raised in tzrun_after_train: RuntimeError: the bucket is gone; training is over and its checkpoints are " \
           "written, so the run ends as usual" in message


@pytest.mark.parametrize(("name", "meant"), [
    ("tzrun_on_train_end", "tzrun_after_train"),
    ("tzrun_on_train_begin", "tzrun_before_train"),
    ("tzrun_after_step", "tzrun_after_train_step"),
    ("tzrun_on_validation_end", "tzrun_after_eval"),
    ("tzrun_on_save_checkpoint", "tzrun_before_checkpoint_save"),
    ("tzrun_on_exception", "tzrun_on_train_error"),
    ("tzrun_after_train_stpe", "tzrun_after_train_step"),  # a typo: the closest spelling
])
def test_an_unknown_hook_suggests_the_hook_it_means(name, meant):
    from tzrun.kernel.hookcheck import hook_problems

    def hook(run):
        pass

    hook.__name__ = name
    plugin = type("Plugin", (), {name: staticmethod(tzrun.hookimpl(hook))})()
    assert hook_problems(plugin, "plugin 'p'") == [f"plugin 'p': unknown hook {name} (did you mean {meant}?)"]
