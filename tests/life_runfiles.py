"""What the lifecycle machine reads from a run directory between operations: a snapshot of
its files, each checkpoint's phase, the newest step a resume could pick, the step a
preemption line names, and ``schedtrain status``'s exit code for the state the machine
believes (docs/checkpoints.md; schedtrain/cli/status.py)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch

#: ``schedtrain status``'s exit code by the machine's state (run.json present).
STATUS_CODES = {"finished": 0, "preempted": 75, "killed": 1}
#: A bucket's lock (docs/checkpoints.md): as ``.lock``, a command may take it.
LEASE = ".schedtrain-lease.json"
_PREEMPT = re.compile(r"^preempted by .+ after step (\d+): checkpoint \S*step-(\d+)\.pt;")


@attrs.frozen
class Place:
    """Where a run's checkpoints are: ``RUN_DIR/checkpoints``, or with ``bucket`` the
    objects under ``prefix`` there (``client``: a boto3 S3 client; the parent reads the
    bucket without s3fs, whose event loop thread a forked child must not inherit)."""

    run_dir: Path
    bucket: str = ""
    prefix: str = ""
    client: Any = None

    def url(self, name: str) -> str:
        """The URL of the checkpoint ``name`` in the bucket."""
        return f"s3://{self.bucket}/{self.prefix}/{name}"

    def path(self, name: str) -> str:
        """What ``--resume`` takes for the checkpoint ``name`` (``RUN_DIR/checkpoints``
        stands for ``checkpoint_dir``; a URL there is read as a local path)."""
        return f"{self.run_dir.name}/checkpoints/{name}"

    def names(self) -> set[str]:
        """The checkpoint files there (a bucket's manifests and lease aside)."""
        return {n for n in self.checkpoints() if not n.endswith(".manifest.json")
                and n != LEASE}

    def checkpoints(self) -> dict[str, bytes]:
        """The checkpoint folder's files by name (a bucket's objects: manifests too)."""
        if not self.bucket:
            folder = self.run_dir / "checkpoints"
            return {p.name: p.read_bytes() for p in sorted(folder.glob("*"))
                    if p.is_file() and not p.name.endswith(".tmp")} if folder.is_dir() else {}
        out = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + "/")
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"].removeprefix(self.prefix + "/")
                body = self.client.get_object(Bucket=self.bucket, Key=obj["Key"])["Body"]
                out[name] = body.read()
        return out


def snapshot(place: Place) -> dict[str, bytes]:
    """Every file of the run directory by its path in it (``.lock`` and interrupted
    writes' temporary files aside: a command may take the lock, or clean those up), and
    a bucket's checkpoint objects (its lease aside)."""
    run_dir = place.run_dir
    out = {str(p.relative_to(run_dir)): p.read_bytes()
           for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"
           and not p.name.endswith(".tmp")}
    if place.bucket:
        out.update({f"bucket:{k}": v for k, v in place.checkpoints().items() if k != LEASE})
    return out


#: Each checkpoint's phase by its bytes' digest: the machine reads the files after every
#: command, and loading a checkpoint (torch's weights-only unpickler, in Python) cost
#: more than any other work of the test process; the same bytes load the same.
_PHASES: dict[bytes, str] = {}


def phases(place: Place) -> dict[str, str]:
    """Each checkpoint file's ``phase`` ("unreadable" where it does not load)."""
    out = {}
    for name, data in place.checkpoints().items():
        if not re.fullmatch(r"step-\d{8}\.pt", name):
            continue
        key = hashlib.sha256(data).digest()
        if key not in _PHASES:
            try:
                _PHASES[key] = torch.load(io.BytesIO(data), weights_only=True)["phase"]
            except Exception:
                _PHASES[key] = "unreadable"
        out[name] = _PHASES[key]
    return out


def newest_step(place: Place) -> int | None:
    """The step of the newest checkpoint that loads (``None``: none does)."""
    good = [int(name[5:13]) for name, phase in phases(place).items() if phase != "unreadable"]
    return max(good) if good else None


def preempted_at(lines: list[str]) -> int | None:
    """The step of the preemption's checkpoint the exit-75 line names."""
    for line in lines:
        got = _PREEMPT.match(line)
        if got is not None:
            return int(got.group(2))
    return None


def run_json(run_dir: Path) -> dict[str, object]:
    try:
        return dict(json.loads((run_dir / "run.json").read_text()))
    except (OSError, ValueError):
        return {}


def answer_text(run_dir: Path) -> str:
    try:
        return (run_dir / "retime.answer.json").read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def s3_bucket() -> Iterator[tuple[str, str, Any]]:
    """A moto S3 server on loopback with one bucket: ``(bucket, endpoint URL, a boto3
    client)``; the dummy credentials set in the environment (forked children inherit
    them)."""
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(key, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line a request, else
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="lifecycles")
        yield "lifecycles", endpoint, client
    finally:
        server.stop()
