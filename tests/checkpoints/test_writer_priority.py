"""The background checkpoint writer yields the cores to training, and gets its priority
back when the loop waits for it (Linux; best-effort elsewhere)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from schedtrain.checkpoints.background import WRITER_NICE, Writer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="per-thread nice values are Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _can_raise_priority() -> bool:
    """Whether this process may give a thread a lower nice value back (root,
    CAP_SYS_NICE or RLIMIT_NICE)."""
    out: list[bool] = []

    def probe() -> None:
        before = _nice()
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(before + 1, 19))
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), before)
            out.append(True)
        except PermissionError:
            out.append(False)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return out[0]


def test_the_write_runs_at_the_lowest_priority() -> None:
    """While nobody waits, the writing thread has nice value ``WRITER_NICE``."""
    seen: list[int] = []
    writer = Writer()
    writer.start(lambda: seen.append(_nice()))
    writer.result()
    assert seen == [max(WRITER_NICE, _nice())]


def test_waiting_for_the_write_gives_it_its_priority_back() -> None:
    """Once the loop waits (``result``), the thread runs at the priority it started with:
    the loop never waits behind other work on a busy machine."""
    if not _can_raise_priority():
        pytest.skip("this process may not raise a thread's priority")
    started, seen = threading.Event(), []
    before = _nice()

    def write() -> str:
        seen.append(_nice())
        started.set()
        deadline = time.monotonic() + 10
        while _nice() != before and time.monotonic() < deadline:
            time.sleep(0.001)
        seen.append(_nice())
        return "written"

    writer = Writer()
    writer.start(write)
    assert started.wait(10)
    assert writer.result() == "written"
    assert seen == [WRITER_NICE, before]


def test_nice_none_leaves_the_priority_alone() -> None:
    """``Writer(nice=None)`` runs the write at the starting thread's priority."""
    seen: list[int] = []
    writer = Writer(nice=None)
    writer.start(lambda: seen.append(_nice()))
    writer.result()
    assert seen == [_nice()]
