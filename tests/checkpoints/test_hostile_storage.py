"""Hostile input to checkpoint storage URLs: crafted manifests (deep, huge, wrong types,
truncated) and checkpoint contents, endpoints that never answer or refuse, two runs
writing one bucket prefix, credentials and bad URLs in `checkpoint_dir`. Each ends in a
clear line, exit 2 (bad input) or 1 (a store that fails), or a clean resume, and changes
no file outside the run. S3 is moto's server on loopback; the other endpoints are local
sockets this module opens."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schedtrain.checkpoints import storage as storage_module
from schedtrain.checkpoints.format import ALGORITHM, FORMAT, CheckpointError
from schedtrain.checkpoints.lease import LEASE, Lease
from schedtrain.checkpoints.mount import Mount
from schedtrain.checkpoints.storage import FsspecStorage, StorageError, manifest_name
from schedtrain.checkpoints.store import checkpoint_body, read_stored, stored_newest_valid
from schedtrain.cli import main
from schedtrain.urls import redact, redact_text, url_problem

Bucket = tuple[str, dict[str, Any]]
SECRET = "SeCrEt+pa/ss"

SPEC = """\
[run]
task = "jobs.crash:make_task"
max_steps = {steps}
seed = 3
checkpoint_dir = "{url}"
storage_options = {options}

[callbacks.checkpoint]
type = "ModelSaver"
keep = 3
trigger = {{ every = "{every} steps" }}
"""


def _toml(value: Any) -> str:
    """A TOML inline value of plain data."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def _spec(folder: Path, url: str, options: dict[str, Any], *, steps: int = 8,
          every: int = 4) -> Path:
    path = folder / "job.toml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(SPEC.format(steps=steps, url=url, options=_toml(options), every=every))
    return path


def _train(capsys: pytest.CaptureFixture[str], spec: Path, run_dir: Path, *args: str
           ) -> tuple[int, str]:
    code = main(["train", str(spec), "--run-dir", str(run_dir), *args])
    return code, capsys.readouterr().err


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error")]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tries of each storage operation, 0.05 s apart: a failing store fails fast."""
    monkeypatch.setattr(storage_module, "ATTEMPTS", 2)
    monkeypatch.setattr(storage_module, "BACKOFF", 0.05)


@pytest.fixture
def blackhole() -> Iterator[str]:
    """The URL of a server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.02)  # the fixture's end waits for the next look at `done`
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    done.set()
    thread.join(timeout=2)
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def refusing() -> str:
    """The URL of a port on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


#: The per-try timeout of ``_quick_options`` (connect + read), which every try at an
#: endpoint that never answers waits in full: short, as a user may set it.
QUICK = 0.5


def _quick_options(endpoint: str) -> dict[str, Any]:
    """An endpoint with 0.25 s connect and read timeouts (set in storage_options)."""
    return {"client_kwargs": {"endpoint_url": endpoint},
            "config_kwargs": {"connect_timeout": QUICK / 2, "read_timeout": QUICK / 2}}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


# -- URLs --------------------------------------------------------------------------------


