"""din, and dssm and mmoe with sequence groups: build-time checks, outputs, gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tzrun.data.batch import Batch
from tzrun.errors import ConfigError
from tzrun.interfaces import DenseFeature, EmbeddingTable, ModelContext, SequenceGroup, SparseFeature
from tzrun.testing import load_config_text
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig
from tzrun_plugins.models.din import DINAttentionConfig, DINTowerConfig

REPO = Path(__file__).resolve().parents[2]
ROWS, MAX_LEN, DIM = 4, 5, 8
#: per row: the clicked items (oldest first); row 0 clicked nothing
CLICKS = [[], [3], [1, 2, 3], [4, 5, 6, 7, 8]]


def _ctx(query: tuple[str, ...] = ("item",), groups: bool = True) -> ModelContext:
    """Dense d0, d1; pooled user; the candidate item, sharing its table with the clicks sequence."""
    sparse = (SparseFeature("user", "user", "user_emb", num_buckets=10), SparseFeature("item", "item", "item_emb", num_buckets=10))
    clicks = SequenceGroup("clicks", MAX_LEN, (SparseFeature("clicks__item", "clicks", "item_emb", num_buckets=10),), query)
    return ModelContext(
        (DenseFeature("d0", "d0"), DenseFeature("d1", "d1")), sparse, (EmbeddingTable("user_emb", 10, DIM, ("user",)),),
        torch.device("cpu"), ("click", "buy"),
        sequence_groups=(clicks,) if groups else (),
        sequence_tables=(EmbeddingTable("item_emb", 10, DIM, ("clicks__item", "item") if groups else ("item",)),),
    )


def _batch(items=(1, 2, 3, 4)) -> Batch:
    torch.manual_seed(0)
    sparse = KeyedJaggedTensor(keys=["user"], values=torch.tensor([0, 1, 2, 3]), lengths=torch.ones(ROWS, dtype=torch.int32))
    sequence = KeyedJaggedTensor(
        keys=["clicks__item", "item"],
        values=torch.tensor([i for row in CLICKS for i in row] + list(items)),
        lengths=torch.tensor([len(row) for row in CLICKS] + [1] * ROWS, dtype=torch.int32),
    )
    labels = {"click": torch.zeros(ROWS), "buy": torch.zeros(ROWS)}
    return Batch(torch.randn(ROWS, 2), sparse, labels, torch.ones(ROWS), ROWS, sequence=sequence)


@pytest.fixture(scope="module")
def registries():
    from tzrun.kernel.plugins import make_plugin_manager
    from tzrun.kernel.registry import collect_registries

    return collect_registries(make_plugin_manager())


def _build(registries, name: str, ctx: ModelContext, **options):
    entry = registries["model"].get(name, "model.type")
    return entry.build(entry.config(**options), ctx)


def _problems(excinfo) -> str:
    return "\n".join(str(p) for p in excinfo.value.problems)


def test_din_gives_one_logit_per_row_that_follows_the_candidate(registries):
    torch.manual_seed(0)
    model = _build(registries, "din", _ctx(), towers=(DINTowerConfig(hidden_units=(8,)),),
                   din_towers=(DINAttentionConfig("clicks", attention_hidden_units=(8,)),), final_hidden_units=(4,))
    assert model.inputs[0].width == 2 + DIM + DIM  # dense, user (bag), item (pooled from the sequence table)
    out = model(_batch())
    assert set(out) == {"logits", "probs"} and out["logits"].shape == (ROWS,)
    torch.testing.assert_close(out["probs"], torch.sigmoid(out["logits"]))
    out["logits"].sum().backward()
    assert model.attention[0].score.weight.grad.abs().sum() > 0  # the attention tower is trained
    assert model.sequences.collections["dim_8"].embeddings["item_emb"].weight.grad is not None
    moved = model(_batch(items=(5, 6, 7, 8)))["logits"]
    assert not torch.allclose(moved, out["logits"])


def test_din_attention_weights_respond_to_the_candidate_inside_the_model(registries):
    torch.manual_seed(0)
    model = _build(registries, "din", _ctx(), din_towers=(DINAttentionConfig("clicks", attention_hidden_units=(8,)),))
    weights = {}
    for items in ((1, 2, 3, 4), (9, 9, 9, 9)):
        features = model.sequences(_batch(items))
        sequence, mask = features.sequence("clicks")
        weights[items] = model.attention[0].weights(sequence, mask, features.query("clicks")).detach()
        assert torch.all(weights[items][~mask] == 0.0) and torch.all(weights[items][0] == 0.0)
    assert not torch.allclose(weights[(1, 2, 3, 4)][2:], weights[(9, 9, 9, 9)][2:])


def test_din_with_dice_learns_running_statistics_in_training_and_uses_them_in_evaluation(registries):
    torch.manual_seed(0)
    model = _build(registries, "din", _ctx(), towers=(DINTowerConfig(hidden_units=(8,)),), final_hidden_units=(4,),
                   din_towers=(DINAttentionConfig("clicks", attention_hidden_units=(8,), attention_activation="dice"),))
    dice = model.attention[0].mlp[1]
    assert type(dice).__name__ == "Dice" and dice.running_mean.shape == (8,)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        out = model(_batch())
        out["logits"].sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.all(dice.running_mean == 0.0) and dice.alpha.abs().sum() > 0  # statistics and alpha learned
    trained = model(_batch())["logits"]  # training: this batch's statistics (and one more update)
    model.eval()
    frozen = dice.running_mean.clone()
    evaluated = model(_batch())["logits"]
    torch.testing.assert_close(dice.running_mean, frozen)  # evaluation moves nothing
    assert not torch.allclose(evaluated, trained)  # and normalises with the running statistics
    assert "mlp.1.running_var" in {k.partition("attention.0.")[2] for k in model.state_dict()}  # saved with the weights


def test_din_needs_a_sequence_group_with_a_query(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "din", _ctx(groups=False))
    assert "features.sequence: din needs at least one [[features.sequence]] group with a query" in _problems(excinfo)
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "din", _ctx(query=()))
    assert ("features.sequence[0].query: din's attention over 'clicks' needs the candidate: name its features in query"
            in _problems(excinfo))


def test_din_towers_name_known_groups_and_features(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "din", _ctx(), towers=(DINTowerConfig(features=("d0", "usr")),),
               din_towers=(DINAttentionConfig("click"),))
    text = _problems(excinfo)
    assert "model.din_towers[0].sequence: no [[features.sequence]] group named 'click' (groups: clicks)" in text
    assert "features.sequence[0]: 'clicks' has no [[model.din_towers]] table" in text
    assert "model.towers[0].features[1]: no feature named 'usr' in [[features.dense]] or [[features.sparse]]; did you mean 'user'?" in text


@pytest.mark.parametrize(("encoder", "options", "width"), [
    ("mean", {}, DIM), ("target_attention", {}, DIM), ("self_attention", {}, DIM),
    ("target_attention", {"attention_activation": "dice"}, DIM),
    ("multi_window_din", {"window_lengths": (1, 2), "attention_activation": "dice"}, 3 * DIM),  # two windows, the query
    ("multi_window_din", {"window_lengths": (1, 2), "attention_activation": "prelu"}, 3 * DIM),
    ("simple_attention", {}, DIM),
    ("self_attention_tzrec", {"attention_dim": 12, "num_heads": 3}, 12),
])
def test_mmoe_reads_a_sequence_group_through_each_encoder(registries, encoder, options, width):
    from tzrun_plugins.models.mmoe import MMoETaskConfig

    torch.manual_seed(0)
    model = _build(registries, "mmoe", _ctx(), tasks=(MMoETaskConfig("ctr", (4,)),), num_experts=2,
                   expert_hidden_units=(8,), sequence_encoders=(SequenceEncoderConfig("clicks", encoder, **options),))
    assert model.inputs.width == 2 + 2 * DIM and model.sequence_inputs.width == width
    out = model(_batch())
    assert out["logits/ctr"].shape == (ROWS,)
    out["logits/ctr"].sum().backward()
    grads = [p.grad for p in model.sequence_inputs.parameters()]
    assert all(g is not None for g in grads)


def test_dssm_encodes_a_sequence_in_the_user_tower(registries):
    torch.manual_seed(0)
    model = _build(registries, "dssm", _ctx(), user_features=("user", "d0", "clicks"), item_features=("item", "d1"),
                   user_hidden_units=(8,), item_hidden_units=(8,), output_dim=4,
                   sequence_encoders=(SequenceEncoderConfig("clicks", "self_attention", num_heads=2),))
    assert model.user_tower.sequence_inputs.names == ["clicks"] and model.item_tower.sequence_inputs.names == []
    out = model(_batch())
    assert out["similarity"].shape == (ROWS, ROWS)
    out["similarity"].sum().backward()
    assert model.user_tower.sequence_inputs.encoders[0].positions.weight.grad is not None


def test_dssm_refuses_target_attention_and_needs_each_group_in_a_tower(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dssm", _ctx(), user_features=("user", "d0"), item_features=("item", "d1"),
               sequence_encoders=(SequenceEncoderConfig("clicks", "target_attention"),))
    text = _problems(excinfo)
    assert "model.sequence_encoders[0].type: dssm cannot use target_attention" in text and 'use "mean", "self_attention" or "self_attention_tzrec"' in text
    assert "features.sequence[0]: 'clicks' is in neither tower" in text


def test_encoder_options_must_fit_their_type_and_group(registries):
    from tzrun_plugins.models.mmoe import MMoETaskConfig

    encoders = (SequenceEncoderConfig("clicks", "mean", num_heads=2), SequenceEncoderConfig("clics", "self_attention", num_heads=3))
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "mmoe", _ctx(query=()), tasks=(MMoETaskConfig("ctr"),), sequence_encoders=encoders)
    text = _problems(excinfo)
    assert ('model.sequence_encoders[0].num_heads: only for type = "self_attention" or type = "self_attention_tzrec" '
            '(this encoder is "mean"); remove it') in text
    assert "model.sequence_encoders[1].sequence: no [[features.sequence]] group named 'clics' (groups: clicks); did you mean 'clicks'?" in text
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "mmoe", _ctx(query=()), tasks=(MMoETaskConfig("ctr"),),
               sequence_encoders=(SequenceEncoderConfig("clicks", "self_attention", num_heads=3),))
    assert "model.sequence_encoders[0].num_heads: 3 heads do not divide the group's width 8; pick a divisor" in _problems(excinfo)
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "mmoe", _ctx(query=()), tasks=(MMoETaskConfig("ctr"),),
               sequence_encoders=(SequenceEncoderConfig("clicks", "target_attention"),))
    assert "model.sequence_encoders[0].type: target_attention needs the candidate: set query on the [[features.sequence]] group 'clicks'" in _problems(excinfo)


@pytest.mark.parametrize(
    "override, message",
    [
        ('model.din_towers=[{sequence = "click_seq"}, {sequence = "click_seq"}]', "model.din_towers: one attention tower per sequence group; click_seq has several"),
        ('model.din_towers=[{sequence = "click_seq", softmax = 1}]', "model.din_towers[0].softmax:"),
        ('model.din_towers=[{sequence = "click_seq", attention_activation = "prelu"}]', "model.din_towers[0].attention_activation:"),
        ("model.towers=[{hidden_units = [0]}]", "model.towers[0].hidden_units: every layer needs at least 1 unit"),
    ],
)
def test_din_option_errors_name_the_option(override, message):
    text = (REPO / "examples" / "din_taobao.toml").read_text()
    with pytest.raises(ConfigError) as excinfo:
        load_config_text(text, overrides=[override])
    assert message in str(excinfo.value)


def test_encoder_option_errors_name_the_option():
    text = (REPO / "examples" / "mmoe_taobao.toml").read_text()
    for override, message in [
        ('model.sequence_encoders=[{sequence = "s", type = "lstm"}]', "model.sequence_encoders[0].type:"),
        ('model.sequence_encoders=[{sequence = "s", dropout = 1.0}]', "model.sequence_encoders[0].dropout: must be in [0, 1), got 1.0"),
        ('model.sequence_encoders=[{sequence = "s", type = "multi_window_din", window_lengths = [2, 0]}]',
         "model.sequence_encoders[0].window_lengths: needs at least one window, each at least 1 id long, got [2, 0]"),
        ('model.sequence_encoders=[{sequence = "s", attention_activation = "Dice"}]', "model.sequence_encoders[0].attention_activation:"),
        ('model.sequence_encoders=[{sequence = "s"}, {sequence = "s"}]', "model.sequence_encoders: one encoder per sequence group; s has several"),
    ]:
        with pytest.raises(ConfigError) as excinfo:
            load_config_text(text, overrides=[override])
        assert message in str(excinfo.value), override


def test_new_encoder_options_are_checked(registries):
    from tzrun_plugins.models.mmoe import MMoETaskConfig

    encoders = (SequenceEncoderConfig("clicks", "multi_window_din", num_layers=2),)
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "mmoe", _ctx(query=()), tasks=(MMoETaskConfig("ctr"),), sequence_encoders=encoders)
    text = _problems(excinfo)
    assert ("model.sequence_encoders[0].window_lengths: multi_window_din needs the windows' lengths in ids, most recent "
            "first: set window_lengths (e.g. [1, 3, 10])") in text
    assert 'model.sequence_encoders[0].num_layers: only for type = "self_attention" (this encoder is "multi_window_din")' in text
    assert ("model.sequence_encoders[0].type: multi_window_din needs the candidate: set query on the [[features.sequence]] "
            "group 'clicks'") in text
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "mmoe", _ctx(), tasks=(MMoETaskConfig("ctr"),),
               sequence_encoders=(SequenceEncoderConfig("clicks", "self_attention_tzrec", attention_dim=12),))
    assert "model.sequence_encoders[0].num_heads: 8 heads do not divide attention_dim 12; pick a divisor" in _problems(excinfo)
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dssm", _ctx(), user_features=("user", "d0", "clicks"), item_features=("item", "d1"),
               sequence_encoders=(SequenceEncoderConfig("clicks", "simple_attention"),))
    assert "model.sequence_encoders[0].type: dssm cannot use simple_attention" in _problems(excinfo)


def test_din_example_passes_check():
    cfg, _ = load_config_text((REPO / "examples" / "din_taobao.toml").read_text())
    assert cfg.model.type == "din"


def test_check_refuses_dssm_with_target_attention_in_one_line(tmp_path, capsys):
    from tests.integration.test_sequence_models import POOLED_SEQUENCE, SEQUENCE_GROUP
    from tzrun.cli.main import main
    from tzrun.errors import EXIT_CONFIG

    group = SEQUENCE_GROUP.replace('type = "self_attention"\nnum_heads = 2\nfeedforward_dim = 16', 'type = "target_attention"')
    text = (REPO / "examples" / "dssm_taobao.toml").read_text().replace(POOLED_SEQUENCE, group)
    config = tmp_path / "dssm.toml"
    config.write_text(text.replace('"click_50_seq", "user_pv_7d"', '"click_seq", "user_pv_7d"'))
    assert main(["check", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.splitlines()[1:] == [
        '  model.sequence_encoders[0].type: dssm cannot use target_attention: its towers never see the candidate item '
        'together with the user\'s sequence; use "mean", "self_attention" or "self_attention_tzrec"'
    ]


def test_dssm_keeps_sequences_in_the_user_tower(registries):
    with pytest.raises(ConfigError) as excinfo:
        _build(registries, "dssm", _ctx(), user_features=("user", "d0"), item_features=("item", "d1", "clicks"))
    assert ("model.item_features[2]: 'clicks' is a sequence group: sequences belong to the user tower (sampled negative "
            "items carry none); move it to model.user_features") in _problems(excinfo)


def test_dssm_user_tower_takes_the_batchs_own_rows_before_its_sequences(registries):
    # with [data.sampler], batch.sparse and batch.dense carry the sampled items after the batch's
    # rows; batch.sequence (and so the encoded sequences) only the batch's own rows
    torch.manual_seed(0)
    model = _build(registries, "dssm", _ctx(), user_features=("user", "d0", "clicks"), item_features=("item", "d1"),
                   user_hidden_units=(8,), item_hidden_units=(8,), output_dim=4)
    batch = _batch()
    sequences = model.sequences(batch)
    more = KeyedJaggedTensor(keys=["user"], values=torch.arange(ROWS + 2) % 10, lengths=torch.ones(ROWS + 2, dtype=torch.int32))
    user = model.user_tower(torch.randn(ROWS + 2, 2), model.ebc(more), sequences, ROWS)
    assert user.shape == (ROWS, 4)
