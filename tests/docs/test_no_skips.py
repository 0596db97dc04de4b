"""``SCHEDTRAIN_NO_SKIPS=1`` (set by ``.ci/run``): a skip for any reason but a missing GPU
fails, so a broken optional install cannot silently drop a suite (tests/no_skips.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest_plugins = ("pytester",)

#: One of each kind of skip, and a test marked gpu that needs no device to pass.
SKIPS = '''
import pytest

def test_import_or_skip():
    pytest.importorskip("no_such_module_for_schedtrain")

@pytest.mark.skipif(True, reason="an optional install is broken")
def test_skipif():
    pass

def test_skip_in_the_body():
    pytest.skip("the data set is missing")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_expected_failure():
    assert False

def test_plain():
    pass

@pytest.mark.gpu
def test_on_the_gpu():
    pass
'''

#: A module skipped whole as it is imported, as the hosts' suites do.
MODULE_SKIP = '''
import pytest

pytest.importorskip("no_such_host_for_schedtrain")

def test_never_collected():
    pass
'''


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project loading the plugin, on a machine without CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pytester.makeconftest('pytest_plugins = ("no_skips",)\n')
    pytester.makepyfile(test_skips=SKIPS)
    return pytester


def test_without_the_variable_a_skip_is_a_skip(project: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's run (no variable, or 0): skips are skips and the session passes."""
    for value in (None, "0"):
        if value is None:
            monkeypatch.delenv("SCHEDTRAIN_NO_SKIPS", raising=False)
        else:
            monkeypatch.setenv("SCHEDTRAIN_NO_SKIPS", value)
        result = project.runpytest("-p", "no:cacheprovider", "--strict-markers")
        result.assert_outcomes(passed=1, skipped=4, xfailed=1)


def test_with_it_only_the_gpu_skip_passes(project: pytest.Pytester,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every skip but the gpu-marked test's fails, naming the test, why it skipped and the
    variable; an expected failure stays one."""
    monkeypatch.setenv("SCHEDTRAIN_NO_SKIPS", "1")
    result = project.runpytest("-p", "no:cacheprovider", "--strict-markers", "-rs")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, failed=2, errors=1)  # skipif: at setup
    out = result.stdout.str()
    for test, reason in [("test_import_or_skip", "could not import "
                          "'no_such_module_for_schedtrain'"),
                         ("test_skipif", "an optional install is broken"),
                         ("test_skip_in_the_body", "the data set is missing")]:
        assert re.search(rf"test_skips.py::{test} was skipped \(.*{re.escape(reason)}", out)
    assert out.count("with SCHEDTRAIN_NO_SKIPS=1 only a test marked gpu may skip") >= 3
    result.stdout.fnmatch_lines(["SKIPPED *test_skips.py:* needs a CUDA device"])


def test_a_module_skipped_on_import_fails_to_collect(project: pytest.Pytester,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite whose host is not installed is a collection error, not a quiet skip."""
    project.makepyfile(test_host=MODULE_SKIP)
    monkeypatch.setenv("SCHEDTRAIN_NO_SKIPS", "1")
    result = project.runpytest("-p", "no:cacheprovider", "test_host.py")
    assert result.ret == pytest.ExitCode.INTERRUPTED  # collection errors stop the session
    result.stdout.fnmatch_lines(["*test_host.py was skipped (*no_such_host_for_schedtrain*"])
    monkeypatch.delenv("SCHEDTRAIN_NO_SKIPS")
    project.runpytest("-p", "no:cacheprovider", "test_host.py").assert_outcomes(skipped=1)


def test_with_cuda_a_gpu_test_runs_and_may_not_skip(project: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Where CUDA is available a gpu test runs; skipped there for another reason, it fails."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("SCHEDTRAIN_NO_SKIPS", "1")
    project.makepyfile(test_gpu_skip='''
import pytest

@pytest.mark.gpu
def test_needs_a_package_too():
    pytest.importorskip("no_such_gpu_package_for_schedtrain")
''')
    result = project.runpytest("-p", "no:cacheprovider", "-k", "gpu")
    result.assert_outcomes(passed=1, failed=1)


def test_gpu_tests_use_the_marker() -> None:
    """No test spells its own CUDA skip: the marker is how the allowed skip is known."""
    tests = Path(__file__).resolve().parents[1]
    own = [p.name for p in sorted(tests.rglob("test_*.py"))
           if re.search(r"skipif\(\s*not torch\.cuda\.is_available\(\)", p.read_text())]
    assert own == []
