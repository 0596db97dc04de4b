"""Reading and writing one checkpoint: checked on the way in and on the way out.

Writes are atomic (``files.write_atomic``); a read loads with ``weights_only=True`` and
checks the format tag and the checksum. A sharded checkpoint (FSDP2, ``sharded``) is a
directory ``step-NNNNNNNN.dcp``: the shards ``torch.distributed.checkpoint`` wrote and
``run.pt``, an ordinary checkpoint without weights whose ``shards`` key holds every shard
file's checksum.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from schedtrain.checkpoints.files import NAME_RE, list_checkpoints, remove, write_atomic
from schedtrain.checkpoints.format import (
    ALGORITHM,
    FORMAT,
    STATE_FILE,
    CheckpointError,
    check_plain,
    digest,
    file_digests,
)
from schedtrain.checkpoints.pacing import paced_file
from schedtrain.checkpoints.storage import Storage

#: What may refuse a checkpoint read back, given its content and how it is shown.
Check = Callable[[dict[str, Any], "str | Path"], None]

__all__ = ["Check", "checkpoint_body", "load_checked", "newest_loaded", "newest_valid",
           "read_checkpoint", "read_stored", "stored_newest_loaded", "stored_newest_valid",
           "write_checkpoint"]


def write_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    """Write ``state`` (plain data and tensors) to ``path`` with its format and checksum.

    Raises:
        CheckpointError: something in ``state`` could not be loaded back safely.
    """
    path = Path(path)
    body = checkpoint_body(state, path)
    if path.is_dir() and not path.is_symlink():  # not ours to keep: a checkpoint's name
        remove(path)
    return write_atomic(path, lambda f: torch.save(body, paced_file(f)))


def checkpoint_body(state: dict[str, Any], shown: str | Path) -> dict[str, Any]:
    """``state`` with its format tag and checksum, as a checkpoint file holds it.

    Raises:
        CheckpointError: something in ``state`` could not be loaded back safely.
    """
    body = {"format": FORMAT, **state}
    try:
        check_plain(body, "checkpoint")
    except TypeError as exc:
        raise CheckpointError(shown, str(exc)) from None
    body["checksum"] = {"algorithm": ALGORITHM, "digest": digest(body)}
    return body


def read_checkpoint(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` and check its format and checksum.

    Of a sharded checkpoint (a directory) this loads ``run.pt`` and checks every shard
    file against the checksum it records; the weights stay in the shards.

    Raises:
        CheckpointError: the file is missing, unreadable, not a schedtrain checkpoint,
            or its content does not match its checksum (it is corrupt).
    """
    path = Path(path)
    if path.is_dir():
        state = _read_file(path / STATE_FILE, map_location, shown=path)
        _check_shards(path, state)
        return state
    return _read_file(path, map_location, shown=path)


def _read_file(path: Path, map_location: Any, *, shown: Path) -> dict[str, Any]:
    if not path.is_file():
        if shown != path:
            why = f"no {path.name} in the directory: it is not a checkpoint"
        else:
            why = "not a regular file" if path.exists() else "no such file"
        raise CheckpointError(shown, why)
    return load_checked(path, map_location, shown=shown)


def load_checked(source: Path | IO[bytes], map_location: Any, *,
                 shown: str | Path) -> dict[str, Any]:
    """Load a checkpoint from a file or a buffer (``weights_only``) and check its format
    and checksum; ``shown`` names it in errors."""
    try:
        state = torch.load(source, map_location=map_location, weights_only=True)
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0][:200]
        # The weights-only unpickler's first line is advice to load unsafely, not a cause.
        cause = type(exc).__name__ if "weights_only" in first or not first else (
            f"{type(exc).__name__}: {first}")
        raise CheckpointError(shown, f"cannot be read ({cause}); it is corrupt or not a "
                                     "checkpoint") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(shown, f"not a {FORMAT} file (found {found!r})")
    _check_sum(state, shown)
    return state


