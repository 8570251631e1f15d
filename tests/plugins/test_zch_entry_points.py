"""A third party's eviction policy and admission filter, installed as a distribution with a
``tzrun`` entry point (not registered on a plugin manager by the test), are picked by name in a
``zch`` block: ``check`` accepts them, a run trains with them (the filter is called at the
evictions, with the options of the config), and a misspelt name is a config error that suggests
the installed one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugin_kit.dists import tzrun_cli, write_distribution
from tzrun.errors import EXIT_CONFIG
from tzrun.testing import tiny_config_text

EXTRAS = '''
"""Collision-free ids' extras: a stale-first eviction and an admission filter that logs."""

import attrs
import tzrun


@attrs.frozen
class StaleFirstConfig:
    """Options of ``stale_first``: how fast an id's score falls with the steps since its last lookup."""

    decay_exponent: float = 2.0


def build_stale_first(cfg, admission):
    from torchrec.modules.mc_modules import DistanceLFU_EvictionPolicy

    return DistanceLFU_EvictionPolicy(decay_exponent=cfg.decay_exponent, threshold_filtering_func=admission)


@attrs.frozen
class LoggedThresholdConfig:
    """Options of ``logged_threshold``: the lookups an id needs, and a file each call appends to."""

    min_count: int = 1
    log: str = ""


def build_logged_threshold(cfg):
    def admit(counts):
        if cfg.log:
            with open(cfg.log, "a") as out:
                out.write(f"{counts.numel()} {cfg.min_count}\\n")
        return counts >= cfg.min_count, float(cfg.min_count - 1)

    return admit


@tzrun.hookimpl
def tzrun_register_eviction_policies(register):
    register("stale_first", config=StaleFirstConfig, build=build_stale_first,
             description="distance-LFU that forgets an id fast")


@tzrun.hookimpl
def tzrun_register_admission_filters(register):
    register("logged_threshold", config=LoggedThresholdConfig, build=build_logged_threshold,
             description="a count threshold that logs each call")
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site directory with the distribution ``tzrun-zch-extras`` installed."""
    site_dir = tmp_path_factory.mktemp("site")
    write_distribution(site_dir, "tzrun-zch-extras", entry_points={"zch_extras": "tzrun_zch_extras"},
                       modules={"tzrun_zch_extras": EXTRAS})
    return site_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tzrun_tools.synth import synth_criteo

    root = tmp_path_factory.mktemp("zch_extras_data")
    synth_criteo(root, rows=2048, eval_rows=1024, seed=2, rows_per_file=2048, row_group_size=512)
    return root


def _config(tmp_path: Path, data: Path, policy: str, admission: str) -> Path:
    """The tiny config with ``cat_0`` collision-free under ``policy`` and ``admission``."""
    zch = f"zch = {{ size = 64, eviction_interval = 2, eviction_policy = {policy}, admission = {admission} }}"
    text = tiny_config_text(data, tmp_path / "run")
    assert 'name = "cat_0"\nnum_buckets = 1000' in text
    path = tmp_path / "zch.toml"
    path.write_text(text.replace('name = "cat_0"\nnum_buckets = 1000', f'name = "cat_0"\n{zch}'))
    return path


@pytest.mark.slow
def test_an_installed_policy_and_filter_are_trained_with_by_name(site, data, tmp_path):
    log = tmp_path / "admissions.log"
    config = _config(tmp_path, data, '{ type = "stale_first", decay_exponent = 3.0 }',
                     f'{{ type = "logged_threshold", min_count = 2, log = "{log.as_posix()}" }}')
    checked = tzrun_cli(["check", str(config)], site)
    assert checked.returncode == 0, checked.stderr
    trained = tzrun_cli(["train", str(config), "--overwrite"], site)
    assert trained.returncode == 0, trained.stderr[-4000:]
    # The filter reaches TorchRec only through the policy's build: called at the evictions, with its options.
    calls = [line.split() for line in log.read_text().splitlines()]
    assert len(calls) >= 2 and all(int(n) > 0 and m == "2" for n, m in calls)
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step-4" / "meta.json").read_text())
    recorded = {p["name"]: p for p in meta["plugins"]}["zch_extras"]
    assert recorded["distribution"] == "tzrun-zch-extras"
    assert recorded["components"] == {"eviction_policy": ["stale_first"], "admission_filter": ["logged_threshold"]}


def test_without_the_distribution_the_names_are_unknown(data, tmp_path):
    config = _config(tmp_path, data, '{ type = "stale_first" }', '{ type = "logged_threshold" }')
    done = tzrun_cli(["check", str(config)], None)
    assert done.returncode == EXIT_CONFIG
    assert "features.sparse[0].zch.eviction_policy.type: unknown eviction policy 'stale_first'" in done.stderr
    assert "features.sparse[0].zch.admission.type: unknown admission filter 'logged_threshold'" in done.stderr


def test_a_misspelt_installed_name_is_a_config_error_with_a_did_you_mean(site, data, tmp_path):
    config = _config(tmp_path, data, '{ type = "stale_frist" }', '{ type = "loged_threshold" }')
    done = tzrun_cli(["check", str(config)], site)
    assert done.returncode == EXIT_CONFIG
    assert "zch.eviction_policy.type: unknown eviction policy 'stale_frist'" in done.stderr
    assert "did you mean 'stale_first'?" in done.stderr
    assert "did you mean 'logged_threshold'?" in done.stderr
