"""A full disk and a read-only model dir, for real (issue 20, point 9).

The model dir lives on a tmpfs mounted in a private mount namespace (``unshare -m``): the
full disk is that tmpfs filled up (the kernel's own ENOSPC, raised wherever the write
happens: inside torch.distributed.checkpoint's writer too), and the read-only model dir is a
read-only bind mount of it (EROFS). ``chmod`` would not do: the tests run as root, which
ignores permissions. Both are gone when the namespace's last process exits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import cli, EXAMPLE, example_overrides, REPO
from tests.integration.test_train import _sets
from tzrun.errors import EXIT_CANT_WRITE

pytestmark = pytest.mark.slow


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(not _namespaces_work(), reason="needs unshare -m and mount (root or user namespaces)")


def _steps(criteo_dir, tmp_path) -> list[list]:
    """The steps run in the namespace: ``["sh", COMMAND, NAME]`` or ``["tzrec-run", ARGS, NAME]``
    (NAME: the ``@@`` marker printed after it with its exit code, if any)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    model_dir = disk / "run"
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text().replace("num_epochs = 1", ""))

    def tzrun(command: str, name: str, *extra: str, resume: bool = False) -> list:
        sets = _sets(example_overrides(criteo_dir, model_dir, "train.save_checkpoints_steps=3", *extra))
        more = ["--resume"] if resume else ["--checkpoint", "latest"] if command == "evaluate" else []
        return ["tzrec-run", [command, str(config), *sets, *more], name]

    return [
        ["sh", f"mount -t tmpfs -o size=64m tmpfs {disk}", "mounted"],
        tzrun("train", "trained", "train.num_steps=3"),
        # a read-only model dir: evaluate, then resume
        ["sh", f"mount --bind {model_dir} {model_dir} && mount -o remount,ro,bind {model_dir}", "read-only"],
        tzrun("evaluate", "evaluate-read-only", "train.num_steps=3"),
        tzrun("train", "resume-read-only", "train.num_steps=6", resume=True),
        ["sh", f"umount {model_dir}", None],
        # a full disk: leave 1 MB, less than a checkpoint (3.6 MB) needs
        ["sh", f"avail=$(df -k --output=avail {disk} | tail -1); "
               f"dd if=/dev/zero of={disk}/filler bs=1K count=$((avail - 1024)) 2>/dev/null", None],
        tzrun("train", "resume-full", "train.num_steps=6", resume=True),
        ["sh", f"rm {disk}/filler; ls {model_dir}/checkpoints", "listed"],
        tzrun("evaluate", "evaluate-after", "train.num_steps=3"),
    ]


def _drive(steps_json: str) -> None:
    """Run the steps of :func:`_steps` in this process (in the namespace): the commands through
    the CLI's entry function, one interpreter for all of them (``tests.conftest.cli``)."""
    import json

    from tests.conftest import cli

    for kind, what, name in json.loads(steps_json):
        if kind == "sh":
            code = subprocess.run(["sh", "-c", what], stderr=subprocess.STDOUT).returncode
        else:
            proc = cli(what)
            print(proc.stdout + proc.stderr, flush=True)
            code = proc.returncode
        if name is not None:
            print(f"@@ {name} {code}", flush=True)


def _sections(output: str) -> dict[str, tuple[int, str]]:
    """``@@ NAME CODE`` markers split the combined output: each step's exit code and output."""
    out, text = {}, []
    for line in output.splitlines():
        if line.startswith("@@ "):
            name, _, code = line[3:].partition(" ")
            out[name] = (int(code) if code else 0, "\n".join(text))
            text = []
        else:
            text.append(line)
    return out


@needs_mounts
def test_a_full_disk_and_a_read_only_model_dir_are_named_and_lose_nothing(criteo_dir, tmp_path):
    import json

    drive = f"from tests.integration.test_write_failures import _drive; _drive({json.dumps(json.dumps(_steps(criteo_dir, tmp_path)))})"
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", drive],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400, cwd=REPO,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    steps = _sections(proc.stdout)
    assert steps.get("mounted", (1,))[0] == 0 and steps["read-only"][0] == 0, proc.stdout[-3000:]
    assert set(steps) >= {"trained", "evaluate-read-only", "resume-read-only", "resume-full", "evaluate-after"}, proc.stdout[-3000:]
    assert steps["trained"][0] == 0, steps["trained"][1][-3000:]
    model_dir = tmp_path / "disk" / "run"

    # evaluate on a read-only dir: the result is printed, the record's failure named, exit 73
    code, text = steps["evaluate-read-only"]
    assert code == EXIT_CANT_WRITE, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "eval of " in text and "step 3" in text and "auc=" in text
    assert (f"tzrec-run: the evaluation above was not recorded: {model_dir}/eval_results.jsonl: cannot write: "
            "Read-only file system (EROFS)") in text

    # resume into a read-only dir: one named line, exit 73
    code, text = steps["resume-read-only"]
    assert code == EXIT_CANT_WRITE and "Traceback" not in text, text[-3000:]
    line = next(x for x in text.splitlines() if x.startswith("tzrec-run: "))
    assert f": cannot write: Read-only file system (EROFS)" in line and str(model_dir) in line, text[-3000:]
    assert f"make {model_dir} writable" in line

    # a disk that fills while the checkpoint of step 6 is written: one named line, exit 73 ...
    code, text = steps["resume-full"]
    assert code == EXIT_CANT_WRITE and "Traceback" not in text, text[-3000:]
    line = next(x for x in text.splitlines() if x.startswith("tzrec-run: "))
    assert "cannot write: No space left on device (ENOSPC)" in line and "free space on that disk" in line, text[-3000:]
    assert str(model_dir) in line
    # ... and the checkpoint of step 3 stays the one to use
    assert "step-3" in steps["listed"][1]
    code, text = steps["evaluate-after"]
    assert code == 0 and "(step 3)" in text and "recorded in" in text, text[-3000:]


def test_metrics_jsonl_on_a_full_disk_ends_the_run_with_one_named_line(criteo_dir, tmp_path):
    """``/dev/full`` is the kernel's own full disk: every write to it fails with ENOSPC."""
    config = tmp_path / "run.toml"
    config.write_text(EXAMPLE.read_text().replace('type = "metrics_log"', 'type = "metrics_log"\npath = "/dev/full"'))
    model_dir = tmp_path / "run"
    proc = cli(["train", str(config), *_sets(example_overrides(criteo_dir, model_dir, "train.save_checkpoints_steps=3"))])
    assert proc.returncode == EXIT_CANT_WRITE, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"tzrec-run: /dev/full: cannot write: No space left on device (ENOSPC); free space on that disk (or set "
        "model_dir to a disk with room) and rerun with --resume: the checkpoints completed before it are intact")
