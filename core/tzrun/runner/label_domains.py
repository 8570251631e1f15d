"""What a run needs of its labels: per label column, the strictest domain of the losses,
metrics and train metrics reading it, and its derived labels (torch-free)."""

from __future__ import annotations

from tzrun.config.schema import RunConfig
from tzrun.data.labels import DerivedLabel, LabelDomain, strictest
from tzrun.kernel.registry import Registries

__all__ = ["label_domains", "derived_labels"]


def label_domains(cfg: RunConfig, registries: Registries) -> dict[str, tuple[LabelDomain, ...]]:
    """Per label name, the domains the batch builder checks it against (see
    :func:`tzrun.data.labels.strictest`). A ``"class_index"`` component whose options have an
    integer ``num_classes`` bounds the indices by it."""
    needs: dict[str, list[LabelDomain]] = {}
    for kind, what in (("loss", "losses"), ("metric", "metrics"), ("metric", "train_metrics")):
        for i, c in enumerate(getattr(cfg, what)):
            domain = registries[kind].get(c.type, f"{what}[{i}].type").extras.get("labels")
            if domain is None:
                continue
            bound = getattr(c.config, "num_classes", None) if domain == "class_index" else None
            label = (c.fields.label if c.fields else None) or cfg.data.labels[0]
            needed_by = f"{what}[{i}] ({c.type})"
            needs.setdefault(label, []).append(LabelDomain(domain, needed_by, bound if isinstance(bound, int) else None))
    return {label: strictest(domains) for label, domains in needs.items()}


def derived_labels(cfg: RunConfig) -> tuple[DerivedLabel, ...]:
    """``[[data.derived_labels]]`` as the batch builder takes them."""
    return tuple(DerivedLabel(d.name, d.source, d.op, d.value, d.map, d.default, d.cast) for d in cfg.data.derived_labels)
