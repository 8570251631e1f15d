"""The first-party models: option validation, build-time cross-checks, outputs and their shapes."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tzrun.data.batch import Batch
from tzrun.errors import EXIT_CONFIG, ConfigError
from tzrun.interfaces import DenseFeature, EmbeddingTable, ModelContext, SparseFeature
from tzrun.testing import load_config_text
from tzrun_plugins.models.mmoe import MMoETaskConfig

REPO = Path(__file__).resolve().parents[2]
ROWS = 5


def _ctx(dims=(8, 8, 8), dense=("d0", "d1"), sparse=("a", "b", "seq"), shared=("seq", "b")) -> ModelContext:
    """Id features ``sparse`` (``seq`` shares ``b``'s table when named in ``shared``) and dense ``dense``."""
    features, tables = [], []
    for name, dim in zip(sparse, dims):
        table = f"{shared[1]}_emb" if name == shared[0] else f"{name}_emb"
        features.append(SparseFeature(name, name, table, num_buckets=10))
        if name != shared[0]:
            users = (name, shared[0]) if name == shared[1] and shared[0] in sparse else (name,)
            tables.append(EmbeddingTable(table, 10, dim, users, "mean"))
    return ModelContext(
        tuple(DenseFeature(n, n) for n in dense), tuple(features), tuple(tables), torch.device("cpu"), ("click", "buy")
    )


def _batch(ctx: ModelContext) -> Batch:
    torch.manual_seed(0)
    lengths = torch.tensor([1] * ROWS * (len(ctx.sparse_features) - 1) + [0, 3, 1, 2, 4], dtype=torch.int32)
    if len(ctx.sparse_features) == 0:
        lengths = torch.zeros(0, dtype=torch.int32)
    sparse = KeyedJaggedTensor(
        keys=[f.name for f in ctx.sparse_features],
        values=torch.randint(0, 10, (int(lengths.sum()),)),
        lengths=lengths,
        stride=ROWS,
    )
    labels = {name: torch.zeros(ROWS) for name in ctx.labels}
    return Batch(torch.randn(ROWS, len(ctx.dense_features)), sparse, labels, torch.ones(ROWS), ROWS)


def _build(registries, name: str, ctx: ModelContext, **options):
    entry = registries["model"].get(name, "model.type")
    return entry.build(entry.config(**options), ctx)


@pytest.fixture(scope="module")
def registries():
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    return collect_registries(make_plugin_manager())


@pytest.mark.parametrize(
    "name, options",
    [
        ("dlrm", {"dense_hidden_units": (4, 8)}),
        ("dlrm", {"dense_hidden_units": (8,), "arch_with_sparse": True, "top_hidden_units": ()}),
        ("wide_and_deep", {"deep_hidden_units": (4,)}),
        ("deepfm", {"deep_hidden_units": (4,), "final_hidden_units": (4,)}),
    ],
)
def test_ranking_models_give_one_logit_and_its_probability_per_row(registries, name, options):
    model = _build(registries, name, _ctx(), **options)
    out = model(_batch(_ctx()))
    assert set(out) == {"logits", "probs"}
    assert out["logits"].shape == (ROWS,)
    torch.testing.assert_close(out["probs"], torch.sigmoid(out["logits"]))
    out["logits"].sum().backward()  # everything is connected


@pytest.mark.parametrize(
    "name, options",
    [
        ("deepfm", {}),
        ("dlrm", {"dense_hidden_units": (8,)}),
        ("wide_and_deep", {}),
        ("mmoe", {"tasks": (MMoETaskConfig("ctr"),)}),
        ("dssm", {"user_features": ("a", "seq", "d0"), "item_features": ("b", "d1")}),
    ],
)
def test_models_take_per_id_weights_when_features_have_them(registries, name, options):
    base = _ctx()
    ctx = attrs.evolve(base, tables=tuple(attrs.evolve(t, weighted=True, pooling="sum") for t in base.tables))
    batch = _batch(ctx)
    weighted = KeyedJaggedTensor(
        keys=batch.sparse.keys(), values=batch.sparse.values(), lengths=batch.sparse.lengths(),
        weights=torch.full(batch.sparse.values().shape, 0.5), stride=ROWS,
    )
    model = _build(registries, name, ctx, **options)
    out = model(Batch(batch.dense, weighted, batch.labels, batch.weights, ROWS))
    assert all(v.shape[0] == ROWS and torch.isfinite(v).all() for v in out.values())


def test_dlrm_interacts_each_pair_once_in_feature_order(registries):
    model = _build(registries, "dlrm", _ctx(), dense_hidden_units=(8,))
    # 3 id features + the dense vector: 4 * 3 / 2 dot products, after the 8-wide dense vector
    assert model.over_arch[0].in_features == 8 + 6
    assert model.pair_rows.tolist() == [0, 0, 0, 1, 1, 2] and model.pair_cols.tolist() == [1, 2, 3, 2, 3, 3]


def test_mmoe_outputs_logits_and_probs_per_task(registries):
    tasks = (MMoETaskConfig("ctr", (4,)), MMoETaskConfig("cvr", ()))
    model = _build(registries, "mmoe", _ctx(), tasks=tasks, num_experts=2, expert_hidden_units=(6,), gate_hidden_units=(3,))
    out = model(_batch(_ctx()))
    assert set(out) == {"logits/ctr", "probs/ctr", "logits/cvr", "probs/cvr"}
    assert all(v.shape == (ROWS,) for v in out.values())
    torch.testing.assert_close(out["probs/cvr"], torch.sigmoid(out["logits/cvr"]))
    assert not torch.allclose(out["logits/ctr"], out["logits/cvr"])


@pytest.mark.parametrize("similarity", ["cosine", "inner_product"])
def test_dssm_gives_a_square_similarity_of_the_towers_embeddings(registries, similarity):
    model = _build(
        registries, "dssm", _ctx(), user_features=("a", "seq", "d0"), item_features=("b", "d1"),
        user_hidden_units=(4,), item_hidden_units=(), output_dim=3, similarity=similarity, temperature=0.5,
    )
    out = model(_batch(_ctx()))
    user, item = out["user_embedding"], out["item_embedding"]
    assert user.shape == item.shape == (ROWS, 3)
    assert out["similarity"].shape == (ROWS, ROWS)
    torch.testing.assert_close(out["similarity"], user @ item.t() / 0.5)
    if similarity == "cosine":
        torch.testing.assert_close(user.norm(dim=1), torch.ones(ROWS))
    # the towers read their own features: d1 moves only the items, d0 only the users
    batch = _batch(_ctx())
    batch.dense[:, 1] += 1.0
    moved = model(batch)
    torch.testing.assert_close(moved["user_embedding"], user)
    assert not torch.allclose(moved["item_embedding"], item)


def _problems(excinfo) -> str:
    return "\n".join(str(p) for p in excinfo.value.problems)


def test_dlrm_needs_the_bottom_mlp_to_end_at_the_embedding_width(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dlrm", _ctx(), dense_hidden_units=(64, 16))
    assert "model.dense_hidden_units: the last width (16) must equal the embedding_dim of the id features (8); set model.dense_hidden_units = [64, 8]" in _problems(excinfo)


def test_dlrm_needs_one_width_and_dense_features(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dlrm", _ctx(dims=(8, 16), sparse=("a", "b"), dense=()), dense_hidden_units=(8,))
    text = _problems(excinfo)
    assert "features.sparse: dlrm needs one embedding_dim for all id features (its dot products need one width), got [8, 16]" in text
    assert "features.dense: dlrm needs at least one dense feature" in text


def test_wide_and_deep_wide_width_must_suit_fbgemm(registries):
    with pytest.raises(ConfigError, match=r"model.wide_embedding_dim: 6 is not a multiple of 4"):
        _build(registries, "wide_and_deep", _ctx(), wide_embedding_dim=6)


def test_dssm_towers_must_name_every_feature_once(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dssm", _ctx(), user_features=("a", "sequ", "d0"), item_features=("a", "d0", "d1"))
    text = _problems(excinfo)
    assert "model.user_features[1]: no feature named 'sequ' in [[features.dense]], [[features.sparse]] or [[features.sequence]]; did you mean 'seq'?" in text
    assert "model.item_features: a, d0 also in model.user_features; a feature belongs to one tower" in text
    assert "features.sparse[1]: 'b' is in neither tower: add it to model.user_features or model.item_features, or remove it" in text
    assert "features.sparse[2]: 'seq' is in neither tower" in text


def test_dssm_towers_need_an_id_feature(registries):
    with pytest.raises(ConfigError, match=r"model.item_features: the item tower needs at least one id feature"):
        _build(registries, "dssm", _ctx(), user_features=("a", "b", "seq", "d0"), item_features=("d1",))


@pytest.mark.parametrize(
    "example, override, message",
    [
        ("mmoe_taobao", 'model.tasks=[{name="ctr"}, {name="ctr"}]', "model.tasks: task names must differ; ctr is named twice"),
        ("mmoe_taobao", "model.tasks=[]", "model.tasks: mmoe needs at least one [[model.tasks]] table"),
        ("mmoe_taobao", 'model.tasks=[{name="CTR"}]', "model.tasks[0].name: task name 'CTR' must be lower_snake"),
        ("mmoe_taobao", "model.num_experts=0", "model.num_experts: must be >= 1"),
        ("mmoe_taobao", "model.expert_hidden_units=[]", "model.expert_hidden_units: needs at least one entry"),
        ("dlrm_criteo", "model.dense_hidden_units=[]", "model.dense_hidden_units: needs at least one entry"),
        ("dlrm_criteo", "model.top_hidden_units=[0]", "model.top_hidden_units: every layer needs at least 1 unit, got [0]"),
        ("dssm_taobao", "model.temperature=0.0", "model.temperature: must be > 0.0"),
        ("dssm_taobao", 'model.similarity="dot"', "model.similarity:"),
        ("dssm_taobao", "model.user_features=[]", "model.user_features: needs at least one entry"),
        ("wide_and_deep_criteo", "model.wide_dim=4", "model.wide_dim:"),
    ],
)
def test_option_errors_name_the_option(example, override, message):
    text = (REPO / "examples" / f"{example}.toml").read_text()
    with pytest.raises(ConfigError) as excinfo:
        load_config_text(text, overrides=[override])
    assert message in str(excinfo.value)


@pytest.mark.parametrize("example", ["deepfm_criteo", "dlrm_criteo", "wide_and_deep_criteo", "mmoe_taobao", "dssm_taobao"])
def test_examples_pass_check(example):
    cfg, _ = load_config_text((REPO / "examples" / f"{example}.toml").read_text())
    assert cfg.model.type == example.rsplit("_", 1)[0]


def test_check_refuses_a_loss_or_metric_reading_an_output_the_model_lacks():
    from tests.conftest import cli

    proc = cli(["check", str(REPO / "examples" / "mmoe_taobao.toml"),
                "--set", 'losses=[{type = "binary_cross_entropy", label = "click"}]',
                "--set", 'metrics=[{type = "auc", label = "click", prediction = "prob/ctr"}]'])
    assert proc.returncode == EXIT_CONFIG
    assert ("losses[0]: reads the model output 'logits' (the default of loss 'binary_cross_entropy'), but mmoe "
            "outputs logits/ctr, probs/ctr, logits/cvr, probs/cvr") in proc.stderr
    assert "metrics[0].prediction: reads the model output 'prob/ctr'" in proc.stderr and "did you mean 'probs/ctr'?" in proc.stderr
