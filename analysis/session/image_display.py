"""The model's view of an accepted image and the app's display of it: :func:`fit_image` makes a photo square as the
user chose (crop, letterbox or stretch), :func:`model_input` and :func:`model_view` resize it to the model's input,
and :func:`display_image` upscales that by an integer factor (nearest neighbour) for display.

Positions are ``(row, col)``, with a ``_px`` suffix for image pixels. The images the app shows are the
model input (e.g. 32×32) upscaled by an integer factor, so a click at display pixel ``(row, col)`` is model-input
pixel ``(row // factor, col // factor)`` exactly (:func:`display_to_input_px`).
"""

from __future__ import annotations

import hashlib

import numpy as np
from torch import Tensor

from convnn import ModelCard
from convnn.data import CIFAR10_MEAN, preprocess_image, resize_image

from .caching import bounded_cache
from .image_decode import InputImage

__all__ = [
    "FITS",
    "LETTERBOX_RGB",
    "clamp_px",
    "display_factor",
    "display_image",
    "display_to_input_px",
    "fit_image",
    "model_input",
    "model_view",
    "upscale_nearest",
]

DISPLAY_SIDE_PX = 256  # images are shown upscaled to about this side
FITS = ("crop", "letterbox", "stretch")  # how a photo that is not square becomes the square the model sees
LETTERBOX_RGB = tuple(round(255 * m) for m in CIFAR10_MEAN)  # the bars: CIFAR-10's mean colour, a zero model input


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
