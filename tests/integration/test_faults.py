"""Faults in real 2-rank jobs (torchrun on CPU): a signal to one rank, a rank killed while
saving, resuming on another number of ranks, ranks with uneven data. Each interrupted job is
compared with the uninterrupted one."""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLE, cli, example_overrides
from tests.warm_ranks import warm_cli
from tests.integration import fault_plugin
from tests.integration.test_train import _results, _sets
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.signals import EXIT_STOPPED_BY_SIGNAL

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

# 12,000 rows over 2 ranks in batches of 1,024: 6 steps per epoch; 10 steps cross an epoch
STEPS = ("train.num_steps=10", "train.save_checkpoints_steps=3", "data.num_workers=1")


def _overrides(criteo_dir, model_dir, *extra):
    return example_overrides(criteo_dir, model_dir, *STEPS, *extra)


def _train(criteo_dir, model_dir, *args, env=None, nproc=2, extra=()):
    config = EXAMPLE.read_text().replace("num_epochs = 1", "")
    path = model_dir.parent / f"{model_dir.name}.toml"
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config)
    cmd = ["train", str(path), *_sets(_overrides(criteo_dir, model_dir, *extra))]
    if nproc == 1 and env is None:
        return cli([*cmd, *args])  # one process: in this one
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc)]
    # the faults (env: the fault plugin) act inside a rank, so the ranks start warm too
    return warm_cli([*cmd, *args], env=env)


@pytest.fixture(scope="module")
def uninterrupted(criteo_dir, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("whole") / "run"
    proc = _train(criteo_dir, model_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _results(model_dir)


def test_sigterm_to_one_rank_stops_both_and_torchrun_resumes_the_same_run(criteo_dir, tmp_path, uninterrupted):
    model_dir = tmp_path / "run"
    env = {**fault_plugin.install(tmp_path / "site"), fault_plugin.ENV: "signal@4:1:SIGTERM"}
    proc = _train(criteo_dir, model_dir, "--max-restarts", "1", "--resume", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stopped by" in proc.stderr and f"exit code {EXIT_STOPPED_BY_SIGNAL}" in proc.stderr
    assert "resuming from" in proc.stderr
    import re

    stopped_at = [int(n) for n in re.findall(r"stopped by (?:SIG\w+|a signal on another rank) at step (\d+)", proc.stderr)]
    assert stopped_at and 4 <= stopped_at[0] <= 6  # at the next agreement (every 8 steps, or a checkpoint)
    assert stopped_at[0] in [s for s, _ in list_checkpoints(model_dir)]  # ... with its checkpoint written
    final = _results(model_dir)[-1]
    assert final["step"] == 10
    assert final == uninterrupted[-1]  # the same eval values, to the last bit


@pytest.mark.parametrize("extra", [(), ("train.async_checkpoint=true",)], ids=["sync", "async"])
def test_a_rank_killed_while_saving_leaves_the_previous_checkpoint_and_the_job_recovers(criteo_dir, tmp_path, uninterrupted,
                                                                                         extra):
    model_dir = tmp_path / "run"
    env = {**fault_plugin.install(tmp_path / "site"), fault_plugin.ENV: "kill-during-save@6:0"}
    proc = _train(criteo_dir, model_dir, "--max-restarts", "1", "--resume", env=env, extra=extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in proc.stderr and "step-3" in proc.stderr.split("resuming from", 1)[1].splitlines()[0]
    assert [s for s, _ in list_checkpoints(model_dir)] == [3, 6, 9, 10]
    assert _results(model_dir)[-1] == uninterrupted[-1]


@pytest.mark.parametrize(("first", "then"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(criteo_dir, tmp_path, first, then):
    model_dir = tmp_path / "run"
    proc = _train(criteo_dir, model_dir, nproc=first, extra=("train.num_steps=3",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _train(criteo_dir, model_dir, "--resume", nproc=then, extra=("train.num_steps=5",))
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta3 = json.loads((model_dir / "checkpoints" / "step-3" / "meta.json").read_text())
    meta5 = json.loads((model_dir / "checkpoints" / "step-5" / "meta.json").read_text())
    assert meta3["world_size"] == first and meta5["world_size"] == then
    consumed = sum(b - a for a, b in meta5["data"]["consumed_rows"])
    # 3 steps of `first` ranks, then 2 steps of `then` ranks, each step 1,024 rows per rank
    assert consumed == 3 * 1024 * first + 2 * 1024 * then
    assert meta5["data"]["layout"]["world_size"] == then and meta5["data"]["layout"]["rows"] is not None
    assert "shared out across" in proc.stderr
    assert _results(model_dir)[-1]["step"] == 5


def test_ranks_with_uneven_data_never_hang(criteo_dir, tmp_path):
    model_dir = tmp_path / "run"
    # the 3,001 eval rows as training data, batches of 1,500: rank 0 has 1 batch, rank 1 has 2
    overrides = [o.replace(str(criteo_dir / "train"), str(criteo_dir / "eval")) for o in example_overrides(
        criteo_dir, model_dir, "data.batch_size=1500", "data.eval_batch_size=1000", "train.num_epochs=2")]
    # a dump every step: a collective in tzrun_after_train_step, which rank 0 reaches at its padding steps
    overrides.append('train.stages=[{type = "embedding_deltas", every_n_steps = 1}]')
    proc = warm_cli(["train", str(EXAMPLE), *_sets(overrides), "--nproc-per-node", "2"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _results(model_dir)[-1]
    assert result["step"] == 4 and result["rows"] == 3001  # 2 steps per epoch on every rank
    from tzrun_serving.deltas import list_dumps, read_dump

    dumps = list_dumps(model_dir / "embedding_deltas")
    assert [s for s, _ in dumps] == [1, 2, 3, 4] and all(len(read_dump(p)["parts"]) == 2 for _, p in dumps)