class TestUrls:
    """Which URLs `check` takes, and that a URL's credentials are never shown."""

    @pytest.mark.parametrize(("url", "why"), [
        ("s3://", "names no bucket"), ("s3:///ck", "names no bucket"),
        ("gs://", "names no bucket"), ("memory://ck", "memory"),
        ("file://../..", "relative file://"), ("file://ck", "relative file://"),
        (f"s3://AKIAKEY:{SECRET}@bucket/ck", "credentials"),
        (f"http://user:{SECRET}@host/ck", "credentials"),
    ])
    def test_check_refuses_by_key_path(self, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch, url: str, why: str
                                       ) -> None:
        """check and train exit 2 with one line at run.checkpoint_dir saying why; no
        secret is printed, nothing is written (no folder named 's3:' either)."""
        monkeypatch.chdir(tmp_path)
        spec = _spec(tmp_path / "spec", url, {})
        before = _tree(tmp_path)
        assert main(["check", str(spec)]) == 2
        err = capsys.readouterr().err
        lines = _error_lines(err)
        assert len(lines) == 1 and "run.checkpoint_dir" in lines[0] and why in lines[0]
        assert SECRET not in err and "SeCrEt" not in err
        if why == "credentials":
            assert "storage_options" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0]
        code, err = _train(capsys, spec, tmp_path / "run")
        assert code == 2 and "run.checkpoint_dir" in err and "SeCrEt" not in err
        assert "Traceback" not in err
        assert _tree(tmp_path) == before
        assert not (tmp_path / "s3:").exists()

    @pytest.mark.parametrize("url", ["/abs/ck", "ck", "file:///abs/ck", "s3://bucket/ck",
                                     "gs://bucket/a/b", "s3://bucket/v@1"])
    def test_good_urls_pass(self, url: str) -> None:
        assert url_problem(url) is None and redact(url) == url

    @settings(max_examples=150, deadline=None)
    @given(scheme=st.sampled_from(["s3", "gs", "http", "https", "s3a"]),
           user=st.text(st.characters(whitelist_categories=("L", "N")), min_size=1,
                        max_size=12),
           password=st.text(st.characters(blacklist_characters="@'\"",
                                          blacklist_categories=("Z", "C")),
                            max_size=40).map(lambda p: f"Pw{p}Zz"),
           host=st.from_regex(r"[a-z][a-z0-9.-]{0,20}", fullmatch=True),
           path=st.from_regex(r"(/[a-z0-9_.-]{1,8}){0,3}", fullmatch=True))
    def test_credentials_never_shown(self, scheme: str, user: str, password: str, host: str,
                                     path: str) -> None:
        """Any user:password@ in a URL: refused, and redacted in the URL, in any text
        holding it, and in the refusal itself."""
        url = f"{scheme}://{user}:{password}@{host}{path}"
        assert redact(url) == f"{scheme}://***@{host}{path}"
        problem = url_problem(url)
        assert problem is not None and "credentials" in problem and password not in problem
        text = redact_text(f"error: write of '{url}' failed; see {url}/x")
        assert password not in text and text.count("***@") == 2


# -- endpoints that fail -----------------------------------------------------------------


