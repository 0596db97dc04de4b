"""What a run reads back from an object store: leases and manifests as typed, bounded
records, and a store that refuses connections for a few seconds. S3 is moto's server on
loopback; the outage is a real one (a proxy in front of it that stops listening)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedtrain.checkpoints import lease as lease_module
from schedtrain.checkpoints.format import CheckpointError
from schedtrain.checkpoints.lease import LEASE, Lease
from schedtrain.checkpoints.remote_shards import Remote, read_remote
from schedtrain.checkpoints.storage import FsspecStorage, StorageError, manifest_name
from schedtrain.cli import main

Bucket = tuple[str, dict[str, Any]]
YEAR = 365.25 * 24 * 3600


def _lease(run: str = "/jobs/other", host: str = "node-7", **fields: Any) -> bytes:
    body = {"format": "schedtrain-lease-1", "run": run, "host": host, "pid": 4242,
            "token": "f" * 32, "refreshed": time.time(), **fields}
    return json.dumps(body).encode()


def _put(storage: FsspecStorage, data: bytes) -> None:
    storage.fs.pipe_file(f"{storage.root}/{LEASE}", data)


#: Leases whose time cannot be trusted, as a crafted file or a broken clock leaves them.
UNTRUSTED = {
    "100-years-ahead": _lease(refreshed=time.time() + 100 * YEAR),
    "huge": _lease(refreshed=1e308),
    "nan": _lease().replace(b'"refreshed": ', b'"refreshed": NaN, "x": '),
    "infinity": b'{"format": "schedtrain-lease-1", "run": "/r", "host": "h", "pid": 1, '
                b'"token": "t", "refreshed": Infinity}',
    "negative": _lease(refreshed=-1),
    "text": _lease(refreshed="soon"),
    "newline-host": _lease(host="node-7\nerror: forged line"),
    "missing-token": b'{"format": "schedtrain-lease-1", "run": "/r", "host": "h", '
                     b'"pid": 1, "refreshed": 1.0}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "not-json": b"\xff\xfe",
}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


class TestUntrustedLease:
    """A lease whose time cannot be trusted is watched for the stale time from when
    this process read it: taken over if it stayed the same, else refused with the way
    out; no message holds a control character or says "0 s ago"."""

    @pytest.mark.parametrize("kind", sorted(UNTRUSTED))
    def test_dead_holder_taken_over(self, tmp_path: Path, s3_bucket: Bucket, kind: str
                                    ) -> None:
        """Nobody refreshes it: after watching it for the stale time, the run takes it,
        having said so once in a line without control characters."""
        storage = FsspecStorage(f"{s3_bucket[0]}/{kind}", s3_bucket[1])
        _put(storage, UNTRUSTED[kind])
        lease = Lease(storage, tmp_path / "run", interval=0.02, stale=4)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            start = time.monotonic()
            lease.acquire()
        lease.release()
        assert time.monotonic() - start >= 0.08
        [warning] = [str(w.message) for w in seen]
        assert "taken over if it stays the same" in warning and "\n" not in warning
        assert "error: forged" not in warning.replace("\\x0aerror: forged", "")

    @settings(max_examples=8, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(ahead=st.floats(min_value=61, max_value=1e10))
    def test_live_holder_with_a_clock_ahead_refused(self, tmp_path: Path, s3_bucket: Bucket,
                                                    ahead: float) -> None:
        """A live run whose clock is ahead by more than the skew allowed (it keeps
        refreshing): refused, naming the clocks and how to go on, never "0 s ago"."""
        storage = FsspecStorage(f"{s3_bucket[0]}/ahead", s3_bucket[1])
        storage.remove(LEASE)
        other = Lease(storage, tmp_path / "other", interval=0.01,
                      clock=lambda: time.time() + ahead)
        other.acquire()
        try:
            mine = Lease(storage, tmp_path / "run", interval=0.05, stale=4)
            with warnings.catch_warnings(), pytest.raises(Exception) as info:
                warnings.simplefilter("ignore")
                mine.acquire()
        finally:
            other.release()
        message = str(info.value)
        assert "ahead of this machine's clock" in message and "rewritten" in message
        assert f"delete {LEASE} there" in message and "0 s ago" not in message
        assert "\n" not in message

    def test_fresh_live_lease_refusal_gives_the_way_out(self, tmp_path: Path,
                                                        s3_bucket: Bucket) -> None:
        """An intact live lease: refused by name, with its age, and how to go on."""
        storage = FsspecStorage(f"{s3_bucket[0]}/fresh", s3_bucket[1])
        _put(storage, _lease())
        with pytest.raises(Exception, match=r"refreshed \d+ s ago; if no run uses it any "
                                            r"more, delete .*; else wait for it to end.*"
                                            r"or give each run its own checkpoint_dir"):
            Lease(storage, tmp_path / "run").acquire()


@pytest.mark.usefixtures("aws")
def test_forged_line_in_host_through_train(tmp_path: Path, s3_endpoint: str,
                                           s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A live lease whose host holds a newline and an "error:" line: `train` refuses in
    one error line (the host escaped), exit 2, the way out given."""
    # Watched for 4 x 1 s: a refresh (a put to the server, from a thread of this process)
    # must land in that time on a loaded machine (4 x 0.5 s once failed in a whole-suite
    # run); a change refuses at once, so the longer watch costs nothing when it passes.
    monkeypatch.setattr(lease_module, "INTERVAL", 1.0)
    url, options = f"{s3_bucket[0]}/forged", {"client_kwargs": {"endpoint_url": s3_endpoint}}
    storage = FsspecStorage(url, options)
    stop = threading.Event()

    def refresh() -> None:  # a live holder: its lease changes as it is refreshed
        while not stop.is_set():
            _put(storage, _lease(host="node-7\nerror: forged line"))
            stop.wait(0.02)

    thread = threading.Thread(target=refresh, daemon=True)
    thread.start()
    spec = tmp_path / "job.toml"
    spec.write_text(f'[run]\ntask = "jobs.crash:make_task"\nmax_steps = 2\n'
                    f'checkpoint_dir = "{url}"\nstorage_options = {{ client_kwargs = '
                    f'{{ endpoint_url = "{s3_endpoint}" }} }}\n\n[callbacks.checkpoint]\n'
                    f'type = "ModelSaver"\ntrigger = {{ every = "1 steps" }}\n')
    try:
        code = main(["train", str(spec), "--run-dir", str(tmp_path / "run")])
    finally:
        stop.set()
        thread.join()
    err = capsys.readouterr().err
    assert code == 2, err
    [line] = [x for x in err.splitlines() if x.startswith("error")]
    assert "is in use by the run" in line and "damaged (host: expected a printable" in line
    assert "error: forged" not in err.replace("\\x0aerror: forged", "")
    assert "delete" in err and "Traceback" not in err, err.splitlines()


