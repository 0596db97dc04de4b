"""``JsonlWriter``: every scalar and every firing as one JSON line in ``events.jsonl``;
images, histograms and text as files under ``media/`` beside it, each named by a line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from schedtrain.files import inside, open_in_place, write_atomic
from schedtrain.monitors.media import Histogram, MediaRecord
from schedtrain.monitors.png import encode_png
from schedtrain.monitors.store import Record
from schedtrain.readback import DamagedFile
from schedtrain.time import Timestamp

__all__ = ["JsonlWriter"]


class JsonlWriter:
    """Append scalars (``{"kind": "scalar", ...}``) and firings (``{"kind": "firing", ...}``).

    Lines are appended and flushed at each write, so the file is readable while
    training runs. A resumed run first cuts the file back to where its checkpoint was
    taken (``truncate``), so the file holds exactly what the uninterrupted run's would.
    The file is created by ``truncate`` (a run starting: even a run that logs nothing
    leaves one) or at the first write; a link or a FIFO in its place is refused
    (``schedtrain.files.UnsafeFile``), never written through.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._heads: dict[tuple[str, str], str] = {}  # a firing line's start, per name

    def _open(self) -> IO[str]:
        if self._file is None or self._file.closed:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open_in_place(self.path, "a")
        return self._file

    def _write(self, rows: list[dict[str, Any]]) -> None:
        f = self._open()
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()

    def position(self) -> int:
        """The file's length in bytes now (where a checkpoint taken now resumes it)."""
        if self._file is not None and not self._file.closed:
            self._file.flush()
        return self.path.stat().st_size if self.path.exists() else 0

    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (what a checkpoint recorded), creating it
        when missing.

        Raises:
            DamagedFile: ``size`` falls inside a line (the log was edited before it).
        """
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open_in_place(self.path, "r+") as f:
            fd = f.fileno()
            if os.fstat(fd).st_size > size:
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    # The log was changed before the checkpoint's length: cut there, two
                    # lines would run into one (and a line's start would be lost).
                    line = os.pread(fd, size, 0).count(b"\n") + 1
                    raise DamagedFile(self.path, f"line {line}", (
                        f"the log was changed before the checkpoint's length ({size:,} "
                        "bytes falls inside this line); put the log back as it was, or "
                        "move it aside to start a new one"))
                f.truncate(size)

    def scalars(self, records: Sequence[Record]) -> None:
        self._write([r.to_dict() for r in records])

    def media(self, records: Sequence[MediaRecord]) -> None:
        """Write each value's file (``media/<name>/step-00000012.png``, ``.json``,
        ``.txt``) atomically, then its line (``{"kind": "media", "type": "image", ...}``).

        A resumed run writes the files of the lines it cut back again, over the old ones.
        """
        media = self.path.parent / "media"
        for r in records:
            target = self.path.parent / r.path
            # media_path never leads out of media/; a link planted on the way must not either
            inside(target.parent, media)
            write_atomic(target, _writer(_file_bytes(r)))
        self._write([r.to_dict() for r in records])

    def record(self, row: Mapping[str, Any]) -> None:
        """Write one line of the run's own (``{"kind": "schedule_change", ...}``)."""
        self._write([dict(row)])

    def firing(self, callback: str, event: str, ts: Timestamp, wall: float) -> None:
        self._write_line(self._firing_line(callback, event, ts, wall) + "}\n")

    def firing_timed(self, callback: str, event: str, ts: Timestamp, wall: float,
                     duration: float) -> None:
        """The firing's line with ``"duration"``: the seconds its callback ran."""
        self._write_line(f"{self._firing_line(callback, event, ts, wall)}, "
                         f'"duration": {_number(duration)}}}\n')

    def _firing_line(self, callback: str, event: str, ts: Timestamp, wall: float) -> str:
        """The line ``json.dumps`` writes for ``_firing_row``, less its closing brace,
        built from a per-(callback, event) head with only the numbers formatted: a
        firing's line costs a fraction of a generic ``json.dumps`` of a dict."""
        head = self._heads.get((callback, event))
        if head is None:
            head = self._heads[callback, event] = (
                f'{{"kind": "firing", "callback": {json.dumps(callback)}, '
                f'"event": {json.dumps(event)}, "step": ')
        if type(wall) is not float or type(ts.step) is not int:  # not the clock's own
            return json.dumps(_firing_row(callback, event, ts, wall))[:-1]
        return (f'{head}{ts.step}, "epoch": {ts.epoch}, "batch": {ts.batch}, '
                f'"step_in_epoch": {ts.step_in_epoch}, "sample": {ts.sample}, '
                f'"token": {ts.token}, "seconds": {_number(ts.seconds)}, '
                f'"time": {_number(wall)}')

    def _write_line(self, line: str) -> None:
        f = self._open()
        f.write(line)
        f.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _firing_row(callback: str, event: str, ts: Timestamp, wall: float) -> dict[str, Any]:
    return {"kind": "firing", "callback": callback, "event": event, "step": ts.step,
            "epoch": ts.epoch, "batch": ts.batch, "step_in_epoch": ts.step_in_epoch,
            "sample": ts.sample, "token": ts.token, "seconds": ts.seconds, "time": wall}


def _number(x: float) -> str:
    """``x`` as ``json.dumps`` writes it (``repr`` for a finite float or an int)."""
    return repr(x) if type(x) is int or (type(x) is float and x - x == 0) else json.dumps(x)


def _file_bytes(r: MediaRecord) -> bytes:
    if isinstance(r.payload, torch.Tensor):
        h, w, c = r.payload.shape
        return encode_png(r.payload.contiguous().numpy().tobytes(), h, w, c)
    if isinstance(r.payload, Histogram):
        return (json.dumps({"name": r.name, "step": r.step, "epoch": r.epoch,
                            **r.payload.to_dict()}) + "\n").encode()
    return r.payload.encode("utf-8", "surrogatepass")



def _writer(data: bytes) -> Callable[[IO[bytes]], None]:
    """What ``write_atomic`` calls to write ``data`` into its temporary file."""
    def write(f: IO[bytes]) -> None:
        f.write(data)
    return write
