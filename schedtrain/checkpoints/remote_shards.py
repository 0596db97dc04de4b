"""Sharded (FSDP2) checkpoints in an object store, for nodes that share no disk.

Every rank writes its shards through DCP's fsspec storage (``FsspecWriter``) under the
checkpoint folder's URL, ``<folder>/step-00000120.dcp/`` (``__<rank>_0.distcp``,
``.metadata``); once every rank's write succeeded the chief adds ``run.pt`` and commits
the checkpoint with its manifest ``step-00000120.manifest.json``, written last, which
names every file of it with its size and blake2b digest. An object store has no rename:
as for a one-file checkpoint, one without its manifest does not exist (``--resume auto``
never sees it) and the next run to open the folder removes it. The manifest's entry for
the checkpoint's own name is ``run.pt``'s: its identity, as a one-file checkpoint's.

The chief reads each shard back once to digest it before the commit, and every read of
the checkpoint checks every file against the manifest before DCP loads its shards.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any, Final

import attrs
import torch

from schedtrain.checkpoints.format import STATE_FILE, CheckpointError
from schedtrain.checkpoints.manifests import MANIFEST, parse_manifest
from schedtrain.checkpoints.pacing import update_in_pieces
from schedtrain.checkpoints.storage import FsspecStorage, StorageError, manifest_name
from schedtrain.checkpoints.store import checkpoint_body, load_checked
from schedtrain.readback import DamagedFile

#: The largest manifest of a sharded checkpoint read (an entry per shard: ~150 bytes).
MANIFEST_LIMIT: Final = 1 << 20

__all__ = ["Remote", "commit_remote", "listing", "read_remote", "reader", "uncommit", "writer"]


@attrs.frozen
class Remote:
    """Where a sharded checkpoint goes in an object store: ``storage`` and its name."""

    storage: FsspecStorage
    name: str

    @property
    def shown(self) -> str:
        return self.storage.url(self.name)


def _fsspec(cls: Any, remote: Remote) -> Any:
    """DCP's fsspec writer or reader of ``remote``, on the storage's own filesystem (its
    endpoint, credentials and request deadlines)."""
    storage = remote.storage
    made = cls(f"{storage.base}/{remote.name}", **storage.options)
    made.fs.fs = storage.fs
    return made


def writer(remote: Remote) -> Any:
    """A ``FsspecWriter`` into ``remote``'s folder (the chief emptied it first)."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return _fsspec(FsspecWriter, remote)


def reader(remote: Remote) -> Any:
    """A ``FsspecReader`` of committed ``remote``."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return _fsspec(FsspecReader, remote)


def listing(storage: FsspecStorage, name: str) -> dict[str, int]:
    """The objects under ``name/`` (a sharded checkpoint's files) and their sizes."""
    try:
        entries = storage._retry("list", name, lambda: storage._call(
            "ls", storage._path(name), detail=True, refresh=True))
    except StorageError as exc:
        if exc.reason.endswith("not found"):
            return {}
        raise
    return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
            for e in entries if e.get("type") != "directory"}


def uncommit(remote: Remote) -> None:
    """Remove ``remote``'s manifest, then all it holds (on the chief, before a write)."""
    remote.storage.delete(remote.name)


def _digest(data: bytes) -> dict[str, Any]:
    checksum = hashlib.blake2b(digest_size=32)
    update_in_pieces(checksum, data)
    return {"size": len(data), "blake2b": checksum.hexdigest()}


def commit_remote(remote: Remote, body: dict[str, Any], world_size: int) -> None:
    """Every rank's shards of ``remote`` are written: add ``run.pt`` (``body`` with the
    shards' digests) and write the manifest naming every file (on the chief)."""
    storage, name = remote.storage, remote.name
    files = {f"{name}/{part}": _digest(storage.get(f"{name}/{part}", 1 << 62) or b"")
             for part in listing(storage, name) if part != STATE_FILE}
    shards = {"world_size": world_size,
              "files": {k.rsplit("/", 1)[1]: v["blake2b"] for k, v in files.items()}}
    buffer = io.BytesIO()
    torch.save(checkpoint_body({**body, "model": None, "optimizer": None,
                                "shards": shards}, remote.shown), buffer)
    state = buffer.getvalue()
    storage.put(f"{name}/{STATE_FILE}", state)
    files[f"{name}/{STATE_FILE}"] = files[name] = _digest(state)
    manifest = {"format": MANIFEST, "files": files}
    storage.put(manifest_name(name), json.dumps(manifest, indent=1).encode())


def read_remote(remote: Remote) -> dict[str, Any]:
    """Committed ``remote``'s ``run.pt``, once every file the manifest names matches it.

    Raises:
        CheckpointError: it is not committed, or a file is missing or damaged.
    """
    storage, name = remote.storage, remote.name
    raw = storage.get(manifest_name(name), MANIFEST_LIMIT)
    if raw is None:
        raise CheckpointError(remote.shown, "it has no manifest: it was never committed")
    try:
        files = parse_manifest(raw, storage.url(manifest_name(name)), MANIFEST_LIMIT)
    except DamagedFile as exc:
        raise CheckpointError(remote.shown, f"its manifest is not a {MANIFEST} naming it "
                                            f"({exc.key or 'the file'}: {exc.reason})"
                              ) from None
    expected = {k: (v.size, v.blake2b) for k, v in files.items() if k.startswith(f"{name}/")}
    if f"{name}/{STATE_FILE}" not in expected:
        raise CheckpointError(remote.shown, f"its manifest is not a {MANIFEST} naming it "
                                            f"(files: no entry '{name}/{STATE_FILE}')")
    state = b""
    for key, (size, blake2b) in sorted(expected.items()):
        data = storage.get(key, size)
        if data is None or (len(data), _digest(data)["blake2b"]) != (size, blake2b):
            what = "is missing" if data is None else "does not match the manifest"
            raise CheckpointError(remote.shown, f"{key.rsplit('/', 1)[1]!r} {what}: it is "
                                                "damaged")
        if key == f"{name}/{STATE_FILE}":
            state = data
    return load_checked(io.BytesIO(state), "cpu", shown=remote.shown)
