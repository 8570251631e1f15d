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

Integrity is computed where the bytes pass anyway: the writer (:func:`storage_writer`) hashes
each file as DCP writes it (:attr:`HashedFiles`, read by the manifest), and a reader given the
manifest's entries reads each file it needs once, whole (a local one mapped, so its pages are
read from the disk once and DCP copies from the page cache), checks its size before DCP gets a
byte of it and its SHA-256 on another thread while DCP reads it (hashing is as slow as the
disk: done first, it halved the load rate). A damaged file is named before the load returns, in
place of whatever torch made of its bytes (``torch.load(weights_only=True)`` runs no code from
them); a load that fails leaves the target state part-loaded, and every caller then stops.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import mmap
import pickle
import re
import threading
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, Callable, Iterator, Mapping, cast

from tzrun.errors import CheckpointError
from tzrun.io.storage import is_remote, redact_url, storage_options

__all__ = [
    "HashedFiles", "storage_writer", "storage_reader", "read_metadata", "load_planner", "load_state", "refused_value", "METADATA_CLASSES",
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

#: What a writer hashed: each file's name (in its directory) to its size and SHA-256 (hex).
HashedFiles = dict[str, tuple[int, str]]


def _name(path: Any) -> str:
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]


class _HashingStream:
    """A write stream that hashes every byte it passes on (DCP only appends: no seeking)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += view.nbytes
        written = self.raw.write(view)
        return view.nbytes if written is None else written

    def seekable(self) -> bool:
        return False

    def seek(self, *args: Any) -> int:
        raise io.UnsupportedOperation("a hashed checkpoint stream is written front to back")

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close
        return getattr(self.raw, name)


class _HashingFileSystem:
    """DCP's file system of a writer, hashing each file it writes into ``hashed``."""

    def __init__(self, fs: Any, hashed: HashedFiles) -> None:
        self._fs = fs
        self._hashed = hashed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with self._fs.create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            hashing = _HashingStream(stream)
            yield hashing
        self._hashed[_name(path)] = (hashing.size, hashing.digest.hexdigest())


def _mapped(stream: Any) -> mmap.mmap | None:
    """A local file's pages, mapped read-only (read from the page cache, no copy in memory of
    ours), or None for a stream that is not a local file or an empty one."""
    try:
        mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    with contextlib.suppress(AttributeError, OSError):
        mapped.madvise(mmap.MADV_WILLNEED)  # the kernel reads ahead the whole file now, not page by page
    return mapped


class _BufferReader(io.RawIOBase):
    """A read-only, seekable stream over bytes in memory (no copy of them)."""

    def __init__(self, data: memoryview) -> None:
        super().__init__()
        self._data = data
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        n = max(0, min(target.nbytes, len(self._data) - self._pos))
        target[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._data)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    @property
    def view(self) -> memoryview:
        """The bytes read, whole (a value is taken from them without a copy)."""
        return self._data

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a slice still held: released when it is freed
            self._data.release()
        super().close()


class _Digest(threading.Thread):
    """SHA-256 of ``data``, computed on a thread of its own (hashlib releases the GIL), so that
    hashing a file overlaps with DCP copying its values out of it."""

    def __init__(self, data: Any) -> None:
        super().__init__(name="tzrun-checkpoint-digest", daemon=True)
        self._data = data
        self.hexdigest = ""
        self.start()

    def run(self) -> None:
        self.hexdigest = hashlib.sha256(self._data).hexdigest()

    def matches(self, expected: str) -> bool:
        """Whether the digest, once computed, is ``expected``."""
        self.join()
        return self.hexdigest == expected


class _VerifyingFileSystem:
    """DCP's file system of a reader: a file the manifest lists is read once, whole; its size
    is checked before DCP gets a byte of it and its SHA-256 while DCP reads it (on another
    thread), and ``damaged(problem)`` is raised for either one that is not the manifest's,
    before the load returns and in place of whatever DCP made of the damaged bytes."""

    def __init__(self, fs: Any, expected: Mapping[str, tuple[int, str]], damaged: Callable[[str, str], Exception]) -> None:
        self._fs = fs
        self._expected = expected
        self._damaged = damaged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        name = _name(path)
        if "r" not in mode or name not in self._expected:
            with self._fs.create_stream(path, mode) as stream:
                yield stream
            return
        size, sha256 = self._expected[name]
        with self._fs.create_stream(path, mode) as stream:
            data = _mapped(stream) or stream.read()
        reader = digest = None
        try:
            if len(data) != size:
                how = "truncated" if len(data) < size else "longer than written"
                raise self._damaged(name, f"{how} ({len(data):,} bytes; {size:,} were written)")
            digest = _Digest(data)
            reader = _BufferReader(memoryview(data))
            try:
                yield reader
            except Exception:
                if not digest.matches(sha256):  # what torch made of damaged bytes is not the news
                    raise self._corrupted(name) from None
                raise
            if not digest.matches(sha256):
                raise self._corrupted(name)
        finally:
            if digest is not None:
                digest.join()  # it reads the mapping: closed only after it
            if reader is not None:
                reader.close()
            if isinstance(data, mmap.mmap):
                with contextlib.suppress(BufferError):  # a view still held (an error's traceback): unmapped when freed
                    data.close()

    def _corrupted(self, name: str) -> Exception:
        return self._damaged(name, "corrupted (its SHA-256 differs from the one written)")


