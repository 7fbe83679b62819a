"""Taking user images in safely: :func:`load_image` (files) and :func:`image_from_array` (arrays), and the limits
every image is held to before and while :mod:`analysis.session.image_decode` decodes it.

Intake: any image of at most :data:`MAX_IMAGE_PIXELS` (Pillow's decompression-bomb limit) and
:data:`MAX_IMAGE_SIDE_PX` a side is accepted, HEIC/HEIF photos included, both checked from the header before a
decode starts (:func:`_check_pixels`); a file is opened as one of :data:`IMAGE_FORMATS` only, a PNG's chunk headers
are counted before Pillow parses them (:func:`_check_png_chunks`), and a file's bytes are decoded once (cached by
their sha256). What is refused gets a message that names the image and says what to do.

Memory: a file whose decode is larger than :data:`LARGE_DECODE_PIXELS` (after JPEG draft mode, except for a JPEG of
several scans, progressive or not, whose every coefficient libjpeg keeps: PNG, TIFF, WebP, such JPEGs… near the pixel
limit take up to 1.3 GB while they are read) is decoded one at a time in the process, with at most
one more waiting for it (a third is refused with a message), and the heap is trimmed after each
(:func:`analysis.session.memory.trim_heap`); smaller decodes run freely. A decode that still runs out of memory is
refused with a message about the image.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import struct
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from .image_decode import InputImage, decode_array, decode_file, set_draft, unreadable
from .jpeg import scans_keep_coefficients
from .memory import trim_heap

__all__ = ["LARGE_DECODE_PIXELS", "MAX_IMAGE_PIXELS", "MAX_IMAGE_SIDE_PX", "image_from_array", "load_image"]

_PILLOW_MAX_IMAGE_PIXELS = 1024 * 1024 * 1024 // 4 // 3  # Pillow's default Image.MAX_IMAGE_PIXELS (89,478,485)
MAX_IMAGE_PIXELS = 2 * _PILLOW_MAX_IMAGE_PIXELS  # width × height above which Pillow raises DecompressionBombError by
#                                                  default (≈ 179 MP): larger images are refused, whatever another
#                                                  library has set Image.MAX_IMAGE_PIXELS to (None lifts it)
MAX_IMAGE_SIDE_PX = 65_535  # an image's longer side, at most (JPEG's largest): a decode's cost grows with its rows
#                             as well as its pixels (a PNG of 1 × 178,956,970 px took 4.3 s, one of 2,730 × 65,535 px
#                             0.7 s), so both bounds together bound a decode's time before it starts
LARGE_DECODE_PIXELS = 4096 * 4096  # decodes of more pixels (16.8 MP, ≤ 64 MB as 8-bit RGBA) run one at a time
_LARGE_DECODES_WAITING = 1  # large decodes that may wait for the one running; one more is refused
_LARGE_DECODE_TURNS = threading.BoundedSemaphore(1 + _LARGE_DECODES_WAITING)  # the one running and those waiting
_LARGE_DECODE = threading.Lock()  # held by the large decode running
# The formats a file may be opened as (Pillow's format ids): photos and pictures, each decoded by Pillow or
# pillow_heif itself; never one that runs an outside program (EPS runs Ghostscript) or needs one
# (JPEG includes its multi-picture variant, MPO, which Pillow opens through the JPEG opener)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "DIB", "TIFF", "HEIF", "AVIF", "ICO", "PPM", "TGA", "QOI")
_PIXEL_LIMIT = (f"images of up to {MAX_IMAGE_PIXELS:,} px (about {MAX_IMAGE_PIXELS / 1e6:.0f} MP; Pillow refuses "
                "more as a possible decompression bomb) are accepted: please downscale it first")
# What Pillow's and its plugins' decoders raise for a damaged file besides OSError (SyntaxError: a PNG's eXIf chunk
# that is not TIFF; RuntimeError: AVIF/HEIF decoders; IndexError: QOI; NotImplementedError: DDS variants)
_DECODER_ERRORS = (SyntaxError, RuntimeError, IndexError, NotImplementedError, EOFError, KeyError, TypeError,
                   ZeroDivisionError, struct.error)


def _check_pixels(width: int, height: int, what: str = "the image") -> None:
    """Raise ``ValueError`` when ``width``×``height`` exceeds :data:`MAX_IMAGE_PIXELS` or a side
    :data:`MAX_IMAGE_SIDE_PX` (``what`` names the image): what a decode may cost, known before it starts."""
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"{what} is {width}×{height} px ({width * height / 1e6:.0f} MP); {_PIXEL_LIMIT}")
    if max(width, height) > MAX_IMAGE_SIDE_PX:
        raise ValueError(f"{what} is {width}×{height} px: images of at most {MAX_IMAGE_SIDE_PX:,} px a side are "
                         "accepted (a longer side costs time to decode however few its pixels): please crop or "
                         "downscale it first")


def image_from_array(pixels: np.ndarray, note: str = "") -> InputImage:
    """Wrap a pixel array as an :class:`InputImage`, by the same size and transparency rules as :func:`load_image`.

    Args:
        pixels (np.ndarray): (H, W) grey, (H, W, 1) grey, (H, W, 3) RGB or (H, W, 4) RGBA (straight alpha;
            composited onto white), of dtype uint8 (0…255), uint16 (0…65535, reduced to 8 bits as
            :func:`load_image` reads a 16-bit PNG), bool (False black, True white) or float in [0, 1] (scaled to
            0…255); H·W at most :data:`MAX_IMAGE_PIXELS`. An array more than twice the working size is first
            averaged over blocks read through a view (:func:`~analysis.session.image_decode.decode_array`), so it
            is never copied at full size.
        note (str): note to keep with the image. Default: ""

    Returns:
        InputImage: (H', W', 3) uint8 RGB pixels, at most :data:`~analysis.session.image_decode.WORKING_SIDE_PX` a
        side; its note says what was done (16-bit reduced, downscaled, transparency composited…).

    Raises:
        ValueError: another shape (e.g. (H, W, 2)) or dtype (e.g. int64), an empty image or one of more than
            :data:`MAX_IMAGE_PIXELS`, or a float image with NaN, ±inf or values outside [0, 1]; the message names
            what was received.
    """
    pixels = np.asarray(pixels)
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3, 4)):
        raise ValueError(f"an image must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got shape {pixels.shape}")
    if pixels.shape[0] == 0 or pixels.shape[1] == 0:
        raise ValueError("the image is empty (0 pixels)")
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    height, width = pixels.shape[:2]
    _check_pixels(width, height)  # before anything reads the values
    return decode_array(pixels, note)


@contextlib.contextmanager
def _decoding(image: Image.Image, name: str, full_size: tuple[int, int]) -> Iterator[None]:
    """The block that decodes ``image`` (opened, its draft scale chosen) and reduces it: a large decode (more than
    :data:`LARGE_DECODE_PIXELS`) waits for the one before it; at the end of the block it closes ``image`` (its
    full-size pixels freed) and trims the heap. A smaller decode is not held up. The decode's size is the draft's,
    but that of a JPEG (or MPO) of several scans is its full size (``full_size``, width × height): libjpeg keeps
    every coefficient of the whole image however small the draft (a 179 MP progressive one took 0.5–1 GB at 1/8
    scale, a non-interleaved baseline one 1.1 GB).

    Raises:
        ValueError: a large decode while one runs and :data:`_LARGE_DECODES_WAITING` wait; the message names the
            file (``name``) and its size.
    """
    several_scans = (image.format in ("JPEG", "MPO") and isinstance(getattr(image, "filename", None), str)
                     and scans_keep_coefficients(image.filename))
    width, height = full_size if several_scans else image.size
    if width * height <= LARGE_DECODE_PIXELS:
        yield
        return
    if not _LARGE_DECODE_TURNS.acquire(blocking=False):
        raise ValueError(f"{name} is a large image to decode ({width}×{height} px): the server decodes one image of "
                         f"more than {LARGE_DECODE_PIXELS / 1e6:.1f} MP at a time and one more is waiting already: try "
                         "again in a few seconds, or downscale it first")
    try:
        with _LARGE_DECODE:
            try:
                yield
            finally:
                image.close()
                trim_heap()
    finally:
        _LARGE_DECODE_TURNS.release()


def _accept_file(image: Image.Image, name: str) -> InputImage:
    """An opened, not yet decoded image file called ``name`` → :class:`InputImage`: its size checked
    (:func:`_check_pixels`), then its first frame, reduced on arrival, turned upright by its EXIF orientation
    (:func:`~analysis.session.image_decode.set_draft`, :func:`~analysis.session.image_decode.decode_file`); decoded
    within :func:`_decoding`.

    Raises:
        ValueError: the file is corrupt or truncated, or there is not enough memory to decode it (the message says
            so and asks for a smaller image), or :func:`_check_pixels` or :func:`_decoding` refuses it.
    """
    width, height = image.size
    _check_pixels(width, height, name)  # Pillow checked too, unless another library lifted its limit
    draft = set_draft(image)
    try:
        with _decoding(image, name, (width, height)):
            return decode_file(image, name, (width, height), draft)
    except MemoryError as err:
        raise ValueError(f"{name} is {width}×{height} px: too large to decode in the memory the server has free, so "
                         "it was not read: downscale it (a few thousand px a side is plenty: the models see 32 px) "
                         "and upload it again") from err


@functools.cache
def _openable_formats() -> tuple[str, ...]:
    """:data:`IMAGE_FORMATS` this Pillow has an opener for (Image.open fails on a name it has none for: AVIF
    needs a Pillow built with libavif)."""
    Image.init()
    return tuple(name for name in IMAGE_FORMATS if name in Image.OPEN)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_PIXEL_CHUNKS = frozenset({b"IDAT", b"fdAT"})  # image data (APNG frames: fdAT)
MAX_PNG_CHUNKS = 100_000  # chunks of a PNG, at most (a 100 MB image in 1 KB IDAT chunks has 100 k) …
MAX_PNG_OTHER_CHUNKS = 1_000  # … and of them, at most this many that are not image data (files have a few)


def _check_png_chunks(path: Path) -> None:
    """Walk a PNG's chunk headers (seeking over their data) before Pillow parses them: Pillow spends ≈ 10 µs on
    each, so 2.6 M empty chunks in a 30 MB file of 8×8 px took 25 s of a handler. No effect on other files.

    Raises:
        ValueError: more than :data:`MAX_PNG_CHUNKS` chunks, or :data:`MAX_PNG_OTHER_CHUNKS` that are not image
            data; the message names the file.
    """
    with path.open("rb") as file:
        if file.read(8) != _PNG_SIGNATURE:
            return
        chunks = other = 0
        while header := file.read(8):
            if len(header) < 8:
                return  # a truncated file: Pillow's message says so
            chunks += 1
            if header[4:] not in _PNG_PIXEL_CHUNKS:
                other += 1
            if chunks > MAX_PNG_CHUNKS or other > MAX_PNG_OTHER_CHUNKS:
                raise ValueError(f"{path.name} is a PNG of more than {MAX_PNG_CHUNKS:,} chunks, or more than "
                                 f"{MAX_PNG_OTHER_CHUNKS:,} that hold no pixels: not read (an image needs a few)")
            if header[4:] == b"IEND":
                return
            file.seek(int.from_bytes(header[:4], "big") + 4, 1)  # the data and its CRC


@functools.lru_cache(maxsize=32)
def _load_cached(path: Path, stamp: tuple[int, int]) -> InputImage:
    """The image in the file at ``path`` as it is now (``stamp``: its size and modification time): the decode of
    its bytes (:func:`_decoded`), so the same bytes sent again (a new upload, or the same one written anew) are
    not decoded again."""
    if stamp[0] == 0:
        raise ValueError(f"{path.name} is empty (0 bytes)")
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return _decoded(_Bytes(digest.hexdigest(), path))


@dataclass(frozen=True)
class _Bytes:
    """A file's bytes as a cache key: their sha256 ``content``; ``path`` (where they are now, to read them and name
    them in a message) is not compared."""

    content: str
    path: Path = field(compare=False)


@functools.lru_cache(maxsize=32)
def _decoded(source: _Bytes) -> InputImage:
    """The image in ``source``'s bytes (decoded once per bytes: a copy elsewhere reuses it); its note is what the
    bytes say, and a message names the file they are in."""
    path = source.path
    try:
        _check_png_chunks(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # up to MAX_IMAGE_PIXELS is accepted
            with Image.open(path, formats=_openable_formats()) as image:
                return _accept_file(image, path.name)
    except UnidentifiedImageError as err:
        raise ValueError(f"{path.name} is not an image that can be read (PNG, JPEG, HEIC, AVIF, WebP, BMP, GIF, "
                         "TIFF, ICO, PPM, TGA or QOI)") from err
    except Image.DecompressionBombError as err:
        raise ValueError(f"{path.name} has too many pixels to open safely ({err}); {_PIXEL_LIMIT}") from err
    except (OSError, *_DECODER_ERRORS) as err:
        raise unreadable(path.name, err) from err


def load_image(path: str | Path) -> InputImage:
    """Read an uploaded image file (cached per path, size and modification time).

    Args:
        path (str or Path): the file: any format Pillow reads, and HEIC/HEIF. Of a file with several frames or
            pages (animated GIF, multi-page TIFF, several HEIF images) the first is used, and the note says so.

    Returns:
        InputImage: RGB pixels, turned upright by the EXIF orientation, 16-bit and float images rescaled to 8 bits,
        transparency composited onto white, downscaled to at most
        :data:`~analysis.session.image_decode.WORKING_SIDE_PX` a side (a large JPEG is decoded at 1/2, 1/4 or 1/8
        scale first); ``note`` says what was done.

    Raises:
        ValueError: a missing, empty, unreadable or non-image file, or one of more than :data:`MAX_IMAGE_PIXELS`;
            the message names the file (its name only, not the server's path).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no image file at {path.name!r}")
    stat = path.stat()
    return _load_cached(path.resolve(), (stat.st_size, stat.st_mtime_ns))
