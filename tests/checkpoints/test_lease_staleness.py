"""A lease's stale time, pinned to what docs/checkpoints.md promises: a live writer's lease
is never taken over before 4 x 30 s = 2 minutes without a refresh, and is after it.

The times are written out here, not read from ``STALE`` and ``INTERVAL``: a test that
derived them from the constants would pass with any constants, and a threshold cut to a
quarter (a live but slow writer losing its folder after 30 s) would go unnoticed. The
store is fsspec's in-memory filesystem (a real one); the clocks are the tests'."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.checkpoints.lease import LEASE, Lease
from schedtrain.checkpoints.storage import FsspecStorage, StorageWarning
from schedtrain.errors import RunDirError

#: The documented stale time, in seconds (docs/checkpoints.md: "4 x 30 s = 2 minutes").
STALE_S = 120.0
#: The documented refresh interval, in seconds.
INTERVAL_S = 30.0


def ms(milliseconds: int) -> float:
    """Seconds from milliseconds: ages a Unix time of 1.8e9 holds exactly enough."""
    return milliseconds / 1000


class Clock:
    """A settable time, in seconds since the epoch."""

    def __init__(self, now: float = 1.8e9) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _storage() -> FsspecStorage:
    return FsspecStorage(f"memory://leases/{uuid.uuid4().hex}")


def _writer(storage: FsspecStorage, clock: Clock) -> Lease:
    """A live writer's lease with the default interval and stale count, refreshed by
    the test (its thread stopped) so that the test decides when."""
    lease = Lease(storage, Path("/jobs/writer/run"), clock=clock)
    lease.acquire()
    assert lease._thread is not None
    lease._stop.set()  # its thread ends; refresh() below writes again once cleared
    lease._thread.join()
    lease._stop.clear()
    return lease


def _taken_over(storage: FsspecStorage, at: float) -> bool:
    """Whether a second run opening ``storage`` at time ``at`` takes the lease (then it
    holds it, unrefreshed)."""
    opener = Lease(storage, Path("/jobs/opener/run"), clock=Clock(at))
    try:
        opener.acquire()
    except RunDirError as exc:
        assert "is in use by the run in '/jobs/writer/run'" in str(exc)
        return False
    assert opener._thread is not None
    opener._stop.set()
    opener._thread.join()
    return True


def test_defaults_are_the_documented_times() -> None:
    """A lease built without arguments refreshes every 30 s and goes stale after 2 min."""
    lease = Lease(_storage(), Path("/jobs/run"))
    assert lease.interval == INTERVAL_S
    assert lease.interval * lease.stale == STALE_S


@settings(max_examples=60, deadline=None)
@given(age=st.one_of(st.integers(0, 1_200_000).map(ms),
                     st.sampled_from([INTERVAL_S, STALE_S / 4, STALE_S / 2, STALE_S - 1e-3,
                                      STALE_S, STALE_S + 1e-3, STALE_S + 1])))
def test_taken_over_only_after_the_stale_time(age: float) -> None:
    """A lease last refreshed ``age`` seconds ago is refused to a second run while
    ``age`` <= 2 minutes and taken over once it is past them."""
    storage, clock = _storage(), Clock()
    _writer(storage, clock)
    assert _taken_over(storage, clock.now + age) is (age > STALE_S)


@settings(max_examples=25, deadline=None)
@given(refreshes=st.lists(st.integers(100, 120_000).map(ms), min_size=1, max_size=12),
       opened=st.integers(0, 1000).map(ms))
def test_a_live_writer_keeps_its_lease(refreshes: list[float], opened: float) -> None:
    """A writer that refreshes at gaps of at most 2 minutes (on time, or late after
    failed refreshes) is never taken over, at whatever moment a second run opens the
    folder; once it stops refreshing, it is taken over after 2 minutes."""
    storage, clock = _storage(), Clock()
    writer = _writer(storage, clock)
    for gap in refreshes:
        assert not _taken_over(storage, clock.now + opened * gap)
        clock.now += gap
        writer.refresh()
        assert writer.lost is None
    assert not _taken_over(storage, clock.now + STALE_S)
    assert _taken_over(storage, clock.now + STALE_S + 0.5)
    writer.refresh()
    assert writer.lost is not None and "took the lease" in writer.lost


def test_untrusted_lease_watched_for_the_stale_time() -> None:
    """A lease whose time cannot be trusted (damaged here) is watched for 2 minutes,
    in refreshes' steps, and taken over if it stayed the same."""
    storage = _storage()
    storage.put(LEASE, b"not a lease")
    slept: list[float] = []
    opener = Lease(storage, Path("/jobs/opener/run"), clock=Clock(), sleep=slept.append)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opener.acquire()
    opener.release()
    assert sum(slept) == pytest.approx(STALE_S)
    assert max(slept) == pytest.approx(INTERVAL_S)
    [warning] = [w for w in seen if issubclass(w.category, StorageWarning)]
    assert f"for {STALE_S:.0f} s" in str(warning.message)
