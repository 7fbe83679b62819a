"""Image intake as people bring images: transparency, phone photos (large JPEGs, HEIC), several frames, huge arrays.

The large images are made on the fly: flat colours encode and decode in well under a second.
"""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pillow_heif
import pytest
from PIL import Image, ImageFile

from analysis import image_from_array, load_image
from analysis.session.images import MAX_IMAGE_PIXELS
from tests.image_files import png_claiming_size

RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)
TRANSPARENT_NOTE = "transparent pixels were composited onto white (the model sees white there)"
ORIENTATION_TAG = 0x0112  # EXIF Orientation
ROTATE_90_CLOCKWISE_TO_SHOW = 6  # EXIF orientation: the stored image is shown turned 90° clockwise
LIMIT_MESSAGE = f"images of up to {MAX_IMAGE_PIXELS:,} px"


def _half_transparent_files(tmp_path):
    """8×8 images, left half transparent with a colour hidden under alpha 0, right half opaque, in every mode that
    carries transparency: RGBA, LA, palette + tRNS ("P" with info["transparency"]) and palette + alpha ("PA")."""
    left = np.arange(8) < 4
    rgba = np.where(left[None, :, None], (*RED, 0), (*BLUE, 255)).astype(np.uint8).repeat(8, axis=0)
    la = np.where(left[None, :, None], (0, 0), (50, 255)).astype(np.uint8).repeat(8, axis=0)
    index = np.where(left, 0, 1).astype(np.uint8)[None].repeat(8, axis=0)
    palette = Image.fromarray(index, "P")
    palette.putpalette([*RED, *BLUE])
    palette_alpha = Image.merge("PA", [palette, Image.fromarray(np.where(index == 0, 0, 255).astype(np.uint8))])
    palette_alpha.putpalette([*RED, *BLUE])
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    palette.save(tmp_path / "palette.png", transparency=0)
    palette_alpha.save(tmp_path / "palette_alpha.tiff")
    return {"RGBA": (tmp_path / "rgba.png", BLUE), "LA": (tmp_path / "la.png", (50, 50, 50)),
            "P": (tmp_path / "palette.png", BLUE), "PA": (tmp_path / "palette_alpha.tiff", BLUE)}


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "PA"])
def test_transparent_pixels_of_files_are_white_not_the_hidden_colour(tmp_path, mode):
    path, opaque = _half_transparent_files(tmp_path)[mode]
    with Image.open(path) as opened:
        assert opened.mode == mode
    image = load_image(path)
    assert (image.pixels[:, :4] == WHITE).all()  # was red (RGBA, P, PA) or black (LA): what hides under alpha 0
    assert (image.pixels[:, 4:] == opaque).all()
    assert image.note == TRANSPARENT_NOTE


@pytest.mark.parametrize(("dtype", "white"), [(np.uint8, 255), (np.uint16, 65535), (np.float32, 1.0)])
def test_transparent_pixels_of_arrays_are_white_and_half_transparent_ones_half_white(dtype, white):
    rgba = np.zeros((4, 4, 4), np.float64)
    rgba[:, :2] = (1, 0, 0, 0)  # red under alpha 0
    rgba[:, 2:] = (1, 0, 0, 128 / 255)  # red at alpha 128
    values = rgba * white
    image = image_from_array((values.round() if np.issubdtype(dtype, np.integer) else values).astype(dtype))
    assert (image.pixels[:, :2] == WHITE).all()
    np.testing.assert_allclose(image.pixels[:, 2:], np.broadcast_to((255, 127, 127), (4, 2, 3)), atol=1)
    assert image.note.endswith(TRANSPARENT_NOTE)


def test_an_opaque_rgba_image_gets_no_transparency_note():
    image = image_from_array(np.full((4, 4, 4), (10, 20, 30, 255), np.uint8))
    assert (image.pixels == (10, 20, 30)).all() and image.note == ""


def test_a_large_rgba_array_is_reduced_without_the_hidden_colour_bleeding_in():
    """Alternate columns: transparent red, opaque blue. Averaged with alpha as weight (as Pillow does), every pixel
    is half blue, half white; an unweighted average would tint it red."""
    rgba = np.zeros((16, 6000, 4), np.uint8)
    rgba[:, 0::2] = (*RED, 0)
    rgba[:, 1::2] = (*BLUE, 255)
    image = image_from_array(rgba)
    assert image.pixels.shape == (3, 1024, 3)
    np.testing.assert_allclose(image.pixels.reshape(-1, 3), np.broadcast_to((128, 128, 255), (3 * 1024, 3)), atol=1)
    assert image.note.endswith(f"downscaled from 6000×16 to 1024×3 px; {TRANSPARENT_NOTE}")


@pytest.mark.parametrize(("width", "height", "draft_scale"), [(6000, 4000, 2), (8000, 6000, 2), (12000, 9000, 4)],
                         ids=["24MP", "48MP", "108MP"])
