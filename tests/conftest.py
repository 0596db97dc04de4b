"""Shared test configuration: a fast hypothesis profile for CI."""

import os

import pytest
import structlog
from hypothesis import HealthCheck, settings

#: s3_endpoint / s3_bucket: a moto S3 server on loopback (tests/s3_server.py); the gpu
#: marker and CI's rule that nothing else skips (tests/no_skips.py)
pytest_plugins = ("s3_server", "no_skips")


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
