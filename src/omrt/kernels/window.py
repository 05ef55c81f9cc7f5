"""Window geometry: where each tap of a kernel sliding over the spatial dims of a tensor reads.

A node's kernel shape, strides, dilations, pads and auto_pad give its output extent and padding
(`sliding_window`; `transposed_window` for ConvTranspose) and, over a static shape, its `Window`.
From a Window come the column-buffer plans of im2col and col2im, in chunks of output rows that
keep a buffer under WORKSPACE_CAP. Shared by the convolutions and the pools.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ShapeError
from .base import Dim, OpContext

PLANE_LANES = 16
"""Planes the native loops of narrow planes (depthwise convolution, pools) compute at once, one
vector lane each (csrc/omrt_lanes.h, OMRT_LANES)."""

WORKSPACE_CAP = 1 << 20
"""Upper bound (bytes) of an im2col/col2im column buffer; bigger layers are processed in row chunks."""


def _text(value: object, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def int_list(ctx: OpContext, key: str, n: int, default: int) -> list[int]:
    """An int-list attribute of length `n`, or `n` copies of `default` when it is absent or empty."""
    value = ctx.attrs.get(key)
    if value is None or len(value) == 0:
        return [default] * n
    if len(value) != n:
        raise ShapeError(f"{ctx.name}: attribute {key}={list(value)} must have {n} values "
                         f"(one per spatial dim); fix the attribute")
    return [int(v) for v in value]


@dataclass(frozen=True)
class Tap:
    """One kernel position: the window positions whose read is in bounds, and what they read."""

    index: tuple[int, ...]
    bounds: tuple[tuple[int, int], ...]
    """(lo, hi) per spatial dim: positions [lo, hi) that read inside the input (relative to a chunk)."""
    src: tuple[slice, ...]
    """The strided input slices read by those positions."""

    @property
    def empty(self) -> bool:
        return any(lo >= hi for lo, hi in self.bounds)

    @property
    def dst(self) -> tuple[slice, ...]:
        return tuple(slice(lo, hi) for lo, hi in self.bounds)


@dataclass(frozen=True)
class Window:
    """A kernel sliding over the spatial dims of a tensor: where every tap of every position reads.

    Window position o of dim i reads input element o * strides[i] + t * dilations[i] - begin[i]
    for kernel tap t; reads outside [0, size[i]) hit padding.
    """

    size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    out: tuple[int, ...]

    def taps(self, first: tuple[int, int] | None = None) -> list[Tap]:
        """Every kernel tap, for positions `first` = [r0, r1) of spatial dim 0 (default: all)."""
        r0, r1 = first if first is not None else (0, self.out[0])
        extents = [(r0, r1)] + [(0, o) for o in self.out[1:]]
        result = []
        for index in itertools.product(*(range(k) for k in self.kernel)):
            bounds, src = [], []
            for (a, b), n, t, s, d, p in zip(extents, self.size, index, self.strides,
                                               self.dilations, self.begin):
                offset = t * d - p
                lo = max(a, -(offset // s) if offset < 0 else 0)
                hi = min(b, (n - 1 - offset) // s + 1 if n - 1 - offset >= 0 else 0)
                hi = max(hi, lo)
                start = lo * s + offset
                src.append(slice(start, start + (hi - lo - 1) * s + 1, s) if hi > lo else slice(0, 0))
                bounds.append((lo - a, hi - a))
            result.append(Tap(index, tuple(bounds), tuple(src)))
        return result

    def counts(self, include_pad: bool = False) -> np.ndarray:
        """Per window position, how many taps read inside the input (or inside input and pads)."""
        per_dim = []
        for o, k, s, d, n, p, e in zip(self.out, self.kernel, self.strides, self.dilations, self.size,
                                       self.begin, self.end):
            lo, hi = (-p, n + e) if include_pad else (0, n)
            pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - p
            per_dim.append(((pos >= lo) & (pos < hi)).sum(axis=1))
        total = np.ones((), np.int64)
        for c in per_dim:
            total = np.multiply.outer(total, c)
        return total


def _window_attrs(ctx: OpContext, nd: int) -> tuple[list[int], list[int], list[int], str]:
    """strides, dilations, pads (begin then end) and auto_pad of a window over `nd` spatial dims."""
    strides = int_list(ctx, "strides", nd, 1)
    dilations = int_list(ctx, "dilations", nd, 1)
    pads = ctx.attrs.get("pads") or [0] * (2 * nd)
    if len(pads) != 2 * nd:
        raise ShapeError(f"{ctx.name}: pads={list(pads)} must have {2 * nd} values "
                         f"(begin and end per spatial dim); fix the attribute")
    auto_pad = _text(ctx.attrs.get("auto_pad"), "NOTSET")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ShapeError(f"{ctx.name}: auto_pad={auto_pad!r} is not one of NOTSET, VALID, "
                         f"SAME_UPPER, SAME_LOWER")
    return strides, dilations, list(pads), auto_pad


def sliding_window(ctx: OpContext, size: Sequence[Dim], kernel: Sequence[int],
                   ceil_mode: bool = False) -> tuple[list[Dim], list[int | None], list[int | None]]:
    """Output extent, begin and end pads of a window over `size` (strides, dilations, pads, auto_pad).

    ONNX: with auto_pad SAME_UPPER/SAME_LOWER "output_shape[i] = ceil(input_shape[i] / strides[i])",
    the padding is split evenly with the extra one at the end (UPPER) or the beginning (LOWER);
    VALID means no padding; NOTSET uses the `pads` attribute. With ceil_mode the last window must
    still start inside the input or its begin padding.
    """
    nd = len(kernel)
    strides, dilations, pads, auto_pad = _window_attrs(ctx, nd)
    out: list[Dim] = []
    begin: list[int | None] = []
    end: list[int | None] = []
    for i in range(nd):
        n, s, span = size[i], strides[i], (kernel[i] - 1) * dilations[i] + 1
        if s < 1 or dilations[i] < 1:
            raise ShapeError(f"{ctx.name}: strides and dilations must be >= 1, got "
                             f"strides={strides} dilations={dilations}")
        if not isinstance(n, int):
            out.append(None)
            begin.append(int(pads[i]) if auto_pad == "NOTSET" else 0 if auto_pad == "VALID" else None)
            end.append(int(pads[i + nd]) if auto_pad == "NOTSET" else 0 if auto_pad == "VALID" else None)
            continue
        if auto_pad.startswith("SAME"):
            o = -(-n // s)
            total = max(0, (o - 1) * s + span - n)
            b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            e = total - b
        else:
            b, e = (int(pads[i]), int(pads[i + nd])) if auto_pad == "NOTSET" else (0, 0)
            room = n + b + e - span
            o = (-(-room // s) if ceil_mode else room // s) + 1
            if ceil_mode and (o - 1) * s >= n + b:
                o -= 1
        if o < 1:
            raise ShapeError(f"{ctx.name}: a window of {kernel[i]} taps (dilation {dilations[i]}) "
                             f"does not fit spatial dim {i} of size {n} with its padding; "
                             f"use a bigger input, more padding or a smaller kernel")
        out.append(o)
        begin.append(b)
        end.append(e)
    return out, begin, end


def window_of(ctx: OpContext, size: Sequence[int], kernel: Sequence[int],
              ceil_mode: bool = False) -> Window:
    """The concrete Window of a node over a static spatial shape."""
    out, begin, end = sliding_window(ctx, size, kernel, ceil_mode)
    nd = len(kernel)
    return Window(tuple(size), tuple(kernel), tuple(int_list(ctx, "strides", nd, 1)),
                  tuple(int_list(ctx, "dilations", nd, 1)), tuple(begin), tuple(end), tuple(out))


def transposed_window(ctx: OpContext, size: Sequence[Dim], kernel: Sequence[int]
                      ) -> tuple[list[Dim], list[int | None], list[int | None]]:
    """ConvTranspose's output extent and begin/end pads (the crop of the full scatter result).

    ONNX: "If output_shape is specified pads values are ignored", and then
    total_padding[i] = stride[i] * (input_size[i] - 1) + output_padding[i] +
    ((kernel_shape[i] - 1) * dilations[i] + 1) - output_shape[i]; with SAME_UPPER
    pads[start_i] = total_padding[i] / 2, otherwise pads[start_i] = total_padding[i] -
    (total_padding[i] / 2). auto_pad SAME_* sets output_shape[i] = input_shape[i] * strides[i].
    """
    nd = len(kernel)
    strides, dilations, pads, auto_pad = _window_attrs(ctx, nd)
    extra = int_list(ctx, "output_padding", nd, 0)
    wanted = ctx.attrs.get("output_shape")
    if wanted is not None and len(wanted) not in (0, nd):
        raise ShapeError(f"{ctx.name}: output_shape={list(wanted)} must list the {nd} spatial dims")
    wanted = list(wanted) if wanted is not None and len(wanted) else None
    out: list[Dim] = []
    begin: list[int | None] = []
    end: list[int | None] = []
    for i in range(nd):
        n, s = size[i], strides[i]
        full = ((n - 1) * s + extra[i] + (kernel[i] - 1) * dilations[i] + 1) if isinstance(n, int) else None
        if wanted is None and auto_pad in ("NOTSET", "VALID"):
            b, e = (int(pads[i]), int(pads[i + nd])) if auto_pad == "NOTSET" else (0, 0)
            out.append(full - b - e if full is not None else None)
            begin.append(b)
            end.append(e)
            continue
        target = int(wanted[i]) if wanted is not None else n * s if full is not None else None
        if target is None:
            out.append(None)
            begin.append(None)
            end.append(None)
            continue
        total = full - target
        b = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        out.append(target)
        begin.append(b)
        end.append(total - b)
    for i, o in enumerate(out):
        if isinstance(o, int) and o < 1:
            raise ShapeError(f"{ctx.name}: ConvTranspose output dim {i} would be {o}; "
                             f"reduce pads or give output_shape")
    return out, begin, end


def strided_columns(image: np.ndarray, win: Window, first: int, last: int) -> np.ndarray:
    """The columns of window positions [first, last) along spatial dim 0, as one read-only strided
    view (C, *kernel, last - first, *out[1:]) of `image` (C, *spatial), the input already padded
    by the window's begin pads: column [c, k.., o..] reads image[c, o * strides + k * dilations]."""
    c, *steps = image.strides
    return as_strided(image[:, first * win.strides[0]:],
                      (image.shape[0],) + win.kernel + (last - first,) + win.out[1:],
                      (c, *(t * d for t, d in zip(steps, win.dilations)),
                       *(t * s for t, s in zip(steps, win.strides))), writeable=False)


