"""Image intake as people bring images: transparency, phone photos (large JPEGs, HEIC), several frames, huge arrays.

The large images are made on the fly: flat colours encode and decode in well under a second.
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import os
import struct
import sys
import threading
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pillow_heif
import pytest
from PIL import GifImagePlugin, Image, ImageFile

from analysis import OUT_OF_MEMORY_MESSAGE, image_from_array, load_image, user_error_message
from analysis.session import image_intake
from analysis.session.image_intake import MAX_IMAGE_PIXELS
from tests.image_files import grey_jpeg_one_scan_per_component, png_claiming_size

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
    eighth = (width // 8, height // 8)  # whether the file is cut short: it as is and probed (jpeg.cut_short)
    assert decoded == [(width // draft_scale, height // draft_scale), eighth, eighth]  # never the full size
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


def test_files_with_several_frames_or_pages_say_that_the_first_is_used(tmp_path, monkeypatch):
    """Without counting the frames: a GIF's n_frames reads every frame (2 million 1-pixel frames in a 48 MB file
    took 4 s a request), so it must not be asked for."""
    def counted(self):
        raise AssertionError("n_frames read")

    monkeypatch.setattr(GifImagePlugin.GifImageFile, "n_frames", property(counted))
    for name, frames in _several_frames(tmp_path).items():
        image = load_image(tmp_path / name)
        assert (np.abs(image.pixels.astype(int) - RED) < 8).all(), name
        expected = "the file holds several frames or pages: only frame 1, the one shown first, is used"
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


CUT_SHORT_NOTE = ("the file is cut off: its picture data ends early, so the part of the picture after the cut is not "
                  "the photo's (the decoder fills it in grey, or blurred)")


@pytest.mark.parametrize("progressive", [False, True])
def test_a_jpeg_cut_off_says_so_in_its_note(tmp_path, progressive):
    """A JPEG cut off, then closed with an end of image, was shown with no note: libjpeg fills in what is missing
    (grey, or unrefined in a progressive file) and only warns, which Pillow does not pass on. Its note says so; the
    whole file, one with bytes after its end, and an MPO whose side picture alone is cut, say nothing."""
    rows, cols = np.mgrid[0:300, 0:400]
    colours = np.stack([cols * 255 // 400, rows * 255 // 300, (rows + cols) % 256], -1)
    picture = Image.fromarray(colours.astype(np.uint8))
    picture.save(tmp_path / "whole.jpg", quality=90, progressive=progressive)
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[:len(data) * 3 // 4] + b"\xff\xd9")  # its last quarter lost
    (tmp_path / "trailing.jpg").write_bytes(data + b"\x00 bytes after the end \xff\xd9")
    picture.save(tmp_path / "side.mpo", format="MPO", quality=90, progressive=progressive, save_all=True,
                 append_images=[picture.resize((40, 30))])
    (tmp_path / "side.mpo").write_bytes((tmp_path / "side.mpo").read_bytes()[:-100])
    whole, cut = load_image(tmp_path / "whole.jpg"), load_image(tmp_path / "cut.jpg")
    assert cut.note == CUT_SHORT_NOTE
    assert [load_image(tmp_path / name).note for name in ("whole.jpg", "trailing.jpg", "side.mpo")] == ["", "", ""]
    np.testing.assert_array_equal(load_image(tmp_path / "side.mpo").pixels, whole.pixels)
    off = np.abs(cut.pixels.astype(int) - whole.pixels.astype(int)).max(axis=2)  # how far from the photo, per pixel
    if progressive:  # its last quarter refined what the first scans drew: all the photo's, less sharp
        assert off.mean() > 0.5 and off.max() < 64
    else:  # a sequential file's blocks after the cut are filled grey
        assert off[:200].max() == 0 and np.abs(cut.pixels[-20:].astype(int) - 128).max() <= 2
    (tmp_path / "cut.jpg").write_bytes(data[:len(data) * 3 // 4])  # no end of image: libjpeg stops, Pillow refuses
    with pytest.raises(ValueError, match=r"^cut\.jpg could not be read as an image \(truncated or corrupt file\?\)"):
        load_image(tmp_path / "cut.jpg")


def test_a_truncated_heic_is_a_clear_error_naming_the_file(tmp_path):
    """pillow_heif reports a HEIF whose image data is cut short as a ValueError of its own, naming no file."""
    buffer = io.BytesIO()
    pillow_heif.from_pillow(Image.new("RGB", (64, 64), RED)).save(buffer, quality=95)
    (tmp_path / "cut.heic").write_bytes(buffer.getvalue()[:-10])  # the image data comes last
    with pytest.raises(ValueError, match=r"^cut\.heic could not be read as an image \(truncated or corrupt file\?\)"):
        load_image(tmp_path / "cut.heic")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_a_decoder_error_of_any_kind_is_a_clear_error_naming_the_file(tmp_path):
    """A PNG whose eXIf chunk is not TIFF made Pillow raise SyntaxError, shown in the page as a bare "Error"."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), RED).save(buffer, format="PNG")
    png = buffer.getvalue()
    at = png.index(b"IDAT") - 4
    (tmp_path / "exif.png").write_bytes(png[:at] + _chunk(b"eXIf", b"NOTATIFF" * 3) + png[at:])
    with pytest.raises(ValueError, match=r"^exif\.png could not be read as an image \(truncated or corrupt file\?\)"):
        load_image(tmp_path / "exif.png")


