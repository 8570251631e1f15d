"""The ``embedding_deltas`` stage: a checkpoint's tables plus the dumps after it equal the tables
of a later checkpoint bit for bit, also across a resume after a crash between a dump and its
checkpoint; the dumps hold only the changed rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tzrun.config.load import load_config, parse_config
from tzrun_serving.deltas import apply_deltas, checkpoint_tables, list_dumps, read_dump
from tzrun.errors import CheckpointError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.testing import tiny_config_text

pytestmark = pytest.mark.slow


def _train(model_dir: Path, data_dir: Path, num_steps: int, *, resume: bool) -> None:
    import torch.distributed as dist

    from tzrun.runner.distributed import shutdown_distributed
    from tzrun.runner.session import Session
    from tzrun.runner.trainer import train

    pm = make_plugin_manager()
    registries = collect_registries(pm)
    raw = parse_config(tiny_config_text(data_dir, model_dir), "<tiny>", [
        f"train.num_steps={num_steps}", "train.save_checkpoints_steps=2", "train.keep_checkpoint_max=10",
        'train.stages=[{type = "embedding_deltas", every_n_steps = 3}]', f'data.eval_input="{data_dir / "eval"}"'])
    created = not dist.is_initialized()
    try:
        train(Session(load_config(raw, registries), raw, pm, registries), resume=resume, overwrite=not resume)
    finally:
        if created:
            shutdown_distributed()


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_base_plus_deltas_equals_the_checkpoint_bit_for_bit_across_a_resume(tmp_path, criteo_dir):
    model_dir = tmp_path / "run"
    deltas = model_dir / "embedding_deltas"
    _train(model_dir, criteo_dir, 6, resume=False)  # dumps at 3 and 6, checkpoints at 2, 4, 6
    assert [s for s, _ in list_dumps(deltas)] == [3, 6]
    base, step = checkpoint_tables(model_dir / "checkpoints" / "step-2")
    assert step == 2 and "model.deep_ebc.embedding_bags.cat_0_emb.weight" in base
    at6, _ = checkpoint_tables(model_dir / "checkpoints" / "step-6")
    applied, upto = apply_deltas(base, deltas, 2)
    assert upto == 6
    _equal(applied, at6)
    dump = read_dump(deltas / "step-6")
    changed = sum(p["ids"].numel() for part in dump["parts"] for p in part["tables"]["model.deep_ebc.embedding_bags.cat_0_emb.weight"])
    assert dump["previous"] == 3 and 0 < changed < 1000  # only the rows looked up in steps 4-6

    # a crash after the dump of step 6, before its checkpoint: resume from step 4
    shutil.rmtree(model_dir / "checkpoints" / "step-6")
    _train(model_dir, criteo_dir, 8, resume=True)  # the stale dump 6 goes; dumps 6 (from 3) and 8
    assert [s for s, _ in list_dumps(deltas)] == [3, 6, 8]
    assert read_dump(deltas / "step-6")["previous"] == 3  # step 4's ids came back from the checkpoint
    at8, _ = checkpoint_tables(model_dir / "checkpoints" / "step-8")
    for base_step in (2, 4):
        base, _ = checkpoint_tables(model_dir / "checkpoints" / f"step-{base_step}")
        applied, upto = apply_deltas(base, deltas, base_step)
        assert upto == 8
        _equal(applied, at8)

    shutil.rmtree(deltas / "step-3")  # a gap: the tables at 2 cannot reach 6
    with pytest.raises(CheckpointError, match="the dumps between are missing"):
        apply_deltas(checkpoint_tables(model_dir / "checkpoints" / "step-2")[0], deltas, 2)


def test_ckpt_apply_deltas_writes_the_tables_at_the_last_dump(tmp_path, criteo_dir):
    from tests.conftest import cli

    model_dir = tmp_path / "run"
    _train(model_dir, criteo_dir, 4, resume=False)  # dump 3 and, at the last step, 4
    out = tmp_path / "tables.pt"
    done = cli(["ckpt", "apply-deltas", str(model_dir / "checkpoints" / "step-2"), str(model_dir / "embedding_deltas"),
                    "--out", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "table(s) at step 4" in done.stdout
    _equal(torch.load(out, weights_only=True), checkpoint_tables(model_dir / "checkpoints" / "step-4")[0])


@pytest.mark.multiproc
@pytest.mark.parametrize("sharding", ["table_wise", "column_wise"])
def test_two_ranks_dump_the_rows_of_their_own_shards(tmp_path, criteo_dir, sharding):
    from tests.warm_ranks import warm_cli

    model_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    # tables 256 wide: TorchRec cuts column-wise shards of 128 columns
    config.write_text(tiny_config_text(criteo_dir, model_dir).replace("embedding_dim = 8",
                                                                      "embedding_dim = 256"))
    sets = ["train.num_steps=5", "train.save_checkpoints_steps=2", "train.keep_checkpoint_max=10",
            'train.stages=[{type = "embedding_deltas", every_n_steps = 2}]',
            f'train.global_embedding_constraints={{sharding_types = ["{sharding}"]}}']
    done = warm_cli(["train", str(config), *[a for s in sets for a in ("--set", s)], "--nproc-per-node", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    deltas = model_dir / "embedding_deltas"
    assert [s for s, _ in list_dumps(deltas)] == [2, 4, 5]
    dumps = [read_dump(p) for _, p in list_dumps(deltas)]
    assert all(len(d["parts"]) == 2 for d in dumps)
    offsets = {piece["col_offset"] for part in dumps[0]["parts"] for pieces in part["tables"].values() for piece in pieces}
    assert (offsets != {0}) == (sharding == "column_wise")  # column shards put their columns back in place
    base, step = checkpoint_tables(model_dir / "checkpoints" / "step-2")
    applied, upto = apply_deltas(base, deltas, step)
    assert upto == 5
    _equal(applied, checkpoint_tables(model_dir / "checkpoints" / "step-5")[0])


def _gather_worker(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 0 and 1 gather their changed ids at step 2; then rank 0 at step 4 while rank 1,
    having skipped that hook, is at its checkpoint of step 5."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from tzrun_serving.embedding_deltas import EmbeddingDeltasConfig, EmbeddingDeltasStage

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        stage, run = EmbeddingDeltasStage(EmbeddingDeltasConfig(every_n_steps=2)), SimpleNamespace(world_size=2)
        stage.record(torch.tensor([rank, 10 + rank]))
        together = stage._everyone(run, 2, "a dump").tolist()
        try:
            stage._everyone(run, 4, "a dump") if rank == 0 else stage._everyone(run, 5, "a checkpoint")
            apart = "no error"
        except RuntimeError as exc:
            apart = str(exc)
        Path(out_dir, f"rank{rank}.txt").write_text(f"{together}\n{apart}")
    finally:
        dist.destroy_process_group()


def test_ranks_that_gather_at_different_steps_stop_with_an_error_naming_them(tmp_path):
    """The dump's collective in tzrun_after_train_step (allowed by the hookspec at steps the step
    number picks): a rank that skipped it is named, not paired with another step's gather."""
    from tests.warm_ranks import warm_spawn

    # a mismatched gather hangs: that is the failure (the ranks are killed after 120 s)
    warm_spawn(_gather_worker, (str(tmp_path / "store"), str(tmp_path)), timeout=120)
    for rank in range(2):
        together, apart = (tmp_path / f"rank{rank}.txt").read_text().split("\n", 1)
        assert together == "[0, 1, 10, 11]"
        assert "rank 0: a dump at step 4, rank 1: a checkpoint at step 5" in apart, apart


