"""Winograd F(2x2, 3x3) convolution (omrt::WinogradConv): 3x3 stride-1 layers with 2.25x fewer multiplies.

A layer's output is cut into 2x2 tiles, each computed from a 4x4 input tile: the input tiles are
transformed (V = B^T d B), multiplied by the filters transformed ahead of time (U = G g G^T) as 16
GEMMs over all channels, and transformed back (Y = A^T M A), bias and activation included. The
transforms are C loops (csrc/winograd.c); the GEMMs are BLAS. The compiler rewrites a Conv into
this op only when it packs the native library, and the node keeps the Conv's own filters: without
the library (not trusted, another host) it runs as the Conv it was.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import parallel
from .base import OpContext, TensorInfo, register
from .conv import Conv, window_of
from .native import F32, I64, PTR, Function, activation_code, address

TRANSFORM_IN = Function("winograd", "omrt_winograd_in_f32", (PTR,) * 3 + (I64,) * 8)
TRANSFORM_OUT = Function("winograd", "omrt_winograd_out_f32", (PTR,) * 4 + (I64,) * 7 + (F32, F32))

G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
"""The filter transform of F(2x2, 3x3) (interpolation points 0, 1, -1 and infinity)."""

SCRATCH_CAP = 1 << 20
"""Bytes of transformed input and products a layer holds, shared by its threads: tiles go in
chunks under it (so that the workspace, hence the arena, does not grow with the threads)."""

FILTERS_PER_PASS = 64
"""Filters multiplied and transformed back per pass over a chunk: keeps the products small, so
that big layers still get many tiles per chunk."""

MAX_FILTER_BYTES_PER_POSITION = 16 << 10
"""Layers whose filters outweigh their output positions by more than this stay plain Convs: the
transformed filters take 16/9 the bytes of the originals, and late, wide layers (512 channels at
14x14 or 7x7) would add the most resident memory for the least time saved."""

MIN_CHANNELS = 16
"""Layers with fewer input or output channels stay plain Convs: their GEMMs are too thin to pay
for the transforms."""


def filter_transform(w: np.ndarray) -> np.ndarray:
    """U (16, F, C) = G w G^T per filter and channel, computed in float64 (at compile time)."""
    u = np.einsum("ir,fcrs,ks->ikfc", G, w.astype(np.float64), G)
    return np.ascontiguousarray(u.reshape(16, *w.shape[:2]).astype(w.dtype))


def eligible(attrs: dict[str, Any], x: TensorInfo, w: np.ndarray) -> bool:
    """Whether a Conv node over `x` with constant filters `w` gains from Winograd."""
    ctx = OpContext(attrs, 1)
    if (x.rank != 4 or not x.static or x.dtype != np.float32 or w.dtype != np.float32
            or w.shape[2:] != (3, 3) or int(attrs.get("group", 1)) != 1
            or min(w.shape[0], w.shape[1]) < MIN_CHANNELS or activation_code(attrs) is None):
        return False
    win = window_of(ctx, x.shape[2:], [3, 3])
    return (win.strides == (1, 1) and win.dilations == (1, 1)
            and w.nbytes <= MAX_FILTER_BYTES_PER_POSITION * math.prod(win.out))


@register("WinogradConv", since=1, domain="omrt")
class WinogradConv(Conv):
    """Conv(X, W, B) with U = filter_transform(W) as input 3, run by Winograd F(2x2, 3x3)."""

    native_units = ("winograd",)

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        oh, ow = self.win.out
        self.tile_grid = (-(-oh // 2), -(-ow // 2))
        self.tiles = math.prod(self.tile_grid)
        self.passes = [(f, min(f + FILTERS_PER_PASS, self.filters))
                       for f in range(0, self.filters, FILTERS_PER_PASS)]
        tw = self.tile_grid[1]
        self.rows_bytes = _align(max(8 * (2 * tw + 2), 4 * tw) * 4)
        self.nbytes = max(self.nbytes, max(t * self._slot(self._per_chunk(t))
                                           for t in range(1, parallel.MAX_SLOTS + 1)))
        act = activation_code(ctx.attrs)
        native = ctx.native
        fns = (native.get(TRANSFORM_IN), native.get(TRANSFORM_OUT)) if native is not None else (None, None)
        self.c_winograd = fns + (act,) if None not in fns and act is not None else None
        self.plans: dict[int, tuple[list[tuple[int, int]], int, int]] = {}

    def _per_chunk(self, threads: int) -> int:
        """Tiles per chunk for each of `threads` threads under their share of SCRATCH_CAP."""
        per_tile = 16 * (self.inputs[0].shape[1] + min(self.filters, FILTERS_PER_PASS)) * 4
        return max(1, min(self.tiles, SCRATCH_CAP // threads // per_tile))

    def _slot(self, n: int) -> int:
        """Scratch bytes of one thread for chunks of `n` tiles: V, the products, and rows."""
        channels = self.inputs[0].shape[1]
        return (_align(16 * channels * n * 4) + _align(16 * min(self.filters, FILTERS_PER_PASS) * n * 4)
                + self.rows_bytes)

    def _plan(self, threads: int) -> tuple[list[tuple[int, int]], int, int]:
        """(tile ranges, tiles per chunk, bytes per thread) on `threads` threads: chunks of at most
        _per_chunk(threads) tiles, and at least one per thread when there are enough tiles."""
        plan = self.plans.get(threads)
        if plan is None:
            per_chunk = self._per_chunk(threads)
            count = max(-(-self.tiles // per_chunk), min(threads, self.tiles))
            plan = self.plans[threads] = (parallel.spans(self.tiles, count), per_chunk, self._slot(per_chunk))
        return plan

    def run(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        if self.c_winograd is None or not (x.flags.c_contiguous and y.flags.c_contiguous) or y.size == 0:
            super().run(inputs, outputs, workspace)
            return
        self._winograd(x, inputs[2] if len(inputs) > 2 else None, inputs[3], y, workspace)

    def _winograd(self, x: np.ndarray, b: np.ndarray | None, u: np.ndarray, y: np.ndarray,
                  workspace: np.ndarray) -> None:
        transform_in, transform_out, (act, alpha, beta) = self.c_winograd
        n_images, channels, height, width = x.shape
        (oh, ow), (pt, pl) = self.win.out, self.win.begin
        tw = self.tile_grid[1]
        threads = min(parallel.get_num_threads(), parallel.MAX_SLOTS)
        chunks, per_chunk, slot_bytes = self._plan(threads)
        image_in, image_out = channels * height * width * 4, self.filters * oh * ow * 4
        src, dst, bias = address(x), address(y), 0 if b is None else address(b)
        flat = workspace[:threads * slot_bytes].view(np.float32)
        v_floats = _align(16 * channels * per_chunk * 4) // 4

        def chunk(j: int, slot: int) -> None:
            i, k = divmod(j, len(chunks))
            t0, t1 = chunks[k]
            n = t1 - t0
            base = slot * slot_bytes // 4
            v = flat[base:base + 16 * channels * n].reshape(16, channels, n)
            products = base + v_floats
            rows = address(workspace) + slot_bytes * (slot + 1) - self.rows_bytes
            transform_in(src + i * image_in, address(v), rows, channels, height, width, pt, pl, tw, t0, t1)
            for f0, f1 in self.passes:
                m = flat[products:products + 16 * (f1 - f0) * n].reshape(16, f1 - f0, n)
                np.matmul(u[:, f0:f1], v, out=m)
                transform_out(address(m), bias and bias + 4 * f0, dst + i * image_out + 4 * f0 * oh * ow,
                              rows, f1 - f0, oh, ow, tw, t0, t1, act, alpha, beta)

        parallel.parallel_for(n_images * len(chunks), chunk, threads)


def _align(n: int) -> int:
    return -(-n // 64) * 64
