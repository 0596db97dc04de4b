"""Where checkpoint files live: a local folder or an object store behind an fsspec URL.

A ``Storage`` holds the checkpoints of one run's checkpoint folder and answers five
questions: write one and commit it, list the committed ones, read one, delete one, clean
up what an interrupted write left. ``LocalStorage`` is a folder on disk (an atomic rename
commits a file); ``FsspecStorage`` is a URL (``s3://``, ``gs://``, ``file://``,
``memory://``...). Object stores have no atomic rename, so a checkpoint there is
committed by its manifest, ``<stem>.manifest.json`` (its file's name, size and blake2b
digest), written after the file: a checkpoint without its manifest does not exist.

fsspec and the protocol's package (s3fs, gcsfs) are imported only when a URL is opened;
a missing one is named with the extra that installs it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Final, Protocol, TypeVar

from schedtrain.checkpoints.files import NAME_RE, remove, remove_leftovers, write_atomic
from schedtrain.checkpoints.format import CheckpointError
from schedtrain.checkpoints.owned import file_identity
from schedtrain.checkpoints.pacing import update_in_pieces
from schedtrain.urls import is_url, missing_package

__all__ = ["ATTEMPTS", "MANIFEST", "FsspecStorage", "LocalStorage", "Storage",
           "StorageError", "is_url", "manifest_name", "open_storage"]

#: The manifest's format tag.
MANIFEST: Final = "schedtrain-manifest-1"
_SUFFIX: Final = ".manifest.json"
#: Attempts of one storage operation before its failure is reported (backoff between).
ATTEMPTS: Final = 5
#: Seconds before the second attempt; doubled before each next one (0.5, 1, 2, 4).
BACKOFF: Final = 0.5
_T = TypeVar("_T")


class StorageError(CheckpointError):
    """A storage operation that failed for good: ``path`` is the URL, ``reason`` says
    which operation and why."""


def manifest_name(name: str) -> str:
    """``step-00000120.pt`` -> ``step-00000120.manifest.json``."""
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return stem + _SUFFIX


class Storage(Protocol):
    """One checkpoint folder, local or remote."""

    def url(self, name: str) -> str:
        """How checkpoint ``name`` is shown to the user."""

    def write(self, name: str, save: Callable[[IO[bytes]], None]) -> None:
        """Write checkpoint ``name`` with ``save(file)`` and commit it."""

    def read(self, name: str) -> bytes:
        """The bytes of committed checkpoint ``name`` (checked against its manifest)."""

    def committed(self) -> list[str]:
        """The names of the committed checkpoints (``step-...`` names), any order."""

    def delete(self, name: str) -> None:
        """Delete checkpoint ``name`` (uncommitted first); a missing one is no error."""

    def clean_leftovers(self) -> list[str]:
        """Remove what interrupted writes left; returns what was removed."""

    def identity(self, name: str) -> tuple[int, str] | None:
        """Committed checkpoint ``name``'s size and blake2b-256 digest (``None``: none)."""


