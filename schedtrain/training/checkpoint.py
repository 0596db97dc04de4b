"""Checkpoint files: a documented format, a checksum, atomic writes, safe loading.

A checkpoint is one ``torch.save`` file holding only plain values and tensors, so it
loads with ``torch.load(path, weights_only=True)`` and in plain PyTorch (docs/
checkpoints.md lists its keys). It carries a checksum of its content, checked on load:
a file with flipped bytes is reported by name, never loaded silently. Writes go to a
temporary file in the same folder, are flushed and synced, renamed over the target and
followed by a sync of the folder, and get the permissions the user's umask gives.

A sharded checkpoint (FSDP2, ``training.sharded``) is a directory ``step-NNNNNNNN.dcp``:
the shards ``torch.distributed.checkpoint`` wrote and ``run.pt``, an ordinary checkpoint
without weights whose ``shards`` key holds every shard file's checksum. It is built in a
temporary directory and moved into place the same way (``replace_dir``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import torch

__all__ = ["FORMAT", "STATE_FILE", "CheckpointError", "checkpoint_name", "digest",
           "file_digests", "fsync_dir", "is_finite", "list_checkpoints", "newest_valid",
           "read_checkpoint", "remove_leftovers", "replace_dir",
           "write_atomic", "write_checkpoint"]

FORMAT: Final = "schedtrain-checkpoint-2"
#: The run's state inside a sharded checkpoint directory.
STATE_FILE: Final = "run.pt"
_NAME_RE: Final = re.compile(r"step-(\d+)(-nonfinite)?\.(?:pt|dcp)")
_OLD: Final = ".old.tmp"
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
    """Whether every floating tensor of the weights, and the loss, is finite (of a
    sharded tensor, this rank's shard)."""
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in model_state.values()
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

    Of a sharded checkpoint (a directory) this loads ``run.pt`` and checks every shard
    file against the checksum it records; the weights stay in the shards.

    Raises:
        CheckpointError: the file is missing, unreadable, not a schedtrain checkpoint,
            or its content does not match its checksum (it is corrupt).
    """
    path = Path(path)
    if path.is_dir():
        state = _read_file(path / STATE_FILE, map_location, shown=path)
        _check_shards(path, state)
        return state
    return _read_file(path, map_location, shown=path)


def _read_file(path: Path, map_location: Any, *, shown: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(shown, "no such file" if shown == path
                              else f"no {path.name} in the directory: it is not a checkpoint")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise CheckpointError(shown, f"cannot be read ({type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0][:200]}); it is corrupt or "
                                     "not a checkpoint") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(shown, f"not a {FORMAT} file (found {found!r})")
    saved = state.get("checksum", {}).get("digest")
    if saved != digest(state):
        raise CheckpointError(shown, "its content does not match its checksum: it is corrupt")
    return state


def _check_shards(folder: Path, state: dict[str, Any]) -> None:
    shards = state.get("shards")
    if not isinstance(shards, dict):
        raise CheckpointError(folder, f"its {STATE_FILE} names no shards")
    expected: dict[str, str] = shards["files"]
    found = file_digests(folder, list(expected))
    for name, want in expected.items():
        if found.get(name) != want:
            what = "is missing" if name not in found else "does not match its checksum"
            raise CheckpointError(folder, f"shard {name!r} {what}: it is corrupt")


def file_digests(folder: Path, names: list[str] | None = None) -> dict[str, str]:
    """blake2b-256 of each file in ``folder`` (``names``, or every file but ``run.pt``);
    a missing one is left out."""
    if names is None:
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != STATE_FILE)
    out = {}
    for name in names:
        h = hashlib.blake2b(digest_size=32)
        try:
            with (folder / name).open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except FileNotFoundError:
            continue
        out[name] = h.hexdigest()
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def replace_dir(tmp: Path, path: Path) -> Path:
    """Move the finished directory ``tmp`` to ``path``, replacing what is there.

    A directory cannot be renamed over a full one: the old one is first renamed aside
    (``.NAME.old.tmp``). A crash between the two renames leaves it there, and
    ``remove_leftovers`` puts it back, so a good checkpoint is never lost.
    """
    fsync_dir(tmp)
    old = path.with_name(f".{path.name}{_OLD}")
    _remove(old)
    if path.exists():
        path.replace(old)
    tmp.replace(path)
    fsync_dir(path.parent)
    _remove(old)
    return path


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
    """Delete what interrupted writes left in ``folder`` (temporary files and
    directories), first putting back a checkpoint that ``replace_dir`` had moved aside."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    for old in folder.glob(f".*{_OLD}"):
        target = old.with_name(old.name[1:-len(_OLD)])
        if not target.exists():
            old.replace(target)
    gone = list(folder.glob(".*.tmp"))
    for p in gone:
        _remove(p)
    return gone
