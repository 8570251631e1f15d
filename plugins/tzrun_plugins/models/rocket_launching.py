"""Rocket Launching (Zhou et al., AAAI 2018), as TorchEasyRec's ``rocket_launching``: a light
net and a booster net trained together over one shared part; the light net is what serving runs.

``x = [dense features, embeddings, encoded sequence groups]`` (TorchEasyRec's first group) and
``s = share_mlp(x)`` (``s = x`` without ``share_hidden_units``). The booster net reads ``s``; the
light net reads ``sg(s)`` (``sg``: stop gradient), so the shared part and the embeddings learn
only from the booster, as TorchEasyRec's ``share_net.detach()``. Each net is a ReLU MLP and a
linear layer to one logit. Outputs: ``logits``/``probs`` (the light net's) and
``logits_booster``/``probs_booster``.

In training the model also returns its own loss terms (``loss/<name>``, see
:mod:`tzrun.runner.model`), each over the batch with its sample weights, never sending a
gradient into the booster (``sg``):

- ``hint_l2_loss``: ``mean_w((logit_light - sg(logit_booster))^2)``, the light logits distilled
  from the booster's;
- with ``feature_based_distillation``, ``similarity_<i>_<j>`` for each light layer ``i`` and the
  first booster layer ``j`` of its width: ``-0.1 mean_w(cos(h_i, sg(b_j)))`` (``cosine``) or
  ``sqrt(sum_w |h_i - sg(b_j)|^2)`` (``euclid``).

``tzrec-run export`` writes the light net alone (:meth:`serving_model`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import attrs

from tzrun import ModelContext
from tzrun_plugins.models._layers import non_empty, out_width, positive_units
from tzrun_plugins.models._multi_task import add_inputs, check_inputs, read_inputs
from tzrun_plugins.models._sequence_config import SequenceEncoderConfig, unique_sequences

if TYPE_CHECKING:  # the batch type imports torchrec, which only build() may
    import torch

    from tzrun import Batch

__all__ = ["RocketLaunchingConfig", "build_rocket_launching", "distilled_layers", "weighted_mean", "feature_distance"]


@attrs.frozen
class RocketLaunchingConfig:
    """Options of the ``rocket_launching`` model.

    Attributes:
        share_hidden_units: layer widths of the shared MLP both nets read (empty: none, the
            nets read the input layer).
        booster_hidden_units: layer widths of the booster net's MLP (a linear layer to one
            logit follows).
        light_hidden_units: layer widths of the light net's MLP (a linear layer to one logit
            follows).
        feature_based_distillation: add a hint loss between each light layer and the first
            booster layer of its width.
        feature_distillation_function: that loss: ``cosine`` or ``euclid``.
        sequence_encoders: how each sequence group is encoded (``[[model.sequence_encoders]]``).
    """

    share_hidden_units: tuple[int, ...] = attrs.field(default=(), validator=positive_units)
    booster_hidden_units: tuple[int, ...] = attrs.field(default=(256, 128, 64, 32),
                                                        validator=[non_empty, positive_units])
    light_hidden_units: tuple[int, ...] = attrs.field(default=(96, 64, 32), validator=[non_empty, positive_units])
    feature_based_distillation: bool = False
    feature_distillation_function: Literal["cosine", "euclid"] = attrs.field(
        default="cosine", validator=attrs.validators.in_(("cosine", "euclid")))
    sequence_encoders: tuple[SequenceEncoderConfig, ...] = attrs.field(default=(), validator=unique_sequences)


def distilled_layers(light: tuple[int, ...], booster: tuple[int, ...]) -> dict[int, int]:
    """``{light layer i: booster layer j}``: for each light layer, the first booster layer of
    its width (layers without one are not distilled), as TorchEasyRec pairs them."""
    return {i: booster.index(w) for i, w in enumerate(light) if w in booster}


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum(w * v) / sum(w)`` over the rows (padding rows have weight 0)."""
    return (values * weights).sum() / weights.sum().clamp_min(1e-12)


