"""``LocalStorage``: a checkpoint folder on the local disk, each file committed by an
atomic rename (``storage.Storage``'s local half)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO

from schedtrain.checkpoints.files import NAME_RE, remove, remove_leftovers, write_atomic
from schedtrain.checkpoints.format import CheckpointError
from schedtrain.checkpoints.owned import file_identity

__all__ = ["LocalStorage"]


class LocalStorage:
    """A folder on the local disk: files committed by an atomic rename."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def url(self, name: str) -> str:
        return str(self.folder / name)

    def write(self, name: str, save: Callable[[IO[bytes]], None]) -> None:
        path = self.folder / name
        if path.is_dir() and not path.is_symlink():  # not ours to keep: a checkpoint's name
            remove(path)
        write_atomic(path, save)

    def read(self, name: str) -> bytes:
        try:
            return (self.folder / name).read_bytes()
        except OSError as exc:
            raise CheckpointError(self.folder / name, exc.strerror or "cannot be read") from None

    def committed(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return [p.name for p in self.folder.iterdir() if NAME_RE.fullmatch(p.name)]

    def delete(self, name: str) -> None:
        remove(self.folder / name)

    def clean_leftovers(self) -> list[str]:
        return [p.name for p in remove_leftovers(self.folder)]

    def identity(self, name: str) -> tuple[int, str] | None:
        return file_identity(self.folder / name)