def _check_sum(state: dict[str, Any], shown: str | Path) -> None:
    """Refuse a checkpoint whose checksum is missing, malformed or does not match: one
    without a checksum is as damaged as one that fails it (nothing vouches for it)."""
    checksum = state.get("checksum")
    if not isinstance(checksum, dict) or "digest" not in checksum:
        found = "no checksum" if checksum is None else f"a malformed checksum {checksum!r:.80}"
        raise CheckpointError(shown, f"it has {found} (expected {{'algorithm': "
                                     f"'{ALGORITHM}', 'digest': ...}}): it is damaged")
    if checksum.get("algorithm") != ALGORITHM or not isinstance(checksum["digest"], str):
        raise CheckpointError(shown, f"its checksum is not a {ALGORITHM} digest "
                                     f"(found {checksum!r:.80}): it is damaged")
    try:
        found = digest(state)
    # A crafted file loads into what hashing cannot walk (a 100,000-deep nesting raises
    # RecursionError, a 5,000-digit int ValueError): damage, skipped like any other.
    except Exception as exc:
        raise CheckpointError(shown, f"cannot be read ({type(exc).__name__}); it is corrupt "
                                     "or not a checkpoint") from None
    if checksum["digest"] != found:
        raise CheckpointError(shown, "its content does not match its checksum: it is corrupt")


def _check_shards(folder: Path, state: dict[str, Any]) -> None:
    shards = state.get("shards")
    if not isinstance(shards, dict):
        raise CheckpointError(folder, f"its {STATE_FILE} names no shards")
    expected = shards.get("files")
    if not isinstance(expected, dict):
        raise CheckpointError(folder, f"its {STATE_FILE} lists no shard files")
    found = file_digests(folder, list(expected))
    for name, want in expected.items():
        if found.get(name) != want:
            what = "is missing" if name not in found else "does not match its checksum"
            raise CheckpointError(folder, f"shard {name!r} {what}: it is corrupt")


def newest_valid(folder: str | Path,
                 skipped: Callable[[Path, str], None] | None = None) -> Path | None:
    """The newest checkpoint in ``folder`` that loads, matches its checksum and is finite.

    Each one passed over is reported to ``skipped(path, reason)``.
    """
    found = newest_loaded(folder, skipped)
    return None if found is None else found[0]


def newest_loaded(folder: str | Path, skipped: Callable[[Path, str], None] | None = None,
                  check: Check | None = None) -> tuple[Path, dict[str, Any]] | None:
    """``newest_valid``, with the checkpoint it loaded to check it (a resume uses that
    instead of reading it again); ``check(state, path)`` may refuse one (a
    ``CheckpointError``: passed over like a damaged file)."""
    for path in list_checkpoints(folder):
        try:
            state = read_checkpoint(path)
            if check is not None:
                check(state, path)
        except CheckpointError as exc:
            if skipped is not None:
                skipped(path, exc.reason)
            continue
        if not state.get("finite", True):
            if skipped is not None:
                skipped(path, "its weights or loss are not finite")
            continue
        return path, state
    return None


def read_stored(storage: Storage, name: str, map_location: Any = "cpu") -> dict[str, Any]:
    """Load committed checkpoint ``name`` from ``storage``, checked against its manifest,
    its format and its checksum.

    Raises:
        CheckpointError: it is not committed, damaged, or not a checkpoint (by URL).
    """
    return load_checked(io.BytesIO(storage.read(name)), map_location,
                        shown=storage.url(name))


def stored_newest_valid(storage: Storage, folder: Path,
                        skipped: Callable[[Path, str], None] | None = None) -> Path | None:
    """``newest_valid`` of a folder whose files are in ``storage``: the newest committed
    checkpoint that loads, matches its checksum and is finite, as ``folder / name``."""
    found = stored_newest_loaded(storage, folder, skipped)
    return None if found is None else found[0]


def stored_newest_loaded(storage: Storage, folder: Path,
                         skipped: Callable[[Path, str], None] | None = None,
                         read: Callable[[str], dict[str, Any]] | None = None,
                         check: Check | None = None,
                         ) -> tuple[Path, dict[str, Any]] | None:
    """``stored_newest_valid``, with the checkpoint it loaded (by ``read(name)``:
    ``read_stored`` by default), which ``check(state, url)`` may refuse."""
    found = [(int(m[1]), bool(m[2]), n) for n in storage.committed()
             if (m := NAME_RE.fullmatch(n)) is not None]
    for _, _, name in sorted(found, key=lambda x: (-x[0], x[1])):
        try:
            state = read_stored(storage, name) if read is None else read(name)
            if check is not None:
                check(state, storage.url(name))
        except CheckpointError as exc:
            if skipped is not None:
                skipped(folder / name, exc.reason)
            continue
        if not state.get("finite", True):
            if skipped is not None:
                skipped(folder / name, "its weights or loss are not finite")
            continue
        return folder / name, state
    return None
