"""``Checkpoints``: the one owner of a run's checkpoints.

It writes a checkpoint of the run (one file, or a sharded directory every rank writes
into), reads one back and puts the run as it was, keeps the saves callbacks ask for
during an event until the event is over, remembers which checkpoints this run wrote
(pruning deletes only those) and picks the one ``--resume auto`` continues. What a
checkpoint holds besides the weights comes from the run's parts (``RunParts``:
``training.run_state``); the keys are documented in docs/checkpoints.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedtrain.checkpoints.background import Writer, checked, nonfinite
from schedtrain.checkpoints.contract import Landing, RunParts, Save, failure
from schedtrain.checkpoints.export import export_weights
from schedtrain.checkpoints.files import checkpoint_name, run_folders
from schedtrain.checkpoints.format import CheckpointError, is_finite
from schedtrain.checkpoints.mount import Mount
from schedtrain.checkpoints.owned import Owned
from schedtrain.checkpoints.pacing import write_share
from schedtrain.checkpoints.preempted import PreemptedFiles
from schedtrain.checkpoints.restore import check_state, load_model, own_part
from schedtrain.checkpoints.rng import rng_state
from schedtrain.checkpoints.sharded import (
    SUFFIX,
    InFlight,
    finish_sharded,
    is_sharded,
    save_sharded,
    start_sharded,
)
from schedtrain.checkpoints.staging import snapshot, trim
from schedtrain.checkpoints.storage import open_storage
from schedtrain.checkpoints.store import newest_valid
from schedtrain.distributed.comm import Comm
from schedtrain.logs import get_logger
from schedtrain.spec.run import CheckpointOptions

__all__ = ["Checkpoints", "RunParts", "Save"]

_log = get_logger("schedtrain.training")


class Checkpoints:
    """Writes, reads, queues and lists a run's checkpoints.

    Args:
        parts: the run's state to save and restore.
        options: its section of the run's options (``RunConfig.checkpoint_options``): the
            ``run_dir`` (paths of checkpoints this run wrote are kept relative to it),
            ``checkpoint_dir`` with its ``storage_options`` (where ``RUN_DIR/checkpoints``
            really is: another folder or a URL), ``checkpoint_mode`` (``"async"``: the
            loop blocks only for a host snapshot, one background thread writes and
            commits it; ``"sync"``: the loop waits), ``checkpoint_busy``,
            ``checkpoint_staging``, ``checkpoint_write_share`` and ``export``. Paths
            callbacks give under ``RUN_DIR/checkpoints`` stand for its files.
        device_type: where training runs (``"cpu"``, ``"cuda"``): the write share's
            default.
        comm: on several processes, how the ranks write together (``None``: one).
        on_background_done: called from the writing thread when a background save
            ended (the loop then collects it at its next step).
        on_written: told ``(shown, phase, step, epoch, resumable)`` after each
            checkpoint is written, ``shown`` its path or URL, ``resumable`` whether
            ``--resume auto`` may pick it (the run directory records it in ``run.json``,
            so a killed run says how far it got).
    """

    def __init__(self, parts: RunParts, options: CheckpointOptions, *,
                 device_type: str = "cpu", comm: Comm | None = None,
                 on_background_done: Callable[[], None] | None = None,
                 on_written: Callable[[Path | str, str, int, int, bool], None] | None = None,
                 ) -> None:
        run_dir, where = options.run_dir, options.checkpoint_dir
        self.parts, self.run_dir, self.comm = parts, run_dir, comm
        storage = open_storage(where, options.storage_options) if where is not None else None
        #: where ``RUN_DIR/checkpoints`` really is
        self.mount = Mount(storage, run_dir, comm is None or comm.is_chief)
        self.mode, self.busy = options.checkpoint_mode, options.checkpoint_busy
        self.on_background_done = on_background_done
        #: the background writer, at the run's pace and staging
        self.writer = Writer(self._background_done,
                             share=write_share(options.checkpoint_write_share, device_type),
                             staging=options.checkpoint_staging)
        self._landing: Landing | None = None
        #: the sharded save in flight (its ranks finish it together: never on a wake-up)
        self._flight: InFlight | None = None
        #: ``written`` had the one-file save in flight been of non-finite weights
        self._if_nonfinite: list[str] = []
        #: checkpoints this run wrote (relative to the run directory when inside it)
        self.written: list[str] = []
        #: each committed file's identity: only a file that has it is the run's to prune
        self.owned = Owned(self.mount.identity, self.mount.is_local)
        self.preempted = PreemptedFiles()
        #: saves asked for during the current event, written once it is over
        self.pending: list[Save] = []
        #: log each checkpoint written (an application configured structlog)
        self.log = False
        #: folders this process wrote into or resumed its run's files in: it deletes there
        self._folders: set[Path] = set()
        self.on_written = on_written
        #: formats the model's weights are also exported in (``export.EXPORT_FORMATS``)
        self.export: tuple[str, ...] = options.export

    def write_preempt(self, step: int) -> Path | str | None:
        """The preemption's checkpoint of ``step``, committed before this returns: its
        path, or its URL in object storage (``None`` without a run directory)."""
        if self.run_dir is None:
            return None
        path = self.write(self.run_dir / "checkpoints" / checkpoint_name(step), "preempt")
        self.wait()  # committed before the process exits
        return path if self.mount.stored(path) is None else self.mount.shown(path)

    def _background_done(self) -> None:
        if self.on_background_done is not None:
            self.on_background_done()

    # -- which checkpoints ---------------------------------------------------------------------
    def key(self, path: Path) -> str:
        """How ``path`` is recorded among ``written``."""
        if self.run_dir is not None:
            try:
                return str(path.resolve().relative_to(self.run_dir.resolve()))
            except ValueError:
                pass
        return str(path.resolve())

    def resolve(self, key: str) -> Path:
        """The path a ``written`` entry stands for, in this run's directory."""
        path = Path(key)
        return path if path.is_absolute() or self.run_dir is None else self.run_dir / path

    def paths(self) -> list[Path]:
        """Checkpoints this run wrote (across resumes), still there as it wrote them
        (``owned``; known to the chief, which deletes), oldest first; never a preemption's own."""
        there = self.mount.exists([self.resolve(k) for k in self.preempted.others(self.written)])
        return [p for p in there if not self.mount.chief or self.owned.trusted(self.key(p), p)]

    def delete(self, path: Path) -> bool:
        """Delete a checkpoint this run wrote (on the chief); any other path is left
        alone. Returns whether it was one of this run's.

        ``written`` is read back from checkpoints on resume, so it is not trusted alone:
        the file must also sit in a folder this process wrote into (or resumed in: see
        ``read``), and be as the run wrote it (its size and digest, ``owned``)."""
        key = self.key(path)
        if (key not in self.written or path.parent.resolve() not in self._folders
                or (self.mount.chief and not self.owned.trusted(key, path, recheck=True))):
            return False
        landing = self._landing  # (its thread may yet name it -nonfinite)
        if landing is not None and path in (landing[0], nonfinite(landing[0])):
            self.wait()  # never delete a file while it is being written
        self.mount.delete(path)
        self.owned.records.pop(key, None)  # (a later file of that name is not it)
        return True

    @staticmethod
    def newest_valid(folder: Path,
                     skipped: Callable[[Path, str], None] | None = None) -> Path | None:
        """The newest checkpoint in ``folder`` on disk that loads, matches its checksum
        and is finite; each one passed over goes to ``skipped(path, why)``."""
        return newest_valid(folder, skipped)

    # -- the save queue ------------------------------------------------------------------------
    def request(self, path: Path, on_saved: Callable[[Path], None] | None = None) -> None:
        """Write a checkpoint once the current event is over (every firing has run)."""
        self.pending.append((path, on_saved))

    def flush(self, phase: str) -> None:
        """Write the checkpoints asked for during the event ``phase``."""
        saves, self.pending = self.pending, []
        if not saves:
            return
        flight = self._flight
        busy = self._landing is not None and not (
            flight.future.done() if flight is not None else self.writer.done())
        skip = self.busy == "skip" and busy
        if self.busy == "skip" and self.comm is not None:  # every rank skips, or none
            skip = self.comm.any(skip)  # (only the chief writes: it decides)
        if busy or skip:
            if self.log:
                _log.info("checkpoint_busy", rule="skip" if skip else "wait",
                          asked=[str(p) for p, _ in saves])
            if skip:
                return
        for path, on_saved in saves:
            self.write(path, phase, on_saved)

    def discard(self) -> None:
        """Forget the saves asked for: never a checkpoint of a half-done event."""
        self.pending = []

    # -- writing and reading -------------------------------------------------------------------
    def write(self, path: Path, phase: str,
              on_saved: Callable[[Path], None] | None = None) -> Path:
        """Write a checkpoint of the run now; returns the path written. ``on_saved(path)``
        is called once it is committed (``"async"``: when the loop collects it).

        In ``"async"`` mode the state is copied to host memory and written in the
        background; a save still in flight is waited for first.

        A checkpoint of non-finite weights or loss never replaces a file: it goes beside
        it as ``<name>-nonfinite.pt``. On several processes every rank calls this: each
        rank's generators and data position are gathered, and the chief writes the file;
        of a sharded (FSDP2) model every rank writes its shard into ``<name>.dcp/``.
        """
        self.wait()  # at most one save in flight
        parts, comm = self.parts, self.comm
        ranks = None if comm is None else comm.gather({"rng": rng_state(),
                                                       "data": parts.data_state()})
        model_state = parts.model.state_dict()
        sharded = comm is not None and is_sharded(model_state)
        # One process in "async": the writing thread checks the host copy and names it.
        deferred = self.mode == "async" and comm is None
        finite = deferred or is_finite(model_state, parts.last_loss())
        if sharded and self.mount.stored(path) is not None and self.mount.remote(path) is None:
            raise CheckpointError(self.mount.shown(path), "a sharded (FSDP2) checkpoint is a "
                                  "directory every rank writes: give a checkpoint_dir URL "
                                  "(an object store) or none, not another folder")
        if sharded and comm is not None:
            finite = not comm.any(not finite)  # each rank checked its own shard
            path = path.with_suffix(SUFFIX)
        if not finite:
            path = nonfinite(path)
        key = self.key(path)
        if deferred:
            bad = self.key(nonfinite(path))
            self._if_nonfinite = self.written + ([] if bad in self.written else [bad])
        self.preempted.wrote(key, phase, self.written)
        if key not in self.written:
            self.written.append(key)
        self._folders.add(path.parent.resolve())
        step, epoch = parts.position()
        run = {**parts.capture(), "written": list(self.written), "owned": self.owned.state(),
               "preempted": self.preempted.state()}
        body: dict[str, Any] | None = {
            "phase": phase, "step": step, "epoch": epoch, "finite": finite,
            "model": None, "optimizer": None,
            "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
            "run": run}
        if comm is not None:
            run["ranks"] = ranks
            body = body if comm.is_chief else None
        landing: Landing = (path, phase, step, epoch, on_saved)
        remote = self.mount.remote(path) if sharded else None  # in an object store
        try:
            if sharded and comm is not None:
                if self.mode == "async":  # each rank stages its shards; DCP writes them
                    self._flight = start_sharded(path, snapshot(body), model=parts.model,
                                                 optimizer=parts.optimizer, comm=comm,
                                                 remote=remote)
                    self._landing = landing
                    return path
                written = save_sharded(path, body, model=parts.model,
                                       optimizer=parts.optimizer, comm=comm, remote=remote)
            elif body is None:
                written = path
            else:
                body["model"], body["optimizer"] = model_state, parts.optimizer.state_dict()
                body = trim(body)  # the same bytes from the same values, in either mode
                if self.mode == "async":
                    self._start(body, landing)
                    return path
                written = self.mount.write(body, path)
        except (OSError, RuntimeError) as exc:  # a full disk, a quota, a read-only mount
            raise failure(exc, landing) from exc
        self._committed(landing)
        return written

    def _start(self, body: dict[str, Any], landing: Landing) -> None:
        """Write ``body`` in the background; the loop blocks only for the host copy (the
        training may change the state at once)."""
        state = self.writer.stage(body)
        loss = self.parts.last_loss()
        self._landing = landing
        self.writer.start(checked(state, None if loss is None else snapshot(loss),
                                   landing[0], self._if_nonfinite, self.mount.write))

    def wait(self, *, together: bool = True) -> None:
        """Finish the save in flight (if any): once committed, ``on_saved`` runs.

        A sharded save is finished by every rank together: call this only where the
        ranks agree (a save, a way out of the loop), as the loop does; ``together=False``
        (``settle``) runs no collective.

        Raises:
            CheckpointError: the background write failed (named, with its cause).
        """
        landing, self._landing = self._landing, None
        flight, self._flight = self._flight, None
        if landing is None:
            return
        try:
            if flight is not None and self.comm is not None:
                finish_sharded(flight, self.comm, together=together)
            elif (written := self.writer.result()) != landing[0] and written is not None:
                self.written = self._if_nonfinite  # the thread found it non-finite
                landing = (written, *landing[1:])
        except Exception as exc:
            failed = failure(exc, landing)
            if failed is exc:
                raise
            raise failed from exc
        self._committed(landing)

    def settle(self) -> None:
        """As ``wait``, on a way out that already fails (maybe on this rank alone: no
        collective runs); a write's failure is logged."""
        try:
            self.wait(together=False)
        except CheckpointError as exc:
            _log.error("checkpoint_failed", error=str(exc))

    def abandon(self) -> None:
        """Stop waiting for the save in flight (a second Ctrl-C aborts at once): its
        thread dies with the process, leaving at most a temporary file."""
        self._landing = self._flight = None
        self.writer.forget()

    def _committed(self, landing: Landing) -> None:
        path, phase, step, epoch, on_saved = landing
        comm = self.comm
        if self.mount.chief:
            self.owned.wrote(self.key(path), path, self.mount.landed.pop(path, None))
        for key in self.preempted.replaced(path, self.key(path), self.resolve):
            self.delete(self.resolve(key))  # (on the chief; every rank forgets the key)
        if self.log:
            _log.debug("checkpoint", path=str(path), step=step, phase=phase)
        if self.on_written is not None and (comm is None or comm.is_chief):
            self.on_written(self.mount.shown(path), phase, step, epoch,
                            self.mount.resumable(path))
        if on_saved is not None:  # the path written: "-nonfinite" added when it was
            on_saved(path)

    # -- exports -------------------------------------------------------------------------------
    def write_export(self, path: Path, checkpoint: Path | None = None) -> Path | None:
        """Export weights to ``path`` (with ``export``; on the chief; ``None`` when nothing
        is exported here): the model's now, or those the committed ``checkpoint`` holds,
        however long after its request it was written."""
        if "safetensors" not in self.export or not (self.comm is None or self.comm.is_chief):
            return None
        if checkpoint is None:
            step, epoch = self.parts.position()
            return export_weights(self.parts.model.state_dict(), path, step=step, epoch=epoch)
        state = self.mount.read(checkpoint)
        return export_weights(state["model"], path, step=state["step"], epoch=state["epoch"])

    def read(self, path: Path, state: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load ``path`` (checked) and put the run back as it was; returns the checkpoint
        (its ``phase``, ``step``, ``run``...). ``state``: ``path`` already read and checked
        (``Mount.newest_to_resume``), not read again.

        Raises:
            CheckpointError: a missing, corrupt or foreign file.
            ValueError: the checkpoint does not fit this run (other callbacks, or taken
                inside an epoch on another number of processes with data whose rest
                cannot be re-divided).
        """
        self.wait()
        parts = self.parts
        # On the host: tensors are copied into the model's and optimizer's own devices.
        if state is None:
            state = self.mount.read(path)
        shown = self.mount.shown(path)  # its URL in object storage, not the stand-in path
        self.validate(state, shown)
        run = state["run"]
        parts.check(shown, run, self.mount.exists)
        rng, data = own_part(self.comm, shown, run)
        load_model(parts, path, state, self.mount.remote(path))
        if parts.scaler is not None and state["scaler"] is not None:
            parts.scaler.load_state_dict(state["scaler"])
        parts.restore(run, rng, data)
        self.written = list(run["written"])
        self.owned.load(run.get("owned"))  # absent from earlier ones: nothing earlier pruned
        self.preempted.load(run, self.key(path), state["phase"], self.owned.records)
        self._folders |= run_folders(self.written, self.run_dir)  # pruned before a write
        if self.mount.chief and self.key(path) in self.written:  # it cannot hold its own
            self.owned.wrote(self.key(path), path, None)
            self._folders.add(path.parent.resolve())
        return state

    def validate(self, state: dict[str, Any], shown: Path | str) -> None:
        """``restore.check_state`` for this run (a ``CheckpointError`` by key path)."""
        check_state(self.parts, state, shown)

    def load_weights(self, path: Path) -> dict[str, Any]:
        """Load only the model and optimizer states of checkpoint ``path`` (checked), as
        a saver's ``load_best_at_end`` does; the clock, metrics and callbacks stay as they
        are. Returns the checkpoint. On several processes every rank calls it, after the
        chief has finished writing."""
        self.wait()
        if self.comm is not None:
            self.comm.barrier()  # the chief's last write is over before anyone reads
        state = self.mount.read(path)
        load_model(self.parts, path, state, self.mount.remote(path))
        return state
