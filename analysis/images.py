"""Reading user images safely, the model's view of them, and nearest-neighbour upscaling for display.

Positions follow STYLE §4: ``(row, col)``, with a ``_px`` suffix for image pixels. The images the app shows are the
model input (e.g. 32×32) upscaled by an integer factor, so a click at display pixel ``(row, col)`` is model-input
pixel ``(row // factor, col // factor)`` exactly (:func:`display_to_input_px`).
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

from convnn import ModelCard
from convnn.data import preprocess_image, resize_image

__all__ = [
    "MAX_IMAGE_SIDE_PX",
    "WORKING_SIDE_PX",
    "InputImage",
    "clamp_px",
    "display_factor",
    "display_image",
    "display_to_input_px",
    "image_from_array",
    "load_image",
    "model_input",
    "model_view",
    "upscale_nearest",
]

MAX_IMAGE_SIDE_PX = 4096  # larger uploads are refused (a 4096² RGB image is 48 MB decoded)
WORKING_SIDE_PX = 1024  # uploads are downscaled to at most this side on arrival (the models see 32 px anyway)
DISPLAY_SIDE_PX = 256  # images are shown upscaled to about this side
MAX_ASPECT_RATIO = 2.0  # longer side / shorter side beyond which the note says the model sees a squashed image
_UINT16_TO_UINT8 = 257  # 65535 / 255: a 16-bit value → 8 bits


@dataclass(frozen=True, eq=False)
class InputImage:
    """An RGB image accepted for analysis; hashed and compared by the sha256 of its pixels.

    Attributes:
        pixels (np.ndarray): (H, W, 3) uint8 RGB, at most :data:`WORKING_SIDE_PX` a side.
        digest (str): sha256 of the pixels and shape; the image's cache key.
        note (str): what was done on arrival (e.g. "downscaled from 3000×2000 px", "a 16-bit image, reduced to
            8 bits per pixel", a far-from-square shape), or "".
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


def _check_side(width: int, height: int, what: str = "the image") -> None:
    """Raise ``ValueError`` when ``width``×``height`` exceeds :data:`MAX_IMAGE_SIDE_PX` a side (``what`` names it)."""
    if max(width, height) > MAX_IMAGE_SIDE_PX:
        raise ValueError(f"{what} is {width}×{height} px; images up to {MAX_IMAGE_SIDE_PX} px a side are accepted: "
                         "please downscale it first")


_SIXTEEN_BIT_NOTE = "a 16-bit image, reduced to 8 bits per pixel"


def _uint16_to_uint8(values: np.ndarray) -> np.ndarray:
    """16-bit values (0…65535) → uint8 (0…255), rounded: 65535 → 255, as a 16-bit PNG is read."""
    return np.clip(np.rint(np.asarray(values, dtype=np.float64) / _UINT16_TO_UINT8), 0, 255).astype(np.uint8)


def _array_to_uint8(pixels: np.ndarray) -> tuple[np.ndarray, str]:
    """Pixel values of an accepted dtype → uint8 and a note ("" when nothing was done); see :func:`image_from_array`."""
    if pixels.dtype == np.uint8:
        return pixels, ""
    if pixels.dtype == np.bool_:
        return pixels.astype(np.uint8) * 255, ""
    if pixels.dtype == np.uint16:
        return _uint16_to_uint8(pixels), _SIXTEEN_BIT_NOTE
    if np.issubdtype(pixels.dtype, np.floating):
        if not np.isfinite(pixels).all():
            raise ValueError("the image has NaN or infinite values: a float image must hold values in [0, 1]")
        low, high = float(pixels.min()), float(pixels.max())
        if low < 0 or high > 1:
            raise ValueError(f"a float image must hold values in [0, 1] (they are scaled to 0–255), got {low:.4g}…"
                             f"{high:.4g}: divide 8-bit values by 255 or pass a uint8 array")
        return np.rint(pixels.astype(np.float64) * 255).astype(np.uint8), ""
    raise ValueError(f"an image array must be uint8, uint16, bool or float in [0, 1], got {pixels.dtype}")


def image_from_array(pixels: np.ndarray, note: str = "") -> InputImage:
    """Wrap a pixel array as an :class:`InputImage` (downscaled to :data:`WORKING_SIDE_PX` if larger).

    Args:
        pixels (np.ndarray): (H, W) grey, (H, W, 1) grey, (H, W, 3) RGB or (H, W, 4) RGBA (converted to RGB), of
            dtype uint8 (0…255), uint16 (0…65535, reduced to 8 bits as :func:`load_image` reads a 16-bit PNG), bool
            (False black, True white) or float in [0, 1] (scaled to 0…255).
        note (str): note to keep with the image. Default: ""

    Returns:
        InputImage: (H', W', 3) uint8 RGB pixels; its note says what was done (16-bit reduced, downscaled…).

    Raises:
        ValueError: another shape (e.g. (H, W, 2)) or dtype (e.g. int64), an empty or oversized image, or a float
            image with NaN, ±inf or values outside [0, 1]; the message names what was received.
    """
    pixels = np.asarray(pixels)
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (1, 3, 4)):
        raise ValueError(f"an image must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got shape {pixels.shape}")
    if pixels.shape[0] == 0 or pixels.shape[1] == 0:
        raise ValueError("the image is empty (0 pixels)")
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    _check_side(pixels.shape[1], pixels.shape[0])  # before any conversion copies it
    values, depth_note = _array_to_uint8(pixels)  # uint8 (H, W), (H, W, 3) or (H, W, 4): PIL's L, RGB or RGBA
    return _accept(Image.fromarray(np.ascontiguousarray(values)), "; ".join(filter(None, [note, depth_note])))


