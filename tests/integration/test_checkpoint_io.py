"""How a checkpoint's bytes are hashed and written: each file is hashed as DCP writes it (the
manifest is the one re-reading every file gave), ``state/`` is checked as it is read, and a save
behind training (``train.async_checkpoint``) writes the same bytes as a synchronous one."""

from __future__ import annotations

import json

import pytest
import torch

from tests.integration.test_checkpoints import _train
from tests.integration.test_update_path import _process_group  # noqa: F401
from tzrun.errors import CheckpointError
from tzrun.runner import checkpoint
from tzrun.runner.async_checkpoint import BackgroundSaves
from tzrun.runner.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint, verify_checkpoint
from tzrun.runner.checkpoint_blobs import Blob
from tzrun.runner.manifest import MANIFEST, describe_files, listed_files

pytestmark = pytest.mark.slow

STEPS = ("train.num_steps=4", "train.save_checkpoints_steps=2", 'metrics=[{type = "auc"}]')


@pytest.fixture(scope="module")
def runs(tmp_path_factory, criteo_dir):
    """The same 4 steps three times, checkpoints every 2: written synchronously, behind training,
    and behind training with a budget no checkpoint fits (so written synchronously after all)."""
    root = tmp_path_factory.mktemp("io")
    _train(root / "sync", criteo_dir, *STEPS)
    _train(root / "async", criteo_dir, *STEPS, "train.async_checkpoint=true")
    _train(root / "budget", criteo_dir, *STEPS, "train.async_checkpoint=true", "train.async_checkpoint_budget_gb=1e-6")
    return root / "sync", root / "async", root / "budget"


def _state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))
    return {"model": model, "loop": Blob(lambda: {"step": 3, "name": "x"}, lambda _: None)}


def test_hashing_while_writing_gives_the_manifest_that_rereading_gave(runs, tmp_path, monkeypatch):
    described: list[str] = []

    def recording(root, names):
        names = list(names)
        described.extend(names)
        return describe_files(root, names)

    monkeypatch.setattr(checkpoint, "describe_files", recording)
    path = save_checkpoint(tmp_path, 3, state=_state(0), meta={"step": 3}, rank=0)
    assert not [n for n in described if n.endswith(".distcp")]  # the data files are never read back
    manifest = json.loads((path / MANIFEST).read_text())
    reread = [e.to_json() for e in describe_files(path, listed_files(path))]
    assert manifest["files"] == reread and manifest["version"] == 2
    assert {f["path"] for f in manifest["files"]} == {"meta.json", "state/.metadata", "state/__0_0.distcp"}


@pytest.mark.parametrize("where", [0, 0.5, -1], ids=["first-entry-header", "values", "last-byte"])
def test_state_is_checked_as_it_is_read_and_a_flipped_byte_is_refused(runs, tmp_path, where):
    """Wherever the byte is (a header torch's reader stumbles on, or values it would load
    silently), the error names the damaged file, not what torch made of it."""
    path = save_checkpoint(tmp_path, 3, state=_state(1), meta={"step": 3}, rank=0)
    data = path / "state" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    at = int(len(raw) * where) if isinstance(where, float) else where
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert verify_checkpoint(path, state_while_reading=True).state == "ok"  # its hash is left to the read
    with pytest.raises(CheckpointError, match=r"state/__0_0\.distcp: corrupted \(its SHA-256 differs") as caught:
        load_checkpoint(path, _state(2))
    assert str(caught.value).startswith(f"checkpoint {path} is damaged")
    fresh = _state(3)
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))
    load_checkpoint(path, fresh)
    assert torch.equal(fresh["model"][0].weight, _state(1)["model"][0].weight)


def _export(source, out, criteo_dir):
    from tests.integration.test_checkpoints import _config
    from tzrun.config.load import load_config
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.runner.session import Session
    from tzrun_serving.export import export_checkpoint

    raw, registries = _config(out / "run", criteo_dir)
    export_checkpoint(Session(load_config(raw, registries), raw, make_plugin_manager(), registries).facts, source,
                      out / "export")


def _delta_base(source, out, criteo_dir):
    from tzrun_serving.deltas import checkpoint_tables

    tables, step = checkpoint_tables(source)
    assert step == 4 and tables


def _init_from(source, out, criteo_dir):
    from tzrun.runner.init_from import InitFrom

    _train(out / "run", criteo_dir, "train.num_steps=1", init_from=InitFrom(str(source), load_optimizer=True))


