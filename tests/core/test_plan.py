"""``tzrec-run plan``: TorchRec's planner on the meta device, for clusters this machine is not."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO
from tzrun.cli.main import EXIT_CONFIG, main
from tzrun.errors import EXIT_USAGE
from tzrun.testing import tiny_config_text

FULL = REPO / "examples" / "deepfm_criteo_full.toml"


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_config_text(tmp_path / "data", tmp_path / "run"))
    return path


def plan(capsys, *args):
    code = main(["plan", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_plan_that_fits_shows_each_rank_and_each_table(capsys, tiny):
    code, out, err = plan(capsys, tiny, "--world-size", 2, "--device", "cpu", "--ddr-gb", 4)
    assert code == 0, err
    assert "sharding plan for 2 ranks (2 per host, 1 host), cpu, 4 GiB DDR per rank, batch 256 per rank" in out
    assert re.search(r"^rank 0 .*\|", out, re.M) is None  # cpu: one tier, DDR
    assert re.search(r"^rank 1 +(\s+\d+\.\d\d){6}$", out, re.M)
    for table in ("cat_0_emb", "cat_5_emb", "cat_8_emb", "cat_0_emb_wide"):
        assert re.search(rf"^{table} +[\d,]+ x \d+ +(table_wise|row_wise|table_row_wise) +fused +[\d,-]+ ", out, re.M), table
    assert "dense part, on every rank:" in out


def test_json_parses_and_adds_up(capsys, tiny):
    code, out, _ = plan(capsys, tiny, "--world-size", 2, "--device", "cpu", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["fits"] is True and report["failure"] is None
    assert {t["table"] for t in report["tables"]} == {"cat_0_emb", "cat_5_emb", "cat_8_emb",
                                                      "cat_0_emb_wide", "cat_5_emb_wide", "cat_8_emb_wide"}
    weights = sum(r["ddr"]["tables"] for r in report["ranks"])
    assert weights == sum(t["weights"] for t in report["tables"]) == 4 * (1000 + 24 + 3) * (8 + 4)
    # sgd keeps no state; the dense sgd (momentum 0) neither
    assert sum(r["ddr"]["optimizer"] for r in report["ranks"]) == 0
    assert all(r["ddr"]["dense"] == report["dense"]["total"] > 0 for r in report["ranks"])
    # the one host's peak: both ranks' DDR, a load's 64 MiB blocks a rank (one per hashing
    # thread, at most 4, and one being copied), and the runtime (torch and TorchRec loaded,
    # 0.5 GiB) once per rank
    peak = report["peak_host_memory"]
    assert peak["ranks"] == 2 and peak["held"] == sum(r["ddr"]["total"] for r in report["ranks"])
    assert peak["checkpoint"] == 2 * (4 + 1) * (64 << 20) and peak["checkpoint_how"] == "written synchronously from the live tables"
    assert peak["runtime"] == 2 * (512 << 20) and peak["total"] == peak["held"] + peak["checkpoint"] + peak["runtime"]


def test_a_save_behind_training_adds_a_copy_of_the_fullest_ranks_state_per_rank_of_the_host(capsys, tiny):
    code, out, _ = plan(capsys, tiny, "--world-size", 4, "--local-world-size", 2, "--device", "cpu", "--json",
                        "--set", "features.sparse[0].num_buckets=20000000", "--set", "train.async_checkpoint=true")
    assert code == 0
    report = json.loads(out)
    ranks = {r["rank"]: r for r in report["ranks"]}
    copies = [sum(r["ddr"][p] for p in ("tables", "optimizer", "managed")) + report["dense"]["weights"]
              + report["dense"]["optimizer"] + report["dense"]["ema"] for r in ranks.values()]
    host = max(((0, 1), (2, 3)), key=lambda h: sum(ranks[i]["ddr"]["total"] for i in h))
    peak = report["peak_host_memory"]
    assert peak["held"] == sum(ranks[i]["ddr"]["total"] for i in host)
    assert peak["checkpoint"] == 2 * max(copies) > 20_000_000 * 12 * 4  # the fullest rank's copy, for both ranks
    assert peak["checkpoint_how"] == "a copy of each rank's state, written behind training"
    text = plan(capsys, tiny, "--world-size", 4, "--local-world-size", 2, "--device", "cpu",
                "--set", "features.sparse[0].num_buckets=20000000", "--set", "train.async_checkpoint=true")[1]
    assert text.splitlines()[-1].startswith(f"peak host memory, the fullest host (2 ranks): about {peak['total'] / (1 << 30):.2f} GiB")


def test_a_table_that_fits_nowhere_is_named_with_what_would_help(capsys, tiny):
    code, out, err = plan(capsys, tiny, "--world-size", 2, "--device", "cuda", "--hbm-gb", 0.5,
                          "--set", "features.sparse[0].num_buckets=20000000",
                          "--set", 'features.sparse[0].embedding_constraints={sharding_types=["table_wise"]}')
    assert code == EXIT_CONFIG
    assert out == ""
    assert "no sharding plan fits 2 ranks" in err
    assert "table 'cat_0_emb' (20,000,000 x 8, read by cat_0) fits on no rank" in err
    assert 'row-wise sharding: add "row_wise" to sharding_types in features.sparse[0].embedding_constraints' in err
    assert 'UVM caching: add "fused_uvm_caching"' in err
    assert "a smaller width: 4 instead of 8 (features.sparse[0].embedding_dim)" in err
    assert "more memory: --hbm-gb" in err


def test_too_little_host_memory_on_cpu_is_reported_in_json(capsys, tiny):
    code, out, _ = plan(capsys, tiny, "--world-size", 2, "--device", "cpu", "--ddr-gb", 0.2, "--json",
                        "--set", "features.sparse[0].num_buckets=20000000")
    assert code == EXIT_CONFIG
    failure = json.loads(out)["failure"]
    assert failure["kind"] == "table" and failure["table"] == "cat_0_emb"  # on CPU TorchRec shards table-wise
    assert any(a.startswith("more memory: --ddr-gb") for a in failure["advice"])
    assert not any("UVM" in a for a in failure["advice"])  # CUDA only


def test_constraints_from_toml_reach_the_planner(capsys, tiny):
    code, out, err = plan(capsys, tiny, "--world-size", 2, "--device", "cuda", "--json",
                          "--set", 'features.sparse[1].embedding_constraints={sharding_types=["row_wise"]}',
                          "--set", 'train.global_embedding_constraints={sharding_types=["table_wise"]}')
    assert code == 0, err
    tables = {t["table"]: t for t in json.loads(out)["tables"]}
    # a feature's constraints apply to every table it reads (the wide twin too)
    assert tables["cat_5_emb"]["sharding_type"] == tables["cat_5_emb_wide"]["sharding_type"] == "row_wise"
    assert tables["cat_5_emb"]["ranks"] == [0, 1]
    assert {tables[t]["sharding_type"] for t in ("cat_0_emb", "cat_8_emb", "cat_0_emb_wide")} == {"table_wise"}


def test_row_wise_is_refused_on_cpu_where_torchrec_does_not_offer_it(capsys, tiny):
    code, _, err = plan(capsys, tiny, "--world-size", 2, "--device", "cpu",
                        "--set", 'features.sparse[1].embedding_constraints={sharding_types=["row_wise"]}')
    assert code == EXIT_CONFIG
    assert ("features.sparse[1].embedding_constraints.sharding_types: table 'cat_5_emb': TorchRec offers none of "
            "row_wise on cpu (it offers table_wise, column_wise, table_column_wise)") in err


def test_uvm_kernels_are_refused_on_cpu_at_their_toml_path(capsys, tiny):
    code, _, err = plan(capsys, tiny, "--world-size", 1, "--device", "cpu",
                        "--set", 'train.global_embedding_constraints={compute_kernels=["fused_uvm_caching"]}')
    assert code == EXIT_CONFIG
    assert "train.global_embedding_constraints.compute_kernels: table 'cat_0_emb': fused_uvm_caching exist only on CUDA" in err


@pytest.mark.parametrize("local_world_size", [8, 4], ids=["1 host", "2 hosts"])
def test_the_full_criteo_tables_on_8_gpus(capsys, local_world_size):
    code, out, err = plan(capsys, FULL, "--world-size", 8, "--local-world-size", local_world_size, "--device", "cuda",
                          "--hbm-gb", 80, "--json")
    assert code == 0, err
    report = json.loads(out)
    tables = {t["table"]: t for t in report["tables"]}
    assert len(tables) == 52  # 26 deep/FM tables, 26 wide twins
    assert sum(tables[f"cat_{i}_emb"]["rows"] for i in range(26)) == 204_184_588
    assert all(len(t["ranks"]) >= 1 and all(0 <= r < 8 for r in t["ranks"]) for t in tables.values())
    cap = 80 * 1024**3
    assert all(r["hbm"]["cap"] == cap and 0 < r["hbm"]["total"] < cap for r in report["ranks"])
    # adagrad: as much state as rows
    assert sum(t["optimizer"] for t in tables.values()) == sum(t["weights"] for t in tables.values())


def test_bad_cluster_arguments_are_refused(capsys, tiny):
    code, _, err = plan(capsys, tiny, "--world-size", 8, "--local-world-size", 3)
    assert code == EXIT_USAGE
    assert "--local-world-size 3 must divide --world-size 8" in err