# -- a store that refuses connections for a while ------------------------------------------


class _Proxy:
    """A TCP proxy on loopback to ``port``; ``refuse(seconds)`` stops listening (new
    connections are refused, open ones reset) and listens again on the same port."""

    def __init__(self, port: int) -> None:
        self.target = port
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._server = self._listen(0)
        self.port = self._server.getsockname()[1]
        self._done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _listen(self, port: int) -> socket.socket:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(64)
        server.settimeout(0.05)
        return server

    def _accept(self) -> None:
        while not self._done.is_set():
            server = self._server
            try:
                client = server.accept()[0]
            except OSError:
                time.sleep(0.01)
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def refuse(self, seconds: float) -> None:
        with self._lock:
            self._server.close()
            for s in self._open:
                s.close()
            self._open.clear()

        def back() -> None:
            time.sleep(seconds)
            self._server = self._listen(self.port)

        threading.Thread(target=back, daemon=True).start()

    def close(self) -> None:
        self._done.set()
        self._server.close()


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[_Proxy]:
    made = _Proxy(int(s3_endpoint.rsplit(":", 1)[1]))
    yield made
    made.close()


def test_store_refusing_for_3_s_is_retried(s3_bucket: Bucket, proxy: _Proxy) -> None:
    """Writes, reads and listings while the endpoint refuses connections for 3 s: each
    is retried with backoff and goes through once it listens again, well inside the
    deadline; one warning says retrying started. A read refused for 1 s (its second
    try, 0.5 s after the first, is refused too) is retried in the same way."""
    url = s3_bucket[0]
    storage = FsspecStorage(f"{url}/ck", {"client_kwargs": {
        "endpoint_url": f"http://127.0.0.1:{proxy.port}"}})
    storage.write("step-00000001.pt", lambda f: f.write(b"one"))
    proxy.refuse(3.0)
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        storage.write("step-00000002.pt", lambda f: f.write(b"two"))
        written = time.monotonic() - start
        assert storage.read("step-00000001.pt") == b"one"
        assert sorted(storage.committed()) == ["step-00000001.pt", "step-00000002.pt"]
    assert 2.5 < written < storage.bound()
    assert len(seen) == 1 and "trying" in str(seen[0].message)
    proxy.refuse(1.0)
    start = time.monotonic()
    assert storage.read("step-00000002.pt") == b"two"
    assert time.monotonic() - start > 0.9