# ----------------------------------------------------------------------------- column buffers (im2col, col2im)


def _row_chunks(rows: int, row_bytes: int) -> int:
    """How many rows of spatial dim 0 one column buffer holds under WORKSPACE_CAP (at least one)."""
    return max(1, min(rows, WORKSPACE_CAP // max(row_bytes, 1)))


def _chunks(total: int, step: int) -> list[tuple[int, int]]:
    return [(r, min(r + step, total)) for r in range(0, total, step)]


def _zero_strips(tap: Tap, lead: tuple, extents: Sequence[int]) -> list[tuple]:
    """Index tuples covering the parts of a tap's column block that read padding."""
    if tap.empty:
        return [lead]
    strips = []
    for i, ((lo, hi), n) in enumerate(zip(tap.bounds, extents)):
        before = (slice(None),) * i
        if lo > 0:
            strips.append(lead + before + (slice(0, lo),))
        if hi < n:
            strips.append(lead + before + (slice(hi, n),))
    return strips


@dataclass(frozen=True)
class _Chunk:
    """A run of window positions along spatial dim 0 and the copies that gather (or scatter) them."""

    first: int
    last: int
    moves: tuple[tuple[tuple, tuple], ...]
    """(column-buffer index, image index) per non-empty tap."""
    zeros: tuple[tuple, ...]
    """Column-buffer index tuples to zero (padding reads)."""


def _flat_move(win: Window, tap: Tap, r0: int, r1: int) -> tuple[tuple, tuple] | None:
    """One tap's gather as a single shifted run per channel, for stride-1 windows with out == size.

    Column buffer viewed (channels, taps, positions), image viewed (channels, pixels): position p of
    the chunk reads pixel p + shift. Positions whose read crosses a row edge get a neighbour pixel;
    they are exactly the tap's padding strips, zeroed after the copy.
    """
    inner = math.prod(win.size[1:])
    pixels = inner * win.size[0]
    shift = r0 * inner
    for i, (t, d, b) in enumerate(zip(tap.index, win.dilations, win.begin)):
        shift += (t * d - b) * math.prod(win.size[i + 1:])
    lo, hi = max(0, -shift), min((r1 - r0) * inner, pixels - shift)
    if hi <= lo:
        return None
    k = 0
    for t, n in zip(tap.index, win.kernel):
        k = k * n + t
    return (slice(None), k, slice(lo, hi)), (slice(None), slice(lo + shift, hi + shift))


def _plan_chunks(win: Window, step: int, flat: bool = False) -> list[_Chunk]:
    """Column-buffer gather/scatter plans for each chunk of `step` positions along spatial dim 0.

    The column buffer is laid out (channels, *kernel, step, *out[1:]); the image is (channels, *size).
    With `flat`, moves address the buffer as (channels, taps, positions) and the image as
    (channels, pixels) (see _flat_move).
    """
    chunks = []
    for r0, r1 in _chunks(win.out[0], step):
        extents = (r1 - r0,) + win.out[1:]
        moves, zeros = [], []
        for tap in win.taps((r0, r1)):
            lead = (slice(None),) + tap.index
            zeros.extend(_zero_strips(tap, lead, extents))
            if tap.empty:
                continue
            move = _flat_move(win, tap, r0, r1) if flat else (lead + tap.dst, (slice(None),) + tap.src)
            if move is not None:
                moves.append(move)
        chunks.append(_Chunk(r0, r1, tuple(moves), tuple(zeros)))
    return chunks