def _tensor_in(data: memoryview, name: str) -> Any:
    """The tensor DCP saved (``torch.save``) in ``data``, as a view of those bytes: what
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
        zip_file = torch._C.PyTorchFileReader(cast(IO[bytes], _BufferReader(memoryview(data))))
        return _load(zip_file, "cpu", _weights_only_unpickler, overall_storage=storage,  # type: ignore[no-untyped-call]
                     encoding="utf-8")
    except pickle.UnpicklingError as error:
        raise refused_value(name, error) from None


def _read_verified(reader: Any, plan: Any, planner: Any) -> Any:
    """DCP's ``FileSystemReader.read_data`` for files read whole by :class:`_VerifyingFileSystem`:
    values are taken from the verified bytes in place (:func:`_tensor_in`)."""
    from torch.futures import Future

    per_file: dict[str, list[Any]] = {}
    for item in plan.items:
        per_file.setdefault(reader.storage_data[item.storage_index].relative_path, []).append(item)
    for relative_path, items in per_file.items():
        with reader.fs.create_stream(reader.fs.concat_path(reader.path, relative_path), "rb") as stream:
            for item in items:
                _load_item(stream.view, reader.storage_data[item.storage_index], item, planner, relative_path)
    done: Any = Future()
    done.set_result(None)
    return done


def _load_item(view: memoryview, info: Any, item: Any, planner: Any, relative_path: str) -> None:
    """One entry of a ``state/`` file into the loaded state, as DCP's reader does. The views of
    the file's bytes die with the call; one an error's traceback still holds keeps the file
    mapped (its slice of ``view`` is never released early), so it never points at unmapped pages."""
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint.planner import LoadItemType

    entry = f"{relative_path} entry '{item.dest_index.fqn}'"
    if info.transform_descriptors:
        raise _refuse(entry, f"it is stored transformed ({', '.join(map(str, info.transform_descriptors))})")
    data = view[info.offset:info.offset + info.length]  # the tensor holds it, and it the mapping
    if item.type == LoadItemType.BYTE_IO:
        planner.load_bytes(item, io.BytesIO(data.tobytes()))
        return
    tensor = narrow_tensor_by_index(_tensor_in(data, entry), item.storage_offsets, item.lengths)
    target = planner.resolve_tensor(item).detach()
    if target.size() != tensor.size():
        raise CheckpointError(f"{entry}: holds {tuple(tensor.size())} where {tuple(target.size())} is loaded")
    target.copy_(tensor)
    planner.commit_tensor(item, target)


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
            if isinstance(self.fs, _VerifyingFileSystem):
                return _read_verified(self, plan, planner)
            return super().read_data(plan, planner)

    SafeReader.__name__ = SafeReader.__qualname__ = f"Safe{reader_class.__name__}"
    return SafeReader


def storage_writer(path: Path) -> Any:
    """DCP's writer of ``path``: the local file system's, or its fsspec storage for a URL
    (torch 2.13 exports ``FsspecWriter`` only from ``torch.distributed.checkpoint._fsspec_filesystem``).

    Its ``hashed`` (:data:`HashedFiles`) fills with the size and SHA-256 of each file it writes,
    computed from the bytes as they are written."""
    writer = _plain_writer(path)
    writer.hashed = {}
    writer.fs = _HashingFileSystem(writer.fs, writer.hashed)
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


def storage_reader(path: Path, expected: Mapping[str, tuple[int, str]] | None = None,
                   damaged: Callable[[str, str], Exception] | None = None) -> Any:
    """DCP's reader of ``path``, as :func:`storage_writer`, reading ``.metadata`` safely
    (:func:`read_metadata`): ``read_metadata()`` raises a :class:`CheckpointError` for a crafted one.

    Args:
        path: the ``state/`` directory.
        expected: size and SHA-256 of its files by name (from the manifest): each file read is
            checked whole: its size before DCP gets a byte of it, its SHA-256 while DCP reads it.
        damaged: builds the error for a file that fails the check, from its name and the problem.
    """
    if is_remote(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        reader = _safe(FsspecReader)(str(path), **storage_options(path))
    else:
        from torch.distributed.checkpoint import FileSystemReader

        reader = _safe(FileSystemReader)(str(path))
    if expected is not None:
        reader.fs = _VerifyingFileSystem(reader.fs, expected, damaged or (lambda name, why: CheckpointError(f"{path}/{name}: {why}")))
    return reader


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


def load_state(path: Path, state: dict[str, Any], *, no_dist: bool = False,
               expected: Mapping[str, tuple[int, str]] | None = None,
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
