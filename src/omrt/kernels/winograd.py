"""Winograd convolution (omrt::WinogradConv): 3x3 stride-1 layers with 2.25x (F(2x2, 3x3)) or 4x
(F(4x4, 3x3), on wide planes) fewer multiplies.

A layer's output is cut into T x T tiles (T = 2 or 4, see tile_for), each computed from a
(T + 2) x (T + 2) input tile: the input tiles are transformed (V = B^T d B), multiplied by the
filters transformed ahead of time (U = G g G^T) as (T + 2)^2 GEMMs over all channels, and
transformed back (Y = A^T M A), bias and activation included. The whole layer is one C call
(csrc/winograd.c) on the native workers, its GEMMs on omrt's own tile (the transformed filter
matrices packed in panels at compile time, as PackedConv's are; their count says T). The
compiler rewrites a Conv into this op only when it packs the native library, and the node keeps
the Conv's own filters: without the library (not trusted, another host, a CPU without a vector
tile) it runs as the Conv it was.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..memory import align
from ..native.bindings import WINOGRAD, activation_code
from ..native.signature import CONSTANTS
from . import parallel
from .base import OpContext, TensorInfo, register, run_bound
from .conv import Conv
from .packed import PANEL, STRIP, gemm_tile, pack_panels
from .window import window_of

G = {2: np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]]),
     4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]])}
"""The filter transforms of F(2x2, 3x3) (interpolation points 0, 1, -1 and infinity) and of
F(4x4, 3x3) (0, 1, -1, 2, -2 and infinity), by output tile side."""

WIDE_PLANE = 20
"""Layers whose output planes are at least this wide and high may take 4x4 tiles: 56x56 to 80x80
layers of 16-64 channels ran in 0.77-0.89 of the time of 2x2 tiles; 14x14 and 13x13 ones gained
nothing for 2.25x the bytes of transformed filters (the padding of 4x4 tiles over 13 or 14
columns, and products over fewer tiles)."""

MAX_WIDE_FILTER_BYTES = 1 << 20
"""...and only when their 36 transformed filter matrices take at most this many bytes (64
channels in and out): above it they stream from beyond the L2 once per chunk of tiles, and
DBNet's 128-channel 40x40 and 256-channel 20x20 layers took 1.08-1.49x the time of 2x2 tiles
(resnet50's 128-channel 28x28 ones 0.75x: the rule gives that up)."""

SCRATCH_CAP = 1 << 20
"""Bytes of transformed input and products a thread holds: tiles go in chunks under it. Shared
by two threads (chunks of 66 tiles each), a 64-channel 56x56 layer took 1.55-1.76 ms on two
threads; with a cap per thread (132 tiles) 1.38-1.44 ms, for 1 MiB more of workspace."""

FILTERS_PER_PASS = 5 * PANEL
"""Filters multiplied and transformed back per pass over a chunk (whole panels): keeps the
products small, so that big layers still get many tiles per chunk."""

MAX_FILTER_BYTES_PER_POSITION = 16 << 10
"""Layers whose filters outweigh their output positions by more than this stay plain Convs: the
transformed filters take 16/9 (2x2 tiles) or 4 (4x4 tiles) times the bytes of the originals, and
late, wide layers (512 channels at 14x14 or 7x7) would add the most resident memory for the least
time saved."""

MIN_CHANNELS = 16
"""Layers with fewer input or output channels stay plain Convs: their GEMMs are too thin to pay
for the transforms."""


def tile_for(attrs: dict[str, Any], x: TensorInfo, w: np.ndarray) -> int:
    """The output tile side for an eligible Conv node over `x` with filters `w`: 4 on wide output
    planes when the transformed filters stay small, else 2."""
    wide = min(window_of(OpContext(attrs, 1), x.shape[2:], [3, 3]).out) >= WIDE_PLANE
    return 4 if wide and len(G[4]) ** 2 * w.shape[0] * w.shape[1] * w.itemsize <= MAX_WIDE_FILTER_BYTES else 2


def tile_of(u: TensorInfo, filters: int, channels: int) -> int | None:
    """The output tile side U = packed_transform(W, tile) was made for, read from its shape
    ((tile + 2)^2, ceil(filters / PANEL), channels, PANEL); None for any other shape (a layout
    this omrt did not write, such as a 1.4 file's unpacked (16, F, C))."""
    return next((t for t, g in G.items()
                 if tuple(u.shape) == (len(g) ** 2, -(-filters // PANEL), channels, PANEL)), None)


def filter_transform(w: np.ndarray, tile: int) -> np.ndarray:
    """U ((tile + 2)^2, F, C) = G w G^T per filter and channel, computed in float64."""
    g = G[tile]
    u = np.einsum("ir,fcrs,ks->ikfc", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(len(g) ** 2, *w.shape[:2]).astype(w.dtype))


def packed_transform(w: np.ndarray, tile: int) -> np.ndarray:
    """filter_transform(w, tile), each element's F x C matrix packed in panels for omrt's GEMM
    (packed.pack_panels): ((tile + 2)^2, ceil(F / PANEL), C, PANEL), computed at compile time."""
    return np.stack([pack_panels(u[:, :, None, None]) for u in filter_transform(w, tile)])


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
    """Conv(X, W, B) with U = packed_transform(W, tile) as input 3, run by Winograd F(tile x tile, 3x3)."""

    native_units = ("winograd",)
    derived = ((3, 1),)
    derived_call = "native_winograd"

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        oh, ow = self.win.out
        self.native_winograd = None
        """Threads -> the layer in one native call with that split bound: call it with (x, U,
        bias, y, work)."""
        self.conv_workspace_bytes = self.workspace_bytes
        self.tile = tile_of(inputs[3], self.filters, inputs[0].shape[1])
        if self.tile is None:  # filters transformed in a layout this omrt does not read: the Conv it was
            return
        self.elements = (self.tile + 2) ** 2
        self.tw = -(-ow // self.tile)
        self.tiles = self.tw * -(-oh // self.tile)
        plans = {t: self._plan(t) for t in range(1, parallel.MAX_SLOTS + 1)}
        self.workspace_bytes = max(self.workspace_bytes,
                                   max(v * shared + t * slot for t, (v, slot, _, shared) in plans.items()))
        act = activation_code(ctx.attrs)
        fn = ctx.native.get(WINOGRAD) if ctx.native is not None else None
        if fn is not None and act is not None and gemm_tile(ctx.native) > 0:
            geometry = (*inputs[0].shape, self.filters, oh, ow, *self.win.begin, *act)
            self.native_winograd = {t: fn.partial(v // 4, slot // 4, per_chunk, shared, FILTERS_PER_PASS, self.tile,
                                                  t, *geometry)
                                    for t, (v, slot, per_chunk, shared) in plans.items()}

    def _rows(self, tiles: int) -> int:
        """Bytes of the rows scratch closing a slot (csrc/winograd.c, wg_rows) for chunks of up to
        `tiles` tiles: the input transform's padded rows, or the output transform's floats per tile."""
        t = self.tile
        return align(max((t + 3) * (t * self.tw + 2), 2 * t * (t + 1) * tiles) * 4)

    def _products(self, filters: int, tiles: int) -> int:
        """Bytes of the products of one pass over `filters` filters and `tiles` tiles."""
        return align(self.elements * min(filters, FILTERS_PER_PASS) * tiles * 4)

    def _plan(self, threads: int) -> tuple[int, int, int, int]:
        """(bytes of a V, bytes of each thread's slot, tiles per chunk, shared) on `threads` threads.

        A layer whose tiles all fit one chunk (under SCRATCH_CAP) on one thread, run on several,
        shares one V: the threads transform blocks of its channels, then multiply blocks of its
        filters. The others give each thread chunks of tiles of its own, each V, products and
        rows in the thread's slot, chunks under SCRATCH_CAP each."""
        n_images, channels = self.inputs[0].shape[:2]
        per_tile = self.elements * (channels + min(self.filters, FILTERS_PER_PASS)) * 4
        if threads > 1 and n_images == 1 and self.tiles * per_tile <= SCRATCH_CAP:
            per_thread = -(-self.filters // threads)
            return (self._transformed(channels, self.tiles),
                    self._products(-(-per_thread // PANEL) * PANEL, self.tiles) + self._rows(self.tiles), self.tiles, 1)
        per_chunk = max(1, min(self.tiles, SCRATCH_CAP // per_tile))
        v = self._transformed(channels, per_chunk)
        return v, v + self._products(self.filters, per_chunk) + self._rows(per_chunk), per_chunk, 0

    def _transformed(self, channels: int, tiles: int) -> int:
        """Bytes of V over `tiles` tiles: its elements, each in strips of STRIP tiles (padded), then
        WINOGRAD_SKEW floats (csrc/winograd.c says why)."""
        return align(self.elements * (channels * -(-tiles // STRIP) * STRIP + CONSTANTS["WINOGRAD_SKEW"]) * 4)

    def bind(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        if self.native_winograd is None or not (x.flags.c_contiguous and y.flags.c_contiguous) or y.size == 0:
            return super().bind(inputs, outputs, workspace)
        b = inputs[2] if len(inputs) > 2 else None
        call = self.native_winograd[parallel.native_threads(self.flops, slots=parallel.MAX_SLOTS)]
        return [call.bind(x, inputs[3], b, y, workspace)]

    def run(self, inputs, outputs, workspace):
        if not run_bound(self.bind(inputs, outputs, workspace)):
            super().run(inputs, outputs, workspace)
