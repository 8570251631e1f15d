"""Two installed distributions registering one dense optimizer name: a problem only for a config
that names it, and a qualified name picks one (``tzrec-run`` in a fresh process, as a user)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.plugin_kit.dists import config_file, tzrun_cli, write_distribution
from tzrun.errors import EXIT_CONFIG

# Each copy of ``twin_opt`` is SGD with its own factor on the lr, so the trained weights tell
# which one ran; the build also writes which plugin built it.
TWIN = """
    import attrs, tzrun

    @attrs.frozen
    class Config:
        lr: float

    def build(cfg, params):
        import torch
        open({marker!r}, "w").write("{plugin}")
        return torch.optim.SGD(params, lr=cfg.lr)

    @tzrun.hookimpl
    def tzrun_register_dense_optimizers(register):
        register("twin_opt", config=Config, build=build, description="SGD, as {plugin} ships it")
"""


def _two_twins(site: Path, marker: Path) -> None:
    for letter in "ab":
        write_distribution(site, f"tzrun-twin-{letter}", "1.0", entry_points={f"twin_{letter}": f"twin_{letter}_mod"},
                           modules={f"twin_{letter}_mod": TWIN.format(marker=str(marker), plugin=f"twin_{letter}")})


def test_a_clash_breaks_only_the_configs_that_name_it_and_a_qualified_name_picks_one(tmp_path, criteo_dir):
    site, marker = tmp_path / "site", tmp_path / "built_by"
    site.mkdir()
    _two_twins(site, marker)
    config = str(config_file(tmp_path))

    listing = tzrun_cli(["plugins"], site)
    assert listing.returncode == 0, listing.stderr
    assert ("CLASH dense optimizer 'twin_opt' is registered by twin_a, twin_b: a config that names it must say which, "
            'with type = "twin_a:twin_opt" or type = "twin_b:twin_opt"') in listing.stdout
    clashes = json.loads(tzrun_cli(["plugins", "--json"], site).stdout)["clashes"]
    assert clashes == [{"kind": "dense_optimizer", "name": "twin_opt", "plugins": ["twin_a", "twin_b"],
                        "distributions": ["tzrun-twin-a", "tzrun-twin-b"]}]

    bystander = tzrun_cli(["check", config], site)
    assert bystander.returncode == 0 and bystander.stderr == "", bystander.stderr

    ambiguous = tzrun_cli(["check", config, "--set", 'train.dense_optimizer={type="twin_opt", lr=0.1}'], site)
    assert ambiguous.returncode == EXIT_CONFIG
    assert ("train.dense_optimizer.type: dense optimizer 'twin_opt' is registered by 2 plugins: 'twin_a' (tzrun-twin-a 1.0) "
            "and 'twin_b' (tzrun-twin-b 1.0); say which one with type = \"twin_a:twin_opt\" or type = \"twin_b:twin_opt\"") in ambiguous.stderr

    text = (tmp_path / "run.toml").read_text().replace(str(tmp_path / "data"), str(criteo_dir))
    (tmp_path / "train.toml").write_text(text)
    trained = tzrun_cli(["train", str(tmp_path / "train.toml"), "--set", "train.num_steps=2"], site)
    assert trained.returncode == 0, trained.stderr[-3000:]  # training a config that does not use it works
    assert not marker.exists()
    picked = tzrun_cli(["train", str(tmp_path / "train.toml"), "--overwrite", "--set", "train.num_steps=2",
                        "--set", 'train.dense_optimizer={type="tzrun-twin-b:twin_opt", lr=0.1}'], site)
    assert picked.returncode == 0, picked.stderr[-3000:]
    assert "trained 2 steps" in picked.stdout
    assert marker.read_text() == "twin_b"  # the distribution named built the optimizer


# A third-party ``calibration`` metric: its build records that it ran and fails, so a run that
# built it instead of the built-in cannot pass.
THIRD_PARTY_CALIBRATION = """
    import attrs, tzrun

    @attrs.frozen
    class Config:
        pass

    def build(cfg):
        open({marker!r}, "w").write("tzrun-calib")
        raise RuntimeError("the third-party calibration was built")

    @tzrun.hookimpl
    def tzrun_register_metrics(register):
        register("calibration", config=Config, build=build, description="calibration, as tzrun-calib ships it")
"""


def test_a_plugin_sharing_a_builtin_name_leaves_configs_naming_the_builtin_working(tmp_path, criteo_dir):
    site, marker = tmp_path / "site", tmp_path / "built_by"
    write_distribution(site, "tzrun-calib", "1.0", entry_points={"tzrun_calib": "tzrun_calib_mod"},
                       modules={"tzrun_calib_mod": THIRD_PARTY_CALIBRATION.format(marker=str(marker))})
    text = config_file(tmp_path).read_text().replace(str(tmp_path / "data"), str(criteo_dir))
    config = tmp_path / "calibrated.toml"
    config.write_text(text.replace('[[metrics]]\ntype = "auc"', '[[metrics]]\ntype = "auc"\n\n[[metrics]]\ntype = "calibration"'))

    listing = tzrun_cli(["plugins"], site)
    assert listing.returncode == 0, listing.stderr
    shadow = [line for line in listing.stdout.splitlines() if "calibration" in line and "tzrun_calib" in line]
    assert shadow == ["SHADOWED metric 'calibration' is registered by tzrun_calib too: the bare name keeps meaning the "
                      'built-in (tzrun_plugins.metrics); pick theirs with type = "tzrun-calib:calibration"']
    report = json.loads(tzrun_cli(["plugins", "--json"], site).stdout)
    assert report["clashes"] == [] and report["shadowed"] == [
        {"kind": "metric", "name": "calibration", "builtin": "tzrun_plugins.metrics", "plugins": ["tzrun_calib"],
         "distributions": ["tzrun-calib"], "picked_by": ["tzrun-calib:calibration"]}]

    checked = tzrun_cli(["check", str(config), "--no-data"], site)
    assert checked.returncode == 0, checked.stderr
    notes = [line for line in checked.stdout.splitlines() if "tzrun-calib" in line]
    assert notes == ["metrics[1].type: 'calibration' is the built-in metric; the one 'tzrun_calib' (tzrun-calib 1.0) "
                     'registers is type = "tzrun-calib:calibration"']

    trained = tzrun_cli(["train", str(config), "--set", "train.num_steps=2"], site)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert not marker.exists()  # the built-in was built
    results = [json.loads(line) for line in (tmp_path / "run" / "eval_results.jsonl").read_text().splitlines()]
    assert results[-1]["calibration"] > 0