# -- manifests -----------------------------------------------------------------------------


def _manifest(name: str, **entry: Any) -> bytes:
    files = {name: {"size": 3, "blake2b": "0" * 64, **entry}}
    return json.dumps({"format": "schedtrain-manifest-1", "files": files}).encode()


BAD_ENTRIES = [({"size": -1}, "size"), ({"size": 1 << 63}, "size"),
               ({"size": 3.5}, "size"), ({"size": "3"}, "size"), ({"size": True}, "size"),
               ({"blake2b": "zz"}, "blake2b"), ({"blake2b": "0" * 64 + "\n"}, "blake2b")]


@pytest.mark.parametrize(("entry", "field"), BAD_ENTRIES)
def test_manifest_entry_named_by_key_path(s3_bucket: Bucket, entry: dict[str, Any],
                                          field: str) -> None:
    """A one-file checkpoint's manifest entry of the wrong type or out of bounds: the
    read is refused naming the manifest's key path (the checkpoint then skipped)."""
    storage = FsspecStorage(f"{s3_bucket[0]}/one", s3_bucket[1])
    storage.write("step-00000008.pt", lambda f: f.write(b"abc"))
    name = "step-00000008.pt"
    storage.fs.pipe_file(f"{storage.root}/{manifest_name(name)}", _manifest(name, **entry))
    with pytest.raises(StorageError, match=rf"manifest is not a schedtrain-manifest-1 naming "
                                           rf"it \(files\.{name}\.{field}: expected"):
        storage.read(name)


@pytest.mark.parametrize(("entry", "field"), BAD_ENTRIES)
def test_sharded_manifest_entry_named_by_key_path(s3_bucket: Bucket, entry: dict[str, Any],
                                                  field: str) -> None:
    """The same for a sharded checkpoint's manifest (the shard's entry)."""
    storage = FsspecStorage(f"{s3_bucket[0]}/sharded", s3_bucket[1])
    name, shard = "step-00000008.dcp", "step-00000008.dcp/__0_0.distcp"
    body = json.loads(_manifest(shard, **entry))
    body["files"][f"{name}/run.pt"] = {"size": 3, "blake2b": "0" * 64}
    storage.put(manifest_name(name), json.dumps(body).encode())
    with pytest.raises(CheckpointError, match=rf"naming it \(files\.{name}/__0_0\.distcp\."
                                              rf"{field}: expected"):
        read_remote(Remote(storage, name))
