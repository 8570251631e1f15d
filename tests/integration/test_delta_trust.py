"""What ``ckpt apply-deltas`` trusts of an embedding dump: nothing it has not checked. A dump of
another run (a shared ``dir``, a run replaced by ``train --overwrite``), ids outside their table,
rows of the wrong shape, NaN or inf, a manifest that lists too few files, a damaged or missing
file: each is refused with one line naming the dump and the problem, and ``--out`` is not
written. One tiny run is trained for the module; each variant is a copy of its dumps, rewritten
and sealed again (sizes and hashes recomputed), so that its content, not a hash, is refused."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tzrun.cli.main import main
from tzrun.config.load import load_config, parse_config
from tzrun_serving.deltas import FORMAT, FORMATS, MANIFEST, MARKER, checkpoint_run_id, checkpoint_tables, list_dumps, read_dump
from tzrun.errors import EXIT_CANT_WRITE, EXIT_CHECKPOINT, CheckpointError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.testing import tiny_config_text

pytestmark = pytest.mark.slow

TABLE = "model.deep_ebc.embedding_bags.cat_0_emb.weight"


def _train(model_dir: Path, data_dir: Path, num_steps: int, *, dumps_dir: str = "embedding_deltas",
           overwrite: bool = True) -> None:
    import torch.distributed as dist

    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.session import Session
    from tzrun.runner.trainer import train

    pm = make_plugin_manager()
    registries = collect_registries(pm)
    raw = parse_config(tiny_config_text(data_dir, model_dir), "<tiny>", [
        f"train.num_steps={num_steps}", "train.save_checkpoints_steps=2", "train.keep_checkpoint_max=10",
        f'train.stages=[{{type = "embedding_deltas", every_n_steps = 3, dir = "{dumps_dir}"}}]'])
    created = not dist.is_initialized()
    try:
        train(Session(load_config(raw, registries), raw, pm, registries), resume=False, overwrite=overwrite)
    finally:
        if created:
            shutdown_distributed()


@pytest.fixture(scope="module")
def run(tmp_path_factory, criteo_dir) -> Path:
    """A run of 4 steps: checkpoints 2 and 4, dumps 3 (from 0) and 4 (from 3). Read only."""
    model_dir = tmp_path_factory.mktemp("delta-trust") / "run"
    _train(model_dir, criteo_dir, 4)
    assert [s for s, _ in list_dumps(model_dir / "embedding_deltas")] == [3, 4]
    return model_dir


def _apply(capsys, checkpoint: Path, deltas: Path, out: Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["ckpt", "apply-deltas", str(checkpoint), str(deltas), "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(capsys, run: Path, deltas: Path, out: Path, code: int, *words: str) -> str:
    got, _, err = _apply(capsys, run / "checkpoints" / "step-2", deltas, out)
    lines = err.strip().splitlines()
    assert got == code, err
    assert len(lines) == 1 and lines[0].startswith("tzrec-run: ") and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]
    assert not (out.exists() and out.is_file()), "--out was written"
    return lines[0]


def _seal(dump: Path, manifest: dict[str, Any] | None = None) -> None:
    """Write ``dump``'s manifest (``manifest``, or the one there with its files' sizes and
    hashes recomputed) and its marker, as a writer who can write the directory would."""
    if manifest is None:
        manifest = json.loads((dump / MANIFEST).read_bytes())
        for entry in manifest["files"]:
            if (dump / entry["path"]).exists():
                data = (dump / entry["path"]).read_bytes()
                entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    raw = json.dumps(manifest, indent=2).encode()
    (dump / MANIFEST).write_bytes(raw)
    (dump / MARKER).write_text(json.dumps({"step": manifest["step"], "manifest_sha256": hashlib.sha256(raw).hexdigest()}))


def _copy(run: Path, tmp_path: Path) -> Path:
    deltas = tmp_path / "deltas"
    shutil.copytree(run / "embedding_deltas", deltas)
    return deltas


def _edit_piece(deltas: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Change the first piece of ``TABLE`` with several ids in dump 3, and seal it again."""
    part_file = deltas / "step-3" / "rank-0.pt"
    part = torch.load(part_file, weights_only=True)
    piece = next(p for p in part["tables"][TABLE] if p["ids"].numel() > 1)
    edit(piece)
    buffer = io.BytesIO()
    torch.save(part, buffer)
    part_file.write_bytes(buffer.getvalue())
    _seal(deltas / "step-3")


