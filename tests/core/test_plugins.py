"""The plugin manager and registries: loading, isolation, duplicates, unknown names."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import attrs
import pytest

import tzrun
from tzrun.errors import AmbiguousComponentError, PluginError, PluginLoadError, UnknownComponentError
from tzrun.kernel.plugins import make_plugin_manager, plugin_infos
from tzrun.kernel.registry import collect_registries
from tzrun.testing import registered

FIRST_PARTY = {
    "tzrun_plugins.optim", "tzrun_plugins.schedules", "tzrun_plugins.losses", "tzrun_plugins.metrics",
    "tzrun_plugins.pipelines", "tzrun_plugins.stages", "tzrun_plugins.models", "tzrun_plugins.readers",
    "tzrun_serving",
}


@attrs.frozen
class TwinConfig:
    lr: float


def _build_twin(cfg: TwinConfig, params):  # pragma: no cover - never built here
    raise AssertionError


def test_first_party_plugins_load_from_entry_points_with_their_distribution(tzrun_pm):
    infos = {i.name: i for i in plugin_infos(tzrun_pm, collect_registries(tzrun_pm))}
    assert FIRST_PARTY <= set(infos)
    optim = infos["tzrun_plugins.optim"]
    assert optim.distribution == "tzrec-run" and optim.version == tzrun.__version__
    assert set(optim.components["sparse_optimizer"]) == {
        "sgd", "adagrad", "rowwise_adagrad", "adam", "lamb", "lars_sgd", "partial_rowwise_adam", "partial_rowwise_lamb"
    }
    assert set(optim.components["dense_optimizer"]) == {"sgd", "adam", "adamw", "adagrad", "rmsprop", "adadelta"}
    assert infos["tzrun_plugins.models"].components == {"model": ("dbmtl", "dcn_v1", "dcn_v2", "deepfm", "din", "dlrm", "dssm", "dssm_v2", "mask_net", "mind", "mmoe", "multi_tower", "pepnet", "ple", "rocket_launching", "tdm", "wide_and_deep", "wukong")}
    serving = infos["tzrun_serving"]  # the way out of a run: a first-party plugin like the others
    assert serving.distribution == "tzrec-run"
    assert serving.components == {"stage": ("embedding_deltas", "export"), "command": ("ckpt apply_deltas", "export")}


def test_every_entry_records_the_plugin_that_made_it(tzrun_pm):
    registries = collect_registries(tzrun_pm)
    entry = registries["metric"].get("auc", "metrics[0].type")
    assert (entry.plugin, entry.distribution) == ("tzrun_plugins.metrics", "tzrec-run")
    assert entry.extras["prediction"] == "probs"


def test_a_plugin_claiming_a_builtin_name_leaves_the_bare_name_to_the_builtin(tzrun_pm):
    class Twin:
        @tzrun.hookimpl
        def tzrun_register_dense_optimizers(self, register):
            register("adam", config=TwinConfig, build=_build_twin)

    with registered(tzrun_pm, Twin(), name="twin"):
        registries = collect_registries(tzrun_pm)
    optimizers = registries["dense_optimizer"]
    assert optimizers.get("adam", "train.dense_optimizer.type").plugin == "tzrun_plugins.optim"  # an install changes nothing
    assert optimizers.get("twin:adam", "x").plugin == "twin"
    assert optimizers.get("tzrec-run:adam", "x").plugin == "tzrun_plugins.optim"  # a distribution
    assert optimizers.clashes() == {}
    builtin, others = optimizers.shadowed()["adam"]
    assert builtin.plugin == "tzrun_plugins.optim" and [e.plugin for e in others] == ["twin"]


def test_two_third_party_plugins_claiming_one_name_are_named(tzrun_pm):
    def twin():
        class Twin:
            @tzrun.hookimpl
            def tzrun_register_dense_optimizers(self, register):
                register("twin_opt", config=TwinConfig, build=_build_twin)
        return Twin()

    with registered(tzrun_pm, twin(), name="twin_a"), registered(tzrun_pm, twin(), name="twin_b"):
        registries = collect_registries(tzrun_pm)  # a clash breaks nothing by itself
    assert registries["dense_optimizer"].get("sgd", "x").plugin == "tzrun_plugins.optim"
    with pytest.raises(AmbiguousComponentError) as info:
        registries["dense_optimizer"].get("twin_opt", "train.dense_optimizer.type")
    assert str(info.value) == (
        "train.dense_optimizer.type: dense optimizer 'twin_opt' is registered by 2 plugins: 'twin_a' and 'twin_b'; "
        'say which one with type = "twin_a:twin_opt" or type = "twin_b:twin_opt"'
    )
    assert registries["dense_optimizer"].get("twin_b:twin_opt", "x").plugin == "twin_b"
    assert set(registries["dense_optimizer"].clashes()) == {"twin_opt"} and registries["dense_optimizer"].shadowed() == {}


def test_unknown_name_lists_available_and_guesses(tzrun_pm_factory):
    registries = collect_registries(tzrun_pm_factory(distributions=["tzrec-run"]))  # the built-ins alone
    with pytest.raises(UnknownComponentError) as info:
        registries["sparse_optimizer"].get("rowwise_adagard", "train.sparse_optimizer.type")
    message = str(info.value)
    assert message.startswith("train.sparse_optimizer.type: unknown sparse optimizer 'rowwise_adagard'")
    assert "available: adagrad, adam, lamb, lars_sgd, partial_rowwise_adam, partial_rowwise_lamb, rowwise_adagrad, sgd;" in message
    assert "did you mean 'rowwise_adagrad'?" in message


def test_disable_blocks_a_plugin_and_its_components():
    pm = make_plugin_manager(disable=["tzrun_plugins.stages"])
    registries = collect_registries(pm)
    assert "progress" not in registries["stage"]
    assert "deepfm" in registries["model"]


def test_env_var_disables_plugins():
    pm = make_plugin_manager(environ={"TZRUN_DISABLE_PLUGINS": "tzrun_plugins.models, tzrun_plugins.readers"})
    registries = collect_registries(pm)
    assert len(registries["model"]) == 0 and len(registries["reader"]) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "Adam", "config": TwinConfig}, "lower_snake"),
        ({"name": "ok", "config": dict}, "attrs class"),
        ({"name": "ok", "config": TwinConfig, "colour": "red"}, r"unknown option.*colour"),
    ],
)
def test_malformed_registrations_name_the_plugin(tzrun_pm, kwargs, match):
    class Bad:
        @tzrun.hookimpl
        def tzrun_register_dense_optimizers(self, register):
            register(kwargs.pop("name"), build=_build_twin, **kwargs)

    with registered(tzrun_pm, Bad(), name="bad"):
        with pytest.warns(RuntimeWarning, match=rf"plugin 'bad' was disabled: .*{match}.*the other plugins are loaded"):
            registries = collect_registries(tzrun_pm)
    assert "ok" not in registries["dense_optimizer"] and "adam" in registries["dense_optimizer"]
    assert [(f.name, f.reason) for f in tzrun_pm.load_failures] == [("bad", "registration")]
    assert not tzrun_pm.has_plugin("bad")  # its lifecycle hooks are off too


def test_config_field_named_like_a_core_key_is_rejected(tzrun_pm):
    @attrs.frozen
    class Clashing:
        lr_schedule: str = "mine"

    class Bad:
        @tzrun.hookimpl
        def tzrun_register_dense_optimizers(self, register):
            register("clash", config=Clashing, build=_build_twin)

    with registered(tzrun_pm, Bad(), name="bad"):
        with pytest.warns(RuntimeWarning, match=r"'bad' was disabled.*lr_schedule.*rename the fields"):
            collect_registries(tzrun_pm)


def test_a_raising_registration_hook_is_skipped_with_a_warning_unless_strict():
    class Broken:
        @tzrun.hookimpl
        def tzrun_register_metrics(self, register):
            register("half", config=TwinConfig, build=_build_twin)
            raise RuntimeError("boom")

    pm = make_plugin_manager(plugins=[("broken", Broken())], strict=False)
    with pytest.warns(RuntimeWarning, match=r"'broken' was disabled: its tzrun_register_metrics raised RuntimeError: boom"):
        registries = collect_registries(pm)
    assert "half" not in registries["metric"] and "auc" in registries["metric"]
    strict = make_plugin_manager(plugins=[("broken", Broken())], strict=True)
    with pytest.raises(PluginError, match="boom") as info:
        collect_registries(strict)
    assert "Traceback (most recent call last)" in str(info.value)  # strict mode shows where


def _fake_distribution(root: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    info = root / f"{dist}-1.2.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[tzrun]\n{lines}\n")
    for name, source in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def broken_distribution(tmp_path, monkeypatch):
    """An installed-looking distribution whose plugin raises on import, beside a working one."""
    _fake_distribution(
        tmp_path,
        "tzrun-broken",
        {"broken_plugin": "tzrun_broken_mod", "fine_plugin": "tzrun_fine_mod"},
        {
            "tzrun_broken_mod": "raise ImportError('needs a missing library')\n",
            "tzrun_fine_mod": """
                import attrs, tzrun

                @attrs.frozen
                class FineConfig:
                    lr: float

                @tzrun.hookimpl
                def tzrun_register_dense_optimizers(register):
                    register("fine", config=FineConfig, build=lambda cfg, params: None)
            """,
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("tzrun_broken_mod", "tzrun_fine_mod"):
        sys.modules.pop(name, None)


def test_a_plugin_that_fails_to_import_is_reported_and_the_rest_load(broken_distribution):
    with pytest.warns(RuntimeWarning, match=r"broken_plugin.*tzrun-broken 1\.2\.3.*needs a missing library"):
        pm = make_plugin_manager(strict=False)
    assert [f.name for f in pm.load_failures] == ["broken_plugin"]
    assert pm.load_failures[0].distribution == "tzrun-broken"
    registries = collect_registries(pm)
    assert "fine" in registries["dense_optimizer"]  # its sibling loaded
    assert "adam" in registries["dense_optimizer"]  # and so did the first-party plugins
    assert registries["dense_optimizer"].get("fine", "x").distribution == "tzrun-broken"


def test_strict_mode_makes_an_import_failure_an_error(broken_distribution):
    with pytest.raises(PluginLoadError, match=r"broken_plugin.*TZRUN_DISABLE_PLUGINS=broken_plugin"):
        make_plugin_manager(environ={"TZRUN_STRICT_PLUGINS": "1"})


def test_a_disabled_broken_plugin_is_not_even_imported(broken_distribution, recwarn):
    pm = make_plugin_manager(disable=["broken_plugin"], strict=True)
    assert pm.load_failures == []
