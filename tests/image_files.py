"""Image files the intake tests need but that would be slow or large to make for real."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from PIL import Image

_IHDR_SIZE = slice(16, 24)  # PNG: 8-byte signature, IHDR length and type (8 bytes), then width and height (>II)
_IHDR_CRC_DATA, _IHDR_CRC = slice(12, 29), slice(29, 33)  # the CRC covers the chunk type and its 13 data bytes


def png_claiming_size(path: Path, width: int, height: int) -> Path:
    """Write a 1×1 grey PNG whose header claims ``width``×``height`` px (its pixel data is not that large).

    Pillow reads the size from the header on open, so a decompression bomb can be tested without making one.
    """
    Image.new("L", (1, 1)).save(path)
    data = bytearray(path.read_bytes())
    data[_IHDR_SIZE] = struct.pack(">II", width, height)
    data[_IHDR_CRC] = struct.pack(">I", zlib.crc32(bytes(data[_IHDR_CRC_DATA])))
    path.write_bytes(bytes(data))
    return path
