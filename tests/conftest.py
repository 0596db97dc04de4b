"""Shared test configuration: helper modules importable from every test folder, and a
fast hypothesis profile for CI."""

import os
import sys
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, settings

# Test files live in one folder per package (tests/core/, tests/training/, ...); the helper
# modules (training_helpers, strategies, oracle, jobs/, ...) stay here, imported by their
# bare name from any folder. pytest's default import mode puts this folder on sys.path
# too, but only because it has no __init__.py; saying it here keeps the helpers
# importable under any import mode. Test folders have no __init__.py either, so every
# test file's basename is unique (tests/docs/test_layout.py checks that).
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

#: s3_endpoint / s3_bucket: a moto S3 server on loopback (tests/s3_server.py); the gpu
#: marker and CI's rule that nothing else skips (tests/no_skips.py); the `project` of
#: the first-day tests, a folder with a small task module (tests/first_day_project.py)
pytest_plugins = ("s3_server", "no_skips", "first_day_project")


#: Folders whose every test starts real training processes (two ranks, or a run's whole
#: life): marked ``slow`` as a whole, so the fast tier (``-m "not slow"``,
#: CONTRIBUTING.md) leaves them out. Elsewhere a test says ``slow`` itself.
SLOW_FOLDERS = ("distributed", "lifecycle")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name in SLOW_FOLDERS and item.path.parent.parent == Path(_TESTS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _reset_structlog():
    """The CLI configures structlog globally; keep one test's setup out of the next."""
    yield
    structlog.reset_defaults()


settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