ZCH_CAT_0 = 'zch = { size = 64, eviction_interval = 2, eviction_policy = { type = "lru" } }'
ZCH_MAP = "model.deep_ebc.managed._managed_collision_collection._managed_collision_modules.cat_0_emb"


def _train_zch(model_dir: Path, data_dir: Path, num_steps: int, *, resume: bool, nproc: int = 1) -> None:
    """The tiny config with cat_0 collision-free (64 rows, lru, an eviction every 2 steps)."""
    from tests.conftest import cli
    from tests.warm_ranks import warm_cli

    config = model_dir.parent / "zch.toml"
    config.write_text(tiny_config_text(data_dir, model_dir).replace('name = "cat_0"\nnum_buckets = 1000',
                                                                    f'name = "cat_0"\n{ZCH_CAT_0}'))
    sets = [f"train.num_steps={num_steps}", "train.save_checkpoints_steps=2", "train.keep_checkpoint_max=10",
            'train.stages=[{type = "embedding_deltas", every_n_steps = 3}]']
    args = ["train", str(config), *[a for s in sets for a in ("--set", s)], *(["--resume"] if resume else [])]
    done = warm_cli([*args, "--nproc-per-node", str(nproc)]) if nproc > 1 else cli(args)
    assert done.returncode == 0, done.stderr[-3000:]


