"""The checkpoint files' layout on disk: their names, atomic writes, listing, removal.

Writes go through ``schedtrain.files.write_atomic``: a temporary file in the same
folder, flushed, synced and renamed over the target (a link planted there is
replaced, never written through). A directory (a sharded checkpoint) is built aside and
moved into place (``replace_dir``); one being removed is renamed to a temporary name first, so a
half-deleted directory is never taken for a checkpoint. What an interrupted write leaves
behind is cleaned up by ``remove_leftovers`` when a run opens the folder.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from schedtrain.files import fsync_dir, write_atomic

__all__ = [
    "NAME_RE",
    "checkpoint_name",
    "clear_folders",
    "fresh_dir",
    "fsync_dir",
    "list_checkpoints",
    "plain_name",
    "remove",
    "remove_leftovers",
    "replace_dir",
    "run_folders",
    "write_atomic",
]

#: A checkpoint's name: one file (``.pt``) or a sharded one's directory (``.dcp``).
NAME_RE: Final = re.compile(r"step-(\d+)(-nonfinite)?\.(?:pt|dcp)")
_OLD: Final = ".old.tmp"


def run_folders(keys: Iterable[str], run_dir: Path | None) -> set[Path]:
    """The folders inside ``run_dir`` (below it, never it) that the run's ``written``
    keys lie in: a resumed process, which holds the run directory, prunes there before
    its first write. A key outside it (absolute, or leading out) names none."""
    if run_dir is None:
        return set()
    root = run_dir.resolve()
    folders = {(root / key).resolve().parent for key in keys if not Path(key).is_absolute()}
    return {f for f in folders if root in f.parents}


def plain_name(name: object, what: str) -> str:
    """``name`` if it is one file name (no folder, no ``..``, no NUL, at most 255 bytes):
    a name read from a spec or a checkpoint never reaches outside its folder.

    Raises:
        ValueError: it is not, saying why.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a file name, got {name!r}")
    shown = f"{name[:60]!r}{'...' if len(name) > 60 else ''}"
    if "\x00" in name:
        raise ValueError(f"{what} {shown} holds a NUL byte")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"{what} {shown} must be a file name in its folder, without a "
                         "folder part or '..'")
    if len(name.encode()) > 255:
        raise ValueError(f"{what} {shown} is longer than a file name may be (255 bytes)")
    return name


def checkpoint_name(step: int, *, finite: bool = True) -> str:
    """``step-00000120.pt``, or ``step-00000120-nonfinite.pt`` for non-finite weights or loss."""
    return f"step-{step:08d}{'' if finite else '-nonfinite'}.pt"


def remove(path: Path) -> None:
    """Delete a checkpoint file, or a directory (renamed aside first); a missing one is
    no error."""
    with contextlib.suppress(FileNotFoundError):
        if not path.is_dir() or path.is_symlink():
            path.unlink()
            return
        gone = path.with_name(f".{path.name}.del.tmp")
        path.replace(gone)
        shutil.rmtree(gone, ignore_errors=True)


def replace_dir(tmp: Path, path: Path) -> Path:
    """Move the finished directory ``tmp`` to ``path``, replacing what is there.

    A directory cannot be renamed over a full one: the old one is first renamed aside
    (``.NAME.old.tmp``). A crash between the two renames leaves it there, and
    ``remove_leftovers`` puts it back, so a good checkpoint is never lost.
    """
    fsync_dir(tmp)
    old = path.with_name(f".{path.name}{_OLD}")
    _discard(old)
    if path.exists():
        path.replace(old)
    tmp.replace(path)
    fsync_dir(path.parent)
    _discard(old)
    return path


def _discard(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def fresh_dir(path: Path) -> None:
    """An empty directory at ``path`` (what was there removed)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Checkpoint files in ``folder``, newest step first (a finite one first at one step)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m[1]), bool(m[2]), p) for p in folder.iterdir()
             if (m := NAME_RE.fullmatch(p.name)) is not None]
    return [p for _, _, p in sorted(found, key=lambda x: (-x[0], x[1]))]


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
        _discard(p)
    return gone


def clear_folders(*folders: Path) -> None:
    """Remove ``folders`` and everything in them (``--overwrite``); a link in a folder's
    place is removed, never what it points at."""
    for folder in folders:
        if folder.is_symlink():
            folder.unlink()
        else:
            shutil.rmtree(folder, ignore_errors=True)
