"""Convolution kernels (Conv, ConvTranspose, Col2Im, DeformConv) and the window geometry pools share.

Conv is im2col (into the planned workspace, in chunks of output rows to bound its size) followed
by one BLAS GEMM per group written straight into the output; 1x1 convolutions skip im2col (the
input already is the column matrix).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ShapeError
from . import parallel
from .base import (FUSED_ACTIVATIONS, Dim, Kernel, OpContext, TensorInfo, aligned, apply_activation,
                   register)
from .native import F32, I64, PTR, Function, activation_code, address, threads_for

WORKSPACE_CAP = 1 << 20
"""Upper bound (bytes) of an im2col/col2im column buffer; bigger layers are processed in row chunks."""

STRIDED_TAPS = 16
"""Strided layers with at least this many taps gather each chunk with one copy from a strided view
of the zero-padded image (in the workspace) instead of one copy per tap: 2x faster on the 7x7 and
11x11 first layers of CNNs."""

SPLIT_PASS_BYTES = 1 << 21
"""Outputs at least this big get their bias and activation pass on all of omrt's threads; on
smaller ones the pass costs less than a handoff."""

DWCONV2D = Function("conv", "omrt_dwconv2d_f32", (PTR,) * 5 + (I64,) * 18 + (F32, F32))
IM2COL2D = Function("conv", "omrt_im2col_f32", (PTR, PTR) + (I64,) * 15)
CONV2D = Function("conv", "omrt_conv2d_f32", (PTR,) * 5 + (I64,) * 20 + (F32, F32), blas=True)


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


def plane_scratch(win: Window) -> int:
    """Bytes a native stride-1 2-d window loop needs per thread for its padded plane and sums
    (csrc/omrt_native.h, omrt_pad_plane); 0 for other windows."""
    if len(win.kernel) != 2 or win.strides != (1, 1):
        return 0
    (oh, ow), (kh, kw), (dh, dw) = win.out, win.kernel, win.dilations
    padded_width = ow + (kw - 1) * dw
    floats = (2 * oh + (kh - 1) * dh) * padded_width + 2 * (kw - 1) * dw
    return aligned(floats * 4)


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


def _cuts(groups: int, filters: int, positions: int, parts: int) -> list[tuple[slice, slice, slice]]:
    """(groups, filters, positions) ranges of `parts` independent GEMMs covering a grouped product:
    the groups when there are enough of them, else the longer of the filter and position sides
    (each thread then re-reads only the shorter side's operand)."""
    whole = slice(None)
    if parts <= 1:
        return [(whole, whole, whole)]
    if groups >= parts:
        return [(slice(*r), whole, whole) for r in parallel.spans(groups, parts)]
    if filters >= positions:
        return [(whole, slice(*r), whole) for r in parallel.spans(filters, parts)]
    return [(whole, whole, slice(*r)) for r in parallel.spans(positions, parts)]


def _contiguous(cuts: Sequence[tuple[slice, slice, slice]], groups: int) -> bool:
    """Whether every cut of a (groups, filters, positions) output is one C-contiguous block."""
    whole = slice(None)
    return all(ps == whole and (ms == whole or groups == 1) for _, ms, ps in cuts)


@dataclass(frozen=True)
class _Split:
    """How Conv's im2col runs on some number of threads.

    With `buffer` > 0 each thread gathers whole chunks into a column buffer of its own (`buffer`
    bytes apart in the workspace) and multiplies them: one parallel region for the layer. With
    `buffer` == 0 the threads share one buffer: the caller gathers a chunk, then the threads
    multiply the pieces `cuts` of it (for layers with more filters than chunk positions).
    """

    step: int
    buffer: int
    chunks: tuple[_Chunk, ...]
    cuts: tuple[tuple[slice, slice, slice], ...]


def _check_ranks(ctx: OpContext, x: TensorInfo, w: TensorInfo) -> None:
    if x.rank < 3 or w.rank != x.rank:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} needs X of rank >= 3 and W of the same rank, got "
                         f"X{list(x.shape)} W{list(w.shape)}")


