"""The persisted-state fuzzer over a run whose checkpoints live in an S3 bucket (issue 41):
the fixture (a real run preempted mid-way, its checkpoints on a moto server on loopback,
the lease a run killed at that point would leave), the walk of every object of its
bucket prefix (checkpoints, their manifests, the lease) with fuzz_mutations' mutations,
and a resume of a mutated copy judged by fuzz_runs' oracle, plus the bucket's weights.
tests/checkpoints/test_state_fuzz_s3.py and benchmarks/fuzz_state_s3.py drive."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
from fuzz_mutations import FILES, Mutation, Site, apply, mutations
from fuzz_runs import (
    Outcome,
    Reference,
    final_weights,
    judge,
    log_lines,
    outside_snapshot,
    run_cli,
)
from jobs.fuzz import FIXTURE

from schedtrain.checkpoints import lease as lease_module
from schedtrain.checkpoints.lease import LEASE

#: The run: the crash job (Adam, dropout, shuffled data), one epoch of 64 steps, its
#: checkpoints in the bucket every 8 steps (kept: the latest 2 and every 16th step),
#: preempted (SIGTERM) at step 30. Every 8, not 4: each case's resume writes 5, not 9.
SPEC = """\
[run]
task = "jobs.crash:make_task"
max_epochs = 1
seed = 3
checkpoint_dir = "{url}"
storage_options = {{ client_kwargs = {{ endpoint_url = "{endpoint}" }} }}

[callbacks.preempt]
type = "jobs.fuzz:Preempt"
trigger = {{ at = "30 steps" }}

[callbacks.validate]
type = "InferenceRunner"
trigger = {{ every = "16 steps" }}