@pytest.mark.parametrize("way", [_export, _delta_base, _init_from], ids=["export", "delta-base", "init-from"])
def test_every_way_out_reads_state_once_checked_as_read_and_refuses_a_flipped_byte(runs, tmp_path, monkeypatch, criteo_dir,
                                                                                    way):
    """An export, the base of ``ckpt apply-deltas`` and ``--init-from`` check ``state/`` as they
    read it, as a resume does: the verification before hashes every other file but not the
    state's (which used to be read twice), and a flipped byte is still refused, naming the file."""
    import shutil

    from tzrun.runner import manifest

    source = tmp_path / "source" / "checkpoints" / "step-4"
    shutil.copytree(runs[0] / "checkpoints" / "step-4", source)
    hashed: list[str] = []
    whole = manifest._file_blocks
    monkeypatch.setattr(manifest, "_file_blocks", lambda path, size: hashed.append(path.name) or whole(path, size))
    way(source, tmp_path / "first", criteo_dir)
    assert "meta.json" in hashed and not [name for name in hashed if name.endswith(".distcp")]
    data = source / "state" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"state/__0_0\.distcp: corrupted \(its SHA-256 differs") as caught:
        way(source, tmp_path / "second", criteo_dir)
    assert str(caught.value).startswith(f"checkpoint {source} is damaged")


def test_a_background_save_writes_the_same_checkpoint_and_completes_before_wait_returns(runs, tmp_path):
    saves = BackgroundSaves()
    try:
        path = saves.start(tmp_path / "bg", 3, state=_state(4), meta={"step": 3}, rank=0)
        assert saves.wait() == path
    finally:
        saves.close()
    same = save_checkpoint(tmp_path / "fg", 3, state=_state(4), meta={"step": 3}, rank=0)
    assert (path / "state" / "__0_0.distcp").read_bytes() == (same / "state" / "__0_0.distcp").read_bytes()
    assert verify_checkpoint(path).state == "ok"


@pytest.mark.parametrize("budget_gb", [None, 1e-4], ids=["host-available", "below-the-state"])
def test_a_background_save_over_its_budget_is_written_synchronously_and_says_so(runs, tmp_path, caplog, budget_gb):
    """The copy a save behind training makes is bounded: over the budget (here 1e-4 GiB, about
    105 KB, against the state's 265 KiB) the checkpoint is written at once, without a copy,
    complete when ``start`` returns; within it (the host's available memory), behind training."""
    from tzrun.runner.async_checkpoint import staged_bytes

    state = _state(5)
    assert staged_bytes(state) == (256 * 256 + 256 + 256 * 8 + 8) * 4  # the Linear layers' tensors; the blob has none
    saves = BackgroundSaves(budget_gb=budget_gb)
    with caplog.at_level("INFO", logger="tzrun"):
        try:
            path = saves.start(tmp_path / "run", 3, state=state, meta={"step": 3}, rank=0)
            complete_at_once = (path / "COMPLETE").exists()
            assert saves.wait() in (path, None)
        finally:
            saves.close()
    assert verify_checkpoint(path).state == "ok"
    same = save_checkpoint(tmp_path / "fg", 3, state=_state(5), meta={"step": 3}, rank=0)
    assert (path / "state" / "__0_0.distcp").read_bytes() == (same / "state" / "__0_0.distcp").read_bytes()
    said = [r.getMessage() for r in caplog.records if r.name == "tzrun"]
    if budget_gb is None:
        assert saves.synchronous_saves == 0 and not said
        return
    assert complete_at_once and saves.synchronous_saves == 1
    assert said == [
        "checkpoint step-3: copying it to write behind training would need 265.03 KiB on this host (1 rank), more than "
        "train.async_checkpoint_budget_gb = 0.0001; written synchronously instead (training waited for it). Raise "
        "train.async_checkpoint_budget_gb if the host has the memory, or leave train.async_checkpoint off"]


