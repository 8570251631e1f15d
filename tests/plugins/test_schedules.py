"""First-party LR schedules against lr tables computed by hand, by step and by epoch, across a
checkpoint restore, and their config errors."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import LRScheduler

from tzrun.errors import ConfigError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.testing import load_config_text
from tests.core.test_config import MINIMAL

# no "lr_scheduler.step() before optimizer.step()" or any other UserWarning from our use
pytestmark = pytest.mark.filterwarnings("error::UserWarning")

BASE_LR = 0.1
BATCHES_PER_EPOCH = 3

# (schedule table, lr of the group with base lr 0.1 at k = 0, 1, 2, ...), computed by hand:
# warmup  w0 + (0.1 - w0) * k / W;  cosine  min + (0.1 - min) * (1 + cos(pi * t / T)) / 2,
# with cos(pi/3) = 1/2, cos(pi/6) = sqrt(3)/2, cos(pi/12) = (sqrt(6) + sqrt(2)) / 4.
TABLES: dict[str, tuple[str, list[float]]] = {
    "constant": ('{ type = "constant" }', [0.1] * 8),
    "exponential_staircase": (
        '{ type = "exponential_decay", decay_size = 2, decay_factor = 0.5, warmup_size = 3,'
        " warmup_learning_rate = 0.01, min_learning_rate = 0.02 }",
        # warmup 0.01, 0.04, 0.07; then 0.1 * 0.5 ** floor((k - 3) / 2), 0.0125 floored to 0.02
        [0.01, 0.04, 0.07, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025, 0.02, 0.02],
    ),
    "exponential_smooth": (
        '{ type = "exponential_decay", decay_size = 2, decay_factor = 0.25, staircase = false, min_learning_rate = 0.01 }',
        # 0.1 * 0.25 ** (k / 2) = 0.1 * 0.5 ** k; 0.00625 floored to 0.01
        [0.1, 0.05, 0.025, 0.0125, 0.01, 0.01],
    ),
    "manual_step": (
        '{ type = "manual_step", schedule_sizes = [2, 5], learning_rates = [0.05, 0.01] }',
        [0.1, 0.1, 0.05, 0.05, 0.05, 0.01, 0.01, 0.01],
    ),
    "manual_step_warmup": (
        '{ type = "manual_step", schedule_sizes = [4, 6], learning_rates = [0.02, 0.001], warmup = true }',
        # 0.1 + (0.02 - 0.1) * k / 4 before k = 4
        [0.1, 0.08, 0.06, 0.04, 0.02, 0.02, 0.001, 0.001],
    ),
    "cosine": (
        '{ type = "cosine_annealing", T_max = 3, min_learning_rate = 0.01, warmup_size = 2, warmup_learning_rate = 0.02 }',
        # warmup 0.02, 0.06; cosine 0.1, 0.01 + 0.09 * 3/4, 0.01 + 0.09 * 1/4, 0.01; then 0.01
        [0.02, 0.06, 0.1, 0.0775, 0.0325, 0.01, 0.01, 0.01],
    ),
    "warm_restarts": (
        '{ type = "cosine_annealing_warm_restarts", T_0 = 3, min_learning_rate = 0.01 }',
        [0.1, 0.0775, 0.0325, 0.1, 0.0775, 0.0325, 0.1, 0.0775],
    ),
    "warm_restarts_mult": (
        '{ type = "cosine_annealing_warm_restarts", T_0 = 3, T_mult = 2, warmup_size = 2 }',
        # warmup 0, 0.05; cycles of 3 (k = 2..4), 6 (k = 5..10), 12 (k = 11..): 0.05 * (1 + cos)
        [0.0, 0.05, 0.1, 0.075, 0.025, 0.1, 0.09330127018922193, 0.075, 0.05, 0.025, 0.006698729810778068,
         0.1, 0.09829629131445341],
    ),
}


@pytest.fixture(scope="module")
def registries():
    return collect_registries(make_plugin_manager())


def schedule_component(table: str, by_epoch: bool = False) -> Any:
    """The ``lr_schedule`` component of the dense optimizer, loaded from TOML."""
    overrides = [f"train.dense_optimizer.lr_schedule={table}"]
    if by_epoch and "constant" not in table:
        overrides.append("train.dense_optimizer.lr_schedule.by_epoch=true")
    cfg, _ = load_config_text(MINIMAL, overrides=overrides)
    return cfg.train.dense_optimizer.fields.lr_schedule


def sgd_with_two_groups() -> torch.optim.Optimizer:
    """SGD over two param groups: base lr 0.1, and a frozen part with base lr 0."""
    weights, frozen = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    return torch.optim.SGD([{"params": [weights], "lr": BASE_LR}, {"params": [frozen], "lr": 0.0}])


def build(registries, component, optimizer) -> LRScheduler:
    return registries["lr_scheduler"].get(component.type, "x").build(component.config, optimizer)


def train(optimizer, scheduler, batches: int, by_epoch: bool, start_batch: int = 0) -> list[list[float]]:
    """Simulate the runner: the lrs every batch trains with, stepping the scheduler after every
    batch, or after the last batch of every epoch with ``by_epoch``."""
    seen = []
    for n in range(start_batch, start_batch + batches):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        if not by_epoch or (n + 1) % BATCHES_PER_EPOCH == 0:
            scheduler.step()
    return seen


def per_batch(table: list[float], by_epoch: bool) -> list[float]:
    """The lr of every batch: the table's, each repeated for every batch of its epoch with ``by_epoch``."""
    return [lr for lr in table for _ in range(BATCHES_PER_EPOCH)] if by_epoch else table


