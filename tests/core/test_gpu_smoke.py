"""The GPU smoke script and suite as far as a CPU machine can check them: ``scripts/gpu_smoke.sh
--dry-run`` names every step a GPU owner's run takes, its example commands are valid configs,
the CUDA requirements pair FBGEMM with its torch, and tests/gpu is collected and skipped here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from tzrun_tools.torchrec_wheel import TORCHREC_VERSION

from tests.conftest import REPO
from tests.gpu import example_runs

SCRIPT = REPO / "scripts" / "gpu_smoke.sh"
ALL_GPUS = '--nproc-per-node "$(nvidia-smi -L | wc -l)"'


@pytest.fixture(scope="module")
def dry_run() -> list[str]:
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout.splitlines()


def commands(lines: list[str]) -> list[str]:
    return [line[2:] for line in lines if line.startswith("+ ")]


def test_dry_run_sets_up_the_cuda_stack_first_and_installs_nothing(dry_run, tmp_path):
    cmds = commands(dry_run)
    assert cmds[0] == "env TZRUN_STACK=cuda TZRUN_VENV=.venv-cuda bash scripts/setup.sh"
    assert cmds[1] == "nvidia-smi -L"
    stack = next(line for line in dry_run if line.startswith("the CUDA stack:"))
    assert "requirements/cuda.txt (torch==2.13.0 fbgemm-gpu==1.8.0)" in stack
    assert "torchrec==1.8.0 (plugins/tzrun_tools/torchrec_wheel.py)" in stack
    venv, work = tmp_path / "venv", tmp_path / "work"
    env = {"PATH": "/usr/bin:/bin", "TZRUN_VENV": str(venv), "TZRUN_SMOKE_DIR": str(work)}
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, cwd=REPO, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"+ env TZRUN_STACK=cuda TZRUN_VENV={venv} bash scripts/setup.sh" in proc.stdout
    assert not venv.exists() and not work.exists()  # nothing installed, nothing written


def test_cuda_requirements_pair_fbgemm_with_its_torch():
    """FBGEMM 1.X is built for torch 2.(X+5), and torchrec 1.X goes with FBGEMM 1.X."""
    pins = {}
    for name in ("cuda.txt", "cpu.txt"):
        for line in (REPO / "requirements" / name).read_text().splitlines():
            if m := re.fullmatch(r"([a-z-]+)==(\d+)\.(\d+)\.(\d+)(\+\w+)?", line.strip()):
                pins.setdefault(name, {})[m.group(1)] = tuple(int(x) for x in m.group(2, 3, 4))
    cuda = pins["cuda.txt"]
    torchrec = tuple(int(x) for x in TORCHREC_VERSION.split("."))  # what setup.sh installs
    assert set(cuda) == {"torch", "fbgemm-gpu"}  # the CUDA build of FBGEMM, not fbgemm-gpu-cpu
    assert cuda["torch"][:2] == (2, cuda["fbgemm-gpu"][1] + 5) and cuda["fbgemm-gpu"][0] == 1
    assert torchrec == cuda["fbgemm-gpu"]
    assert cuda["torch"] == pins["cpu.txt"]["torch"]  # the stack the CPU tests run on
    assert "--extra-index-url https://download.pytorch.org/whl/cu" in (REPO / "requirements" / "cuda.txt").read_text()


def test_dry_run_runs_the_gpu_suite_after_checking_the_gpus(dry_run):
    cmds = commands(dry_run)
    suite = next(i for i, c in enumerate(cmds) if " -m pytest tests/gpu " in f"{c} ")
    assert cmds[suite].startswith(".venv-cuda/bin/python -m pytest tests/gpu -m gpu")
    assert suite > cmds.index("nvidia-smi -L")


def _example_commands(dry_run: list[str]) -> dict[str, str]:
    found = {}
    for cmd in commands(dry_run):
        if m := re.search(r"-m tzrun train examples/(\w+)\.toml", cmd):
            if "/runs/throughput" not in cmd:
                found[m.group(1)] = cmd
    return found


def test_dry_run_trains_every_example_on_all_gpus_through_torchrun(dry_run):
    found = _example_commands(dry_run)
    assert sorted(found) == example_runs.examples() == sorted(p.stem for p in (REPO / "examples").glob("*.toml"))
    for example, cmd in found.items():
        assert cmd.startswith(f".venv-cuda/bin/torchrun {ALL_GPUS} -m tzrun train examples/{example}.toml --set "), cmd


def test_each_example_command_is_a_valid_config(dry_run, tzrun_pm):
    """Both config passes over each example with the script's ``--set`` arguments."""
    from tzrun.config.load import load_config, parse_config
    from tzrun.kernel.registry import collect_registries

    registries = collect_registries(tzrun_pm)
    for example, cmd in _example_commands(dry_run).items():
        args = shlex.split(cmd)
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        assert f'model_dir="/tmp/tzrun_gpu_smoke.XXXXXX/runs/{example}-all-gpus"' in sets
        path = REPO / "examples" / f"{example}.toml"
        cfg = load_config(parse_config(path.read_text(), str(path), sets), registries)
        assert cfg.data.batch_size == example_runs.BATCH_SIZE
        dataset = example_runs.dataset_of(example)
        assert str(cfg.data.train_input).endswith(f"/data/{dataset}/train"), (example, cfg.data.train_input)


def test_dry_run_ends_with_the_throughput_line_of_deepfm_on_all_gpus(dry_run):
    cmds = commands(dry_run)
    synth, train = cmds[-2], cmds[-1]
    assert synth.startswith(".venv-cuda/bin/python -m tzrun data synth criteo --rows ")
    assert train.startswith(f".venv-cuda/bin/torchrun {ALL_GPUS} -m tzrun train examples/deepfm_criteo.toml ")
    assert "/runs/throughput" in train and "data.batch_size=8192" in train
    # the summary reads the line benchmarks/compare_deepfm.py reads
    assert "grep -E '^trained [0-9]+ steps in '" in SCRIPT.read_text()
    assert 'FRAMEWORK_RE = re.compile(r"^trained (\\d+) steps in' in (REPO / "benchmarks" / "compare_deepfm.py").read_text()


def test_an_unknown_argument_is_a_usage_error():
    proc = subprocess.run(["bash", str(SCRIPT), "--dryrun"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 64
    assert proc.stderr.strip() == "gpu_smoke.sh: unknown argument '--dryrun' (usage: bash scripts/gpu_smoke.sh [--dry-run])"


def test_the_gpu_suite_is_collected_and_skipped_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/gpu runs here")
    # one run selecting the gpu mark: a test without it would be deselected (and the summary say so)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?\d+ skipped in [0-9.]+s ?=*", summary), summary  # every test is marked gpu, and skipped
    reason = "needs CUDA: torch.cuda.is_available() is False"
    skipped_files = {m.group(1) for m in re.finditer(rf"SKIPPED \[\d+\] (tests/gpu/test_\w+\.py)\S*: {re.escape(reason)}", proc.stdout)}
    assert skipped_files == {f"tests/gpu/{p.name}" for p in (REPO / "tests" / "gpu").glob("test_*.py")}
