"""The process group and device of a job: one process, ``torchrun``, or many machines."""

from __future__ import annotations

import datetime
import os
from typing import Any

import attrs

from tzrun.runner.launch import available_cpus, default_num_threads
__all__ = ["DistInfo", "init_distributed", "shutdown_distributed", "default_num_threads", "available_cpus", "refusal_of_rank0",
           "value_of_rank0"]


@attrs.frozen
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: object
    backend: str


def init_distributed(timeout_s: float = 300.0) -> DistInfo:
    """Join (or, alone, create) the default process group.

    Args:
        timeout_s: how long a collective may wait for the other ranks (``train.collective_timeout_s``).

    Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set), joins with ``env://``; otherwise creates a
    one-process group on an in-memory store, since TorchRec's sharding needs one. CUDA uses
    NCCL and ``cuda:<LOCAL_RANK>``; CPU uses gloo.
    """
    import torch
    import torch.distributed as dist

    from tzrun.runner.launch import stop_with_agent

    stop_with_agent()
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if torch.cuda.is_available():
        device, backend = torch.device(f"cuda:{local_rank}"), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(default_num_threads(available_cpus(), local_world_size))
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if "TORCHELASTIC_RESTART_COUNT" in os.environ and "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend=backend, store=_attempt_store(rank, world_size, timeout),
                                    rank=rank, world_size=world_size, timeout=timeout)
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return DistInfo(rank, world_size, local_rank, local_world_size, device, backend)


def _attempt_store(rank: int, world_size: int, timeout: datetime.timedelta) -> Any:
    """torchrun's store, under a prefix of its own for each restart of the job.

    With ``torchrun --max-restarts``, the workers of a restarted attempt share the agent's store
    with the attempt before; in torch 2.13 gloo then reads the peer addresses the previous
    attempt left there and fails with "Connection refused" (reproduced with a two-line script).
    A prefix per ``TORCHELASTIC_RESTART_COUNT`` keeps every attempt's rendezvous apart.
    """
    import torch.distributed as dist

    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
        is_master=not agent_hosts_it and rank == 0, timeout=timeout,
    )
    return dist.PrefixStore(f"tzrun/attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", store)


def shutdown_distributed(timeout_s: float = 30.0) -> None:
    """Leave the process group (if any), all ranks together.

    The rank's watchdog stops first (:mod:`tzrun.runner.watchdog`); a rank that failed
    leaves at once. Ranks first meet at a barrier (gloo's ``monitored_barrier``, bounded by ``timeout_s``, so a
    rank that already failed cannot hold the others): a rank that tears gloo down while a peer
    is still finishing its last collective made that peer abort ("terminate called without an
    active exception") in a 2-rank test.
    """
    import datetime

    import torch.distributed as dist

    from tzrun.runner.watchdog import stop_watchdog

    if stop_watchdog():  # this rank failed: the others are ending, meet no one
        return
    if not dist.is_initialized():
        return
    if dist.get_world_size() > 1:
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
            else:
                dist.barrier()
        except Exception:  # a peer is gone: leave anyway
            pass
    dist.destroy_process_group()


def refusal_of_rank0(refusal: str | None, world_size: int) -> str | None:
    """Rank 0's ``refusal`` (a message, or None to go on) on every rank: what rank 0 alone
    decided (the model dir is not a run's, the lock is held) stops every rank together instead
    of leaving the others waiting in the next collective. Collective when ``world_size > 1``."""
    return value_of_rank0(refusal, world_size)


def value_of_rank0(value: Any, world_size: int) -> Any:
    """Rank 0's ``value`` (anything picklable) on every rank. Collective when ``world_size > 1``."""
    if world_size <= 1:
        return value
    import torch.distributed as dist

    outcome: list[Any] = [value]
    dist.broadcast_object_list(outcome, src=0)
    return outcome[0]
