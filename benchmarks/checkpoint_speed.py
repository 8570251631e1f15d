"""Checkpoint save and load MB/s against the disk's own sequential bandwidth, in one run.

A TorchRec ``EmbeddingBagCollection`` whose tables hold ``--size-mb`` of float32 weights (26
tables, Criteo-like, sized to the total) is saved and loaded with tzrec-run's own
``save_checkpoint``/``load_checkpoint`` (DCP, hashed as written, verified as read) in a
one-process gloo group. The reference is ``dd`` writing the same number of bytes with
``conv=fdatasync`` (DCP fsyncs every file it writes) and reading them back. Before every read,
the files' pages are dropped from the page cache (``posix_fadvise(DONTNEED)``: no root needed,
the pages are clean after the fsync), so loads and ``dd`` reads both come from the disk.

Rows:

* ``dd write`` / ``dd read``: the disk.
* ``save``: ``save_checkpoint``, files hashed as written (this version).
* ``save + re-read hash``: ``save`` followed by what the manifest used to cost, re-reading and
  hashing every file from the disk (the version before).
* ``async save, blocking``: what ``train.async_checkpoint`` blocks training for (the copy to
  CPU memory); ``async save, total``: until the checkpoint is complete.
* ``load``: ``load_checkpoint``, the SHA-256 of each 64 MiB block of each ``state/`` file
  checked on this process's share of the cores while DCP reads it (this version).
* ``load, sizes only``: ``load_checkpoint`` without the hashes of ``state/``
  (``TZRUN_CHECKPOINT_VERIFY=size``), which reads through DCP's own reader: ``torch.load``
  copies each value into a fresh allocation before DCP copies it into the state.
* ``verify + load``: every file hashed first, then loaded (the version before: two reads).

Usage::

    python benchmarks/checkpoint_speed.py --dir /path/on/the/disk --size-mb 1024 --rounds 3

``--json OUT`` writes the same medians (seconds, MB/s, x disk, every round's seconds) for
``benchmarks/scaling.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

MB = 1 << 20


def build_state(size_mb: int, seed: int) -> dict[str, Any]:
    """An EmbeddingBagCollection of 26 dim-64 tables holding ``size_mb`` of float32 weights in all."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    dim, tables = 64, 26
    rows = size_mb * MB // (4 * dim * tables)
    torch.manual_seed(seed)
    configs = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
               for i in range(tables)]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    with torch.no_grad():
        for param in ebc.parameters():
            param.uniform_(-0.1, 0.1)
    return {"model": ebc}


def drop_cache(paths: list[Path]) -> None:
    """Drop the (clean) pages of ``paths`` from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_of(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def dd_round(work: Path, size_mb: int) -> tuple[float, float]:
    """Seconds for dd to write ``size_mb`` (fdatasync) and to read them back from the disk."""
    target = work / "dd.bin"
    write = timed(lambda: subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size_mb}",
                                          "conv=fdatasync"], check=True, capture_output=True))
    drop_cache([target])
    read = timed(lambda: subprocess.run(["dd", f"if={target}", "of=/dev/null", "bs=1M"], check=True,
                                        capture_output=True))
    target.unlink()
    return write, read


def checkpoint_round(work: Path, size_mb: int, step: int) -> dict[str, float]:
    """Seconds of each checkpoint operation of one round."""
    from tzrun.runner.async_checkpoint import BackgroundSaves
    from tzrun.runner.checkpoint import checkpoint_dir, load_checkpoint, save_checkpoint, verify_checkpoint
    from tzrun.runner.manifest import describe_files, listed_files

    out: dict[str, float] = {}
    state = build_state(size_mb, step)
    model_dir = work / "run"
    out["save"] = timed(lambda: save_checkpoint(model_dir, step, state=state, meta={"step": step}, rank=0))
    path = checkpoint_dir(model_dir, step)
    drop_cache(files_of(path))
    out["save + re-read hash"] = out["save"] + timed(lambda: describe_files(path, listed_files(path)))
    saves = BackgroundSaves()
    started = time.perf_counter()
    saves.start(model_dir, step + 1, state=state, meta={"step": step + 1}, rank=0)
    out["async save, blocking"] = time.perf_counter() - started
    saves.close()
    out["async save, total"] = time.perf_counter() - started
    target = build_state(size_mb, step + 100)
    drop_cache(files_of(path))
    out["load"] = timed(lambda: load_checkpoint(path, target))
    drop_cache(files_of(path))
    out["load, sizes only"] = timed(lambda: load_checkpoint(path, target, verify_reads=False))
    drop_cache(files_of(path))
    out["verify + load"] = timed(lambda: (verify_checkpoint(path),
                                          load_checkpoint(path, target, verify=False, verify_reads=False)))
    for a, b in zip(state["model"].parameters(), target["model"].parameters()):
        assert torch.equal(a, b), "the loaded weights differ from the saved ones"
    out["bytes"] = sum(f.stat().st_size for f in files_of(path / "state"))
    shutil.rmtree(model_dir)
    return out


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to write (a directory on the disk to measure)")
    parser.add_argument("--size-mb", type=int, default=1024, help="float32 weights in the checkpoint, MB")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results to OUT")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckpt-speed-", dir=args.dir))
    dist.init_process_group("gloo", init_method=f"file://{work / 'pg'}", rank=0, world_size=1)
    try:
        rows: dict[str, list[float]] = {}
        for r in range(args.rounds):
            write, read = dd_round(work, args.size_mb)
            rows.setdefault("dd write", []).append(write)
            rows.setdefault("dd read", []).append(read)
            for name, seconds in checkpoint_round(work, args.size_mb, 10 * (r + 1)).items():
                rows.setdefault(name, []).append(seconds)
    finally:
        dist.destroy_process_group()
        shutil.rmtree(work, ignore_errors=True)
    size = median(rows.pop("bytes")) / MB
    disk = {"write": args.size_mb / median(rows["dd write"]), "read": args.size_mb / median(rows["dd read"])}
    print(f"checkpoint: {size:,.0f} MB in state/; dd: {args.size_mb} MB; {args.rounds} round(s), medians "
          f"(range of MB/s); directory {args.dir}")
    print(f"{'operation':<24}{'seconds':>9}{'MB/s':>9}{'range MB/s':>16}{'x disk':>8}")
    results = {}
    for name, seconds in rows.items():
        mb = args.size_mb if name.startswith("dd") else size
        rates = sorted(mb / s for s in seconds)
        kind = "write" if name.startswith(("dd write", "save", "async")) else "read"
        results[name] = {"seconds": median(seconds), "mb_per_s": mb / median(seconds),
                         "x_disk": mb / median(seconds) / disk[kind], "round_seconds": seconds}
        print(f"{name:<24}{median(seconds):>9.2f}{mb / median(seconds):>9.0f}{f'{rates[0]:.0f}-{rates[-1]:.0f}':>16}"
              f"{mb / median(seconds) / disk[kind]:>8.2f}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"size_mb": args.size_mb, "state_mb": size, "rounds": args.rounds,
                                         "dir": str(args.dir), "operations": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
