"""Where checkpoint files live: a local folder or an object store behind an fsspec URL.

A ``Storage`` holds the checkpoints of one run's checkpoint folder and answers five
questions: write one and commit it, list the committed ones, read one, delete one, clean
up what an interrupted write left. ``LocalStorage`` is a folder on disk (an atomic rename
commits a file); ``FsspecStorage`` is a URL (``s3://``, ``gs://``, ``file://``,
``memory://``...). Object stores have no atomic rename, so a checkpoint there is
committed by its manifest, ``<stem>.manifest.json`` (its file's name, size and blake2b
digest), written after the file: a checkpoint without its manifest does not exist.

fsspec and the protocol's package (s3fs, gcsfs) are imported only when a URL is opened;
a missing one is named with the extra that installs it. Every request has a deadline: an
endpoint that accepts connections and never answers fails an operation within
``bound()`` seconds (``ATTEMPTS`` tries of ``TIMEOUT`` s each, with the backoff between),
saying so once when the retrying starts. URLs are shown redacted (``urls.redact``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import json
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Final, Protocol, TypeVar

from schedtrain.checkpoints.files import NAME_RE
from schedtrain.checkpoints.format import CheckpointError
from schedtrain.checkpoints.local import LocalStorage
from schedtrain.checkpoints.manifests import MANIFEST, Entry, parse_manifest
from schedtrain.checkpoints.pacing import update_in_pieces
from schedtrain.checkpoints.transient import cause, transient
from schedtrain.readback import DamagedFile
from schedtrain.urls import is_url, missing_package, redact

__all__ = ["ATTEMPTS", "MANIFEST", "TIMEOUT", "FsspecStorage", "LocalStorage", "Storage",
           "StorageError", "StorageWarning", "is_url", "manifest_name", "open_storage"]

_SUFFIX: Final = ".manifest.json"
_FOLDER: Final = ".dcp"  # a sharded checkpoint's name ends so: a folder of objects
#: Attempts of one storage operation before its failure is reported (backoff between).
ATTEMPTS: Final = 5
#: Seconds before the second attempt; doubled before each next one (0.5, 1, 2, 4), up to
#: ``MAX_BACKOFF``: the tries go on, that far apart, until the operation's deadline.
BACKOFF: Final = 0.5
MAX_BACKOFF: Final = 4.0
#: Seconds one try may take (then a transient failure); bytes moved get 1 s per MIN_RATE more.
TIMEOUT: Final = 10.0
MIN_RATE: Final = 1 << 20
#: Seconds the one try of a tidying request (a failed write's leftover, a lease) may take.
QUICK: Final = 2.0
#: s3fs's botocore client's connect and read deadlines, and no retries of its own (ours
#: make the bound), unless ``storage_options`` ``config_kwargs`` say otherwise.
S3_CONFIG: Final = {"connect_timeout": 3, "read_timeout": 7, "retries": {"max_attempts": 1}}
#: The largest manifest read: one is a few hundred bytes; a bigger one is damage.
MANIFEST_LIMIT: Final = 1 << 16
_T = TypeVar("_T")


class StorageWarning(UserWarning):
    """A storage operation failed and is being tried again (said once per operation)."""


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


class FsspecStorage:
    """A folder behind an fsspec URL, committed by a manifest written last.

    Args:
        url: the folder, e.g. ``s3://bucket/runs/lm/checkpoints``.
        options: the filesystem's options (``[run] storage_options``: credentials,
            ``client_kwargs = {endpoint_url = ...}``...).
        fs: the filesystem to use instead of the one ``url`` names (tests wrap one).
        attempts: tries of each operation before it is reported (``ATTEMPTS``).
        backoff: seconds before the second try, doubled for each next one (``BACKOFF``).
        timeout: seconds one try may take, of an asynchronous filesystem (s3fs's and
            gcsfs's, whose requests could otherwise wait for ever): by default s3's
            ``config_kwargs`` connect + read timeouts, gcs's ``requests_timeout``, else
            ``TIMEOUT``.
    """

    def __init__(self, url: str, options: Mapping[str, Any] | None = None, *,
                 fs: Any = None, attempts: int | None = None, backoff: float | None = None,
                 timeout: float | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        # "s3://" keeps its slashes: stripped, it would be a local path named "s3:".
        self.base = url.rstrip("/") if not url.rstrip("/").endswith(":") else url
        #: How the folder is shown: never with the URL's credentials.
        self.shown = redact(self.base)
        per_try = TIMEOUT
        #: The filesystem's options as opened (DCP's fsspec writer is given them too).
        self.options: dict[str, Any] = dict(options or {})
        if fs is None:
            fs, root, per_try = _filesystem(self.base, self.options)
        else:
            root = fs._strip_protocol(self.base)
        self.fs, self.root = fs, root.rstrip("/")
        self.attempts = ATTEMPTS if attempts is None else attempts
        self.backoff = BACKOFF if backoff is None else backoff
        self.timeout, self._sleep = per_try if timeout is None else timeout, sleep
        self._deadlined = _asynchronous(fs)
        #: An operation failed for good on transient errors: the store does not answer,
        #: so what is only tidying (an uncommitted file's removal) is not tried.
        self.unreachable = False
        #: Told once per operation that retrying starts (a ``StorageWarning`` by default).
        self.on_retry: Callable[[str], None] = _warn

    def url(self, name: str) -> str:
        return f"{self.shown}/{name}"

    def bound(self) -> float:
        """The longest an operation on a small object waits for an endpoint that never
        answers before it fails: every try's timeout and the backoff between them."""
        waits = sum(self.backoff * 2.0 ** i for i in range(self.attempts - 1))
        return float(self.attempts * self.timeout + waits)

    def _call(self, method: str, *args: Any, size: int = 0, deadline: float | None = None,
              **kwargs: Any) -> Any:
        """``fs.method(*args)`` within this storage's deadline (``size`` bytes moved
        earn ``1 s per MIN_RATE`` more; ``deadline`` replaces it)."""
        fn = getattr(self.fs, method)
        if self._deadlined:  # fsspec's sync() takes the deadline
            seconds = deadline if deadline is not None else self.timeout + size / MIN_RATE
            return fn(*args, timeout=seconds, **kwargs)
        return fn(*args, **kwargs)

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _retry(self, operation: str, name: str, call: Callable[[], _T]) -> _T:
        """``call()``, tried again on a transient failure until the operation's
        deadline (``bound()``): at least ``attempts`` tries, and more while the deadline
        allows, since a refused connection fails in a millisecond and its tries alone
        would not outlast a store restarting for a few seconds."""
        delay, waited, start = self.backoff, 0.0, time.monotonic()
        self.unreachable = False
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except FileNotFoundError:
                if operation == "read the manifest":
                    raise StorageError(self.url(name), "it has no manifest: it was never "
                                                       "committed") from None
                raise StorageError(self.url(name), f"{operation} failed: not found") from None
            except Exception as exc:
                why = cause(exc, self.timeout)
                if not transient(exc):
                    raise StorageError(self.url(name), f"{operation} failed ({why})"
                                       ) from None
                # The sleeps count even where ``sleep`` is a test's, so retries end.
                spent = max(time.monotonic() - start, waited)
                if attempt >= self.attempts and spent + delay >= self.bound():
                    self.unreachable = True
                    raise StorageError(self.url(name), f"{operation} failed after "
                                       f"{attempt} attempts in {spent:.0f} s ({why})"
                                       ) from None
                if attempt == 1:
                    self.on_retry(f"{self.url(name)}: {operation} failed ({why}); trying "
                                  f"{self.attempts - 1} or more times, for at most "
                                  f"{self.bound():.0f} s in all")
            self._sleep(delay)
            waited += delay
            delay = min(delay * 2, MAX_BACKOFF)

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
                        lambda: self._call("makedirs", self.root, exist_ok=True))
        # Uncommit a checkpoint of this name first: its file is about to change.
        self._retry("delete the old manifest", name,
                    lambda: self._rm(manifest_name(name)))
        try:
            self._retry("write", name, lambda: self._call("pipe_file", self._path(name), data,
                                                          size=len(data)))
            self._retry("commit (write the manifest)", name,
                        lambda: self._call("pipe_file", self._path(manifest_name(name)),
                                           manifest))
        except StorageError:
            # The run cleans up what it failed to write, once and briefly: of a store that
            # does not answer, the next run to open the folder removes the leftover.
            with contextlib.suppress(Exception):
                self._rm(name, quick=True)
            raise

    def _rm(self, name: str, *, quick: bool = False) -> None:
        with contextlib.suppress(FileNotFoundError):
            if name.endswith(_FOLDER):  # a sharded checkpoint: a prefix of objects
                self._call("rm", self._path(name), recursive=True,
                           deadline=QUICK if quick else None)
                return
            self._call("rm_file", self._path(name), deadline=QUICK if quick else None)

    def get(self, name: str, limit: int, *, quick: bool = False) -> bytes | None:
        """The first ``limit`` + 1 bytes of object ``name`` (``None``: there is none);
        ``quick``: one short try, its failure raised as it is."""
        def cat() -> bytes:
            try:
                return bytes(self._call("cat_file", self._path(name), start=0, end=limit + 1,
                                        deadline=QUICK if quick else None))
            except OSError as exc:
                if exc.errno == errno.EINVAL and "range" in str(exc).lower():
                    return b""  # an empty object: no range of it can be served
                raise
        try:
            return cat() if quick else self._retry("read", name, cat)
        except FileNotFoundError:
            return None
        except StorageError as exc:
            if exc.reason.endswith("not found"):
                return None
            raise

    def put(self, name: str, data: bytes) -> None:
        """Write object ``name`` (not a checkpoint: no manifest)."""
        if _needs_folders(self.fs):
            self._retry("create the folder", "", lambda: self._call("makedirs", self.root,
                                                                    exist_ok=True))
        self._retry("write", name, lambda: self._call("pipe_file", self._path(name), data))

    def remove(self, name: str, *, quick: bool = False) -> None:
        """Delete object ``name`` (a missing one is no error); ``quick``: one short try."""
        if quick:
            self._rm(name, quick=True)
        else:
            self._retry("delete", name, lambda: self._rm(name))

    def _manifest(self, name: str) -> Entry:
        raw = self._retry("read the manifest", name, lambda: self._call(
            "cat_file", self._path(manifest_name(name)), start=0, end=MANIFEST_LIMIT + 1))
        shown = self.url(manifest_name(name))
        try:
            entry = parse_manifest(bytes(raw), shown, MANIFEST_LIMIT).get(name)
        except DamagedFile as exc:
            raise StorageError(self.url(name), f"its manifest is not a {MANIFEST} naming it "
                                               f"({exc.key or 'the file'}: {exc.reason})"
                               ) from None
        if entry is None:
            raise StorageError(self.url(name), f"its manifest is not a {MANIFEST} naming it "
                                               f"(files: no entry {name!r})")
        return entry

    def read(self, name: str) -> bytes:
        expected = self._manifest(name)
        data: bytes = self._retry("read", name, lambda: self._call(
            "cat_file", self._path(name), size=expected.size))
        if (len(data) != expected.size
                or hashlib.blake2b(data, digest_size=32).hexdigest() != expected.blake2b):
            raise StorageError(self.url(name), "its content does not match its manifest: "
                                               "it is corrupt")
        return data

    def _names(self) -> list[str]:
        try:
            entries = self._retry("list", "", lambda: self._call("ls", self.root, detail=False))
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
        return entry.size, entry.blake2b

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


