"""Atomic checkpoint files: write to a temporary file in the same folder, then ``os.replace``.

A crash while writing leaves the previous file intact and no partial file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_save", "latest_checkpoint"]


def atomic_save(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)  # os.replace: atomic within one file system
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            Path(tmp).unlink()
        raise
    return path


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The newest ``*.pt`` in ``folder`` by name (savers zero-pad the step), or ``None``."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    found = sorted(folder.glob("*.pt"))
    return found[-1] if found else None
