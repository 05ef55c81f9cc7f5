"""PackedConv and PackedMatMul (omrt::): a Conv, or a product by a constant matrix, whose weights
the compiler packed, once, into the layout omrt's own GEMM reads (csrc/omrt_gemm.h), so that no
run packs or re-reads them in another layout.

The compiler rewrites a node into one of these only when it packs the native library, and the
node keeps its own weights: without the library (not trusted, another host, a CPU without a
vector tile) it runs as the node it was, through numpy or BLAS. With it, PackedConv gathers the
columns (as Conv's native path does), copies them a block at a time next to the cores, and
multiplies every panel of filters by each strip; PackedMatMul copies A's rows into panels and
multiplies them by B's strips. Bias, a PackedConv's residual and the activation are applied in
the tile's registers.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ShapeError
from ..memory import align
from ..native.bindings import GEMM_TILE, PCONV2D, PMATMUL, activation_code
from ..native.signature import CONSTANTS
from . import parallel
from .base import OpContext, TensorInfo, apply_activation, numel, register, run_bound
from .conv import Conv, ShuffledConv
from .linalg import PERMS, MatMulBase, _Product

PANEL = CONSTANTS["GEMM_PANEL"]
"""Rows of filters per packed panel."""

STRIP = CONSTANTS["GEMM_MAX_NR"]
"""Columns of the widest strip a tile reads."""

TAIL_COLS = CONSTANTS["GEMM_TAIL_COLS"]
"""The most columns past a multiple of 16 that the GEMM takes through its narrow tail (a panel of
filters times a few columns, csrc/omrt_gemm.h) rather than through a tile 16 or 32 columns wide."""

LINE_FLOATS = 16
"""Floats in a 64-byte cache line: a plane's rows start on lines when its positions are a multiple
of it (csrc/omrt_gemm.h, omrt_copies_whole_b, tests the same of b's pitch)."""

BLOCK_FLOATS = 8192
"""Floats of columns the GEMM copies at a time, per thread: 32 KiB, about an L1 data cache."""


RESIDUAL = 4
"""The input of a PackedResidualConv holding the residual, added before the activation."""

MIN_POSITIONS = 16
"""Layers with fewer output positions per image run as Convs through BLAS (see `runs_packed`): the
tile's strip of 32 columns would be mostly padding (a squeeze-excite 1x1 layer has one position)."""


def runs_packed(positions: int, lanes: bool) -> bool:
    """Whether a PackedConv of `positions` output positions per image runs on omrt's GEMM (on a
    CPU with a vector tile): at least MIN_POSITIONS of them, or one with the filters in the lanes
    (a squeeze-excite block's layers, a classifier's after global pooling), where each strip of
    filters is read once, front to back (csrc/omrt_lanes.h, omrt_lanes_column). Through BLAS's
    sgemv such a layer read the filters' rows 4 streams at a time: 1024 filters of 1024 taps,
    weights out of cache, took 225 us a layer against 154 for the strips and 180 for ONNX
    Runtime (AMD Zen 4, AVX-512 hidden, one thread)."""
    return positions >= MIN_POSITIONS or (lanes and positions == 1)


WHOLE_PLANE_FLOATS = 128 * 1024
"""The most floats (taps x the plane's columns: 512 KiB, half of a 1 MiB L2, as much as the GEMM
takes whole in place where the C library does not say how big L2 is) of a plane whose rows do not
start on cache lines that the GEMM copies whole into one block, per thread. In a C loop over the
GEMM (AVX2 tile, one thread, AMD Zen 4): 1000 filters of 512 taps over 13x13 (squeezenet's
classifier), 8 such layers cycled (their 16 MiB of weights out of L2), 1670-1720 us copied against
1890 in blocks of 64; 1024 filters of 256 taps over 14x14, weights in cache, 960 against 1000
read in place."""


def block_columns(taps: int, positions: int) -> int:
    """Columns the GEMM copies at a time for `taps` rows: a multiple of STRIP, 1 to 8 strips, or
    all of a plane (`positions` output positions) of at most two strips (7x7, 8x8), or of at most
    WHOLE_PLANE_FLOATS whose rows do not start on cache lines (13x13, 14x14). The GEMM copies such
    a plane whole where its rows do not start on cache lines (omrt_copies_whole_b): each of its
    loads then touches one line rather than two, and each panel of filters is read once rather
    than once per block. For a plane of two strips the copy takes about as many floats as the
    plane's column buffer, where the layer has one."""
    block = _blocks_of_l1(taps)
    plane = -(-positions // STRIP) * STRIP
    if plane <= 2 * STRIP or (positions % LINE_FLOATS and taps * plane <= WHOLE_PLANE_FLOATS):
        return max(block, plane)
    return block


def _blocks_of_l1(taps: int) -> int:
    """Columns of `taps` rows in about BLOCK_FLOATS: a multiple of STRIP, 1 to 8 strips."""
    return max(STRIP, min(8 * STRIP, BLOCK_FLOATS // taps // STRIP * STRIP))


def pack_panels(w: np.ndarray, group: int = 1) -> np.ndarray:
    """The filters w (M, C, KH, KW) as (ceil(M / PANEL), C * KH * KW, PANEL) panels: element
    [i, k, r] is filter PANEL * i + r at tap k, zero past the last filter. In `group` groups,
    each group's M / group filters are packed so on their own, the groups' panels one after the
    other: (group * ceil(M / group / PANEL), C * KH * KW, PANEL)."""
    if group > 1:
        return np.concatenate([pack_panels(part) for part in np.split(w, group)])
    filters, taps = w.shape[0], math.prod(w.shape[1:])
    rows = -(-filters // PANEL) * PANEL
    padded = np.zeros((rows, taps), w.dtype)
    padded[:filters] = w.reshape(filters, taps)
    return np.ascontiguousarray(padded.reshape(rows // PANEL, PANEL, taps).transpose(0, 2, 1))


def pack_filter_strips(w: np.ndarray, group: int = 1) -> np.ndarray:
    """The filters w (M, C, KH, KW) with the filters in the vector lanes: strips of STRIP filters,
    (ceil(M / STRIP), C * KH * KW, STRIP), element [s, k, j] filter STRIP * s + j at tap k, zero
    past the last filter (pack_strips of the filters as columns). In `group` groups, each group's
    filters are packed so on their own, the groups' strips one after the other."""
    return np.concatenate([pack_strips(part.reshape(part.shape[0], -1).T) for part in np.split(w, group)])


LANES_RULES = ((1.2, 32),)
"""(gain, taps) pairs: a layer is packed with the filters in the vector lanes when its tiles are
filled at least `gain` times better so (filter_lanes) and it has at least `taps` rows (C / G * KH
* KW) for one of them: the transposed tile's sums go back through transposes, a cost per tile
that deep products hide, and it reads 12 positions of every row of the plane, a row of the plane
apart. Measured on 1x1 layers, one thread, AVX-512, on an AMD Zen 5: 7x7 (gain 1.23) of 64-960
taps took 0.83-0.98 of the time, 14x14 (gain 1.06) of 80-256 taps 0.94-0.99, and layers as full
either way (13x13, 28x28, 56x56) of 256-512 taps 0.90-0.97. On an Intel Xeon (AVX-512, 2 MiB L2)
only the 7x7 layers held about even (0.87-1.08 in ResNet-50); its 14x14 layers took up to 1.2 of the
time of panels at two threads, and its 28x28 and 56x56 ones 1.2-2.2 at one. With only the 7x7
rule, whole models there took 0.89 / 0.92 of the time at one / two threads (resnet50),
0.90 / 0.87 (densenet121), 0.94 / 0.88 (inception_v2), 0.94 / 0.92 (squeezenet).

Since the panels' GEMM takes a last TAIL_COLS columns or fewer through its narrow tail, a 7x7
layer fills its panels (48 columns in strips, the 49th in the tail) and runs on them: on an AMD
Zen 4, one thread, 1x1 layers over 7x7 of 96-2048 taps took 0.80-1.11 of the lanes' time with
AVX-512 hidden (512 -> 2048: 1214 us against 1482) and 0.80-1.05 with it (1015 against 1071)."""


def _filled(n: int, unit: int, last: int) -> float:
    """The share of a tile dimension's slots that `n` fills in slots of `unit`, the last of a
    multiple of `last` (a tile's last strip of columns is 16 wide when 16 are left)."""
    whole, rest = divmod(n, unit)
    return n / (whole * unit + -(-rest // last) * last)


def _positions_filled(positions: int) -> float:
    """The share of the panels' column slots that `positions` fill: strips of STRIP, the last 16
    wide when 16 or fewer are left, except that in a layer that runs packed a last TAIL_COLS or
    fewer past a multiple of 16 go through the GEMM's narrow tail and fill it (a 7x7 plane's
    49th position, a 14x14 one's last 4)."""
    rest = positions % (STRIP // 2)
    tail = rest if positions >= MIN_POSITIONS and rest <= TAIL_COLS else 0
    tiled = positions - tail
    return positions / (tiled / _filled(tiled, STRIP, STRIP // 2) + tail)


def filter_lanes(positions: int, filters: int, taps: int) -> bool:
    """Whether a layer of `filters` filters (per group) of `taps` rows over `positions` output
    positions per image is packed with the filters in the vector lanes (pack_filter_strips)
    rather than in panels (see LANES_RULES). Panels take the positions in strips of STRIP (16 for
    a last one of 16 or fewer, a last few through the tail: _positions_filled) and the filters 4
    rows at a time; the transposed tile takes the positions 4 at a time and the filters in strips:
    21 positions fill 0.66 of the panels' slots and 0.81 of the transposed tile's rows, a 7x7
    layer's 49 all of the first and 0.94 of the second."""
    panels = _positions_filled(positions) * _filled(filters, 4, 4)
    lanes = _filled(positions, 4, 4) * _filled(filters, STRIP, STRIP // 2)
    return any(lanes >= gain * panels and taps >= least for gain, least in LANES_RULES)


def packing_shape(filters: Sequence[int], group: int, lanes: bool) -> tuple[int, int, int]:
    """The shape of filters of shape `filters` in `group` groups packed by pack_filter_strips
    (`lanes`) or pack_panels."""
    unit = STRIP if lanes else PANEL
    return group * -(-filters[0] // group // unit), math.prod(filters[1:]), unit


def pack_strips(b: np.ndarray) -> np.ndarray:
    """The matrix b (K, N) as (ceil(N / STRIP), K, STRIP) strips: element [s, k, j] is
    b[k, STRIP * s + j], zero past column N."""
    taps, cols = b.shape
    padded = np.zeros((taps, -(-cols // STRIP) * STRIP), b.dtype)
    padded[:, :cols] = b
    return np.ascontiguousarray(padded.reshape(taps, -1, STRIP).transpose(1, 0, 2))


def gemm_tile(library: Any) -> int:
    """The widest tile of omrt's GEMM in `library` on this CPU (bindings.GEMM_TILES); without a
    vector tile, BLAS multiplies faster and PackedConv runs as a Conv."""
    out = np.zeros(1, np.int64)
    library.get(GEMM_TILE)(out)
    return int(out[0])


MIN_GROUP_FILTERS = PANEL // 2
"""Grouped layers with fewer filters per group stay Convs (depthwise ones run by their own loop):
a tile would multiply mostly zero rows."""


def eligible(attrs: dict[str, Any], x: TensorInfo, w: np.ndarray) -> bool:
    """Whether a Conv node over `x` with constant filters `w` can run as a PackedConv: 2-d, one
    group or groups of at least MIN_GROUP_FILTERS filters, float32, static shapes and an
    activation the C tile applies."""
    group = int(attrs.get("group", 1))
    return (x.rank == 4 and x.static and x.dtype == np.float32 and w.dtype == np.float32 and w.ndim == 4
            and (group == 1 or (w.shape[0] % group == 0 and w.shape[0] // group >= MIN_GROUP_FILTERS))
            and activation_code(attrs) is not None)


@register("PackedConv", since=1, domain="omrt")
class PackedConv(Conv):
    """Conv(X, W, B) with pack_panels(W) as input 3, multiplied by omrt's own GEMM (and, as a
    PackedResidualConv, a residual R as input 4 added before the activation). With the attribute
    `lanes` = 1, input 3 is pack_filter_strips(W) instead: the filters in the vector lanes."""

    native_units = ("conv",)
    derived = ((3, 1),)
    derived_call = "native_packed"

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        self.residual = len(inputs) > RESIDUAL and inputs[RESIDUAL] is not None
        self.post = ctx
        """The node's context: its activation follows the residual, so the Conv paths run without it."""
        if self.residual:
            ctx = replace(ctx, attrs={k: v for k, v in ctx.attrs.items() if not k.startswith("_act")})
        super().__init__(ctx, inputs, outputs)
        self.conv_workspace_bytes = self.workspace_bytes
        self.lanes = int(ctx.attrs.get("lanes", 0))
        """Whether input 3 holds the filters as strips (pack_filter_strips) rather than panels."""
        # with the filters in the lanes, the GEMM copies at most a panel of columns: no plane whole
        self._use_block(_blocks_of_l1(self.taps) if self.lanes else block_columns(self.taps, math.prod(self.win.out)))
        self._check_packing(ctx, inputs[1], inputs[3] if len(inputs) > 3 else None)
        self.native_packed = self._native_packed(self.post, inputs[0])

    @property
    def taps(self) -> int:
        """Rows of the product: C / G * KH * KW."""
        return math.prod(self.inputs[1].shape[1:])

    def _use_block(self, block: int) -> None:
        """Copy `block` columns at a time (its strips, one per slot, after the Conv's workspace)."""
        self.block = block
        self.strip_bytes = align(self.taps * block * 4)
        self.workspace_bytes = self.conv_workspace_bytes + parallel.MAX_SLOTS * self.strip_bytes

    def fit_workspace(self, nbytes: int) -> bool:
        """A plan made before small planes were copied whole (block_columns; a file an older omrt
        compiled) gives the strips of fewer columns: the GEMM takes such a plane a block at a
        time, as it did then."""
        if self.workspace_bytes > nbytes:
            self._use_block(_blocks_of_l1(self.taps))
        return super().fit_workspace(nbytes)

    def _check_packing(self, ctx: OpContext, w: TensorInfo, packing: TensorInfo | None) -> None:
        """Refuse packed filters of another shape than the packing the node names: the native
        call checks only their size, which panels and strips of some layers share."""
        if packing is None or packing.shape is None:
            return
        want = packing_shape(w.shape, self.group, bool(self.lanes))
        if tuple(packing.shape) != want:
            how = "as strips with the filters in the lanes" if self.lanes else "in panels"
            raise ShapeError(f"{ctx.name}: its packed filters (input 3) have shape {tuple(packing.shape)}, but W "
                             f"{tuple(w.shape)} packed {how} (attribute lanes={self.lanes}) has shape {want}: "
                             f"the file is damaged; compile the model again")

    def _native_packed(self, ctx: OpContext, x: TensorInfo) -> Callable | None:
        """The layer in one native call, its geometry bound, when the model has it; else None.
        Call it with (x, panels, bias, residual, y, work, strips, step, buffer, block, threads)."""
        fn = ctx.native.get(PCONV2D) if self._native_2d(ctx, x) else None
        act = activation_code(ctx.attrs)
        if fn is None or act is None or not runs_packed(math.prod(self.win.out), bool(self.lanes)) or (
                gemm_tile(ctx.native) == 0 and self.native_conv is not None):
            return None
        win = self.win
        return fn.partial(*x.shape, self.filters * self.group, self.group, int(self.shuffled), self.lanes, *win.out,
                          *win.kernel, *win.strides, *win.dilations, *win.begin, *act)

    def bind(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        r = inputs[RESIDUAL] if self.residual else None
        if self.native_packed is None or y.size == 0 or not all(v is None or v.flags.c_contiguous for v in (x, y, r)):
            return None if self.residual else super().bind(inputs, outputs, workspace)
        threads = min(parallel.native_threads(self.flops), parallel.MAX_SLOTS)
        step = buffer = 0
        if self.mode == "im2col":
            split = self._split(threads)
            step, buffer = split.step, split.buffer // 4
        work = workspace[self.pad_bytes:self.conv_workspace_bytes] if self.mode == "im2col" else None
        strips = workspace[self.conv_workspace_bytes:]
        b = inputs[2] if len(inputs) > 2 else None
        return [self.native_packed.bind(x, inputs[3], b, r, y, work, strips, step, buffer, self.block, threads)]

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        y = outputs[0]
        residual = inputs[RESIDUAL] if self.residual else None
        if residual is not None and np.shares_memory(residual, y):
            residual = residual.copy()  # planned under y (`inplace`), which the Conv paths write first
        super().run(inputs, outputs, workspace)
        if residual is not None:
            np.add(y, residual, out=y)
            apply_activation(y, self.post)


@register("PackedResidualConv", since=1, domain="omrt")
class PackedResidualConv(PackedConv):
    """act(Conv(X, W, B) + R): a PackedConv and the Add of its output to a residual R (input 4,
    of its output's shape), the Add done in the tile's registers, so that the layer's output is
    never written and read back (omrt.compiler.passes.fuse_residual_adds). An op type of its own:
    an omrt that lacks it refuses the file, where a PackedConv would drop the sum.

    Its output may be planned over the residual when the residual dies here (a ResNet block's
    identity): the tile reads each residual element just before it writes that element, so the
    layer reads one array and writes it back instead of also filling a third (1x1 layers of 256
    filters at 56x56: 0.82-0.89 of the time). Only the numpy and BLAS paths copy the residual
    first, as they write the whole output before adding it."""

    inplace = {0: RESIDUAL}


@register("PackedShuffledConv", since=1, domain="omrt")
class PackedShuffledConv(PackedConv, ShuffledConv):
    """A ShuffledConv (a grouped Conv and ShuffleNet's channel shuffle after it) with each group's
    filters packed (pack_panels(W, group)) as input 3: the tile writes each filter's rows where
    the shuffle puts them. Without the native library it runs as the ShuffledConv it was."""


MIN_ROWS = PANEL // 2
"""Products with fewer rows of A run through BLAS: a tile would multiply mostly zero rows."""


def product_eligible(attrs: dict[str, Any], a: TensorInfo, b: np.ndarray, bias: TensorInfo | None) -> bool:
    """Whether a MatMul (or FusedMatMul with `bias`) of `a` by the constant matrix `b` can run as a
    PackedMatMul: float32, A a stack of rows, a bias over the columns only, no transposes folded
    in, and an activation the C tile applies."""
    return (a.dtype == np.float32 and b.dtype == np.float32 and b.ndim == 2 and a.shape is not None
            and a.rank >= 2 and a.shape[-1] == b.shape[0] and not any(attrs.get(k) for k in PERMS)
            and (bias is None or (bias.dtype == np.float32 and tuple(bias.shape) == (b.shape[1],)))
            and activation_code(attrs) is not None)


@register("PackedMatMul", since=1, domain="omrt")
class PackedMatMul(MatMulBase):
    """MatMul(A, B) + bias (or ""), B constant, with pack_strips(B) as input 3, multiplied by
    omrt's own GEMM.

    With the attribute `parts` = G > 1 (sibling products of one A, stacked by the compiler:
    omrt.compiler.passes.stack_sibling_products), B's columns are G matrices side by side, the
    bias theirs, and the output is [G, *A's rows, N / G]: part g is A @ B[:, g N/G : (g+1) N/G]
    plus its bias, a contiguous tensor of its own that the next nodes read in place."""

    derived = ((3, 1),)
    derived_call = "native_packed"

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        (out,) = super().infer(ctx, inputs)
        parts, cols = int(ctx.attrs.get("parts", 1)), out.shape[-1]
        if parts == 1:
            return [out]
        if parts < 1 or not isinstance(cols, int) or cols % parts:
            raise ShapeError(f"{ctx.name}: PackedMatMul parts={parts} must divide B's {cols} columns "
                             f"into equal parts")
        return [TensorInfo(out.dtype, (parts, *out.shape[:-1], cols // parts))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        self.parts = int(ctx.attrs.get("parts", 1))
        whole = [TensorInfo(outputs[0].dtype, self.product_shape(ctx, inputs))]
        super().__init__(ctx, inputs[:2], whole)
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.rows, (self.depth, self.cols) = numel(inputs[0].shape[:-1]), inputs[1].shape
        self.part_cols = self.cols // self.parts
        if self.parts > 1:  # without the tile: one batched product, A the same for every part
            self.product = _Product((self.rows, self.depth), (self.parts, self.depth, self.part_cols),
                                    (self.parts, self.rows, self.part_cols), outputs[0].dtype, fold=False,
                                    ctx=ctx, fuse=False)
        self.flops = 2 * self.rows * self.depth * self.cols
        self.panel_bytes = align(-(-self.rows // PANEL) * PANEL * self.depth * 4)
        self.act = activation_code(ctx.attrs)
        fn = ctx.native.get(PMATMUL) if ctx.native is not None else None
        usable = fn is not None and self.act is not None and self.rows >= MIN_ROWS and gemm_tile(ctx.native) > 0
        self.native_packed = fn if usable else None

    def workspace(self) -> int:
        return max(super().workspace(), self.panel_bytes)

    def fit_workspace(self, nbytes: int) -> bool:
        """A plan too small for A's panels (an older omrt's) runs the product through BLAS."""
        if self.panel_bytes > nbytes:
            self.native_packed = None
            self.panel_bytes = 0
        return super().fit_workspace(nbytes)

    def bind(self, inputs, outputs, workspace):
        a, out = inputs[0], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        in_place = all(v is None or v.flags.c_contiguous for v in (a, out, bias))  # a fed bias may be a view
        if self.native_packed is None or not in_place or not out.size:
            return None
        m, n, k, part = self.rows, self.cols, self.depth, self.part_cols
        return [self.native_packed.bind(a.reshape(m, k), inputs[3], bias, out.reshape(-1, part), workspace, m, n,
                                         k, k, part, part, m * part, parallel.native_threads(self.flops),
                                         *self.act)]

    def views(self, inputs: Sequence[np.ndarray],
              out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A, B and the output as the product reads them: for parts, A's rows, B's column blocks
        as a stack and the output as one matrix per part."""
        if self.parts == 1:
            return super().views(inputs, out)
        g, m, k, part = self.parts, self.rows, self.depth, self.part_cols
        return (inputs[0].reshape(m, k), inputs[1].reshape(k, g, part).transpose(1, 0, 2),
                out.reshape(g, m, part))

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        out = outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        a, b, y = self.views(inputs, out)
        if not self.product(a, b, y, workspace, bias if self.parts == 1 else None):
            if bias is not None:
                np.add(y, bias.reshape(self.parts, 1, self.part_cols) if self.parts > 1 else bias, out=y)
            apply_activation(out, self.ctx)
