"""``collector_paused``: no cyclic garbage collection while a schedule's objects are built.

Loading a spec, compiling its table and simulating it build objects that all stay
alive: per callback its TOML table, trigger, located tree, node and due vectors, per
firing a record. Python's collector walks every live object each time enough new ones
have survived, and finds nothing here to free; with thousands of callbacks those walks
cost as much as the work itself, and more as the schedule grows. Paused for the length
of the work, whatever cycles it leaves are collected after, at the collector's next
pass.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside (left as it was when it is off already:
    paused by an enclosing block, or by the program itself)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