@pytest.mark.parametrize("by_epoch", [False, True], ids=["by_step", "by_epoch"])
@pytest.mark.parametrize("name", list(TABLES))
def test_lr_of_every_batch_matches_the_hand_computed_table(registries, name, by_epoch):
    table, lrs = TABLES[name]
    component = schedule_component(table, by_epoch)
    optimizer = sgd_with_two_groups()
    scheduler = build(registries, component, optimizer)
    assert isinstance(scheduler, LRScheduler)
    assert scheduler.by_epoch is (by_epoch and name != "constant")
    per_epoch = BATCHES_PER_EPOCH if scheduler.by_epoch else 1
    seen = train(optimizer, scheduler, len(lrs) * per_epoch, scheduler.by_epoch)
    assert [lr for lr, _ in seen] == pytest.approx(per_batch(lrs, scheduler.by_epoch), rel=1e-12, abs=1e-15)
    assert [frozen for _, frozen in seen] == [0.0] * len(seen)  # exactly 0, whatever warmup or min lr say


@pytest.mark.parametrize("by_epoch", [False, True], ids=["by_step", "by_epoch"])
@pytest.mark.parametrize("name", list(TABLES))
def test_a_restored_schedule_continues_where_it_stopped(registries, name, by_epoch):
    table, lrs = TABLES[name]
    component = schedule_component(table, by_epoch)
    optimizer = sgd_with_two_groups()
    scheduler = build(registries, component, optimizer)
    total = len(lrs) * (BATCHES_PER_EPOCH if scheduler.by_epoch else 1)
    uninterrupted = train(optimizer, scheduler, total, scheduler.by_epoch)

    stop = 5 if scheduler.by_epoch else 4  # mid-epoch with by_epoch (epoch 1, after its 2nd batch)
    optimizer = sgd_with_two_groups()
    scheduler = build(registries, component, optimizer)
    before = train(optimizer, scheduler, stop, scheduler.by_epoch)
    buffer = io.BytesIO()
    torch.save(scheduler.state_dict(), buffer)  # as the checkpoint writes it
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    optimizer = sgd_with_two_groups()
    scheduler = build(registries, component, optimizer)  # at k = 0 until the state is loaded
    scheduler.load_state_dict(state)
    after = train(optimizer, scheduler, total - stop, scheduler.by_epoch, start_batch=stop)
    assert before + after == uninterrupted
    assert scheduler.get_last_lr() == [g["lr"] for g in optimizer.param_groups]


def test_schedules_drive_torchrec_keyed_and_combined_optimizers(registries):
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    def keyed(lr: float) -> KeyedOptimizerWrapper:
        params = {"w": torch.nn.Parameter(torch.ones(2))}
        return KeyedOptimizerWrapper(params, lambda ps: torch.optim.SGD(ps, lr=lr))

    table, lrs = TABLES["exponential_staircase"]
    component = schedule_component(table)
    optimizer = CombinedOptimizer([("dense", keyed(BASE_LR)), ("frozen", keyed(0.0))])
    scheduler = build(registries, component, optimizer)
    seen = train(optimizer, scheduler, 5, False)
    assert [lr for lr, _ in seen] == pytest.approx(lrs[:5], rel=1e-12)
    assert [frozen for _, frozen in seen] == [0.0] * 5

    restored_optimizer = CombinedOptimizer([("dense", keyed(BASE_LR)), ("frozen", keyed(0.0))])
    restored = build(registries, component, restored_optimizer)
    restored.load_state_dict(scheduler.state_dict())
    inner = [opt.param_groups[0]["lr"] for _, opt in restored_optimizer.optimizers]
    assert inner == pytest.approx([lrs[5], 0.0], rel=1e-12)  # written through to the wrapped optimizers


