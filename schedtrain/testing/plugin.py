"""The pytest plugin of schedule coverage: ``pytest --schedule-coverage``.

Registered through the ``pytest11`` entry point (or ``-p schedtrain.testing.plugin``),
it does nothing unless asked: with ``--schedule-coverage`` it records every schedule
the session simulates (``simulate()``, ``Simulation``, ``schedtrain plan``) and lists,
at the end, each part of a trigger that never decided a firing (see
``schedtrain.testing.coverage``); ``--schedule-coverage-fail`` also fails the session
when it lists any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from schedtrain.testing.recorder import Recorder

__all__ = ["pytest_addoption", "pytest_configure", "pytest_runtest_logfinish",
           "pytest_runtest_logstart",
           "pytest_sessionfinish", "pytest_terminal_summary", "pytest_unconfigure"]

_RECORDER: pytest.StashKey[Recorder] = pytest.StashKey()
#: The recorders of the sessions running in this process, innermost last (a session
#: inside a test, as pytester runs one, has its own).
_ACTIVE: list[Recorder] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("schedtrain", "schedule coverage (schedtrain)")
    group.addoption("--schedule-coverage", action="store_true", default=False,
                    help="report each part of a simulated trigger that never decided a firing")
    group.addoption("--schedule-coverage-fail", action="store_true", default=False,
                    help="as --schedule-coverage, and fail the session if it reports any")


def pytest_configure(config: pytest.Config) -> None:
    if not (config.getoption("schedule_coverage", False)
            or config.getoption("schedule_coverage_fail", False)):
        return
    from schedtrain.testing.recorder import Recorder

    recorder = Recorder()
    recorder.start()
    config.stash[_RECORDER] = recorder
    _ACTIVE.append(recorder)


def pytest_unconfigure(config: pytest.Config) -> None:
    recorder = config.stash.get(_RECORDER, None)
    if recorder is not None:
        recorder.stop()
        del config.stash[_RECORDER]
        _ACTIVE.remove(recorder)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    recorder = _ACTIVE[-1] if _ACTIVE else None
    if recorder is not None:
        recorder.where = nodeid


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    if _ACTIVE:
        _ACTIVE[-1].where = ""


def pytest_sessionfinish(session: pytest.Session) -> None:
    recorder = session.config.stash.get(_RECORDER, None)
    if (recorder is not None and session.config.getoption("schedule_coverage_fail")
            and recorder.gaps() and session.exitstatus == pytest.ExitCode.OK):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1: ``1 part``, ``2 parts``, ``0 parts``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None:
        return
    gaps = recorder.gaps()
    tr = terminalreporter
    tr.write_sep("=", "schedule coverage")
    shown = len(recorder.callbacks)
    if not gaps:
        tr.write_line(f"every part of the {count(shown, 'simulated callback trigger')} "
                      "decided a firing")
        return
    names = {g.callback for g in gaps}
    tr.write_line(f"{count(len(gaps), 'part')} of {count(len(names), 'callback')} "
                  f"(of {shown} simulated) never decided a firing:")
    last = None
    for g in gaps:
        if (g.callback, g.where) != last:
            place = f"in {g.where}" if g.where else "outside a test"
            tr.write_line(f"  {g.callback} (first simulated {place})")
            last = (g.callback, g.where)
        tr.write_line(f"    {g}")
    if config.getoption("schedule_coverage_fail"):
        tr.write_line("failing the session: --schedule-coverage-fail")