def _held_by_row(tables: dict) -> torch.Tensor:
    from tzrun_serving.delta_maps import ids_by_row

    return ids_by_row(tables[ZCH_MAP + "._mch_sorted_raw_ids"], tables[ZCH_MAP + "._mch_remapped_ids_mapping"])


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.multiproc)])
def test_a_zch_tables_rows_and_id_to_row_map_apply_as_the_later_checkpoint(tmp_path, criteo_dir, nproc):
    model_dir = tmp_path / "run"
    deltas = model_dir / "embedding_deltas"
    _train_zch(model_dir, criteo_dir, 6, resume=False, nproc=nproc)  # dumps 3 and 6, checkpoints 2, 4, 6
    dump = read_dump(deltas / "step-6")
    assert dump["format"] == "tzrun-deltas/2" and dump["maps"][ZCH_MAP]["table"].endswith(".cat_0_emb.weight")
    at2, at6 = (checkpoint_tables(model_dir / "checkpoints" / f"step-{s}")[0] for s in (2, 6))
    assert ZCH_MAP + "._mch_sorted_raw_ids" in at2  # the base holds the map
    before, after = _held_by_row(at2), _held_by_row(at6)
    assert not torch.equal(before, after)  # ids admitted and evicted between the two
    applied, upto = apply_deltas(at2, deltas, 2)
    assert upto == 6
    _equal(applied, at6)  # every table's rows and every zch map, tensor for tensor

    # a crash after the dump of step 6, before its checkpoint: resume from step 4
    shutil.rmtree(model_dir / "checkpoints" / "step-6")
    _train_zch(model_dir, criteo_dir, 8, resume=True, nproc=nproc)
    at8, _ = checkpoint_tables(model_dir / "checkpoints" / "step-8")
    for base_step in (2, 4):
        applied, upto = apply_deltas(checkpoint_tables(model_dir / "checkpoints" / f"step-{base_step}")[0], deltas, base_step)
        assert upto == 8
        _equal(applied, at8)


def test_a_dump_that_would_give_one_raw_id_two_rows_is_refused(tmp_path, criteo_dir):
    import io

    model_dir = tmp_path / "run"
    _train_zch(model_dir, criteo_dir, 3, resume=False)
    at2, _ = checkpoint_tables(model_dir / "checkpoints" / "step-2")
    dump = model_dir / "embedding_deltas" / "step-3"
    part = torch.load(dump / "rank-0.pt", weights_only=True)
    piece = part["maps"][ZCH_MAP][0]
    held = piece["raw_ids"] != 2**63 - 1
    piece["raw_ids"][held.nonzero()[1]] = piece["raw_ids"][held.nonzero()[0]]
    buffer = io.BytesIO()
    torch.save(part, buffer)
    (dump / "rank-0.pt").write_bytes(buffer.getvalue())
    from tests.integration.test_delta_trust import _seal

    _seal(dump)
    with pytest.raises(CheckpointError, match="a raw id would be held by two rows"):
        apply_deltas(at2, model_dir / "embedding_deltas", 2)
