"""Exact resume in one process: a run stopped by a signal at step k and resumed ends with
bit-identical weights and the same loss sequence as an uninterrupted run, with DataLoader
workers, across an epoch boundary; the policy for a model dir that has checkpoints."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

import tzrun
from tests.integration.test_update_path import CONFIG, _local, _process_group, weights  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.errors import TzrunError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.trainer import train
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

OVERRIDES = (
    "data.batch_size=1024",  # 12,000 rows: 12 steps per epoch
    "data.num_workers=2",
    "train.num_steps=18",
    "train.save_checkpoints_steps=5",
    'train.sparse_optimizer={type = "rowwise_adagrad", lr = 0.05}',
    'train.dense_optimizer={type = "adam", lr = 0.01, lr_schedule = {type = "exponential_decay", decay_size = 3, decay_factor = 0.8}}',
    'train_metrics=[{type = "auc", decay_step = 4}]',
)


class Losses:
    """Records each step's loss and lr; optionally sends itself a signal after a step."""

    def __init__(self, signal_at: int | None = None, signum: int = signal.SIGUSR1) -> None:
        self.steps: dict[int, tuple[float, float]] = {}
        self.metrics: dict[int, dict[str, float]] = {}
        self.signal_at, self.signum = signal_at, signum

    @tzrun.hookimpl
    def tzrun_after_train_step(self, run, step):
        self.steps[step.step] = (float(step.loss), step.learning_rates["dense"])
        self.metrics[step.step] = dict(step.metrics)
        if step.step == self.signal_at:
            os.kill(os.getpid(), self.signum)


def _train(tmp_path: Path, criteo_dir: Path, name: str, recorder: Losses, *extra: str, resume: bool = False,
           overwrite: bool = False, epochs: int | None = None):
    pm = make_plugin_manager(plugins=[("losses", recorder)])
    registries = collect_registries(pm)
    text = CONFIG.format(model_dir=tmp_path / name, train=criteo_dir / "train")
    overrides = list(OVERRIDES)
    if epochs is not None:
        text = text.replace("num_steps = 4", f"num_epochs = {epochs}")
        overrides.remove("train.num_steps=18")
    raw = parse_config(text, "<test>", [*overrides, *extra])
    return train(Session(load_config(raw, registries), raw, pm, registries), resume=resume, overwrite=overwrite)


@pytest.mark.parametrize("shuffle", [0, 2048])
def test_a_run_stopped_by_a_signal_and_resumed_is_the_uninterrupted_run(tmp_path, criteo_dir, shuffle):
    shuffled = f"data.shuffle_buffer_rows={shuffle}"
    whole = Losses()
    uninterrupted = _train(tmp_path, criteo_dir, "whole", whole, shuffled)
    assert uninterrupted.steps == 18 and sorted(whole.steps) == list(range(1, 19))

    first = Losses(signal_at=7)
    stopped = _train(tmp_path, criteo_dir, "split", first, shuffled)
    assert stopped.stopped_by == "SIGUSR1" and stopped.steps == 7
    assert [s for s, _ in list_checkpoints(tmp_path / "split")] == [5, 7]
    meta = json.loads((tmp_path / "split" / "checkpoints" / "step-7" / "meta.json").read_text())
    assert meta["data"]["epoch"] == 0 and meta["data"]["step_in_epoch"] == 7
    assert sum(b - a for a, b in meta["data"]["consumed_rows"]) == 7 * 1024
    # shuffled, the rows of a half-read window are scattered; in order they are whole runs
    assert (len(meta["data"]["consumed_rows"]) > 2) == bool(shuffle)

    second = Losses(signal_at=13)  # stopped again in the second epoch
    again = _train(tmp_path, criteo_dir, "split", second, shuffled, resume=True)
    assert again.stopped_by == "SIGUSR1" and again.steps == 13
    third = Losses()
    resumed = _train(tmp_path, criteo_dir, "split", third, shuffled, resume=True)
    assert resumed.steps == 18 and resumed.stopped_by is None

    pieces = {**first.steps, **second.steps, **third.steps}
    assert sorted(pieces) == list(range(1, 19))
    assert pieces == whole.steps  # the same loss and lr at every step, exactly
    assert third.metrics[18] == whole.metrics[18]  # the decayed train metric continued too
    a, b = weights(uninterrupted.model), weights(resumed.model)
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_resuming_with_other_workers_trains_the_rest_of_the_epoch_once(tmp_path, criteo_dir):
    first = Losses(signal_at=5)
    _train(tmp_path, criteo_dir, "run", first, epochs=1)
    resumed = _train(tmp_path, criteo_dir, "run", Losses(), "data.num_workers=0", "data.batch_size=2000",
                     resume=True, epochs=1)
    # 12,000 - 5 * 1,024 = 6,880 rows left, read in batches of 2,000: 4 more steps
    assert resumed.steps == 5 + 4
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step-9" / "meta.json").read_text())
    assert meta["data"]["epoch"] == 1 and meta["data"]["step_in_epoch"] == 0  # the epoch is done


