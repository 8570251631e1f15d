"""Reading a checkpoint's entries in the test process, for tests that check what was saved."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from tzrun.runner.checkpoint_blobs import Blob
from tzrun.runner.dcp_storage import load_state
from tzrun.io.storage import as_path


def read_saved(path: Path, key: str) -> Any:
    """What a checkpoint saved under ``key`` through a :class:`~tzrun.runner.checkpoint_blobs.Blob`
    (``loop``, ``schedules``, ``update``, ``train_metrics``, ``stages``, ``rank.<R>``), read in
    this process alone (no process group, no model)."""
    found: list[Any] = []
    state = as_path(path) / "state"
    with warnings.catch_warnings():  # "torch.distributed is disabled ...": loading in one process is the intent
        warnings.simplefilter("ignore", UserWarning)
        load_state(state, {key: Blob(lambda: None, found.append, f"{state} entry '{key}'")}, no_dist=True)
    return found[0]


def saved_tensors(step_dir: Path) -> dict[str, Any]:
    """Every tensor a checkpoint saved (the model's and the optimizer's, each whole whatever
    number of ranks wrote it), by its flat key (``model.model.<name>``, ``optimizer.<...>``),
    read in this process alone."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = Path(scratch) / "state.pt"
        dcp_to_torch_save(str(as_path(step_dir) / "state"), str(target))
        state = torch.load(target, weights_only=False)
    return {k: v for k, v in _flat(state).items() if isinstance(v, torch.Tensor)}


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out
