"""``inverse_sqrt`` against hand tables, with frozen groups, and restored from a checkpoint."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

from tzrun.testing import load_config_text, tiny_config_text
from tzrun_contrib_optimizers.options import InverseSqrtConfig
from tzrun_contrib_optimizers.schedules import InverseSqrtLR

# the schedules here step without training, which torch points out
pytestmark = pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler\.step\(\)` before:UserWarning")


def _lrs(cfg: InverseSqrtConfig, base: float, positions: int) -> list[float]:
    """The lr of positions 0..positions-1, read from the optimizer as the runner does."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    scheduler = InverseSqrtLR(opt, cfg)
    out = []
    for _ in range(positions):
        out.append(opt.param_groups[0]["lr"])
        scheduler.step()
    return out


def test_warmup_then_fairseq_inverse_sqrt_by_hand():
    # base 0.4, W = 4: linear 0 -> 0.4 over k = 0..3, then 0.4 * sqrt(4 / k)
    lrs = _lrs(InverseSqrtConfig(warmup_size=4), 0.4, 101)
    table = {0: 0.0, 1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 9: 0.4 * 2 / 3, 16: 0.2, 25: 0.16, 64: 0.1, 100: 0.08}
    for k, lr in table.items():
        assert lrs[k] == pytest.approx(lr, rel=1e-12), k
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))  # decays monotonically after the warmup


def test_warmup_start_timescale_and_floor_by_hand():
    # warmup from 0.2: k = 2 is half way from 0.2 to 0.4
    assert _lrs(InverseSqrtConfig(warmup_size=4, warmup_learning_rate=0.2), 0.4, 3)[2] == pytest.approx(0.3)
    # no warmup: T = 1, lr = base / sqrt(k + 1): k = 0, 3, 15 -> 1, 1/2, 1/4
    lrs = _lrs(InverseSqrtConfig(), 1.0, 16)
    assert [lrs[0], lrs[3], lrs[15]] == pytest.approx([1.0, 0.5, 0.25])
    # timescale 9: lr = sqrt(9 / (k + 9)): k = 27 -> 1/2;  and a floor of 0.3 at k = 15 (0.25 otherwise)
    assert _lrs(InverseSqrtConfig(timescale=9), 1.0, 28)[27] == pytest.approx(0.5)
    assert _lrs(InverseSqrtConfig(min_learning_rate=0.3), 1.0, 16)[15] == pytest.approx(0.3)
    # warmup 2 and timescale 8: k = 2 + 24 gives sqrt(8 / 32) = 1/2
    assert _lrs(InverseSqrtConfig(warmup_size=2, timescale=8), 1.0, 27)[26] == pytest.approx(0.5)


def test_every_group_scales_its_own_base_and_a_frozen_group_stays_at_zero():
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 0.4}, {"params": [params[1]], "lr": 0.0},
                           {"params": [params[2]], "lr": 0.04}], lr=1.0)
    scheduler = InverseSqrtLR(opt, InverseSqrtConfig(warmup_size=4))
    for _ in range(16):
        scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2, 0.0, 0.02])


@pytest.mark.parametrize("by_epoch", [False, True])
def test_a_restored_schedule_continues_where_it_stopped(by_epoch):
    cfg = InverseSqrtConfig(warmup_size=3, by_epoch=by_epoch)
    uninterrupted = _lrs(cfg, 0.3, 12)

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
    scheduler = InverseSqrtLR(opt, cfg)
    assert scheduler.by_epoch is by_epoch  # the runner steps it per epoch or per batch
    for _ in range(7):
        scheduler.step()
    buffer = io.BytesIO()
    torch.save(scheduler.state_dict(), buffer)
    json.dumps(scheduler.state_dict())  # plain values only
    buffer.seek(0)

    fresh_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)  # lr back at its base
    fresh = InverseSqrtLR(fresh_opt, cfg)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    resumed = []
    for _ in range(7, 12):
        resumed.append(fresh_opt.param_groups[0]["lr"])
        fresh.step()
    assert resumed == pytest.approx(uninterrupted[7:], rel=1e-15)


def test_restoring_steps_into_epochs_warns():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
    saved = InverseSqrtLR(opt, InverseSqrtConfig(by_epoch=False)).state_dict()
    with pytest.warns(UserWarning, match="counted steps and the config counts epochs"):
        InverseSqrtLR(opt, InverseSqrtConfig(by_epoch=True)).load_state_dict(saved)


def test_the_schedule_is_named_in_toml(tzrun_pm, tmp_path):
    text = tiny_config_text(tmp_path / "data", tmp_path / "run")
    schedule = 'train.dense_optimizer={type="sgd", lr=0.1, lr_schedule={type="inverse_sqrt", warmup_size=100, by_epoch=true}}'
    cfg, registries = load_config_text(text, tzrun_pm, [schedule])
    component = cfg.train.dense_optimizer.fields.lr_schedule
    assert component.config == InverseSqrtConfig(warmup_size=100, by_epoch=True)
    entry = registries["lr_scheduler"].get(component.type, "train.dense_optimizer.lr_schedule.type")
    assert entry.distribution == "tzrun-contrib-optimizers"
    assert math.isclose(entry.build(component.config, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)).get_last_lr()[0], 0.0)