def test_a_model_dir_with_checkpoints_needs_resume_or_overwrite(tmp_path, criteo_dir):
    _train(tmp_path, criteo_dir, "run", Losses(), "train.num_steps=2")
    with pytest.raises(TzrunError, match=r"already has checkpoints \(latest: step-2\); pass --resume to continue from it, --overwrite"):
        _train(tmp_path, criteo_dir, "run", Losses(), "train.num_steps=2")
    done = _train(tmp_path, criteo_dir, "run", Losses(), "train.num_steps=2", resume=True)
    assert done.steps == 2  # nothing left to train
    # an incomplete checkpoint directory (a save that was killed) is removed, never loaded
    broken = tmp_path / "run" / "checkpoints" / "step-3"
    (broken / "state").mkdir(parents=True)
    more = Losses()
    _train(tmp_path, criteo_dir, "run", more, "train.num_steps=4", resume=True)
    assert sorted(more.steps) == [3, 4]
    assert not broken.exists() and (tmp_path / "run" / "checkpoints" / "step-4" / "COMPLETE").is_file()


class NaNAtStep:
    """A plugin with a loss that is NaN at its n-th training call: ``how = "scale"`` multiplies
    it by NaN (NaN gradients), ``"add"`` adds a NaN constant (the gradients stay finite)."""

    def __init__(self, n: int, how: str = "scale") -> None:
        self.n, self.how = n, how

    @tzrun.hookimpl
    def tzrun_register_losses(self, register):
        import attrs

        @attrs.frozen
        class Options:
            pass

        n, how = self.n, self.how

        class Loss(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.calls = 0  # per instance: the component check before training builds its own

            def forward(self, logits, label, weight):
                if self.training:
                    self.calls += 1
                value = torch.nn.functional.binary_cross_entropy_with_logits(logits, label, weight)
                if self.calls != n or not self.training:
                    return value
                return value * float("nan") if how == "scale" else value + torch.tensor(float("nan"))

        register("nan_at", config=Options, build=lambda cfg: Loss())


def _train_nan(tmp_path, criteo_dir, name, policy, recorder):
    pm = make_plugin_manager(plugins=[("nan", NaNAtStep(4)), ("losses", recorder)])
    registries = collect_registries(pm)
    text = CONFIG.format(model_dir=tmp_path / name, train=criteo_dir / "train")
    raw = parse_config(text, "<test>", ['losses=[{type = "nan_at"}]', "train.num_steps=6",
                                        "train.save_checkpoints_steps=3", f'train.on_nonfinite_loss="{policy}"'])
    return train(Session(load_config(raw, registries), raw, pm, registries))


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_checkpoint(tmp_path, criteo_dir):
    from tzrun.errors import NonFiniteLossError

    with pytest.raises(NonFiniteLossError, match=r"step 4 \(epoch 0, batch 4 of the epoch\) on rank 0: the training loss is nan"):
        _train_nan(tmp_path, criteo_dir, "err", "error", Losses())
    assert [s for s, _ in list_checkpoints(tmp_path / "err")] == [3]


def _optimizer_state(optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the optimizers' state by its path in their state dict."""
    out = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, torch.Tensor) or hasattr(value, "local_shards"):
            out[prefix] = _local(value).detach().clone()

    walk("state", optimizer.state_dict()["state"])
    return out


@pytest.mark.parametrize("sparse", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize(("pipeline", "how"), [("sparse_dist", "add"), ("base", "add"), ("sparse_dist", "scale")])
def test_a_nan_loss_can_skip_its_step_without_touching_the_weights(tmp_path, criteo_dir, caplog, sparse, pipeline, how):
    import logging

    class Snap:
        def __init__(self):
            self.by_step = {}

        @tzrun.hookimpl
        def tzrun_after_train_step(self, run, step):
            self.by_step[step.step] = ({k: v.clone() for k, v in weights(run.model).items()},
                                       _optimizer_state(run.optimizer))

    snap = Snap()
    pm = make_plugin_manager(plugins=[("nan", NaNAtStep(4, how)), ("snap", snap)])
    registries = collect_registries(pm)
    text = CONFIG.format(model_dir=tmp_path / "skip", train=criteo_dir / "train")
    raw = parse_config(text, "<test>", ['losses=[{type = "nan_at"}]', "train.num_steps=6", 'train.on_nonfinite_loss="skip"',
                                        f'train.sparse_optimizer={{type = "{sparse}", lr = 0.05}}',
                                        f'train.pipeline={{type = "{pipeline}"}}'])
    with caplog.at_level(logging.WARNING, logger="tzrun"):
        result = train(Session(load_config(raw, registries), raw, pm, registries))
    assert result.steps == 6
    assert "step 4: the loss is not finite; its update was skipped (1 such step(s) so far" in caplog.text
    (w3, s3), (w4, s4), (w6, s6) = snap.by_step[3], snap.by_step[4], snap.by_step[6]
    assert any(k.startswith("table:") for k in w4) and set(w4) == set(w3)
    for key, value in w4.items():  # step 4 changed nothing, embeddings included, bit for bit
        assert torch.equal(value, w3[key]), key
    assert set(s4) == set(s3) and (sparse == "sgd" or s4)
    for key, value in s4.items():  # nor any optimizer state (accumulators, step counts)
        assert torch.equal(value, s3[key]), key
    assert all(torch.isfinite(v).all() for v in (*w6.values(), *s6.values()))
    assert any(not torch.equal(w6[k], w4[k]) for k in w6 if k.startswith("table:"))


def test_checkpoints_at_epoch_ends(tmp_path, criteo_dir):
    # 12,000 rows in batches of 4,096: 3 steps per epoch, the last one short
    result = _train(tmp_path, criteo_dir, "epochs", Losses(), "data.batch_size=4096", "train.save_checkpoints_steps=0",
                    "train.save_checkpoints_epochs=1", epochs=2)
    assert result.steps == 6
    assert [s for s, _ in list_checkpoints(tmp_path / "epochs")] == [3, 6]
    meta = json.loads((tmp_path / "epochs" / "checkpoints" / "step-3" / "meta.json").read_text())
    assert meta["data"]["epoch"] == 1 and meta["data"]["step_in_epoch"] == 0


def test_resuming_with_another_plugin_set_warns(tmp_path, criteo_dir, caplog):
    import logging

    _train(tmp_path, criteo_dir, "run", Losses(), "train.num_steps=2")

    class Other:
        pass

    pm = make_plugin_manager(plugins=[("other_plugin", Other())])
    registries = collect_registries(pm)
    raw = parse_config(CONFIG.format(model_dir=tmp_path / "run", train=criteo_dir / "train"), "<test>",
                       [*OVERRIDES, "train.num_steps=3"])
    with caplog.at_level(logging.WARNING, logger="tzrun"):
        train(Session(load_config(raw, registries), raw, pm, registries), resume=True)
    assert "the plugin set changed since the checkpoint" in caplog.text
    assert "losses" in caplog.text and "other_plugin" in caplog.text


def test_every_plugin_hears_of_a_failed_run_even_when_one_raises_in_its_clean_up(tmp_path, criteo_dir):
    from tzrun.errors import NonFiniteLossError

    seen = []

    class BrokenCleanUp:
        @tzrun.hookimpl
        def tzrun_on_train_error(self, run, error):
            raise RuntimeError("broken clean-up")

    class CleanUp:
        @tzrun.hookimpl
        def tzrun_on_train_error(self, run, error):
            seen.append(type(error).__name__)

    # called in registration order: the broken one first, and the next one still runs
    pm = make_plugin_manager(plugins=[("nan", NaNAtStep(2)), ("broken", BrokenCleanUp()), ("clean", CleanUp())])
    registries = collect_registries(pm)
    text = CONFIG.format(model_dir=tmp_path / "err", train=criteo_dir / "train")
    raw = parse_config(text, "<test>", ['losses=[{type = "nan_at"}]', "train.num_steps=4"])
    import re
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with pytest.raises(NonFiniteLossError, match="step 2 "):  # the run's own error, not the plugin's
            train(Session(load_config(raw, registries), raw, pm, registries))
    assert seen == ["NonFiniteLossError"]
    assert any(re.search("broken.*raised in tzrun_on_train_error: RuntimeError: broken clean-up", str(w.message))
               for w in caught)
