"""A real S3-compatible server for the storage tests: moto's server mode on loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    name = "b-" + "".join(c for c in request.node.name.lower() if c.isalnum())[:40]
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    fs.mkdir(name)
    yield f"s3://{name}", options
    fs.rm(name, recursive=True)
