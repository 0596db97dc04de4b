"""The owner of an object-store checkpoint folder: the local ``.lock`` rule, in the bucket.

A run that writes checkpoints to a URL holds a lease there, ``<folder>/.schedtrain-lease.json``
(``{"run": its run directory, "host", "pid", "token", "refreshed": Unix time}``), refreshed
every ``INTERVAL`` seconds while it runs and deleted when it ends. A second run opening the
folder is refused in one line naming the holder and the way out, unless the lease is stale
(not refreshed for ``STALE`` x ``INTERVAL`` seconds, by the writer's clock: the machines'
clocks must agree to within ``SKEW``) or names this run directory on this host, whose local
``.lock`` this process now holds (so its last holder is gone: a ``kill -9`` resumed at
once). A run whose lease another run took over (it was stale) stops writing there.

The lease is read back as a typed, bounded ``LeaseRecord`` (``readback``). One whose time
cannot be trusted, being damaged (not JSON, a field of the wrong type or out of bounds, a
host with a newline) or refreshed more than ``SKEW`` ahead of this machine's clock, has
its age measured from when this process first read it: the opening run watches it for
the stale time and takes it over if it stayed the same; one that changes meanwhile is
being refreshed by a live run, which is refused with the way out.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs

from schedtrain.checkpoints.storage import FsspecStorage, StorageError, StorageWarning
from schedtrain.errors import RunDirError
from schedtrain.readback import (
    DamagedFile,
    at_most,
    between,
    invalid,
    parse_json,
    printable,
    structure,
    valid,
)

__all__ = ["INTERVAL", "LEASE", "SKEW", "STALE", "Lease", "LeaseRecord"]

#: The lease object's name in the checkpoint folder (not a checkpoint's: never pruned).
LEASE: Final = ".schedtrain-lease.json"
#: Seconds between refreshes of a live run's lease.
INTERVAL: Final = 30.0
#: Refreshes missed before a lease is stale and may be taken over (4 x 30 s = 2 min).
STALE: Final = 4
#: How far ahead of this machine's clock a lease's ``refreshed`` may be and still be
#: believed (the writer's clock running that much fast); further is not a time to trust.
SKEW: Final = 60.0
_FORMAT: Final = "schedtrain-lease-1"
_LIMIT: Final = 1 << 14
#: The latest ``refreshed`` a lease may hold at all (the year 5138): past it, damage.
_LATEST: Final = 1e11


def _path(_inst: Any, attribute: Any, value: str) -> None:
    if printable(value) != value or not value:
        raise invalid(attribute.name, "expected a run directory's path without control "
                      f"characters, found {printable(value)[:60]!r}")


@attrs.frozen
class LeaseRecord:
    """A lease read back: who holds the folder, and when they last said so."""

    format: str = attrs.field(validator=at_most(100))
    run: str = attrs.field(validator=[at_most(4096), _path])
    host: str = attrs.field(validator=valid)
    pid: int = attrs.field(validator=between(0, 1 << 32))
    token: str = attrs.field(validator=valid)
    refreshed: float = attrs.field(validator=between(0, _LATEST))

    def __attrs_post_init__(self) -> None:
        if self.format != _FORMAT:
            raise invalid("format", f"expected {_FORMAT!r}, found "
                          f"{printable(self.format)[:60]!r}")


class Lease:
    """This run's claim on ``storage``'s folder.

    Args:
        storage: the checkpoint folder.
        run_dir: the run directory, which names the run.
        interval: seconds between refreshes (``INTERVAL``).
        stale: refreshes missed before another run may take the lease over (``STALE``).
        clock: the time, in seconds since the epoch.
        sleep: waits, while a lease whose time cannot be trusted is watched.
    """

    def __init__(self, storage: FsspecStorage, run_dir: Path, *,
                 interval: float | None = None, stale: int | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.storage, self._clock, self._sleep = storage, clock, sleep
        self.interval = INTERVAL if interval is None else interval
        self.stale = STALE if stale is None else stale
        self.owner = {"format": _FORMAT, "run": str(run_dir.resolve()),
                      "host": socket.gethostname(), "pid": os.getpid(),
                      "token": uuid.uuid4().hex}
        #: Why this run may no longer write there (another run took the lease over).
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The lease object's URL (redacted)."""
        return self.storage.url(LEASE)

    def _raw(self, *, quick: bool = False) -> bytes | None:
        return self.storage.get(LEASE, _LIMIT, quick=quick)

    def parse(self, raw: bytes) -> LeaseRecord:
        """Lease bytes ``raw`` as a record.

        Raises:
            DamagedFile: not a lease schedtrain wrote (named by key path).
        """
        if len(raw) > _LIMIT:
            raise DamagedFile(self.url, "", f"expected at most {_LIMIT:,} bytes, found more")
        return structure(parse_json(raw, self.url), LeaseRecord, self.url)

    def held(self, *, quick: bool = False) -> LeaseRecord | None:
        """The lease there (``None``: none).

        Raises:
            DamagedFile: the lease there is damaged.
        """
        raw = self._raw(quick=quick)
        return None if raw is None else self.parse(raw)

    def acquire(self) -> None:
        """Take the folder for this run and keep refreshing the lease until ``release``.

        Raises:
            RunDirError: another live run holds it (named, with how to go on).
            StorageError: the store failed (after its retries).
        """
        raw = self._raw()
        untrusted = self._judge(raw)
        if untrusted is not None:
            changed, now = self._watch(raw, untrusted)
            if changed:
                again = self._judge(now)
                if again is not None:  # refreshed meanwhile: a live run, its time untrusted
                    raise RunDirError(self._refusal(
                        f"whose lease {again} yet was rewritten"))
        self._write()
        if self._thread is None:
            self._thread = threading.Thread(target=self._keep, name="schedtrain-lease",
                                            daemon=True)
            self._thread.start()

    def _stale_s(self) -> float:
        return self.stale * self.interval

    def _judge(self, raw: bytes | None) -> str | None:
        """``None``: lease ``raw`` may be taken; else why its time cannot be trusted.

        Raises:
            RunDirError: a live run's lease, refreshed within the stale time.
        """
        if raw is None:
            return None
        try:
            held = self.parse(raw)
        except DamagedFile as exc:
            return f"is damaged ({exc.key or 'the file'}: {exc.reason[:20]})"
        if held.token == self.owner["token"] or (
                held.run == self.owner["run"] and held.host == self.owner["host"]):
            return None  # ours, or this run directory's on this host: its .lock is ours
        age = self._clock() - held.refreshed
        if age < -SKEW:
            return (f"is {-age:,.0f} s ahead of this machine's clock (over the {SKEW:.0f} s "
                    "allowed)")
        if age > self._stale_s():
            return None
        raise RunDirError(self._refusal(
            f"in {printable(held.run)!r} on {held.host} (process {held.pid}), whose lease "
            f"was refreshed {max(age, 0):.0f} s ago"))

    def _refusal(self, who: str) -> str:
        # The way out comes right after the holder: a long line is cut in its middle.
        return (f"checkpoint_dir {self.storage.shown!r} is in use by the run {who}; if no "
                f"run uses it any more, delete {LEASE} there; else wait for it to end or "
                "give each run its own checkpoint_dir")

    def _watch(self, raw: bytes | None, why: str) -> tuple[bool, bytes | None]:
        """Watch lease ``raw`` (``why``: its time is untrusted) for the stale time from
        now: whether it changed (else it is stale: taken over), and what it became."""
        warnings.warn(f"{self.url} {why}: its age is measured from now; it is taken over "
                      f"if it stays the same for {self._stale_s():.0f} s", StorageWarning,
                      stacklevel=3)
        end = time.monotonic() + self._stale_s()
        waited = 0.0
        while (left := min(end - time.monotonic(), self._stale_s() - waited)) > 0:
            step = min(self.interval, left)
            self._sleep(step)
            waited += step
            now = self._raw()
            if now != raw:
                return True, now
        return False, raw

    def _write(self) -> None:
        body = {**self.owner, "refreshed": self._clock()}
        self.storage.put(LEASE, json.dumps(body, indent=1).encode())

    def refresh(self) -> None:
        """Write the lease again, unless another run took it over (``lost`` says so)."""
        raw = self._raw()
        if raw is not None:
            try:
                held = self.parse(raw)
                who = f"the run in {printable(held.run)!r} on {held.host}"
            except DamagedFile as exc:  # not ours: this run wrote an intact one
                held, who = None, f"another run (its lease {exc.key or 'the file'}: " \
                                  f"{exc.reason[:40]})"
            if held is None or held.token != self.owner["token"]:
                self.lost = (f"{who} took the lease of checkpoint_dir {self.storage.shown!r} "
                             "over (this run's was not refreshed in time): this run stops "
                             "writing there")
                self._stop.set()
                return
        if not self._stop.is_set():
            self._write()

    def _keep(self) -> None:
        while not self._stop.wait(self.interval):
            # A failed refresh is tried at the next interval; missing STALE of them in a
            # row is what lets another run take over.
            with contextlib.suppress(StorageError):
                self.refresh()

    def check(self) -> None:
        """Raise ``StorageError`` when the lease was taken over: no more writes."""
        if self.lost is not None:
            raise StorageError(self.storage.shown, self.lost)

    def release(self) -> None:
        """Stop refreshing and delete the lease if it is still this run's: one short
        try each (a store that does not answer leaves it to go stale)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=0.1)
        if self.lost is not None or self.storage.unreachable:
            return
        with contextlib.suppress(Exception):
            held = self.held(quick=True)
            if held is not None and held.token == self.owner["token"]:
                self.storage.remove(LEASE, quick=True)
