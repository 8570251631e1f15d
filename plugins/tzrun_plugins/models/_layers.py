"""Building blocks the first-party models share: MLPs, option validators, build-time checks."""

from __future__ import annotations

from typing import Any, Sequence

from tzrun import ModelContext
from tzrun.errors import ConfigProblem

__all__ = ["positive_units", "non_empty", "each_once", "mlp", "out_width", "wide_tables", "one_embedding_dim", "unknown_feature_problems"]


def positive_units(instance: Any, attribute: Any, value: Sequence[int]) -> None:
    """attrs validator: every layer width is at least 1."""
    if any(u < 1 for u in value):
        raise ValueError(f"every layer needs at least 1 unit, got {list(value)}", attribute)


def non_empty(instance: Any, attribute: Any, value: Sequence[Any]) -> None:
    """attrs validator: at least one entry."""
    if not value:
        raise ValueError("needs at least one entry", attribute)


def each_once(field: str, what: str) -> Any:
    """attrs validator of a tuple of tables: no two share the value of ``field``
    (``"<what>; <value> has several"``)."""

    def check(instance: Any, attribute: Any, value: Sequence[Any]) -> None:
        names = [getattr(v, field) for v in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{what}; {', '.join(twice)} has several", attribute)

    return check


def mlp(in_features: int, units: Sequence[int], *, bias: bool = True, batch_norm: bool = False) -> Any:
    """``Linear -> ReLU`` per width of ``units`` (an identity when ``units`` is empty); without
    ``bias``, the linear layers have none. With ``batch_norm``, ``Linear`` (no bias) ``->
    BatchNorm1d -> ReLU`` (TorchEasyRec's ``MLP`` with ``use_bn``)."""
    from torch import nn

    layers: list[nn.Module] = []
    for width in units:
        layers.append(nn.Linear(in_features, width, bias=bias and not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm1d(width))
        layers.append(nn.ReLU())
        in_features = width
    return nn.Sequential(*layers)


def out_width(in_features: int, units: Sequence[int]) -> int:
    """The width of :func:`mlp`'s output."""
    return units[-1] if units else in_features


def wide_tables(ctx: ModelContext, dim: int) -> list[Any]:
    """TorchRec configs of a ``dim``-wide twin (``<table>_wide``) of each of ``ctx``'s tables,
    looked up by the same features with the same pooling: the per-id weights of a wide part."""
    from torchrec import EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(
            name=f"{t.name}_wide",
            num_embeddings=t.num_embeddings,
            embedding_dim=dim,
            feature_names=list(t.feature_names),
            pooling=PoolingType[t.pooling.upper()],
        )
        for t in ctx.tables
    ]


def one_embedding_dim(ctx: ModelContext, model: str, why: str, problems: list[ConfigProblem]) -> int:
    """The embedding width all of ``ctx``'s tables share, or a problem (and 0) when they differ."""
    dims = sorted({t.embedding_dim for t in ctx.tables})
    if len(dims) > 1:
        problems.append(ConfigProblem("features.sparse", f"{model} needs one embedding_dim for all id features ({why}), got {dims}"))
        return 0
    return dims[0] if dims else 0


def unknown_feature_problems(path: str, names: Sequence[str], ctx: ModelContext, *, sequences: bool = False) -> list[ConfigProblem]:
    """A problem for each of ``names`` that is neither a dense nor a sparse feature of ``ctx``
    (nor, with ``sequences``, a sequence group), or is named twice."""
    from tzrun.errors import did_you_mean

    known = [f.name for f in ctx.dense_features] + [f.name for f in ctx.sparse_features]
    kinds = "[[features.dense]] or [[features.sparse]]"
    if sequences:
        known += [g.name for g in ctx.sequence_groups]
        kinds = "[[features.dense]], [[features.sparse]] or [[features.sequence]]"
    problems = []
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            problems.append(ConfigProblem(f"{path}[{i}]", f"feature '{name}' is named twice"))
        elif name not in known:
            guess = did_you_mean(name, known)
            hint = f"; did you mean '{guess}'?" if guess else ""
            problems.append(ConfigProblem(
                f"{path}[{i}]", f"no feature named '{name}' in {kinds}{hint}"
            ))
        seen.add(name)
    return problems
