"""The owner of an object-store checkpoint folder: the local ``.lock`` rule, in the bucket.

A run that writes checkpoints to a URL holds a lease there, ``<folder>/.schedtrain-lease.json``
(``{"run": its run directory, "host", "pid", "token", "refreshed": Unix time}``), refreshed
every ``INTERVAL`` seconds while it runs and deleted when it ends. A second run opening the
folder is refused in one line naming the holder, unless the lease is stale (not refreshed
for ``STALE`` x ``INTERVAL`` seconds, by the writer's clock: the machines' clocks must agree
to well within that) or names this run directory on this host, whose local ``.lock`` this
process now holds (so its last holder is gone: a ``kill -9`` resumed at once). A run whose
lease another run took over (it was stale) stops writing there.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from schedtrain.checkpoints.storage import FsspecStorage, StorageError
from schedtrain.errors import RunDirError

__all__ = ["INTERVAL", "LEASE", "STALE", "Lease"]

#: The lease object's name in the checkpoint folder (not a checkpoint's: never pruned).
LEASE: Final = ".schedtrain-lease.json"
#: Seconds between refreshes of a live run's lease.
INTERVAL: Final = 30.0
#: Refreshes missed before a lease is stale and may be taken over (4 x 30 s = 2 min).
STALE: Final = 4
_FORMAT: Final = "schedtrain-lease-1"
_LIMIT: Final = 1 << 14


class Lease:
    """This run's claim on ``storage``'s folder.

    Args:
        storage: the checkpoint folder.
        run_dir: the run directory, which names the run.
        interval: seconds between refreshes (``INTERVAL``).
        stale: refreshes missed before another run may take the lease over (``STALE``).
        clock: the time, in seconds since the epoch.
    """

    def __init__(self, storage: FsspecStorage, run_dir: Path, *, interval: float = INTERVAL,
                 stale: int = STALE, clock: Callable[[], float] = time.time) -> None:
        self.storage, self.interval, self.stale, self._clock = storage, interval, stale, clock
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

    def held(self, *, quick: bool = False) -> dict[str, Any] | None:
        """The lease there (``None``: none; ``{}``: one that does not parse, as stale)."""
        raw = self.storage.get(LEASE, _LIMIT, quick=quick)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            if (len(raw) > _LIMIT or not isinstance(data, dict)
                    or data.get("format") != _FORMAT
                    or not isinstance(data.get("refreshed"), int | float)
                    or not all(isinstance(data.get(k), str) for k in ("run", "host", "token"))):
                return {}
        except Exception:  # any way a crafted lease fails to parse: no owner named
            return {}
        return data

    def acquire(self) -> None:
        """Take the folder for this run and keep refreshing the lease until ``release``.

        Raises:
            RunDirError: another live run holds it (named, with how to go on).
            StorageError: the store failed (after its retries).
        """
        held = self.held()
        if held and held["token"] != self.owner["token"] and not self._may_take(held):
            age = self._clock() - float(held["refreshed"])
            raise RunDirError(
                f"checkpoint_dir {self.storage.shown!r} is in use by the run in "
                f"{held['run']!r} on {held['host']} (process {held.get('pid')}), whose lease "
                f"was refreshed {max(age, 0):.0f} s ago; wait for it to end, or give each "
                f"run its own checkpoint_dir (a lease not refreshed for "
                f"{self.stale * self.interval:.0f} s is taken over; {self.url})")
        self._write()
        if self._thread is None:
            self._thread = threading.Thread(target=self._keep, name="schedtrain-lease",
                                            daemon=True)
            self._thread.start()

    def _may_take(self, held: dict[str, Any]) -> bool:
        """A stale lease, or this run directory's on this host (its ``.lock`` is ours)."""
        same = held["run"] == self.owner["run"] and held["host"] == self.owner["host"]
        return same or self._clock() - float(held["refreshed"]) > self.stale * self.interval

    def _write(self) -> None:
        body = {**self.owner, "refreshed": self._clock()}
        self.storage.put(LEASE, json.dumps(body, indent=1).encode())

    def refresh(self) -> None:
        """Write the lease again, unless another run took it over (``lost`` says so)."""
        held = self.held()
        if held is not None and held.get("token") != self.owner["token"]:
            who = (f"the run in {held['run']!r} on {held['host']}" if held else
                   "another run")
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
            if held and held.get("token") == self.owner["token"]:
                self.storage.remove(LEASE, quick=True)
