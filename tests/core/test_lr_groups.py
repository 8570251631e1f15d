"""The names the train log gives the learning rates of an optimizer with several param groups:
TorchRec's fused sparse optimizer (a CombinedOptimizer of one KeyedOptimizer per embedding
module) is named per module, with the tables each holds."""

from __future__ import annotations

import torch
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer

from tzrun.runner.stages import learning_rates, param_group_tables


def _module(tables: list[str], suffix: str = "") -> KeyedOptimizer:
    params = {f"embedding_bags.{t}{suffix}.weight": torch.nn.Parameter(torch.zeros(4, 2)) for t in tables}
    return KeyedOptimizer(params, {}, [{"params": list(params.values()), "lr": 0.05}])


def test_the_fused_sparse_optimizers_groups_are_named_after_their_embedding_modules():
    fused = CombinedOptimizer([("model.deep_ebc", _module(["cat_0_emb", "cat_5_emb"])),
                               ("model.wide_ebc", _module(["cat_0_emb", "cat_5_emb"], "_wide"))])
    dense = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    optimizers = {"sparse": fused, "dense": dense}
    assert learning_rates(optimizers) == {"sparse/deep_ebc": 0.05, "sparse/wide_ebc": 0.05, "dense": 0.1}
    assert param_group_tables(optimizers) == {"sparse/deep_ebc": ["cat_0_emb", "cat_5_emb"],
                                              "sparse/wide_ebc": ["cat_0_emb_wide", "cat_5_emb_wide"]}


def test_groups_without_parameter_names_keep_their_index():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    plain = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.2}], lr=0.1)  # no parameter names
    assert learning_rates({"dense": plain}) == {"dense/0": 0.1, "dense/1": 0.2}
    same = KeyedOptimizer({"m.x.weight": a, "m.y.weight": b}, {}, [{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.1}])
    assert learning_rates({"dense": same}) == {"dense/m.x": 0.1, "dense/m.y": 0.1}
