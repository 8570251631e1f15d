"""Exact resume on CUDA: a run stopped by SIGUSR1 and resumed is the uninterrupted run (the same
loss and learning rate at every step, the same weights), as tests/integration/test_resume.py
checks on CPU, with its helpers."""

from __future__ import annotations

import torch

from tests.integration.test_resume import Losses, _train
from tests.integration.test_update_path import _process_group, weights  # noqa: F401  (module fixture)


def test_a_run_stopped_and_resumed_on_cuda_is_the_uninterrupted_run(tmp_path, criteo_dir):
    whole = Losses()
    uninterrupted = _train(tmp_path, criteo_dir, "whole", whole)
    assert uninterrupted.steps == 18
    assert {p.device.type for p in uninterrupted.model.parameters()} == {"cuda"}

    first = Losses(signal_at=7)
    stopped = _train(tmp_path, criteo_dir, "split", first)
    assert stopped.stopped_by == "SIGUSR1" and stopped.steps == 7
    second = Losses()
    resumed = _train(tmp_path, criteo_dir, "split", second, resume=True)
    assert resumed.steps == 18 and resumed.stopped_by is None

    pieces = {**first.steps, **second.steps}
    assert sorted(pieces) == list(range(1, 19))
    assert pieces == whole.steps  # the same loss and lr at every step, exactly
    a, b = weights(uninterrupted.model), weights(resumed.model)
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
