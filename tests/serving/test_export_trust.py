"""An export is data: a crafted one is refused before torch reads a byte of it (no pickle, no
code), a damaged one is named, and ``export --out`` / ``predict --output`` never remove what
tzrec-run did not write. Each payload is crafted here from a real export, its manifest and
``COMPLETE`` recomputed so that the hashes alone cannot refuse it (tests/serving/crafted.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.serving import crafted
from tzrun.cli.main import main
from tzrun.errors import EXIT_CANT_WRITE, EXIT_CHECKPOINT, CheckpointError


@pytest.fixture(scope="module")
def export(tiny_run) -> Path:
    """The shared run's newest export (a version directory)."""
    exports = tiny_run.model_dir / "exports"
    return exports / (exports / "latest").read_text().strip()


def _marker(tmp_path: Path) -> Path:
    return tmp_path / "payload-ran"


#: payloads that torch.export.load itself runs on this torch (checked first: the test is live)
LIVE = {"pickled_weight": crafted.pickled_weight, "pickled_sample_inputs": crafted.pickled_sample_inputs,
        "code_in_shape": crafted.code_in_shape}
OTHERS = {"code_in_guard": crafted.code_in_guard, "os_target": lambda _: crafted.os_target(),
          "shared_library": lambda _: crafted.extra_entry("data/aotinductor/model/model.so"),
          "legacy_pickled_weights": lambda _: crafted.extra_entry("data/weights/model.pt")}


@pytest.mark.parametrize("kind", sorted(LIVE))
def test_the_payloads_run_under_torch_export_load(export, tmp_path, kind):
    import torch

    bad = crafted.crafted_copy(export, tmp_path / "bad", LIVE[kind](_marker(tmp_path)))
    try:
        torch.export.load(str(bad / "model.pt2")).module()
    except Exception:
        pass  # torch fails after running the payload
    assert _marker(tmp_path).exists()


@pytest.mark.parametrize("kind", sorted(LIVE) + sorted(OTHERS))
def test_a_crafted_export_is_refused_before_torch_reads_it(export, tmp_path, kind):
    from tzrun_serving import Predictor

    bad = crafted.crafted_copy(export, tmp_path / "bad", {**LIVE, **OTHERS}[kind](_marker(tmp_path)))
    with pytest.raises(CheckpointError, match=r"model\.pt2: refused, nothing in it was loaded") as error:
        Predictor(bad)
    assert error.value.exit_code == EXIT_CHECKPOINT
    assert not _marker(tmp_path).exists()


def test_predict_export_refuses_a_crafted_export_directly_and_through_latest(tiny_run, export, tmp_path, capsys):
    versions = tmp_path / "versions"
    crafted.crafted_copy(export, versions / "step-9", crafted.pickled_weight(_marker(tmp_path)))
    (versions / "latest").write_text("step-9\n")
    config = tiny_run.model_dir.parent / "tiny.toml"
    rows = tiny_run.model_dir.parent / "tiny_data" / "eval"
    for source in (versions / "step-9", versions):
        out = tmp_path / f"scores-{source.name}.parquet"
        code = main(["predict", str(config), "--export", str(source), "--input", str(rows), "--output", str(out)])
        err = capsys.readouterr().err
        assert code == EXIT_CHECKPOINT, err
        assert "model.pt2: refused" in err and "use_pickle" in err and "Traceback" not in err
        assert not out.exists() and not _marker(tmp_path).exists()


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _edit_a_transform(export: Path) -> None:
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["features"]["dense"][0]["mean"] = 1000.0
    (export / "manifest.json").write_text(json.dumps(manifest))


