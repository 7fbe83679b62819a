"""How an image becomes the pixels the analysis reads: the :class:`InputImage` and the decode behind it.

A file that :mod:`analysis.session.image_intake` has opened and checked is decoded here (:func:`decode_file`): its
first frame, turned upright by its EXIF orientation, a JPEG cut off noted; HEIC/HEIF photos are read by
``pillow-heif``, and a PNG text chunk too large for Pillow is passed over (:func:`_text_chunk_or_none`). An image more
than twice the working size is first reduced by an integer factor without being decoded or copied at full size (JPEG
draft mode decodes at 1/2, 1/4 or 1/8 scale, :func:`set_draft`; an array is averaged over blocks through a view,
:func:`decode_array`), then resampled exactly to at most :data:`WORKING_SIDE_PX` a side. Every image then ends in the
same steps (:func:`_accept`): 16-bit and float values reduced to 8 bits, transparency composited onto white, RGB, and
a note saying what was done (which the app shows).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import pillow_heif
from PIL import ExifTags, Image, ImageCms, ImageFile, ImageOps, PngImagePlugin

from .jpeg import cut_short

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

__all__ = ["WORKING_SIDE_PX", "InputImage", "decode_array", "decode_file", "set_draft", "unreadable"]

WORKING_SIDE_PX = 1024  # images are downscaled to at most this side on arrival (the models see 32 px anyway)
BACKGROUND_RGB = (255, 255, 255)  # transparent pixels are composited onto white, as a browser shows them on a page
_REDUCING_GAP = 2.0  # the cheap integer reduction on arrival stops at ≥ this × the working size before the exact
#                      resample: Pillow's default reducing_gap for Image.thumbnail ("very close to fair resampling")
_UINT16_MAX = 65535  # white in a 16-bit image
_ORIENTATIONS_TURNING_90 = frozenset({5, 6, 7, 8})  # EXIF Orientation values (tag 0x0112) that swap width and height
_SIDE_IMAGE_FORMATS = frozenset({"MPO"})  # JPEG multi-picture: the extra images are previews, stereo views or HDR
#                                           gain maps of the photo, not frames or pages
_SIXTEEN_BIT_NOTE = "a 16-bit image, reduced to 8 bits per pixel"
_TRANSPARENT_NOTE = "transparent pixels were composited onto white (the model sees white there)"
_LAB_NOTE = "its CIE L*a*b* colours were converted to sRGB"
_CUT_SHORT_NOTE = ("the file is cut off: its picture data ends early, so the part of the picture after the cut is "
                   "not the photo's (the decoder fills it in grey, or blurred)")


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
    :func:`~analysis.session.image_intake.image_from_array` for the dtypes accepted. Reads the minimum and maximum
    of a float array, no copy."""
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


def decode_array(pixels: np.ndarray, note: str = "") -> InputImage:
    """A pixel array that :func:`~analysis.session.image_intake.image_from_array` has checked → :class:`InputImage`:
    its values read as its dtype says (:func:`_white_point`), averaged over blocks through a view when it is more
    than twice the working size (:func:`_to_uint8`), then :func:`_accept`.

    Args:
        pixels (np.ndarray): (H, W) grey, (H, W, 3) RGB or (H, W, 4) RGBA (straight alpha), H·W within the limits;
            of a dtype :func:`_white_point` accepts.
        note (str): note to keep with the image. Default: ""

    Returns:
        InputImage: (H', W', 3) uint8 RGB pixels, at most :data:`WORKING_SIDE_PX` a side.

    Raises:
        ValueError: a dtype other than uint8, uint16, bool or float, or a float image with NaN, ±inf or values
            outside [0, 1].
    """
    height, width = pixels.shape[:2]
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


def set_draft(image: Image.Image) -> tuple[int, int] | None:
    """Choose the scale an opened, not yet decoded ``image`` is decoded at (reduced on arrival by
    :func:`_reduction_factor`): returns the (width, height) px asked of its decoder, or None when it is decoded at
    full size."""
    width, height = image.size
    factor = _reduction_factor(width, height)
    draft = (-(-width // factor), -(-height // factor)) if factor > 1 else None
    if draft is not None:
        # JPEG: decode at 1/2, 1/4 or 1/8 scale (at most 1/factor); HEIF: decode an embedded thumbnail instead if
        # one is at least that large; other formats: no effect
        image.draft(None, draft)
    return draft


def decode_file(image: Image.Image, name: str, size: tuple[int, int], draft: tuple[int, int] | None) -> InputImage:
    """Decode an opened image file called ``name`` → :class:`InputImage`: its first frame, at the scale
    :func:`set_draft` chose, turned upright by its EXIF orientation, then :func:`_accept`.

    Args:
        image (Image.Image): opened, its draft scale chosen, not yet decoded.
        name (str): the file's name, for a message.
        size (tuple[int, int]): ``image``'s full (width, height) px, before the draft.
        draft (tuple[int, int] or None): what :func:`set_draft` returned.

    Returns:
        InputImage: its note says what was done (only the first of several frames used, a JPEG cut off, …).

    Raises:
        ValueError: a HEIF that pillow_heif finds corrupt or truncated (:func:`unreadable`). A damaged file of
            another format raises what Pillow's decoders raise (OSError…), and a decode larger than the memory
            free MemoryError: the caller turns those into messages.
    """
    width, height = size
    notes = []
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
        raise unreadable(name, err) from err
    if image.format in ("JPEG", "MPO") and cut_short(image, draft):  # decoded, but not all from the file
        notes.append(_CUT_SHORT_NOTE)
    ImageOps.exif_transpose(image, in_place=True)  # HEIF: libheif has applied its rotation already and
    #                                                pillow_heif reset the EXIF tag, so nothing turns twice
    return _accept(image, (height, width) if turned else (width, height), notes)


def unreadable(name: str, err: Exception) -> ValueError:
    """The error for a file called ``name`` that opened as an image but could not be decoded."""
    return ValueError(f"{name} could not be read as an image (truncated or corrupt file?): {err}")