def _to_8bit(image: Image.Image) -> tuple[Image.Image, str]:
    """16-bit and 32-bit int/float grey images → 8-bit grey ("L"), so ``convert("RGB")`` does not clip them white.

    ``I;16*`` modes are scaled by their range (65535 → 255, ÷ :data:`_UINT16_TO_UINT8`); ``I`` and ``F`` (whose
    range is not fixed) are stretched from their min–max to 0–255 (NaN → 0). Other modes are returned unchanged.
    Returns the image and a note ("" when nothing was done).
    """
    if image.mode.startswith("I;16"):
        return Image.fromarray(_uint16_to_uint8(np.asarray(image)), "L"), _SIXTEEN_BIT_NOTE
    if image.mode in ("I", "F"):
        values = np.asarray(image, dtype=np.float64)
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        scale = 255.0 / (high - low) if high > low else 0.0
        values = np.nan_to_num((values - low) * scale, nan=0.0, posinf=255.0, neginf=0.0)
        kind = "a 32-bit integer" if image.mode == "I" else "a floating-point"
        note = f"{kind} image: its values {low:.4g}…{high:.4g} were stretched to 8 bits (0–255)"
    else:
        return image, ""
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), "L"), note


def _accept(image: Image.Image, note: str = "") -> InputImage:
    width, height = image.size
    _check_side(width, height)
    image, depth_note = _to_8bit(image)
    notes = [note, depth_note]
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        notes.append(f"the image is {width}×{height} px, far from square: the model sees it squashed to a square")
    rgb = image.convert("RGB")
    if max(width, height) > WORKING_SIDE_PX:
        rgb.thumbnail((WORKING_SIDE_PX, WORKING_SIDE_PX), Image.Resampling.LANCZOS)
        notes.append(f"downscaled from {width}×{height} to {rgb.width}×{rgb.height} px")
    note = "; ".join(filter(None, notes))
    pixels = np.ascontiguousarray(np.asarray(rgb, dtype=np.uint8))
    digest = hashlib.sha256(pixels.tobytes() + str(pixels.shape).encode()).hexdigest()
    return InputImage(pixels, digest, note)


@functools.lru_cache(maxsize=32)
def _load_cached(path: Path, stamp: tuple[int, int]) -> InputImage:
    if stamp[0] == 0:
        raise ValueError(f"{path.name} is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                _check_side(*image.size, path.name)
                image.load()
                return _accept(ImageOps.exif_transpose(image))  # upright as a photo viewer shows it
    except UnidentifiedImageError as err:
        raise ValueError(f"{path.name} is not an image that can be read (PNG, JPEG, WebP, BMP, GIF…)") from err
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ValueError(f"{path.name} has too many pixels to open safely: {err}") from err
    except OSError as err:
        raise ValueError(f"{path.name} could not be read as an image (truncated or corrupt file?): {err}") from err


def load_image(path: str | Path) -> InputImage:
    """Read an uploaded image file (cached per path, size and modification time).

    Args:
        path (str or Path): the file.

    Returns:
        InputImage: RGB pixels, turned upright by the EXIF orientation, 16-bit and float images rescaled to 8 bits,
        downscaled to at most :data:`WORKING_SIDE_PX` a side (``note`` says what was done).

    Raises:
        ValueError: a missing, empty, unreadable or non-image file, or one over :data:`MAX_IMAGE_SIDE_PX` a side.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no image file at {path.name!r}")
    stat = path.stat()
    return _load_cached(path.resolve(), (stat.st_size, stat.st_mtime_ns))


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