def test_warm_restarts_restart_exactly_on_their_step_for_long_runs(registries):
    # T_0 = 1, T_mult = 3: cycle n starts at e = 1 + 3 + ... + 3**(n-1) = (3**n - 1) / 2
    component = schedule_component('{ type = "cosine_annealing_warm_restarts", T_0 = 1, T_mult = 3 }')
    optimizer = sgd_with_two_groups()
    scheduler = build(registries, component, optimizer)
    for n in range(1, 25):
        start = (3**n - 1) // 2
        scheduler.load_state_dict({"last_epoch": start})
        assert optimizer.param_groups[0]["lr"] == pytest.approx(BASE_LR, rel=1e-12)
        if n >= 8:  # the last step of the cycle before, 3**(n-1) >= 2187 steps long, is near 0
            scheduler.load_state_dict({"last_epoch": start - 1})
            assert optimizer.param_groups[0]["lr"] < 1e-6


def test_state_dict_is_the_position_only(registries):
    component = schedule_component(TABLES["cosine"][0], by_epoch=True)
    optimizer = sgd_with_two_groups()
    scheduler = build(registries, component, optimizer)
    train(optimizer, scheduler, 2 * BATCHES_PER_EPOCH, True)
    assert scheduler.state_dict() == {"last_epoch": 2, "step_count": 3, "by_epoch": True}


def test_loading_a_state_counted_in_other_units_warns(registries):
    optimizer = sgd_with_two_groups()
    scheduler = build(registries, schedule_component(TABLES["cosine"][0], by_epoch=True), optimizer)
    with pytest.warns(UserWarning, match="checkpoint counted steps and the config counts epochs"):
        scheduler.load_state_dict({"last_epoch": 3, "step_count": 4, "by_epoch": False})
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0775, rel=1e-12)


def problems_of(table: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(MINIMAL, overrides=[f"train.dense_optimizer.lr_schedule={table}"])
    return [str(p) for p in info.value.problems]


PATH = "train.dense_optimizer.lr_schedule"


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('{ type = "exponential_decay", decay_size = 0 }', f"{PATH}: decay_size must be an integer of at least 1"),
        ('{ type = "exponential_decay" }', f"{PATH}.decay_size: required key 'decay_size' is missing"),
        ('{ type = "exponential_decay", decay_size = 5, decay_factor = 1.5 }', f"{PATH}: decay_factor must be above 0 and at most 1"),
        ('{ type = "exponential_decay", decay_size = 5, warmup_size = -1 }', f"{PATH}: warmup_size must be an integer of at least 0"),
        ('{ type = "exponential_decay", decay_size = 5, min_learning_rate = -0.1 }', f"{PATH}: min_learning_rate must be a learning rate of at least 0"),
        (
            '{ type = "manual_step", schedule_sizes = [10, 20, 30], learning_rates = [0.1, 0.01] }',
            f"{PATH}: learning_rates has 2 and schedule_sizes has 3 entries: give one learning rate per schedule size",
        ),
        (
            '{ type = "manual_step", schedule_sizes = [10, 10], learning_rates = [0.1, 0.01] }',
            f"{PATH}: schedule_sizes must be strictly increasing, got [10, 10] (10 after 10)",
        ),
        ('{ type = "manual_step", schedule_sizes = [0, 10], learning_rates = [0.1, 0.01] }', f"{PATH}: schedule_sizes must be integers of at least 1"),
        ('{ type = "manual_step", schedule_sizes = [], learning_rates = [] }', f"{PATH}: schedule_sizes is empty"),
        ('{ type = "cosine_annealing", T_max = 0 }', f"{PATH}: T_max must be an integer of at least 1"),
        ('{ type = "cosine_annealing_warm_restarts", T_0 = 0 }', f"{PATH}: T_0 must be an integer of at least 1"),
        ('{ type = "cosine_annealing_warm_restarts", T_0 = 10, T_mult = 0 }', f"{PATH}: T_mult must be an integer of at least 1"),
        ('{ type = "cosine_annealing", T_max = 10, T_mult = 2 }', f"{PATH}.T_mult: unknown key"),
    ],
)
def test_config_errors_name_the_path_and_the_field(table, problem):
    problems = problems_of(table)
    assert len(problems) == 1 and problems[0].startswith(problem), problems
