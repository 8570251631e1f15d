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
