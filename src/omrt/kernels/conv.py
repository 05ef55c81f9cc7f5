"""Conv: N-d convolution, and the checks of a convolution's inputs that its relatives share.

Conv is im2col (into the planned workspace, in chunks of output rows to bound its size) followed
by one BLAS GEMM per group written straight into the output; 1x1 convolutions skip im2col (the
input already is the column matrix). The window geometry and the column-buffer plans are in
`window`; ConvTranspose, Col2Im and DeformConv in `conv_transpose`; WinogradConv in `winograd`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

import numpy as np

from ..errors import ShapeError
from ..memory import align
from ..native.bindings import CONV2D, DWCONV2D, IM2COL2D, activation_code
from ..native.library import Checked
from ..native.signature import CONSTANTS
from . import parallel, window
from .base import FUSED_ACTIVATIONS, Dim, Kernel, OpContext, TensorInfo, apply_activation, register, run_bound
from .window import (PLANE_LANES, _Chunk, _chunks, _plan_chunks, _row_chunks, sliding_window,
                     strided_columns, window_of)

DEPTHWISE_WIDE_PLANE = 16
"""Depthwise layers with at least this many output columns may run plane by plane (csrc/conv.c,
DW_WIDE_PLANE: where the CPU lacks AVX2), their rows filling vectors; otherwise 16 channels
are interleaved, one per vector lane."""

DEPTHWISE_BAND_BYTES = 1 << 17
"""Scratch per thread of the native depthwise loop: it works in bands of output rows whose
interleaved input and output stay in L2."""

STRIDED_TAPS = 16
"""Strided layers with at least this many taps gather each chunk with one copy from a strided view
of the zero-padded image (in the workspace) instead of one copy per tap: 2x faster on the 7x7 and
11x11 first layers of CNNs."""

SPLIT_PASS_BYTES = 1 << 21
"""Outputs at least this big get their bias and activation pass on all of omrt's threads; on
smaller ones the pass costs less than a handoff."""

STREAM_SPLIT_BYTES = 1 << 21
"""Native layers with at least this many bytes of filters run on all of omrt's threads even below
parallel.NATIVE_SPLIT_FLOPS: their time goes to streaming the filters from memory, which each
core then does for its own filters (a 1024 -> 1000 classifier on a 1x1 map ran 2-3x faster on two
threads, 576 -> 1024 1.45x; 1.5-1.9 MFLOP layers with small filters did not gain)."""

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
    shuffled: ClassVar[bool] = False
    """Whether the output channels are shuffled (ShuffledConv)."""

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
        self.native_depthwise = self._depthwise(ctx, x, channels, filters)
        self.native_im2col = self._native_im2col(ctx, x)
        self.native_conv = self._native_conv(ctx, x, filters)
        self.filters = filters // self.group
        self.inner = math.prod(self.win.out[1:])
        self.row_bytes = channels * math.prod(kernel) * self.inner * x.dtype.itemsize
        self.flops = 2 * x.shape[0] * filters * (channels // self.group) * math.prod(kernel) \
            * math.prod(self.win.out)
        self.step = _row_chunks(self.win.out[0], self.row_bytes)
        self.flat = all(s == 1 for s in self.win.strides) and self.win.out == self.win.size
        self.padded = self._padded_extent(channels, x.dtype.itemsize) if self.mode == "im2col" else None
        self.pad_bytes = 0 if self.padded is None else align(channels * math.prod(self.padded) * x.dtype.itemsize)
        self.splits: dict[int, _Split] = {}
        self.cuts: dict[int, list[tuple[slice, slice, slice]]] = {}
        self.workspace_bytes = 0
        if self.mode == "im2col":
            self.workspace_bytes = self.pad_bytes + max(min(t, parallel.MAX_SLOTS) * self._layout(t)[1]
                                                        for t in range(1, parallel.MAX_SLOTS + 1))
            self._split(1)
        self.im2col_bytes = self.workspace_bytes
        self.lanes = True
        self.band, self.band_bytes = self._band(x, channels, self.lanes)
        self.workspace_bytes = max(self.workspace_bytes, parallel.MAX_SLOTS * self.band_bytes)

    def _band(self, x: TensorInfo, channels: int, lanes: bool) -> tuple[int, int]:
        """(output rows, bytes of scratch) per item of the native depthwise loop: as many output
        rows as keep the scratch under DEPTHWISE_BAND_BYTES. Layers go 16 channels at a time
        (csrc/conv.c, block_part); wide planes may instead go plane by plane, each band of rows
        split into its stride phases (dw_band), which the C picks by the CPU it runs on, so the
        band fits both; without `lanes` (a plan an older omrt made) they always do, and the band
        need fit only that path. Planned whether or not the model will have that loop, so that
        plans do not depend on it."""
        if self.group != channels or x.rank != 4 or x.dtype != np.float32:
            return 0, 0
        (oh, ow), (kh, kw), (sh, sw), (dh, dw) = self.win.out, self.win.kernel, self.win.strides, self.win.dilations
        wide = (ow - 1) * sw + (kw - 1) * dw + 1
        wq = -(-wide // sw)

        def floats(rows: int) -> int:
            interleaved = PLANE_LANES * (kh * kw + ((rows - 1) * sh + (kh - 1) * dh + 1) * wide + rows * ow)
            if ow < DEPTHWISE_WIDE_PLANE:
                return interleaved
            phases = sh * sw * ((rows + (kh - 1) * dh // sh) * wq + (kw - 1) * dw // sw) + rows * wq
            return max(interleaved, phases) if lanes else phases

        band = next((r for r in range(oh, 0, -1) if 4 * floats(r) <= DEPTHWISE_BAND_BYTES), 1)
        return band, align(4 * floats(band))

    def fit_workspace(self, nbytes: int) -> bool:
        """A plan too small for the scratch of a path over derived filters (WinogradConv's,
        PackedConv's: a file an older omrt planned) runs the layer as the plain Conv; one too
        small for a wide depthwise layer's 16 channels at a time runs it plane by plane."""
        if self.derived and self.workspace_bytes > nbytes:
            self.drop_derived()
            self.workspace_bytes = self.conv_workspace_bytes
        if self.band and self.workspace_bytes > nbytes:
            self.lanes = False
            self.band, self.band_bytes = self._band(self.inputs[0], self.inputs[0].shape[1], self.lanes)
            self.workspace_bytes = max(self.im2col_bytes, parallel.MAX_SLOTS * self.band_bytes)
        return super().fit_workspace(nbytes)

    def _native_2d(self, ctx: OpContext, x: TensorInfo) -> bool:
        """Whether the native loops can take this layer: 2-d, float32 data and filters."""
        w = self.inputs[1]
        return ctx.native is not None and x.rank == 4 and x.dtype == np.float32 and w.dtype == np.float32

    def _depthwise(self, ctx: OpContext, x: TensorInfo, channels: int, filters: int) -> Callable | None:
        """The native loop of a 2-d float32 depthwise layer, its geometry bound, when the model has
        it; else None. Call it with (x, w, bias, y, scratch, pitch, band, threads, lanes)."""
        act = activation_code(ctx.attrs)
        fn = ctx.native.get(DWCONV2D) if self._native_2d(ctx, x) else None
        if fn is None or self.group != channels or act is None or math.prod(self.win.kernel) > CONSTANTS["MAX_TAPS"]:
            return None
        win = self.win
        return fn.partial(x.shape[0], filters, filters // channels, *win.size, *win.out, *win.kernel, *win.strides,
                          *win.dilations, *win.begin, *act)

    def _native_im2col(self, ctx: OpContext, x: TensorInfo) -> Callable | None:
        """The native gather of a 2-d float32 layer's columns, one call per chunk (instead of a
        numpy copy per tap), its geometry bound, when the model has it; else None. Call it with
        (image, cols, pitch, first row, last row)."""
        fn = ctx.native.get(IM2COL2D) if self._native_2d(ctx, x) else None
        if fn is None or self.mode != "im2col":
            return None
        win = self.win
        return fn.partial(x.shape[1], *win.size, win.out[1], *win.kernel, *win.strides, *win.dilations, *win.begin)

    def _native_conv(self, ctx: OpContext, x: TensorInfo, filters: int) -> Callable | None:
        """The whole 2-d float32 layer in one native call, gather and GEMMs included, on the native
        workers, its geometry bound, when the model has it; else None. Call it with (x, w, bias,
        y, work, step, buffer, threads)."""
        fn = ctx.native.get(CONV2D) if self._native_2d(ctx, x) else None
        act = activation_code(ctx.attrs)
        if fn is None or act is None:
            return None
        win = self.win
        return fn.partial(*x.shape, filters, self.group, int(self.shuffled), *win.out, *win.kernel, *win.strides,
                          *win.dilations, *win.begin, *act)

    def _padded_extent(self, channels: int, itemsize: int) -> tuple[int, ...] | None:
        """Spatial extent of the zero-padded image a strided gather reads (None: gather by taps)."""
        win = self.win
        if self.flat or math.prod(win.kernel) < STRIDED_TAPS:
            return None
        extent = tuple((o - 1) * s + (k - 1) * d + 1
                       for o, s, k, d in zip(win.out, win.strides, win.kernel, win.dilations))
        return extent if channels * math.prod(extent) * itemsize <= window.WORKSPACE_CAP else None

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
        rows = chunk.last - chunk.first
        np.copyto(cols[(slice(None),) * (1 + len(self.win.kernel)) + (slice(0, rows),)],
                  strided_columns(image, self.win, chunk.first, chunk.last))

    def workspace(self) -> int:
        return self.workspace_bytes

    def _threads(self) -> int:
        """The threads this layer runs on: all of omrt's when it is big enough to pay for a split."""
        return parallel.get_num_threads() if self.flops >= parallel.MIN_FLOPS else 1

    def _layout(self, threads: int) -> tuple[int, int]:
        """Output rows per chunk, and bytes per thread's column buffer (0: one shared buffer).

        One thread: as many rows as the buffer cap allows. Several: a layer gathered in one chunk
        with more filters than positions shares its buffer and splits its filters (one parallel
        region after the gather); the others give each thread (up to parallel.MAX_SLOTS of them)
        a buffer of its own and as many chunks each, all in one region (the native layer rounds
        its count of chunks up to whole rounds and splits the rows evenly: 7 chunks of 4 rows on
        two threads run as 8 of 3 or 4, csrc/conv.c). A layer that needs many
        capped chunks anyway splits the cap between its threads, so that its workspace does not
        grow and the planner keeps the arena at its lower bound. (The packed Conv runs a shared
        layer whose plane fits one block of its GEMM as one region instead, each thread gathering
        the plane into its own strips: gathers_into_strips in csrc/conv.c.)
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
        return step, align(step * self.row_bytes)

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

    def bind(self, inputs, outputs, workspace):
        return self._bind_conv(inputs, outputs, workspace)

    def _bind_conv(self, inputs, outputs, workspace) -> list | None:
        """The native call of the layer on these arrays (the depthwise loop or the whole layer),
        checked; None on the numpy paths and for an empty output."""
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        y = outputs[0]
        path = self._path(x, y) if y.size else None
        if path == "depthwise":
            return [self._bind_depthwise(x, w, b, y, workspace)]
        if path == "native":
            return [self._bind_native(x, w, b, y, workspace)]
        return None

    def run(self, inputs, outputs, workspace):
        if run_bound(self._bind_conv(inputs, outputs, workspace)) or outputs[0].size == 0:
            return
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        y = outputs[0]
        if self.mode == "pointwise":
            self._pointwise(x, w, b, y)
        else:
            self._im2col(x, w, b, y, workspace)

    def _path(self, x: np.ndarray, y: np.ndarray) -> str:
        """Which path a run over x and y takes: "depthwise" or "native" (C, contiguous tensors
        only), else the numpy "pointwise" or "im2col"."""
        contiguous = x.flags.c_contiguous and y.flags.c_contiguous
        if self.native_depthwise is not None and contiguous:
            return "depthwise"
        if self.native_conv is not None and contiguous:
            return "native"
        return self.mode

    def _bind_depthwise(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, y: np.ndarray,
                        workspace: np.ndarray | None) -> Checked:
        """The native depthwise loop, split when the planes it reads or writes are big enough: a
        strided layer reads stride^2 times more than it writes (a 5x5 stride-2 layer on 288 planes
        of 14x14 ran 1.5-1.8x faster on two threads, though its output is below the threshold)."""
        threads = parallel.native_threads(nbytes=max(x.nbytes, y.nbytes), slots=parallel.MAX_SLOTS)
        return self.native_depthwise.bind(x, w, b, y, workspace, self.band_bytes // 4, self.band, threads,
                                          int(self.lanes))

    def _bind_native(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, y: np.ndarray,
                     workspace: np.ndarray | None) -> Checked:
        """The whole layer in one call: the native workers share it (see _layout for the plan)."""
        streams = w.nbytes >= STREAM_SPLIT_BYTES
        threads = parallel.get_num_threads() if streams else parallel.native_threads(self.flops)
        step = buffer = 0
        if self.mode == "im2col":
            split = self._split(min(threads, parallel.MAX_SLOTS))
            step, buffer = split.step, split.buffer // 4
            if buffer:
                threads = min(threads, parallel.MAX_SLOTS)
        work = None if workspace is None or not workspace.nbytes else workspace[self.pad_bytes:]
        return self.native_conv.bind(x, w, b, y, work, step, buffer, threads)

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
        if self.padded is not None and self.native_im2col is None:
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
            if self.native_im2col is not None:
                self.native_im2col(x[i], cols, split.step * inner, chunk.first, chunk.last)
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


@register("ShuffledConv", since=1, domain="omrt")
class ShuffledConv(Conv):
    """A grouped Conv (G groups) and the channel shuffle after it, as ShuffleNet writes it (Reshape
    to (N, G, M / G, H, W), Transpose (0, 2, 1, 3, 4), Reshape back): filter f of group g goes to
    channel f * G + g. The native loop writes each group's rows there (omrt.compiler.passes.
    fold_channel_shuffles); the numpy paths shuffle the planes in place afterwards, a cycle at a
    time through one plane of workspace."""

    shuffled = True

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        if self.group < 2:
            raise ShapeError(f"{ctx.name}: ShuffledConv needs group >= 2, got {self.group}")
        self.native_depthwise = None
        self.plane_at = self.workspace_bytes
        self.workspace_bytes += align(math.prod(self.win.out) * outputs[0].dtype.itemsize)
        filters = inputs[1].shape[0]
        self.cycles = _cycles([(d % self.group) * (filters // self.group) + d // self.group
                               for d in range(filters)])

    def bind(self, inputs, outputs, workspace):
        return super().bind(inputs, outputs, workspace)  # only the native path binds, and it shuffles

    def run(self, inputs, outputs, workspace):
        super().run(inputs, outputs, workspace)
        y = outputs[0]
        if y.size and self._path(inputs[0], y) != "native":
            plane = workspace[self.plane_at:self.plane_at + math.prod(y.shape[2:]) * y.itemsize]
            tmp = plane.view(y.dtype).reshape(y.shape[2:])
            for image in y:
                for cycle in self.cycles:
                    np.copyto(tmp, image[cycle[0]])
                    for d, s in zip(cycle, cycle[1:]):
                        np.copyto(image[d], image[s])
                    np.copyto(image[cycle[-1]], tmp)


def _cycles(source: list[int]) -> list[list[int]]:
    """The cycles, longer than one, of the permutation `source` (position d takes what was at
    source[d]): each [d, source[d], source[source[d]], ...]."""
    seen, cycles = set(), []
    for start in range(len(source)):
        cycle = []
        d = start
        while d not in seen:
            seen.add(d)
            cycle.append(d)
            d = source[d]
        if len(cycle) > 1:
            cycles.append(cycle)
    return cycles