def _png_of_chunks(ancillary: int, idat_pieces: int) -> bytes:
    """An 8×8 red PNG with ``ancillary`` empty private chunks before its pixels, its image data split into
    ``idat_pieces`` IDAT chunks."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), RED).save(buffer, format="PNG")
    png = buffer.getvalue()
    start = png.index(b"IDAT") - 4
    size = struct.unpack(">I", png[start:start + 4])[0]
    data, end = png[start + 8:start + 8 + size], start + 12 + size
    cuts = np.linspace(0, len(data), idat_pieces + 1).astype(int)
    pieces = b"".join(_chunk(b"IDAT", data[a:b]) for a, b in itertools.pairwise(cuts))
    return png[:start] + _chunk(b"prVt", b"") * ancillary + pieces + png[end:]


def test_a_png_of_millions_of_chunks_is_refused_before_pillow_parses_them(tmp_path):
    """2.6 M empty chunks in a 30 MB file of 8×8 px kept a handler busy 25 s (Pillow: ≈ 10 µs a chunk); IHDR and
    IEND count among the chunks that hold no pixels, so 998 private ones make 1,000."""
    for ancillary, pieces, readable in ((998, 1, True), (999, 1, False), (0, 5_000, True), (0, 100_001, False)):
        (tmp_path / "c.png").write_bytes(_png_of_chunks(ancillary, pieces))
        if readable:
            assert (load_image(tmp_path / "c.png").pixels == RED).all()
        else:
            with pytest.raises(ValueError, match=r"^c\.png is a PNG of more than 100,000 chunks, or more than 1,000"):
                load_image(tmp_path / "c.png")
        image_intake._load_cached.cache_clear()


def test_only_picture_formats_are_opened_never_one_that_runs_a_program(tmp_path, monkeypatch):
    """Pillow opens EPS through Ghostscript, an outside program: an uploaded .eps would run it. Files are opened
    as one of IMAGE_FORMATS only; an image in another format (PCX here) is refused, naming what is read."""
    from PIL import EpsImagePlugin

    monkeypatch.setattr(EpsImagePlugin, "gs_binary", "/bin/false")  # were it ever called
    (tmp_path / "x.eps").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\nshowpage\n")
    Image.new("RGB", (8, 8), RED).save(tmp_path / "red.pcx")
    for name in ("x.eps", "red.pcx"):
        with pytest.raises(ValueError, match=rf"^{name.replace('.', '[.]')} is not an image that can be read \(PNG,"):
            load_image(tmp_path / name)
    Image.new("RGB", (8, 8), RED).save(tmp_path / "red.qoi")  # a listed one opens
    assert (load_image(tmp_path / "red.qoi").pixels == RED).all()


def test_a_lab_image_is_converted_to_srgb_not_masked_by_its_a_band(tmp_path):
    """LAB's bands are L, A, B: its a* band was taken for alpha ("transparent pixels were composited onto white").
    Pillow's LAB encoding: L · 255/100, a* + 128, b* + 128; sRGB red is L* 53.2, a* 80.1, b* 67.2 (CIE, D65)."""
    Image.new("LAB", (16, 16), (round(53.24 * 2.55), 128 + 80, 128 + 67)).save(tmp_path / "red.tif")
    loaded = load_image(tmp_path / "red.tif")
    assert np.abs(loaded.pixels.astype(int) - [255, 0, 0]).max() <= 12
    assert "L*a*b*" in loaded.note and "transparent" not in loaded.note