[callbacks.checkpoint]
type = "ModelSaver"
keep = {{ any = [{{ latest = 2 }}, {{ every = "16 steps" }}] }}
trigger = {{ any = [{{ every = "8 steps" }}, {{ on = "train_end" }}] }}
"""
BUCKET = "fuzz-s3"
#: The lease's refresh interval in the fuzz runs (forked children inherit it): a
#: damaged lease is watched STALE x this long before it is taken over, not 2 minutes.
LEASE_INTERVAL = 0.25
#: Mutations of an object as a whole: what a store can hold in its place (no FIFO,
#: directory or symlink there), and the object gone.
OBJECTS = ("empty", "garbage")
DELETED = "deleted"
#: Outcomes that pass: fuzz_runs' three, and a damaged lease watched for the stale time
#: and then taken over (the run's result otherwise the intact resume's).
PASSES = ("identical", "passed over", "refused", "watched, taken over")
#: What the library says while it watches an untrusted lease.
WATCHED = "taken over if it stays the same"


def use_endpoint(endpoint: str) -> None:
    """Dummy credentials for the moto server, and a short lease interval, in this
    process's environment (every forked resume inherits both); s3fs imported here once,
    not in each resume (importing it creates no event-loop thread to fork)."""
    import s3fs  # noqa: F401

    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    setattr(lease_module, "INTERVAL", LEASE_INTERVAL)  # noqa: B010 (a Final, shortened)


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for a script (the tests use tests/s3_server.py)."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


class Bucket:
    """The fuzzer's bucket on the moto server, through boto3 (synchronous: no event-loop
    thread in the process that forks the resumes)."""

    def __init__(self, endpoint: str, name: str = BUCKET) -> None:
        import boto3

        self.endpoint, self.name = endpoint, name
        self.client: Any = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing")
        with contextlib.suppress(self.client.exceptions.BucketAlreadyOwnedByYou):
            self.client.create_bucket(Bucket=name)

    def url(self, prefix: str) -> str:
        return f"s3://{self.name}/{prefix}"

    def names(self, prefix: str) -> list[str]:
        """The objects under ``prefix``, by their names relative to it."""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=f"{prefix}/"):
            out += [o["Key"][len(prefix) + 1:] for o in page.get("Contents", [])]
        return sorted(out)

    def tags(self, prefix: str) -> dict[str, str]:
        """Each object under ``prefix`` by its ETag: what a case must leave as it was."""
        out: dict[str, str] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=f"{prefix}/"):
            out |= {o["Key"]: o["ETag"] for o in page.get("Contents", [])}
        return out

    def get(self, prefix: str, name: str) -> bytes:
        body = self.client.get_object(Bucket=self.name, Key=f"{prefix}/{name}")["Body"]
        return bytes(body.read())

    def put(self, prefix: str, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=f"{prefix}/{name}", Body=data)

    def delete(self, prefix: str, name: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=f"{prefix}/{name}")

    def copy(self, source: str, to: str) -> None:
        """Every object under prefix ``source`` to prefix ``to``."""
        for name in self.names(source):
            self.client.copy_object(Bucket=self.name, Key=f"{to}/{name}",
                                    CopySource={"Bucket": self.name,
                                                "Key": f"{source}/{name}"})


@attrs.frozen
class Fixture:
    """The fixture case folder (``job.toml``, ``outside.txt``, ``run/``) and the bucket
    prefix its checkpoints are in."""

    folder: Path
    prefix: str


def _write_spec(folder: Path, bucket: Bucket, prefix: str) -> None:
    (folder / "job.toml").write_text(SPEC.format(url=bucket.url(prefix),
                                                 endpoint=bucket.endpoint))


def train_argv(case: Path) -> list[str]:
    return ["train", str(case / "job.toml"), "--run-dir", str(case / "run"),
            "--resume", "auto"]


def _leave_lease(bucket: Bucket, prefix: str, run_dir: Path) -> None:
    """The lease of ``run_dir``'s run on this host as a run killed now leaves it (the
    preempted run deleted its own as it ended)."""
    body = {"format": "schedtrain-lease-1", "run": str(run_dir.resolve()),
            "host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
            "refreshed": time.time()}
    bucket.put(prefix, LEASE, json.dumps(body, indent=1).encode())


def make_fixture(folder: Path, bucket: Bucket, prefix: str = "fixture/ck") -> Fixture:
    """The run preempted at step 30, its checkpoints under ``prefix``, a lease left."""
    folder.mkdir(parents=True)
    _write_spec(folder, bucket, prefix)
    (folder / "outside.txt").write_text("a user's notes\n")
    got = run_cli(train_argv(folder), folder, deadline=300, env={FIXTURE: "1"})
    if got.code != 75:
        raise AssertionError(f"the fixture run was not preempted (exit {got.code}):\n"
                             f"{got.stderr[-3000:]}")
    _leave_lease(bucket, prefix, folder / "run")
    return Fixture(folder, prefix)


def copy_case(fixture: Fixture, bucket: Bucket, to: Path, prefix: str) -> None:
    """The fixture's folder at ``to`` and its objects at ``prefix``, every mention of the
    old URL (the spec, run.json, the log) and the lease's run directory pointed there."""
    shutil.copytree(fixture.folder, to, symlinks=True)
    old, new = bucket.url(fixture.prefix), bucket.url(prefix)
    for path in [to / "job.toml", *(p for p in (to / "run").rglob("*") if p.is_file())]:
        with contextlib.suppress(UnicodeDecodeError):
            text = path.read_text()
            if old in text:
                path.write_text(text.replace(old, new))
    bucket.copy(fixture.prefix, prefix)
    if LEASE in bucket.names(prefix):
        body = json.loads(bucket.get(prefix, LEASE))
        body["run"] = str((to / "run").resolve())
        bucket.put(prefix, LEASE, json.dumps(body, indent=1).encode())


def download(bucket: Bucket, prefix: str, to: Path) -> Path:
    """Every object under ``prefix`` as a file under ``to``."""
    for name in bucket.names(prefix):
        path = to / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bucket.get(prefix, name))
    return to


def object_mutations(fixture: Fixture, bucket: Bucket) -> list[Mutation]:
    """Every mutation of every leaf, table and object of the fixture's prefix: the walk
    of fuzz_mutations over a download of it, the object-level ones a store can hold."""
    with tempfile.TemporaryDirectory() as tmp:
        every = mutations(download(bucket, fixture.prefix, Path(tmp)))
    out = [m for m in every if m.kind not in FILES or m.kind in OBJECTS]
    out += [Mutation(Site(name, None, ()), DELETED) for name in bucket.names(fixture.prefix)]
    return out


def _manifest(name: str, data: bytes) -> bytes:
    """The manifest committing checkpoint ``name`` holding ``data``, as the library
    writes it."""
    return json.dumps({"format": "schedtrain-manifest-1", "files": {name: {
        "size": len(data), "blake2b": hashlib.blake2b(data, digest_size=32).hexdigest()}}}
    ).encode()


