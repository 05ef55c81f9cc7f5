"""Pooling kernels: windowed max/average/Lp pools, their global forms, MaxRoiPool and MaxUnpool.

Windowed pools never loop over output pixels: they reduce one spatial dim at a time with one
ufunc call per kernel tap over a strided (or flat, shifted) view, a block of (N, C) planes at a
time; the window geometry (`window`) is shared with the convolutions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import ShapeError
from ..memory import align
from ..native.bindings import GLOBAL_POOL, POOL2D
from ..native.library import Bound, Checked
from .base import Kernel, OpContext, TensorInfo, register, run_bound
from . import parallel, window
from .window import PLANE_LANES, Tap, Window, int_list, sliding_window, window_of

_ALL = (Ellipsis,)

BAND_FLOATS = 4096
"""Scratch per thread (16 KiB, so that a band's copy stays in L1 beside the rows it reads) in
which the native loop pools bands of output rows (`pool_band_floats`)."""

NARROW_ROW = 16
"""Output rows shorter than this pool 16 planes at a time, one vector lane each (csrc/pool.c,
lanes_part_16 with AVX-512, lanes_part_8 with AVX2, whose transposes interleave the planes
cheaply; csrc/pool_lanes.h), each output row a pass down the window's rows and one along its
columns; without AVX2 the C loop takes the plane loops. Each plan holds the scratch for either
path. With AVX2 (AVX-512 hidden, AMD Zen 4, one and two threads, per node in the models, two
builds alternating), against the plane loops: inception_v2's pools over 7x7 planes took
0.58-0.65 of the time, its 3x3 averages over 14x14 ones 0.80-0.99 and the max at stride 2 0.84-0.90;
inception_v1's over 13x13 and 6x6 ones 0.56-0.93, its 7x7 average over 6x6 0.24."""

ROW_PATH_WIDTH = 96
"""Planes at least this wide pool row by row: their rows are long enough for the row loop's
vectors, and a band of them would hold few rows (3x3 max pools at stride 2 over 111- and
112-wide planes ran 1.09-1.38x slower in bands, 56-wide ones 0.91x, 28-wide ones 0.52x; 80-wide
planes ran 1.1-1.3x slower in bands at stride 2, 0.94x at stride 1, so the line stays here)."""

REGISTER_ROW = 16
"""Pools over planes at most this wide, with output rows and windows no wider, pool each row in
one register where the CPU has AVX-512 (csrc/pool.c, register_part: the window's input rows
reduced lane by lane, its taps along the row picked by permutes; no copy of the planes, no
scratch), and 16 planes at a time with AVX2 (see NARROW_ROW). Alone (one thread, hot in cache,
an Intel Xeon), 3x3 windows over 576 planes of 14x14 took 38 us averaging against 56 for 16
planes at a time, 24 against 42 for the max at stride 2; in inception_v2, its 14x14 pools took
0.50-0.65 of the time at one thread and 0.27-0.34 at two, its 7x7 ones 0.57-0.82, the whole
model 0.96 / 0.95."""

VECTOR_ROW_WIDTH = 20
"""Max pools at stride 2 along rows at least this wide take the native loop's vector path where
the CPU has AVX2 or AVX-512 (csrc/pool.c, vector_part and vector_part8: each row's column maxima
over its window's rows in a buffer, the taps along the row picked from it by shuffles), when
their windows' taps fall at columns 0 to 2 of their start. Alone with AVX-512 (one thread, hot in
cache), 3x3 windows took 0.54 of the row path's time over 111-wide planes, 0.45 over 112-wide
padded ones, 0.64 of the band path's over 55-wide ones, 0.62 and 0.81 of the 16-planes path's
over 27- and 20-wide ones; as long over 24-wide padded ones, 1.26x over 18-wide padded ones, 1.5x
over 14-wide ones. With AVX2 (AVX-512 hidden, the kernel alone in a model), 0.74-0.80 of the time
over 111- to 160-wide planes, 0.53-0.70 over 27- to 56-wide ones."""

VECTOR_ROW_WIDTH_STRIDE_1 = 80
"""Max pools at stride 1 along rows at least this wide take the vector path too: with AVX-512 it
took 0.79 and 0.87 of the time over 80- and 112-wide planes, but 1.05x over 72-wide ones and 1.2x
over 28- and 56-wide ones (3x3 windows, padded); with AVX2, 0.63 over 80-wide ones (0.92 over
28-wide ones: the line stays where AVX-512 puts it)."""

SPLIT_BYTES = 1 << 24
"""Pools that read at least this many bytes (input size times the taps per dim) spread their
plane blocks over omrt's threads; smaller ones cost less than a handoff."""


def _vector_rows(win: Window) -> bool:
    """Whether a max pool with this window asks the native loop for its vector path (see
    VECTOR_ROW_WIDTH); the loop itself takes the row path for output rows wider than its buffer
    holds (csrc/pool.c, vector_path)."""
    (_, kw), (_, sw), (_, dw), width = win.kernel, win.strides, win.dilations, win.size[1]
    if sw == 2:
        return (kw - 1) * dw <= 2 and width >= VECTOR_ROW_WIDTH
    return sw == 1 and width >= VECTOR_ROW_WIDTH_STRIDE_1


def pool_plane_floats(win: Window, rows: int) -> int:
    """Floats of scratch the native loop needs to pool a band of `rows` output rows (csrc/pool.c,
    pool_plane): a padded copy of its input rows Wq * SW wide, their columns pooled (Wq per row),
    and the output rows SH * Wq apart."""
    ow, (kh, kw), (sh, sw), (dh, dw) = win.out[1], win.kernel, win.strides, win.dilations
    wq = -(-((ow - 1) * sw + (kw - 1) * dw + 1) // sw)
    hp = (rows - 1) * sh + (kh - 1) * dh + 1
    return max(hp * wq * sw + (kw - 1) * dw, rows * sh * wq) + (hp + sh - 1) * wq


def pool_lanes_floats(win: Window, rows: int) -> int:
    """Floats of scratch the native loop needs to pool a band of `rows` output rows of 16 narrow
    planes at once (csrc/pool.c, pool_lanes_floats): their input rows interleaved, the results, and
    a row of column results."""
    ow, (kh, kw), (sh, sw), (dh, dw) = win.out[1], win.kernel, win.strides, win.dilations
    wide = (ow - 1) * sw + (kw - 1) * dw + 1
    return PLANE_LANES * (((rows - 1) * sh + (kh - 1) * dh + 2) * wide + rows * ow)


def pool_band_floats(win: Window) -> int:
    """The scratch per thread of the native 2-d loop: the widest band of output rows that fits
    BAND_FLOATS (the C code finds the same band from it), else one input row (the row path, also
    for planes ROW_PATH_WIDTH or wider); for output rows shorter than NARROW_ROW, also room for
    the widest band of 16 planes at once that fits BAND_FLOATS (at least one row)."""
    row = win.size[1]
    fits = [rows for rows in range(1, win.out[0] + 1) if pool_plane_floats(win, rows) <= BAND_FLOATS]
    floats = max(pool_plane_floats(win, fits[-1]), row) if fits and row < ROW_PATH_WIDTH else row
    if win.out[1] < NARROW_ROW:
        lanes = [rows for rows in range(2, win.out[0] + 1) if pool_lanes_floats(win, rows) <= BAND_FLOATS]
        floats = max(floats, pool_lanes_floats(win, max(lanes, default=1)))
    return floats


def _kernel_shape(ctx: OpContext, x: TensorInfo) -> list[int]:
    ks = ctx.attrs.get("kernel_shape")
    if not ks:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} needs the kernel_shape attribute")
    if x.rank != len(ks) + 2:
        raise ShapeError(f"{ctx.name}: X has rank {x.rank} but kernel_shape={list(ks)} needs rank "
                         f"{len(ks) + 2} (N, C, *spatial)")
    return [int(k) for k in ks]


@dataclass(frozen=True)
class _Stage:
    """The reduction of one spatial dim: per-tap strided views, or flat shifts.

    When the dim's input is exactly out * stride long and either the stride is 1 or the dim is the
    last one, every tap is a single 1-d view of the whole flattened tensor (rows run into each
    other); only the few edge positions whose window leaves the row are then recomputed. Long
    contiguous 1-d ufunc calls are several times faster than the same work on strided views.
    """

    taps: tuple[Tap, ...]
    shifts: tuple[int, ...] = ()
    """Flat form: how far (in elements of this dim) each tap that is ever in bounds reads."""
    edges: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """Flat form: (output position, the input positions its window reads) near the edges."""

    @staticmethod
    def plan(line: Window, inner: int) -> "_Stage":
        """The stage for a 1-d window `line` over a dim followed by `inner` elements per position."""
        out, n, stride = line.out[0], line.size[0], line.strides[0]
        taps = sorted((t for t in line.taps() if not t.empty), key=lambda t: t.bounds != ((0, out),))
        edges = sorted({o for t in taps for o in range(out) if not t.bounds[0][0] <= o < t.bounds[0][1]})
        if n != out * stride or (stride != 1 and inner != 1) or len(edges) * 2 > out:
            return _Stage(tuple(taps))
        shifts = tuple(t.index[0] * line.dilations[0] - line.begin[0] for t in taps)
        reads = tuple((o, tuple(o * stride + sh for sh in shifts if 0 <= o * stride + sh < n))
                      for o in edges)
        return _Stage(tuple(taps), shifts, reads)


class _WindowPool(Kernel):
    """A pool whose window slides over the spatial dims of X (N, C, *spatial).

    Max and sum over a box window are separable: the pool reduces one spatial dim at a time
    (each stage one ufunc call per kernel tap along that dim, intermediates in the workspace),
    which costs sum(kernel) instead of prod(kernel) passes and keeps inner loops long.
    """

    identity: float = 0.0

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        kernel = _kernel_shape(ctx, x)
        spatial = sliding_window(ctx, x.shape[2:], kernel, bool(ctx.attrs.get("ceil_mode", 0)))[0]
        return [TensorInfo(x.dtype, (*x.shape[:2], *spatial))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x = inputs[0]
        ceil_mode = bool(ctx.attrs.get("ceil_mode", 0))
        self.win = window_of(ctx, x.shape[2:], _kernel_shape(ctx, x), ceil_mode)
        w = self.win
        nd = len(w.kernel)
        self.stages = [_Stage.plan(Window(w.size[d:d + 1], w.kernel[d:d + 1], w.strides[d:d + 1],
                                          w.dilations[d:d + 1], w.begin[d:d + 1], w.end[d:d + 1],
                                          w.out[d:d + 1]), math.prod(w.size[d + 1:]))
                       for d in range(nd)]
        self.planes = math.prod(x.shape[:2])
        self.plane_shapes = [w.out[:d + 1] + w.size[d + 1:] for d in range(nd - 1)]
        per_plane = sum(math.prod(sh) for sh in self.plane_shapes) * x.dtype.itemsize
        self.block = max(1, min(self.planes, window.WORKSPACE_CAP // max(per_plane, 1)))
        self.traffic = x.nbytes * sum(w.kernel)
        self.stage_bytes = max(t * self._slot_bytes(self._block(t))
                               for t in range(1, parallel.MAX_SLOTS + 1))
        native_2d = nd == 2 and x.dtype == np.float32
        self.pitch_bytes = align(pool_band_floats(w) * 4) if native_2d else 0
        """Scratch per thread of the native loop: planned whether or not the model has it."""
        self.stage_bytes = max(self.stage_bytes, parallel.MAX_SLOTS * self.pitch_bytes)
        self.native_pool = ctx.native.get(POOL2D) if ctx.native is not None and native_2d else None
        self.lanes = int(self.native_pool is not None and w.out[1] < NARROW_ROW)
        """Whether the native loop is asked to pool 16 planes at a time (1) or plane by plane (0)."""
        self.register_rows = self.native_pool is not None and max(w.size[1], w.out[1], w.kernel[1]) <= REGISTER_ROW
        """Whether the native loop is asked to pool each row in one register (see REGISTER_ROW)."""
        self.vector_rows = self.native_pool is not None and _vector_rows(w)
        """Whether a max pool asks the native loop for its vector path (see VECTOR_ROW_WIDTH)."""
        self.window_args = (*w.size, *w.out, *w.kernel, *w.strides, *w.dilations, *w.begin)
        whole = w.kernel == w.size and not any(w.begin) and not any(w.end) and set(w.dilations) == {1}
        self.native_global = ctx.native.get(GLOBAL_POOL) if self.native_pool is not None and whole else None
        """A window over each whole plane, unpadded, pools as GlobalAveragePool or GlobalMaxPool."""

    def workspace(self) -> int:
        return self.stage_bytes

    def _block(self, threads: int) -> int:
        """Planes per block on `threads` threads, each with intermediates of its own: the blocks of
        one thread split between them (or all planes, when they fit one), so the workspace holds."""
        if threads == 1:
            return self.block
        if self.planes > self.block:
            return max(1, self.block // threads)
        return -(-self.planes // threads)

    def _slot_bytes(self, block: int) -> int:
        return sum(align(block * math.prod(sh) * self.inputs[0].dtype.itemsize) for sh in self.plane_shapes)

    def _reduce(self, ufunc: np.ufunc, x: np.ndarray, y: np.ndarray, workspace: np.ndarray | None,
                finish: Callable[[np.ndarray], None] | None = None) -> None:
        """y = ufunc-reduction of x over each window (padding is skipped), one spatial dim at a time,
        then finish(block of y) if given.

        Planes (N * C of them) go in blocks so that the intermediates stay within WORKSPACE_CAP;
        big pools spread their blocks over omrt's threads.
        """
        xs, ys = x.reshape((-1,) + x.shape[2:]), y.reshape((-1,) + y.shape[2:])
        threads = min(parallel.get_num_threads(), parallel.MAX_SLOTS) if self.traffic >= SPLIT_BYTES else 1
        block = self._block(threads)
        slot_bytes = self._slot_bytes(block)

        def reduce_block(j: int, slot: int) -> None:
            b0 = j * block
            src, offset = xs[b0:b0 + block], slot * slot_bytes
            count = src.shape[0]
            for d, stage in enumerate(self.stages):
                if d < len(self.plane_shapes):
                    shape = (count,) + self.plane_shapes[d]
                    nbytes = math.prod(shape) * x.dtype.itemsize
                    dst = workspace[offset:offset + nbytes].view(x.dtype).reshape(shape)
                    offset += align(block * math.prod(self.plane_shapes[d]) * x.dtype.itemsize)
                else:
                    dst = ys[b0:b0 + count]
                lead = (slice(None),) * (1 + d)
                if stage.shifts and dst.size:
                    self._flat_stage(ufunc, stage, src, dst, lead)
                else:
                    self._tap_stage(ufunc, stage, src, dst, lead)
                src = dst
            if finish is not None:
                finish(src)

        parallel.parallel_for(-(-xs.shape[0] // block), reduce_block, threads)

    def _bind_pool(self, x: np.ndarray, y: np.ndarray, workspace: np.ndarray, is_max: bool,
                   inv_count: np.ndarray | None) -> list[Checked] | None:
        """The 2-d float32 pool in one native pass over each plane, checked, when the model has
        the C loop and the tensors are contiguous; None when the numpy stages must run instead.

        Each thread has scratch of its own in the workspace (`pool_band_floats`)."""
        if self.native_pool is None or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        if self.native_global is not None:
            return bind_global(self.native_global, x, y, is_max)
        threads = parallel.native_threads(nbytes=x.nbytes, slots=parallel.MAX_SLOTS)
        return [self.native_pool.bind(x, y, inv_count, workspace, self.pitch_bytes // 4, threads, self.planes,
                                      *self.window_args, int(is_max), self._path(is_max))]

    def _path(self, is_max: bool) -> int:
        """The native loop's path asked for: 3 each row in one register, 2 the vector path, 1 16
        planes at a time, 0 plane by plane (csrc/pool.c, omrt_pool2d_f32)."""
        if self.register_rows:
            return 3
        return 2 if is_max and self.vector_rows else self.lanes

    def _tap_stage(self, ufunc: np.ufunc, stage: _Stage, src: np.ndarray, dst: np.ndarray,
                   lead: tuple) -> None:
        rest = stage.taps
        if rest and rest[0].bounds == ((0, dst.shape[len(lead)]),):
            np.copyto(dst, src[lead + rest[0].src])
            rest = rest[1:]
        else:
            dst.fill(self.identity)
        for tap in rest:
            view = dst[lead + tap.dst]
            ufunc(view, src[lead + tap.src], out=view)

    def _flat_stage(self, ufunc: np.ufunc, stage: _Stage, src: np.ndarray, dst: np.ndarray,
                    lead: tuple) -> None:
        stride, inner = self.win.strides[len(lead) - 1], math.prod(src.shape[len(lead) + 1:])
        flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
        for i, shift in enumerate(stage.shifts):
            offset = shift * inner
            k0 = -(offset // stride) if offset < 0 else 0
            k1 = min(flat_dst.size, (flat_src.size - 1 - offset) // stride + 1)
            view = flat_dst[k0:k1]
            taps = flat_src[k0 * stride + offset:(k1 - 1) * stride + offset + 1:stride]
            if i == 0:
                np.copyto(view, taps)
            else:
                ufunc(view, taps, out=view)
        for pos, reads in stage.edges:
            view = dst[lead + (pos,)]
            if not reads:
                view.fill(self.identity)
                continue
            np.copyto(view, src[lead + (reads[0],)])
            for j in reads[1:]:
                ufunc(view, src[lead + (j,)], out=view)


@register("MaxPool", since=1)
class MaxPool(_WindowPool):
    """Max over each window; padding never wins. Optional Indices (opset 8+) into the flattened X.

    ONNX: "the indices are computed as flatten 1-D tensor ... with storage_order=1 the values are
    in column-major order" (of the spatial dims; N and C stay outer).
    """

    native_units = ("pool",)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        y = super().infer(ctx, inputs)[0]
        return [y, TensorInfo(np.dtype(np.int64), y.shape)] if ctx.opset >= 8 else [y]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        dtype = inputs[0].dtype
        self.identity = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min

    def bind(self, inputs, outputs, workspace):
        if len(outputs) > 1 and outputs[1] is not None:
            return None
        return self._bind_pool(inputs[0], outputs[0], workspace, True, None)

    def run(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        indices = outputs[1] if len(outputs) > 1 else None
        if indices is None:
            if not run_bound(self._bind_pool(x, y, workspace, True, None)):
                self._reduce(np.maximum, x, y, workspace)
            return
        y.fill(self.identity)
        indices.fill(-1)
        for tap in self.win.taps():
            if tap.empty:
                continue
            dst = _ALL + tap.dst
            yv, iv, xv = y[dst], indices[dst], x[_ALL + tap.src]
            take = xv > yv
            take |= iv < 0
            np.copyto(yv, xv, where=take)
            np.copyto(iv, self._flat(tap), where=take)
        n, c = x.shape[:2]
        planes = np.arange(n * c, dtype=np.int64).reshape(n, c, *([1] * (x.ndim - 2)))
        indices += planes * math.prod(self.win.size)

    def _flat(self, tap: Tap) -> np.ndarray:
        """Flat spatial index of the input element each in-bounds position of `tap` reads."""
        column_major = int(self.ctx.attrs.get("storage_order", 0)) == 1
        size = self.win.size
        flat = np.zeros((), np.int64)
        for i, sl in enumerate(tap.src):
            step = math.prod(size[:i]) if column_major else math.prod(size[i + 1:])
            coords = np.arange(sl.start, sl.stop, sl.step, dtype=np.int64) * step
            flat = np.add.outer(flat, coords)
        return flat


@register("AveragePool", since=1)
class AveragePool(_WindowPool):
    """Mean over each window.

    ONNX: count_include_pad "whether include pad pixels when calculating values for the edges";
    either way positions past the end padding (from ceil_mode) are never counted.
    """

    native_units = ("pool",)

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        counts = self.win.counts(bool(ctx.attrs.get("count_include_pad", 0)))
        uniform = counts.size and (counts == counts.flat[0]).all()
        self.divisor = np.asarray(counts.flat[0] if uniform else counts, inputs[0].dtype)
        self.inv_count = (1 / counts).astype(np.float32) if self.native_pool is not None else None

    def bind(self, inputs, outputs, workspace):
        return self._bind_pool(inputs[0], outputs[0], workspace, False, self.inv_count)

    def run(self, inputs, outputs, workspace):
        if not run_bound(self.bind(inputs, outputs, workspace)):
            self._reduce(np.add, inputs[0], outputs[0], workspace,
                         lambda block: np.divide(block, self.divisor, out=block))


def _p(ctx: OpContext) -> float:
    p = float(ctx.attrs.get("p", 2))
    if p <= 0:
        raise ShapeError(f"{ctx.name}: p={p} must be positive")
    return p


def _abs_pow(x: np.ndarray, p: float, out: np.ndarray) -> None:
    np.abs(x, out=out)
    if p != 1:
        np.power(out, out.dtype.type(p), out=out)


@register("LpPool", since=1)
class LpPool(_WindowPool):
    """(sum over the window of |x|^p)^(1/p); padding contributes zero."""

    def workspace(self) -> int:
        return self.stage_bytes + self.inputs[0].nbytes

    def run(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        p = _p(self.ctx)
        powered = workspace[self.stage_bytes:self.stage_bytes + x.nbytes].view(x.dtype).reshape(x.shape)
        _abs_pow(x, p, powered)
        self._reduce(np.add, powered, y, workspace)
        np.power(y, y.dtype.type(1 / p), out=y)


def bind_global(fn: Bound, x: np.ndarray, y: np.ndarray, is_max: bool) -> list[Checked]:
    """The call of GLOBAL_POOL `fn`: each of y's planes (one value each) the mean or maximum of
    x's plane, x and y C-contiguous and not empty."""
    return [fn.bind(x, y, y.size, x.size // y.size, int(is_max), parallel.native_threads(nbytes=x.nbytes))]


class _GlobalPool(Kernel):
    """A pool over all spatial dims of X (N, C, *spatial): output (N, C, 1, ...); float32
    averages and maxima in C (`GLOBAL_POOL`) when the model has the pool unit."""

    native_units = ("pool",)
    is_max: int | None = None
    """1 for the maximum, 0 for the mean, None: numpy only."""

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        native = self.is_max is not None and ctx.native is not None and outputs[0].dtype == np.float32
        self.native_global = ctx.native.get(GLOBAL_POOL) if native else None

    def bind(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        if self.native_global is None or x.size == 0 or not (x.flags.c_contiguous and y.flags.c_contiguous):
            return None
        return bind_global(self.native_global, x, y, self.is_max)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.rank < 2:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs X of rank >= 2 (N, C, *spatial), "
                             f"got {list(x.shape)}")
        return [TensorInfo(x.dtype, (*x.shape[:2], *([1] * (x.rank - 2))))]

    @staticmethod
    def axes(x: np.ndarray) -> tuple[int, ...]:
        return tuple(range(2, x.ndim))

    def run(self, inputs, outputs, workspace):
        if not run_bound(self.bind(inputs, outputs, workspace)):
            x = inputs[0]
            (np.max if self.is_max else np.mean)(x, axis=self.axes(x), keepdims=True, out=outputs[0])


@register("GlobalAveragePool", since=1)
class GlobalAveragePool(_GlobalPool):
    """Mean over the spatial dims."""

    is_max = 0


@register("GlobalMaxPool", since=1)
class GlobalMaxPool(_GlobalPool):
    """Max over the spatial dims."""

    is_max = 1


@register("GlobalLpPool", since=1)
class GlobalLpPool(_GlobalPool):
    """(sum over the spatial dims of |x|^p)^(1/p)."""

    def workspace(self) -> int:
        return self.inputs[0].nbytes

    def run(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        p = _p(self.ctx)
        powered = workspace[:x.nbytes].view(x.dtype).reshape(x.shape)
        _abs_pow(x, p, powered)
        np.sum(powered, axis=self.axes(x), keepdims=True, out=y)
        np.power(y, y.dtype.type(1 / p), out=y)


@register("MaxRoiPool", since=1)
class MaxRoiPool(Kernel):
    """Max over a pooled_shape grid of bins inside each region of interest (Fast R-CNN RoI pooling).

    rois are (batch_index, x1, y1, x2, y2) in input coordinates before `spatial_scale`; corners
    round half away from zero, each bin spans floor(i * roi / pooled) .. ceil((i + 1) * roi / pooled),
    and empty bins give 0.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, rois = inputs[0], inputs[1]
        pooled = ctx.attrs.get("pooled_shape")
        if not pooled or len(pooled) != 2 or x.rank != 4 or rois.rank != 2:
            raise ShapeError(f"{ctx.name}: MaxRoiPool needs X (N, C, H, W), rois (R, 5) and "
                             f"pooled_shape=[h, w]; got X{list(x.shape)} rois{list(rois.shape)} "
                             f"pooled_shape={pooled}")
        return [TensorInfo(x.dtype, (rois.shape[0], x.shape[1], int(pooled[0]), int(pooled[1])))]

    def run(self, inputs, outputs, workspace):
        x, rois, y = inputs[0], inputs[1], outputs[0]
        ph, pw = (int(v) for v in self.ctx.attrs["pooled_shape"])
        scale = float(self.ctx.attrs.get("spatial_scale", 1.0))
        height, width = x.shape[2:]
        corners = rois[:, 1:5].astype(np.float64) * scale
        corners = (np.sign(corners) * np.floor(np.abs(corners) + 0.5)).astype(np.int64)
        y.fill(0)
        for r, (x1, y1, x2, y2) in enumerate(corners):
            image = x[int(rois[r, 0])]
            rows = _bins(y1, max(y2 - y1 + 1, 1), ph, height)
            cols = _bins(x1, max(x2 - x1 + 1, 1), pw, width)
            for i, (h0, h1) in enumerate(rows):
                if h1 <= h0:
                    continue
                band = image[:, h0:h1].max(axis=1)
                for j, (w0, w1) in enumerate(cols):
                    if w1 > w0:
                        np.max(band[:, w0:w1], axis=1, out=y[r, :, i, j])


def _bins(start: int, length: int, pooled: int, limit: int) -> list[tuple[int, int]]:
    """[begin, end) of each of `pooled` bins over `length` pixels from `start`, clipped to [0, limit)."""
    size = length / pooled
    return [(min(max(math.floor(i * size) + start, 0), limit),
             min(max(math.ceil((i + 1) * size) + start, 0), limit)) for i in range(pooled)]


@register("MaxUnpool", since=9)
class MaxUnpool(Kernel):
    """Scatter X into zeros at the flat positions MaxPool's Indices name (a partial inverse of MaxPool).

    The indices address a tensor of the default shape (in - 1) * stride + kernel - pads; with a
    larger output_shape, that tensor sits at the start of each spatial dim and the rest is zero.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        shape = inputs[2] if len(inputs) > 2 else None
        if shape is not None:
            if shape.value is None:
                return [TensorInfo(x.dtype, (None,) * x.rank)]
            return [TensorInfo(x.dtype, tuple(int(v) for v in shape.value))]
        return [TensorInfo(x.dtype, cls._default_shape(ctx, x.shape))]

    @staticmethod
    def _default_shape(ctx: OpContext, shape: Sequence) -> tuple:
        kernel = _kernel_shape(ctx, TensorInfo(np.dtype(np.float32), tuple(shape)))
        nd = len(kernel)
        strides = int_list(ctx, "strides", nd, 1)
        pads = int_list(ctx, "pads", 2 * nd, 0)
        spatial = [(n - 1) * s + k - pads[i] - pads[i + nd] if isinstance(n, int) else None
                   for i, (n, s, k) in enumerate(zip(shape[2:], strides, kernel))]
        return (*shape[:2], *spatial)

    def run(self, inputs, outputs, workspace):
        x, indices, y = inputs[0], inputs[1], outputs[0]
        default = self._default_shape(self.ctx, x.shape)
        if any(o < d for o, d in zip(y.shape, default)):
            raise ShapeError(f"{self.ctx.name}: output_shape {list(y.shape)} is smaller than the "
                             f"unpooled shape {list(default)}; give a shape at least that big")
        y.fill(0)
        if tuple(y.shape) == default:
            np.put(y, indices, x)
        else:
            y[np.unravel_index(indices, default)] = x
