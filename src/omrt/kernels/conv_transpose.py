"""The convolutions besides Conv: ConvTranspose and Col2Im, which scatter column blocks back into
an image (col2im), and DeformConv, which gathers its columns at learned offsets.

ConvTranspose is one GEMM per group (W^T X) into column chunks, then col2im; Col2Im is col2im
alone; DeformConv is a bilinear im2col, then one GEMM per group. They share Conv's checks of
their inputs (`conv`) and the window geometry (`window`).
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from ..errors import ShapeError
from ..native.bindings import ACTIVATIONS, DECONV, activation_code
from ..native.signature import CONSTANTS
from . import parallel
from .base import Kernel, OpContext, TensorInfo, apply_activation, register, run_bound
from .conv import _bias_view, _check_group, _check_ranks, _kernel_shape
from .window import Window, _plan_chunks, _row_chunks, int_list, sliding_window, transposed_window, window_of


def _scatter(image: np.ndarray, cols: np.ndarray, moves: Sequence[tuple[tuple, tuple]]) -> None:
    """col2im: add every tap's column block into the image positions it came from."""
    for col, img in moves:
        view = image[img]
        np.add(view, cols[col], out=view)


@register("ConvTranspose", since=1)
class ConvTranspose(Kernel):
    """N-d transposed convolution: one GEMM per group (W^T X) into column chunks, then col2im.

    A 2-d one whose kernel is its stride (a detector's 2x2 stride-2 upsampling; float32, one
    group, unpadded) runs natively: each output pixel is one tap of one input pixel, so the C loop
    sums the channels per tap and stores the taps interleaved, bias and activation applied."""

    fuses = frozenset(ACTIVATIONS) - {None}
    """Only those the native loop applies: a Sigmoid or Tanh folded in would be one more numpy pass
    over the output after it (dbnet's Sigmoid over its 320 x 320 map: 100 us), where on its own it
    is a native chain of the compiler's (csrc/omrt_fused.h)."""
    native_units = ("conv",)

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
        self.workspace_bytes = row_bytes * self.step
        self.native, self.act = None, activation_code(ctx.attrs)
        k = kernel[0]
        stride_k = (kernel == [k, k] and k <= CONSTANTS["DECONV_MAX_K"] and self.win.strides == (k, k)
                    and self.win.dilations == (1, 1) and not any(begin) and not any(end))
        if (ctx.native is not None and x.dtype == np.float32 and nd == 2 and self.group == 1 and stride_k
                and self.win.size == (x.shape[2] * k, x.shape[3] * k)):
            self.native = ctx.native.get(DECONV)

    def workspace(self) -> int:
        return self.workspace_bytes

    def bind(self, inputs, outputs, workspace):
        return None if self.act is None else self._native_call(inputs, outputs, self.act)

    def _native_call(self, inputs, outputs, act: tuple[int, float, float]) -> list | None:
        """The native loop's call with activation `act`, or None where it does not apply."""
        x, w, y = inputs[0], inputs[1], outputs[0]
        b = inputs[2] if len(inputs) > 2 else None
        if (self.native is None or x.size == 0 or y.size == 0
                or not all(a is None or a.flags.c_contiguous for a in (x, w, b, y))):
            return None
        n, c, h, width = x.shape
        return [self.native.bind(x, w, b, y, n, c, h, width, y.shape[1], self.win.kernel[0],
                                 parallel.native_threads(nbytes=y.nbytes), *act)]

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        if self.act is None and run_bound(self._native_call(inputs, outputs, (0, 0.0, 0.0))):
            apply_activation(outputs[0], self.ctx)  # one the C loop does not apply (an older file folded it in)
            return
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
        cols = workspace[:self.workspace_bytes].view(x.dtype).reshape(shape)
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
        self.workspace_bytes = x.shape[1] * taps * int(np.prod(self.win.out)) * x.dtype.itemsize

    def workspace(self) -> int:
        return self.workspace_bytes

    def run(self, inputs, outputs, workspace):
        x, w, offset = inputs[:3]
        b = inputs[3] if len(inputs) > 3 else None
        mask = inputs[4] if len(inputs) > 4 else None
        y = outputs[0]
        win, g, og = self.win, self.group, self.offset_group
        n, c, height, width = x.shape
        oh, ow = win.out
        taps = win.kernel[0] * win.kernel[1]
        cols = workspace[:self.workspace_bytes].view(x.dtype).reshape(og, c // og, taps, oh * ow)
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
                    h_positions = grid_h + ki * win.dilations[0] + offset[i, grp, k, 0]
                    w_positions = grid_w + kj * win.dilations[1] + offset[i, grp, k, 1]
                    sample = _bilinear(planes[grp], h_positions, w_positions, height, width)
                    if mask is not None:
                        sample *= mask[i, grp, k]
                    cols[grp, :, k] = sample
            yi = y[i].reshape(g, w3.shape[1], oh * ow)
            np.matmul(w3, gemm_in, out=yi)
        if b is not None:
            np.add(y, _bias_view(b, y.ndim), out=y)


def _bilinear(plane: np.ndarray, h_positions: np.ndarray, w_positions: np.ndarray, height: int,
              width: int) -> np.ndarray:
    """Sample plane (C, H*W) at fractional (h_positions, w_positions) with bilinear weights; outside
    points read zero."""
    h0, w0 = np.floor(h_positions), np.floor(w_positions)
    fh, fw = h_positions - h0, w_positions - w0
    h0, w0 = h0.astype(np.int64), w0.astype(np.int64)
    total = np.zeros((plane.shape[0], h_positions.shape[0]), plane.dtype)
    for dh, wh in ((0, 1 - fh), (1, fh)):
        for dw, ww in ((0, 1 - fw), (1, fw)):
            hh, wc = h0 + dh, w0 + dw
            inside = (hh >= 0) & (hh < height) & (wc >= 0) & (wc < width)
            flat = np.where(inside, hh * width + wc, 0)
            total += plane[:, flat] * (wh * ww * inside).astype(plane.dtype)
    return total