@pytest.mark.parametrize("other", [1, 2], ids=["behind-training", "over-its-budget"])
def test_async_and_sync_training_write_bit_identical_checkpoints(runs, other):
    sync_dir, async_dir = runs[0], runs[other]
    assert [s for s, _ in list_checkpoints(sync_dir)] == [s for s, _ in list_checkpoints(async_dir)] == [2, 4]
    for step in (2, 4):
        a, b = (d / "checkpoints" / f"step-{step}" for d in (sync_dir, async_dir))
        for name in listed_files(a):
            if name.endswith(".distcp"):
                assert (a / name).read_bytes() == (b / name).read_bytes(), name
        files = {f["path"]: f for f in json.loads((a / MANIFEST).read_text())["files"]}
        other_files = {f["path"]: f for f in json.loads((b / MANIFEST).read_text())["files"]}
        assert files["state/__0_0.distcp"] == other_files["state/__0_0.distcp"]
        assert verify_checkpoint(b).state == "ok"
    assert [json.loads(x) for x in (sync_dir / "eval_results.jsonl").read_text().splitlines()] == \
        [json.loads(x) for x in (async_dir / "eval_results.jsonl").read_text().splitlines()]
    log = (async_dir / "logs" / "train.log").read_text()
    assert ("written synchronously instead" in log) == (other == 2)



def test_a_value_an_error_still_holds_keeps_the_checkpoint_file_mapped(runs, tmp_path, monkeypatch):
    """A load that fails after taking a value from the mapped file (here a value of the wrong
    size) leaves that value readable, wherever the error's traceback keeps it: the file stays
    mapped until the value is freed (reading it used to touch unmapped pages and crash)."""
    import gc

    import torch.distributed._shard._utils as shard_utils

    path = save_checkpoint(tmp_path, 3, state=_state(1), meta={"step": 3}, rank=0)
    monkeypatch.setattr(shard_utils, "narrow_tensor_by_index", lambda tensor, *_: tensor[:1])
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp entry '.*': holds \(1, 256\) where \(256, 256\) is loaded") as caught:
        load_checkpoint(path, _state(2))
    held = [t for t in gc.get_objects() if type(t) is torch.Tensor and tuple(t.shape) == (1, 256)]
    assert held and all(torch.isfinite(t).all() for t in held)  # read from the file's pages
    del caught, held


def test_views_into_a_larger_buffer_are_saved_from_the_buffer_without_a_copy_and_load_back_exactly(runs, tmp_path, monkeypatch):
    """FBGEMM keeps a rank's tables in one buffer and each table is a view into it: DCP's writer
    cloned every such view before writing it (a second copy of the largest table in memory while
    a checkpoint was written). The save planner hands the writer the view's own bytes."""
    buffer = torch.arange(300_000, dtype=torch.float32)
    halves = torch.arange(40_000, dtype=torch.float32).to(torch.bfloat16)
    state = {"table_a": buffer[1_000:201_000].view(50_000, 4),  # at an offset, as every table but the first
             "table_b": buffer[201_000:].view(-1, 3),
             "bf16": halves[8_000:].view(-1, 8),
             "strided": buffer[:20_000].view(-1, 4)[:, :2]}  # not contiguous: DCP copies it, as before
    cloned: list[int] = []
    clone = torch.Tensor.clone

    def recording(self, *args, **kwargs):
        cloned.append(self.numel())
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", recording)
    path = save_checkpoint(tmp_path, 1, state=state, meta={"step": 1}, rank=0)
    monkeypatch.undo()
    assert cloned == [10_000]  # the strided view alone
    loaded = {key: torch.zeros_like(value) for key, value in state.items()}
    load_checkpoint(path, loaded)
    for key, value in state.items():
        assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key


#: (VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak, this pytest process's)
_LOAD_MEMORY = """
import sys, torch, torch.distributed as dist
from tzrun.runner.checkpoint import load_checkpoint
from tzrun.runner.manifest import hash_threads

def status(field):
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1])

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/group", rank=0, world_size=1)
state = {"table": torch.ones(6_250_000, 16)}  # every page of the state resident before the load
before = status("VmRSS:")
load_checkpoint(sys.argv[2], state)
print(hash_threads(), status("VmHWM:") - before)
"""


def test_a_load_holds_a_few_blocks_of_the_checkpoint_file_besides_the_state(runs, tmp_path):
    """A resume held the whole mapped file (each page the hash and the copy touched) on top of
    the state it loads: twice the state at its peak. Now each block is let go once used: the
    load holds a block for each hashing thread and the piece being copied (measured here, 2
    threads: about 200 MB over a 400 MB state; 440 MB before the blocks were let go)."""
    import subprocess
    import sys

    from tzrun.runner.manifest import BLOCK_SIZE as BLOCK

    path = save_checkpoint(tmp_path, 1, state={"table": torch.rand(6_250_000, 16)}, meta={"step": 1}, rank=0)
    script = tmp_path / "load_memory.py"
    script.write_text(_LOAD_MEMORY)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    state_kib = 400_000_000 // 1024
    threads, grown_kib = map(int, done.stdout.split()[-2:])
    few_blocks_kib = ((threads + 1) * BLOCK + (32 << 20)) >> 10
    assert grown_kib < min(few_blocks_kib, state_kib), (
        f"the load's peak grew by {grown_kib:,} KiB over a {state_kib:,} KiB state ({threads} hashing threads)")
    print(f"a load of a {state_kib:,} KiB state grew the peak by {grown_kib:,} KiB (blocks of {BLOCK >> 10:,} KiB, "
          f"{threads} hashing threads)")


