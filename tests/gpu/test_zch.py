"""Collision-free ids on CUDA: the ``zch`` DeepFM of tests/integration/test_zch.py trains on one GPU
through TorchRec's managed-collision sharder (row-wise, on CUDA as on CPU), its ids get rows at each
eviction, and a run stopped between two evictions resumes as the uninterrupted run: the same loss
at every step and the same weights, optimizer state and id-to-row maps at the end."""

from __future__ import annotations

import torch

from tests.integration.test_resume import Losses
from tests.integration.test_zch import _train, _weights, config, data  # noqa: F401  (module fixtures)
from tzrun.runner.checkpoint import list_checkpoints

_EMPTY = 2**63 - 1  # TorchRec's empty slot in a sorted id map


def test_a_zch_run_on_cuda_evicts_and_resumes_as_the_uninterrupted_run(data, config, tmp_path):  # noqa: F811
    whole = Losses()
    uninterrupted = _train(data, config, tmp_path / "whole", whole)
    assert {p.device.type for p in uninterrupted.model.parameters()} == {"cuda"}
    a = _weights(uninterrupted.model)
    maps = [k for k in a if k.endswith("_mch_sorted_raw_ids")]
    assert maps and all(bool((a[k] != _EMPTY).any()) for k in maps)  # every zch table gave ids rows

    first = Losses(signal_at=5)  # eviction every 2 steps: step 5 is one step into a window
    stopped = _train(data, config, tmp_path / "split", first)
    assert stopped.stopped_by == "SIGUSR1" and [s for s, _ in list_checkpoints(tmp_path / "split")] == [3, 5]
    rest = Losses()
    resumed = _train(data, config, tmp_path / "split", rest, resume=True)
    assert resumed.steps == 8 and {**first.steps, **rest.steps} == whole.steps
    b = _weights(resumed.model)
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
