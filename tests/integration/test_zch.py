"""DeepFM with collision-free ids (``zch``) on two id features: it trains on 2 CPU ranks with the
zch tables sharded row-wise through TorchRec's managed-collision collection (their managed state
in the checkpoint), a run stopped by a signal between two evictions resumes exactly as the
uninterrupted run (the same loss at every step, the same weights at the end), and an export,
carrying each table's id-to-row map, scores the rows as the checkpoint does on 1 and 2 ranks. A
checkpoint reshards 2 -> 1, and 1 -> 2: every id it keeps scores as on one rank, and training goes on;
``--init-from`` loads it onto fewer or more ranks, every id it keeps with its row (and optimizer state)."""

from __future__ import annotations

import collections
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import tzrun
from tests.checkpoint_entries import read_saved, saved_tensors
from tests.conftest import REPO, cli
from tests.integration import fault_plugin
from tests.integration.test_resume import Losses
from tests.warm_ranks import warm_cli
from tzrun.config.load import load_config, parse_config
from tzrun.data.ids import zch_raw_ids
from tzrun.errors import EXIT_STOPPED_BY_SIGNAL, TzrunError
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.checkpoint import list_checkpoints
from tzrun.runner.init_from import InitFrom
from tzrun.runner.session import Session
from tzrun.runner.trainer import train

pytestmark = pytest.mark.slow

