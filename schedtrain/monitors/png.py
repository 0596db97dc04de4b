"""A minimal PNG encoder (8-bit grey, grey+alpha, RGB, RGBA) with the standard library's
``zlib``: media files need no Pillow."""

from __future__ import annotations

import struct
import zlib

__all__ = ["encode_png"]

_COLOUR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type
_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def encode_png(pixels: bytes, height: int, width: int, channels: int) -> bytes:
    """The PNG file of ``height`` x ``width`` pixels of ``channels`` 8-bit samples each,
    given row-major (``HWC``) in ``pixels``.

    Raises:
        ValueError: for a size that does not match ``pixels`` or 0, 5 or more channels.
    """
    if channels not in _COLOUR_TYPE or height < 1 or width < 1:
        raise ValueError(f"a PNG needs 1 to 4 channels and a size >= 1x1, got "
                         f"{height}x{width}x{channels}")
    row = width * channels
    if len(pixels) != height * row:
        raise ValueError(f"{len(pixels)} bytes are not {height}x{width}x{channels} pixels")
    # Each scanline starts with its filter type, 0 (none): simple and exact.
    raw = b"".join(b"\x00" + pixels[i * row:(i + 1) * row] for i in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, _COLOUR_TYPE[channels], 0, 0, 0)
    return (_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 6))
            + _chunk(b"IEND", b""))