def test_a_copy_sealed_again_applies(run, tmp_path, capsys):
    """The harness: a copy of the dumps, sealed again unchanged, still applies."""
    deltas = _copy(run, tmp_path)
    _edit_piece(deltas, lambda piece: None)
    out = tmp_path / "tables.pt"
    code, stdout, err = _apply(capsys, run / "checkpoints" / "step-2", deltas, out)
    assert code == 0 and "table(s) at step 4" in stdout, err
    at4, _ = checkpoint_tables(run / "checkpoints" / "step-4")
    applied = torch.load(out, weights_only=True)
    assert applied.keys() == at4.keys() and all(torch.equal(applied[k], at4[k]) for k in at4)


def _negative(piece):
    piece["ids"][0] = -1


def _out_of_range(piece):
    piece["ids"][0] = 10**6


def _float_ids(piece):
    piece["ids"] = piece["ids"].float()


def _one_row_to_broadcast(piece):
    piece["rows"] = piece["rows"][:1]


def _nan(piece):
    piece["rows"][0, 0] = float("nan")


def _inf(piece):
    piece["rows"][-1, -1] = float("inf")


def _past_the_columns(piece):
    piece["col_offset"] = 1


def _repeated_id(piece):
    piece["ids"][1] = piece["ids"][0]


@pytest.mark.parametrize("edit, words", [
    (_negative, ["step-3/rank-0.pt", TABLE, "id -1 is negative"]),
    (_out_of_range, ["step-3/rank-0.pt", TABLE, "id 1000000 is out of range"]),
    (_float_ids, ["step-3/rank-0.pt", "not a 1-D integer tensor"]),
    (_one_row_to_broadcast, ["step-3/rank-0.pt", TABLE, "one row per id"]),
    (_nan, ["step-3/rank-0.pt", TABLE, "NaN or infinite"]),
    (_inf, ["step-3/rank-0.pt", TABLE, "NaN or infinite"]),
    (_past_the_columns, ["step-3/rank-0.pt", "outside the table's"]),
    (_repeated_id, ["step-3/rank-0.pt", "repeats ids"]),
], ids=lambda v: v.__name__.strip("_") if callable(v) else "")
def test_a_piece_that_does_not_fit_its_table_is_refused(run, tmp_path, capsys, edit, words):
    deltas = _copy(run, tmp_path)
    _edit_piece(deltas, edit)
    _refused(capsys, run, deltas, tmp_path / "tables.pt", EXIT_CHECKPOINT, *words)


def _too_few_files(dump: Path) -> None:
    manifest = json.loads((dump / MANIFEST).read_bytes())
    _seal(dump, {**manifest, "files": []})


def _more_ranks_than_files(dump: Path) -> None:
    manifest = json.loads((dump / MANIFEST).read_bytes())
    _seal(dump, {**manifest, "world_size": 2})


def _missing_rank_file(dump: Path) -> None:
    (dump / "rank-0.pt").unlink()


def _empty_marker(dump: Path) -> None:
    (dump / MARKER).write_text("")


def _malformed_marker(dump: Path) -> None:
    (dump / MARKER).write_text('{"step": 3, "manifest_sha')


def _marker_not_an_object(dump: Path) -> None:
    (dump / MARKER).write_text("[3]")


def _missing_manifest(dump: Path) -> None:
    (dump / MANIFEST).unlink()


def _malformed_manifest(dump: Path) -> None:
    (dump / MANIFEST).write_text("{")
    (dump / MARKER).write_text(json.dumps({"step": 3, "manifest_sha256": hashlib.sha256(b"{").hexdigest()}))


