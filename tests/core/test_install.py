"""The install pieces a user relies on: a consistent environment (pip check), TorchRec's corrected
wheel, ``tzrec-run init`` from the shipped examples, and one-line errors naming what is missing."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO
from tzrun.cli.main import main
from tzrun.errors import EXIT_CONFIG, MissingDependencyError
from tzrun.cli.install_commands import EXAMPLES, example_text, synth_command
from tzrun_tools.torchrec_wheel import correct_wheel, corrected_requirements

_PUBLISHED_METADATA = """Metadata-Version: 2.4
Name: torchrec
Version: 1.8.0
Requires-Python: >=3.10
Requires-Dist: fbgemm-gpu
Requires-Dist: tensordict
Requires-Dist: torchmetrics==1.0.3
Requires-Dist: tqdm
Requires-Dist: iopath; extra == "datasets"

Requires-Dist: fbgemm-gpu (a line of the description, left alone)
"""


def test_the_project_environment_passes_pip_check():
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_torchrec_metadata_is_corrected_for_each_stack():
    lines = _PUBLISHED_METADATA.split("\n")
    cpu = corrected_requirements(lines, "cpu")
    assert "Version: 1.8.0+tzrun.cpu" in cpu
    assert "Requires-Dist: fbgemm-gpu-cpu>=1.8,<1.9" in cpu and "Requires-Dist: torchmetrics>=1.0.3" in cpu
    assert "Requires-Dist: fbgemm-gpu (a line of the description, left alone)" in cpu
    assert 'Requires-Dist: iopath; extra == "datasets"' in cpu and "Requires-Dist: tensordict" in cpu
    cuda = corrected_requirements(lines, "cuda")
    assert "Requires-Dist: fbgemm-gpu>=1.8,<1.9" in cuda and "Version: 1.8.0+tzrun.cuda" in cuda
    with pytest.raises(ValueError, match="not TorchRec 1.8.0's metadata"):
        corrected_requirements(["Version: 1.7.0", "Requires-Dist: fbgemm-gpu"], "cpu")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_corrected_wheel_has_a_record_that_matches_its_files(tmp_path):
    published = tmp_path / "torchrec-1.8.0-py311-none-any.whl"
    with zipfile.ZipFile(published, "w") as whl:
        whl.writestr("torchrec/__init__.py", "VERSION = 1\n")
        whl.writestr("torchrec-1.8.0.dist-info/METADATA", _PUBLISHED_METADATA)
        whl.writestr("torchrec-1.8.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py311-none-any\n")
        whl.writestr("torchrec-1.8.0.dist-info/RECORD", "stale\n")
    out = tmp_path / "out"
    out.mkdir()
    corrected = correct_wheel(published, out, "cpu")
    assert corrected.name == "torchrec-1.8.0+tzrun.cpu-py311-none-any.whl"
    with zipfile.ZipFile(corrected) as whl:
        names = set(whl.namelist())
        assert names == {"torchrec/__init__.py", "torchrec-1.8.0+tzrun.cpu.dist-info/METADATA",
                         "torchrec-1.8.0+tzrun.cpu.dist-info/WHEEL", "torchrec-1.8.0+tzrun.cpu.dist-info/RECORD"}
        rows = list(csv.reader(io.StringIO(whl.read("torchrec-1.8.0+tzrun.cpu.dist-info/RECORD").decode())))
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = whl.read(name)
            assert digest == _record_hash(data) and int(size) == len(data), name
        assert "torchmetrics>=1.0.3" in whl.read("torchrec-1.8.0+tzrun.cpu.dist-info/METADATA").decode()


def test_init_offers_every_example_that_runs_on_synthetic_data():
    synthetic = {p.stem for p in (REPO / "examples").glob("*.toml") if "tzrec-run data synth" in p.read_text()}
    assert sorted(EXAMPLES) == sorted(synthetic)  # a new example is copied to the templates and named in EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_shipped_examples_are_the_repositorys_and_name_their_data(name):
    text = example_text(name)
    assert text == (REPO / "examples" / f"{name}.toml").read_text(encoding="utf-8"), (
        f"plugins/tzrun_tools/templates/examples/{name}.toml differs from examples/{name}.toml: copy it over")
    assert synth_command(text).startswith("tzrec-run data synth ")


def test_init_writes_a_starter_config_and_refuses_to_overwrite_it(tmp_path, capsys):
    assert main(["init", str(tmp_path / "proj"), "--example", "dssm_taobao"]) == 0
    out = capsys.readouterr().out
    written = tmp_path / "proj" / "dssm_taobao.toml"
    text = written.read_text(encoding="utf-8")
    assert text == example_text("dssm_taobao").replace("examples/dssm_taobao.toml", "dssm_taobao.toml")
    assert "#   tzrec-run train dssm_taobao.toml\n" in text and "repository" not in text
    assert f"cd {tmp_path / 'proj'}" in out
    assert "tzrec-run data synth taobao --rows 300000 --out data/taobao_synth\n" in out
    assert "tzrec-run train dssm_taobao.toml" in out
    written.write_text("# mine\n")
    assert main(["init", str(tmp_path / "proj"), "--example", "dssm_taobao"]) == EXIT_CONFIG
    err = capsys.readouterr().err.strip()
    assert err == f"tzrec-run init: {written} exists; pass --force to overwrite it"
    assert written.read_text() == "# mine\n"
    assert main(["init", str(tmp_path / "proj"), "--example", "dssm_taobao", "--force"]) == 0
    assert written.read_text(encoding="utf-8") == text


def test_a_missing_stack_package_is_one_line_with_the_command(monkeypatch, tmp_path, capsys):
    from tzrun import stack

    monkeypatch.setitem(stack._MODULES, "torchrec", "tzrun_no_such_torchrec")
    config = tmp_path / "c.toml"
    config.write_text(example_text("deepfm_criteo"))
    for command in ("train", "evaluate", "check"):
        extra = ["--checkpoint", "latest"] if command == "evaluate" else []
        launch = ["--nproc-per-node", "2"] if command == "evaluate" else []  # through torchrun
        assert main([command, str(config), *extra, *launch]) == EXIT_CONFIG
        err = capsys.readouterr().err
        assert err == ("tzrec-run: torchrec is not installed (train, evaluate, check and plan need torch, FBGEMM "
                       "and TorchRec): run `tzrec-run install-stack`\n")


def test_a_missing_extra_names_it(monkeypatch):
    from tzrun import stack

    monkeypatch.setitem(stack.EXTRAS, "plot", ("tzrun_no_such_matplotlib", "tzrec-run plot"))
    with pytest.raises(MissingDependencyError, match=r"^tzrec-run plot needs tzrun_no_such_matplotlib, which is not "
                                                     r"installed: run `pip install 'tzrec-run\[plot\]'`$"):
        stack.require_extra("plot")


def test_env_names_no_repository_file(capsys):
    from tzrun.cli.install_commands import env_advice, print_env_advice

    versions = {"torch": "2.13.0+cpu", "fbgemm_gpu": None, "torchrec": None}
    advice = env_advice(versions, ["fbgemm_gpu is not installed", "torchrec is not installed"])
    assert advice["missing"] == ["fbgemm_gpu", "torchrec"] and advice["install"].startswith("tzrec-run install-stack")
    print_env_advice(advice, ["fbgemm_gpu is not installed", "torchrec is not installed"])
    err = capsys.readouterr().err
    assert "to install fbgemm_gpu and torchrec, run: tzrec-run install-stack" in err
    assert "scripts/" not in err and "requirements/" not in err


def test_install_stack_installs_only_what_is_missing(monkeypatch):
    from tzrun_tools import install_stack

    def versions(**installed):
        monkeypatch.setattr(install_stack, "_version", lambda name: installed.get(name.replace("-", "_")))

    def argvs(stack):
        return [step.argv for step in install_stack.install_steps(stack, python="py")]

    versions()
    assert argvs("cpu") == [
        ["py", "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", "--index-url",
         "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"],
        ["py", "-m", "pip", "install", "--disable-pip-version-check", "torch==2.13.0+cpu", "fbgemm-gpu-cpu>=1.8,<1.9"],
        ["py", "-m", "tzrun_tools.torchrec_wheel", "--stack", "cpu"],
    ]
    mirror = install_stack.install_steps("cpu", python="py", index_url="http://mirror/whl")[0]
    assert mirror.index == "http://mirror/whl" and mirror.argv[-2:] == ["http://mirror/whl", "torch==2.13.0+cpu"]
    versions(torch="2.13.0+cpu", fbgemm_gpu_cpu="1.8.0", torchrec="1.8.0")  # the published torchrec
    assert argvs("cpu") == [["py", "-m", "tzrun_tools.torchrec_wheel", "--stack", "cpu"]]
    versions(torch="2.13.0+cpu", fbgemm_gpu_cpu="1.8.0", torchrec="1.8.0+tzrun.cpu")
    assert argvs("cpu") == []
    versions(torch="2.14.0", fbgemm_gpu="1.8.0", torchrec="1.8.0+tzrun.cuda")
    assert [s[-1] for s in argvs("cuda")] == ["torch>=2.13,<2.14", "fbgemm-gpu>=1.8,<1.9"]
    versions(torch="2.13.1", torchrec="1.8.0+tzrun.cpu")  # FBGEMM missing: the installed torch is held
    assert argvs("cpu") == [["py", "-m", "pip", "install", "--disable-pip-version-check", "torch==2.13.1",
                             "fbgemm-gpu-cpu>=1.8,<1.9"]]


def test_the_dry_run_keeps_the_cpu_label(monkeypatch, capsys):
    from tzrun_tools import install_stack

    monkeypatch.setattr(install_stack, "_version", lambda name: None)
    assert main(["install-stack", "--cpu", "--dry-run"]) == 0
    torch_line = [line for line in capsys.readouterr().out.splitlines() if "--index-url" in line]
    assert torch_line == ["+ python -m pip install --disable-pip-version-check --no-deps --index-url "
                          "https://download.pytorch.org/whl/cpu torch==2.13.0+cpu"]


def test_an_environment_without_pip_gets_it_first(monkeypatch):
    from tzrun_tools import install_stack

    monkeypatch.setattr(install_stack, "_version", lambda name: None)
    real_find_spec = install_stack.importlib.util.find_spec
    missing = {"pip"}
    monkeypatch.setattr(install_stack.importlib.util, "find_spec",
                        lambda name, *a: None if name in missing else real_find_spec(name, *a))
    assert install_stack.install_steps("cpu", python="py")[0].argv == ["py", "-m", "ensurepip", "--default-pip"]
    missing.add("ensurepip")  # an interpreter without ensurepip (Debian's, without python3-venv)
    monkeypatch.setattr(install_stack.shutil, "which", lambda name: "/opt/uv/bin/uv" if name == "uv" else None)
    assert install_stack.install_steps("cpu", python="py")[0].argv == ["/opt/uv/bin/uv", "pip", "install",
                                                                       "--python", "py", "pip"]


_UNREACHABLE_PIP = """WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection \
broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object at 0x7f>: Failed to establish a new \
connection: [Errno 111] Connection refused')': /torch/
ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from versions: none)
ERROR: No matching distribution found for torch==2.13.0+cpu
"""
_NO_BUILD_PIP = """ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from versions: none)
ERROR: No matching distribution found for torch==2.13.0+cpu
"""


def test_a_failed_step_is_one_line_naming_the_index_and_the_next_step():
    from tzrun_tools.install_stack import Step, failure_line

    torch = Step("torch==2.13.0+cpu", ["py", "-m", "pip"], "https://download.pytorch.org/whl/cpu")
    line = failure_line(torch, _UNREACHABLE_PIP)
    assert line.startswith("cannot reach https://download.pytorch.org/whl/cpu for torch==2.13.0+cpu: ")
    assert "`tzrec-run install-stack --index-url URL`" in line and "\n" not in line
    line = failure_line(torch, _NO_BUILD_PIP)
    assert line.startswith("https://download.pytorch.org/whl/cpu has no torch==2.13.0+cpu for Python 3.")
    assert "CPython 3.10 to 3.14 on Linux" in line and "\n" not in line
    fbgemm = Step("fbgemm-gpu-cpu>=1.8,<1.9", ["py", "-m", "pip"])
    assert failure_line(fbgemm, _UNREACHABLE_PIP).startswith("cannot reach the package index pip is configured with")
    other = failure_line(fbgemm, "ERROR: Could not install packages due to an OSError: [Errno 28] No space left\n")
    assert other == ("installing fbgemm-gpu-cpu>=1.8,<1.9 failed: pip says: Could not install packages due to an "
                     "OSError: [Errno 28] No space left; fix that, then run `tzrec-run install-stack` again (it "
                     "installs only what is still missing)")


def test_a_failed_step_exits_with_the_install_code_and_one_line(monkeypatch, capsys):
    from tzrun.errors import EXIT_INSTALL
    from tzrun_tools import install_stack

    monkeypatch.setattr(install_stack, "_version", lambda name: None)
    # pip itself, run for real: a step that cannot succeed (no such package in an empty local index)
    monkeypatch.setattr(install_stack, "install_steps", lambda stack, index_url=None: [install_stack.Step(
        "tzrun-no-such-package", [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
                                  "--no-index", "--find-links", str(REPO / "docs"), "tzrun-no-such-package"])])
    assert install_stack.install_stack("cpu") == EXIT_INSTALL
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tzrec-run install-stack: the package index pip is configured "
                                                    "with (PyPI unless PIP_INDEX_URL says otherwise) has no "
                                                    "tzrun-no-such-package for Python"), err