def apply_object(mutation: Mutation, bucket: Bucket, prefix: str, work: Path) -> None:
    """Write ``mutation`` into the object it names under ``prefix`` (``work``: a scratch
    folder). A mutated checkpoint keeps a valid checksum and gets a manifest matching its
    new bytes, so the resume reads what was crafted. Raises where the value cannot be
    written in that object's format."""
    name = mutation.site.file
    if mutation.kind == DELETED:
        bucket.delete(prefix, name)
        return
    work.mkdir(parents=True, exist_ok=True)
    (work / name).write_bytes(bucket.get(prefix, name))
    apply(mutation, work, work.parent / "elsewhere")
    data = (work / name).read_bytes()
    bucket.put(prefix, name, data)
    if name.endswith(".pt") and mutation.kind not in OBJECTS:
        bucket.put(prefix, name.removesuffix(".pt") + ".manifest.json", _manifest(name, data))


def bucket_weights(bucket: Bucket, prefix: str) -> str:
    """A digest of the model the train_end checkpoint under ``prefix`` holds."""
    for name in reversed(bucket.names(prefix)):
        if not (name.startswith("step-") and name.endswith(".pt")):
            continue
        with contextlib.suppress(Exception):
            state = torch.load(io.BytesIO(bucket.get(prefix, name)), weights_only=True)
            if state.get("phase") == "train_end":
                h = hashlib.sha256()
                for key, value in sorted(state["model"].items()):
                    h.update(key.encode())
                    h.update(value.numpy().tobytes())
                return h.hexdigest()
    return "no train_end checkpoint"


@attrs.frozen
class S3Reference:
    """The intact resume's result: fuzz_runs' reference (its log) and the weights of its
    train_end checkpoint in the bucket."""

    ref: Reference
    weights: str


def reference(fixture: Fixture, bucket: Bucket, to: Path, prefix: str = "reference/ck"
              ) -> S3Reference:
    """Resume an intact copy of ``fixture`` to its end."""
    copy_case(fixture, bucket, to, prefix)
    got = run_cli(train_argv(to), to)
    assert got.code == 0, got.stderr[-3000:]
    return S3Reference(Reference(final_weights(to), log_lines(to), False, "", to),
                       bucket_weights(bucket, prefix))


def classify(case: Path, ref: S3Reference, outcome: Outcome, mutation: Mutation, *,
             outside: dict[str, bytes], weights: str, fixture_touched: bool
             ) -> tuple[str, str]:
    """fuzz_runs' oracle, with the bucket's weights, the fixture's objects left as they
    were, and a damaged lease watched then taken over as its own passing kind."""
    site = mutation.site
    kind, detail = judge(case, ref.ref, outcome, file=site.file, key=site.key,
                         outside=outside)
    if kind.startswith("FAIL"):
        return kind, detail
    if fixture_touched:
        return "FAIL fixture's objects touched", detail
    if outcome.code != 0:
        return kind, detail
    if weights != ref.weights:
        return "FAIL other weights", detail
    if WATCHED in outcome.stderr:
        return "watched, taken over", detail
    stem = Path(site.file).name.split(".")[0]
    used = any(x.startswith("resumed from") and stem in x
               for x in outcome.stderr.splitlines())
    if kind == "identical" and stem.startswith("step-") and stem in outcome.stderr \
            and not used:
        return "passed over", detail
    return kind, detail


def run_case(fixture: Fixture, bucket: Bucket, ref: S3Reference, mutation: Mutation,
             case: Path, *, prefix: str) -> tuple[str, str, float]:
    """Copy the fixture to ``case`` and ``prefix``, write ``mutation``, resume: ``(kind,
    detail, seconds)``; kind ``"unwritable"`` where the value has no form there."""
    copy_case(fixture, bucket, case, prefix)
    try:
        apply_object(mutation, bucket, prefix, case / "object")
    except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
        return "unwritable", f"{type(exc).__name__}: {exc}"[:200], 0.0
    shutil.rmtree(case / "object", ignore_errors=True)
    shutil.rmtree(case / "elsewhere", ignore_errors=True)
    before = bucket.tags(fixture.prefix)
    outside = outside_snapshot(case)
    got = run_cli(train_argv(case), case)
    kind, detail = classify(case, ref, got, mutation, outside=outside,
                            weights=bucket_weights(bucket, prefix),
                            fixture_touched=bucket.tags(fixture.prefix) != before)
    return kind, detail, got.seconds
