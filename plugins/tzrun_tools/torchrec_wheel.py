"""TorchRec 1.8.0 installed with its metadata corrected for the stack it runs on.

TorchRec's published wheel asks for ``fbgemm-gpu`` (FBGEMM's CUDA build, which a CPU machine
runs as ``fbgemm-gpu-cpu``) and pins ``torchmetrics==1.0.3`` (tzrec-run needs 1.4 or newer, and
TorchRec works with them). Installed as published, pip either pulls the CUDA FBGEMM and an old
torchmetrics, or (with ``--no-deps``) leaves an environment that fails ``pip check``. This tool
downloads the published wheel, rewrites those two ``Requires-Dist`` lines and the wheel's
``RECORD`` hashes, gives it the local version ``1.8.0+tzrun.<stack>`` so that ``pip list``
shows it is not the published file, and installs it with its dependencies checked by pip.
Nothing else in the wheel changes.

It uses only the standard library (and pip), so it also runs as a script before tzrec-run's own
dependencies are installed: ``python plugins/tzrun_tools/torchrec_wheel.py --stack cpu``.
``tzrec-run install-stack`` calls it after installing torch and FBGEMM when they are missing.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

__all__ = ["TORCHREC_VERSION", "FBGEMM_DISTRIBUTIONS", "FBGEMM_RANGE", "local_version", "corrected_requirements",
           "correct_wheel", "download_wheel", "install_torchrec", "main"]

#: The TorchRec release that goes with FBGEMM 1.8 and torch 2.13.
TORCHREC_VERSION = "1.8.0"
#: The FBGEMM distribution of each stack, and the releases TorchRec 1.8 goes with.
FBGEMM_DISTRIBUTIONS = {"cpu": "fbgemm-gpu-cpu", "cuda": "fbgemm-gpu"}
FBGEMM_RANGE = ">=1.8,<1.9"
_TORCHMETRICS = ">=1.0.3"


def local_version(stack: str) -> str:
    """The version the corrected wheel carries, e.g. ``1.8.0+tzrun.cpu``."""
    return f"{TORCHREC_VERSION}+tzrun.{stack}"


def corrected_requirements(lines: Sequence[str], stack: str) -> list[str]:
    """``METADATA`` lines with TorchRec's FBGEMM and torchmetrics requirements corrected.

    Args:
        lines: the lines of the published ``METADATA``.
        stack: ``cpu`` or ``cuda``.

    Returns:
        The same lines with ``Version`` set to :func:`local_version`, ``Requires-Dist: fbgemm-gpu``
        naming the stack's FBGEMM distribution (1.8.x), and ``torchmetrics==1.0.3`` relaxed to
        ``torchmetrics>=1.0.3``.

    Raises:
        ValueError: if the metadata is not TorchRec 1.8.0's (nothing to correct was found).
    """
    out, seen, header = [], set(), True
    for line in lines:
        header = header and line.strip() != ""  # the description follows the first blank line
        if not header:
            pass
        elif line.startswith("Version: "):
            seen.add("version")
            line = f"Version: {local_version(stack)}"
        elif re.fullmatch(r"Requires-Dist: fbgemm-gpu\s*", line):
            seen.add("fbgemm")
            line = f"Requires-Dist: {FBGEMM_DISTRIBUTIONS[stack]}{FBGEMM_RANGE}"
        elif re.fullmatch(r"Requires-Dist: torchmetrics\s*==\s*1\.0\.3\s*", line):
            seen.add("torchmetrics")
            line = f"Requires-Dist: torchmetrics{_TORCHMETRICS}"
        out.append(line)
    if seen != {"version", "fbgemm", "torchmetrics"}:
        raise ValueError(f"not TorchRec {TORCHREC_VERSION}'s metadata (found {sorted(seen)} of "
                         "version, fbgemm-gpu and torchmetrics==1.0.3)")
    return out


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def correct_wheel(wheel: Path, out_dir: Path, stack: str) -> Path:
    """Write the corrected copy of TorchRec's published ``wheel`` into ``out_dir``.

    Args:
        wheel: ``torchrec-1.8.0-pyXY-none-any.whl`` as published.
        out_dir: where the corrected wheel goes.
        stack: ``cpu`` or ``cuda``.

    Returns:
        The corrected wheel, ``torchrec-1.8.0+tzrun.<stack>-pyXY-none-any.whl``.

    Raises:
        ValueError: if ``wheel`` is not TorchRec 1.8.0's wheel.
    """
    old_info, new_info = f"torchrec-{TORCHREC_VERSION}.dist-info/", f"torchrec-{local_version(stack)}.dist-info/"
    tag = wheel.name[len(f"torchrec-{TORCHREC_VERSION}-"):]
    if not wheel.name.startswith(f"torchrec-{TORCHREC_VERSION}-"):
        raise ValueError(f"{wheel}: not a TorchRec {TORCHREC_VERSION} wheel")
    target = out_dir / f"torchrec-{local_version(stack)}-{tag}"
    records = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            name = item.filename
            if name == old_info + "RECORD":
                continue
            data = src.read(item)
            if name.startswith(old_info):
                name = new_info + name[len(old_info):]
                if name == new_info + "METADATA":
                    text = data.decode("utf-8")
                    data = "\n".join(corrected_requirements(text.split("\n"), stack)).encode("utf-8")
            info = zipfile.ZipInfo(name, date_time=item.date_time)
            info.external_attr, info.compress_type = item.external_attr, zipfile.ZIP_DEFLATED
            dst.writestr(info, data)
            records.append((name, _record_hash(data), str(len(data))))
        records.append((new_info + "RECORD", "", ""))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(records)
        dst.writestr(new_info + "RECORD", text.getvalue())
    return target


def download_wheel(dest: Path, python: str = sys.executable) -> Path:
    """Download TorchRec's published wheel for ``python`` with ``pip download`` (pip's cache and
    configured indexes apply); returns the file."""
    subprocess.run([python, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                    "--only-binary", ":all:", f"torchrec=={TORCHREC_VERSION}", "-d", str(dest)], check=True)
    found = sorted(dest.glob(f"torchrec-{TORCHREC_VERSION}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download left no torchrec-{TORCHREC_VERSION} wheel in {dest}")
    return found[0]


def install_torchrec(stack: str, pip_args: Sequence[str] = (), wheel: Path | None = None,
                     python: str = sys.executable) -> Path:
    """Download (unless ``wheel`` is given), correct and install TorchRec for ``stack``.

    Args:
        stack: ``cpu`` or ``cuda``.
        pip_args: extra arguments for ``pip install`` (e.g. ``-c constraints.txt``).
        wheel: TorchRec's published wheel, already downloaded.
        python: the interpreter whose environment gets TorchRec.

    Returns:
        The corrected wheel that was installed (in a temporary directory, now removed).

    Raises:
        subprocess.CalledProcessError: when pip fails (its own message is on standard error).
    """
    with tempfile.TemporaryDirectory(prefix="tzrun-torchrec-") as tmp:
        source = wheel if wheel is not None else download_wheel(Path(tmp), python)
        corrected = correct_wheel(Path(source), Path(tmp), stack)
        subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", *pip_args,
                        str(corrected)], check=True)
        return corrected


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tzrun_tools.torchrec_wheel``: install (or with ``--out``, only write) the
    corrected TorchRec wheel; returns the exit code."""
    parser = argparse.ArgumentParser(prog="torchrec_wheel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", choices=sorted(FBGEMM_DISTRIBUTIONS), default="cpu")
    parser.add_argument("--wheel", type=Path, help="TorchRec's published wheel, already downloaded")
    parser.add_argument("--out", type=Path, help="write the corrected wheel here instead of installing it")
    parser.add_argument("pip_args", nargs="*", help="after --: more arguments for pip install")
    args = parser.parse_args(argv)
    try:
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                source = args.wheel or download_wheel(Path(tmp))
                print(correct_wheel(source, args.out, args.stack))
            return 0
        install_torchrec(args.stack, args.pip_args, args.wheel)
    except subprocess.CalledProcessError as error:
        print(f"torchrec_wheel: pip failed (exit {error.returncode}); its message is above", file=sys.stderr)
        return 1
    except (OSError, ValueError) as error:
        print(f"torchrec_wheel: {error}", file=sys.stderr)
        return 1
    print(f"installed torchrec {local_version(args.stack)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
