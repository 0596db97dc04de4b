"""Which checkpoint files are this run's: each one's identity, recorded when it was written.

A checkpoint's ``run.written`` lists the files the run wrote, and pruning deletes among
them; but a checkpoint is a file anyone can craft, so a name alone proves nothing. Each
file this run commits gets its identity, its size and the blake2b-256 digest of its
bytes (a local file read back once by the writing thread; in a bucket, hashed on the
way, as its manifest says), kept in the run
state (``run.owned``) of every later checkpoint. A file counts as the run's, to list or
to delete, only while its identity is the recorded one: another run's checkpoint or a
user's file of the same name is left alone, whatever a ``written`` list says.

Hashing a large file is costly, so a local file whose size, inode and modification time
are those this process saw when it wrote or last verified it is taken as unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from schedtrain.checkpoints.format import STATE_FILE
from schedtrain.files import UnsafeFile, open_regular

__all__ = ["Identity", "Owned", "Tap", "file_identity", "owned_records"]

#: A file's size in bytes and the blake2b-256 digest (hex) of its bytes.
Identity = tuple[int, str]


class Tap:
    """A file (write-only) that counts and hashes the bytes written through it."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._hash = hashlib.blake2b(digest_size=32)
        self._size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._size += len(view)
        self._file.write(view)
        return len(view)

    def flush(self) -> None:
        self._file.flush()

    @property
    def identity(self) -> Identity:
        """The size and digest of what went through so far."""
        return self._size, self._hash.hexdigest()


def file_identity(path: Path) -> Identity | None:
    """The identity of a local checkpoint (of a sharded one, its ``run.pt``, which holds
    every shard's checksum); ``None`` when it is not there."""
    if path.is_dir() and not path.is_symlink():
        path = path / STATE_FILE
    h = hashlib.blake2b(digest_size=32)
    size = 0
    try:
        with open_regular(path) as f:  # a FIFO there is not the run's file: never block
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except (OSError, UnsafeFile):
        return None
    return size, h.hexdigest()


def _stat(path: Path) -> tuple[int, int, int] | None:
    """What shows a local file changed without reading it: inode, size, mtime."""
    if path.is_dir() and not path.is_symlink():
        path = path / STATE_FILE
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def owned_records(value: object) -> dict[str, Identity]:
    """``run.owned`` read from a checkpoint: a malformed entry is dropped (its file is
    then never taken for the run's), never trusted."""
    out: dict[str, Identity] = {}
    if not isinstance(value, dict):
        return out
    for key, ident in value.items():
        if (isinstance(key, str) and isinstance(ident, list | tuple) and len(ident) == 2
                and isinstance(ident[0], int) and not isinstance(ident[0], bool)
                and isinstance(ident[1], str)):
            out[key] = (ident[0], ident[1])
    return out


class Owned:
    """The identities of the files this run committed, by their ``written`` key.

    Args:
        identity: the identity of the file at a path now (reads a local file, or a
            bucket object's manifest); ``None`` when it is not there.
        local: whether a path is a local file (then its stat stands in for a re-read).
    """

    def __init__(self, identity: Callable[[Path], Identity | None],
                 local: Callable[[Path], bool]) -> None:
        self._identity, self._local = identity, local
        #: key -> the identity recorded when this run wrote the file
        self.records: dict[str, Identity] = {}
        #: key -> stat of a local file (or ``None`` for a stored one) known to match
        self._seen: dict[str, tuple[int, int, int] | None] = {}

    def state(self) -> dict[str, list[Any]]:
        """The records as plain values (``run.owned``)."""
        return {k: [size, digest] for k, (size, digest) in self.records.items()}

    def load(self, value: object) -> None:
        """Take the records of a checkpoint's ``run.owned``."""
        self.records, self._seen = owned_records(value), {}

    def wrote(self, key: str, path: Path, identity: Identity | None) -> None:
        """This process committed ``path``, or resumed from it (``identity``: its size and
        digest as written; ``None``: read it now, as a checkpoint cannot hold its own)."""
        if identity is None:
            identity = self._identity(path)
        if identity is None:
            return
        self.records[key] = identity
        self._seen[key] = _stat(path) if self._local(path) else None

    def trusted(self, key: str, path: Path, *, recheck: bool = False) -> bool:
        """Whether ``path`` is the file this run recorded under ``key``. A file seen to
        match before is taken as such (a local one while its stat is unchanged) unless
        ``recheck`` asks a stored one's manifest again (before deleting it)."""
        recorded = self.records.get(key)
        if recorded is None:
            return False
        local = self._local(path)
        if key in self._seen and (self._seen[key] == _stat(path) if local else not recheck):
            return True
        if self._identity(path) != recorded:
            self._seen.pop(key, None)
            return False
        self._seen[key] = _stat(path) if local else None
        return True
