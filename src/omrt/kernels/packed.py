"""PackedConv (omrt::PackedConv): a Conv whose filters the compiler packed, once, into the panels
omrt's own GEMM reads (csrc/omrt_gemm.h), so that no run packs or re-reads them in another layout.

The compiler rewrites a dense 2-d float32 Conv into this op only when it packs the native
library, and the node keeps the Conv's own filters: without the library (not trusted, another
host) it runs as the Conv it was, through numpy or BLAS. With it, one C call gathers the columns
(as Conv's native path does), copies them a strip at a time next to the cores, and multiplies
every panel of filters by each strip with bias and activation applied in the tile's registers.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..memory import align
from ..native.bindings import GEMM_TILE, PCONV2D, activation_code
from ..native.signature import CONSTANTS
from . import parallel
from .base import OpContext, TensorInfo, register
from .conv import Conv

PANEL = CONSTANTS["GEMM_PANEL"]
"""Rows of filters per packed panel."""

STRIP = CONSTANTS["GEMM_MAX_NR"]
"""Columns of the widest strip a tile reads."""

BLOCK_FLOATS = 8192
"""Floats of columns the GEMM copies at a time, per thread: 32 KiB, about an L1 data cache."""


def block_columns(taps: int) -> int:
    """Columns the GEMM copies at a time for `taps` rows: a multiple of STRIP, 1 to 8 strips."""
    return max(STRIP, min(8 * STRIP, BLOCK_FLOATS // taps // STRIP * STRIP))


def pack_panels(w: np.ndarray) -> np.ndarray:
    """The filters w (M, C, KH, KW) as (ceil(M / PANEL), C * KH * KW, PANEL) panels: element
    [i, k, r] is filter PANEL * i + r at tap k, zero past the last filter."""
    filters, taps = w.shape[0], math.prod(w.shape[1:])
    rows = -(-filters // PANEL) * PANEL
    padded = np.zeros((rows, taps), w.dtype)
    padded[:filters] = w.reshape(filters, taps)
    return np.ascontiguousarray(padded.reshape(rows // PANEL, PANEL, taps).transpose(0, 2, 1))


def gemm_tile(library: Any) -> int:
    """The widest tile of omrt's GEMM in `library` on this CPU (bindings.GEMM_TILES); without a
    vector tile, BLAS multiplies faster and PackedConv runs as a Conv."""
    out = np.zeros(1, np.int64)
    library.get(GEMM_TILE)(out)
    return int(out[0])


def eligible(attrs: dict[str, Any], x: TensorInfo, w: np.ndarray) -> bool:
    """Whether a Conv node over `x` with constant filters `w` can run as a PackedConv: 2-d, one
    group, float32, static shapes and an activation the C tile applies."""
    return (x.rank == 4 and x.static and x.dtype == np.float32 and w.dtype == np.float32 and w.ndim == 4
            and int(attrs.get("group", 1)) == 1 and activation_code(attrs) is not None)


@register("PackedConv", since=1, domain="omrt")
class PackedConv(Conv):
    """Conv(X, W, B) with pack_panels(W) as input 3, multiplied by omrt's own GEMM."""

    native_units = ("conv",)
    derived = ((3, 1),)

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        taps = math.prod(inputs[1].shape[1:])
        self.block = block_columns(taps)
        self.strip_bytes = align(taps * self.block * 4)
        self.conv_workspace_bytes = self.workspace_bytes
        self.workspace_bytes += parallel.MAX_SLOTS * self.strip_bytes
        self.native_packed = self._native_packed(ctx, inputs[0])

    def _native_packed(self, ctx: OpContext, x: TensorInfo) -> Callable | None:
        """The layer in one native call, its geometry bound, when the model has it; else None.
        Call it with (x, panels, bias, y, work, strips, step, buffer, block, threads)."""
        fn = ctx.native.get(PCONV2D) if self._native_2d(ctx, x) else None
        act = activation_code(ctx.attrs)
        if fn is None or act is None or (gemm_tile(ctx.native) == 0 and self.native_conv is not None):
            return None
        win = self.win
        return fn.partial(*x.shape, self.filters, *win.out, *win.kernel, *win.strides, *win.dilations,
                          *win.begin, *act)

    def drop_derived(self) -> None:
        self.native_packed = None

    def fit_workspace(self, nbytes: int) -> bool:
        """A plan too small for the strips (an older omrt's) runs the layer as a Conv."""
        if self.workspace_bytes > nbytes:
            self.native_packed = None
            self.workspace_bytes = self.conv_workspace_bytes
        return super().fit_workspace(nbytes)

    def run(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        if self.native_packed is None or not (x.flags.c_contiguous and y.flags.c_contiguous) or y.size == 0:
            super().run(inputs, outputs, workspace)
            return
        threads = min(parallel.native_threads(self.flops), parallel.MAX_SLOTS)
        step = buffer = 0
        if self.mode == "im2col":
            split = self._split(threads)
            step, buffer = split.step, split.buffer // 4
        work = workspace[self.pad_bytes:self.conv_workspace_bytes] if self.mode == "im2col" else None
        strips = workspace[self.conv_workspace_bytes:]
        b = inputs[2] if len(inputs) > 2 else None
        self.native_packed(x, inputs[3], b, y, work, strips, step, buffer, self.block, threads)
