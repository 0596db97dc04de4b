"""Real object-store servers for the storage tests, on loopback: moto's server mode (S3)
and gcp-storage-emulator (Google Cloud Storage's JSON API)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

# gcsfs reads this once, when it is first imported: it must be set before any test of
# the worker imports gcsfs, not when the first gs:// fixture runs. Left on, gcsfs first
# asks a gRPC control plane for a bucket's layout, which the emulator does not serve;
# without a network that lookup waits minutes per bucket (a CI run hung on it).
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fresh_bucket(fs: Any, scheme: str, options: dict[str, Any],
                  request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, Any]]]:
    """A bucket named after the test, made on ``fs`` and removed with all it holds after."""
    name = "t-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40]
    fs.mkdir(name)
    yield f"{scheme}://{name}", options
    fs.rm(name, recursive=True)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The endpoint URL of a moto S3 server on 127.0.0.1 (dummy credentials)."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
              request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh bucket: ``(s3://bucket, storage options)``."""
    import s3fs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    options: dict[str, Any] = {"client_kwargs": {"endpoint_url": s3_endpoint}}
    yield from _fresh_bucket(s3fs.S3FileSystem(**options, skip_instance_cache=True), "s3",
                             options, request)


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """The endpoint URL of a Cloud Storage emulator on 127.0.0.1 (anonymous)."""
    import gcsfs
    from gcp_storage_emulator.server import create_server

    if gcsfs.GCSFileSystem.__name__ != "GCSFileSystem":  # its experimental subclass
        pytest.fail("gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false")
    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def gcs_bucket(gcs_endpoint: str, request: pytest.FixtureRequest
               ) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh bucket: ``(gs://bucket, storage options)``."""
    import gcsfs

    options: dict[str, Any] = {"endpoint_url": gcs_endpoint, "token": "anon",
                               "project": "schedtrain-tests"}
    yield from _fresh_bucket(gcsfs.GCSFileSystem(**options, skip_instance_cache=True), "gs",
                             options, request)


@pytest.fixture(params=["s3", "gs"])
def object_bucket(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """A fresh bucket on each object store's server: ``(URL, storage options)``."""
    bucket: tuple[str, dict[str, Any]] = request.getfixturevalue(
        "s3_bucket" if request.param == "s3" else "gcs_bucket")
    return bucket
