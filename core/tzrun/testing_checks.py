"""The conformance checks and the multi-rank metric check of :mod:`tzrun.testing`, for plugin
authors' tests: :func:`check_component` runs the checks ``tzrec-run check`` runs on a component
(:mod:`tzrun.kernel.conformance`), and :func:`assert_metric_rank_invariant` runs a metric on several
gloo ranks on CPU with the rows split between them and compares with one process."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from tzrun.kernel.plugins import PluginManager, make_plugin_manager
from tzrun.kernel.registry import Entry, collect_registries

__all__ = ["check_component", "metric_on_ranks", "assert_metric_rank_invariant"]


def _entry_and_options(
    kind: str, name: str, options: Mapping[str, Any] | None, pm: PluginManager | None,
    distributions: Sequence[str] | None = None,
) -> tuple[Entry, Any]:
    from tzrun.config.converter import StructureFailed, make_converter, structure

    pm = pm if pm is not None else make_plugin_manager(distributions=distributions)
    entry = collect_registries(pm)[kind].get(name, f"{kind} '{name}'")
    try:
        config = structure(make_converter(), dict(options or {}), entry.config, f"{kind} '{name}'")
    except StructureFailed as failed:
        raise AssertionError(f"the options of {kind} '{name}' do not structure: {failed}") from None
    return entry, config


def check_component(
    kind: str,
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    pm: PluginManager | None = None,
    group: bool | None = None,
) -> Entry:
    """Build component ``name`` of ``kind`` from ``options`` and run the conformance checks of
    ``tzrec-run check`` on it (:mod:`tzrun.kernel.conformance`).

    Args:
        kind: a kind key (``"dense_optimizer"``, ``"metric"``, ``"loss"``, ``"lr_scheduler"``,
            ``"sparse_optimizer"``, ``"stage"``, ``"eviction_policy"``, ``"admission_filter"``).
        name: its registered name (or ``"plugin:name"``).
        options: its TOML options as a dict (structured strictly, as from a config).
        pm: the plugin manager (default: a fresh one with the installed plugins).
        group: pass group keys to a loss or metric (default: when registered with
            ``group="required"``).

    Returns:
        The registry entry, for further assertions (its plugin, distribution).

    Raises:
        AssertionError: listing every rule broken, each naming the plugin and the component.
    """
    from tzrun.kernel.conformance import component_problems

    entry, config = _entry_and_options(kind, name, options, pm)
    problems = component_problems(entry, config, group=group)
    if problems:
        raise AssertionError("\n".join(problems))
    return entry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world_size: int, port: int, name: str, options: Mapping[str, Any],
               rows: Mapping[str, Any], out: str, distributions: Sequence[str] | None) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        entry, config = _entry_and_options("metric", name, options, None, distributions)
        metric = entry.build(config)
        mine = {k: torch.tensor_split(v, world_size)[rank] for k, v in rows.items()}
        metric.update(mine.pop("prediction"), mine.pop("label"), mine.pop("weight"), **mine)
        value = metric.compute()
        if rank == 0:
            torch.save(value, out)
    finally:
        dist.destroy_process_group()


def metric_on_ranks(
    name: str,
    rows: Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
    *,
    world_size: int = 2,
    distributions: Sequence[str] | None = None,
) -> Any:
    """Compute metric ``name`` on ``world_size`` gloo ranks (CPU processes started with
    ``torch.multiprocessing``), rank ``r`` updating with the ``r``-th contiguous chunk of
    ``rows``; returns rank 0's ``compute()`` (the value over all ranks' rows).

    Args:
        name: the metric's registered name; the ranks load the installed plugins.
        rows: ``prediction``, ``label``, ``weight`` (and ``group``) tensors, one row each.
        options: the metric's TOML options.
        world_size: how many ranks.
        distributions: load only these distributions' plugins in the ranks.
    """
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "value.pt")
        mp.start_processes(_rank_main, args=(world_size, _free_port(), name, dict(options or {}), dict(rows), out,
                                             distributions), nprocs=world_size, start_method="spawn")
        return torch.load(out, weights_only=True)  # written by the ranks this call started, still read as data


def assert_metric_rank_invariant(
    name: str,
    rows: Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
    *,
    world_size: int = 2,
    rtol: float = 1e-6,
    distributions: Sequence[str] | None = None,
) -> Any:
    """Assert that metric ``name`` gives the same value on ``world_size`` gloo ranks, the
    rows split between them (:func:`metric_on_ranks`), as in one process with every row.

    Returns:
        The one-process value.

    Raises:
        AssertionError: with both values.
    """
    import torch

    entry, config = _entry_and_options("metric", name, options, None, distributions)
    metric = entry.build(config)
    whole = dict(rows)
    metric.update(whole.pop("prediction"), whole.pop("label"), whole.pop("weight"), **whole)
    expected = metric.compute()
    got = metric_on_ranks(name, rows, options, world_size=world_size, distributions=distributions)
    same = torch.allclose(torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64),
                          rtol=rtol, atol=0.0)
    assert same, f"metric '{name}' on {world_size} ranks gave {got!r}, and {expected!r} in one process"
    return expected