def _check_group(ctx: OpContext, channels: Dim, w_channels: Dim, filters: Dim, group: int,
                 what: str) -> None:
    if group < 1:
        raise ShapeError(f"{ctx.name}: group={group} must be >= 1")
    if isinstance(channels, int) and isinstance(w_channels, int) and channels != w_channels * group:
        raise ShapeError(f"{ctx.name}: X has {channels} channels but W expects {w_channels} x group "
                         f"{group} = {w_channels * group} {what}; make X's dim 1 match W")
    if isinstance(filters, int) and filters % group:
        raise ShapeError(f"{ctx.name}: {filters} filters cannot be split into group={group} groups")


def _bias_view(b: np.ndarray, rank: int) -> np.ndarray:
    """B (M,) reshaped to broadcast along dim 1 of a tensor of rank `rank`."""
    return b.reshape((1, -1) + (1,) * (rank - 2))


def _kernel_shape(ctx: OpContext, w: TensorInfo) -> list[Dim]:
    ks = ctx.attrs.get("kernel_shape")
    return [int(k) for k in ks] if ks else list(w.shape[2:])


@register("Conv", since=1)
class Conv(Kernel):
    """N-d convolution: im2col + one batched GEMM over the groups; 1x1 layers skip im2col.

    Depthwise 2-d float32 layers run a native loop per channel when the model has it (bias and
    activation included, in one pass). Without it they take the im2col path too: gathering the
    taps and letting BLAS run one small GEMM per channel measured faster than accumulating
    strided taps with numpy ufuncs.
    """

    fuses = frozenset(FUSED_ACTIVATIONS)
    native_units = ("conv",)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, w = inputs[0], inputs[1]
        _check_ranks(ctx, x, w)
        group = int(ctx.attrs.get("group", 1))
        _check_group(ctx, x.shape[1], w.shape[1], w.shape[0], group, "input channels")
        kernel = _kernel_shape(ctx, w)
        if all(isinstance(k, int) for k in kernel):
            spatial = sliding_window(ctx, x.shape[2:], kernel)[0]
        else:
            spatial = [None] * (x.rank - 2)
        return [TensorInfo(x.dtype, (x.shape[0], w.shape[0], *spatial))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, w = inputs[0], inputs[1]
        self.group = int(ctx.attrs.get("group", 1))
        kernel = [int(k) for k in _kernel_shape(ctx, w)]
        self.win = window_of(ctx, x.shape[2:], kernel)
        channels, filters = x.shape[1], w.shape[0]
        pointwise = (all(k == 1 for k in kernel) and all(s == 1 for s in self.win.strides)
                     and all(b == 0 for b in self.win.begin) and self.win.out == self.win.size)
        self.mode = "pointwise" if pointwise else "im2col"
        self.c_depthwise = self._depthwise(ctx, x, channels, filters)
        self.c_im2col = self._native_im2col(ctx, x)
        self.c_conv = self._native_conv(ctx, x, filters)
        self.filters = filters // self.group
        self.inner = math.prod(self.win.out[1:])
        self.row_bytes = channels * math.prod(kernel) * self.inner * x.dtype.itemsize
        self.flops = 2 * x.shape[0] * filters * (channels // self.group) * math.prod(kernel) \
            * math.prod(self.win.out)
        self.step = _row_chunks(self.win.out[0], self.row_bytes)
        self.flat = all(s == 1 for s in self.win.strides) and self.win.out == self.win.size
        self.padded = self._padded_extent(channels, x.dtype.itemsize) if self.mode == "im2col" else None
        self.pad_bytes = 0 if self.padded is None else aligned(channels * math.prod(self.padded) * x.dtype.itemsize)
        self.splits: dict[int, _Split] = {}
        self.cuts: dict[int, list[tuple[slice, slice, slice]]] = {}
        self.nbytes = 0
        if self.mode == "im2col":
            self.nbytes = self.pad_bytes + max(min(t, parallel.MAX_SLOTS) * self._layout(t)[1]
                                               for t in range(1, parallel.MAX_SLOTS + 1))
            self._split(1)
        self.plane_scratch = self._plane_scratch(x, channels)
        self.nbytes = max(self.nbytes, parallel.MAX_SLOTS * self.plane_scratch)

    def _plane_scratch(self, x: TensorInfo, channels: int) -> int:
        """Bytes of scratch per thread of the native depthwise loop: planned whether or not the
        model will have that loop, so that plans do not depend on it."""
        if self.group != channels or x.rank != 4 or x.dtype != np.float32:
            return 0
        return plane_scratch(self.win)

    def _depthwise(self, ctx: OpContext, x: TensorInfo, channels: int, filters: int) -> tuple | None:
        """(C function, geometry arguments) for a 2-d float32 depthwise layer when the model has
        the native loop, else None."""
        act = activation_code(ctx.attrs)
        if (ctx.native is None or self.group != channels or x.rank != 4 or x.dtype != np.float32
                or act is None):
            return None
        fn = ctx.native.get(DWCONV2D)
        win = self.win
        geometry = (x.shape[0], filters, filters // channels, *win.size, *win.out, *win.kernel, *win.strides,
                    *win.dilations, *win.begin, *act)
        return None if fn is None else (fn, geometry)

    def _native_im2col(self, ctx: OpContext, x: TensorInfo) -> tuple | None:
        """(C function, geometry arguments) that gather a 2-d float32 layer's columns in one call
        per chunk (instead of a numpy copy per tap), when the model has it; else None."""
        fn = ctx.native.get(IM2COL2D) if ctx.native is not None else None
        if fn is None or self.mode != "im2col" or x.rank != 4 or x.dtype != np.float32:
            return None
        win = self.win
        return fn, (x.shape[1], *win.size, win.out[1], *win.kernel, *win.strides, *win.dilations, *win.begin)

    def _native_conv(self, ctx: OpContext, x: TensorInfo, filters: int) -> tuple | None:
        """(C function, geometry arguments) that run a whole 2-d float32 layer, gather and GEMMs
        included, on the native workers, when the model has it; else None."""
        fn = ctx.native.get(CONV2D) if ctx.native is not None else None
        act = activation_code(ctx.attrs)
        if fn is None or x.rank != 4 or x.dtype != np.float32 or act is None:
            return None
        win = self.win
        return fn, (*x.shape, filters, self.group, *win.out, *win.kernel, *win.strides, *win.dilations,
                    *win.begin, *act)

    def _padded_extent(self, channels: int, itemsize: int) -> tuple[int, ...] | None:
        """Spatial extent of the zero-padded image a strided gather reads (None: gather by taps)."""
        win = self.win
        if self.flat or math.prod(win.kernel) < STRIDED_TAPS:
            return None
        extent = tuple((o - 1) * s + (k - 1) * d + 1
                       for o, s, k, d in zip(win.out, win.strides, win.kernel, win.dilations))
        return extent if channels * math.prod(extent) * itemsize <= WORKSPACE_CAP else None

    def _pad(self, x: np.ndarray, image: np.ndarray) -> None:
        """image = x zero-padded by the window's begin pads (and cut or padded to its extent)."""
        inside = []
        for b, n, e in zip(self.win.begin, x.shape[1:], self.padded):
            inside.append((slice(b, min(b + n, e)), slice(0, min(n, e - b))))
        for d, (dst, _) in enumerate(inside):
            lead = (slice(None),) * (1 + d)
            image[lead + (slice(0, dst.start),)] = 0
            image[lead + (slice(dst.stop, None),)] = 0
        image[(slice(None),) + tuple(dst for dst, _ in inside)] = x[(slice(None),) + tuple(src for _, src in inside)]

    def _strided_gather(self, image: np.ndarray, cols: np.ndarray, chunk: _Chunk) -> None:
        """Copy a chunk's columns out of the padded image through one strided view of it."""
        win, rows = self.win, chunk.last - chunk.first
        c, *steps = image.strides
        view = as_strided(image[:, chunk.first * win.strides[0]:],
                          (image.shape[0],) + win.kernel + (rows,) + win.out[1:],
                          (c, *(t * d for t, d in zip(steps, win.dilations)),
                           *(t * s for t, s in zip(steps, win.strides))), writeable=False)
        np.copyto(cols[(slice(None),) * (1 + len(win.kernel)) + (slice(0, rows),)], view)

    def workspace(self) -> int:
        return self.nbytes

    def _threads(self) -> int:
        """The threads this layer runs on: all of omrt's when it is big enough to pay for a split."""
        return parallel.get_num_threads() if self.flops >= parallel.MIN_FLOPS else 1

    def _layout(self, threads: int) -> tuple[int, int]:
        """Output rows per chunk, and bytes per thread's column buffer (0: one shared buffer).

        One thread: as many rows as the buffer cap allows. Several: a layer gathered in one chunk
        with more filters than positions shares its buffer and splits its filters (one parallel
        region after the gather); the others give each thread (up to parallel.MAX_SLOTS of them)
        a buffer of its own and as many chunks each, all in one region. A layer that needs many
        capped chunks anyway splits the cap between its threads, so that its workspace does not
        grow and the planner keeps the arena at its lower bound.
        """
        rows = self.win.out[0]
        count = -(-rows // self.step)
        if threads > 1 and count == 1 and self.filters >= rows * self.inner:
            return self.step, 0
        slots = min(threads, parallel.MAX_SLOTS)
        if slots == 1:
            step = self.step
        elif count >= 2 * slots:
            step = max(1, self.step // slots)
        else:
            step = -(-rows // (-(-count // slots) * slots))
        return step, aligned(step * self.row_bytes)

    def _split(self, threads: int) -> _Split:
        """The plan for `threads` threads (made on first use)."""
        split = self.splits.get(threads)
        if split is None:
            step, buffer = self._layout(threads)
            cuts = () if buffer else tuple(_cuts(self.group, self.filters, step * self.inner, threads))
            chunks = (tuple(_Chunk(r0, r1, (), ()) for r0, r1 in _chunks(self.win.out[0], step))
                      if self.padded else tuple(_plan_chunks(self.win, step, self.flat)))
            split = _Split(step, buffer, chunks, cuts)
            self.splits[threads] = split
        return split

    def run(self, inputs, outputs, workspace):
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        y = outputs[0]
        if y.size == 0:
            return
        contiguous = x.flags.c_contiguous and y.flags.c_contiguous
        if self.c_depthwise is not None and contiguous:
            self._run_depthwise(x, w, b, y, workspace)
        elif self.c_conv is not None and contiguous:
            self._run_native(x, w, b, y, workspace)
        elif self.mode == "pointwise":
            self._pointwise(x, w, b, y)
        else:
            self._im2col(x, w, b, y, workspace)

    def _run_depthwise(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, y: np.ndarray,
                       workspace: np.ndarray | None) -> None:
        fn, geometry = self.c_depthwise
        threads = threads_for(nbytes=y.nbytes, slots=parallel.MAX_SLOTS)
        fn(address(x), address(w), 0 if b is None else address(b), address(y),
           0 if workspace is None else address(workspace), self.plane_scratch // 4, threads, *geometry)

    def _run_native(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, y: np.ndarray,
                    workspace: np.ndarray | None) -> None:
        """The whole layer in one call: the native workers share it (see _layout for the plan)."""
        fn, geometry = self.c_conv
        threads = threads_for(self.flops)
        step = buffer = 0
        if self.mode == "im2col":
            split = self._split(min(threads, parallel.MAX_SLOTS))
            step, buffer = split.step, split.buffer // 4
            if buffer:
                threads = min(threads, parallel.MAX_SLOTS)
        work = 0 if workspace is None or not workspace.nbytes else address(workspace) + self.pad_bytes
        fn(address(x), address(w), 0 if b is None else address(b), address(y), work, step, buffer, threads,
           *geometry)

    def _finish(self, y: np.ndarray, b: np.ndarray | None) -> None:
        """Bias and fused activation on a C-contiguous block of the output (numpy buffers ufuncs
        over strided views, which would allocate)."""
        if b is not None:
            np.add(y, b, out=y)
        apply_activation(y, self.ctx)

    def _finish_all(self, y: np.ndarray, b: np.ndarray | None, threads: int) -> None:
        """_finish over the whole output (N, M, P), in contiguous blocks of filters per image."""
        if b is None and self.ctx.attrs.get("_act") is None:
            return
        n, m = y.shape[:2]
        y3 = y.reshape(n, m, -1)
        b2 = None if b is None else b.reshape(m, 1)
        parts = threads if y.nbytes >= SPLIT_PASS_BYTES else 1
        cuts = [(i, slice(*r)) for i in range(n) for r in parallel.spans(m, -(-parts // n))]

        def block(j: int, slot: int) -> None:
            i, ms = cuts[j]
            self._finish(y3[i, ms], None if b2 is None else b2[ms])

        parallel.parallel_for(len(cuts), block)

    def _pointwise(self, x, w, b, y) -> None:
        n, g = x.shape[0], self.group
        p = math.prod(x.shape[2:])
        w3 = w.reshape(g, self.filters, -1)
        x4 = x.reshape(n, g, w3.shape[2], p)
        y4 = y.reshape(n, g, self.filters, p)
        b3 = None if b is None else b.reshape(g, self.filters, 1)
        threads = self._threads()
        cuts = self.cuts.get(threads)
        if cuts is None:
            cuts = self.cuts[threads] = _cuts(g, self.filters, p, -(-threads // n))
        whole = _contiguous(cuts, g)

        def piece(j: int, slot: int) -> None:
            i, k = divmod(j, len(cuts))
            gs, ms, ps = cuts[k]
            out = y4[i, gs, ms, ps]
            np.matmul(w3[gs, ms], x4[i, gs, :, ps], out=out)
            if whole:
                self._finish(out, None if b3 is None else b3[gs, ms])

        parallel.parallel_for(n * len(cuts), piece)
        if not whole:
            self._finish_all(y, b, threads)

    def _im2col(self, x, w, b, y, workspace) -> None:
        g, win, inner = self.group, self.win, self.inner
        n, c = x.shape[:2]
        threads = self._threads()
        split = self._split(threads)
        slots = min(threads, parallel.MAX_SLOTS) if split.buffer else 1
        w3 = w.reshape(g, self.filters, -1)
        b3 = None if b is None else b.reshape(g, self.filters, 1)
        shape = (c,) + win.kernel + (split.step,) + win.out[1:]
        nbytes = math.prod(shape) * x.dtype.itemsize
        buffers = []
        image = None
        if self.padded is not None and self.c_im2col is None:
            image = workspace[:c * math.prod(self.padded) * x.dtype.itemsize].view(x.dtype)
            image = image.reshape((c,) + self.padded)
        for slot in range(slots):
            start = self.pad_bytes + slot * split.buffer
            cols = workspace[start:start + nbytes].view(x.dtype).reshape(shape)
            gemm_in = cols.reshape(g, w3.shape[2], split.step * inner)
            buffers.append((cols, gemm_in.reshape(c, -1, split.step * inner) if self.flat else cols, gemm_in))
        chunks = split.chunks
        whole = len(chunks) == 1 and _contiguous(split.cuts, g)

        def gather(i: int, chunk: _Chunk, slot: int) -> None:
            cols, flat, _ = buffers[slot]
            if self.c_im2col is not None:
                fn, geometry = self.c_im2col
                fn(address(x) + i * x[0].nbytes, address(cols), split.step * inner, chunk.first, chunk.last,
                   *geometry)
                return
            if image is not None:
                self._strided_gather(image, cols, chunk)
                return
            xi = x[i].reshape(c, -1) if self.flat else x[i]
            for dst, src in chunk.moves:
                flat[dst] = xi[src]
            for z in chunk.zeros:
                cols[z] = 0

        def multiply(i: int, chunk: _Chunk, slot: int, gs=slice(None), ms=slice(None), ps=slice(None)) -> None:
            start, width = chunk.first * inner, (chunk.last - chunk.first) * inner
            out = y[i].reshape(g, self.filters, -1)[:, :, start:start + width][gs, ms, ps]
            np.matmul(w3[gs, ms], buffers[slot][2][gs, :, :width][:, :, ps], out=out)
            if whole:
                self._finish(out, None if b3 is None else b3[gs, ms])

        if split.buffer:
            def chunk_task(j: int, slot: int) -> None:
                i, chunk = divmod(j, len(chunks))
                gather(i, chunks[chunk], slot)
                multiply(i, chunks[chunk], slot)

            if image is None:
                parallel.parallel_for(n * len(chunks), chunk_task, slots)
            else:
                for i in range(n):
                    self._pad(x[i], image)

                    def image_task(j: int, slot: int, i: int = i) -> None:
                        chunk_task(i * len(chunks) + j, slot)

                    parallel.parallel_for(len(chunks), image_task, slots)
        else:
            for i in range(n):
                if image is not None:
                    self._pad(x[i], image)
                for chunk in chunks:
                    gather(i, chunk, 0)

                    def piece(j: int, slot: int, i: int = i, chunk: _Chunk = chunk) -> None:
                        multiply(i, chunk, 0, *split.cuts[j])

                    parallel.parallel_for(len(split.cuts), piece)
        if not whole:
            self._finish_all(y, b, threads)


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


def _scatter(image: np.ndarray, cols: np.ndarray, moves: Sequence[tuple[tuple, tuple]]) -> None:
    """col2im: add every tap's column block into the image positions it came from."""
    for col, img in moves:
        view = image[img]
        np.add(view, cols[col], out=view)


@register("ConvTranspose", since=1)
class ConvTranspose(Kernel):
    """N-d transposed convolution: one GEMM per group (W^T X) into column chunks, then col2im."""

    fuses = frozenset(FUSED_ACTIVATIONS)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, w = inputs[0], inputs[1]
        _check_ranks(ctx, x, w)
        group = int(ctx.attrs.get("group", 1))
        channels = x.shape[1]
        if group < 1 or isinstance(channels, int) and channels % group:
            raise ShapeError(f"{ctx.name}: {channels} input channels cannot be split into "
                             f"group={group} groups")
        if isinstance(channels, int) and isinstance(w.shape[0], int) and channels != w.shape[0]:
            raise ShapeError(f"{ctx.name}: X has {channels} channels but W's dim 0 is {w.shape[0]}; "
                             f"ConvTranspose weights are (C, M/group, *kernel)")
        kernel = _kernel_shape(ctx, w)
        filters = w.shape[1] * group if isinstance(w.shape[1], int) else None
        if all(isinstance(k, int) for k in kernel):
            spatial = transposed_window(ctx, x.shape[2:], kernel)[0]
        else:
            spatial = [None] * (x.rank - 2)
        return [TensorInfo(x.dtype, (x.shape[0], filters, *spatial))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, w = inputs[0], inputs[1]
        self.group = int(ctx.attrs.get("group", 1))
        kernel = [int(k) for k in _kernel_shape(ctx, w)]
        out, begin, end = transposed_window(ctx, x.shape[2:], kernel)
        nd = len(kernel)
        self.win = Window(tuple(out), tuple(kernel), tuple(int_list(ctx, "strides", nd, 1)),
                          tuple(int_list(ctx, "dilations", nd, 1)), tuple(begin), tuple(end),
                          tuple(x.shape[2:]))
        filters = w.shape[1] * self.group
        inner = math.prod(x.shape[3:])
        taps = math.prod(kernel)
        row_bytes = filters * taps * inner * x.dtype.itemsize
        self.step = _row_chunks(x.shape[2], row_bytes)
        self.chunks = _plan_chunks(self.win, self.step) if x.shape[2] else []
        self.nbytes = row_bytes * self.step

    def workspace(self) -> int:
        return self.nbytes

    def run(self, inputs, outputs, workspace):
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        y = outputs[0]
        if b is not None:
            np.copyto(y, _bias_view(b, y.ndim))
        else:
            y.fill(0)
        g, win = self.group, self.win
        n, c = x.shape[:2]
        inner = math.prod(win.out[1:])
        filters = y.shape[1]
        shape = (filters,) + win.kernel + (self.step,) + win.out[1:]
        cols = workspace[:self.nbytes].view(x.dtype).reshape(shape)
        wt = w.reshape(g, c // g, -1).transpose(0, 2, 1)
        gemm_out = cols.reshape(g, wt.shape[1], self.step * inner)
        for i in range(n):
            xi = x[i].reshape(g, c // g, -1)
            for chunk in self.chunks:
                width = (chunk.last - chunk.first) * inner
                np.matmul(wt, xi[:, :, chunk.first * inner:chunk.first * inner + width],
                          out=gemm_out[:, :, :width])
                _scatter(y[i], cols, chunk.moves)
        apply_activation(y, self.ctx)


@register("Col2Im", since=18)
class Col2Im(Kernel):
    """Rearrange column blocks (N, C * prod(block_shape), L) into an image, summing overlaps."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, image, block = inputs[:3]
        if x.rank != 3:
            raise ShapeError(f"{ctx.name}: Col2Im input must be (N, C * prod(block_shape), L), "
                             f"got {list(x.shape)}")
        if image.value is None or block.value is None:
            nd = image.shape[0] if isinstance(image.shape[0], int) else 0
            return [TensorInfo(x.dtype, (x.shape[0], None) + (None,) * nd)]
        image_shape = [int(v) for v in image.value]
        block_shape = [int(v) for v in block.value]
        taps = int(np.prod(block_shape))
        blocks = sliding_window(ctx, image_shape, block_shape)[0]
        channels = x.shape[1]
        if isinstance(channels, int) and channels % taps:
            raise ShapeError(f"{ctx.name}: input dim 1 ({channels}) must be a multiple of "
                             f"prod(block_shape)={taps}")
        if isinstance(x.shape[2], int) and x.shape[2] != int(np.prod(blocks)):
            raise ShapeError(f"{ctx.name}: input has {x.shape[2]} blocks but image_shape {image_shape} "
                             f"with these pads/strides/dilations holds {int(np.prod(blocks))}")
        return [TensorInfo(x.dtype, (x.shape[0], channels // taps if isinstance(channels, int) else None,
                                     *image_shape))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.win = window_of(ctx, outputs[0].shape[2:], [int(v) for v in inputs[2].value])
        self.moves = _plan_chunks(self.win, self.win.out[0])[0].moves

    def run(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        y.fill(0)
        cols = x.reshape((x.shape[0], y.shape[1]) + self.win.kernel + self.win.out)
        for i in range(x.shape[0]):
            _scatter(y[i], cols[i], self.moves)


@register("DeformConv", since=19)
class DeformConv(Kernel):
    """2-d deformable convolution: bilinear im2col at offset positions (times the mask), then GEMM.

    ONNX: each kernel tap samples X at its regular position plus a learned (dh, dw) offset, with
    bilinear interpolation and zeros outside X; offset is (N, offset_group * kH * kW * 2, oH, oW)
    and mask (N, offset_group * kH * kW, oH, oW) scales each sample.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, w = inputs[0], inputs[1]
        if x.rank != 4 or w.rank != 4:
            raise ShapeError(f"{ctx.name}: omrt's DeformConv is 2-d: X (N, C, H, W) and W (M, C/group, "
                             f"kH, kW), got X{list(x.shape)} W{list(w.shape)}")
        group = int(ctx.attrs.get("group", 1))
        _check_group(ctx, x.shape[1], w.shape[1], w.shape[0], group, "input channels")
        kernel = _kernel_shape(ctx, w)
        spatial = (sliding_window(ctx, x.shape[2:], kernel)[0] if all(isinstance(k, int) for k in kernel)
                   else [None, None])
        return [TensorInfo(x.dtype, (x.shape[0], w.shape[0], *spatial))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, w = inputs[0], inputs[1]
        self.win = window_of(ctx, x.shape[2:], [int(k) for k in _kernel_shape(ctx, w)])
        self.group = int(ctx.attrs.get("group", 1))
        self.offset_group = int(ctx.attrs.get("offset_group", 1))
        if x.shape[1] % self.offset_group:
            raise ShapeError(f"{ctx.name}: {x.shape[1]} channels cannot be split into "
                             f"offset_group={self.offset_group} groups")
        taps = int(np.prod(self.win.kernel))
        self.nbytes = x.shape[1] * taps * int(np.prod(self.win.out)) * x.dtype.itemsize

    def workspace(self) -> int:
        return self.nbytes

    def run(self, inputs, outputs, workspace):
        x, w, offset = inputs[:3]
        b = inputs[3] if len(inputs) > 3 else None
        mask = inputs[4] if len(inputs) > 4 else None
        y = outputs[0]
        win, g, og = self.win, self.group, self.offset_group
        n, c, height, width = x.shape
        oh, ow = win.out
        taps = win.kernel[0] * win.kernel[1]
        cols = workspace[:self.nbytes].view(x.dtype).reshape(og, c // og, taps, oh * ow)
        offset = offset.reshape(n, og, taps, 2, oh * ow)
        if mask is not None:
            mask = mask.reshape(n, og, taps, oh * ow)
        grid_h = np.repeat(np.arange(oh) * win.strides[0] - win.begin[0], ow)
        grid_w = np.tile(np.arange(ow) * win.strides[1] - win.begin[1], oh)
        w3 = w.reshape(g, w.shape[0] // g, -1)
        gemm_in = cols.reshape(g, w3.shape[2], oh * ow)
        for i in range(n):
            planes = x[i].reshape(og, c // og, height * width)
            for k, (ki, kj) in enumerate(itertools.product(*(range(s) for s in win.kernel))):
                for grp in range(og):
                    hs = grid_h + ki * win.dilations[0] + offset[i, grp, k, 0]
                    ws = grid_w + kj * win.dilations[1] + offset[i, grp, k, 1]
                    sample = _bilinear(planes[grp], hs, ws, height, width)
                    if mask is not None:
                        sample *= mask[i, grp, k]
                    cols[grp, :, k] = sample
            yi = y[i].reshape(g, w3.shape[1], oh * ow)
            np.matmul(w3, gemm_in, out=yi)
        if b is not None:
            np.add(y, _bias_view(b, y.ndim), out=y)


def _bilinear(plane: np.ndarray, hs: np.ndarray, ws: np.ndarray, height: int, width: int) -> np.ndarray:
    """Sample plane (C, H*W) at fractional (hs, ws) with bilinear weights; outside points read zero."""
    h0, w0 = np.floor(hs), np.floor(ws)
    fh, fw = hs - h0, ws - w0
    h0, w0 = h0.astype(np.int64), w0.astype(np.int64)
    total = np.zeros((plane.shape[0], hs.shape[0]), plane.dtype)
    for dh, wh in ((0, 1 - fh), (1, fh)):
        for dw, ww in ((0, 1 - fw), (1, fw)):
            hh, wc = h0 + dh, w0 + dw
            inside = (hh >= 0) & (hh < height) & (wc >= 0) & (wc < width)
            flat = np.where(inside, hh * width + wc, 0)
            total += plane[:, flat] * (wh * ww * inside).astype(plane.dtype)
    return total
