"""ImageDecoder on PNG, BMP, PNM and TIFF streams, against Pillow's decoding of the same bytes."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest

from omrt.errors import KernelError, ShapeError
from tests.kernel_check import run_kernel

Image = pytest.importorskip("PIL.Image")
rng = np.random.default_rng(0)


def decode(data: bytes, fmt: str = "RGB") -> np.ndarray:
    return run_kernel("ImageDecoder", [np.frombuffer(data, np.uint8)], {"pixel_format": fmt}, opset=20)[0]


def encoded(img, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def expected(data: bytes, fmt: str) -> np.ndarray:
    """Pillow's reading, in the layout the spec asks for: RGB/BGR with 3 channels, gray with 1."""
    rgb = Image.open(io.BytesIO(data)).convert("RGB")
    if fmt == "Grayscale":
        return np.asarray(rgb.convert("L"))[..., None]
    arr = np.asarray(rgb)
    return arr[..., ::-1] if fmt == "BGR" else arr


def random_image(mode: str, size=(13, 7)):
    w, h = size
    if mode == "1":
        return Image.fromarray(rng.random((h, w)) > 0.5)
    if mode == "P":
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert("P")
        return img
    bands = len(mode)
    arr = rng.integers(0, 256, (h, w, bands) if bands > 1 else (h, w), dtype=np.uint8)
    return Image.fromarray(arr, mode)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "1"])
@pytest.mark.parametrize("fmt", ["RGB", "BGR", "Grayscale"])
def test_png_modes(mode, fmt):
    data = encoded(random_image(mode), "PNG")
    np.testing.assert_array_equal(decode(data, fmt), expected(data, fmt))


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_png_low_bit_depth_palette(depth):
    img = random_image("P").quantize(1 << depth)
    data = encoded(img, "PNG", bits=depth)
    np.testing.assert_array_equal(decode(data), expected(data, "RGB"))


def png(pixels: np.ndarray, color: int, depth: int = 8, filters: list[int] | None = None) -> bytes:
    """A PNG with the given row filters (to cover all five), written by hand."""
    h = pixels.shape[0]
    rows = pixels.reshape(h, -1).astype(np.int64)
    bpp = max(depth * {0: 1, 2: 3, 4: 2, 6: 4}[color] // 8, 1)
    filters = filters or [y % 5 for y in range(h)]
    out = bytearray()
    prev = np.zeros(rows.shape[1], np.int64)
    for y in range(h):
        row = rows[y]
        left = np.concatenate([np.zeros(bpp, np.int64), row[:-bpp]])
        upleft = np.concatenate([np.zeros(bpp, np.int64), prev[:-bpp]])
        f = filters[y]
        if f == 0:
            pred = 0
        elif f == 1:
            pred = left
        elif f == 2:
            pred = prev
        elif f == 3:
            pred = (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = abs(p - left), abs(p - prev), abs(p - upleft)
            pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        out.append(f)
        out += ((row - pred) % 256).astype(np.uint8).tobytes()
        prev = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    w = pixels.shape[1]
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(out))) + \
        chunk(b"IEND", b"")


@pytest.mark.parametrize("color,channels", [(2, 3), (6, 4), (0, 1), (4, 2)])
def test_png_every_filter_type(color, channels):
    pixels = rng.integers(0, 256, (11, 9, channels), dtype=np.uint8)
    got = decode(png(pixels, color))
    want = pixels[..., :3] if channels >= 3 else np.repeat(pixels[..., :1], 3, axis=2)
    np.testing.assert_array_equal(got, want)


def test_png_16_bit_keeps_the_high_byte():
    pixels = rng.integers(0, 65536, (5, 6, 3)).astype(">u2")
    got = decode(png(pixels.view(np.uint8).reshape(5, 6, 6), 2, depth=16))
    np.testing.assert_array_equal(got, (pixels >> 8).astype(np.uint8))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L", "1"])
@pytest.mark.parametrize("fmt", ["RGB", "Grayscale"])
def test_bmp(mode, fmt):
    data = encoded(random_image(mode, (10, 5)), "BMP")
    np.testing.assert_array_equal(decode(data, fmt), expected(data, fmt))


@pytest.mark.parametrize("mode", ["RGB", "L", "1"])
def test_pnm_binary(mode):
    data = encoded(random_image(mode, (9, 4)), "PPM")
    np.testing.assert_array_equal(decode(data), expected(data, "RGB"))


def test_pnm_ascii_comments_and_maxval():
    pixels = rng.integers(0, 101, (3, 4, 3))
    text = "P3\n# a comment\n4 3\n100\n" + " ".join(str(v) for v in pixels.reshape(-1)) + "\n"
    np.testing.assert_array_equal(decode(text.encode()), (pixels * 255 + 50) // 100)
    bits = rng.integers(0, 2, (2, 5))
    got = decode(("P1\n5 2\n" + "\n".join("".join(map(str, r)) for r in bits)).encode(), "Grayscale")
    np.testing.assert_array_equal(got[..., 0], (1 - bits) * 255)
    gray16 = rng.integers(0, 1000, (2, 3))
    data = b"P5 3 2 999\n" + gray16.astype(">u2").tobytes()
    np.testing.assert_array_equal(decode(data, "Grayscale")[..., 0], (gray16 * 255 + 499) // 999)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
@pytest.mark.parametrize("compression", [None, "packbits"])
def test_tiff(mode, compression):
    options = {"compression": compression} if compression else {}
    data = encoded(random_image(mode, (8, 6)), "TIFF", **options)
    np.testing.assert_array_equal(decode(data), expected(data, "RGB"))


def test_corrupt_or_unknown_streams_give_an_empty_image():
    good = encoded(random_image("RGB"), "PNG")
    for data in (good[:40], b"not an image at all", good[:8] + b"\x00" * 30):
        assert decode(data).shape == (0, 0, 3)
    assert decode(good[:40], "Grayscale").shape == (0, 0, 1)


def test_lossy_formats_are_refused_and_attributes_checked():
    with pytest.raises(KernelError, match="JPEG"):
        decode(encoded(random_image("RGB"), "JPEG"))
    with pytest.raises(ShapeError, match="pixel_format"):
        decode(encoded(random_image("RGB"), "PNG"), "CMYK")
    with pytest.raises(ShapeError, match="uint8"):
        run_kernel("ImageDecoder", [np.zeros(4, np.int8)], opset=20)
