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
