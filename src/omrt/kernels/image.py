"""ImageDecoder for the formats the standard library can decode exactly: PNG (zlib), BMP, PNM
(PBM/PGM/PPM) and uncompressed or PackBits TIFF.

JPEG, JPEG 2000 and WebP need full lossy codecs whose results are only defined up to the
reference decoder's rounding; they are refused with a KernelError rather than guessed at.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import Sequence

import numpy as np

from ..errors import KernelError, ShapeError
from .base import Kernel, OpContext, TensorInfo, register

_U8 = np.dtype(np.uint8)


class _Corrupt(Exception):
    """The stream is not a valid image of the format its signature names."""


def _gray(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma in the integer form Pillow uses: (19595 R + 38470 G + 7471 B + 2^15) >> 16."""
    w = rgb.astype(np.uint32)
    return ((w[..., 0] * 19595 + w[..., 1] * 38470 + w[..., 2] * 7471 + 0x8000) >> 16).astype(_U8)


def _rgb(pixels: np.ndarray) -> np.ndarray:
    """[H, W] gray, [H, W, 2] gray+alpha, [H, W, 3] RGB or [H, W, 4] RGBA as [H, W, 3] RGB."""
    if pixels.ndim == 2:
        return np.repeat(pixels[..., None], 3, axis=2)
    if pixels.shape[2] in (1, 2):
        return np.repeat(pixels[..., :1], 3, axis=2)
    return pixels[..., :3]


# ----------------------------------------------------------------------------- PNG


def _paeth_row(row: bytearray, prev: bytes, bpp: int) -> None:
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF


def _average_row(row: bytearray, prev: bytes, bpp: int) -> None:
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        row[i] = (row[i] + ((a + prev[i]) >> 1)) & 0xFF


