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


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">HH", marker, len(payload) + 2) + payload


def grey_jpeg_one_scan_per_component(path: Path, width: int, height: int) -> Path:
    """Write a baseline (sequential) 3-component JPEG, ``width``×``height`` px, whose components come in three scans
    of one component each (a non-interleaved file, which Pillow's encoder never writes), every 8×8 block flat.

    The Huffman tables have one 1-bit code each (DC difference 0, AC end of block), so each block is two 0 bits.
    """
    one_code = bytes([1] + [0] * 15) + b"\x00"  # one code of length 1, for symbol 0
    head = b"\xff\xd8" + _segment(0xFFDB, b"\x00" + bytes([1] * 64))  # start of image, a quantisation table
    head += _segment(0xFFC0, struct.pack(">BHHB", 8, height, width, 3)
                     + b"".join(bytes([component, 0x11, 0]) for component in (1, 2, 3)))  # baseline frame
    head += _segment(0xFFC4, b"\x00" + one_code) + _segment(0xFFC4, b"\x10" + one_code)  # DC and AC tables
    bits = 2 * (-(-width // 8)) * (-(-height // 8))
    data = bytes(bits // 8) + (bytes([0xFF >> (bits % 8)]) if bits % 8 else b"")  # the last byte padded with 1s
    scans = b"".join(_segment(0xFFDA, bytes([1, component, 0x00, 0, 63, 0])) + data for component in (1, 2, 3))
    path.write_bytes(head + scans + b"\xff\xd9")
    return path