def feature_distance(light: torch.Tensor, booster: torch.Tensor, weights: torch.Tensor, function: str) -> torch.Tensor:
    """The hint loss between a light layer ``[B, w]`` and a booster layer (its gradient stopped).

    ``cosine``: ``-0.1`` times the weighted mean cosine similarity. ``euclid``:
    ``sqrt(sum_i w_i / mean(w) * |light_i - booster_i|^2)``, ``mean(w)`` over the batch's real
    rows (weight > 0): TorchEasyRec's square root of the batch's summed squared distance.
    """
    import torch
    import torch.nn.functional as F

    booster = booster.detach()
    if function == "cosine":
        cos = (F.normalize(light, p=2, dim=1) * F.normalize(booster, p=2, dim=1)).sum(dim=1)
        return -0.1 * weighted_mean(cos, weights)
    squared = (booster - light).square().sum(dim=1)
    real = (weights > 0).sum()
    return torch.sqrt((squared * weights).sum() * real / weights.sum().clamp_min(1e-12))


def build_rocket_launching(cfg: RocketLaunchingConfig, ctx: ModelContext) -> Any:
    """Build Rocket Launching for ``ctx``'s features.

    Raises:
        ConfigError: when no id feature is configured, or a sequence encoder does not fit its group.
    """
    import torch
    from torch import nn

    check_inputs(cfg.sequence_encoders, ctx, "rocket_launching")
    pairs = distilled_layers(cfg.light_hidden_units, cfg.booster_hidden_units) if cfg.feature_based_distillation else {}

    def layers(width: int, units: tuple[int, ...]) -> nn.ModuleList:
        widths = (width, *units)
        return nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths, widths[1:]))

    class Net(nn.Module):
        """A ReLU MLP whose every layer's output is kept, and a linear layer to one logit."""

        def __init__(self, width: int, units: tuple[int, ...]) -> None:
            super().__init__()
            self.layers = layers(width, units)
            self.output = nn.Linear(units[-1], 1)

        def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
            hidden = []
            for layer in self.layers:
                h = layer(h)
                hidden.append(h)
            return self.output(h).squeeze(-1), hidden

    class LightNet(nn.Module):
        """What serving runs: the input layer, the shared MLP and the light net of a trained
        model (its modules, not copies), returning ``logits`` and ``probs``."""

        def __init__(self, shared: nn.Module, light: nn.Module) -> None:
            super().__init__()
            self.shared = shared
            self.light = light

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            logits, _ = self.light(self.shared(batch))
            return {"logits": logits, "probs": torch.sigmoid(logits)}

    class Shared(nn.Module):
        """The input layer and the shared MLP: ``s``."""

        def __init__(self) -> None:
            super().__init__()
            width = add_inputs(self, cfg.sequence_encoders, ctx)
            self.share = nn.Sequential(*layers(width, cfg.share_hidden_units))
            self.width = out_width(width, cfg.share_hidden_units)

        def forward(self, batch: Batch) -> torch.Tensor:
            s: torch.Tensor = self.share(read_inputs(self, batch))
            return s

    class RocketLaunching(nn.Module):
        """A shared part, a booster net over it and a light net over its stopped gradient."""

        def __init__(self) -> None:
            super().__init__()
            self.shared = Shared()
            self.booster = Net(self.shared.width, cfg.booster_hidden_units)
            self.light = Net(self.shared.width, cfg.light_hidden_units)
            features = [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features]
            features += [g.name for g in ctx.sequence_groups]
            # what `tzrec-run export` writes: the light net (serving_model), its two outputs
            self.serving_programs = {"model": {"outputs": ["logits", "probs"], "features": features}}

        def serving_model(self) -> nn.Module:
            """The module ``tzrec-run export`` traces in place of this one: the light net."""
            return LightNet(self.shared, self.light)

        def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
            s = self.shared(batch)
            light, light_hidden = self.light(s.detach())
            booster, booster_hidden = self.booster(s)
            out = {"logits": light, "probs": torch.sigmoid(light),
                   "logits_booster": booster, "probs_booster": torch.sigmoid(booster)}
            if self.training:
                w = batch.weights
                out["loss/hint_l2_loss"] = weighted_mean((light - booster.detach()).square(), w)
                for i, j in pairs.items():
                    out[f"loss/similarity_{i}_{j}"] = feature_distance(
                        light_hidden[i], booster_hidden[j], w, cfg.feature_distillation_function)
            return out

    return RocketLaunching()