ZCH = {
    "cat_0": "zch = { size = 64, eviction_interval = 2 }",
    "cat_1": 'zch = { size = 32, eviction_interval = 2, eviction_policy = { type = "lru" }, '
             'admission = { type = "threshold", min_count = 2 } }',
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,048 training and 1,024 eval rows of synthetic Criteo (read-only)."""
    from tzrun_tools.synth import synth_criteo

    root = tmp_path_factory.mktemp("zch_criteo")
    synth_criteo(root, rows=2048, eval_rows=1024, seed=1, rows_per_file=1024, row_group_size=512)
    return root


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DeepFM example with cat_0 and cat_1 collision-free."""
    text = (REPO / "examples" / "deepfm_criteo.toml").read_text()
    for name, zch in ZCH.items():
        text, n = re.subn(rf'name = "{name}"\nnum_buckets = \d+', f'name = "{name}"\n{zch}', text)
        assert n == 1, name
    path = tmp_path_factory.mktemp("zch_config") / "deepfm_zch.toml"
    path.write_text(text)
    return path


def _sets(data: Path, model_dir: Path, *extra: str) -> list[str]:
    sets = [f'data.train_input="{data / "train"}"', f'data.eval_input="{data / "eval"}"', f'model_dir="{model_dir}"',
            "data.batch_size=256", "data.eval_batch_size=512", "data.num_workers=0", "model.deep_hidden_units=[16]",
            "model.final_hidden_units=[8]", *extra]
    return [a for s in sets for a in ("--set", s)]


#: the 2-rank runs: 4 steps, evictions after steps 2 and 4, a checkpoint at 3 (between them)
TWO_RANKS = ("train.log_every_n_steps=1", "train.save_checkpoints_steps=3")


def _train_two_ranks(config: Path, data: Path, model_dir: Path, *args: str, env: dict[str, str] | None = None):
    return warm_cli(["train", str(config), *_sets(data, model_dir, *TWO_RANKS), "--nproc-per-node", "2", *args], env=env)


@pytest.fixture(scope="module")
def two_ranks(data: Path, config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config trained on 2 ranks, uninterrupted: its model dir (read-only)."""
    model_dir = tmp_path_factory.mktemp("zch_two_ranks") / "run"
    proc = _train_two_ranks(config, data, model_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return model_dir


@pytest.mark.multiproc
def test_deepfm_with_zch_on_two_id_features_trains_on_two_ranks(data, config, two_ranks, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(two_ranks, model_dir)  # resumed below
    result = json.loads((model_dir / "eval_results.jsonl").read_text().splitlines()[-1])
    assert result["step"] == 4 and 0.0 <= result["auc"] <= 1.0
    meta = json.loads((model_dir / "checkpoints" / "step-4" / "meta.json").read_text())
    assert meta["world_size"] == 2
    for table in ("cat_0_emb", "cat_1_emb", "cat_0_emb_wide"):
        assert f"{table}" in meta["plan"] and re.search(rf"{table}\s*\|\s*row_wise", meta["plan"]), table
    saved = (model_dir / "checkpoints" / "step-4" / "state" / ".metadata").read_bytes()
    assert b"_mch_sorted_raw_ids" in saved and b"_mch_remapped_ids_mapping" in saved  # the id -> row map
    windows = read_saved(model_dir / "checkpoints" / "step-4", "rank.1")["zch_windows"]
    assert len(windows) == 4  # this rank's managed slice of each zch table, deep and wide
    by_export, by_checkpoint = _export_and_predict(config, data, model_dir, tmp_path, "--nproc-per-node", "2")
    _assert_same_scores(by_export, by_checkpoint)  # an id missing reads the miss row of its own rank's slice
    # 2 -> 1: the maps reshard with their tables, into one slice each
    resumed = cli(["train", str(config), *_sets(data, model_dir, "train.num_epochs=2", "train.log_every_n_steps=1"),
                   "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    records = [r for r in _train_records(model_dir) if r["step"] > 4]
    first = records[0]["zch"]["cat_0_emb"]
    assert records[0]["step"] == 5 and first["rows_in_use"] == 2 * 31  # both slices' ids, before any eviction
    assert first["misses"] < first["ids_seen"] == 256  # the ids held on 2 ranks find their rows on 1


@pytest.mark.multiproc
def test_a_two_rank_zch_run_killed_between_evictions_resumes_bit_exactly(data, config, two_ranks, tmp_path):
    model_dir = tmp_path / "run"
    # rank 1 gets SIGTERM after step 2 (an eviction); both ranks stop at the checkpoint of step 3
    env = {**fault_plugin.install(tmp_path / "site"), fault_plugin.ENV: "signal@2:1:SIGTERM"}
    stopped = _train_two_ranks(config, data, model_dir, env=env)
    assert stopped.returncode == EXIT_STOPPED_BY_SIGNAL, stopped.stderr[-4000:]
    assert [s for s, _ in list_checkpoints(model_dir)] == [3]
    windows = read_saved(model_dir / "checkpoints" / "step-3", "rank.1")["zch_windows"]
    assert all(w["history"].numel() > 0 for w in windows.values())  # step 3's ids wait for the eviction at 4
    resumed = _train_two_ranks(config, data, model_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resuming from" in resumed.stderr
    losses = {r["step"]: r["loss"] for r in _train_records(model_dir)}
    assert len(losses) == len(_train_records(model_dir))  # no step twice
    assert losses == {r["step"]: r["loss"] for r in _train_records(two_ranks)} and sorted(losses) == [1, 2, 3, 4]
    whole, split = saved_tensors(two_ranks / "checkpoints" / "step-4"), saved_tensors(model_dir / "checkpoints" / "step-4")
    assert whole.keys() == split.keys()
    assert {k.rsplit(".", 1)[-1] for k in whole} >= {"weight", "_mch_sorted_raw_ids", "_mch_remapped_ids_mapping",
                                                      "_mch_counts", "_mch_last_access_iter"}
    assert any(k.startswith("optimizer.") for k in whole)
    assert [k for k in whole if not torch.equal(whole[k], split[k])] == []  # weights, optimizer state, maps


def _train_records(model_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (model_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def _train(data: Path, config: Path, model_dir: Path, recorder: Losses | None = None, resume: bool = False, *,
           steps: int = 8, init: InitFrom | None = None, evaluate: bool = False, extra: tuple[str, ...] = ()):
    """Train in this process (``evaluate``: with the eval input and the config's metrics)."""
    pm = make_plugin_manager(plugins=[("losses", recorder or Losses())])
    registries = collect_registries(pm)
    quiet = () if evaluate else ("metrics=[]",)
    overrides = [s for s in _sets(data, model_dir, f"train.num_steps={steps}", "train.save_checkpoints_steps=3", *quiet,
                                  "train.stages=[]", *extra) if s != "--set"]
    text = config.read_text().replace("num_epochs = 1", f"num_steps = {steps}")
    if not evaluate:
        text = text.replace(f'eval_input = "data/criteo_synth/eval"\n', "")
        overrides = [o for o in overrides if not o.startswith("data.eval_input")]
    raw = parse_config(text, str(config), overrides)
    return train(Session(load_config(raw, registries), raw, pm, registries), resume=resume, init_from=init)


def _weights(model) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in model.state_dict().items():
        tensor = value.local_shards()[0].tensor if hasattr(value, "local_shards") else value
        out[key] = tensor.detach().clone()
    return out


def test_a_zch_run_stopped_between_evictions_resumes_as_the_uninterrupted_run(data, config, tmp_path):
    whole = Losses()
    uninterrupted = _train(data, config, tmp_path / "whole", whole)
    first = Losses(signal_at=5)  # eviction every 2 steps: step 5 is one step into a window
    stopped = _train(data, config, tmp_path / "split", first)
    assert stopped.stopped_by == "SIGUSR1" and [s for s, _ in list_checkpoints(tmp_path / "split")] == [3, 5]
    rest = Losses()
    resumed = _train(data, config, tmp_path / "split", rest, resume=True)
    assert resumed.steps == 8 and sorted(rest.steps) == [6, 7, 8]
    assert {**first.steps, **rest.steps} == whole.steps
    a, b = _weights(uninterrupted.model), _weights(resumed.model)
    assert any("_mch_sorted_raw_ids" in k for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _held(model_dir: Path, table_key: str) -> torch.Tensor:
    """The raw ids a zch table of the run's last checkpoint holds (every slice's)."""
    view = tzrun.find_checkpoint(model_dir, "latest")
    key = f"model.model.{table_key}._mch_sorted_raw_ids"
    state = {key: torch.empty(view.tensor_shapes()[key], dtype=torch.int64)}
    view.load_state(state)
    return state[key][state[key] < 2**63 - 1]


def _export_and_predict(config: Path, data: Path, model_dir: Path, tmp: Path, *ranks: str) -> tuple[Path, Path]:
    """Export the run's last checkpoint, and score the eval rows with it and with the checkpoint
    (on ``ranks``' ranks): the two prediction files."""
    sets = _sets(data, model_dir)
    made = cli(["export", str(config), *sets, "--out", str(tmp / "export")])
    assert made.returncode == 0, made.stderr[-3000:]
    by_export = cli(["predict", str(config), *sets, "--export", str(tmp / "export"), "--input", str(data / "eval"),
                     "--output", str(tmp / "export.parquet")])
    assert by_export.returncode == 0, by_export.stderr[-3000:]
    command = ["predict", str(config), *sets, "--checkpoint", "latest", "--input", str(data / "eval"),
               "--output", str(tmp / "checkpoint.parquet"), *ranks]
    by_checkpoint = warm_cli(command) if ranks else cli(command)
    assert by_checkpoint.returncode == 0, by_checkpoint.stderr[-3000:]
    return tmp / "export.parquet", tmp / "checkpoint.parquet"


def _assert_same_scores(a: Path, b: Path) -> None:
    np.testing.assert_allclose(pq.read_table(a).column("probs").to_numpy(), pq.read_table(b).column("probs").to_numpy(),
                               rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def one_rank(data: Path, config: Path, tmp_path_factory: pytest.TempPathFactory):
    """The config trained on 1 rank (8 steps, a train record every 2): its model dir and the
    train command's result (read-only)."""
    model_dir = tmp_path_factory.mktemp("zch_one_rank") / "run"
    done = cli(["train", str(config), *_sets(data, model_dir, "train.log_every_n_steps=2")])
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir, done


def test_an_export_of_a_zch_run_scores_as_its_checkpoint(data, config, one_rank, tmp_path):
    model_dir, _ = one_rank
    by_export, by_checkpoint = _export_and_predict(config, data, model_dir, tmp_path)
    _assert_same_scores(by_export, by_checkpoint)
    raw = torch.from_numpy(zch_raw_ids(pq.read_table(data / "eval").column("cat_0").to_numpy()))
    held = torch.isin(raw, _held(model_dir, "deep_ebc.managed._managed_collision_collection._managed_collision_modules."
                                            "cat_0_emb"))
    assert held.any() and not held.all()  # the rows read trained rows of their own and the miss row


def test_the_train_records_count_each_zch_tables_lookups_misses_admissions_evictions_and_rows_in_use(data, one_rank):
    model_dir, done = one_rank
    records = _train_records(model_dir)
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert set(records[0]["zch"]) == {"cat_0_emb", "cat_1_emb", "cat_0_emb_wide", "cat_1_emb_wide"}
    first, last = records[0]["zch"]["cat_0_emb"], records[-1]["zch"]["cat_0_emb"]
    assert first["ids_seen"] == last["ids_seen"] == 2 * 256  # one cat_0 id a row, 256 rows a step, 2 steps a window
    assert first["misses"] >= 256  # the first step's ids: no id holds a row before the first eviction
    assert 0 < last["misses"] < last["ids_seen"] and last["miss_share"] == last["misses"] / last["ids_seen"]
    # the first eviction gave all 64 rows but the miss row to new ids, and took none from an id
    assert first["admitted"] == first["rows_in_use"] == 63 and first["evicted"] == 0
    assert last["rows_in_use"] == 63 and last["occupancy"] == 63 / 64
    for table in records[0]["zch"]:  # every window: the rows in use change by the ids admitted less those evicted
        used = [0] + [r["zch"][table]["rows_in_use"] for r in records]
        assert all(used[i] + r["zch"][table]["admitted"] - r["zch"][table]["evicted"] == used[i + 1]
                   for i, r in enumerate(records)), table
    assert sum(r["zch"]["cat_0_emb"]["evicted"] for r in records) > 0
    # cat_1's threshold (min_count = 2): an id enters only if looked up twice in the window
    cat_1 = pq.read_table(data / "train").column("cat_1").to_pylist()
    for i, record in enumerate(records):
        window = collections.Counter(cat_1[512 * i: 512 * (i + 1)])  # no shuffle: steps 2i+1 and 2i+2 read these rows
        assert record["zch"]["cat_1_emb"]["admitted"] <= sum(n >= 2 for n in window.values()) < len(window)
    assert "zch/cat_0_emb=miss " in done.stderr + done.stdout and " adm 63 ev 0" in done.stderr + done.stdout


#: lr 0 everywhere: a step changes no weight (and with eviction_interval = 2, no map)
FROZEN = ('train.sparse_optimizer={type = "sgd", lr = 0.0}', 'train.dense_optimizer={type = "sgd", lr = 0.0}')


def test_a_run_initialized_from_a_zch_run_looks_up_the_same_rows_for_the_same_ids(data, config, one_rank, tmp_path):
    source, _ = one_rank
    tuned = _train(data, config, tmp_path / "tuned", steps=1, init=InitFrom(str(source)), evaluate=True, extra=FROZEN)
    report = json.loads((tmp_path / "tuned" / "init_report.json").read_text())
    assert any(k.endswith("cat_0_emb._mch_sorted_raw_ids") for k in report["loaded"]) and not report["missing"]
    before = json.loads((source / "eval_results.jsonl").read_text().splitlines()[-1])
    assert before["step"] == 8 and tuned.eval.metrics["auc"] == before["auc"]  # every eval row scored as the source did


@pytest.fixture(scope="module")
def hash_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DeepFM example without zch (cat_0 and cat_1 by num_buckets), trained 1 step: its model dir."""
    model_dir = tmp_path_factory.mktemp("zch_hash_run") / "run"
    _train(data, REPO / "examples" / "deepfm_criteo.toml", model_dir, steps=1)
    return model_dir


def test_init_from_between_a_hash_and_a_zch_table_is_refused_naming_the_table(data, config, one_rank, hash_run, tmp_path):
    with pytest.raises(TzrunError) as refused:
        _train(data, config, tmp_path / "a", steps=1, init=InitFrom(str(hash_run)))
    message = str(refused.value)
    assert "\n" not in message and "'deep_ebc" not in message  # one line, one problem per table, not per tensor
    assert ("table 'cat_0_emb' has zch here, and the checkpoint holds no id-to-row map for it" in message
            and "start the table fresh with --init-allow-missing '*.cat_0_emb.*' --init-allow-unexpected '*.cat_0_emb.*'"
            in message and "table 'cat_1_emb_wide' has zch here" in message)
    with pytest.raises(TzrunError, match=r"table 'cat_0_emb' has zch in the checkpoint and not here: .*give its feature "
                                         r"the zch block it had, or start the table fresh"):
        _train(data, REPO / "examples" / "deepfm_criteo.toml", tmp_path / "b", steps=1, init=InitFrom(str(one_rank[0])))
    names = tmp_path / "names.txt"  # a hash table's rows renamed into a zch table
    names.write_text("deep_ebc.managed._embedding_module.embeddings.cat_0_emb.weight deep_ebc.embedding_bags.cat_0_emb.weight\n")
    with pytest.raises(TzrunError, match=r"table 'cat_0_emb' has zch here, and its rows would load from the checkpoint's "
                                         r"'deep_ebc\.embedding_bags\.cat_0_emb\.weight', which has no id-to-row map"):
        _train(data, config, tmp_path / "c", steps=1, init=InitFrom(str(hash_run), name_map=str(names)))


def test_the_zch_tables_start_fresh_when_allowed_and_the_rest_loads_from_a_hash_run(data, config, hash_run, tmp_path):
    tables = [f"*.{t}.*" for t in ("cat_0_emb", "cat_1_emb", "cat_0_emb_wide", "cat_1_emb_wide")]
    _train(data, config, tmp_path / "tuned", steps=1, extra=FROZEN,
           init=InitFrom(str(hash_run), allow_missing=tuple(tables), allow_unexpected=tuple(tables)))
    report = json.loads((tmp_path / "tuned" / "init_report.json").read_text())
    assert "deep_ebc.managed._embedding_module.embeddings.cat_0_emb.weight" in report["missing"]
    assert "deep_ebc.embedding_bags.cat_0_emb.weight" in report["unexpected"]
    # a plain table of a collection that holds a zch table now: found under its old name
    moved = "deep_ebc.plain.embedding_bags.cat_2_emb.weight"
    assert report["renamed"][moved] == "deep_ebc.embedding_bags.cat_2_emb.weight"
    source, tuned = saved_tensors(list_checkpoints(hash_run)[-1][1]), saved_tensors(tmp_path / "tuned" / "checkpoints" / "step-1")
    assert torch.equal(tuned[f"model.model.{moved}"], source["model.model.deep_ebc.embedding_bags.cat_2_emb.weight"])
    assert torch.equal(tuned["model.model.deep.0.weight"], source["model.model.deep.0.weight"])
    assert _held(tmp_path / "tuned", "deep_ebc.managed._managed_collision_collection._managed_collision_modules."
                                      "cat_0_emb").numel() == 0  # a fresh map (no eviction in its one step)


def _rows_by_id(tensors: dict[str, torch.Tensor], table: str, state: str = "weight") -> dict[int, torch.Tensor]:
    """A saved zch table's rows by the raw id that holds each (every slice's): its weights, or
    the sparse optimizer's ``state`` (``momentum1``: row-wise adagrad's accumulator)."""
    prefix = f"model.model.deep_ebc.managed._managed_collision_collection._managed_collision_modules.{table}."
    ids, rows = tensors[prefix + "_mch_sorted_raw_ids"], tensors[prefix + "_mch_remapped_ids_mapping"]
    weight = f"deep_ebc.managed._embedding_module.embeddings.{table}.weight"
    values = tensors[f"model.model.{weight}"] if state == "weight" else next(
        v for k, v in tensors.items() if k.startswith("optimizer.") and f".{weight}." in k and k.endswith(f".{state}"))
    return {int(i): values[int(r)] for i, r in zip(ids, rows) if int(i) < 2**63 - 1}


def _init_on_two_ranks(config: Path, data: Path, source: Path, model_dir: Path, tmp: Path):
    """One step on 2 warm ranks from ``source`` with --init-optimizer, the config's optimizers at
    learning rate 0 (weights unchanged; row-wise adagrad's accumulator grows only for the rows
    the step looks up: at most 2 x 8 per table), no evaluation."""
    text = config.read_text().replace("num_epochs = 1", "num_steps = 1").replace('eval_input = "data/criteo_synth/eval"\n', "")
    (tmp / "one_step.toml").write_text(text)
    frozen = ('train.sparse_optimizer={type = "rowwise_adagrad", lr = 0.0}', 'train.dense_optimizer={type = "adam", lr = 0.0}')
    sets = [s for s in _sets(data, model_dir, "data.batch_size=8", "metrics=[]", "train.stages=[]", *frozen)
            if s != "--set" and not s.startswith("data.eval_input")]
    return warm_cli(["train", str(tmp / "one_step.toml"), *[a for s in sets for a in ("--set", s)], "--init-from",
                     str(source), "--init-optimizer", "--nproc-per-node", "2"])


@pytest.mark.multiproc
def test_init_from_a_zch_run_on_fewer_or_more_ranks_gives_every_id_that_fits_its_row(data, config, two_ranks, one_rank,
                                                                                     tmp_path):
    _train(data, config, tmp_path / "tuned", steps=1, init=InitFrom(str(two_ranks)), extra=FROZEN)
    source = _rows_by_id(saved_tensors(two_ranks / "checkpoints" / "step-4"), "cat_0_emb")
    loaded = _rows_by_id(saved_tensors(tmp_path / "tuned" / "checkpoints" / "step-1"), "cat_0_emb")
    assert len(source) == 2 * 31 and source.keys() == loaded.keys()  # both slices' ids, in one slice now
    assert all(torch.equal(source[i], loaded[i]) for i in source)
    # 1 -> 2: each table split by raw id as --resume splits it, the optimizer's rows with it
    done = _init_on_two_ranks(config, data, one_rank[0], tmp_path / "grown", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "do not fit slice" in done.stderr
    before = saved_tensors(one_rank[0] / "checkpoints" / "step-8")
    after = saved_tensors(tmp_path / "grown" / "checkpoints" / "step-1")
    maps = "deep_ebc.managed._managed_collision_collection._managed_collision_modules"
    for table, score in (("cat_0_emb", "counts"), ("cat_1_emb", "last_access_iter")):  # lfu, lru
        source, loaded = _rows_by_id(before, table), _rows_by_id(after, table)
        dropped = set(_dropped_on_two_ranks(one_rank[0], f"{maps}.{table}", score).tolist())
        assert dropped and dropped < set(source) and loaded.keys() == source.keys() - dropped, table
        assert all(torch.equal(source[i], loaded[i]) for i in loaded), table
        old, new = _rows_by_id(before, table, "momentum1"), _rows_by_id(after, table, "momentum1")
        assert all(new[i] >= old[i] for i in new) and sum(bool(new[i] != old[i]) for i in new) <= 16, table
        assert all(old[i] > 0 for i in new), table  # a fresh state (zero) would have failed the line above


def _dropped_on_two_ranks(model_dir: Path, table_key: str, score: str) -> torch.Tensor:
    """The raw ids a zch table of the run's last checkpoint (one rank) holds that do not fit
    their slice of 2: in each slice, beyond its ``rows / 2 - 1`` ids by descending ``score``
    (the policy's ``_mch_`` buffer; ties: lower raw id)."""
    view = tzrun.find_checkpoint(model_dir, "latest")
    prefix = f"model.model.{table_key}."
    state = {prefix + k: torch.empty(view.tensor_shapes()[prefix + k], dtype=torch.int64)
             for k in ("_mch_sorted_raw_ids", f"_mch_{score}")}
    view.load_state(state)
    raw, scores = state[prefix + "_mch_sorted_raw_ids"], state[prefix + f"_mch_{score}"]
    fit, dropped = raw.numel() // 2 - 1, []
    for rank in range(2):
        mine = [(-int(s), int(i)) for i, s in zip(raw, scores) if i < 2**63 - 1 and i // 2**62 == rank]
        dropped += [i for _, i in sorted(mine)[fit:]]
    return torch.tensor(dropped, dtype=torch.int64)


@pytest.mark.multiproc
def test_a_one_rank_zch_run_resumes_and_predicts_on_two_ranks_with_every_id_it_keeps_on_its_row(data, config, one_rank,
                                                                                                  tmp_path):
    import shutil

    model_dir, _ = one_rank
    sets = _sets(data, model_dir)
    scores = {}
    for ranks in ((), ("--nproc-per-node", "2")):
        out = tmp_path / f"ranks{len(ranks)}.parquet"
        command = ["predict", str(config), *sets, "--checkpoint", "latest", "--input", str(data / "eval"), "--output",
                   str(out), *ranks]
        done = warm_cli(command) if ranks else cli(command)
        assert done.returncode == 0, done.stderr[-3000:]
        scores[ranks] = pq.read_table(out).column("probs").to_numpy()
    maps = "managed._managed_collision_collection._managed_collision_modules"
    eval_rows, dropped_rows = pq.read_table(data / "eval"), np.zeros(1024, dtype=bool)
    for feature, score in (("cat_0", "counts"), ("cat_1", "last_access_iter")):  # lfu, lru
        raw = torch.from_numpy(zch_raw_ids(eval_rows.column(feature).to_numpy()))
        for table in (f"deep_ebc.{maps}.{feature}_emb", f"wide_ebc.{maps}.{feature}_emb_wide"):
            dropped = _dropped_on_two_ranks(model_dir, table, score)
            assert dropped.numel() > 0  # both tables full: a slice of 2 cannot hold all its ids
            dropped_rows |= torch.isin(raw, dropped).numpy()
    one, two = scores[()], scores[("--nproc-per-node", "2")]
    assert 0 < dropped_rows.sum() < 1024 / 2
    # every id kept (and every id the table does not hold: the miss rows) reads the row it read on one rank
    np.testing.assert_allclose(two[~dropped_rows], one[~dropped_rows], rtol=0, atol=1e-6)
    assert not np.allclose(two[dropped_rows], one[dropped_rows], rtol=0, atol=1e-6)  # a dropped id reads the miss row
    resumed_dir = tmp_path / "run"
    shutil.copytree(model_dir, resumed_dir)
    resumed = warm_cli(["train", str(config), *_sets(data, resumed_dir, "train.num_epochs=2", "train.log_every_n_steps=1"),
                        "--resume", "--nproc-per-node", "2"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "do not fit slice" in resumed.stderr
    records = [r for r in map(json.loads, (resumed_dir / "metrics.jsonl").read_text().splitlines())
               if r["kind"] == "train" and r["step"] > 8]
    # an epoch of 2,048 rows is 4 steps of 2 x 256 on 2 ranks
    assert [r["step"] for r in records] == list(range(9, 13)) and all(np.isfinite(r["loss"]) for r in records)
    first = records[0]["zch"]["cat_0_emb"]
    assert first["rows_in_use"] == 31 and first["misses"] < first["ids_seen"]  # rank 0's slice of 32 rows, full
    assert json.loads((resumed_dir / "checkpoints" / "step-12" / "meta.json").read_text())["world_size"] == 2
