"""``Mount``: where ``RUN_DIR/checkpoints`` really is — that folder, or another folder or an
fsspec URL (``[run] checkpoint_dir``). Paths callbacks give under ``RUN_DIR/checkpoints``
stand for the storage's files; any other path is a plain file. A URL's folder is held by a
lease while the run uses it (``lease.Lease``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from schedtrain.checkpoints.files import NAME_RE, remove
from schedtrain.checkpoints.format import CheckpointError, UnresumableCheckpoint
from schedtrain.checkpoints.lease import Lease
from schedtrain.checkpoints.owned import Identity, Tap, file_identity
from schedtrain.checkpoints.pacing import paced_file
from schedtrain.checkpoints.remote_shards import Remote, read_remote
from schedtrain.checkpoints.sharded import SUFFIX
from schedtrain.checkpoints.storage import FsspecStorage, LocalStorage, Storage, manifest_name
from schedtrain.checkpoints.store import (
    Check,
    checkpoint_body,
    newest_loaded,
    read_checkpoint,
    read_stored,
    stored_newest_loaded,
    write_checkpoint,
)
from schedtrain.distributed.comm import Comm
from schedtrain.errors import RunDirError
from schedtrain.urls import is_url

__all__ = ["Mount"]


class Mount:
    """Maps the run's checkpoint paths to their storage.

    Args:
        storage: where ``RUN_DIR/checkpoints`` really is; ``None``: that folder itself.
        run_dir: the run directory (``None``: paths are plain files).
        chief: whether this process writes and deletes (rank 0).
    """

    def __init__(self, storage: Storage | None, run_dir: Path | None, chief: bool) -> None:
        self.storage, self.run_dir, self.chief = storage, run_dir, chief
        #: This run's claim on an object-store folder, from ``claim`` to ``close``.
        self.lease: Lease | None = None
        #: path -> identity of each checkpoint ``write`` wrote, until the owner takes it
        self.landed: dict[Path, Identity] = {}

    def stored(self, path: Path) -> str | None:
        """The name in ``storage`` that ``path`` stands for (``None``: a plain path)."""
        if self.storage is None or self.run_dir is None:
            return None
        mount = (self.run_dir / "checkpoints").resolve()
        return path.name if path.parent.resolve() == mount else None

    def remote(self, path: Path) -> Remote | None:
        """The sharded checkpoint in an object store that ``path`` stands for (``None``:
        ``path`` is not one in ``storage``, or ``storage`` is a local folder)."""
        name = self.stored(path)
        if name is None or not isinstance(self.storage, FsspecStorage):
            return None
        return Remote(self.storage, name)

    def resumable(self, path: Path) -> bool:
        """Whether ``path`` is a checkpoint ``--resume auto`` may pick: a finite one of
        ``RUN_DIR/checkpoints`` (wherever it really is)."""
        found = NAME_RE.fullmatch(path.name)
        if found is None or found[2] or self.run_dir is None:
            return False
        return path.parent.resolve() == (self.run_dir / "checkpoints").resolve()

    def shown(self, path: Path) -> str:
        """Where ``path`` really is: its URL in ``storage``, or the path."""
        name = self.stored(path)
        return str(path) if name is None or self.storage is None else self.storage.url(name)

    def given(self, location: str | Path) -> tuple[Path, Path | str]:
        """The checkpoint ``--resume LOCATION`` names, and how it is shown: a path as it
        is; a URL as the path under ``RUN_DIR/checkpoints`` standing for its object, so it
        resumes exactly as ``--resume auto`` would from that object. Only this run's own
        ``checkpoint_dir`` is taken: the folder the run leases, prunes and resumes from.

        Raises:
            UnresumableCheckpoint: a URL outside ``checkpoint_dir`` (or with a local one),
                or a checkpoint that is not there (in an object store: not committed).
        """
        url = isinstance(location, str) and is_url(location)
        path = self._stand_in(str(location)) if url else Path(location)
        name, storage, shown = self.stored(path), self.storage, self.shown(path)
        if name is None or storage is None:
            if not path.exists():
                raise UnresumableCheckpoint(path, "no such file")
        elif isinstance(storage, LocalStorage):
            if not (storage.folder / name).exists():
                raise UnresumableCheckpoint(shown, "no such file in checkpoint_dir")
        elif isinstance(storage, FsspecStorage) and storage.get(manifest_name(name), 0) is None:
            raise UnresumableCheckpoint(shown, "no checkpoint of that name is committed in "
                                               "checkpoint_dir (its manifest is missing); "
                                               "--resume auto picks the newest there")
        return path, (shown if url else path)

    def _stand_in(self, url: str) -> Path:
        storage = self.storage
        if not isinstance(storage, FsspecStorage) or self.run_dir is None:
            local = storage.folder if isinstance(storage, LocalStorage) else (
                None if self.run_dir is None else self.run_dir / "checkpoints")
            raise UnresumableCheckpoint(url, "--resume URL must be a checkpoint in this run's "
                                             "object-store checkpoint_dir, and its checkpoints "
                                             "are local files" + (f" in '{local}'" if local
                                                                  else "")
                                        + ": give a path, or --resume auto")
        # Only this folder: a checkpoint elsewhere is another run's, under its lease.
        folder = storage.base
        name = url[len(folder) + 1:].rstrip("/") if url.startswith(folder + "/") else ""
        if name in ("", ".", "..") or "/" in name:
            raise UnresumableCheckpoint(url, "--resume URL must be a checkpoint in this run's "
                                             f"checkpoint_dir {storage.shown!r} (a name there, "
                                             "such as step-00000100.pt), or give --resume auto")
        return self.run_dir / "checkpoints" / name

    def exists(self, paths: list[Path]) -> list[Path]:
        """Those of ``paths`` that are there (committed, in ``storage``), in order."""
        committed: set[str] | None = None
        out = []
        for path in paths:
            name = self.stored(path)
            if name is None:
                if path.exists():
                    out.append(path)
                continue
            if committed is None and self.storage is not None:
                committed = set(self.storage.committed())
            if committed is not None and name in committed:
                out.append(path)
        return out

    def write(self, body: dict[str, Any], path: Path) -> Path:
        """Write the checkpoint ``body`` at ``path`` (committed by a manifest in storage);
        its identity (size and digest of the bytes written) goes to ``landed``."""
        name = self.stored(path)
        if name is None or self.storage is None:
            written = write_checkpoint(body, path)
            identity = file_identity(written)  # read back once, in the writing thread
        else:
            full = checkpoint_body(body, self.storage.url(name))
            if self.lease is not None:
                self.lease.check()
            taps: list[Tap] = []

            def save(f: IO[bytes]) -> None:
                taps.append(Tap(paced_file(f)))  # hashed on the way to the buffer
                torch.save(full, taps[-1])  # type: ignore[arg-type]

            self.storage.write(name, save)
            written, identity = path, (taps[-1].identity if taps else None)
        if identity is not None:
            self.landed[written] = identity
        return written

    def identity(self, path: Path) -> Identity | None:
        """The size and digest of the checkpoint at ``path`` now (in ``storage``: what
        its manifest says); ``None`` when it is not there."""
        name = self.stored(path)
        if name is None or self.storage is None:
            return file_identity(path)
        return self.storage.identity(name)

    def is_local(self, path: Path) -> bool:
        """Whether ``path`` is a file on this machine's disk (not an object in a bucket)."""
        name = self.stored(path)
        return name is None or self.storage is None or isinstance(self.storage, LocalStorage)

    def read(self, path: Path) -> dict[str, Any]:
        """The checkpoint at ``path``, checked, on the host."""
        name = self.stored(path)
        if name is None or self.storage is None:
            return read_checkpoint(path, map_location="cpu")
        return self._read_stored(name)

    def _read_stored(self, name: str) -> dict[str, Any]:
        if name.endswith(SUFFIX) and isinstance(self.storage, FsspecStorage):
            return read_remote(Remote(self.storage, name))
        assert self.storage is not None
        return read_stored(self.storage, name)

    def delete(self, path: Path) -> None:
        """Delete the checkpoint at ``path`` (on the chief)."""
        if not self.chief:
            return
        name = self.stored(path)
        if name is None or self.storage is None:
            remove(path)
        else:
            if self.lease is not None:
                self.lease.check()
            self.storage.delete(name)

    def newest_to_resume(self, folder: Path,
                         skipped: Callable[[Path, str], None] | None = None,
                         check: Check | None = None,
                         ) -> tuple[Path, dict[str, Any]] | None:
        """The newest good checkpoint of ``folder`` for ``--resume auto``, looked up where
        it really is (``storage``: the newest committed one), with what it holds (read
        once: the resume puts the run back from it); ``check`` refuses one the resuming
        loop cannot trust (passed over, as a damaged file is)."""
        if self.storage is not None and self.stored(folder / "x") is not None:
            return stored_newest_loaded(self.storage, folder, skipped, self._read_stored,
                                        check)
        return newest_loaded(folder, skipped, check)

    def pick_to_resume(self, folder: Path, comm: Comm | None,
                       skipped: Callable[[Path, str], None] | None = None,
                       check: Check | None = None,
                       ) -> tuple[Path, dict[str, Any] | None] | None:
        """``newest_to_resume`` on the chief, whose pick every rank resumes: it tells them
        its name (one broadcast), so all resume the same checkpoint even where their views
        of the folder differ (a node that lists a bucket while a write lands, a rank whose
        read failed once). The others get no content: they read it to restore it."""
        found: tuple[Path, dict[str, Any] | None] | None = None
        failed: Exception | None = None
        if comm is None or comm.is_chief:
            try:
                found = self.newest_to_resume(folder, skipped, check)
            except Exception as exc:  # every rank hears of it first: none waits for ever
                failed = exc
        if comm is not None:
            picked = comm.broadcast("" if failed is not None else
                                    None if found is None else found[0].name)
            if picked == "" and failed is None:
                raise CheckpointError(folder, "the chief could not pick a checkpoint to "
                                              "resume (its error says why)")
            if not comm.is_chief:
                found = None if picked is None else (folder / picked, None)
        if failed is not None:
            raise failed
        return found

    def claim(self) -> None:
        """Take an object-store folder for this run (its lease), before anything there is
        cleaned, emptied or written; on the chief.

        Raises:
            RunDirError: another live run holds it.
        """
        storage = self.storage
        if (not isinstance(storage, FsspecStorage) or not self.chief or self.run_dir is None
                or self.lease is not None):
            return
        lease = Lease(storage, self.run_dir)
        lease.acquire()
        self.lease = lease

    def close(self) -> None:
        """The run ended: give the folder up (its lease deleted)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.release()

    def open(self, *, fresh: bool) -> None:
        """The run opened its directory: remove what its interrupted writes left in
        ``storage``; a fresh run (not a resume, nor ``--overwrite``, which empties it)
        refuses a ``storage`` that holds checkpoints, as a run directory holding a run is
        refused.

        Raises:
            RunDirError: a fresh run's ``storage`` holds checkpoints.
        """
        storage = self.storage
        if storage is None or not self.chief:
            return
        storage.clean_leftovers()
        held = storage.committed()
        if fresh and held:
            where = storage.url("").rstrip("/")
            raise RunDirError(f"checkpoint_dir {where!r} holds checkpoints of a run "
                              f"({len(held)}, e.g. {sorted(held)[-1]}): resume it "
                              "(--resume auto) or start over (--overwrite)")

    def clear(self) -> None:
        """Delete every checkpoint in ``storage`` (``--overwrite``: it belongs to this run)."""
        if self.storage is not None and self.chief:
            for name in self.storage.committed():
                self.storage.delete(name)
            self.storage.clean_leftovers()
