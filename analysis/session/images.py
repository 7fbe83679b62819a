"""Reading user images safely, the model's view of them, and nearest-neighbour upscaling for display.

Intake: :func:`load_image` (files) and :func:`image_from_array` (arrays) accept any image of at most
:data:`MAX_IMAGE_PIXELS` (Pillow's decompression-bomb limit) and :data:`MAX_IMAGE_SIDE_PX` a side, HEIC/HEIF photos
included (read by ``pillow-heif``); a file's bytes are decoded once (cached by their sha256).
An image more than twice the working size is first reduced by an integer factor without being decoded or copied at
full size (JPEG draft mode decodes at 1/2, 1/4 or 1/8 scale; an array is averaged over blocks through a view), then
resampled exactly to at most :data:`WORKING_SIDE_PX` a side. Every image then ends in the same steps
(:func:`_accept`): 16-bit and float values reduced to 8 bits, transparency composited onto white, RGB, and a note
saying what was done (which the app shows).

Memory: a file whose decode is larger than :data:`LARGE_DECODE_PIXELS` (after JPEG draft mode, except for a JPEG of
several scans, progressive or not, whose every coefficient libjpeg keeps: PNG, TIFF, WebP, such JPEGs… near the pixel
limit take up to 1.3 GB while they are read) is decoded one at a time in the process, with at most
one more waiting for it (a third is refused with a message), and the heap is trimmed after each
(:func:`analysis.session.memory.trim_heap`); smaller decodes run freely. A decode that still runs out of memory is
refused with a message about the image.

Positions are ``(row, col)``, with a ``_px`` suffix for image pixels. The images the app shows are the
model input (e.g. 32×32) upscaled by an integer factor, so a click at display pixel ``(row, col)`` is model-input
pixel ``(row // factor, col // factor)`` exactly (:func:`display_to_input_px`).
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
import pillow_heif
from PIL import ExifTags, Image, ImageCms, ImageFile, ImageOps, PngImagePlugin, UnidentifiedImageError
from torch import Tensor

from convnn import ModelCard
from convnn.data import CIFAR10_MEAN, preprocess_image, resize_image

from .caching import bounded_cache
from .jpeg import cut_short, scans_keep_coefficients
from .memory import trim_heap

pillow_heif.register_heif_opener()  # HEIC/HEIF (phone photos) then open through Image.open like any other format


def _text_chunk_or_none(read_text):
    """Pillow's reader of a PNG text chunk (tEXt, zTXt, iTXt), made to pass over one that Pillow refuses as too
    large (over ``MAX_TEXT_CHUNK`` once decompressed, or past ``MAX_TEXT_MEMORY`` in all): the text is metadata
    this app never shows, and the pixels are fine (a 50 MB zTXt comment refused the whole image)."""
    @functools.wraps(read_text)
    def read(stream: PngImagePlugin.PngStream, pos: int, length: int) -> bytes:
        try:
            return read_text(stream, pos, length)
        except ValueError:  # "Decompressed data too large…", "Too much memory used in text chunks"
            stream.fp.seek(pos)
            return ImageFile._safe_read(stream.fp, length)  # the chunk's bytes, for its CRC; its text not kept
    return read


for _chunk in ("chunk_tEXt", "chunk_zTXt", "chunk_iTXt"):
    setattr(PngImagePlugin.PngStream, _chunk, _text_chunk_or_none(getattr(PngImagePlugin.PngStream, _chunk)))

__all__ = [
    "FITS",
    "LARGE_DECODE_PIXELS",
    "LETTERBOX_RGB",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE_PX",
    "WORKING_SIDE_PX",
    "InputImage",
    "clamp_px",
    "display_factor",
    "display_image",
    "display_to_input_px",
    "fit_image",
    "image_from_array",
    "load_image",
    "model_input",
    "model_view",
    "upscale_nearest",
]

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
WORKING_SIDE_PX = 1024  # images are downscaled to at most this side on arrival (the models see 32 px anyway)
DISPLAY_SIDE_PX = 256  # images are shown upscaled to about this side
FITS = ("crop", "letterbox", "stretch")  # how a photo that is not square becomes the square the model sees
LETTERBOX_RGB = tuple(round(255 * m) for m in CIFAR10_MEAN)  # the bars: CIFAR-10's mean colour, a zero model input
BACKGROUND_RGB = (255, 255, 255)  # transparent pixels are composited onto white, as a browser shows them on a page
_REDUCING_GAP = 2.0  # the cheap integer reduction on arrival stops at ≥ this × the working size before the exact
#                      resample: Pillow's default reducing_gap for Image.thumbnail ("very close to fair resampling")
_UINT16_MAX = 65535  # white in a 16-bit image
_ORIENTATIONS_TURNING_90 = frozenset({5, 6, 7, 8})  # EXIF Orientation values (tag 0x0112) that swap width and height
# The formats a file may be opened as (Pillow's format ids): photos and pictures, each decoded by Pillow or
# pillow_heif itself; never one that runs an outside program (EPS runs Ghostscript) or needs one
# (JPEG includes its multi-picture variant, MPO, which Pillow opens through the JPEG opener)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "DIB", "TIFF", "HEIF", "AVIF", "ICO", "PPM", "TGA", "QOI")
_SIDE_IMAGE_FORMATS = frozenset({"MPO"})  # JPEG multi-picture: the extra images are previews, stereo views or HDR
#                                           gain maps of the photo, not frames or pages
_PIXEL_LIMIT = (f"images of up to {MAX_IMAGE_PIXELS:,} px (about {MAX_IMAGE_PIXELS / 1e6:.0f} MP; Pillow refuses "
                "more as a possible decompression bomb) are accepted: please downscale it first")
_SIXTEEN_BIT_NOTE = "a 16-bit image, reduced to 8 bits per pixel"
_TRANSPARENT_NOTE = "transparent pixels were composited onto white (the model sees white there)"
_LAB_NOTE = "its CIE L*a*b* colours were converted to sRGB"
_CUT_SHORT_NOTE = ("the file is cut off: its picture data ends early, so the part of the picture after the cut is "
                   "not the photo's (the decoder fills it in grey, or blurred)")
# What Pillow's and its plugins' decoders raise for a damaged file besides OSError (SyntaxError: a PNG's eXIf chunk
# that is not TIFF; RuntimeError: AVIF/HEIF decoders; IndexError: QOI; NotImplementedError: DDS variants)
_DECODER_ERRORS = (SyntaxError, RuntimeError, IndexError, NotImplementedError, EOFError, KeyError, TypeError,
                   ZeroDivisionError, struct.error)


@dataclass(frozen=True, eq=False)
class InputImage:
    """An RGB image accepted for analysis; hashed and compared by the sha256 of its pixels.

    Attributes:
        pixels (np.ndarray): (H, W, 3) uint8 RGB, at most :data:`WORKING_SIDE_PX` a side.
        digest (str): sha256 of the pixels and shape; the image's cache key.
        note (str): what was done on arrival, clauses joined by "; " (e.g. "downscaled from 6000×4000 to 1024×683
            px", "a 16-bit image, reduced to 8 bits per pixel", transparency composited onto white, only the first
            of several frames used, a JPEG cut off, a far-from-square shape), or "".
    """

    pixels: np.ndarray
    digest: str
    note: str = ""

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputImage) and other.digest == self.digest

    @property
    def pil(self) -> Image.Image:
        """The pixels as a PIL RGB image."""
        return Image.fromarray(self.pixels, "RGB")


def _check_pixels(width: int, height: int, what: str = "the image") -> None:
    """Raise ``ValueError`` when ``width``×``height`` exceeds :data:`MAX_IMAGE_PIXELS` or a side
    :data:`MAX_IMAGE_SIDE_PX` (``what`` names the image): what a decode may cost, known before it starts."""
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"{what} is {width}×{height} px ({width * height / 1e6:.0f} MP); {_PIXEL_LIMIT}")
    if max(width, height) > MAX_IMAGE_SIDE_PX:
        raise ValueError(f"{what} is {width}×{height} px: images of at most {MAX_IMAGE_SIDE_PX:,} px a side are "
                         "accepted (a longer side costs time to decode however few its pixels): please crop or "
                         "downscale it first")


def _reduction_factor(width: int, height: int) -> int:
    """The integer factor a ``width``×``height`` px image is reduced by on arrival, before the exact resample: the
    largest that leaves its longer side ≥ ``_REDUCING_GAP`` × :data:`WORKING_SIDE_PX` (1 up to twice that size)."""
    return max(1, int(max(width, height) / (_REDUCING_GAP * WORKING_SIDE_PX)))


def _to_uint8(values: np.ndarray, white: float, factor: int = 1) -> np.ndarray:
    """Values in 0…``white`` → uint8 0…255 (``white`` → 255, rounded), averaged over ``factor``×``factor`` blocks.

    Args:
        values (np.ndarray): (H, W) or (H, W, C); C = 4 is RGBA with straight (not premultiplied) alpha.
        white (float): the value meaning full intensity (255 for uint8, 65535 for uint16, 1 for bool or float).
        factor (int): block side in pixels; an axis shorter than ``factor`` is averaged over its whole length, and
            the last rows and columns short of a whole block are dropped. Default: 1

    Returns:
        np.ndarray: (H // f, W // f) or (H // f, W // f, C) uint8. The blocks are read through a reshaped view,
        so nothing full-size is copied: the one array made is the float32 result. RGBA colour is averaged weighted
        by alpha (as Pillow reduces RGBA, premultiplied), so that a colour hidden under alpha 0 does not bleed in.
    """
    rows_per_block, cols_per_block = min(factor, values.shape[0]), min(factor, values.shape[1])
    height, width = values.shape[0] // rows_per_block, values.shape[1] // cols_per_block
    channels = values.shape[2] if values.ndim == 3 else 1
    blocks = values[:height * rows_per_block, :width * cols_per_block].reshape(
        height, rows_per_block, width, cols_per_block, channels)  # (H', f, W', f, C), a view
    if channels == 4:
        means = np.empty((height, width, 4), np.float32)
        colour, alpha = means[..., :3], means[..., 3:]  # views, filled in place
        np.einsum("afbgc,afbg->abc", blocks[..., :3], blocks[..., 3], out=colour, dtype=np.float32,
                  casting="unsafe")  # Σ colour · alpha per block
        blocks[..., 3:].sum(axis=(1, 3), dtype=np.float32, out=alpha)  # Σ alpha
        np.divide(colour, alpha, out=colour, where=alpha > 0)  # where Σ alpha = 0, Σ colour · alpha is 0 too
        alpha /= rows_per_block * cols_per_block  # mean alpha
    else:
        means = blocks.mean(axis=(1, 3), dtype=np.float32)
    means *= 255 / white
    np.clip(np.rint(means, out=means), 0, 255, out=means)
    return means.astype(np.uint8).reshape((height, width, channels)[:values.ndim])


def _white_point(pixels: np.ndarray) -> tuple[float, str]:
    """The value meaning full intensity in ``pixels``' dtype and a note ("" unless 16-bit); see
    :func:`image_from_array` for the dtypes accepted. Reads the minimum and maximum of a float array, no copy."""
    if pixels.dtype == np.uint8:
        return 255, ""
    if pixels.dtype == np.bool_:
        return 1, ""
    if pixels.dtype == np.uint16:
        return _UINT16_MAX, _SIXTEEN_BIT_NOTE
    if np.issubdtype(pixels.dtype, np.floating):
        low, high = float(pixels.min()), float(pixels.max())  # NaN propagates to both, ±inf shows in one
        if not (np.isfinite(low) and np.isfinite(high)):
            raise ValueError("the image has NaN or infinite values: a float image must hold values in [0, 1]")
        if low < 0 or high > 1:
            raise ValueError(f"a float image must hold values in [0, 1] (they are scaled to 0–255), got {low:.4g}…"
                             f"{high:.4g}: divide 8-bit values by 255 or pass a uint8 array")
        return 1.0, ""
    raise ValueError(f"an image array must be uint8, uint16, bool or float in [0, 1], got {pixels.dtype}")


def image_from_array(pixels: np.ndarray, note: str = "") -> InputImage:
    """Wrap a pixel array as an :class:`InputImage`, by the same size and transparency rules as :func:`load_image`.

    Args:
        pixels (np.ndarray): (H, W) grey, (H, W, 1) grey, (H, W, 3) RGB or (H, W, 4) RGBA (straight alpha;
            composited onto white), of dtype uint8 (0…255), uint16 (0…65535, reduced to 8 bits as
            :func:`load_image` reads a 16-bit PNG), bool (False black, True white) or float in [0, 1] (scaled to
            0…255); H·W at most :data:`MAX_IMAGE_PIXELS`. An array more than twice the working size is first
            averaged over blocks read through a view (:func:`_to_uint8`), so it is never copied at full size.
        note (str): note to keep with the image. Default: ""

    Returns:
        InputImage: (H', W', 3) uint8 RGB pixels, at most :data:`WORKING_SIDE_PX` a side; its note says what was
        done (16-bit reduced, downscaled, transparency composited…).

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
    white, depth_note = _white_point(pixels)
    factor = _reduction_factor(width, height)
    values = pixels if pixels.dtype == np.uint8 and factor == 1 else _to_uint8(pixels, white, factor)
    return _accept(Image.fromarray(values), (width, height), [note, depth_note])  # PIL's L, RGB or RGBA


def _to_8bit(image: Image.Image, sixteen_bit: bool) -> tuple[Image.Image, str]:
    """32-bit int and float grey images ("I", "F") → 8-bit grey ("L"), so ``convert("RGB")`` does not clip them white.

    Values that came from a 16-bit image (``sixteen_bit``) are scaled by their range (65535 → 255); other ``I`` and
    ``F`` images (whose range is not fixed) are stretched from their min–max to 0–255 (NaN → 0). Other modes are
    returned unchanged. Returns the image and a note ("" when nothing was done).
    """
    if image.mode not in ("I", "F"):
        return image, ""
    values = np.asarray(image, dtype=np.float64)
    if sixteen_bit:
        return Image.fromarray(_to_uint8(values, _UINT16_MAX)), _SIXTEEN_BIT_NOTE
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    scale = 255.0 / (high - low) if high > low else 0.0
    values = np.nan_to_num((values - low) * scale, nan=0.0, posinf=255.0, neginf=0.0)
    kind = "a 32-bit integer" if image.mode == "I" else "a floating-point"
    note = f"{kind} image: its values {low:.4g}…{high:.4g} were stretched to 8 bits (0–255)"
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8)), note