def test_the_pixel_limit_is_the_same_whatever_pillows_setting_at_import(monkeypatch):
    """The limit was 2 × Image.MAX_IMAGE_PIXELS at import: after a library that lifts Pillow's limit (None), importing
    the module raised a TypeError (2 * None)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    spec = importlib.util.spec_from_file_location("analysis.session._image_intake_again", image_intake.__file__)
    again = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, again)  # for its dataclasses; gone after the test
    spec.loader.exec_module(again)  # a fresh copy of the module, imported with the limit lifted
    assert again.MAX_IMAGE_PIXELS == MAX_IMAGE_PIXELS == 178_956_970


class _ContendedLock:
    """A lock that says when a thread has to wait for it."""

    def __init__(self) -> None:
        self._lock, self.contended = threading.Lock(), threading.Event()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()


def test_a_jpeg_of_several_scans_counts_its_full_size_as_its_decode(tmp_path, monkeypatch):
    """Draft mode decodes a large JPEG at 1/2…1/8 scale, but libjpeg keeps every coefficient of a JPEG of several
    scans at full size: six 179 MP progressive JPEGs (2 MB files) decoded side by side took 3 GB, a non-interleaved
    baseline one 1.1 GB, a progressive one saved as MPO passed as one. Such a JPEG is a large decode by its full
    size (it waits its turn); a baseline, interleaved one of the same size (camera photos, with their EXIF
    thumbnail) by its draft's."""
    width, height = 8192, 4096  # drafted to 1/4 (2048 × 1024): the largest scale that keeps ≥ 2 × 1024 px
    monkeypatch.setattr(image_intake, "LARGE_DECODE_PIXELS", width * height // 4)  # the draft's size is not large
    turns = []

    class Turn:
        def __enter__(self):
            turns.append(True)

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(image_intake, "_LARGE_DECODE", Turn())
    picture = Image.new("RGB", (width, height), RED)
    picture.save(tmp_path / "baseline.jpg")
    thumbnail = io.BytesIO()  # a thumbnail of several scans inside an application segment, as cameras embed one
    Image.new("RGB", (160, 120), RED).save(thumbnail, "JPEG", progressive=True)
    baseline = (tmp_path / "baseline.jpg").read_bytes()
    (tmp_path / "baseline.jpg").write_bytes(baseline[:2] + struct.pack(">HH", 0xFFE9, len(thumbnail.getvalue()) + 2)
                                            + thumbnail.getvalue() + baseline[2:])
    picture.save(tmp_path / "progressive.jpg", progressive=True)
    picture.save(tmp_path / "progressive.mpo", format="MPO", progressive=True, save_all=True,
                 append_images=[Image.new("RGB", (8, 8))])
    grey_jpeg_one_scan_per_component(tmp_path / "non-interleaved.jpg", width, height)
    for name, several_scans in (("baseline.jpg", False), ("progressive.jpg", True), ("progressive.mpo", True),
                                ("non-interleaved.jpg", True)):
        turns.clear()
        assert load_image(tmp_path / name).pixels.shape[:2] == (512, 1024)
        assert turns == ([True] if several_scans else []), name


def test_large_decodes_run_one_at_a_time_and_give_their_memory_back(tmp_path, monkeypatch):
    """Six 179 MP PNGs decoded at once took the server from 1.8 to 9.5 GB, and it stayed there. Now a decode of more
    than LARGE_DECODE_PIXELS (here 16 px) waits for the one running, a third is refused while one waits, a small
    image is not held up, and the heap is trimmed after each large decode."""
    monkeypatch.setattr(image_intake, "LARGE_DECODE_PIXELS", 16)
    lock = _ContendedLock()
    monkeypatch.setattr(image_intake, "_LARGE_DECODE", lock)
    trims = []
    monkeypatch.setattr(image_intake, "trim_heap", lambda: trims.append(len(decoding)))
    for name, side in (("large-1.png", 5), ("large-2.png", 5), ("large-3.png", 5), ("small.png", 4)):
        Image.new("RGB", (side, side), RED).save(tmp_path / name)
    decoding, started = [], []  # files being decoded now; every decode, in the order they start
    first_inside, release_first = threading.Event(), threading.Event()
    load = ImageFile.ImageFile.load

    def recording_load(image):
        if not image.tile:  # decoded already
            return load(image)
        name = Path(image.filename).name
        started.append(name)
        decoding.append(name)
        try:
            if name == "large-1.png":
                first_inside.set()
                assert release_first.wait(30)
            return load(image)
        finally:
            decoding.remove(name)

    monkeypatch.setattr(ImageFile.ImageFile, "load", recording_load)
    loaded = {}
    threads = [threading.Thread(target=lambda n=n: loaded.update({n: load_image(tmp_path / n)}))
               for n in ("large-1.png", "large-2.png")]
    threads[0].start()
    assert first_inside.wait(30)
    threads[1].start()
    try:
        assert lock.contended.wait(30)  # large-2 waits for its turn
        assert load_image(tmp_path / "small.png").pixels.shape == (4, 4, 3)  # decoded meanwhile
        with pytest.raises(ValueError, match=r"^large-3\.png is a large image to decode \(5×5 px\): the server "
                                             r"decodes one image of more than 0\.0 MP at a time and one more is "
                                             r"waiting already: try again in a few seconds, or downscale it first$"):
            load_image(tmp_path / "large-3.png")
        assert started == ["large-1.png", "small.png"]
    finally:
        release_first.set()
        for thread in threads:
            thread.join(30)
    assert started == ["large-1.png", "small.png", "large-2.png"] and set(loaded) == {"large-1.png", "large-2.png"}
    assert trims == [0, 0]  # once after each large decode, with nothing being decoded; none for the small one


def test_an_image_too_large_to_decode_in_memory_gets_a_message_about_the_image(tmp_path, monkeypatch):
    """A valid 178,956,970×1 PNG made Pillow raise MemoryError while decoding, and the page said to choose a smaller
    K, window R or r."""
    Image.new("RGB", (6, 2), RED).save(tmp_path / "long.png")
    load = ImageFile.ImageFile.load

    def out_of_memory(image):
        if image.tile:
            raise MemoryError
        return load(image)

    monkeypatch.setattr(ImageFile.ImageFile, "load", out_of_memory)
    with pytest.raises(ValueError) as refused:
        load_image(tmp_path / "long.png")
    message = user_error_message(refused.value)  # what the page shows
    assert message == ("long.png is 6×2 px: too large to decode in the memory the server has free, so it was not "
                       "read: downscale it (a few thousand px a side is plenty: the models see 32 px) and upload it "
                       "again")
    assert message != OUT_OF_MEMORY_MESSAGE


def test_an_images_note_is_its_own_not_that_of_an_earlier_image_with_the_same_pixels(tmp_path):
    """A TIFF's "only frame 1" and a composited PNG's note were taken from an earlier image with the same pixels."""
    from analysis import fit_image

    red = Image.new("RGB", (40, 30), RED)
    red.save(tmp_path / "plain.png")
    red.save(tmp_path / "pages.tiff", save_all=True, append_images=[Image.new("RGB", (40, 30), (0, 0, 255))])
    plain, pages = load_image(tmp_path / "plain.png"), load_image(tmp_path / "pages.tiff")
    assert plain == pages and plain.note == "" and "only frame 1" in pages.note
    for fit in ("crop", "letterbox", "stretch"):
        fitted_plain, fitted_pages = fit_image(plain, fit), fit_image(pages, fit)
        assert fitted_plain == fitted_pages
        assert "only frame 1" not in fitted_plain.note and "only frame 1" in fitted_pages.note, fit
        assert fit_image(plain, fit).note == fitted_plain.note, fit  # and the plain one's stays its own
    square = image_from_array(np.zeros((8, 8, 3), np.uint8))
    noted = image_from_array(np.zeros((8, 8, 3), np.uint8), note="a note of its own")
    assert fit_image(square).note == "" and fit_image(noted).note == "a note of its own"


def test_a_decodes_cost_is_bounded_before_it_starts_and_a_decode_is_reused(tmp_path, monkeypatch):
    """A 348 KB PNG of 1 × 178,956,970 px (within the pixel limit) took 4.3 s to decode, on every use: a new upload
    of the same bytes (a new file, or the same one written anew) was decoded again."""
    column = png_claiming_size(tmp_path / "column.png", 1, MAX_IMAGE_PIXELS)
    with pytest.raises(ValueError, match=r"^column\.png is 1×178956970 px: images of at most 65,535 px a side are "
                                         r"accepted .*: please crop or downscale it first$"):
        load_image(column)  # refused from its header: the file holds one pixel, so a decode would say "truncated"
    with pytest.raises(ValueError, match="at most 65,535 px a side"):
        image_from_array(np.broadcast_to(np.uint8(0), (1, 65_536)))
    assert image_from_array(np.broadcast_to(np.uint8(0), (1, 65_535))).pixels.shape == (1, 1024, 3)

    image_intake._load_cached.cache_clear()
    image_intake._decoded.cache_clear()  # bytes another test decoded would not be decoded here
    decodes = []
    accept_file = image_intake._accept_file
    monkeypatch.setattr(image_intake, "_accept_file",
                        lambda image, name: decodes.append(name) or accept_file(image, name))
    Image.new("RGB", (40, 30), RED).save(tmp_path / "first.png")
    first = load_image(tmp_path / "first.png")
    data = (tmp_path / "first.png").read_bytes()
    (tmp_path / "again.png").write_bytes(data)  # another upload of the same bytes
    (tmp_path / "first.png").write_bytes(data)  # the same file written anew (a new modification time)
    os.utime(tmp_path / "first.png", ns=(1, 1))
    assert load_image(tmp_path / "again.png") == first and load_image(tmp_path / "first.png") == first
    assert decodes == ["first.png"]
    Image.new("RGB", (40, 30), (0, 0, 255)).save(tmp_path / "first.png")  # other bytes: decoded
    assert load_image(tmp_path / "first.png") != first and decodes == ["first.png", "first.png"]


@pytest.mark.parametrize("kind", ["zTXt", "iTXt", "tEXt"])
def test_a_png_with_a_huge_text_chunk_is_read_passing_over_the_text(tmp_path, kind):
    """A 50 MB text chunk (a zTXt comment of 50 KB) refused the whole image with Pillow's "Decompressed data too
    large for PngImagePlugin.MAX_TEXT_CHUNK", naming no file; the pixels are fine."""
    def chunk(name: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + name + data + struct.pack(">I", zlib.crc32(name + data))

    text = b"x" * 70_000_000 if kind == "tEXt" else zlib.compress(b"x" * 50_000_000)
    payload = {"tEXt": b"Comment\0", "zTXt": b"Comment\0\0", "iTXt": b"Comment\0\1\0\0\0"}[kind] + text
    picture = io.BytesIO()
    Image.new("RGB", (8, 8), RED).save(picture, "PNG")
    data = picture.getvalue()
    (tmp_path / "noted.png").write_bytes(data[:33] + chunk(kind.encode(), payload) + data[33:])
    image = load_image(tmp_path / "noted.png")
    assert (image.pixels == RED).all() and image.note == ""