def _another_shape(dump: Path) -> None:
    manifest = json.loads((dump / MANIFEST).read_bytes())
    manifest["tables"][TABLE] = [manifest["tables"][TABLE][0] + 1, manifest["tables"][TABLE][1]]
    _seal(dump, manifest)


def _not_a_part(dump: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"tables": [1, 2]}, buffer)
    (dump / "rank-0.pt").write_bytes(buffer.getvalue())
    _seal(dump)


def _no_run_id(dump: Path) -> None:
    manifest = json.loads((dump / MANIFEST).read_bytes())
    del manifest["run_id"]
    _seal(dump, manifest)


def _another_format(dump: Path) -> None:
    manifest = json.loads((dump / MANIFEST).read_bytes())
    _seal(dump, {**manifest, "format": "tzrun-deltas/99"})


def _maps_in_the_first_format(dump: Path) -> None:
    manifest = json.loads((dump / MANIFEST).read_bytes())
    _seal(dump, {**manifest, "maps": {"model.x": {"table": TABLE, "rows": 1000}}})


@pytest.mark.parametrize("edit, words", [
    (_maps_in_the_first_format, ["step-3/manifest.json", "tzrun-deltas/1 holds no \"maps\""]),
    (_too_few_files, ["step-3/manifest.json", "lists no file", "rank-0.pt"]),
    (_more_ranks_than_files, ["step-3/manifest.json", "lists rank-0.pt", "world size 2", "rank-1.pt"]),
    (_missing_rank_file, ["step-3/rank-0.pt", "missing"]),
    (_empty_marker, ["step-3/COMPLETE", "empty"]),
    (_malformed_marker, ["step-3/COMPLETE", "malformed"]),
    (_marker_not_an_object, ["step-3/COMPLETE", "malformed"]),
    (_missing_manifest, ["step-3/manifest.json", "missing"]),
    (_malformed_manifest, ["step-3/manifest.json", "malformed"]),
    (_another_shape, ["step-3/manifest.json", TABLE, "another model"]),
    (_not_a_part, ["step-3/rank-0.pt", "not a dict with"]),
    (_no_run_id, ["step-3/manifest.json", "names no run_id", "cannot tell"]),
    (_another_format, ["step-3/manifest.json", "tzrun-deltas/99", FORMAT]),
], ids=lambda v: v.__name__.strip("_") if callable(v) else "")
def test_a_damaged_or_incomplete_dump_is_named_in_one_line(run, tmp_path, capsys, edit, words):
    deltas = _copy(run, tmp_path)
    edit(deltas / "step-3")
    _refused(capsys, run, deltas, tmp_path / "tables.pt", EXIT_CHECKPOINT, *words)


def test_a_dump_of_another_run_is_refused_naming_both_runs(run, tmp_path, capsys):
    deltas = _copy(run, tmp_path)
    ours = checkpoint_run_id(run / "checkpoints" / "step-2")
    for step in (3, 4):
        manifest = json.loads((deltas / f"step-{step}" / MANIFEST).read_bytes())
        assert manifest["run_id"] == ours and manifest["format"] == FORMATS[0]  # no zch map: the first format
        _seal(deltas / f"step-{step}", {**manifest, "run_id": "0123abcd"})
    line = _refused(capsys, run, deltas, tmp_path / "tables.pt", EXIT_CHECKPOINT, "step-3", "run 0123abcd", f"run {ours}")
    assert "--overwrite" in line


def test_dumps_of_two_runs_are_never_applied_together(run, tmp_path):
    from tzrun_serving.deltas import apply_deltas

    deltas = _copy(run, tmp_path)
    manifest = json.loads((deltas / "step-4" / MANIFEST).read_bytes())
    _seal(deltas / "step-4", {**manifest, "run_id": "0123abcd"})
    base, step = checkpoint_tables(run / "checkpoints" / "step-2")
    with pytest.raises(CheckpointError, match="two runs"):
        apply_deltas(base, deltas, step)  # no run id given: the chain itself must be one run's