def _filesystem(url: str, options: dict[str, Any]) -> tuple[Any, str, float]:
    """The fsspec filesystem of ``url``, the path inside it and the seconds one try may
    take; a missing package is named with the extra that installs it."""
    shown = redact(url)
    missing = missing_package(url)
    if missing is not None:
        raise StorageError(shown, missing)
    import fsspec

    protocol, per_try = url.split("://", 1)[0].lower(), TIMEOUT
    if protocol in ("s3", "s3a"):  # bounded requests unless the user's options say else
        given = options.get("config_kwargs")
        config = {**S3_CONFIG, **(given if isinstance(given, Mapping) else {})}
        options["config_kwargs"] = config
        per_try = _seconds(config.get("connect_timeout")) + _seconds(config.get("read_timeout"))
    elif protocol in ("gs", "gcs") and options.get("requests_timeout") is not None:
        per_try = _seconds(options["requests_timeout"])
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:  # a protocol schedtrain has no extra for
        raise StorageError(shown, f"its protocol's package is missing ({cause(exc)})"
                           ) from None
    except (ValueError, TypeError) as exc:
        raise StorageError(shown, f"not a storage URL fsspec knows, or options it does not "
                                  f"take ({cause(exc)})") from None
    return fs, str(root), per_try


def _seconds(value: object) -> float:
    """A client's timeout option as seconds (half of ``TIMEOUT`` for one that is not one)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return TIMEOUT / 2


def _asynchronous(fs: Any) -> bool:
    """Whether ``fs`` is an fsspec asynchronous filesystem (s3fs, gcsfs), whose blocking
    calls take a ``timeout``."""
    try:
        from fsspec.asyn import AsyncFileSystem
    except ImportError:  # pragma: no cover - a filesystem given without fsspec
        return False
    return isinstance(fs, AsyncFileSystem)


def _warn(message: str) -> None:
    warnings.warn(message, StorageWarning, stacklevel=4)


def open_storage(location: str | Path,
                 options: Mapping[str, Any] | None = None) -> LocalStorage | FsspecStorage:
    """The storage of a checkpoint folder: a URL through fsspec, else the local disk."""
    if is_url(location):
        return FsspecStorage(str(location), options)
    return LocalStorage(location)