def _unfilter(raw: bytes, height: int, stride: int, bpp: int) -> np.ndarray:
    """Undo the PNG per-row filters; [height, stride] bytes."""
    if len(raw) < height * (stride + 1):
        raise _Corrupt("image data is short")
    rows = np.frombuffer(raw, _U8, height * (stride + 1)).reshape(height, stride + 1)
    out = np.zeros((height + 1, stride), _U8)  # row 0: the zero row above the image
    for y in range(height):
        kind, data = int(rows[y, 0]), rows[y, 1:]
        prev = out[y]
        if kind == 0:
            out[y + 1] = data
        elif kind == 1:
            # left neighbours accumulate: a running sum per byte position modulo 256
            width = -(-stride // bpp) * bpp
            padded = np.zeros(width, _U8)
            padded[:stride] = data
            out[y + 1] = np.cumsum(padded.reshape(-1, bpp), axis=0, dtype=_U8).reshape(-1)[:stride]
        elif kind == 2:
            np.add(data, prev, out=out[y + 1])
        elif kind in (3, 4):
            row = bytearray(data.tobytes())
            (_average_row if kind == 3 else _paeth_row)(row, prev.tobytes(), bpp)
            out[y + 1] = np.frombuffer(bytes(row), _U8)
        else:
            raise _Corrupt(f"unknown filter type {kind}")
    return out[1:]


def _unpack_bits(rows: np.ndarray, width: int, depth: int) -> np.ndarray:
    """Samples of 1, 2 or 4 bits packed MSB first in each row, as [H, width] uint8 values."""
    if depth == 8:
        return rows[:, :width]
    bits = np.unpackbits(rows, axis=1)
    per = bits.reshape(rows.shape[0], -1, depth)
    weights = (1 << np.arange(depth - 1, -1, -1)).astype(_U8)
    return (per * weights).sum(axis=2, dtype=_U8)[:, :width]


def _decode_png(data: bytes) -> np.ndarray:
    pos, chunks, idat = 8, {}, []
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IDAT":
            idat.append(body)
        else:
            chunks.setdefault(kind, body)
        pos += 12 + length
        if kind == b"IEND":
            break
    if b"IHDR" not in chunks or not idat:
        raise _Corrupt("IHDR or IDAT missing")
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(color)
    if channels is None or depth not in (1, 2, 4, 8, 16):
        raise _Corrupt(f"colour type {color} with bit depth {depth}")
    if interlace:
        raise KernelError("ImageDecoder: interlaced (Adam7) PNG is not supported; save the image "
                          "without interlacing")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise _Corrupt(str(e)) from None
    bits = depth * channels
    rows = _unfilter(raw, height, -(-width * bits // 8), max(bits // 8, 1))
    if depth == 16:
        pixels = rows.reshape(height, width * channels, 2)[..., 0]  # the high byte, as Pillow keeps
    else:
        pixels = _unpack_bits(rows, width * channels, depth)
    pixels = pixels.reshape(height, width, channels)
    if color == 3:
        palette = np.frombuffer(chunks.get(b"PLTE", b""), _U8).reshape(-1, 3)
        if pixels.size and pixels.max() >= len(palette):
            raise _Corrupt("palette index out of range")
        return palette[pixels[..., 0]]
    if color in (0, 4) and depth < 8:
        pixels = pixels * np.uint8(255 // ((1 << depth) - 1))
    return _rgb(pixels)


# ----------------------------------------------------------------------------- BMP


def _decode_bmp(data: bytes) -> np.ndarray:
    offset = struct.unpack("<I", data[10:14])[0]
    header = struct.unpack("<I", data[14:18])[0]
    if header == 12:
        width, height, _, bpp = struct.unpack("<HHHH", data[18:26])
        compression, entry = 0, 3
    else:
        width, height, _, bpp, compression = struct.unpack("<iiHHI", data[18:34])
        entry = 4
    if compression not in (0, 3) or bpp not in (1, 4, 8, 24, 32):
        raise KernelError(f"ImageDecoder: BMP with {bpp} bits per pixel and compression {compression} "
                          f"is not supported (uncompressed 1/4/8/24/32-bit only)")
    top_down, height = height < 0, abs(height)
    stride = (width * bpp + 31) // 32 * 4
    raw = np.frombuffer(data, _U8, stride * height, offset).reshape(height, stride)
    if not top_down:
        raw = raw[::-1]
    if bpp >= 24:
        bgr = raw[:, :width * bpp // 8].reshape(height, width, bpp // 8)
        return bgr[..., 2::-1]
    colors = struct.unpack("<I", data[46:50])[0] if header >= 40 else 0
    count = colors or (1 << bpp)
    table = np.frombuffer(data, _U8, count * entry, 14 + header).reshape(count, entry)
    index = _unpack_bits(raw, width, bpp)
    if index.size and index.max() >= count:
        raise _Corrupt("palette index out of range")
    return table[index][..., 2::-1]


# ----------------------------------------------------------------------------- PNM

_PNM_NUMBER = re.compile(rb"(?:\s|#[^\n]*)*(\d+)")


def _decode_pnm(data: bytes) -> np.ndarray:
    kind = data[:2]
    bitmap = kind in (b"P1", b"P4")
    numbers, pos = [], 2
    for _ in range(2 if bitmap else 3):
        m = _PNM_NUMBER.match(data, pos)
        if not m:
            raise _Corrupt("bad header")
        numbers.append(int(m.group(1)))
        pos = m.end()
    width, height = numbers[:2]
    maxval = 1 if bitmap else numbers[2]
    if maxval < 1 or maxval > 65535:
        raise _Corrupt("bad maxval")
    channels = 3 if kind in (b"P3", b"P6") else 1
    body = data[pos:]
    count = width * height * channels
    if kind == b"P1":
        values = np.array([int(c) for c in re.sub(rb"\s+", b"", body).decode("ascii")], np.int64)[:count]
    elif kind in (b"P2", b"P3"):
        values = np.array(body.split(), np.int64)[:count]
    elif kind == b"P4":
        stride = -(-width // 8)
        rows = np.frombuffer(body[1:], _U8, stride * height).reshape(height, stride)
        values = np.unpackbits(rows, axis=1)[:, :width].reshape(-1).astype(np.int64)
    else:
        sample = np.dtype(">u2") if maxval > 255 else _U8
        values = np.frombuffer(body[1:], sample, count).astype(np.int64)
    if values.size != count:
        raise _Corrupt("pixel data is short")
    if bitmap:
        values = (1 - values) * 255  # PBM: 1 is black
    elif maxval != 255:
        values = (values * 255 + maxval // 2) // maxval
    return _rgb(values.astype(_U8).reshape(height, width, channels))


# ----------------------------------------------------------------------------- TIFF


def _packbits(strip: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(strip):
        n = strip[i] - 256 if strip[i] > 127 else strip[i]
        if n >= 0:
            out += strip[i + 1:i + 2 + n]
            i += 2 + n
        elif n != -128:
            out += strip[i + 1:i + 2] * (1 - n)
            i += 2
        else:
            i += 1
    return bytes(out)


def _decode_tiff(data: bytes) -> np.ndarray:
    e = "<" if data[:2] == b"II" else ">"
    ifd = struct.unpack(e + "I", data[4:8])[0]
    (count,) = struct.unpack(e + "H", data[ifd:ifd + 2])
    sizes = {1: 1, 2: 1, 3: 2, 4: 4, 16: 8}
    codes = {1: "B", 2: "c", 3: "H", 4: "I", 16: "Q"}
    tags: dict[int, tuple] = {}
    for k in range(count):
        tag, kind, n = struct.unpack(e + "HHI", data[ifd + 2 + 12 * k:ifd + 10 + 12 * k])
        if kind not in sizes:
            continue
        field = data[ifd + 10 + 12 * k:ifd + 14 + 12 * k]
        if sizes[kind] * n > 4:
            field = data[struct.unpack(e + "I", field)[0]:][:sizes[kind] * n]
        tags[tag] = struct.unpack(e + codes[kind] * n, field[:sizes[kind] * n])
    width, height = tags[256][0], tags[257][0]
    bits = tags.get(258, (1,))
    samples = tags.get(277, (1,))[0]
    compression, photometric = tags.get(259, (1,))[0], tags.get(262, (1,))[0]
    if compression not in (1, 32773) or set(bits) != {8} or tags.get(284, (1,))[0] != 1 or \
            tags.get(317, (1,))[0] != 1 or photometric not in (0, 1, 2):
        raise KernelError(f"ImageDecoder: TIFF with compression {compression}, bits {bits}, photometric "
                          f"{photometric} is not supported (8-bit chunky gray or RGB, uncompressed or "
                          f"PackBits)")
    strips = [data[o:o + n] for o, n in zip(tags[273], tags[279])]
    if compression == 32773:
        strips = [_packbits(s) for s in strips]
    raw = b"".join(strips)
    if len(raw) < width * height * samples:
        raise _Corrupt("pixel data is short")
    pixels = np.frombuffer(raw, _U8, width * height * samples).reshape(height, width, samples)
    if photometric == 0:
        pixels = 255 - pixels
    return _rgb(pixels)


# ----------------------------------------------------------------------------- the kernel

_DECODERS = ((b"\x89PNG\r\n\x1a\n", _decode_png), (b"BM", _decode_bmp), (b"II*\x00", _decode_tiff),
             (b"MM\x00*", _decode_tiff))
_REFUSED = ((b"\xff\xd8", "JPEG"), (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"), (b"\xff\x4f\xff\x51", "JPEG 2000"))


@register("ImageDecoder", since=20)
class ImageDecoder(Kernel):
    """Decodes an encoded image (uint8 bytes) to [H, W, 3] RGB or BGR or [H, W, 1] Grayscale.

    "If it can't decode for any reason (e.g. corrupted encoded stream, invalid format), it will
    return an empty matrix": a corrupt or unknown stream gives a [0, 0, C] result. Formats that
    are valid but need a codec outside the standard library raise a KernelError instead.
    """

    dynamic = True
    formats = ("RGB", "BGR", "Grayscale")

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.dtype != _U8 or x.rank != 1:
            raise ShapeError(f"{ctx.name}: ImageDecoder takes the encoded bytes as a 1-D uint8 tensor, "
                             f"got {x.dtype}{x.shape}")
        fmt = ctx.attr("pixel_format", "RGB")
        if fmt not in cls.formats:
            raise ShapeError(f"{ctx.name}: ImageDecoder pixel_format must be one of {cls.formats}, "
                             f"got {fmt!r}")
        return [TensorInfo(_U8, (None, None, 1 if fmt == "Grayscale" else 3))]

    def run(self, inputs, outputs, workspace):
        data = inputs[0].tobytes()
        fmt = self.ctx.attr("pixel_format", "RGB")
        rgb = self.decode(data)
        if fmt == "Grayscale":
            return [_gray(rgb)[..., None]]
        return [np.ascontiguousarray(rgb[..., ::-1] if fmt == "BGR" else rgb)]

    def decode(self, data: bytes) -> np.ndarray:
        for magic, name in _REFUSED:
            if data.startswith(magic):
                raise KernelError(f"{self.ctx.name}: ImageDecoder cannot decode {name}: omrt decodes PNG, "
                                  f"BMP, PNM and uncompressed TIFF; convert the image to PNG")
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            raise KernelError(f"{self.ctx.name}: ImageDecoder cannot decode WebP: omrt decodes PNG, BMP, "
                              f"PNM and uncompressed TIFF; convert the image to PNG")
        decoder = next((d for magic, d in _DECODERS if data.startswith(magic)), None)
        if decoder is None and data[:1] == b"P" and data[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6"):
            decoder = _decode_pnm
        try:
            if decoder is not None:
                return np.ascontiguousarray(decoder(data))
        except (_Corrupt, struct.error, ValueError, IndexError, KeyError):
            pass
        return np.zeros((0, 0, 3), _U8)
