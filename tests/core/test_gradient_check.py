"""The gradient check behind ``train.on_nonfinite_loss``: which gradient counts as not finite,
which parameter is named, and how the watch remembers the first batch (no training run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tzrun.runner.nonfinite import GradientCheck
from tzrun.runner.update import NonFiniteWatch


def _params(**grads: float | None) -> dict[str, torch.nn.Parameter]:
    out = {}
    for name, value in grads.items():
        p = torch.nn.Parameter(torch.zeros(3))
        if value is not None:
            p.grad = torch.tensor([0.5, value, -1.0])
        out[name] = p
    return out


def _first(check: GradientCheck) -> tuple[str | None, float]:
    index, magnitude = check.first()
    return (check.names[int(index)] if int(index) >= 0 else None), float(magnitude)


@pytest.mark.parametrize(("value", "bad"), [(1e18, False), (1e20, True), (float("inf"), True), (float("nan"), True)])
def test_a_gradient_counts_as_not_finite_when_its_square_overflows_float32(value, bad):
    name, magnitude = _first(GradientCheck(_params(a=2.0, b=value), [], torch.device("cpu")))
    assert name == ("'b'" if bad else None)
    if bad and value == value:
        assert magnitude == pytest.approx(value)


def test_the_first_bad_parameter_is_named_past_parameters_without_a_gradient():
    check = GradientCheck(_params(a=None, b=1.0, c=float("inf"), d=float("nan")), ["sparse.ebc"], torch.device("cpu"))
    assert _first(check)[0] == "'c'"


def test_embedding_gradients_are_noted_and_forgotten_at_each_batch():
    check = GradientCheck(_params(a=1.0), ["sparse.ebc", "sparse.ec"], torch.device("cpu"))
    assert bool(check.note_embedding(0, torch.ones(4, 2)))
    assert not bool(check.note_embedding(1, torch.full((4, 2), 3e30)))
    assert _first(check) == ("the embedding lookups of 'sparse.ec'", pytest.approx(3e30))
    assert _first(check)[0] is None  # the next batch starts clean


def test_the_watch_keeps_the_first_batch_and_its_parameter():
    check = GradientCheck(_params(a=1.0, b=1.0), [], torch.device("cpu"))
    watch = NonFiniteWatch(check.names)
    watch.see(torch.tensor(0.5), check.first())
    assert watch.first() is None
    check.params["b"].grad = torch.tensor([1.0, float("inf"), 0.0])
    watch.see(torch.tensor(0.7), check.first())
    check.params["a"].grad = torch.tensor([float("nan"), 0.0, 0.0])
    watch.see(torch.tensor(float("nan")), check.first())
    first = watch.first()
    assert (first.batch, first.parameter, first.magnitude) == (2, "'b'", float("inf"))
    assert first.loss == pytest.approx(0.7)


def _collective_worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from tzrun.runner.nonfinite import collective_max

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:  # an embedding gradient bad on rank 1 only: both ranks must skip the step together
        index = collective_max(torch.tensor(-1 if rank == 0 else 3))
        Path(out_dir, f"rank{rank}.txt").write_text(str(index))
    finally:
        dist.destroy_process_group()


def test_every_rank_agrees_on_the_first_bad_gradient(tmp_path):
    from tests.warm_ranks import warm_spawn

    warm_spawn(_collective_worker, (str(tmp_path / "store"), str(tmp_path)))
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)] == ["3", "3"]
