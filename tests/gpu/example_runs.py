"""How the GPU smoke suite trains every example config for a few steps, and its data.

Importing this module and its ``args`` command use the standard library only, so that
``scripts/gpu_smoke.sh --dry-run`` can print the exact commands on a machine without torch::

    python tests/gpu/example_runs.py data DATA_ROOT            # synthetic criteo, criteo text, taobao
    python tests/gpu/example_runs.py args EXAMPLE DATA_ROOT MODEL_DIR   # the --set arguments, one a line
    python tests/gpu/example_runs.py list                      # every example the suite trains

Each example keeps its model, features, losses, metrics and optimizers; only the data paths, the
model dir, the batch sizes and the length change (one epoch of :data:`TRAIN_ROWS` rows at
:data:`BATCH_SIZE` per rank). ``deepfm_criteo_full`` (204M embedding rows, "to be planned, not
trained" on one machine) trains with the table sizes of ``deepfm_criteo`` and its own layers.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["REPO", "TRAIN_ROWS", "EVAL_ROWS", "BATCH_SIZE", "DATASETS", "examples", "dataset_of", "set_args", "make_data"]

REPO = Path(__file__).resolve().parents[2]
TRAIN_ROWS, EVAL_ROWS, BATCH_SIZE = 16_384, 4_096, 512

#: the synthetic data set each example's data paths point into (by the first path component)
DATASETS = {"criteo_synth": "criteo", "criteo_full": "criteo", "criteo_text": "criteo_text", "taobao_synth": "taobao"}


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with path.open("rb") as f:
        return tomllib.load(f)


def examples() -> list[str]:
    """Every example config of the repository (``examples/*.toml``), by name."""
    return sorted(p.stem for p in (REPO / "examples").glob("*.toml"))


def dataset_of(example: str) -> str:
    """The synthetic data set (``criteo``, ``criteo_text`` or ``taobao``) an example reads.

    Raises:
        ValueError: the example reads a data directory this suite does not know.
    """
    train_input = _load_toml(REPO / "examples" / f"{example}.toml")["data"]["train_input"]
    folder = Path(train_input).parts[1] if train_input.startswith("data/") else ""
    if folder not in DATASETS:
        raise ValueError(f"examples/{example}.toml: data.train_input {train_input!r} is not one of the smoke suite's "
                         f"data sets ({', '.join(sorted(DATASETS))}): add it to tests/gpu/example_runs.py")
    return DATASETS[folder]


def set_args(example: str, data_root: str | Path, model_dir: str | Path) -> list[str]:
    """The ``--set KEY=VALUE`` arguments that train ``example`` on the smoke data."""
    config = _load_toml(REPO / "examples" / f"{example}.toml")
    data = Path(data_root) / dataset_of(example)
    sets = [
        f'data.train_input="{data / "train"}"',
        f'data.eval_input="{data / "eval"}"',
        f'model_dir="{model_dir}"',
        f"data.batch_size={BATCH_SIZE}",
        f"data.eval_batch_size={BATCH_SIZE}",
        "data.num_workers=0",
        "train.num_epochs=1",
        "train.log_every_n_steps=8",
    ]
    if "num_steps" in config.get("train", {}):
        sets.remove("train.num_epochs=1")
    if "sampler" in config["data"]:
        sets.append(f'data.sampler.item_table="{data / "items.parquet"}"')
    if example == "deepfm_criteo_full":
        small = {f["name"]: f["num_buckets"] for f in _load_toml(REPO / "examples" / "deepfm_criteo.toml")["features"]["sparse"]}
        sets += [f"features.sparse[{i}].num_buckets={small[f['name']]}" for i, f in enumerate(config["features"]["sparse"])]
    return [a for s in sets for a in ("--set", s)]


def make_data(root: str | Path) -> None:
    """Write the smoke data sets under ``root`` (criteo, criteo_text, taobao with its items)."""
    from tzrun_tools.criteo_text import parquet_to_criteo_text
    from tzrun_tools.synth import synth_criteo
    from tzrun_tools.synth_taobao import synth_taobao

    root = Path(root)
    synth_criteo(root / "criteo", rows=TRAIN_ROWS, eval_rows=EVAL_ROWS, seed=1, rows_per_file=4096, row_group_size=1024)
    synth_taobao(root / "taobao", rows=TRAIN_ROWS, eval_rows=EVAL_ROWS, seed=1, rows_per_file=4096, row_group_size=1024)
    for split in ("train", "eval"):
        parquet_to_criteo_text(root / "criteo" / split, root / "criteo_text" / split)


def main(argv: list[str]) -> int:
    """The command line (see the module docstring); returns the exit code."""
    if argv[:1] == ["list"] and len(argv) == 1:
        print("\n".join(examples()))
    elif argv[:1] == ["data"] and len(argv) == 2:
        make_data(argv[1])
    elif argv[:1] == ["args"] and len(argv) == 4:
        print("\n".join(set_args(*argv[1:])))
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
