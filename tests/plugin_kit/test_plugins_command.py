"""``tzrec-run plugins``: each plugin's distribution, version, hooks and components per kind;
``--freeze``: the pinned requirement lines of the distributions that provide plugins."""

from __future__ import annotations

import importlib.metadata

import tzrun
from tests.plugin_kit.dists import tzrun_cli, write_distribution


def test_plugins_shows_origin_hooks_and_components_of_an_installed_distribution(tmp_path):
    write_distribution(tmp_path, "tzrun-listed", "4.5.6", entry_points={"listed": "listed_mod"}, modules={"listed_mod": """
        import attrs, tzrun

        @attrs.frozen
        class C:
            lr: float

        @tzrun.hookimpl
        def tzrun_register_dense_optimizers(register):
            register("listed_b", config=C, build=lambda cfg, params: None)
            register("listed_a", config=C, build=lambda cfg, params: None)

        @tzrun.hookimpl
        def tzrun_register_lr_schedulers(register):
            register("listed_schedule", config=C, build=lambda cfg, optimizer: None)

        @tzrun.hookimpl
        def tzrun_after_train(run, step):
            pass
    """})
    proc = tzrun_cli(["plugins"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (
        "listed  (tzrun-listed 4.5.6)\n"
        "  hooks: tzrun_after_train, tzrun_register_dense_optimizers, tzrun_register_lr_schedulers\n"
        "  dense optimizers: listed_a, listed_b\n"
        "  lr schedules: listed_schedule\n"
    ) in proc.stdout
    assert f"tzrun_plugins.optim  (tzrec-run {tzrun.__version__})\n" in proc.stdout


def test_freeze_pins_every_distribution_that_provides_a_plugin(tmp_path):
    write_distribution(tmp_path, "tzrun-pinned", "1.2.3",
                       entry_points={"pinned_a": "pinned_a_mod", "pinned_b": "pinned_b_mod", "pinned_c": "pinned_a_mod"},
                       modules={"pinned_a_mod": "import tzrun\n", "pinned_b_mod": "import tzrun\n"})
    write_distribution(tmp_path, "tzrun-broken", "0.9", entry_points={"broken": "broken_mod"},
                       modules={"broken_mod": "raise ImportError('nope')\n"})
    proc = tzrun_cli(["plugins", "--freeze"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    pins = [line for line in lines if not line.startswith("#")]
    assert pins == sorted(pins, key=str.lower) and len(pins) == len(set(pins))
    assert f"tzrec-run=={tzrun.__version__}" in pins
    assert "tzrun-pinned==1.2.3" in pins  # once, for its two plugins
    assert "entry point 'pinned_c' (tzrun-pinned 1.2.3) names the same plugin as 'pinned_a'" in proc.stderr
    for dist in ("tzrun-contrib-optimizers", "tzrun-contrib-metrics"):  # installed by scripts/setup.sh
        assert f"{dist}=={importlib.metadata.version(dist)}" in pins
    assert not any("broken" in pin for pin in pins)  # it provides no plugin; it is a comment
    assert "# not loaded: plugin 'broken' (from tzrun-broken 0.9) failed to load: ImportError: nope" in lines
