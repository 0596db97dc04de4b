"""The pytest plugin of schedule coverage: ``pytest --schedule-coverage``.

Registered through the ``pytest11`` entry point (or ``-p schedtrain.testing.plugin``),
it does nothing unless asked: with ``--schedule-coverage`` it records every schedule
the session simulates (``simulate()``, ``Simulation``, ``schedtrain plan``) and lists,
at the end, each part of a trigger that never decided a firing (see
``schedtrain.testing.coverage``); ``--schedule-coverage-fail`` also fails the session
when it lists any.

Under pytest-xdist (``-n``) each worker records its own share: at its session's end it
puts its records, as plain data, in xdist's ``workeroutput``; the controller collects
them as each worker goes down (``pytest_testnodedown``, a hook registered only where
xdist is loaded), merges them (``testing.workers``) and reports once, as one process
would have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from schedtrain.testing.coverage import CallbackCoverage, Gap
    from schedtrain.testing.recorder import Recorder

__all__ = ["pytest_addoption", "pytest_configure", "pytest_runtest_logfinish",
           "pytest_runtest_logstart",
           "pytest_sessionfinish", "pytest_terminal_summary", "pytest_unconfigure"]

_RECORDER: pytest.StashKey[Recorder] = pytest.StashKey()
_WORKERS: pytest.StashKey[_Workers] = pytest.StashKey()
#: The key of a worker's records in xdist's ``workeroutput``.
_OUTPUT = "schedtrain_schedule_coverage"
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
    if config.pluginmanager.hasplugin("xdist") and not _is_worker(config):
        workers = config.stash[_WORKERS] = _Workers()
        config.pluginmanager.register(workers, "schedtrain-coverage-workers")


class _Workers:
    """The controller's collection of its xdist workers' records."""

    def __init__(self) -> None:
        self.exports: list[list[dict[str, Any]]] = []
        self.silent: list[str] = []  # workers that went down without sending any

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        output = getattr(node, "workeroutput", None) or {}
        if _OUTPUT in output:
            self.exports.append(output[_OUTPUT])
        else:
            self.silent.append(str(getattr(getattr(node, "gateway", None), "id", node)))

    def records(self, recorder: Recorder) -> list[CallbackCoverage] | None:
        """The merged records, with this process's own; ``None`` when no worker ran."""
        if not self.exports and not self.silent:
            return None
        from schedtrain.testing.workers import export, merge

        return merge([export(recorder, ()), *self.exports])


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _records(config: pytest.Config, recorder: Recorder) -> list[CallbackCoverage]:
    workers = config.stash.get(_WORKERS, None)
    merged = workers.records(recorder) if workers is not None else None
    return list(recorder.callbacks.values()) if merged is None else merged


def _silent(config: pytest.Config) -> list[str]:
    workers = config.stash.get(_WORKERS, None)
    return workers.silent if workers is not None else []


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
    config = session.config
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None:
        return
    if _is_worker(config):  # the controller reports and decides
        from schedtrain.testing.workers import export

        output: dict[str, Any] = config.workeroutput  # type: ignore[attr-defined]
        output[_OUTPUT] = export(recorder, [item.nodeid for item in session.items])
        return
    if (config.getoption("schedule_coverage_fail") and session.exitstatus == pytest.ExitCode.OK
            and (_silent(config) or _gaps(_records(config, recorder)))):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless ``n`` is 1: ``1 part``, ``2 parts``, ``0 parts``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _gaps(records: list[CallbackCoverage]) -> list[Gap]:
    return [g for cov in records for g in cov.gaps()]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None or _is_worker(config):
        return
    records = _records(config, recorder)
    gaps = _gaps(records)
    tr = terminalreporter
    tr.write_sep("=", "schedule coverage")
    silent = _silent(config)
    if silent:
        tr.write_line(f"incomplete: xdist worker(s) {', '.join(silent)} went down without "
                      "sending their schedule coverage")
    shown = len(records)
    failing = config.getoption("schedule_coverage_fail") and (gaps or silent)
    if not gaps:
        tr.write_line(f"every part of the {count(shown, 'simulated callback trigger')} "
                      "decided a firing")
    else:
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
    if failing:
        tr.write_line("failing the session: --schedule-coverage-fail")
