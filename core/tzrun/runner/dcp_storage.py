"""Where torch.distributed.checkpoint writes and reads a checkpoint's ``state/``, and how it is
read without running code from it.

A local path is written and read through DCP's file-system storage, a URL (``s3://``,
``gs://``, ``abfs://``, ``hdfs://``) through its fsspec storage. The fsspec storage renames
only DCP's own ``.metadata`` file (a copy on an object store); nothing of tzrec-run's atomicity
relies on it (see :mod:`tzrun.runner.checkpoint`).

A checkpoint is data. DCP itself reads ``.metadata`` with ``pickle.load`` and every value that
is not a tensor with ``torch.load(weights_only=False)``, either of which runs whatever code a
crafted file names. Here:

* the readers (:func:`storage_reader`) read ``.metadata`` through an unpickler that admits
  only the classes DCP writes there, and only files inside ``state/``
  (:func:`tzrun.runner.dcp_metadata.read_metadata`);
* the load planner (:func:`load_planner`) reads values with ``torch.load(weights_only=True)``;
* :func:`load_state` reads the metadata before DCP does, so that a refused file is one
  :class:`~tzrun.errors.CheckpointError` naming it, not an error DCP gathered from every rank.

Integrity is computed where the bytes pass anyway (:mod:`tzrun.runner.dcp_integrity`): the
writer (:func:`storage_writer`) hashes each file as DCP writes it, and a reader given the
manifest's entries checks each file it needs as DCP reads it, taking the values from the
verified bytes in place. A load that fails leaves the target state part-loaded, and every
caller then stops.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import IO, Any, Callable, Mapping, cast

from tzrun.errors import CheckpointError
from tzrun.io.storage import is_remote, redact_url, storage_options
from tzrun.runner.dcp_integrity import BufferReader, HashingFileSystem, VerifyingFileSystem
from tzrun.runner.dcp_metadata import read_metadata, refused, refused_value
from tzrun.runner.manifest import BLOCK_SIZE, FileEntry

__all__ = ["storage_writer", "save_planner", "storage_reader", "load_planner", "load_state"]


def _tensor_in(data: memoryview, name: str) -> tuple[Any, int]:
    """The tensor DCP saved (``torch.save``) in ``data``, as a view of those bytes (and the
    address of ``data``'s first byte, where the tensor's are found from): what
    ``torch.load(weights_only=True)`` reads, without copying the values into a fresh allocation
    (DCP copies them into the loaded state next; a copy more, into pages never touched before,
    cost as much as reading the file). torch 2.13's ``torch.load`` maps only a whole file, so
    this calls the loader it uses for one (``torch.serialization._load`` with the bytes as its
    ``overall_storage``)."""
    import warnings

    import torch
    from torch.serialization import _load, _weights_only_unpickler  # type: ignore[attr-defined]

    with warnings.catch_warnings():  # read-only bytes: the view is only read (copied from)
        warnings.simplefilter("ignore", UserWarning)
        storage = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
    try:
        zip_file = torch._C.PyTorchFileReader(cast(IO[bytes], BufferReader(memoryview(data))))
        return _load(zip_file, "cpu", _weights_only_unpickler, overall_storage=storage,  # type: ignore[no-untyped-call]
                     encoding="utf-8"), storage.data_ptr()
    except pickle.UnpicklingError as error:
        raise refused_value(name, error) from None


def _read_verified(reader: Any, plan: Any, planner: Any) -> Any:
    """DCP's ``FileSystemReader.read_data`` for files read whole by :class:`VerifyingFileSystem`:
    values are taken from the verified bytes in place (:func:`_tensor_in`)."""
    from torch.futures import Future

    per_file: dict[str, list[Any]] = {}
    for item in plan.items:
        per_file.setdefault(reader.storage_data[item.storage_index].relative_path, []).append(item)
    for relative_path, items in per_file.items():
        with reader.fs.create_stream(reader.fs.concat_path(reader.path, relative_path), "rb") as stream:
            for item in items:
                _load_item(stream.view, reader.storage_data[item.storage_index], item, planner, relative_path,
                           stream.release)
    done: Any = Future()
    done.set_result(None)
    return done


def _load_item(view: memoryview, info: Any, item: Any, planner: Any, relative_path: str,
               release: Callable[[int, int], None]) -> None:
    """One entry of a ``state/`` file into the loaded state, as DCP's reader does, letting go
    of the file's pages as they are copied (``release(start, end)``, offsets in the file;
    :func:`~tzrun.runner.manifest.release_pages`). The views of the file's bytes die with
    the call; one an error's traceback still holds keeps the file mapped (its slice of ``view``
    is never released early), so it never points at unmapped pages."""
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint.planner import LoadItemType

    entry = f"{relative_path} entry '{item.dest_index.fqn}'"
    if info.transform_descriptors:
        raise refused(entry, f"it is stored transformed ({', '.join(map(str, info.transform_descriptors))})")
    data = view[info.offset:info.offset + info.length]  # the tensor holds it, and it the mapping
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data.tobytes()))
        return
    loaded, first = _tensor_in(data, entry)
    tensor = narrow_tensor_by_index(loaded, item.storage_offsets, item.lengths)
    target = planner.resolve_tensor(item).detach()
    if target.size() != tensor.size():
        raise CheckpointError(f"{entry}: holds {tuple(tensor.size())} where {tuple(target.size())} is loaded")
    _copy_releasing(target, tensor, lambda start, end: release(info.offset + start - first, info.offset + end - first))
    release(info.offset, info.offset + info.length)
    planner.commit_tensor(item, target)


def _copy_releasing(target: Any, tensor: Any, release: Callable[[int, int], None]) -> None:
    """``target.copy_(tensor)``, a contiguous ``tensor`` in pieces of about
    :data:`~tzrun.runner.manifest.BLOCK_SIZE` bytes, each piece's source bytes released (by
    address) once copied."""
    if not tensor.is_contiguous() or tensor.dim() == 0 or tensor.nbytes <= BLOCK_SIZE:
        target.copy_(tensor)
        return
    rows = max(1, BLOCK_SIZE // max(1, tensor[0].nbytes))
    for start in range(0, tensor.shape[0], rows):
        piece = tensor[start:start + rows]
        target[start:start + rows].copy_(piece)
        release(piece.data_ptr(), piece.data_ptr() + piece.nbytes)


def _safe(reader_class: type) -> type:
    """``reader_class`` (DCP's file-system or fsspec reader) with :func:`read_metadata`'s
    safe reading, done once per reader: :func:`load_state` reads first, DCP gets the same;
    and, given the manifest's hashes, :func:`_read_verified`'s reading."""

    class SafeReader(reader_class):  # type: ignore[misc, valid-type]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            rank = kwargs.get("rank")
            cached = getattr(self, "_tzrun_metadata", {})
            if rank not in cached:
                path = self._get_metadata_path(rank)
                with self.fs.create_stream(path, "rb") as stream:
                    cached[rank] = read_metadata(stream, str(path))
                self._tzrun_metadata = cached
            metadata = cached[rank]
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            if isinstance(self.fs, VerifyingFileSystem):
                return _read_verified(self, plan, planner)
            return super().read_data(plan, planner)

    SafeReader.__name__ = SafeReader.__qualname__ = f"Safe{reader_class.__name__}"
    return SafeReader


def storage_writer(path: Path) -> Any:
    """DCP's writer of ``path``: the local file system's, or its fsspec storage for a URL
    (torch 2.13 exports ``FsspecWriter`` only from ``torch.distributed.checkpoint._fsspec_filesystem``).

    Its ``hashed`` (:data:`~tzrun.runner.dcp_integrity.HashedFiles`) fills with the size and SHA-256 of each file it writes,
    computed from the bytes as they are written."""
    writer = _plain_writer(path)
    writer.hashed = {}
    writer.fs = HashingFileSystem(writer.fs, writer.hashed)
    return writer


def _plain_writer(path: Path) -> Any:
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        class RedactingFsspecWriter(FsspecWriter):
            """DCP's fsspec writer, recording the checkpoint's URL in ``.metadata`` without its password."""

            def storage_meta(self) -> Any:
                meta = super().storage_meta()
                if meta is not None and meta.checkpoint_id is not None:
                    meta.checkpoint_id = redact_url(meta.checkpoint_id)
                return meta

        return RedactingFsspecWriter(str(path), **storage_options(path))
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(str(path))


def save_planner() -> Any:
    """DCP's default save planner, handing DCP's writer each tensor without a copy of it.

    The writer clones a tensor whose storage is larger than the tensor (so that ``torch.save``
    writes its bytes alone, not the whole storage). That is every embedding table: FBGEMM keeps
    a rank's tables in one buffer (and their optimizer state in another), and each table's
    weights are a view into it, so a save held a second copy of each table while writing it,
    the largest one included. Here a contiguous CPU view goes to the writer as a tensor over
    the same memory whose storage is exactly its bytes (:func:`own_storage`): ``torch.save``
    writes the same bytes, and nothing is copied. Anything else is left to DCP as before."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class InPlaceSavePlanner(DefaultSavePlanner):
        def resolve_data(self, write_item: Any) -> Any:
            data = super().resolve_data(write_item)
            return own_storage(data) if isinstance(data, torch.Tensor) else data

    return InPlaceSavePlanner()


def own_storage(tensor: Any) -> Any:
    """``tensor`` (detached) as a tensor over the same memory with a storage of exactly its
    bytes: numpy's view of those bytes, wrapped by ``torch.from_numpy`` (which keeps the array,
    and the array the tensor, alive), viewed back as its dtype and shape. A tensor that already
    is its storage, or is not a contiguous CPU tensor, comes back detached and unchanged."""
    import torch

    tensor = tensor.detach()
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.untyped_storage().nbytes() == tensor.nbytes:
        return tensor
    if tensor.numel() == 0:
        return tensor.clone()
    as_bytes = torch.from_numpy(tensor.reshape(-1).view(torch.uint8).numpy())
    return as_bytes.view(tensor.dtype).view(tensor.shape)


def storage_reader(path: Path, expected: Mapping[str, FileEntry] | None = None,
                   damaged: Callable[[str, str], Exception] | None = None) -> Any:
    """DCP's reader of ``path``, as :func:`storage_writer`, reading ``.metadata`` safely
    (:func:`read_metadata`): ``read_metadata()`` raises a :class:`CheckpointError` for a crafted one.

    Args:
        path: the ``state/`` directory.
        expected: the manifest's entry of its files by name (size and block hashes): each file read is
            checked whole: its size before DCP gets a byte of it, its blocks' SHA-256 while DCP reads it.
        damaged: builds the error for a file that fails the check, from its name and the problem.
    """
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        reader = _safe(FsspecReader)(str(path), **storage_options(path))
    else:
        from torch.distributed.checkpoint import FileSystemReader

        reader = _safe(FileSystemReader)(str(path))
    if expected is not None:
        reader.fs = VerifyingFileSystem(reader.fs, expected, damaged or (lambda name, why: CheckpointError(f"{path}/{name}: {why}")))
    return reader


def load_planner(path: Path | None = None) -> Any:
    """DCP's default load planner, reading values with ``torch.load(weights_only=True)`` and
    without its guess at checkpoints written before torch 2.4.

    Loading part of a checkpoint (evaluation loads the model and the update path, not the
    optimizers) leaves keys of the checkpoint unloaded; DCP's planner then re-flattens the
    request the pre-2.4 way, which keeps a :class:`~tzrun.runner.checkpoint_blobs.Blob`'s dict whole,
    and on 2 ranks reported "Missing key in checkpoint state_dict: update" for a key the
    checkpoint holds. tzrec-run's checkpoints are all written by torch >= 2.13.

    Args:
        path: the ``state/`` directory, for messages.
    """
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, create_default_local_load_plan

    where = str(path) if path is not None else "state/"

    class CurrentFormatLoadPlanner(DefaultLoadPlanner):
        def create_local_plan(self) -> Any:
            assert self.metadata is not None
            return create_default_local_load_plan(self.state_dict, self.metadata, not self.allow_partial_load)

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as error:
                raise refused_value(f"{where} entry '{fqn}'", error) from None
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element

                set_element(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[fqn] = loaded

    return CurrentFormatLoadPlanner()


def load_state(path: Path, state: dict[str, Any], *, no_dist: bool = False,
               expected: Mapping[str, FileEntry] | None = None,
               damaged: Callable[[str, str], Exception] | None = None) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` from the ``state/`` directory ``path``,
    safely (collective unless ``no_dist``); ``expected`` and ``damaged`` as :func:`storage_reader`.

    Raises:
        CheckpointError: for a ``.metadata`` or a value that would run code (naming it), or
            any other error of ours raised while loading (on every rank alike).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = storage_reader(path, expected, damaged)
    reader.read_metadata()  # a refused file is named here, before DCP gathers errors from the ranks
    try:
        dcp.load(state, storage_reader=reader, planner=load_planner(path), no_dist=no_dist)
    except CheckpointException as error:
        ours = [exc for exc, _ in error.failures.values() if isinstance(exc, CheckpointError)]
        if ours:
            raise ours[0] from None
        raise