class LocalStorage:
    """A folder on the local disk: files committed by an atomic rename."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def url(self, name: str) -> str:
        return str(self.folder / name)

    def write(self, name: str, save: Callable[[IO[bytes]], None]) -> None:
        path = self.folder / name
        if path.is_dir() and not path.is_symlink():  # not ours to keep: a checkpoint's name
            remove(path)
        write_atomic(path, save)

    def read(self, name: str) -> bytes:
        try:
            return (self.folder / name).read_bytes()
        except OSError as exc:
            raise CheckpointError(self.folder / name, exc.strerror or "cannot be read") from None

    def committed(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return [p.name for p in self.folder.iterdir() if NAME_RE.fullmatch(p.name)]

    def delete(self, name: str) -> None:
        remove(self.folder / name)

    def clean_leftovers(self) -> list[str]:
        return [p.name for p in remove_leftovers(self.folder)]

    def identity(self, name: str) -> tuple[int, str] | None:
        return file_identity(self.folder / name)


def _transient(exc: BaseException) -> bool:
    """Worth another attempt: a dropped connection, a timeout, a server's 5xx or throttle
    (s3fs raises those as ``OSError``); a missing object or a refusal is not."""
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError
                  | NotADirectoryError | FileExistsError):
        return False
    return isinstance(exc, OSError | ConnectionError | TimeoutError)


def _cause(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FsspecStorage:
    """A folder behind an fsspec URL, committed by a manifest written last.

    Args:
        url: the folder, e.g. ``s3://bucket/runs/lm/checkpoints``.
        options: the filesystem's options (``[run] storage_options``: credentials,
            ``client_kwargs = {endpoint_url = ...}``...).
        fs: the filesystem to use instead of the one ``url`` names (tests wrap one).
        attempts: tries of each operation before it is reported (``ATTEMPTS``).
        backoff: seconds before the second try, doubled for each next one.
    """

    def __init__(self, url: str, options: Mapping[str, Any] | None = None, *,
                 fs: Any = None, attempts: int = ATTEMPTS, backoff: float = BACKOFF,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.base = url.rstrip("/")
        if fs is None:
            fs, root = _filesystem(self.base, dict(options or {}))
        else:
            root = fs._strip_protocol(self.base)
        self.fs, self.root = fs, root.rstrip("/")
        self.attempts, self.backoff, self._sleep = attempts, backoff, sleep

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _retry(self, operation: str, name: str, call: Callable[[], _T]) -> _T:
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return call()
            except FileNotFoundError:
                if operation == "read the manifest":
                    raise StorageError(self.url(name), "it has no manifest: it was never "
                                                       "committed") from None
                raise StorageError(self.url(name), f"{operation} failed: not found") from None
            except Exception as exc:
                if not _transient(exc):
                    raise StorageError(self.url(name), f"{operation} failed ({_cause(exc)})"
                                       ) from None
                if attempt == self.attempts:
                    raise StorageError(self.url(name), f"{operation} failed after "
                                       f"{attempt} attempts ({_cause(exc)})") from None
            self._sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def write(self, name: str, save: Callable[[IO[bytes]], None]) -> None:
        buffer = io.BytesIO()
        save(buffer)
        data = buffer.getvalue()
        checksum = hashlib.blake2b(digest_size=32)
        update_in_pieces(checksum, data)
        manifest = json.dumps({
            "format": MANIFEST,
            "files": {name: {"size": len(data),
                             "blake2b": checksum.hexdigest()}},
        }, indent=1).encode()
        if _needs_folders(self.fs):  # a local folder, unlike an object store's prefix
            self._retry("create the folder", "",
                        lambda: self.fs.makedirs(self.root, exist_ok=True))
        # Uncommit a checkpoint of this name first: its file is about to change.
        self._retry("delete the old manifest", name,
                    lambda: self._rm(manifest_name(name)))
        try:
            self._retry("write", name, lambda: self.fs.pipe_file(self._path(name), data))
            self._retry("commit (write the manifest)", name,
                        lambda: self.fs.pipe_file(self._path(manifest_name(name)), manifest))
        except StorageError:
            with contextlib.suppress(Exception):  # the run cleans up what it failed to write
                self._rm(name)
            raise

    def _rm(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(name))

    def _manifest(self, name: str) -> dict[str, Any]:
        raw = self._retry("read the manifest", name,
                          lambda: self.fs.cat_file(self._path(manifest_name(name))))
        try:
            manifest = json.loads(raw)
            entry = manifest["files"][name]
            if manifest.get("format") != MANIFEST:
                raise ValueError(manifest.get("format"))
            return {"size": int(entry["size"]), "blake2b": str(entry["blake2b"])}
        except (ValueError, KeyError, TypeError):
            raise StorageError(self.url(name), f"its manifest is not a {MANIFEST} naming it"
                               ) from None

    def read(self, name: str) -> bytes:
        expected = self._manifest(name)
        data: bytes = self._retry("read", name, lambda: self.fs.cat_file(self._path(name)))
        if (len(data) != expected["size"]
                or hashlib.blake2b(data, digest_size=32).hexdigest() != expected["blake2b"]):
            raise StorageError(self.url(name), "its content does not match its manifest: "
                                               "it is corrupt")
        return data

    def _names(self) -> list[str]:
        try:
            entries = self._retry("list", "", lambda: self.fs.ls(self.root, detail=False))
        except StorageError as exc:
            if exc.reason.endswith("not found"):
                return []
            raise
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def committed(self) -> list[str]:
        names = set(self._names())
        return [n for n in names if NAME_RE.fullmatch(n) and manifest_name(n) in names]

    def delete(self, name: str) -> None:
        self._retry("delete the manifest", name, lambda: self._rm(manifest_name(name)))
        self._retry("delete", name, lambda: self._rm(name))

    def identity(self, name: str) -> tuple[int, str] | None:
        # Its manifest's word (a small read): another run's object has its own digest.
        try:
            entry = self._manifest(name)
        except StorageError:
            return None
        return entry["size"], entry["blake2b"]

    def clean_leftovers(self) -> list[str]:
        names = set(self._names())
        gone = [n for n in names if NAME_RE.fullmatch(n) and manifest_name(n) not in names]
        for name in gone:
            self._retry("delete an uncommitted checkpoint", name, functools.partial(self._rm, name))
        return sorted(gone)


def _needs_folders(fs: Any) -> bool:
    """Whether files need their folder made first (the local disk through ``file://``)."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return bool({"file", "local"} & set(protocol))


def _filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path inside it; a missing package is
    named with the extra that installs it."""
    missing = missing_package(url)
    if missing is not None:
        raise StorageError(url, missing)
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:  # a protocol schedtrain has no extra for
        raise StorageError(url, f"its protocol's package is missing ({_cause(exc)})"
                           ) from None
    except ValueError as exc:
        raise StorageError(url, f"not a storage URL fsspec knows ({_cause(exc)})") from None
    return fs, str(root)


def open_storage(location: str | Path,
                 options: Mapping[str, Any] | None = None) -> LocalStorage | FsspecStorage:
    """The storage of a checkpoint folder: a URL through fsspec, else the local disk."""
    if is_url(location):
        return FsspecStorage(str(location), options)
    return LocalStorage(location)