def test_a_checkpoint_without_a_run_id_cannot_take_dumps(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"step": 2}))
    with pytest.raises(CheckpointError, match="names no run_id.*cannot tell"):
        checkpoint_run_id(tmp_path)


@pytest.mark.parametrize("where, words", [
    ("missing", ["no such directory", "embedding_deltas"]),
    ("model_dir", ["holds no embedding dump"]),
    ("a_file", ["not a directory"]),
])
def test_a_mistyped_deltas_dir_is_an_error_not_the_base_tables(run, tmp_path, capsys, where, words):
    deltas = {"missing": run / "embedding_delta", "model_dir": run, "a_file": run / "checkpoints" / "step-2" / "meta.json"}[where]
    _refused(capsys, run, deltas, tmp_path / "tables.pt", EXIT_CHECKPOINT, str(deltas), *words)


def test_an_out_that_cannot_be_a_file_is_refused_before_anything_is_read(run, tmp_path, capsys):
    _refused(capsys, run, run / "embedding_deltas", tmp_path, EXIT_CANT_WRITE, str(tmp_path), "is a directory")
    out = tmp_path / "no" / "such" / "tables.pt"
    _refused(capsys, run, run / "embedding_deltas", out, EXIT_CANT_WRITE, str(out), "does not exist")
    assert not (tmp_path / "no").exists()


def test_train_overwrite_never_applies_the_replaced_runs_dumps(run, tmp_path, capsys, criteo_dir):
    model_dir = tmp_path / "run"
    shutil.copytree(run, model_dir)
    kept = tmp_path / "old-dumps"  # a copy of the replaced run's dumps, kept elsewhere
    shutil.copytree(run / "embedding_deltas", kept)
    old = checkpoint_run_id(run / "checkpoints" / "step-2")

    _train(model_dir, criteo_dir, 2, overwrite=True)  # a new run: checkpoint 2, dump 2

    new = checkpoint_run_id(model_dir / "checkpoints" / "step-2")
    assert new != old
    assert [s for s, _ in list_dumps(model_dir / "embedding_deltas")] == [2]  # the old dumps 3 and 4 are gone
    assert read_dump(model_dir / "embedding_deltas" / "step-2")["run_id"] == new
    out = tmp_path / "tables.pt"
    _refused(capsys, model_dir, kept, out, EXIT_CHECKPOINT, f"run {old}", f"run {new}")


def test_a_new_run_retires_another_runs_dumps_in_a_shared_dir(run, tmp_path, capsys, criteo_dir, caplog):
    shared = tmp_path / "shared"  # outside the model dir: --overwrite does not remove it
    shutil.copytree(run / "embedding_deltas", shared)
    shutil.copytree(shared / "step-4", shared / "step-9")  # a step the new run never reaches
    (shared / "step-7").mkdir()
    (shared / "step-7" / "notes.txt").write_text("not a dump")
    (shared / "README").write_text("kept")
    old = checkpoint_run_id(run / "checkpoints" / "step-2")
    model_dir = tmp_path / "new"

    with caplog.at_level(logging.INFO, logger="tzrun.embedding_deltas"):
        _train(model_dir, criteo_dir, 2, dumps_dir=str(shared))

    new = checkpoint_run_id(model_dir / "checkpoints" / "step-2")
    assert sorted(p.name for p in shared.iterdir()) == ["README", "step-2", "step-7"]
    assert (shared / "step-7" / "notes.txt").read_text() == "not a dump"
    assert read_dump(shared / "step-2")["run_id"] == new
    retired = [r.getMessage() for r in caplog.records if "retired" in r.getMessage()]
    assert len(retired) == 1 and "retired 3 dump(s)" in retired[0] and old in retired[0], retired
    assert any("step-7: left in place" in r.getMessage() for r in caplog.records)
    out = tmp_path / "tables.pt"
    code, stdout, err = _apply(capsys, model_dir / "checkpoints" / "step-2", shared, out)
    assert code == 0 and "table(s) at step 2" in stdout, err  # the new run's own dump: nothing after its checkpoint