DAMAGE = {
    "flipped_bit": (lambda d: _flip_a_bit(d / "model.pt2"), "model.pt2: does not match its SHA-256"),
    "truncated_program": (lambda d: (d / "model.pt2").write_bytes((d / "model.pt2").read_bytes()[:1000]),
                          "model.pt2: does not match its SHA-256"),
    "edited_transform": (_edit_a_transform, "manifest.json: does not match the SHA-256 that COMPLETE records"),
    "truncated_manifest": (lambda d: (d / "manifest.json").write_bytes((d / "manifest.json").read_bytes()[:100]),
                           "manifest.json: does not match"),
    "missing_manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json: missing"),
    "empty_complete": (lambda d: (d / "COMPLETE").write_text(""), "COMPLETE: empty"),
    "malformed_complete": (lambda d: (d / "COMPLETE").write_text("step 4\n"), "COMPLETE: not the marker of an export"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_export_is_named(export, tmp_path, kind):
    from tzrun_serving import Predictor

    damage, message = DAMAGE[kind]
    copy = tmp_path / "copy"
    shutil.copytree(export, copy)
    damage(copy)
    with pytest.raises(CheckpointError, match=message) as error:
        Predictor(copy)
    assert error.value.exit_code == EXIT_CHECKPOINT and "\n" not in str(error.value)


def test_paths_leading_out_of_the_export_are_refused(export, tmp_path):
    from tzrun_serving import Predictor

    versions = tmp_path / "versions"
    shutil.copytree(export, tmp_path / "elsewhere")
    versions.mkdir()
    (versions / "latest").write_text("../elsewhere\n")
    with pytest.raises(CheckpointError, match="not a version"):
        Predictor(versions)
    copy = tmp_path / "copy"
    shutil.copytree(export, copy)
    shutil.copy(copy / "model.pt2", tmp_path / "outside.pt2")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["programs"]["model"]["file"] = "../outside.pt2"
    manifest["files"] = {"../outside.pt2": manifest["files"]["model.pt2"]}
    body = json.dumps(manifest).encode()
    (copy / "manifest.json").write_bytes(body)
    (copy / "COMPLETE").write_text(json.dumps({"format": "tzrun-export/1", "manifest_sha256": hashlib.sha256(body).hexdigest()}))
    with pytest.raises(CheckpointError, match="not a hashed .pt2 file of this export"):
        Predictor(copy)


def _user_dir(path: Path) -> dict[str, bytes]:
    path.mkdir(parents=True)
    files = {"notes.txt": b"mine", "manifest.json": b'{"mine": true}', "old.pt2": b"not ours", "COMPLETE": b"step 4\n"}
    for name, body in files.items():
        (path / name).write_bytes(body)
    return files


def _contents(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_export_out_never_replaces_what_is_not_an_export_of_ours(tiny_run, tmp_path, capsys, monkeypatch):
    config = str(tiny_run.model_dir.parent / "tiny.toml")
    user = tmp_path / "user"
    files = _user_dir(user)
    checkpoint = tiny_run.model_dir / "checkpoints" / "step-4"
    before = _contents(checkpoint)
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    monkeypatch.chdir(user)
    for out in (str(user), str(checkpoint), str(a_file), "."):
        code = main(["export", config, "--checkpoint", "latest", "--out", out])
        err = capsys.readouterr().err.strip()
        assert code == EXIT_CANT_WRITE, err
        assert len(err.splitlines()) == 1 and "--out" in err, err
    assert _contents(user) == files
    assert _contents(checkpoint) == before
    assert a_file.read_text() == "mine"

    mine = tmp_path / "mine"
    assert main(["export", config, "--checkpoint", "latest", "--out", str(mine)]) == 0
    (mine / "notes.txt").write_text("added by hand")
    assert main(["export", config, "--checkpoint", "latest", "--out", str(mine)]) == EXIT_CANT_WRITE
    assert "notes.txt" in capsys.readouterr().err and (mine / "model.pt2").exists()
    (mine / "notes.txt").unlink()
    assert main(["export", config, "--checkpoint", "latest", "--out", str(mine)]) == 0  # ours alone: replaced


def test_predict_output_overwrite_never_removes_what_predict_did_not_write(tiny_run, tmp_path, capsys, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    config = str(tiny_run.model_dir.parent / "tiny.toml")
    rows = str(tiny_run.model_dir.parent / "tiny_data" / "eval")
    user = tmp_path / "user"
    files = _user_dir(user)
    checkpoint = tiny_run.model_dir / "checkpoints" / "step-4"
    before = _contents(checkpoint)
    monkeypatch.chdir(user)

    def predict(out: str, *more: str) -> int:
        return main(["predict", config, "--checkpoint", "latest", "--input", rows, "--output", out, *more])

    for out in (str(user), str(checkpoint), str(tiny_run.model_dir), "."):
        code = predict(out, "--overwrite")
        err = capsys.readouterr().err.strip()
        assert code == EXIT_CANT_WRITE, err
        assert len(err.splitlines()) == 1 and "--output" in err, err
    assert _contents(user) == files
    assert _contents(checkpoint) == before

    listing = tmp_path / "scores.skipped.parquet"  # a user's file named like the skipped-rows list
    pq.write_table(pa.table({"mine": [1, 2]}), listing)
    assert predict(str(tmp_path / "scores.parquet"), "--overwrite") == EXIT_CANT_WRITE
    assert "not a prediction file tzrec-run wrote" in capsys.readouterr().err
    assert pq.read_table(listing).column("mine").to_pylist() == [1, 2]
    listing.unlink()

    scores = tmp_path / "scores"
    assert predict(str(scores)) == 0
    assert predict(str(scores)) == EXIT_CANT_WRITE and "pass --overwrite" in capsys.readouterr().err
    assert predict(str(scores), "--overwrite") == 0  # ours: replaced
    assert (scores / "_SUCCESS").exists()
    assert predict(str(tmp_path / "one.parquet")) == 0
    assert predict(str(tmp_path / "one.parquet"), "--overwrite") == 0


def test_after_train_overwrite_only_the_new_runs_export_is_served(tiny_run, tmp_path):
    """A shared ``export.dir`` outside the model dir: the replaced run's version is retired when
    the new run starts, and ``latest`` names the new run's export."""
    from tests.conftest import cli
    from tzrun_serving.publish import latest_version, versions

    config = tiny_run.model_dir.parent / "tiny.toml"
    shared = tmp_path / "shared_exports"
    model_dir = tmp_path / "run"
    common = ["--model-dir", str(model_dir), "--set", f'export={{at_end=true, dir="{shared}"}}']
    first = cli(["train", str(config), *common])
    assert first.returncode == 0, first.stderr[-3000:]
    assert [s for s, _, _ in versions(shared)] == [4]
    again = cli(["train", str(config), *common, "--overwrite", "--set", "train.num_steps=2"])
    assert again.returncode == 0, again.stderr[-3000:]
    run_id = json.loads((model_dir / ".tzrec-run").read_text())["run_id"]
    assert [s for s, _, _ in versions(shared)] == [2]
    assert latest_version(shared).name == "step-2"
    assert json.loads((shared / "step-2" / "manifest.json").read_text())["checkpoint"]["run_id"] == run_id
    assert "retired" in again.stderr


def test_on_two_ranks_a_foreign_output_is_refused_by_rank_0_and_no_rank_waits(tiny_run, tmp_path):
    from tests.warm_ranks import warm_cli

    user = tmp_path / "user"
    files = _user_dir(user)
    done = warm_cli(["predict", str(tiny_run.model_dir.parent / "tiny.toml"), "--checkpoint", "latest", "--input",
                    str(tiny_run.model_dir.parent / "tiny_data" / "eval"), "--output", str(user), "--overwrite",
                    "--nproc-per-node", "2"], timeout=300)
    assert done.returncode == EXIT_CANT_WRITE, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("tzrec-run:")]
    assert len(lines) == 1 and "no tzrec-run marker" in lines[0], done.stderr[-3000:]
    assert _contents(user) == files


def test_predictions_an_earlier_version_wrote_are_still_replaced_with_overwrite(tiny_run, tmp_path):
    """A directory of parts and ``_SUCCESS`` without the marker (written before markers existed)."""
    config = str(tiny_run.model_dir.parent / "tiny.toml")
    rows = str(tiny_run.model_dir.parent / "tiny_data" / "eval")
    scores = tmp_path / "scores"
    assert main(["predict", config, "--checkpoint", "latest", "--input", rows, "--output", str(scores)]) == 0
    (scores / ".tzrec-run-output").unlink()
    assert main(["predict", config, "--checkpoint", "latest", "--input", rows, "--output", str(scores), "--overwrite"]) == 0
    assert sorted(p.name for p in scores.iterdir()) == [".tzrec-run-output", "_SUCCESS", "part-00000.parquet"]


def test_a_program_this_torch_cannot_read_is_one_line(export, tmp_path):
    """Allowed entries, but not a program torch can load (another archive version): exit 66."""
    from tzrun_serving import Predictor

    def other_version(entries: dict[str, bytes]) -> None:
        entries["archive_version"] = b"99"

    bad = crafted.crafted_copy(export, tmp_path / "bad", other_version)
    with pytest.raises(CheckpointError, match=r"model\.pt2: torch .* cannot load this program") as error:
        Predictor(bad)
    assert error.value.exit_code == EXIT_CHECKPOINT


def test_an_output_claim_killed_while_writing_its_marker_is_claimed_by_the_next_run(tmp_path):
    """The marker is written first, through a temporary file: a kill between the directory's
    creation and the marker's rename leaves the temporary alone (seen as a kill during
    ``predict``'s start), which the next run claims; beside anything else it proves nothing."""
    from tzrun.errors import WriteError
    from tzrun.io.owned import OUTPUT_MARKER, claim_output_dir, read_output_marker

    def parts(name: str) -> bool:
        return name.startswith("part-") or name == "_SUCCESS"

    temporary = f".{OUTPUT_MARKER}.tmp"
    staging = tmp_path / "scores.partial"
    staging.mkdir()
    (staging / temporary).write_text('{"format": 1, "ki')  # killed mid-write
    claim_output_dir(staging, "predictions", parts, flag="--output", overwrite=False)
    assert [p.name for p in staging.iterdir()] == [OUTPUT_MARKER] and read_output_marker(staging)["kind"] == "predictions"
    (staging / "part-00000.parquet").write_bytes(b"x")
    (staging / temporary).write_text("{")  # a later claim of it killed while rewriting the marker
    claim_output_dir(staging, "predictions", parts, flag="--output")
    assert [p.name for p in staging.iterdir()] == [OUTPUT_MARKER]

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / temporary).write_text("{")
    (theirs / "notes.txt").write_text("keep")
    with pytest.raises(WriteError, match=r"not empty and not a tzrec-run predictions \(it has no tzrec-run marker"):
        claim_output_dir(theirs, "predictions", parts, flag="--output", overwrite=True)
    assert sorted(p.name for p in theirs.iterdir()) == [temporary, "notes.txt"]  # nothing changed
