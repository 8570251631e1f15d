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
  only the classes DCP writes there (its metadata dataclasses, its storage record, ``torch.Size``,
  dtypes, layouts, paths, plain containers), and only files inside ``state/``;
* the load planner (:func:`load_planner`) reads values with ``torch.load(weights_only=True)``;
* :func:`load_state` reads the metadata before DCP does, so that a refused file is one
  :class:`~tzrun.errors.CheckpointError` naming it, not an error DCP gathered from every rank.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from tzrun.errors import CheckpointError
from tzrun.io.storage import is_remote, redact_url, storage_options

__all__ = [
    "storage_writer", "storage_reader", "read_metadata", "load_planner", "load_state", "refused_value", "METADATA_CLASSES",
]

#: What ``state/.metadata`` may name, by module: everything DCP (torch 2.13) writes there.
METADATA_CLASSES: Mapping[str, frozenset[str]] = MappingProxyType({
    "torch.distributed.checkpoint.metadata": frozenset({
        "Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
    }),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),  # and dtypes: any attribute of torch that is a torch.dtype
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"dict", "list", "tuple", "set", "frozenset"}),
})
_DATA_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`METADATA_CLASSES` (and torch dtypes)."""

    def find_class(self, module: str, name: str) -> Any:
        if name in METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            import torch

            if isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}")


def _refuse(file: str, why: str) -> CheckpointError:
    return CheckpointError(
        f"{file}: refused: {why}, which a checkpoint written by tzrec-run never holds (a checkpoint is data; loading "
        "never runs code from it). Only load checkpoints from directories you control (tzrec-run help checkpoint-trust)"
    )


def refused_value(name: str, error: pickle.UnpicklingError) -> CheckpointError:
    """The error for a value ``torch.load(weights_only=True)`` refused: one line naming it."""
    text = str(error)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    why = f"it names {found.group(1)}" if found else next(
        (line.strip() for line in text.splitlines() if line.strip()), "it is not plain data")
    return _refuse(name, why)


def read_metadata(file: Any, name: str) -> Any:
    """DCP's ``Metadata`` from an open ``.metadata`` stream, unpickled safely.

    Args:
        file: the open binary stream.
        name: the file's path, for messages.

    Raises:
        CheckpointError: when the file names anything outside :data:`METADATA_CLASSES`, is not
            DCP's metadata, or lists a data file outside its own directory.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(file).load()
    except pickle.UnpicklingError as error:
        raise _refuse(name, str(error) or "it is not DCP's metadata") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as error:
        raise CheckpointError(f"{name}: unreadable as DCP's checkpoint metadata ({type(error).__name__}: {error})") from None
    if not isinstance(metadata, Metadata):
        raise _refuse(name, f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    for info in (metadata.storage_data or {}).values():
        path = getattr(info, "relative_path", None)
        if not isinstance(path, str) or not _DATA_FILE.match(path):
            raise _refuse(name, f"it lists the data file {path!r}, outside its own directory")
    return metadata


def _safe(reader_class: type) -> type:
    """``reader_class`` (DCP's file-system or fsspec reader) with :func:`read_metadata`'s
    safe reading, done once per reader: :func:`load_state` reads first, DCP gets the same."""

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

    SafeReader.__name__ = SafeReader.__qualname__ = f"Safe{reader_class.__name__}"
    return SafeReader


def storage_writer(path: Path) -> Any:
    """DCP's writer of ``path``: the local file system's, or its fsspec storage for a URL
    (torch 2.13 exports ``FsspecWriter`` only from ``torch.distributed.checkpoint._fsspec_filesystem``)."""
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


def storage_reader(path: Path) -> Any:
    """DCP's reader of ``path``, as :func:`storage_writer`, reading ``.metadata`` safely
    (:func:`read_metadata`): ``read_metadata()`` raises a :class:`CheckpointError` for a crafted one."""
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return _safe(FsspecReader)(str(path), **storage_options(path))
    from torch.distributed.checkpoint import FileSystemReader

    return _safe(FileSystemReader)(str(path))


def load_planner(path: Path | None = None) -> Any:
    """DCP's default load planner, reading values with ``torch.load(weights_only=True)`` and
    without its guess at checkpoints written before torch 2.4.

    Loading part of a checkpoint (evaluation loads the model and the update path, not the
    optimizers) leaves keys of the checkpoint unloaded; DCP's planner then re-flattens the
    request the pre-2.4 way, which keeps a :class:`~tzrun.runner.checkpoint.Blob`'s dict whole,
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


def load_state(path: Path, state: dict[str, Any], *, no_dist: bool = False) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` from the ``state/`` directory ``path``,
    safely (collective unless ``no_dist``).

    Raises:
        CheckpointError: for a ``.metadata`` or a value that would run code (naming it), or
            any other error of ours raised while loading (on every rank alike).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = storage_reader(path)
    reader.read_metadata()  # a refused file is named here, before DCP gathers errors from the ranks
    try:
        dcp.load(state, storage_reader=reader, planner=load_planner(path), no_dist=no_dist)
    except CheckpointException as error:
        ours = [exc for exc, _ in error.failures.values() if isinstance(exc, CheckpointError)]
        if ours:
            raise ours[0] from None
        raise
