"""Reading a checkpoint's ``state/.metadata`` without running code from it, and the one-line
error of a refused file or value.

DCP reads ``.metadata`` with ``pickle.load``, which runs whatever code a crafted file names:
:func:`read_metadata` reads it through an unpickler that admits only the classes DCP writes
there (:data:`METADATA_CLASSES`), and only data files inside ``state/``. A value that
``torch.load(weights_only=True)`` refused is named by :func:`refused_value`.
"""

from __future__ import annotations

import pickle
import re
from types import MappingProxyType
from typing import Any, Mapping

from tzrun.errors import CheckpointError

__all__ = ["METADATA_CLASSES", "read_metadata", "refused", "refused_value"]

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


def refused(file: str, why: str) -> CheckpointError:
    """The error for ``file`` (a file or an entry of one) refused because ``why``: one line."""
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
    return refused(name, why)


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
        raise refused(name, str(error) or "it is not DCP's metadata") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as error:
        raise CheckpointError(f"{name}: unreadable as DCP's checkpoint metadata ({type(error).__name__}: {error})") from None
    if not isinstance(metadata, Metadata):
        raise refused(name, f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    for info in (metadata.storage_data or {}).values():
        path = getattr(info, "relative_path", None)
        if not isinstance(path, str) or not _DATA_FILE.match(path):
            raise refused(name, f"it lists the data file {path!r}, outside its own directory")
    return metadata