@pytest.mark.usefixtures("fast", "aws")
class TestFailingEndpoints:
    """A store that never answers, or refuses: one line naming the URL and the cause,
    exit 1, at every way in; the run's own files only."""

    def test_blackhole_at_start(self, tmp_path: Path, blackhole: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
        """A fresh run: the first request times out (the deadline is the overridden
        timeouts), one warning says retrying starts, then one error line."""
        spec = _spec(tmp_path, "s3://bucket/job/ck", _quick_options(blackhole))
        code, err = _train(capsys, spec, tmp_path / "run")
        assert code == 1
        [line] = _error_lines(err)
        assert "'s3://bucket/job/ck" in line and "failed after 2 attempts" in line
        assert f"no answer within {QUICK:g} s" in line
        retrying = [x for x in err.splitlines() if "more times" in x]
        assert len(retrying) == 1 and "StorageWarning" in retrying[0]
        assert {k for k in _tree(tmp_path) if not k.startswith("run/")} == {"job.toml"}

    def test_blackhole_at_resume_listing(self, tmp_path: Path, blackhole: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
        """--resume auto lists the folder first: it fails the same way."""
        spec = _spec(tmp_path, "s3://bucket/job/ck", _quick_options(blackhole))
        code, err = _train(capsys, spec, tmp_path / "run", "--resume", "auto")
        assert code == 1
        [line] = _error_lines(err)
        assert "'s3://bucket/job/ck" in line and "list failed after 2 attempts" in line

    def test_blackhole_at_save(self, blackhole: str) -> None:
        """A checkpoint write to a store that stops answering fails by its URL."""
        store = FsspecStorage("s3://bucket/job/ck", _quick_options(blackhole))
        assert store.timeout == QUICK
        with pytest.raises(StorageError, match=r"step-00000004\.pt'.* failed after 2 "
                                               rf"attempts .*no answer within {QUICK:g} s"):
            store.write("step-00000004.pt", lambda f: f.write(b"x"))

    def test_refused_with_credentials_in_endpoint(self, tmp_path: Path, refusing: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
        """An endpoint URL holding user:password that refuses connections: the error
        line names the store, and no secret reaches the terminal, run.json, events.jsonl
        or traceback.txt."""
        endpoint = refusing.replace("http://", f"http://user:{SECRET}@")
        spec = _spec(tmp_path, "s3://bucket/job/ck", _quick_options(endpoint))
        code, err = _train(capsys, spec, tmp_path / "run")
        assert code == 1
        [line] = _error_lines(err)
        assert "'s3://bucket/job/ck" in line
        assert "SeCrEt" not in err
        for name, data in _tree(tmp_path / "run").items():
            assert b"SeCrEt" not in data, name

    def test_default_bound(self) -> None:
        """Without options: 5 tries of 10 s (3 s connect + 7 s read) and 7.5 s of
        backoff, the documented 57.5 s bound."""
        store = FsspecStorage("s3://bucket/ck", {}, attempts=5, backoff=0.5)
        assert store.timeout == 10.0 and store.bound() == 57.5


# -- crafted manifests and checkpoints ---------------------------------------------------


def _checkpoint(step: int) -> bytes:
    body = checkpoint_body({"step": step, "phase": "step_end", "run": {}, "finite": True,
                            "w": torch.tensor([float(step)])}, "x")
    buffer = io.BytesIO()
    torch.save(body, buffer)
    return buffer.getvalue()


def _text(value: str) -> bytes:
    """A pickled string (BINUNICODE)."""
    return b"X" + len(value.encode()).to_bytes(4, "little") + value.encode()


def _deep_pickle(depth: int) -> bytes:
    """A checkpoint whose content nests ``depth`` lists deep, as a crafted file could:
    written opcode by opcode (pickling it would recurse), in torch's zip layout. It
    carries a well-formed checksum, so reading it gets as far as hashing the content."""
    plain = io.BytesIO()
    torch.save({"format": FORMAT, "x": 0}, plain)
    source = zipfile.ZipFile(io.BytesIO(plain.getvalue()))
    checksum = (b"}(" + _text("algorithm") + _text(ALGORITHM) + _text("digest")
                + _text("0" * 64) + b"u")
    data = (b"\x80\x02}(" + _text("format") + _text(FORMAT) + _text("checksum") + checksum
            + _text("x") + b"]" * depth + b"a" * (depth - 1) + b"u.")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            content = data if info.filename.endswith("data.pkl") else source.read(info)
            target.writestr(info, content)
    return out.getvalue()


CRAFTED = {
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "huge": json.dumps({"format": "schedtrain-manifest-1", "pad": "x" * 200_000}).encode(),
    "huge-number": b'{"format": "schedtrain-manifest-1", "files": {"step-00000008.pt": '
                   b'{"size": ' + b"9" * 5001 + b', "blake2b": "00"}}}',
    "size-text": b'{"format": "schedtrain-manifest-1", "files": {"step-00000008.pt": '
                 b'{"size": "12", "blake2b": "00"}}}',
    "size-bool": b'{"format": "schedtrain-manifest-1", "files": {"step-00000008.pt": '
                 b'{"size": true, "blake2b": "00"}}}',
    "files-list": b'{"format": "schedtrain-manifest-1", "files": ["step-00000008.pt"]}',
    "digest-number": b'{"format": "schedtrain-manifest-1", "files": {"step-00000008.pt": '
                     b'{"size": 1, "blake2b": 5}}}',
    "not-utf8": b"\xff\xfe\x00",
    "truncated": b'{"format": "schedtrain-manifest-1", "files": {"step-000',
}


class TestCraftedManifests:
    """Any manifest that does not parse, and any checkpoint whose content cannot be
    walked, is damage: skipped by URL, the previous good checkpoint resumed."""

    def test_skipped_for_the_previous(self, s3_bucket: Bucket) -> None:
        """Each crafted manifest (its own folder of one bucket): read refuses it as not
        a manifest, and the newest valid checkpoint is the one before."""
        url, options = s3_bucket
        for kind, crafted in CRAFTED.items():
            store = FsspecStorage(f"{url}/{kind}", options)
            for step in (4, 8):
                data = _checkpoint(step)
                store.write(f"step-{step:08d}.pt", lambda f, d=data: f.write(d))
            store.fs.pipe_file(f"{store.root}/{manifest_name('step-00000008.pt')}", crafted)
            with pytest.raises(StorageError, match="manifest is not a schedtrain-manifest-1"):
                store.read("step-00000008.pt")
            skipped: list[tuple[Path, str]] = []
            found = stored_newest_valid(store, Path("ck"),
                                        lambda p, why, s=skipped: s.append((p, why)))
            assert found == Path("ck/step-00000004.pt"), kind
            assert [p.name for p, _ in skipped] == ["step-00000008.pt"], kind

    def test_deep_checkpoint_content(self, s3_bucket: Bucket) -> None:
        """A committed checkpoint whose content nests 100,000 lists deep: a
        CheckpointError naming its URL, not a RecursionError."""
        url, options = s3_bucket
        store = FsspecStorage(f"{url}/deep", options)
        data = _deep_pickle(100_000)
        store.write("step-00000008.pt", lambda f: f.write(data))
        with pytest.raises(CheckpointError, match=r"step-00000008\.pt'.*corrupt"):
            read_stored(store, "step-00000008.pt")


@pytest.mark.usefixtures("aws")
class TestResumeFromBucket:
    """End to end through `schedtrain train` on moto."""

    def test_deep_manifest_skipped_resume_and_lines(self, tmp_path: Path, s3_endpoint: str,
                                                    s3_bucket: Bucket,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
        """The newest manifest made 100,000 deep: --resume auto skips it by URL and
        resumes from the one before, saying so in one plain line (D13); a changed
        schedule's refusal names the checkpoint by its URL (D12)."""
        url = f"{s3_bucket[0]}/job/ck"
        options = {"client_kwargs": {"endpoint_url": s3_endpoint}}
        run_dir = tmp_path / "run"
        code, err = _train(capsys, _spec(tmp_path / "a", url, options), run_dir)
        assert code == 0, err
        store = FsspecStorage(url, options)
        assert sorted(store.committed()) == ["step-00000004.pt", "step-00000008.pt"]
        # The schedule changed: refused, naming the checkpoint where it is.
        changed = _spec(tmp_path / "b", url, options, steps=12, every=3)
        code, err = _train(capsys, changed, run_dir, "--resume", "auto")
        assert code == 2
        assert f"checkpoint '{url}/step-00000008.pt' was saved with another schedule" in err
        assert "ck/step-" not in err.replace(url, "")
        store.fs.pipe_file(f"{store.root}/step-00000008.manifest.json", CRAFTED["deep"])
        longer = _spec(tmp_path / "c", url, options, steps=12)
        code, err = _train(capsys, longer, run_dir, "--resume", "auto")
        assert code == 0, err
        assert f"{url}/step-00000008.pt" in err and "manifest is not a" in err
        assert f"resumed from {url}/step-00000004.pt at step 4\n" in err
        assert "[warning" not in "".join(x for x in err.splitlines() if "resumed" in x)
        assert sorted(store.committed()) == ["step-00000004.pt", "step-00000008.pt",
                                             "step-00000012.pt"]


# -- two writers -------------------------------------------------------------------------


@pytest.mark.usefixtures("aws")
class TestTwoWriters:
    """One object-store folder, one live writer: the local .lock rule, in the bucket."""

    def _live(self, url: str, options: dict[str, Any], run_dir: Path, **kw: Any) -> Lease:
        lease = Lease(FsspecStorage(url, options), run_dir, **kw)
        lease.acquire()
        lease._stop.set()  # held, not refreshed by a thread: the test decides its time
        return lease

    @pytest.mark.parametrize("how", [(), ("--resume", "auto"), ("--overwrite",)])
    def test_second_live_writer_refused(self, tmp_path: Path, s3_endpoint: str,
                                        s3_bucket: Bucket, capsys: pytest.CaptureFixture[str],
                                        how: tuple[str, ...]) -> None:
        """Another live run's lease: refused in one line naming it (exit 2), whether
        fresh, resuming or overwriting; its lease and checkpoint stay untouched."""
        url = f"{s3_bucket[0]}/shared"
        options = {"client_kwargs": {"endpoint_url": s3_endpoint}}
        other = self._live(url, options, tmp_path / "other-run")
        store = FsspecStorage(url, options)
        theirs = _checkpoint(4)
        store.write("step-00000004.pt", lambda f: f.write(theirs))
        store.fs.pipe_file(f"{store.root}/step-00000006.pt", b"their write in flight")
        lease_before = store.get(LEASE, 1 << 16)
        code, err = _train(capsys, _spec(tmp_path, url, options), tmp_path / "run", *how)
        assert code == 2, err
        [line] = _error_lines(err)
        assert "is in use by the run in" in line and "other-run" in line
        assert store.get(LEASE, 1 << 16) == lease_before
        assert store.committed() == ["step-00000004.pt"]
        assert store.read("step-00000004.pt") == theirs
        assert store.fs.cat_file(f"{store.root}/step-00000006.pt") == b"their write in flight"
        other.release()
        assert store.get(LEASE, 1 << 16) is None

    def test_stale_or_own_lease_taken_over(self, tmp_path: Path, s3_endpoint: str,
                                           s3_bucket: Bucket,
                                           capsys: pytest.CaptureFixture[str]) -> None:
        """A lease not refreshed for its stale time is taken over, as is one naming this
        run directory on this host (its holder is gone: the .lock is ours); the run's
        lease is deleted when it ends."""
        url = f"{s3_bucket[0]}/taken"
        options = {"client_kwargs": {"endpoint_url": s3_endpoint}}
        store = FsspecStorage(url, options)
        self._live(url, options, tmp_path / "other", clock=lambda: time.time() - 10_000)
        spec = _spec(tmp_path, url, options, steps=4)
        code, err = _train(capsys, spec, tmp_path / "run")
        assert code == 0, err
        assert store.get(LEASE, 1 << 16) is None
        self._live(url, options, tmp_path / "run")  # as a kill -9 leaves it
        longer = _spec(tmp_path / "b", url, options, steps=8)
        code, err = _train(capsys, longer, tmp_path / "run", "--resume", "auto")
        assert code == 0, err
        assert store.get(LEASE, 1 << 16) is None

    def test_refreshed_and_lost(self, tmp_path: Path, s3_bucket: Bucket) -> None:
        """A live lease is refreshed on its interval; one another run took over stops
        this run's writes with a line saying so."""
        url = f"{s3_bucket[0]}/refresh"
        storage = FsspecStorage(url, s3_bucket[1])
        lease = Lease(storage, tmp_path / "run", interval=0.05)
        lease.acquire()
        first = lease.held()
        assert first is not None and first.run == str((tmp_path / "run").resolve())
        for _ in range(400):  # until the thread wrote it again
            now = lease.held()
            if now is not None and now.refreshed != first.refreshed:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the lease was never refreshed")
        lease.release()
        intruder = self._live(url, s3_bucket[1], tmp_path / "other")
        lease.refresh()
        assert lease.lost is not None and "other" in lease.lost
        mount = Mount(storage, tmp_path / "run", chief=True)
        mount.lease = lease
        with pytest.raises(StorageError, match="took the lease"):
            mount.write({"step": 1}, tmp_path / "run" / "checkpoints" / "step-00000001.pt")
        assert storage.committed() == []
        assert intruder.held() is not None
