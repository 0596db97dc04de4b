"""A checkpoint's manifest in an object store, read back as a typed, bounded record.

``<stem>.manifest.json`` commits a checkpoint there (``storage``, ``remote_shards``):
``{"format": "schedtrain-manifest-1", "files": {NAME: {"size": ..., "blake2b": ...}}}``.
What comes back from the store may have been crafted: it passes ``readback.parse_json``
(depth cap, no ``NaN``) and is structured here, each entry by its key path, so a bad one
is a ``DamagedFile`` naming the manifest's URL and the key (``files.step-...pt.size``).
"""

from __future__ import annotations

import re
from typing import Any, Final

import attrs

from schedtrain.readback import (
    MAX_LIST,
    DamagedFile,
    at_most,
    between,
    invalid,
    parse_json,
    printable,
    structure,
)

__all__ = ["MANIFEST", "MAX_SIZE", "Entry", "parse_manifest"]

#: The manifest's format tag.
MANIFEST: Final = "schedtrain-manifest-1"
#: The largest file a manifest may name (2^62 bytes: no store holds more).
MAX_SIZE: Final = 1 << 62
_HEX: Final = re.compile(r"[0-9a-f]{64}")
_NAME: Final = re.compile(r"[A-Za-z0-9_.\-/]{1,400}")


def _digest(_inst: Any, attribute: Any, value: str) -> None:
    if not _HEX.fullmatch(value):
        raise invalid(attribute.name, "expected 64 hexadecimal digits (a blake2b-256 "
                      f"digest), found {printable(value)[:80]!r}")


@attrs.frozen
class Entry:
    """One file a manifest names: its size in bytes and blake2b-256 digest."""

    size: int = attrs.field(validator=between(0, MAX_SIZE))
    blake2b: str = attrs.field(validator=[at_most(64), _digest])


@attrs.frozen
class _Head:
    """What a manifest holds besides its entries (checked first)."""

    format: str = attrs.field(validator=at_most(100))
    files: dict[str, Any] = attrs.field(validator=at_most(MAX_LIST))


def parse_manifest(raw: bytes, shown: str, limit: int) -> dict[str, Entry]:
    """The files manifest ``raw`` (read from ``shown``, at most ``limit`` bytes) names.

    Raises:
        DamagedFile: it is too long, not JSON, not a manifest, or an entry is bad.
    """
    if len(raw) > limit:
        raise DamagedFile(shown, "", f"expected at most {limit:,} bytes, found more")
    head = structure(parse_json(raw, shown), _Head, shown)
    if head.format != MANIFEST:
        raise DamagedFile(shown, "format", f"expected {MANIFEST!r}, found "
                                           f"{printable(head.format)[:60]!r}")
    files: dict[str, Entry] = {}
    for name, entry in head.files.items():
        key = f"files.{printable(name)[:100]}"
        if not _NAME.fullmatch(name) or ".." in name.split("/"):
            raise DamagedFile(shown, key, "expected a checkpoint file's name")
        files[name] = structure(entry, Entry, shown, key)
    return files