@functools.cache
def _lab_to_srgb() -> ImageCms.ImageCmsTransform:
    return ImageCms.buildTransform(ImageCms.createProfile("LAB"), ImageCms.createProfile("sRGB"), "LAB", "RGB")


def _composite_on_white(image: Image.Image) -> tuple[Image.Image, str]:
    """An image with an alpha band (LA, RGBA: the modes :func:`_accept` leaves transparency in) → RGB composited
    onto :data:`BACKGROUND_RGB` (colour · α + white · (1 − α)), and the note; an image without alpha (LAB's "A" is
    its a* colour band), or fully opaque, is returned unchanged with ""."""
    if image.mode not in ("RGBA", "LA") or image.getchannel("A").getextrema()[0] == 255:
        return image, ""
    composited = Image.new("RGB", image.size, BACKGROUND_RGB)
    composited.paste(image, mask=image.getchannel("A"))
    return composited, _TRANSPARENT_NOTE


def _accept(image: Image.Image, size: tuple[int, int], notes: list[str]) -> InputImage:
    """The steps every image ends in: ``image`` (upright, perhaps already reduced on arrival from ``size`` =
    (width, height) px) → an :class:`InputImage` of at most :data:`WORKING_SIDE_PX` a side.

    Palette, bilevel and 16-bit images are first converted to modes that Pillow resamples properly (RGB, RGBA when
    they carry transparency, 32-bit "I"); then the exact Lanczos downscale (Pillow weights colour by alpha), values
    to 8 bits (:func:`_to_8bit`), transparency onto white (:func:`_composite_on_white`), RGB. The note joins
    ``notes`` (what was done before) and what was done here.
    """
    width, height = size
    sixteen_bit = image.mode.startswith("I;16")
    if sixteen_bit:
        image = image.convert("I")  # Pillow resamples 16-bit values only as 32-bit ones
    elif image.has_transparency_data and image.mode not in ("RGBA", "LA"):
        image = image.convert("RGBA")  # palette + tRNS, PA, a colour key, premultiplied RGBa / La
    elif image.mode in ("1", "P"):
        image = image.convert("RGB")  # Pillow resamples these nearest-neighbour only
    elif image.mode == "LAB":  # Pillow's own convert("RGB") would read L, a*, b* as R, G, B
        image = ImageCms.applyTransform(image, _lab_to_srgb())
        notes.append(_LAB_NOTE)
    image.thumbnail((WORKING_SIDE_PX, WORKING_SIDE_PX), Image.Resampling.LANCZOS, reducing_gap=_REDUCING_GAP)
    if image.size != size:
        notes.append(f"downscaled from {width}×{height} to {image.width}×{image.height} px")
    image, depth_note = _to_8bit(image, sixteen_bit)
    image, alpha_note = _composite_on_white(image)
    pixels = np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))
    digest = hashlib.sha256(pixels.tobytes() + str(pixels.shape).encode()).hexdigest()
    return InputImage(pixels, digest, "; ".join(filter(None, [*notes, depth_note, alpha_note])))


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
    """An opened, not yet decoded image file called ``name`` → :class:`InputImage`: its first frame, reduced on
    arrival, turned upright by its EXIF orientation; decoded within :func:`_decoding`.

    Raises:
        ValueError: the file is corrupt or truncated, or there is not enough memory to decode it (the message says
            so and asks for a smaller image), or :func:`_decoding` refuses it.
    """
    width, height = image.size
    _check_pixels(width, height, name)  # Pillow checked too, unless another library lifted its limit
    factor = _reduction_factor(width, height)
    draft = (-(-width // factor), -(-height // factor)) if factor > 1 else None
    if draft is not None:
        # JPEG: decode at 1/2, 1/4 or 1/8 scale (at most 1/factor); HEIF: decode an embedded thumbnail instead if
        # one is at least that large; other formats: no effect
        image.draft(None, draft)
    notes = []
    try:
        with _decoding(image, name, (width, height)):
            # Whether there is a second frame costs one frame; counting them (n_frames) reads every one of a GIF
            # (2 million 1-pixel frames in 48 MB took 4 s a request)
            if getattr(image, "is_animated", False) and image.format not in _SIDE_IMAGE_FORMATS:
                notes.append(f"the file holds several frames or pages: only frame {image.tell() + 1}, the one shown "
                             "first, is used")
            # PNG: the EXIF chunk may follow the pixels, so reading it decodes the image
            turned = image.getexif().get(ExifTags.Base.Orientation) in _ORIENTATIONS_TURNING_90
            try:
                image.load()  # decodes (at the reduced scale)
            except ValueError as err:  # how pillow_heif reports a corrupt or truncated HEIF (Pillow raises OSError)
                raise _unreadable(name, err) from err
            if image.format in ("JPEG", "MPO") and cut_short(image, draft):  # decoded, but not all from the file
                notes.append(_CUT_SHORT_NOTE)
            ImageOps.exif_transpose(image, in_place=True)  # HEIF: libheif has applied its rotation already and
            #                                                pillow_heif reset the EXIF tag, so nothing turns twice
            return _accept(image, (height, width) if turned else (width, height), notes)
    except MemoryError as err:
        raise ValueError(f"{name} is {width}×{height} px: too large to decode in the memory the server has free, so "
                         "it was not read: downscale it (a few thousand px a side is plenty: the models see 32 px) "
                         "and upload it again") from err


def _unreadable(name: str, err: Exception) -> ValueError:
    """The error for a file called ``name`` that opened as an image but could not be decoded."""
    return ValueError(f"{name} could not be read as an image (truncated or corrupt file?): {err}")


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
        raise _unreadable(path.name, err) from err


def load_image(path: str | Path) -> InputImage:
    """Read an uploaded image file (cached per path, size and modification time).

    Args:
        path (str or Path): the file: any format Pillow reads, and HEIC/HEIF. Of a file with several frames or
            pages (animated GIF, multi-page TIFF, several HEIF images) the first is used, and the note says so.

    Returns:
        InputImage: RGB pixels, turned upright by the EXIF orientation, 16-bit and float images rescaled to 8 bits,
        transparency composited onto white, downscaled to at most :data:`WORKING_SIDE_PX` a side (a large JPEG is
        decoded at 1/2, 1/4 or 1/8 scale first); ``note`` says what was done.

    Raises:
        ValueError: a missing, empty, unreadable or non-image file, or one of more than :data:`MAX_IMAGE_PIXELS`;
            the message names the file (its name only, not the server's path).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no image file at {path.name!r}")
    stat = path.stat()
    return _load_cached(path.resolve(), (stat.st_size, stat.st_mtime_ns))


def fit_image(image: InputImage, fit: str = "crop") -> InputImage:
    """``image`` made square as the user chose, before the model's resize (the pixels cached per image and fit; the
    note is ``image``'s own, never that of an earlier image with the same pixels).

    Args:
        image (InputImage): any shape.
        fit (str): ``"crop"``: the centred square of the shorter side; ``"letterbox"``: the whole image centred on
            a square of :data:`LETTERBOX_RGB` bars; ``"stretch"``: unchanged, so the resize squashes it (how the
            model is fed a training image, which is square already). Default: ``"crop"``

    Returns:
        InputImage: square for crop and letterbox (the same object when ``image`` is square; the same pixels for
        stretch); its note is ``image``'s and what was done ("the model sees the centre 683×683 px of the
        1024×683 px image").

    Raises:
        ValueError: ``fit`` not one of :data:`FITS`.
    """
    if fit not in FITS:
        raise ValueError(f"the fit must be one of {FITS}, got {fit!r}")
    height, width = image.pixels.shape[:2]
    if height == width:
        return image
    fitted = _fitted(image, fit)  # keyed by the pixels: its note is the fit's alone
    return InputImage(fitted.pixels, fitted.digest, "; ".join(filter(None, [image.note, fitted.note])))


@bounded_cache(32)
def _fitted(image: InputImage, fit: str) -> InputImage:
    """The pixels of a ``image`` that is not square made square by ``fit`` (:func:`fit_image`), with a note of
    what the fit did only."""
    height, width = image.pixels.shape[:2]
    if fit == "stretch":
        return InputImage(image.pixels, image.digest, f"the {width}×{height} px image is squashed to a square "
                                                      "(stretch)")
    side = min(height, width) if fit == "crop" else max(height, width)
    if fit == "crop":
        top, left = (height - side) // 2, (width - side) // 2
        pixels = image.pixels[top:top + side, left:left + side]
        note = f"the model sees the centre {side}×{side} px of the {width}×{height} px image (crop)"
    else:
        pixels = np.empty((side, side, 3), np.uint8)
        pixels[:] = LETTERBOX_RGB
        top, left = (side - height) // 2, (side - width) // 2
        pixels[top:top + height, left:left + width] = image.pixels
        note = f"the {width}×{height} px image is shown whole on a {side}×{side} px square with bars (letterbox)"
    pixels = np.ascontiguousarray(pixels)
    return InputImage(pixels, hashlib.sha256(pixels.tobytes() + str(pixels.shape).encode()).hexdigest(), note)


def model_input(image: InputImage, card: ModelCard) -> Tensor:
    """The (1, 3, S, S) float32 normalised model input (S = ``card.input_size``), via :func:`preprocess_image`."""
    return preprocess_image(image.pil, card.input_size, tuple(card.mean), tuple(card.std))


def model_view(image: InputImage, size: int) -> np.ndarray:
    """What the model sees, for display: (S, S, 3) uint8, as :func:`convnn.data.resize_image` makes it."""
    return resize_image(image.pil, size)


def display_factor(side_px: int, target_px: int = DISPLAY_SIDE_PX) -> int:
    """Integer nearest-neighbour upscale factor that brings ``side_px`` to about ``target_px`` (≥ 1)."""
    return max(1, round(target_px / max(side_px, 1)))


def upscale_nearest(pixels: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour upscale of an (H, W, ...) array by an integer ``factor`` → (H·f, W·f, ...)."""
    return pixels.repeat(factor, axis=0).repeat(factor, axis=1)


def display_image(pixels: np.ndarray, factor: int, query_px: tuple[int, int] | None = None) -> np.ndarray:
    """``pixels`` upscaled by ``factor`` (nearest neighbour), with the query pixel outlined if given.

    Args:
        pixels (np.ndarray): (H, W, 3) uint8.
        factor (int): integer upscale factor.
        query_px (tuple[int, int], optional): ``(row_px, col_px)`` in ``pixels``; outlined white with a black inner
            line, one display pixel each. Default: None

    Returns:
        np.ndarray: (H·f, W·f, 3) uint8.
    """
    shown = upscale_nearest(pixels, factor).copy()
    if query_px is not None:
        top, left = query_px[0] * factor, query_px[1] * factor
        for inset, color in ((0, 255), (1, 0)):
            y0, x0 = max(top - 2 + inset, 0), max(left - 2 + inset, 0)
            y1 = min(top + factor + 1 - inset, shown.shape[0] - 1)
            x1 = min(left + factor + 1 - inset, shown.shape[1] - 1)
            shown[y0, x0:x1 + 1] = shown[y1, x0:x1 + 1] = color
            shown[y0:y1 + 1, x0] = shown[y0:y1 + 1, x1] = color
    return shown


def display_to_input_px(x_px: float, y_px: float, factor: int, height: int, width: int) -> tuple[int, int]:
    """A click at display pixel (x, y) (Gradio's order) → ``(row_px, col_px)`` in the un-upscaled image.

    Args:
        x_px, y_px (float): column and row in the displayed (upscaled) image's natural pixels.
        factor (int): the upscale factor of the display.
        height, width (int): size of the un-upscaled image in pixels.

    Raises:
        ValueError: the position lies outside the image.
    """
    row, col = int(y_px // factor), int(x_px // factor)
    if not (0 <= row < height and 0 <= col < width):
        raise ValueError(f"the click (x={x_px}, y={y_px}) is outside the {width * factor}×{height * factor} image")
    return row, col


def clamp_px(query_px: tuple[int, int], height: int, width: int) -> tuple[int, int]:
    """``(row_px, col_px)`` moved to the nearest pixel of a ``height``×``width`` image (unchanged when inside), so
    that a query kept across a change of model or image stays valid."""
    return min(max(query_px[0], 0), height - 1), min(max(query_px[1], 0), width - 1)