def test_phone_jpegs_are_decoded_at_a_reduced_scale_upright_and_downscaled(tmp_path, monkeypatch, width, height,
                                                                          draft_scale):
    """Phone photos (24 and 48 MP, and 108 MP, above Pillow's warning limit of 89 MP) were refused at 4096 px a
    side. Now JPEG draft mode decodes them at 1/2…1/8 scale (never the full size), still ≥ 2× the working size, and
    the EXIF orientation is applied to the reduced image."""
    stored = Image.new("RGB", (width, height), BLUE)
    stored.paste(RED, (0, 0, width // 2, height))  # left half red → top half once upright (orientation 6)
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = ROTATE_90_CLOCKWISE_TO_SHOW
    stored.save(tmp_path / "phone.jpg", exif=exif, quality=80)
    decoded, load = [], ImageFile.ImageFile.load

    def recording_load(image):
        if image.tile:  # not decoded yet: this call decodes it
            decoded.append(image.size)
        return load(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", recording_load)

    image = load_image(tmp_path / "phone.jpg")
    assert decoded == [(width // draft_scale, height // draft_scale)]
    shown_width = round(1024 * height / width)
    assert image.pixels.shape == (1024, shown_width, 3)
    top, bottom = image.pixels[:480].astype(int), image.pixels[-480:].astype(int)
    assert top[..., 0].min() > 200 and top[..., 2].max() < 60
    assert bottom[..., 2].min() > 200 and bottom[..., 0].max() < 60
    assert image.note == f"downscaled from {height}×{width} to {shown_width}×1024 px"


def test_heic_photos_are_read_upright(tmp_path):
    """HEIF stores the rotation as an image transform that libheif applies (pillow_heif then clears the EXIF tag,
    so the image must not be turned a second time)."""
    stored = np.zeros((32, 64, 3), np.uint8)
    stored[:, :32] = RED  # left half red → top half once upright
    stored[:, 32:] = BLUE
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = ROTATE_90_CLOCKWISE_TO_SHOW
    pillow_heif.from_pillow(Image.fromarray(stored)).save(tmp_path / "phone.heic", exif=exif.tobytes(), quality=95)
    image = load_image(tmp_path / "phone.heic")  # was "not an image that can be read"
    pixels = image.pixels.astype(int)
    assert pixels.shape == (64, 32, 3) and image.note == ""
    assert pixels[:28, :, 0].min() > 200 and pixels[:28, :, 2].max() < 60
    assert pixels[36:, :, 2].min() > 200 and pixels[36:, :, 0].max() < 60


def _several_frames(tmp_path):
    """Each file: a red first frame, then others (distinct, so that the GIF writer keeps them apart)."""
    frames = [Image.new("RGB", (8, 8), colour) for colour in (RED, BLUE, (0, 255, 0))]
    frames[0].save(tmp_path / "animated.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    frames[0].save(tmp_path / "pages.tiff", save_all=True, append_images=frames[1:2])
    burst = pillow_heif.from_pillow(frames[0])
    burst.add_from_pillow(frames[1])
    burst.save(tmp_path / "burst.heic", quality=95)
    frames[0].save(tmp_path / "photo.mpo", save_all=True, append_images=frames[1:2])  # a gain map or a stereo view
    return {"animated.gif": 3, "pages.tiff": 2, "burst.heic": 2, "photo.mpo": 1}


def test_files_with_several_frames_or_pages_say_that_the_first_is_used(tmp_path):
    for name, frames in _several_frames(tmp_path).items():
        image = load_image(tmp_path / name)
        assert (np.abs(image.pixels.astype(int) - RED) < 8).all(), name
        expected = f"the file holds {frames} frames or pages: only frame 1, the one shown first, is used"
        assert image.note == (expected if frames > 1 else ""), name  # MPO's extra images are not pages


def test_images_up_to_the_decompression_bomb_limit_are_the_rule_for_files_and_arrays(tmp_path, monkeypatch):
    """Pillow refuses more than 2 × Image.MAX_IMAGE_PIXELS (≈ 179 MP) as a possible decompression bomb; that is the
    one limit, for files and arrays, and it holds even when another library lifts Pillow's."""
    bomb = png_claiming_size(tmp_path / "bomb.png", 20_000, 10_000)
    with pytest.raises(ValueError, match=f"^bomb\\.png has too many pixels to open safely .*; {LIMIT_MESSAGE}"):
        load_image(bomb)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with pytest.raises(ValueError, match=f"^bomb\\.png is 20000×10000 px \\(200 MP\\); {LIMIT_MESSAGE}"):
        load_image(bomb)  # refused before decoding, not "truncated"
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    with pytest.raises(ValueError, match=f"^the image is {side}×{side} px \\(179 MP\\); {LIMIT_MESSAGE}"):
        image_from_array(np.broadcast_to(np.uint8(0), (side, side, 3)))  # no pixel is read


def test_huge_arrays_are_accepted_and_downscaled_without_a_full_size_copy():
    """A 108 MP float64 array (864 MB) was refused at 4096 px a side. It is reduced through a view: the peak
    allocation stays below even one full-size uint8 copy."""
    pixels = np.broadcast_to(np.float64(0.5), (9000, 12000))
    tracemalloc.start()
    try:
        image = image_from_array(pixels)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < pixels.size  # bytes of a uint8 copy
    assert image.pixels.shape == (768, 1024, 3) and (image.pixels == 128).all()
    assert image.note == "downscaled from 12000×9000 to 1024×768 px"


def test_a_truncated_heic_is_a_clear_error_naming_the_file(tmp_path):
    """pillow_heif reports a HEIF whose image data is cut short as a ValueError of its own, naming no file."""
    buffer = io.BytesIO()
    pillow_heif.from_pillow(Image.new("RGB", (64, 64), RED)).save(buffer, quality=95)
    (tmp_path / "cut.heic").write_bytes(buffer.getvalue()[:-10])  # the image data comes last
    with pytest.raises(ValueError, match=r"^cut\.heic could not be read as an image \(truncated or corrupt file\?\)"):
        load_image(tmp_path / "cut.heic")
