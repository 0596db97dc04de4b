"""Schedule coverage under pytest-xdist: the workers' records merged on the controller.

The rule: however a session's tests are shared among worker processes, the merged
records report what one process running them all in order would have reported.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import Shape, schedules, shapes

from schedtrain import Schedule, ScheduleError, simulate
from schedtrain.testing.coverage import CallbackCoverage
from schedtrain.testing.recorder import Recorder
from schedtrain.testing.workers import export, merge

pytest_plugins = ("pytester",)
pytestmark = pytest.mark.filterwarnings("ignore::schedtrain.ScheduleWarning")

Run = tuple[Schedule, Shape]


def _report(records: list[CallbackCoverage]) -> list[tuple[Any, ...]]:
    """Everything the plugin prints of the records, and what it is made of."""
    return [(c.name, c.where, [str(g) for g in c.gaps()], c.evaluated, c.true, c.fired,
             c.blocked) for c in records]


def _recorded(runs: list[tuple[str, Run]]) -> Recorder:
    recorder = Recorder()
    recorder.start()
    try:
        for where, (schedule, shape) in runs:
            recorder.where = where
            simulate(schedule, **shape.kwargs())
    finally:
        recorder.stop()
    return recorder


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Run], list[tuple[Run, int]], int]:
    """Simulations at collection (every worker imports them), then tests, each run by
    one of ``workers`` workers; the tests share a few schedules, so that one callback
    is seen by several workers."""
    pool = draw(st.lists(schedules(max_callbacks=3), min_size=1, max_size=3))
    run = st.tuples(st.sampled_from(pool), shapes(max_epochs=3, max_len=12))
    workers = draw(st.integers(1, 3))
    collected = draw(st.lists(run, max_size=2))
    tests = draw(st.lists(st.tuples(run, st.integers(0, workers - 1)), min_size=1,
                          max_size=5))
    return collected, tests, workers


class TestMerge:
    @settings(max_examples=40, deadline=None)
    @given(sessions())
    def test_merged_workers_report_as_one_process(
            self, session: tuple[list[Run], list[tuple[Run, int]], int]) -> None:
        """Shared among workers, sent as JSON and merged, the records are those of one
        process: same callbacks, order, first places, part flags and gaps."""
        collected, tests, workers = session
        for schedule, shape in [*collected, *(r for r, _w in tests)]:
            try:
                simulate(schedule, **shape.kwargs())
            except ScheduleError:
                assume(False)
        ids = [f"test_{i}" for i in range(len(tests))]
        at_collection = [("", r) for r in collected]
        serial = _recorded(at_collection + [(i, r) for i, (r, _w) in zip(ids, tests,
                                                                           strict=True)])
        exports = []
        for w in range(workers):
            mine = [(i, r) for i, (r, owner) in zip(ids, tests, strict=True) if owner == w]
            exports.append(json.loads(json.dumps(export(_recorded(at_collection + mine),
                                                        ids))))
        assert _report(merge(exports)) == _report(list(serial.callbacks.values()))

    def test_parts_that_differ_are_not_merged(self) -> None:
        """Two records of one name but different triggers never mix their flags."""
        from schedtrain import every

        a = CallbackCoverage("cb", every("2 steps"), "")
        b = CallbackCoverage("cb", every("2 steps") & every("3 steps"), "")
        with pytest.raises(ValueError, match=r"'cb'.*parts differ"):
            a.merge(b)


#: The report's problem, split over two files: ``late``'s window is entered in neither.
GAP_ONE = '''
import os
from schedtrain import Schedule, every, on, window
from schedtrain.testing import simulate

SCHEDULE = Schedule({"ckpt": every("20 steps") | on("train_end"),
                     "late": every("1 epoch") & window(start="30 epochs"),
                     "val": every("100 steps") & window(start="300 steps")})
simulate(SCHEDULE, epochs=1, steps_per_epoch=10)  # at import: outside a test

def test_short():
    open(os.environ.get("PYTEST_XDIST_WORKER", "main") + "_one", "w").close()
    simulate(SCHEDULE, epochs=2, steps_per_epoch=100)
'''
GAP_TWO = '''
import os
from schedtrain import Schedule, every, on, window
from schedtrain.testing import simulate

def test_long():
    open(os.environ.get("PYTEST_XDIST_WORKER", "main") + "_two", "w").close()
    simulate(Schedule({"val": every("100 steps") & window(start="300 steps"),
                       "quiet": every("3 steps") | every("6 steps")}),
             epochs=5, steps_per_epoch=100)
'''


#: Installed plugins the inner sessions do not use, left out of all but one session: each
#: of a session's processes (the controller and every xdist worker) would import them,
#: hypothesis alone about 1 s of CPU. Naming a plugin that is not installed is harmless.
LEAN = tuple(arg for name in ("hypothesispytest", "benchmark", "anyio", "timeout",
                              "xdist.looponfail") for arg in ("-p", f"no:{name}"))


def _coverage_section(result: pytest.RunResult) -> list[str]:
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if "= schedule coverage =" in line)
    end = next(i for i in range(start, len(lines))
               if re.match(r"^\d+ (passed|failed)|^=+ .*\d+ (passed|failed)", lines[i]))
    return lines[start:end]


class TestUnderXdist:
    """Real sessions, run with ``-n 2`` in a subprocess (xdist's workers are processes)."""

    def test_a_gap_fails_the_session_and_reads_as_without_n(
            self, pytester: pytest.Pytester) -> None:
        """Each file on its own worker (``--dist loadfile``): the gaps of both, the
        `val` window entered only on one, the first places, the count: the report is
        the one-process report, and ``--schedule-coverage-fail`` fails the session. The
        one-process session loads every installed plugin; the others leave out LEAN's."""
        pytester.makepyfile(test_one=GAP_ONE, test_two=GAP_TWO)
        args = ("-p", "no:cacheprovider", "--schedule-coverage-fail")
        alone = pytester.runpytest_subprocess(*args)
        assert alone.ret == pytest.ExitCode.TESTS_FAILED
        shared = pytester.runpytest_subprocess(*args, *LEAN, "-n", "2", "--dist", "loadfile")
        assert shared.ret == pytest.ExitCode.TESTS_FAILED
        shared.assert_outcomes(passed=2)
        ran = {p.name for p in pytester.path.iterdir() if p.name.startswith("gw")}
        assert {r.split("_")[0] for r in ran} == {"gw0", "gw1"}, ran  # both workers ran
        section = _coverage_section(shared)
        assert section == _coverage_section(alone)
        assert "failing the session: --schedule-coverage-fail" in section
        assert any('late.trigger.all[1] (start = "30 epochs"): window never entered' in line
                   for line in section)
        assert "  late (first simulated outside a test)" in section
        assert not any(line.startswith("  val ") for line in section)  # covered by the union

    def test_without_a_gap_the_session_passes(self, pytester: pytest.Pytester) -> None:
        """Coverage only the union of the workers completes passes ``-n 2``; the issue's
        one-file session with a gap fails it."""
        pytester.makepyfile(test_one='''
from schedtrain import Schedule, every, window
from schedtrain.testing import simulate

def test_short():
    simulate(Schedule({"val": every("100 steps") & window(start="300 steps")}),
             epochs=2, steps_per_epoch=100)
''', test_two=GAP_TWO.replace('"quiet": every("3 steps") | every("6 steps")',
                              '"quiet": every("3 steps")'))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *LEAN, "-n", "2",
                                               "--dist", "loadfile",
                                               "--schedule-coverage-fail")
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines(["every part of the 2 simulated callback triggers "
                                     "decided a firing"])
        (pytester.path / "test_two.py").unlink()
        pytester.makepyfile(test_one=GAP_ONE)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *LEAN, "-n", "2",
                                               "--schedule-coverage-fail")
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*late.trigger.all[[]1[]] (start = *): window never entered",
                                     "failing the session: --schedule-coverage-fail"])

    def test_without_xdist_loaded_the_plugin_works(self, pytester: pytest.Pytester) -> None:
        """``-p no:xdist``: the xdist hook is not registered (it would be unknown)."""
        pytester.makepyfile(test_one=GAP_ONE)
        result = pytester.runpytest("-p", "no:cacheprovider", *LEAN, "-p", "no:xdist",
                                    "--schedule-coverage")
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines(["*late.trigger.all[[]1[]] (start = *): window never entered"])

    def test_a_worker_that_sent_nothing_makes_the_report_incomplete(
            self, pytester: pytest.Pytester) -> None:
        """A worker that dies before its session's end sends no records: the report says
        so rather than reading as complete."""
        pytester.makepyfile(test_one='''
import os
def test_dies():
    os._exit(3)
''', test_two=GAP_TWO.replace('"quiet": every("3 steps") | every("6 steps")',
                              '"quiet": every("3 steps")'))
        # xdist gives the dying file to a replacement worker, which dies too: once, not
        # the default 8 times (each a fresh worker process)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *LEAN, "-n", "2",
                                               "--dist", "loadfile", "--max-worker-restart",
                                               "1", "--schedule-coverage")
        result.stdout.fnmatch_lines(["incomplete: xdist worker(s) gw* went down without "
                                     "sending their schedule coverage"])
