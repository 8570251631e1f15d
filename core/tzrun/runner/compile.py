"""Compiling the dense part of a run (``[train.compile]``): every largest submodule of the
user's model that holds no embedding collection, and every loss, is compiled in place with
``torch.compile`` (TorchInductor); the embedding collections (sharded by DMP afterwards) and the
model's own ``forward`` stay eager.

These are the modules TorchRec's train pipelines already treat as leaves of their fx tracing
(``_get_leaf_module_names``: a child without a ``ShardedModule`` below it), so the pipeline never
traces into a compiled module. The module object (and so every state-dict key and checkpoint)
stays as it is: like ``nn.Module.compile``, only its ``_compiled_call_impl`` is set. Unlike it,
the compiled function is a frame of this module's own, one code object per compiled module:
dynamo skips a top frame in ``torch.nn`` (``nn.Module.compile`` on an ``nn.Sequential``
compiles nothing in torch 2.13), and its recompile limit counts per code object.
"""

from __future__ import annotations

import logging
import types
from typing import Iterator

import attrs
import torch
from torch import nn

from tzrun.config.schema import CompileConfig

__all__ = ["CompiledDense", "compile_dense", "dense_roots"]

log = logging.getLogger(__name__)

_CONTAINERS = (nn.ModuleDict, nn.ModuleList, nn.ParameterDict, nn.ParameterList)


def _embedding_kinds() -> tuple[type, ...]:
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.distributed.types import ShardedModule

    return (EmbeddingBagCollection, EmbeddingCollection, ShardedModule)


def dense_roots(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """The largest submodules of ``module`` (by qualified name) that hold no embedding
    collection: what :func:`compile_dense` compiles. A container without a ``forward`` of its
    own (``ModuleDict``, ``ModuleList``) is looked into instead."""
    kinds = _embedding_kinds()
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, kinds):
            continue
        if isinstance(child, _CONTAINERS) or any(isinstance(m, kinds) for m in child.modules()):
            yield from dense_roots(child, path + ".")
        elif not isinstance(child, nn.Identity):
            yield path, child


def _entry(module: nn.Module, name: str) -> types.FunctionType:
    """A fresh function (its own code object, named after ``name``) that calls ``module``
    as ``nn.Module._call_impl`` does: hooks included."""
    call = module._call_impl

    def compiled_module(*args, **kwargs):
        return call(*args, **kwargs)

    label = "compiled_" + "".join(c if c.isalnum() else "_" for c in name)
    code = compiled_module.__code__.replace(co_name=label, co_qualname=label)
    return types.FunctionType(code, compiled_module.__globals__, label, None, compiled_module.__closure__)


def _stats() -> dict[str, float]:
    from torch._dynamo.utils import calculate_time_spent, counters

    spent = calculate_time_spent()
    return {
        "seconds": float(spent.get("entire_frame_compile", 0.0)),
        "graphs": float(counters["stats"]["unique_graphs"]),
        "graph_breaks": float(sum(counters["graph_break"].values())),
        "cache_hits": float(counters["inductor"]["fxgraph_cache_hit"]),
        "cache_misses": float(counters["inductor"]["fxgraph_cache_miss"]),
    }


@attrs.define
class CompiledDense:
    """The modules a run compiled, and what compiling them has cost since the last report.

    torch's compile counters are global to the process; each report logs the change since
    the previous one (or since :func:`compile_dense`).

    Attributes:
        modules: the qualified names compiled (under the ``TrainModel``: ``model.*``, ``losses.*``).
    """

    modules: list[str]
    _last: dict[str, float] = attrs.field(factory=_stats)
    _breaks: dict[str, int] = attrs.field(factory=dict)

    def report(self, rank: int, when: str) -> dict[str, float]:
        """Log the compile seconds, graphs, graph breaks and inductor cache hits since the last
        report (info on rank 0; each new graph break's reason at debug); returns the changes."""
        from torch._dynamo.utils import counters

        now = _stats()
        delta = {k: now[k] - self._last[k] for k in now}
        self._last = now
        for reason, count in counters["graph_break"].items():
            if count != self._breaks.get(reason, 0):
                log.debug("torch.compile graph break (%d time(s)): %s", count, reason)
                self._breaks[reason] = count
        if rank == 0 and any(delta.values()):
            log.info("compile (%s): %.1f s compiling, %d graph(s), %d graph break(s) (their reasons at debug level), "
                     "inductor cache %d hit(s) / %d miss(es)", when, delta["seconds"], delta["graphs"],
                     delta["graph_breaks"], delta["cache_hits"], delta["cache_misses"])
        return delta


def compile_dense(model: nn.Module, cfg: CompileConfig, rank: int = 0) -> CompiledDense | None:
    """Compile ``model``'s dense roots in place (``model`` is the unsharded ``TrainModel``:
    its user model's and losses' roots); None when ``cfg`` is off.

    Compiling is lazy: each module is traced and compiled at its first call (the first step,
    the first evaluation), and again when a shape or ``training`` changes.
    """
    if not cfg.enabled:
        return None
    names = []
    for name, module in dense_roots(model):
        if name.startswith(("model.", "losses.")):
            module._compiled_call_impl = torch.compile(_entry(module, name), mode=cfg.mode, dynamic=cfg.dynamic)
            names.append(name)
    if rank == 0:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        log.info("compile: %d dense module(s) compiled in place with mode %r (%s); inductor cache: %s "
                 "(TORCHINDUCTOR_CACHE_DIR); each compiles at its first call",
                 len(names), cfg.mode, ", ".join(names), cache_dir())
    return CompiledDense(names)
