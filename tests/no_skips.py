"""CI's rule on skipped tests: only a test marked ``gpu`` may skip, and only without CUDA.

A test marked ``@pytest.mark.gpu`` is skipped where CUDA is not available. With
``SCHEDTRAIN_NO_SKIPS=1`` in the environment (``.ci/run`` sets it) every other skip
fails instead: a test module that ``importorskip``s a broken optional install (the
Lightning, Hugging Face or Ignite suites), a ``skipif`` that holds unexpectedly, a
``pytest.skip()`` in a test. Without the variable a skip is a skip, as a user expects.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

ENV = "SCHEDTRAIN_NO_SKIPS"
GPU_REASON = "needs a CUDA device"
_SKIPPED_FOR_GPU = pytest.StashKey[bool]()


def strict() -> bool:
    """Whether skips other than the GPU one fail (``SCHEDTRAIN_NO_SKIPS`` set, not 0)."""
    return os.environ.get(ENV, "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"gpu: {GPU_REASON}; skipped without one (the one skip {ENV}=1 allows)")


def _cuda() -> bool:
    import torch  # only once a gpu test is collected: collecting others needs no torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu and not _cuda():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=GPU_REASON))
            item.stash[_SKIPPED_FOR_GPU] = True


def _refuse(report: pytest.TestReport | pytest.CollectReport, what: str) -> None:
    longrepr: Any = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = (f"{what} was skipped ({reason}), but with {ENV}=1 only a test marked "
                       "gpu may skip, for want of CUDA: install what it needs, or mark it gpu")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: pytest.TestReport = yield
    if (report.skipped and strict() and not hasattr(report, "wasxfail")
            and not item.stash.get(_SKIPPED_FOR_GPU, False)):
        _refuse(report, item.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    """A module skipped as it is imported (``importorskip`` at its top) fails to collect."""
    report: pytest.CollectReport = yield
    if report.skipped and strict():
        _refuse(report, report.nodeid or "a module")
    return report
