"""A run's life as one tested machine (issue 42): real runs of a tiny task through random
sequences of start, kill -9 (at a step, inside a save, after a commit, inside a retime's
apply), SIGTERM, SIGUSR1, a cloud notice, a live retime, resumes as is, with a changed
schedule and keep policy (applied, or refused) and a requeue after the end; after each,
the firings, the files kept, the exit code and its line, the files beside the run and the
final weights are checked (tests/life_machine.py). benchmarks/run_life.py runs
hundreds of lifecycles."""

from __future__ import annotations

import life_machine as machine
import pytest
from hypothesis import HealthCheck, Phase, settings
from life_faults import warm_up
from life_runfiles import s3_bucket
from notice_server import NoticeServer

pytestmark = pytest.mark.slow


def test_run_life() -> None:
    warm_up()
    with NoticeServer() as server, s3_bucket() as bucket:
        machine.NOTICE.update(server=server, port=server.port, s3=bucket)
        try:
            test = machine.RunLife.TestCase
            # No shrinking: over real runs it can take minutes; the failure's lifecycle
            # is printed as it happened (benchmarks/run_life.py shrinks).
            test.settings = settings(max_examples=20, stateful_step_count=6, deadline=None,
                                     derandomize=True, database=None, report_multiple_bugs=False,
                                     phases=[Phase.explicit, Phase.generate],
                                     suppress_health_check=list(HealthCheck))
            test("runTest").runTest()
        finally:
            machine.NOTICE.clear()
