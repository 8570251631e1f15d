"""The plugin side of sampled negatives: DSSM's ``sampled_similarity`` over the items appended to
a batch, the ``sampled_softmax`` loss, ``recall_at_k`` with ``sampled = true``, and what
``tzrec-run check`` says about ``[data.sampler]``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tests.plugins.test_models import ROWS, _batch, _build, _ctx, registries  # noqa: F401
from tzrun.data.batch import Batch
from tzrun.errors import EXIT_CONFIG, ConfigError
from tzrun.testing import load_config_text
from tzrun_plugins.losses.ranking import SampledSoftmaxConfig, build_sampled_softmax
from tzrun_plugins.metrics.retrieval import HitRateAtK, RecallAtK

REPO = Path(__file__).resolve().parents[2]
SAMPLED = 3


def _with_items(batch: Batch) -> Batch:
    """``batch`` with 3 items appended the way the data path appends sampled ones: one id of
    ``b`` and a dense row each, no ids of the user features."""
    keys = batch.sparse.keys()
    own = batch.sparse.lengths().view(len(keys), -1)
    values = torch.split(batch.sparse.values(), batch.sparse.length_per_key())
    item_lengths = {k: torch.tensor([1, 1, 1] if k == "b" else [0, 0, 0], dtype=torch.int32) for k in keys}
    item_values = {k: torch.tensor([7, 2, 9]) if k == "b" else torch.zeros(0, dtype=torch.int64) for k in keys}
    sparse = KeyedJaggedTensor(
        keys=keys,
        values=torch.cat([v for i, k in enumerate(keys) for v in (values[i], item_values[k])]),
        lengths=torch.cat([v for i, k in enumerate(keys) for v in (own[i], item_lengths[k])]),
        stride=ROWS + SAMPLED,
    )
    dense = torch.cat([batch.dense, torch.randn(SAMPLED, batch.dense.shape[1])])
    return Batch(dense, sparse, batch.labels, batch.weights, batch.num_rows)


def test_dssm_scores_each_user_against_its_item_and_the_sampled_ones(registries):
    model = _build(registries, "dssm", _ctx(), user_features=("a", "seq", "d0"), item_features=("b", "d1"),
                   user_hidden_units=(4,), item_hidden_units=(), output_dim=3, temperature=0.5)
    plain = model(_batch(_ctx()))
    batch = _with_items(_batch(_ctx()))
    out = model(batch)
    # the batch's own rows are untouched by the items after them
    torch.testing.assert_close(out["user_embedding"], plain["user_embedding"])
    torch.testing.assert_close(out["item_embedding"], plain["item_embedding"])
    torch.testing.assert_close(out["similarity"], plain["similarity"])
    assert out["sampled_similarity"].shape == (ROWS, 1 + SAMPLED)
    torch.testing.assert_close(out["sampled_similarity"][:, 0], out["similarity"].diagonal())
    # column j > 0: the user against the j-th sampled item, embedded by the item tower
    item_only = Batch(batch.dense[ROWS:], KeyedJaggedTensor(
        keys=batch.sparse.keys(), values=torch.tensor([7, 2, 9]),
        lengths=torch.tensor([0, 0, 0, 1, 1, 1, 0, 0, 0], dtype=torch.int32), stride=SAMPLED,
    ), {}, torch.ones(SAMPLED), SAMPLED)
    sampled_items = model(item_only)["item_embedding"]
    torch.testing.assert_close(out["sampled_similarity"][:, 1:], out["user_embedding"] @ sampled_items.t() / 0.5)
    assert plain["sampled_similarity"].shape == (ROWS, 1)  # without a sampler: only the own item


def test_sampled_softmax_is_cross_entropy_with_the_positive_in_column_0():
    loss = build_sampled_softmax(SampledSoftmaxConfig(temperature=0.5))
    similarity = torch.tensor([[1.0, 0.0, 2.0], [0.5, -1.0, 0.5]])
    weight = torch.tensor([1.0, 3.0])

    def row(s):
        z = [x / 0.5 for x in s]
        return math.log(sum(math.exp(v) for v in z)) - z[0]

    expected = (1.0 * row([1.0, 0.0, 2.0]) + 3.0 * row([0.5, -1.0, 0.5])) / 4.0
    assert loss(similarity, torch.zeros(2), weight).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match=r"sampled_softmax needs a \[B, 1 \+ num_negatives\] similarity .* got \[2, 1\]; set \[data.sampler\]"):
        loss(similarity[:, :1], torch.zeros(2), weight)


def test_recall_and_hit_rate_with_sampled_take_column_0_as_the_positive():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.1], [0.5, 0.5, 0.1], [0.0, 1.0, 1.0]])
    weight = torch.tensor([1.0, 1.0, 2.0, 0.0])  # the last row is padding
    for metric in (RecallAtK(k=1, sampled=True), HitRateAtK(k=1, sampled=True)):
        metric.update(scores, None, weight)
        # row 0: top; row 1: second; row 2: tied for the top with one other, retrieved half the time
        assert metric.compute().item() == pytest.approx((1.0 + 0.0 + 2.0 * 0.5) / 4.0)
    with pytest.raises(ValueError, match="set in_batch or sampled, not both"):
        RecallAtK(k=1, in_batch=True, sampled=True)


def _example() -> str:
    return (REPO / "examples" / "dssm_taobao_sampled.toml").read_text()


def test_the_sampled_example_passes_check():
    cfg, _ = load_config_text(_example())
    assert cfg.data.sampler.type == "negative" and cfg.data.sampler.config.num_negatives == 1024
    assert cfg.data.sampler.config.weight == "popularity"


@pytest.mark.parametrize(("override", "message"), [
    ("data.sampler.num_negatives=0", "data.sampler.num_negatives: must be >= 1, got 0"),
    ("data.sampler.item_ids=1", "data.sampler.item_ids: unknown key"),
    ('data.sampler.type="negatives"', "data.sampler.type: unknown sampler 'negatives' (available: negative, tdm; did you mean 'negative'?)"),
    ("data.sampler.weight_by_count=true", "data.sampler: set weight or weight_by_count, not both"),
    ('data.sampler.column_types={price="decimal"}', "column 'price': unknown type 'decimal'"),
])
def test_sampler_option_errors_name_the_toml_path(override, message):
    with pytest.raises(ConfigError) as excinfo:
        load_config_text(_example(), overrides=[override])
    assert message in str(excinfo.value)


def _check(config: Path, *sets: str):
    from tests.conftest import cli

    return cli(["check", str(config), *(a for s in sets for a in ("--set", s))])


def test_check_refuses_a_sampler_for_a_model_without_sampled_outputs_and_sampled_reads_without_one():
    proc = _check(REPO / "examples" / "deepfm_criteo.toml",
                  'data.sampler={type = "negative", item_table = "items.parquet", item_id = "c1", num_negatives = 8}')
    assert proc.returncode == EXIT_CONFIG
    assert ("data.sampler: model deepfm does not use sampled negatives (it makes no 'sampled_similarity' output); "
            "remove [data.sampler] or use a two-tower model") in proc.stderr
    proc = _check(REPO / "examples" / "dssm_taobao.toml", 'losses=[{type = "sampled_softmax"}]',
                  'metrics=[{type = "recall_at_k", sampled = true, prediction = "sampled_similarity"}]')
    assert proc.returncode == EXIT_CONFIG
    assert "losses[0]: reads 'sampled_similarity', which needs sampled negatives: add [data.sampler]" in proc.stderr
    assert "metrics[0]: reads 'sampled_similarity'" in proc.stderr


def _gather_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from tzrun_plugins.models._gather import gather_rows

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        rows = torch.full((2, 3), float(rank + 1), requires_grad=True)
        gathered = gather_rows(rows)
        scale = torch.arange(1.0, 1.0 + 4 * 3).view(4, 3)  # the same on both ranks
        (gathered * scale).sum().backward()
        torch.save({"gathered": gathered.detach(), "grad": rows.grad}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.multiproc
def test_gathered_negatives_come_from_every_rank_and_send_gradients_back(tmp_path):
    from tests.warm_ranks import warm_spawn

    warm_spawn(_gather_worker, (2, str(tmp_path / "store"), str(tmp_path)))
    scale = torch.arange(1.0, 13.0).view(4, 3)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(got["gathered"], torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)]))
        # both ranks' losses use this rank's rows: its gradient is the sum of their scales
        torch.testing.assert_close(got["grad"], 2 * scale[2 * rank : 2 * rank + 2])