def _rewrite_manifest(path, manifest: dict) -> None:
    """Replace a checkpoint's manifest and record its digest in the marker, as a save would."""
    from tzrun.io.files import write_atomic
    from tzrun.runner.manifest import MARKER, marker_bytes

    content = json.dumps(manifest, indent=1).encode()
    write_atomic(path / MANIFEST, content)
    write_atomic(path / MARKER, marker_bytes(manifest["step"], content))


def test_a_file_of_several_blocks_lists_each_blocks_hash_and_a_damaged_block_is_named_with_its_bytes(runs, tmp_path):
    """Format 2: a 100 MB state file is two 64 MiB blocks, each listed with the SHA-256 of its
    bytes; a flipped byte in the second is named with that block's bytes, by ``ckpt inspect``'s
    check and by a load (which checks the blocks on several threads as it reads)."""
    import hashlib

    from tzrun.runner.manifest import BLOCK_SIZE, check_checkpoint

    table = torch.rand(6_250_000, 4)
    path = save_checkpoint(tmp_path, 1, state={"table": table}, meta={"step": 1}, rank=0)
    data = path / "state" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    entry, = [f for f in json.loads((path / MANIFEST).read_text())["files"] if f["path"] == "state/__0_0.distcp"]
    assert entry["blocks"] == [hashlib.sha256(raw[i:i + BLOCK_SIZE]).hexdigest() for i in range(0, len(raw), BLOCK_SIZE)]
    assert len(entry["blocks"]) == 2
    loaded = {"table": torch.zeros_like(table)}
    load_checkpoint(path, loaded)
    assert torch.equal(loaded["table"], table)

    raw[BLOCK_SIZE + 12345] ^= 0x01
    data.write_bytes(bytes(raw))
    named = f"state/__0_0.distcp: corrupted (block 2 of 2, bytes {BLOCK_SIZE:,}-{len(raw):,}: its SHA-256 differs"
    assert check_checkpoint(path).problems[0].startswith(named)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path, loaded)
    assert named in str(caught.value)


def test_a_format_1_checkpoint_still_loads_and_a_flipped_byte_in_it_is_refused(runs, tmp_path):
    """A checkpoint an earlier tzrec-run wrote (one SHA-256 per file) loads to the same values,
    its state checked as it is read; damaged, it is refused naming the file."""
    import hashlib

    path = save_checkpoint(tmp_path, 3, state=_state(2), meta={"step": 3}, rank=0)
    files = [{"path": f["path"], "size": f["size"], "sha256": hashlib.sha256((path / f["path"]).read_bytes()).hexdigest()}
             for f in json.loads((path / MANIFEST).read_text())["files"]]
    _rewrite_manifest(path, {"version": 1, "step": 3, "files": files})
    loaded = _state(5)
    load_checkpoint(path, loaded)
    for got, want in zip(loaded["model"].parameters(), _state(2)["model"].parameters()):
        assert torch.equal(got, want)

    data = path / "state" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"state/__0_0\.distcp: corrupted \(its SHA-256 differs"):
        load_checkpoint(path, _state(5))


def test_a_manifest_of_a_newer_format_is_refused_naming_the_format(runs, tmp_path):
    from tzrun.runner.manifest import check_checkpoint

    path = save_checkpoint(tmp_path, 3, state=_state(3), meta={"step": 3}, rank=0)
    manifest = json.loads((path / MANIFEST).read_text())
    _rewrite_manifest(path, {**manifest, "version": 3})
    status = check_checkpoint(path)
    assert status.state == "unsupported" and "format 3" in status.problems[0]
    with pytest.raises(CheckpointError, match=r"manifest\.json: format 3, which this tzrec-run does not read .*a newer "
                                              r"tzrec-run wrote it"):
        load_checkpoint(path, _state(5))
