"""Checkpoint files: a documented format, a checksum, atomic writes, safe loading.

A checkpoint is one ``torch.save`` file holding only plain values and tensors, so it
loads with ``torch.load(path, weights_only=True)`` and in plain PyTorch (docs/
checkpoints.md lists its keys). It carries a checksum of its content, checked on load:
a file with flipped bytes is reported by name, never loaded silently. Writes go to a
temporary file in the same folder, are flushed and synced, renamed over the target and
followed by a sync of the folder, and get the permissions the user's umask gives.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import torch

__all__ = ["FORMAT", "CheckpointError", "checkpoint_name", "digest", "fsync_dir", "is_finite",
           "list_checkpoints", "newest_valid", "read_checkpoint", "remove_leftovers",
           "write_atomic", "write_checkpoint"]

FORMAT: Final = "schedtrain-checkpoint-2"
_NAME_RE: Final = re.compile(r"step-(\d+)(-nonfinite)?\.pt")
_PLAIN: Final = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                 torch.Tensor, torch.Size)


class CheckpointError(Exception):
    """A checkpoint that cannot be written or used; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"checkpoint {str(path)!r}: {reason}")
        self.path = Path(path)
        self.reason = reason


def checkpoint_name(step: int, *, finite: bool = True) -> str:
    """``step-00000120.pt``, or ``step-00000120-nonfinite.pt`` for non-finite weights or loss."""
    return f"step-{step:08d}{'' if finite else '-nonfinite'}.pt"


def _check_plain(value: Any, where: str) -> None:
    """Refuse what ``torch.load(weights_only=True)`` could not read back, saying where."""
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, dict):  # OrderedDict included
        for k, v in value.items():
            _check_plain(k, where)
            _check_plain(v, f"{where}.{k}")
        return
    if isinstance(value, list | tuple | set):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(f"{where}: {type(value).__name__} {value!r:.60} is not plain data; a "
                    "state_dict holds numbers, strings, lists, dicts and tensors")


def _feed(h: Any, value: Any) -> None:
    """Hash a state tree deterministically: structure, keys, values and tensor bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(b"{")
        for k, v in value.items():
            _feed(h, k)
            _feed(h, v)
        h.update(b"}")
    elif isinstance(value, list | tuple):
        h.update(b"[" if isinstance(value, list) else b"(")
        for v in value:
            _feed(h, v)
        h.update(b"]")
    elif isinstance(value, set):
        h.update(b"<")
        for item in sorted(repr(v) for v in value):
            h.update(item.encode())
        h.update(b">")
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def digest(state: Mapping[str, Any]) -> str:
    """The checksum of a checkpoint's content (every key but ``checksum``)."""
    h = hashlib.blake2b(digest_size=32)
    _feed(h, {k: v for k, v in state.items() if k != "checksum"})
    return h.hexdigest()


def is_finite(model_state: Mapping[str, Any], loss: torch.Tensor | None) -> bool:
    """Whether every floating tensor of the weights, and the loss, is finite."""
    tensors = [t for t in model_state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if loss is not None:
        tensors.append(loss)
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, write: Callable[[Any], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then move it into place.

    A crash at any moment leaves either the old file or the new one, and at most a
    ``.tmp`` file that ``remove_leftovers`` cleans up.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; files get the usual mode
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise
    return path


def write_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` (plain data and tensors) to ``path`` with its format and checksum.

    Raises:
        CheckpointError: something in ``state`` could not be loaded back safely.
    """
    path = Path(path)
    body = {"format": FORMAT, **state}
    try:
        _check_plain(body, "checkpoint")
    except TypeError as exc:
        raise CheckpointError(path, str(exc)) from None
    body["checksum"] = {"algorithm": "blake2b-256", "digest": digest(body)}
    return write_atomic(path, lambda f: torch.save(body, f))


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` and check its format and checksum.

    Raises:
        CheckpointError: the file is missing, unreadable, not a schedtrain checkpoint,
            or its content does not match its checksum (it is corrupt).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "no such file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise CheckpointError(path, f"cannot be read ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0][:200]}); it is corrupt or "
                                    "not a checkpoint") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(path, f"not a {FORMAT} file (found {found!r})")
    saved = state.get("checksum", {}).get("digest")
    if saved != digest(state):
        raise CheckpointError(path, "its content does not match its checksum: it is corrupt")
    return state


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Checkpoint files in ``folder``, newest step first (a finite one first at one step)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m[1]), bool(m[2]), p) for p in folder.iterdir()
             if (m := _NAME_RE.fullmatch(p.name)) is not None]
    return [p for _, _, p in sorted(found, key=lambda x: (-x[0], x[1]))]


def newest_valid(folder: str | Path,
                 skipped: Callable[[Path, str], None] | None = None) -> Path | None:
    """The newest checkpoint in ``folder`` that loads, matches its checksum and is finite.

    Each one passed over is reported to ``skipped(path, reason)``.
    """
    for path in list_checkpoints(folder):
        try:
            state = read_checkpoint(path)
        except CheckpointError as exc:
            if skipped is not None:
                skipped(path, exc.reason)
            continue
        if not state.get("finite", True):
            if skipped is not None:
                skipped(path, "its weights or loss are not finite")
            continue
        return path
    return None


def remove_leftovers(folder: str | Path) -> list[Path]:
    """Delete temporary files that interrupted writes left in ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = [p for p in folder.glob(".*.tmp") if p.is_file()]
    for p in gone:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return gone
