"""Host snapshots of a checkpoint's state: what the loop blocks for in an async save.

``snapshot`` copies every tensor of a state tree to host memory (pinned where CUDA is
there), so training may change the live state at once while a background thread writes
the copy. ``Staging`` keeps the copy's buffers for the next save (``"reuse"``, the
default): the copy is then into memory already there, without allocating, zeroing or
pinning 1x the state again at every save (docs/performance.md: a 1.2 GB copy into kept
buffers took 0.1 s where a fresh one took 0.4-1.8 s). The price is that memory, held
between saves; ``"fresh"`` frees it after each write. ``trim`` makes the bytes of a
state independent of what an allocator left beside its tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from schedtrain.spec.run import STAGING

__all__ = ["STAGING", "Staging", "snapshot", "trim"]


_Key = tuple[str, int]  # a storage: its device and address


class Staging:
    """Where the snapshots of one run are copied.

    Args:
        mode: ``"reuse"``: each snapshot's buffers are kept and the next one is copied
            into them (a storage whose size changed gets a new one); ``"fresh"``: new
            host memory at every snapshot, freed once the write drops it.
    """

    def __init__(self, mode: str = "reuse") -> None:
        if mode not in STAGING:
            raise ValueError(f"`checkpoint_staging` must be one of {STAGING}, got {mode!r}")
        self.mode = mode
        self._kept: dict[_Key, torch.UntypedStorage] = {}

    def snapshot(self, tree: Any, *, free: bool) -> Any:
        """``snapshot(tree)``; ``free``: no write reads the kept buffers any more (the
        former save is collected), so they may be copied into."""
        used: dict[_Key, torch.UntypedStorage] = {}
        copy = snapshot(tree, self._kept if free else None, used)
        self._kept = used if self.mode == "reuse" else {}
        return copy

    @property
    def held_bytes(self) -> int:
        """Host memory kept between saves for the next snapshot."""
        return sum(s.nbytes() for s in self._kept.values())


def snapshot(tree: Any, kept: Mapping[_Key, torch.UntypedStorage] | None = None,
             used: dict[_Key, torch.UntypedStorage] | None = None) -> Any:
    """A deep copy of a state tree whose tensors are host copies.

    Tensors sharing a storage share the copied one (views, tied weights), so the copy
    serialises to the same bytes as the original; containers are copied, other values
    (numbers, strings) are immutable and kept; a ``state_dict``'s ``_metadata`` is copied.
    A storage is copied into its buffer in ``kept`` (of a former snapshot) where one of
    its size is there; ``used`` gets the host storages of this copy.
    """
    storages: dict[_Key, torch.UntypedStorage] = {} if used is None else used
    buffers = kept or {}

    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _host_tensor(value, storages, buffers)
        if type(value) is dict:
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, dict):  # an OrderedDict state_dict: its ``_metadata`` too
            out = type(value)()
            for k, v in value.items():
                out[k] = copy(v)
            out.__dict__.update(copy(vars(value)))
            return out
        if isinstance(value, list):
            return [copy(v) for v in value]
        if isinstance(value, tuple):
            return tuple(copy(v) for v in value)
        if isinstance(value, set):
            return set(value)
        return value

    return copy(tree)


def _tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from _tensors(v)


def trim(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with each tensor that alone uses a larger storage (a scalar loss in an
    allocator's block) replaced by a compact copy; containers are new (the run's live
    state dicts are never changed), other tensors are the same objects.

    ``torch.save`` writes whole storages: the bytes outside the tensor are whatever
    memory held, so without this two runs computing the same values could write
    different files.
    """
    users: dict[int, int] = {}
    for t in _tensors(tree):
        if type(t) is torch.Tensor:
            key = t.untyped_storage().data_ptr()
            users[key] = users.get(key, 0) + 1

    def fix(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if (type(value) is torch.Tensor
                    and value.untyped_storage().nbytes() > value.nbytes
                    and users[value.untyped_storage().data_ptr()] == 1):
                return value.clone()
            return value
        if type(value) is dict:
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, dict):  # an OrderedDict state_dict, with its _metadata
            out = type(value)()
            for k, v in value.items():
                out[k] = fix(v)
            out.__dict__.update(vars(value))
            return out
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, tuple):
            return tuple(fix(v) for v in value)
        return value

    fixed: dict[str, Any] = fix(tree)
    return fixed


def _host_tensor(t: torch.Tensor, storages: dict[_Key, torch.UntypedStorage],
                 kept: Mapping[_Key, torch.UntypedStorage]) -> torch.Tensor:
    if type(t) is not torch.Tensor:  # a subclass (DTensor...): its own copy
        return t.detach().clone()
    source = t.untyped_storage()
    key = (str(t.device), source.data_ptr())
    host = storages.get(key)
    if host is None and (reuse := kept.get(key)) is not None and (
            reuse.nbytes() == source.nbytes()):
        host = storages[key] = reuse.copy_(source)
    elif host is None:
        if t.device.type == "cpu":
            host = source.clone()  # type: ignore[no-untyped-call]
        else:  # pinned host memory: the copy from the device is as fast as it gets
            buffer = torch.empty(source.nbytes(), dtype=torch.uint8, pin_memory=True)
            host = buffer.untyped_storage()
            host.copy_(source)
        storages[key] = host
    out = torch.empty(0, dtype=t.dtype)
    out.set_(host, t.storage_offset(), t.size(), t.stride())
    return out
