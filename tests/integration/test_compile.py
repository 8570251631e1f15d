"""``[train.compile]``: every shipped model and a third-party one train to the same losses with
the dense part compiled as eager, in one process; exact resume with compile on.

Inductor compiles C++ on the CPU: each model costs seconds of g++ on a cold cache
(``TORCHINDUCTOR_CACHE_DIR``; about 60% of this file's time when every model went through it),
so the steps are few, one batch size is used throughout, and the models of ``INDUCTOR`` go
through inductor while the others go through ``aot_eager``: TorchDynamo's capture and AOT
Autograd's forward and backward graphs, which is where a model of ours can break (a graph break,
a data-dependent branch, an op without a decomposition), without inductor's C++ code
generation, which is torch's. ``benchmarks/compile_zoo.py`` runs every model through inductor.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable
from unittest import mock
from xml.etree import ElementTree

import pytest
import torch
from torch import nn

import tzrun
from tests.conftest import REPO
from tests.integration.test_models import EXAMPLES as ZOO, MATRIX_ONLY
from tzrun.config.schema import CompileConfig
from tzrun.runner.compile import compile_dense, dense_roots

_TORCH_COMPILE = torch.compile

pytestmark = pytest.mark.slow

#: each shipped model once: example -> its data set
EXAMPLES = {
    "deepfm_criteo": "criteo",
    "dlrm_criteo": "criteo",
    "wide_and_deep_criteo": "criteo",
    "dcn_v2_criteo": "criteo",
    "dcn_v1_criteo": "criteo",
    "mask_net_criteo": "criteo",
    "wukong_criteo": "criteo",
    "rocket_launching_criteo": "criteo",
    "mmoe_taobao": "taobao",
    "ple_taobao": "taobao",
    "dbmtl_taobao": "taobao",
    "pepnet_taobao": "taobao",
    "dssm_taobao": "taobao",
    "dssm_v2_taobao": "taobao",
    "mind_taobao": "taobao",
    "tdm_taobao": "taobao",
    "din_taobao": "taobao",
}
#: small layers (those of test_models.py): inductor's C++ costs seconds per kernel on a cold
#: cache, and the examples' widths and depths add kernels, not code paths; ple as two levels (a
#: shared gate below the last) of one expert each
SMALL = {name: list(overrides) for name, (_, overrides, _) in {**ZOO, **MATRIX_ONLY}.items()}
SMALL["ple_taobao"] = [
    'model.extraction_networks=[{num_task_experts=1, task_expert_hidden_units=[16], num_shared_experts=1},'
    ' {num_task_experts=1, task_expert_hidden_units=[8], num_shared_experts=1}]',
    'model.tasks=[{name="ctr", hidden_units=[8]}, {name="cvr", hidden_units=[8]}]']
#: the models compiled with inductor here (din's target attention over a padded sequence with its
#: masked softmax); the others with aot_eager (see the module's docstring). DeepFM's MLPs, FM and
#: cross entropy go through inductor in the resume test below, under the default pipeline and
#: against an eager run of the same config (31 s of g++ on a cold cache when this test compiled
#: them again at other shapes). dssm's normalized towers and softmax loss went through inductor
#: too until the suite had to fit in 15 minutes: 14 s of g++ for linear layers, a vector norm, a
#: matrix product and a log-softmax, inductor's common lowerings; benchmarks/compile_zoo.py runs
#: every model through inductor
INDUCTOR = ("din_taobao",)
STEPS = 3
ROWS = 128
_CHILD = "TZRUN_COMPILE_TEST_CHILD"


#: the tests that compile, run together in one interpreter of their own (see ``fresh_process``)
_COMPILING = (
    "test_every_shipped_model_trains_to_the_same_losses_compiled",
    "test_a_compiled_run_stopped_and_resumed_is_the_uninterrupted_compiled_run",
    "test_graph_breaks_are_counted_at_info_and_named_at_debug",
)


@pytest.fixture(scope="module")
def fresh_process(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Run this module's compiling tests (those this session selected) in one interpreter of
    their own; each test's outcome (``"passed"``, ``"failure"``, ``"error"``, ``"skipped"``) and
    its message, by name. They compile in a fresh process: in a pytest process that had already
    imported Python 3.11's own ``distutils`` (an earlier test did), inductor's import of
    setuptools failed (setuptools' ``_distutils_hack`` asserts that it came first), so the
    compiling tests failed in the whole suite and passed alone. One interpreter for the three
    pays torch's import and inductor's start-up once."""
    selected = {item.name for item in request.session.items if item.path == Path(__file__)}
    wanted = [f"{__file__}::{test}" for test in _COMPILING if test in selected]
    assert wanted, f"none of {_COMPILING} is selected"  # (no node ids would run the whole suite)
    report = tmp_path_factory.mktemp("compile_child") / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *wanted],
                          capture_output=True, text=True, cwd=REPO, timeout=1800, env={**os.environ, _CHILD: "1"})
    assert report.exists(), proc.stdout[-6000:] + proc.stderr[-2000:]
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        found = [(child.tag, f"{child.get('message', '')}\n{child.text or ''}") for child in case
                 if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = found[0] if found else ("passed", "")
    return outcomes


def _ran_in_a_fresh_process(request: pytest.FixtureRequest) -> bool:
    """True after asserting that this test passed in ``fresh_process``'s interpreter (or
    skipping as it skipped there); False inside that interpreter, where the test runs."""
    if os.environ.get(_CHILD):
        torch._dynamo.reset()  # each test compiles from a clean slate, as in an interpreter of its own
        return False
    outcomes = request.getfixturevalue("fresh_process")
    name = request.node.name
    assert name in outcomes, f"{name} did not run in the fresh process: {sorted(outcomes)}"
    outcome, message = outcomes[name]
    if outcome == "skipped":
        pytest.skip(message)
    assert outcome == "passed", f"{name} {outcome} in a fresh process:\n{message[-6000:]}"
    return True


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tzrun_tools.synth import synth_criteo
    from tzrun_tools.synth_taobao import synth_taobao

    root = tmp_path_factory.mktemp("compile_zoo")
    rows = STEPS * ROWS
    synth_criteo(root / "criteo", rows=rows, eval_rows=rows, seed=3, rows_per_file=rows, row_group_size=rows)
    synth_taobao(root / "taobao", rows=rows, eval_rows=rows, seed=3, rows_per_file=rows, row_group_size=rows)
    return {"criteo": root / "criteo", "taobao": root / "taobao"}


def _batches(session, data: Path) -> list:
    import pyarrow as pa

    from tzrun.data.features import BatchBuilder

    d, f = session.cfg.data, session.facts
    builder = BatchBuilder(session.specs, d.labels, d.sample_weight, f.group_columns,
                           label_domains=f.label_domains, derived_labels=f.derived_labels)
    reader = session.reader
    table = pa.Table.from_batches([b for g in reader.row_groups(str(data / "train"))
                                   for b in reader.read(g, 0, g.num_rows, session.columns)])
    return [builder(table.slice(i * ROWS, ROWS), "train") for i in range(STEPS)]


def _losses(model: nn.Module, batches: list) -> list[float]:
    """Train every parameter with SGD (the embedding tables too: unsharded here) and return
    each step's loss (evaluation under compile: tests/integration/test_compile.py's resume test)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    model.train()
    torch.manual_seed(0)  # a model that draws in training (mind's routing start) draws the same in both runs
    for batch in batches:
        loss, _ = model(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def _train_model(session):
    from tzrun.runner.model import build_model

    torch.manual_seed(0)
    return build_model(session.facts, torch.device("cpu"))


def test_every_shipped_model_trains_to_the_same_losses_compiled(request):
    if _ran_in_a_fresh_process(request):
        return
    datasets, tmp_path = request.getfixturevalue("datasets"), request.getfixturevalue("tmp_path")
    # one process compiles faster than a pool's start-up on a small machine
    with torch._inductor.config.patch(compile_threads=1):
        _same_losses_compiled(datasets, tmp_path)


def _same_losses_compiled(datasets: dict[str, Path], tmp_path: Path, inductor: Iterable[str] = INDUCTOR) -> None:
    """Each model of ``EXAMPLES`` trained eager and compiled (inductor for those of ``inductor``,
    aot_eager for the others) gives the same losses."""
    from torch._dynamo.utils import counters

    for example, data_name in EXAMPLES.items():
        backend = "inductor" if example in inductor else "aot_eager"
        with mock.patch.object(torch, "compile", functools.partial(_TORCH_COMPILE, backend=backend)):
            _same_losses_compiled_one(example, datasets[data_name], tmp_path, backend, counters)


def _same_losses_compiled_one(example: str, data: Path, tmp_path: Path, backend: str, counters: Any) -> None:
    from tzrun.runner.session import Session

    sets = [f'data.train_input="{data / "train"}"', f'data.eval_input="{data / "eval"}"',
            f'model_dir="{tmp_path / example}"', f"data.batch_size={ROWS}", *SMALL.get(example, ())]
    session = Session.from_config(REPO / "examples" / f"{example}.toml", sets)
    eager = _train_model(session)
    compiled = copy.deepcopy(eager)
    keys = list(compiled.state_dict())
    frames = counters["frames"]["ok"]
    started = time.perf_counter()
    report = compile_dense(compiled, CompileConfig(enabled=True))
    assert report is not None and report.modules, example
    assert all(not n.endswith(("ebc", "ec")) for n in report.modules), report.modules
    batches = _batches(session, data)
    want = _losses(eager, batches)
    got = _losses(compiled, batches)
    assert counters["frames"]["ok"] > frames, f"{example}: nothing was compiled"
    assert list(compiled.state_dict()) == keys  # checkpoints keep their keys
    print(f"{example} ({backend}): {time.perf_counter() - started:.1f} s, {report.modules}")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{example}: {m}")


def test_a_third_party_model_is_compiled_around_its_embeddings():
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    class Tower(nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 2

    class ThirdParty(nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10,
                                                                         feature_names=["f"])])
            self.heads = nn.ModuleDict({"a": nn.Linear(4, 1), "b": Tower()})
            self.skip = nn.Identity()

    roots = [name for name, _ in dense_roots(nn.ModuleDict({"model": ThirdParty()}))]
    assert roots == ["model.heads.a", "model.heads.b"]


def test_a_compiled_run_stopped_and_resumed_is_the_uninterrupted_compiled_run(request):
    if _ran_in_a_fresh_process(request):
        return
    tmp_path, criteo_dir = request.getfixturevalue("tmp_path"), request.getfixturevalue("criteo_dir")
    from tests.integration.test_resume import Losses, _train
    from tests.integration.test_update_path import weights

    sets = ('train.pipeline={type="sparse_dist"}', "train.num_steps=8", f'data.eval_input="{criteo_dir / "eval"}"',
            "eval.num_steps=2")
    eager = Losses()
    _train(tmp_path, criteo_dir, "eager", eager, *sets)
    sets = ("train.compile={enabled=true}", *sets)
    whole = Losses()
    uninterrupted = _train(tmp_path, criteo_dir, "whole", whole, *sets)
    assert uninterrupted.steps == 8 and uninterrupted.model.module.model.deep._compiled_call_impl is not None
    # DeepFM through inductor (the default backend) trains to eager's losses and learning rates
    torch.testing.assert_close(whole.steps, eager.steps, rtol=1e-5, atol=1e-6)
    first = Losses(signal_at=6)
    stopped = _train(tmp_path, criteo_dir, "split", first, *sets)
    assert stopped.stopped_by == "SIGUSR1" and stopped.steps == 6
    second = Losses()
    resumed = _train(tmp_path, criteo_dir, "split", second, *sets, resume=True)
    assert resumed.steps == 8
    assert {**first.steps, **second.steps} == whole.steps  # the same loss and lr at every step, exactly
    assert resumed.eval.metrics == uninterrupted.eval.metrics  # evaluation compiled too
    a, b = weights(uninterrupted.model), weights(resumed.model)
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_the_inductor_cache_dir_reaches_every_rank_unchanged():
    from tzrun.runner.launch import launch_environment

    env = launch_environment({"TORCHINDUCTOR_CACHE_DIR": "/data/inductor"}, 2)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/data/inductor"


def test_graph_breaks_are_counted_at_info_and_named_at_debug(request):
    if _ran_in_a_fresh_process(request):
        return
    caplog = request.getfixturevalue("caplog")
    class Breaking(nn.Module):
        def forward(self, x):
            y = x * 2
            torch._dynamo.graph_break()
            return y + 1

    model = nn.ModuleDict({"model": nn.ModuleDict({"tower": Breaking()})})
    report = compile_dense(model, CompileConfig(enabled=True))
    assert report is not None and report.modules == ["model.tower"]
    with caplog.at_level(logging.DEBUG, logger="tzrun.runner.compile"):
        assert torch.equal(model["model"]["tower"](torch.ones(3)), torch.full((3,), 3.0))
        delta = report.report(rank=0, when="up to step 1")
    assert delta["graph_breaks"] >= 1 and delta["seconds"] > 0
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(f"{int(delta['graph_breaks'])} graph break(s)" in m for m in info), info
    assert any("graph break" in m and "graph_break" in m for m in debug), debug
