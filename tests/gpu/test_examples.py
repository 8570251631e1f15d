"""Every example config trains for one short epoch on one GPU through ``tzrec-run train`` (a
run takes CUDA and NCCL whenever torch sees a GPU: ``tzrun.runner.distributed``)
(tests/gpu/example_runs.py has the data and the ``--set`` arguments; scripts/gpu_smoke.sh runs
the same on every GPU of the machine through torchrun)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.gpu import example_runs

THROUGHPUT = re.compile(r"^trained (\d+) steps in ([0-9.]+) s \(([0-9,.]+) samples/s\)\s*$", re.M)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smoke_data")
    example_runs.make_data(root)
    return root


@pytest.mark.parametrize("example", example_runs.examples())
def test_example_trains_on_one_gpu(example, data_root, tmp_path):
    model_dir = tmp_path / "run"
    config = example_runs.REPO / "examples" / f"{example}.toml"
    proc = run_cli(["train", str(config), *example_runs.set_args(example, data_root, model_dir)], timeout=300,
                   env={"CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    match = THROUGHPUT.search(proc.stdout)
    assert match and int(match.group(1)) > 0, proc.stdout[-2000:]
    result = json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])
    assert result["step"] == int(match.group(1))
