"""Checkpoint integrity, retention, the best checkpoint, ``tzrec-run evaluate`` and ``tzrec-run
ckpt``: a damaged file is named at load, ``keep_checkpoint_max`` keeps the newest K and the best,
``best.json`` follows the configured metric, and a saved checkpoint evaluates to the numbers the
training recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.checkpoint_entries import read_saved
from tests.conftest import cli
from tests.warm_ranks import warm_cli
from tests.integration.test_update_path import CONFIG, _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.errors import EXIT_CHECKPOINT, CheckpointError, ConfigError, IncompleteCheckpointError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import MARKER, list_checkpoints, load_checkpoint
from tzrun.runner.checkpoint_eval import evaluate_checkpoint
from tzrun.runner.manifest import check_checkpoint
from tzrun.runner.retention import read_best
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

EVAL = (
    "train.num_steps=8",
    "train.save_checkpoints_steps=2",
    "train.keep_checkpoint_max=1",
    'metrics=[{type = "auc"}]',
    # the largest eval loss is the best: an early step, so retention must keep it apart
    'eval.best_metric="loss/binary_cross_entropy"',
    'eval.best_mode="max"',
)


def _config(model_dir: Path, criteo_dir: Path, *overrides: str):
    registries = collect_registries(make_plugin_manager())
    text = CONFIG.format(model_dir=model_dir, train=criteo_dir / "train")
    raw = parse_config(text, "run.toml", [f'data.eval_input="{criteo_dir / "eval"}"', *overrides])
    return raw, registries


def _train(model_dir: Path, criteo_dir: Path, *overrides: str, **options):
    from tzrun.runner.trainer import train

    raw, registries = _config(model_dir, criteo_dir, *overrides)
    pm = make_plugin_manager()
    return train(Session(load_config(raw, registries), raw, pm, registries), **options)


def _evaluate(model_dir: Path, criteo_dir: Path, which: str, *overrides: str):
    raw, registries = _config(model_dir, criteo_dir, *EVAL, *overrides)
    return evaluate_checkpoint(Session(load_config(raw, registries), raw, make_plugin_manager(), registries), which)


def _results(model_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (model_dir / "eval_results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, criteo_dir):
    """One run: 8 steps, a checkpoint and an evaluation every 2, keep 1 plus the best."""
    model_dir = tmp_path_factory.mktemp("ckpt") / "run"
    result = _train(model_dir, criteo_dir, *EVAL)
    return model_dir, result


def test_retention_keeps_the_newest_k_and_the_best_which_best_json_tracks(trained):
    model_dir, _ = trained
    results = _results(model_dir)
    assert [r["step"] for r in results] == [2, 4, 6, 8]
    losses = {r["step"]: r["loss/binary_cross_entropy"] for r in results}
    best_step = max(losses, key=losses.get)
    assert best_step != 8, losses  # the premise of this test: the best is not the newest
    best = json.loads((model_dir / "best.json").read_text())
    assert best == {"step": best_step, "metric": "loss/binary_cross_entropy", "value": losses[best_step],
                    "mode": "max", "checkpoint": f"checkpoints/step-{best_step}"}
    assert [s for s, _ in list_checkpoints(model_dir)] == sorted({best_step, 8})
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == sorted({f"step-{best_step}", "step-8"})


def test_every_file_is_in_the_manifest_and_verifies(trained):
    model_dir, _ = trained
    path = model_dir / "checkpoints" / "step-8"
    manifest = json.loads((path / "manifest.json").read_text())
    listed = {f["path"] for f in manifest["files"]}
    assert listed == {"meta.json", "state/.metadata", "state/__0_0.distcp"}  # one DCP save holds all the state
    assert "manifest sha256 " in (path / MARKER).read_text()
    status = check_checkpoint(path)
    assert status.state == "ok" and status.hashed and status.files == 3
    assert read_saved(path, "loop")["step"] == 8 and set(read_saved(path, "rank.0")["rng"]) == {"python", "numpy", "torch"}


@pytest.mark.parametrize("damage, expected", [
    ("corrupt", r"state/__0_0\.distcp: corrupted \(its SHA-256 differs"),
    ("truncate", r"state/__0_0\.distcp: truncated \([\d,]+ bytes; [\d,]+ were written\)"),
    ("delete", r"meta\.json: missing"),
    ("manifest", r"manifest\.json: corrupted"),
])
def test_a_damaged_file_is_named_at_load_with_the_previous_checkpoint(trained, criteo_dir, tmp_path, damage, expected):
    model_dir = tmp_path / "copy"
    shutil.copytree(trained[0], model_dir)
    path = model_dir / "checkpoints" / "step-8"
    previous = next(p for s, p in list_checkpoints(model_dir) if s < 8)
    if damage == "corrupt":
        with open(path / "state" / "__0_0.distcp", "r+b") as f:
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert check_checkpoint(path, hashes=False).state == "ok"  # sizes alone cannot see it
    elif damage == "truncate":
        with open(path / "state" / "__0_0.distcp", "r+b") as f:
            f.truncate(100)
    elif damage == "delete":
        (path / "meta.json").unlink()
    else:
        (path / "manifest.json").write_text((path / "manifest.json").read_text().replace('"size": ', '"size":  '))
    with pytest.raises(CheckpointError, match=expected) as caught:
        _train(model_dir, criteo_dir, *EVAL, "train.num_steps=10", resume=True)
    message = str(caught.value)
    assert f"checkpoint {path} is damaged" in message
    assert f"{previous} is the previous complete one" in message and "--resume" in message
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(path, {"model": trained[1].model})


def _flip_byte(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("damage", ["empty", "truncated", "flipped-and-empty", "digest-removed"])
def test_a_damaged_marker_makes_the_checkpoint_incomplete_never_unverified(trained, criteo_dir, tmp_path, damage):
    model_dir = tmp_path / "copy"
    shutil.copytree(trained[0], model_dir)
    path = model_dir / "checkpoints" / "step-8"
    marker = path / MARKER
    previous = next(p for s, p in list_checkpoints(model_dir) if s < 8)
    if damage == "empty":
        marker.write_bytes(b"")
    elif damage == "truncated":
        marker.write_bytes(marker.read_bytes()[:30])  # "step 8\nmanifest sha256 " and part of the digest
    elif damage == "flipped-and-empty":  # a corrupted shard must not load because the marker is damaged too
        _flip_byte(path / "state" / "__0_0.distcp")
        marker.write_bytes(b"")
    else:
        marker.write_text("step 8\n")  # what a marker written before manifests holds, next to a manifest
    assert check_checkpoint(path).state == "incomplete"
    assert [s for s, _ in list_checkpoints(model_dir)] == [int(previous.name.split("-")[1])]  # --resume skips it
    with pytest.raises(IncompleteCheckpointError, match=r"step-8: not a complete checkpoint \(its COMPLETE marker"):
        load_checkpoint(path, {"model": trained[1].model})
    with pytest.raises(IncompleteCheckpointError, match=r"step-8: not a complete checkpoint \(its COMPLETE marker"):
        _evaluate(model_dir, criteo_dir, str(path), f'model_dir="{model_dir}"')
    inspected = cli(["ckpt", "inspect", str(path)])
    assert inspected.returncode == EXIT_CHECKPOINT and "not checked: incomplete (its COMPLETE marker" in inspected.stdout
    assert "state       incomplete" in inspected.stdout


def test_evaluate_latest_reproduces_the_training_eval_and_records_it(trained, criteo_dir, tmp_path):
    model_dir = tmp_path / "copy"
    shutil.copytree(trained[0], model_dir)
    done = _evaluate(model_dir, criteo_dir, "latest", f'model_dir="{model_dir}"')
    last = _results(model_dir)[3]
    assert done.checkpoint == model_dir / "checkpoints" / "step-8" and not done.ema
    assert done.result.step == 8 and done.result.rows == last["rows"] == 3001
    assert done.result.metrics == {k: last[k] for k in ("auc", "loss/binary_cross_entropy")}
    recorded = _results(model_dir)[-1]
    assert recorded == {**last, "checkpoint": str(done.checkpoint), "command": "evaluate", "ema": False}

    best = read_best(model_dir)
    by_best = _evaluate(model_dir, criteo_dir, "best", f'model_dir="{model_dir}"')
    by_path = _evaluate(model_dir, criteo_dir, str(best.path(model_dir)), f'model_dir="{model_dir}"')
    by_name = _evaluate(model_dir, criteo_dir, f"step-{best.step}", f'model_dir="{model_dir}"')
    assert by_best.checkpoint == by_path.checkpoint == by_name.checkpoint == best.path(model_dir)
    assert by_best.result.metrics["loss/binary_cross_entropy"] == best.value
    assert by_path.result.metrics == by_name.result.metrics == by_best.result.metrics
    assert [r["step"] for r in _results(model_dir)] == [2, 4, 6, 8, 8, best.step, best.step, best.step]


def test_evaluate_refuses_what_it_cannot_use(trained, criteo_dir, tmp_path):
    model_dir = trained[0]
    with pytest.raises(CheckpointError, match=r"no complete checkpoint to evaluate \(train first"):
        _evaluate(tmp_path / "empty", criteo_dir, "latest", f'model_dir="{tmp_path / "empty"}"')
    with pytest.raises(CheckpointError, match=r"no best\.json: set eval\.best_metric"):
        _evaluate(tmp_path / "empty", criteo_dir, "best", f'model_dir="{tmp_path / "empty"}"')
    with pytest.raises(CheckpointError, match="step-99: no such checkpoint"):
        _evaluate(model_dir, criteo_dir, "step-99", f'model_dir="{model_dir}"')
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    (copy / "checkpoints" / "step-8" / MARKER).unlink()  # a save that never finished
    with pytest.raises(IncompleteCheckpointError, match=r"step-8: not a complete checkpoint .*the previous complete one is .*step-\d"):
        _evaluate(copy, criteo_dir, str(copy / "checkpoints" / "step-8"), f'model_dir="{copy}"')
    with pytest.raises(CheckpointError, match=r"written with another model or features.*\n  model\.deep_hidden_units: \[16, 8\] in the checkpoint, \[16\] now"):
        _evaluate(model_dir, criteo_dir, "latest", f'model_dir="{model_dir}"', "model.deep_hidden_units=[16]")


def test_an_unknown_best_metric_is_refused_before_training_naming_the_results(criteo_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"eval\.best_metric: 'acu' is not an eval result \(available: auc, loss/binary_cross_entropy; did you mean 'auc'\?\)"):
        _train(tmp_path / "run", criteo_dir, *EVAL, 'eval.best_metric="acu"')
    assert not (tmp_path / "run").exists()


def test_ckpt_ls_and_inspect(trained, tmp_path):
    model_dir = tmp_path / "copy"
    shutil.copytree(trained[0], model_dir)
    best = read_best(model_dir)
    (model_dir / "checkpoints" / "step-9" / "state").mkdir(parents=True)  # an interrupted save
    ls = cli(["ckpt", "ls", str(model_dir)])
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.splitlines()
    assert lines[0].split() == ["CHECKPOINT", "STEP", "EPOCH", "WORLD", "STATE", "SIZE"]
    assert lines[1].split()[:5] == [f"step-{best.step}", str(best.step), "0", "1", "complete"] and lines[1].endswith("best")
    assert lines[2].split()[:5] == ["step-8", "8", "0", "1", "complete"] and not lines[2].endswith("best")
    assert lines[3].split()[:5] == ["step-9", "9", "-", "-", "incomplete"]
    listed = json.loads(cli(["ckpt", "ls", str(model_dir), "--json"]).stdout)
    assert [(r["step"], r["complete"], r["best"]) for r in listed] == [(best.step, True, True), (8, True, False), (9, False, False)]

    path = model_dir / "checkpoints" / "step-8"
    text = cli(["ckpt", "inspect", str(path)])
    assert text.returncode == 0, text.stderr
    assert "manifest    ok (3 files" in text.stdout and "sizes and SHA-256 checked" in text.stdout
    assert "step        8, epoch 0, world size 1" in text.stdout
    assert "data        resumes in epoch 0, 8 step(s) into it; 2,048 of 12,000 rows of the epoch consumed" in text.stdout
    assert "lr          sparse 0.1, dense 0.1" in text.stdout
    assert "sharding    6 tables; table_wise 6; kernels fused 6; rank 0: 6" in text.stdout and "rank 0: 6" in text.stdout
    assert "tzrun_plugins.models (tzrec-run " in text.stdout
    described = json.loads(cli(["ckpt", "inspect", str(path), "--json"]).stdout)
    assert described["step"] == 8 and described["learning_rates"] == pytest.approx({"sparse": 0.1, "dense": 0.1})
    assert described["data"]["consumed_rows"] == 8 * 256 and described["manifest"]["state"] == "ok"
    assert {t["table"] for t in described["sharding"]["detail"]} >= {"cat_0_emb", "cat_1_emb", "cat_2_emb"}

    with open(path / "state" / ".metadata", "ab") as f:
        f.write(b"x")
    damaged = cli(["ckpt", "inspect", str(path)])
    assert damaged.returncode == EXIT_CHECKPOINT and "manifest    DAMAGED\n  state/.metadata: longer than written" in damaged.stdout
    incomplete = cli(["ckpt", "inspect", str(model_dir / "checkpoints" / "step-9")])
    assert incomplete.returncode == EXIT_CHECKPOINT and "incomplete (no COMPLETE marker" in incomplete.stdout
    missing = cli(["ckpt", "ls", str(tmp_path / "nowhere")])
    assert missing.returncode == EXIT_CHECKPOINT and "nowhere: no such model dir" in missing.stderr


def test_evaluate_command_on_one_process(trained, criteo_dir, tmp_path):
    model_dir = tmp_path / "copy"
    shutil.copytree(trained[0], model_dir)
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(model_dir=model_dir, train=criteo_dir / "train"))
    sets = [a for o in (f'data.eval_input="{criteo_dir / "eval"}"', *EVAL) for a in ("--set", o)]
    proc = cli(["evaluate", str(config), *sets, "--checkpoint", "best"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    best = read_best(model_dir)
    assert f"eval of {best.path(model_dir)} (step {best.step}) over 3001 rows: auc=" in proc.stdout
    recorded = _results(model_dir)[-1]
    assert recorded["command"] == "evaluate" and recorded["checkpoint"] == str(best.path(model_dir))
    assert recorded["loss/binary_cross_entropy"] == pytest.approx(best.value, abs=1e-6)
    none = cli(["evaluate", str(config), *sets, "--checkpoint", "latest", "--model-dir", str(tmp_path / "empty")])
    assert none.returncode == EXIT_CHECKPOINT and "no complete checkpoint to evaluate" in none.stderr



@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory, criteo_dir):
    """A 4-step run on 2 ranks (torchrun) with its config file and ``--set`` arguments."""
    root = tmp_path_factory.mktemp("ckpt2")
    config = root / "run.toml"
    config.write_text(CONFIG.format(model_dir=root / "run2", train=criteo_dir / "train"))
    sets = [a for o in (f'data.eval_input="{criteo_dir / "eval"}"', 'metrics=[{type = "auc"}]') for a in ("--set", o)]
    trained = warm_cli(["train", str(config), *sets, "--nproc-per-node", "2"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    return root / "run2", config, sets


@pytest.mark.multiproc
def test_two_ranks_hash_their_share_verify_together_and_evaluate_together(two_rank_run, tmp_path):
    model_dir, config, sets = two_rank_run
    path = model_dir / "checkpoints" / "step-4"
    listed = {f["path"] for f in json.loads((path / "manifest.json").read_text())["files"]}
    assert {"state/__0_0.distcp", "state/__1_0.distcp"} <= listed
    assert read_saved(path, "rank.0")["rng"] and read_saved(path, "rank.1")["rng"]  # each rank's own state
    trained_eval = [r for r in _results(model_dir) if "command" not in r][-1]  # the training run's own
    both = warm_cli(["evaluate", str(config), *sets, "--checkpoint", "latest", "--nproc-per-node", "2"])
    assert both.returncode == 0, both.stderr[-3000:]
    recorded = _results(model_dir)[-1]
    assert recorded["command"] == "evaluate" and recorded["rows"] == 3001 and recorded["auc"] == trained_eval["auc"]

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    with open(copy / "checkpoints" / "step-4" / "state" / "__1_0.distcp", "r+b") as f:
        f.truncate(10)
    damaged = warm_cli(["evaluate", str(config), *sets, "--checkpoint", "latest", "--nproc-per-node", "2",
                       "--model-dir", str(copy)], timeout=300)
    assert damaged.returncode != 0  # every rank stops; none hangs in the load
    assert "state/__1_0.distcp: truncated (10 bytes;" in damaged.stderr
    assert "There is no earlier complete checkpoint next to it" in damaged.stderr


@pytest.mark.multiproc
def test_a_two_rank_checkpoint_evaluates_to_the_same_values_on_one_rank(two_rank_run):
    model_dir, config, sets = two_rank_run
    trained_eval = [r for r in _results(model_dir) if "command" not in r][-1]
    one = cli(["evaluate", str(config), *sets, "--checkpoint", "latest"])
    assert one.returncode == 0, one.stderr[-3000:]
    assert _results(model_dir)[-1]["auc"] == pytest.approx(trained_eval["auc"], abs=1e-6)


def _eval_with_bad_rows(criteo_dir: Path, out: Path) -> Path:
    """The eval data with every 97th row's ``cat_0`` outside its 1,000 buckets (a bad row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True)
    for path in sorted((criteo_dir / "eval").glob("*.parquet")):
        table = pq.read_table(path)
        ids = table.column("cat_0").to_numpy().copy()
        ids[::97] = 1_000_000
        table = table.set_column(table.schema.get_field_index("cat_0"), "cat_0", pa.array(ids))
        pq.write_table(table, out / path.name, row_group_size=700)
    return out


@pytest.mark.parametrize("options", [
    ('data.on_bad_row="skip"',),
    ('data.on_bad_row="skip"', "data.eval_batch_size=700", "eval.num_steps=3", "data.num_workers=1"),
], ids=["skip", "skip-batches-steps-workers"])
def test_training_eval_and_evaluate_of_its_checkpoint_agree_with_every_row_option(criteo_dir, tmp_path, options):
    # training and `tzrec-run evaluate` take their data from one Session: the same rows, the same numbers
    bad = _eval_with_bad_rows(criteo_dir, tmp_path / "eval_bad")
    model_dir = tmp_path / "run"
    overrides = (f'data.eval_input="{bad}"', 'metrics=[{type = "auc"}]', "train.num_steps=4", *options)
    trained = _train(model_dir, criteo_dir, *overrides).eval
    raw, registries = _config(model_dir, criteo_dir, *overrides)
    done = evaluate_checkpoint(Session(load_config(raw, registries), raw, make_plugin_manager(), registries), "latest")
    assert trained is not None and done.result.step == trained.step == 4
    assert done.result.rows == trained.rows < 3001  # the bad rows were left out both times
    assert done.result.metrics == trained.metrics  # to the last bit
