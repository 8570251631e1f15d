"""Crafted exports for the trust tests: each a copy of a real export with one thing changed,
its manifest's hash and ``COMPLETE`` recomputed (so that hashes alone cannot refuse it)."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import zipfile
from pathlib import Path
from typing import Callable


class Payload:
    """Unpickling it creates ``marker`` (a stand-in for any code an attacker would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def payload_bytes(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker), protocol=2)


def rewrite_archive(data: bytes, change: Callable[[dict[str, bytes]], None]) -> bytes:
    """The archive ``data`` with its entries (names below the root) changed by ``change``."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        root = names[0].split("/", 1)[0]
        entries = {n[len(root) + 1:]: archive.read(n) for n in names}
    change(entries)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, body in entries.items():
            archive.writestr(f"{root}/{name}", body)
    return out.getvalue()


def reseal(export: Path) -> None:
    """Recompute the manifest's file hashes and ``COMPLETE`` after a change, as an attacker would."""
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["files"] = {f: hashlib.sha256((export / f).read_bytes()).hexdigest() for f in manifest["files"]}
    body = json.dumps(manifest, indent=2).encode()
    (export / "manifest.json").write_bytes(body)
    complete = json.loads((export / "COMPLETE").read_text())
    (export / "COMPLETE").write_text(json.dumps({**complete, "manifest_sha256": hashlib.sha256(body).hexdigest()}))


def crafted_copy(export: Path, to: Path, change: Callable[[dict[str, bytes]], None]) -> Path:
    """A copy of ``export`` at ``to`` whose ``model.pt2`` is changed by ``change``, resealed."""
    shutil.copytree(export, to)
    program = to / "model.pt2"
    program.write_bytes(rewrite_archive(program.read_bytes(), change))
    reseal(to)
    return to


def pickled_weight(marker: Path) -> Callable[[dict[str, bytes]], None]:
    """The first weight stored as a pickle that creates ``marker`` when loaded."""
    def change(entries: dict[str, bytes]) -> None:
        key = "data/weights/model_weights_config.json"
        config = json.loads(entries[key])
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        entries[key] = json.dumps(config).encode()
        entries["data/weights/" + first["path_name"]] = payload_bytes(marker)
    return change


def pickled_sample_inputs(marker: Path) -> Callable[[dict[str, bytes]], None]:
    def change(entries: dict[str, bytes]) -> None:
        buffer = io.BytesIO()
        import torch

        torch.save(((Payload(marker),), {}), buffer)
        entries["data/sample_inputs/model.pt"] = buffer.getvalue()
    return change


def program_json(edit: Callable[[dict], None]) -> Callable[[dict[str, bytes]], None]:
    def change(entries: dict[str, bytes]) -> None:
        program = json.loads(entries["models/model.json"])
        edit(program)
        entries["models/model.json"] = json.dumps(program).encode()
    return change


def code_in_guard(marker: Path) -> Callable[[dict[str, bytes]], None]:
    def edit(program: dict) -> None:
        program["guards_code"] = [f"__import__('pathlib').Path({str(marker)!r}).touch() is None"]
    return program_json(edit)


def code_in_shape(marker: Path) -> Callable[[dict[str, bytes]], None]:
    def edit(program: dict) -> None:
        values = program["graph_module"]["graph"]["sym_int_values"]
        name = next(iter(values))
        values[name]["as_expr"]["expr_str"] = f"__import__('pathlib').Path({str(marker)!r}).touch() or 1"
    return program_json(edit)


def os_target() -> Callable[[dict[str, bytes]], None]:
    def edit(program: dict) -> None:
        program["graph_module"]["graph"]["nodes"][0]["target"] = "torch.os.system"
    return program_json(edit)


def extra_entry(name: str) -> Callable[[dict[str, bytes]], None]:
    def change(entries: dict[str, bytes]) -> None:
        entries[name] = b"\x7fELF"
    return change
