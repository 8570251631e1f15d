"""The entries of a checkpoint that are not sharded tensors (the loop position, schedules, the
update path, train metrics, stage states, RNG states): what such an entry may hold
(:func:`unsaveable`: what ``torch.load(weights_only=True)`` reads back without running code),
and the ``Stateful`` that saves and loads one (:class:`Blob`).
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Callable, Mapping

from tzrun.runner.dcp_metadata import refused_value

__all__ = ["Blob", "unsaveable", "named_state"]


#: What :func:`unsaveable` admits as a leaf, by exact type (a subclass, numpy's scalars among
#: them, is not loadable with ``torch.load(weights_only=True)``).
_LEAVES = (int, float, bool, str, bytes, type(None))


def unsaveable(value: Any, where: str = "state") -> str | None:
    """What in ``value`` a checkpoint cannot hold, or None when it can all be saved.

    A checkpoint entry that is not a sharded tensor (the loop position, schedules, update path,
    train metrics, stage states, RNG states) may hold tensors, numbers, strings, bytes, bools,
    None, ``torch.Size`` and dtypes, and lists, tuples and dicts of those (keys: numbers,
    strings, bools, None): what ``torch.load(weights_only=True)`` reads back without running
    code. No other class: not a numpy array or scalar, a dataclass, a function.

    Args:
        value: the state.
        where: how to name ``value`` in the answer.

    Returns:
        ``"a numpy.float64 at state['best']"`` for the first thing found, or None.
    """
    import torch

    kind = type(value)
    if kind in _LEAVES or kind in (torch.Tensor, torch.nn.Parameter, torch.Size, torch.dtype):
        return None
    if kind in (list, tuple):
        items = enumerate(value)
    elif kind is dict:
        for key in value:
            if type(key) not in _LEAVES:
                return f"a {_type_name(key)} key in {where}"
        items = value.items()  # type: ignore[assignment]
    else:
        return f"a {_type_name(value)} at {where}"
    for key, item in items:
        found = unsaveable(item, f"{where}[{key!r}]")
        if found:
            return found
    return None


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


class Blob:
    """A ``Stateful`` for state that is not tensors to shard (loop position, schedules, stage
    states, RNG states): DCP stores what ``get()`` returns as one value (``torch.save`` of what
    :func:`unsaveable` admits) under the key it is given, and hands it to ``put`` on load, read
    with ``torch.load(weights_only=True)``.

    Args:
        get: returns the state to save.
        put: receives the saved state on load.
        name: the entry, for messages (:func:`save_checkpoint` and :func:`load_checkpoint`
            name it by its key, and its checkpoint).
    """

    def __init__(self, get: Callable[[], Any], put: Callable[[Any], None], name: str = "state") -> None:
        self.get = get
        self.put = put
        self.name = name

    def state_dict(self) -> dict[str, Any]:
        import torch

        value = self.get()
        found = unsaveable(value, self.name)
        if found:
            raise TypeError(f"checkpoint entry '{self.name}' cannot be saved: it holds {found} (see tzrun.runner."
                            "checkpoint_blobs.unsaveable for what an entry may hold)")
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return {"value": buffer.getvalue()}

    def named(self, name: str) -> Blob:
        """The same entry, named ``name`` in messages."""
        return Blob(self.get, self.put, name)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        import torch

        try:
            value = torch.load(io.BytesIO(state["value"]), weights_only=True)
        except pickle.UnpicklingError as error:
            raise refused_value(self.name, error) from None
        self.put(value)


def named_state(state: Mapping[str, Any], label: Callable[[str], str] = str) -> dict[str, Any]:
    """``state`` with each :class:`Blob` named ``label(key)`` in messages."""
    return {key: value.named(label(key)) if isinstance(value, Blob) else value for key, value in state.items()}
