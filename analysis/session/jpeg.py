"""What a JPEG file's structure says beside its decode: whether libjpeg keeps every coefficient while it decodes the
file (:func:`scans_keep_coefficients`, which :mod:`analysis.session.image_intake` asks), and whether the picture's
data ends before the picture does (:func:`cut_short`, which :mod:`analysis.session.image_decode` asks).

Both walk the file's markers (:func:`_markers`): a segment is passed over by its length, a scan's entropy-coded data
searched for the marker that ends it. The file is mapped, not read into memory (the uploads it reads are written
whole, then renamed into place, so none shrinks while it is mapped).
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import re
from collections.abc import Iterator
from pathlib import Path

from PIL import Image, ImageChops, JpegImagePlugin

__all__ = ["cut_short", "scans_keep_coefficients"]

_SOI = b"\xff\xd8"  # start of image: a JPEG's first two bytes
_EOI = b"\xff\xd9"  # end of image
_SOS = 0xDA  # start of scan: entropy-coded data follows its segment
_SEGMENTS_READ = 10_000  # markers walked, at most (files have a few dozen); past it, the walk gives up
_PROGRESSIVE_FRAMES = frozenset({0xC2, 0xC6, 0xCA, 0xCE})  # SOF markers of progressive frames
_NO_SEGMENT = frozenset({0x01, *range(0xD0, 0xDA)})  # TEM, RSTn, SOI, EOI: markers without a length or data
# What may come after a scan within one picture (ITU T.81 B.2.4, B.6): tables (DHT, DAC, DQT), DNL, DRI, the next
# scan, a comment, application data; any other marker (EOI, normally) ends the picture
_BETWEEN_SCANS = frozenset({0xC4, 0xCC, 0xDB, 0xDC, 0xDD, _SOS, 0xFE, *range(0xE0, 0xF0)})
_FILL = re.compile(rb"\xff+")  # a marker's 0xFF, and any fill bytes before it
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7]")  # in entropy-coded data, the 0xFF of the marker after it (0xFF 0x00
#                                                    is a data byte, RSTn a restart within the scan)
_PROBE = bytes(range(1, 255)) * 4  # put where a picture's data ends (cut_short): no 0xFF, so neither a marker nor a
#                                    stuffed byte, and no long run of one bit that could decode as nothing


@contextlib.contextmanager
def _mapped(path: str | Path) -> Iterator[mmap.mmap | bytes]:
    """The bytes of the file at ``path``, mapped read-only for the block."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            yield b""
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data


def _markers(data: mmap.mmap | bytes) -> Iterator[tuple[int, int]]:
    """(marker, offset of its 0xFF) of each marker of the JPEG ``data`` after its start of image, in file order: a
    segment passed over by its length, a scan's data searched for the marker after it. Ends at the end of the data,
    or where a marker should start and does not (a damaged or cut file)."""
    pos = len(_SOI)
    while True:
        fill = _FILL.match(data, pos)
        if fill is None or fill.end() == len(data):
            return
        pos = fill.end()
        marker = data[pos]
        yield marker, pos - 1
        pos += 1
        if marker in _NO_SEGMENT:
            continue
        pos += int.from_bytes(data[pos:pos + 2], "big")
        if marker == _SOS:
            found = _SCAN_END.search(data, pos)
            if found is None:
                return
            pos = found.start()


def scans_keep_coefficients(path: str | Path) -> bool:
    """Whether libjpeg must keep every coefficient of the JPEG at ``path`` while it decodes it, whatever the draft
    scale: a progressive frame, or a first scan holding fewer components than the frame (each component, or group,
    then comes in a scan of its own; Pillow marks only the progressive case). Reads the markers up to the first
    start of scan (an EXIF thumbnail's scans, inside an application segment, are passed over); a file of more than
    :data:`_SEGMENTS_READ` markers before it counts as one of several scans, a damaged or cut one as not (Pillow's
    message says what is wrong with it)."""
    with _mapped(path) as data:
        if data[:2] != _SOI:
            return False
        components = None
        for count, (marker, at) in enumerate(_markers(data)):
            if count == _SEGMENTS_READ:
                return True
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
                if marker in _PROGRESSIVE_FRAMES:
                    return True
                components = data[at + 9] if at + 9 < len(data) else None  # after the length, precision, height, width
            elif marker == _SOS:
                return at + 4 < len(data) and components is not None and data[at + 4] < components
    return False


def _picture_end(data: mmap.mmap | bytes) -> int | None:
    """Where the first picture of the JPEG ``data`` ends: the offset of the first marker after a scan that cannot
    come between scans (its end of image, normally), or the data's length if it ends inside a scan; None for a file
    without a scan, or of more than :data:`_SEGMENTS_READ` markers."""
    scanned = False
    for count, (marker, at) in enumerate(_markers(data)):
        if count == _SEGMENTS_READ:
            return None
        if scanned and marker not in _BETWEEN_SCANS:
            return at
        scanned = scanned or marker == _SOS
    return len(data) if scanned else None


def _decode(source: str | Path | io.BytesIO, draft: tuple[int, int] | None) -> Image.Image:
    """The first picture of a JPEG (a path or a file) decoded as a plain JPEG, after ``draft(None, draft)``."""
    picture = JpegImagePlugin.JpegImageFile(source)
    if draft is not None:
        picture.draft(None, draft)
    picture.load()
    return picture


def cut_short(picture: Image.Image, draft: tuple[int, int] | None = None) -> bool:
    """Whether ``picture``, the first picture of a JPEG (or MPO) file, decoded (after ``picture.draft(None,
    draft)``), was decoded from less data than it needs: its data stops before its last block and a marker follows
    (a file cut off, then closed with an end of image), so libjpeg filled in the rest (grey, or unrefined in a
    progressive file) and only warned, which Pillow does not pass on.

    The file's picture is decoded again with :data:`_PROBE` put where its data ends: a complete picture never reads
    those bytes, so the two decodes are equal; one cut short reads them as its missing data, so they differ (or the
    probed one fails). A sequential picture is compared at 1/8 scale (each scan holds its blocks' every coefficient,
    so a cut scan loses their mean colours too: two decodes of ≈ 20 ms for a 12 MP photo); a progressive one at its
    own scale (its last scans refine what a 1/8 scale decode leaves out), against ``picture``. Also costs a copy of
    the file's bytes up to the picture's end.

    Args:
        picture (Image.Image): a JPEG or MPO opened from a file (its ``filename``), loaded, not yet changed.
        draft (tuple[int, int], optional): the size ``picture.draft`` was asked for, in px. Default: None (not
            drafted: full size)

    Raises:
        OSError: the picture cannot be decoded at 1/8 scale (it was at its own).
    """
    with _mapped(picture.filename) as data:
        end = _picture_end(data) if data[:2] == _SOI else None
        if end is None:
            return False
        with memoryview(data) as view:
            probed = b"".join((view[:end], _PROBE, _EOI))
    if picture.info.get("progressive"):
        scale, as_is = draft, picture
    else:
        scale = (1, 1)  # libjpeg's smallest scale, 1/8
        as_is = _decode(picture.filename, scale)
    try:
        probe = _decode(io.BytesIO(probed), scale)
    except OSError:  # it read the probe, and libjpeg could not make a picture of it
        return True
    return probe.size != as_is.size or ImageChops.difference(probe, as_is).getbbox() is not None
