"""Files schedtrain writes and reads, never through a link planted in their place.

Every file schedtrain writes is either replaced whole (``write_atomic``: a temporary
file beside it, opened with ``O_EXCL | O_NOFOLLOW``, renamed over the target, so a
symbolic link there is replaced, never written through) or opened in place
(``open_in_place``: ``O_NOFOLLOW`` and a regular file only, so ``events.jsonl`` and the
lock are refused when a link or a FIFO sits there). ``inside`` refuses a folder of a run
directory that leads out of it. ``read_regular`` reads a file a person edits without ever
blocking on a FIFO or reading ``/dev/zero`` forever.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

from schedtrain.errors import RunDirError

__all__ = ["UnsafeFile", "fsync_dir", "inside", "open_in_place", "open_regular",
           "read_regular", "write_atomic"]

_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)


class UnsafeFile(RunDirError):
    """A file or folder schedtrain would use is a symbolic link, not a regular file, or
    leads out of its run directory.

    Attributes:
        path: the path at fault.
    """

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"{str(path)!r} {message}")
        self.path = path


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


def _kind(path: Path, mode: int | None = None) -> str:
    """What sits at ``path`` (or what ``mode`` says an open file is), in words."""
    if mode is None:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return "missing"
        if stat.S_ISLNK(mode):
            return f"a symbolic link (to {str(path.readlink())!r})"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def write_atomic(path: Path, write: Callable[[Any], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over
    ``path``: a link there is replaced, never written through.

    A crash at any moment leaves either the old file or the new one, and at most a
    ``.tmp`` file (``remove_leftovers`` in ``checkpoints.files`` cleans it up).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp opens with O_CREAT | O_EXCL | O_NOFOLLOW: never an existing file or link.
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


def open_in_place(path: Path, mode: str = "a") -> IO[str]:
    """Open the regular file ``path`` for appending (``"a"``) or reading and writing
    (``"r+"``), creating it; never through a symbolic link.

    Raises:
        UnsafeFile: ``path`` is a link, a FIFO, a directory or another non-regular file.
    """
    flags = os.O_CREAT | _NOFOLLOW | _NONBLOCK | (
        os.O_WRONLY | os.O_APPEND if mode == "a" else os.O_RDWR)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise UnsafeFile(path, f"is {_kind(path)}: schedtrain writes only regular "
                             "files it owns there; remove it") from None
        raise OSError(exc.errno, f"cannot open {str(path)!r}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeFile(path, f"is {_kind(path)}: schedtrain writes only regular files it "
                         "owns there; remove it")
    os.set_blocking(fd, True)  # O_NONBLOCK only kept a FIFO from blocking the open
    return os.fdopen(fd, mode, encoding="utf-8")


def open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading in binary, a regular file only (a link to one is
    followed); opening never blocks, so a FIFO planted there cannot hang a run.

    Raises:
        UnsafeFile: it is not a regular file.
        OSError: it cannot be opened (``FileNotFoundError`` when missing).
    """
    fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeFile(path, f"is {_kind(path, mode)}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: Path, limit: int) -> bytes:
    """The content of the regular file ``path`` (a link to one is followed), at most
    ``limit`` bytes; opening never blocks.

    Raises:
        UnsafeFile: it is not a regular file (a FIFO, a device, a directory), or it is
            longer than ``limit`` bytes.
        OSError: it cannot be read (``FileNotFoundError`` when missing).
    """
    fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(path, f"is {_kind(path, mode)}, not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnsafeFile(path, f"is longer than {limit:,} bytes")
    return data


def inside(folder: Path, root: Path) -> Path:
    """``folder``, checked to stay inside ``root`` wherever links in it lead.

    Raises:
        UnsafeFile: ``folder`` (or a link on its way) leads out of ``root``.
    """
    real, top = os.path.realpath(folder), os.path.realpath(root)
    if real != top and not real.startswith(top.rstrip(os.sep) + os.sep):
        raise UnsafeFile(folder, f"leads out of the run directory (to {real!r}); a run "
                         "writes only inside its directory: remove the link")
    return folder
