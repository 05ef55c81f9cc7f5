"""Quantization kernels: (de)quantization, dynamic quantization and integer or quantized MatMul and Conv.

Integer products are computed in float64 on the BLAS path: products of 8-bit operands (after the
zero point is taken off) are below 2**18, so float64 sums are exact for any K below 2**35, and
the result equals the int32 accumulation the spec defines.

Narrow types (int4, uint4, int2, uint2, float8, float4) are numpy dtypes only when ml_dtypes is
loaded (onnx loads it); they are handled by name, one element per byte, never packed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ShapeError
from .base import (Kernel, OpContext, Shape, TensorInfo, broadcast_shapes, carve, carve_size, normalize_axis,
                   numel, onnx_dtype, register)
from .conv import Conv, _kernel_shape
from .window import Window, _chunks, strided_columns, window_of

COLUMNS_CAP = 1 << 20
"""Upper bound (bytes) of the integer convolutions' column and result buffers; bigger layers are
processed in chunks of output rows."""

_NARROW_INT_RANGES = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
_FLOAT_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0,
              "float8_e5m2fnuz": 57344.0, "float4_e2m1fn": 6.0, "float6_e2m3fn": 7.5,
              "float6_e3m2fn": 28.0}


def _quant_range(dtype: np.dtype, name: str) -> tuple[float, float, bool]:
    """(low, high, is_float) of a quantized type: what saturation clips to."""
    if dtype.name in _NARROW_INT_RANGES:
        return (*_NARROW_INT_RANGES[dtype.name], False)
    if dtype.name in _FLOAT_MAX:
        top = _FLOAT_MAX[dtype.name]
        return -top, top, True
    if dtype.kind in "iu" and dtype.itemsize <= 4:
        info = np.iinfo(dtype)
        return float(info.min), float(info.max), False
    raise ShapeError(f"{name}: {dtype} is not a quantized type; use int8, uint8, int16, uint16, "
                     f"int32, a 4-bit or an 8-bit float type")


def _saturate(q: np.ndarray, out: np.ndarray, saturate: bool = True) -> None:
    """Clip rounded float scratch `q` to `out`'s range (float8 only when `saturate`) and store it."""
    low, high, is_float = _quant_range(out.dtype, "")
    if saturate or not is_float:
        np.clip(q, low, high, out=q)
    np.copyto(out, q, casting="unsafe")


def _requantize(q: np.ndarray, zero_point: np.ndarray | None, out: np.ndarray) -> None:
    """Store float scratch `q` (already divided by the output scale) quantized into `out`.

    Integer targets round half to even, then add the zero point, then saturate; float8 targets
    have no zero point and are cast with saturation.
    """
    if not _quant_range(out.dtype, "")[2]:
        np.rint(q, out=q)
        if zero_point is not None:
            np.add(q, zero_point, out=q, casting="unsafe")
    _saturate(q, out)


def _scalar(v: np.ndarray | None) -> np.ndarray | None:
    """A one-element parameter as a 0-d array, so it broadcasts against any shape."""
    return v.reshape(()) if v is not None and v.size == 1 else v


class _Granularity:
    """How a scale of one shape applies to x of another: per tensor, per axis or in blocks (opset 21).

    Spec: "Blocked quantization: The scale's shape is identical to the input's shape, except for one
    dimension, in which blocking is performed. Given x shape (D0, ..., Di, ..., Dn), axis=i, and
    block size B: y_scale shape is (D0, ..., ceil(Di/B), ..., Dn)." The last block may be short; it
    is split off so every part is a broadcast between views, never a repeated scale.
    """

    def __init__(self, ctx: OpContext, x: Shape, s: Shape) -> None:
        rank = len(x)
        self.block = int(ctx.attr("block_size", 0) or 0)
        self.axis = 0
        one = all(isinstance(d, int) for d in s) and numel(s) == 1
        if one and len(s) <= 1:
            self.mode = "tensor"
            return
        self.axis = normalize_axis(int(ctx.attr("axis", 1)), rank, ctx.name)
        if len(s) == 1 and not self.block:
            self.mode = "axis"
            if rank == 0 or not _agree(s[0], x[self.axis]):
                raise ShapeError(f"{ctx.name}: a 1-D scale of {s[0]} elements needs x's axis "
                                 f"{self.axis} to have that size, x has shape {x}; set `axis` to the "
                                 f"quantized dim")
        elif len(s) == rank and self.block > 0:
            self.mode = "block"
            for i, (dx, ds) in enumerate(zip(x, s)):
                want = -(-dx // self.block) if i == self.axis and isinstance(dx, int) else dx
                if not _agree(want, ds):
                    raise ShapeError(f"{ctx.name}: blocked scale shape {s} does not fit x {x} with "
                                     f"block_size {self.block} on axis {self.axis}; dim {i} must be "
                                     f"{want}")
        else:
            raise ShapeError(f"{ctx.name}: scale shape {s} fits none of per-tensor (a scalar), "
                             f"per-axis (1-D, length of x's axis) or blocked (x's rank, block_size > 0) "
                             f"for x {x}")

    def _three(self, a: np.ndarray) -> np.ndarray:
        """`a` as (before axis, axis, after axis)."""
        return a.reshape(numel(a.shape[:self.axis]), a.shape[self.axis], numel(a.shape[self.axis + 1:]))

    def data(self, a: np.ndarray) -> list[np.ndarray]:
        """Views of an x-shaped array, one per part."""
        if self.mode == "tensor":
            return [a]
        a3 = self._three(a)
        if self.mode == "axis":
            return [a3]
        pre, dim, post = a3.shape
        full = dim // self.block
        parts = [a3[:, :full * self.block].reshape(pre, full, self.block, post)] if full else []
        if dim % self.block:
            parts.append(a3[:, full * self.block:])
        return parts

    def params(self, s: np.ndarray | None, x: np.ndarray) -> list[np.ndarray | None]:
        """A scale-shaped array (or None) cut to broadcast against each part of `data(x)`."""
        if s is None:
            return [None, None]
        if self.mode == "tensor":
            return [s.reshape(())]
        if self.mode == "axis":
            return [s.reshape(1, -1, 1)]
        s3 = self._three(s)
        dim = x.shape[self.axis]
        full = dim // self.block
        parts = [s3[:, :full, None, :]] if full else []
        if dim % self.block:
            parts.append(s3[:, full:full + 1])
        return parts


def _agree(a: object, b: object) -> bool:
    """Two dims that may be equal (symbolic or unknown dims agree with anything)."""
    return not (isinstance(a, int) and isinstance(b, int)) or a == b


@register("QuantizeLinear", since=10)
class QuantizeLinear(Kernel):
    """y = saturate(round_half_even(x / y_scale) + y_zero_point), per tensor, per axis or blocked."""

    @staticmethod
    def _out_dtype(ctx: OpContext, zp: TensorInfo | None) -> np.dtype:
        code = ctx.attr("output_dtype", 0)
        if zp is not None:
            if code and onnx_dtype(code, ctx) != zp.dtype:
                raise ShapeError(f"{ctx.name}: output_dtype {onnx_dtype(code, ctx)} differs from "
                                 f"y_zero_point's {zp.dtype}; drop one or make them agree")
            return zp.dtype
        return onnx_dtype(code, ctx) if code else np.dtype(np.uint8)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        dtype = cls._out_dtype(ctx, zp)
        _quant_range(dtype, ctx.name)
        _Granularity(ctx, x.shape, scale.shape)
        return [TensorInfo(dtype, x.shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, scale = inputs[0], inputs[1]
        self.grain = _Granularity(ctx, x.shape, scale.shape)
        precision = ctx.attr("precision", 0)
        self.dtype = (onnx_dtype(precision, ctx) if precision
                      else np.result_type(x.dtype, scale.dtype))
        self.saturate = bool(ctx.attr("saturate", 1))
        self.spec = (tuple(x.shape), self.dtype)

    def workspace(self) -> int:
        return carve_size(self.spec)

    def run(self, inputs, outputs, workspace):
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        (q,) = carve(workspace, self.spec)
        grain = self.grain
        is_float = _quant_range(outputs[0].dtype, self.ctx.name)[2]
        for xp, qp, sp, zpp in zip(grain.data(x), grain.data(q), grain.params(scale, x),
                                   grain.params(zp, x)):
            np.divide(xp, sp, out=qp, dtype=self.dtype, casting="unsafe")
            if not is_float:
                np.rint(qp, out=qp)
                if zpp is not None:
                    np.add(qp, zpp, out=qp, casting="unsafe")
        _saturate(q, outputs[0], self.saturate)


@register("DequantizeLinear", since=10)
class DequantizeLinear(Kernel):
    """y = (x - x_zero_point) * x_scale in float32, per tensor, axis or block (float8: no zero point)."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, scale = inputs[0], inputs[1]
        code = ctx.attr("output_dtype", 0)
        _Granularity(ctx, x.shape, scale.shape)
        return [TensorInfo(onnx_dtype(code, ctx) if code else scale.dtype, x.shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, scale = inputs[0], inputs[1]
        self.grain = _Granularity(ctx, x.shape, scale.shape)
        zp = inputs[2] if len(inputs) > 2 else None
        self.use_zp = zp is not None and x.dtype.name not in _FLOAT_MAX
        self.spec = (tuple(x.shape), np.dtype(np.float32))
        self.direct = outputs[0].dtype == np.float32

    def workspace(self) -> int:
        return 0 if self.direct else carve_size(self.spec)

    def run(self, inputs, outputs, workspace):
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if self.use_zp else None
        y = outputs[0] if self.direct else carve(workspace, self.spec)[0]
        grain = self.grain
        for xp, yp, sp, zpp in zip(grain.data(x), grain.data(y), grain.params(scale, x),
                                   grain.params(zp, x)):
            if zpp is None:
                np.copyto(yp, xp, casting="unsafe")
            else:
                np.subtract(xp, zpp, out=yp, dtype=np.float32, casting="unsafe")
            np.multiply(yp, sp, out=yp, casting="unsafe")
        if not self.direct:
            np.copyto(outputs[0], y, casting="unsafe")


@register("DynamicQuantizeLinear", since=11)
class DynamicQuantizeLinear(Kernel):
    """uint8 quantization of x with a scale and zero point chosen from x's range (widened to hold 0)."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.dtype != np.float32:
            raise ShapeError(f"{ctx.name}: DynamicQuantizeLinear takes float32, got {x.dtype}; "
                             f"cast first")
        return [TensorInfo(np.dtype(np.uint8), x.shape), TensorInfo(np.dtype(np.float32), ()),
                TensorInfo(np.dtype(np.uint8), ())]

    def workspace(self) -> int:
        return carve_size((self.inputs[0].shape, np.float32))

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        f32 = np.float32
        high = f32(max(0.0, x.max())) if x.size else f32(0)
        low = f32(min(0.0, x.min())) if x.size else f32(0)
        scale = f32(f32(1.0) if high == low else high - low) / f32(255)
        zp = np.rint(np.clip(f32(0) - low / scale, 0, 255))
        (q,) = carve(workspace, (x.shape, np.float32))
        np.divide(x, scale, out=q)
        _requantize(q, zp, outputs[0])
        outputs[1][...] = scale
        outputs[2][...] = zp


def _matmul_shape(ctx: OpContext, a: Shape, b: Shape) -> Shape:
    """numpy.matmul's output shape (1-D operands are promoted, then their added dim removed)."""
    if not a or not b:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} operands need rank >= 1, got {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if not _agree(a2[-1], b2[-2]):
        raise ShapeError(f"{ctx.name}: inner dims differ: A {a} has {a2[-1]} columns, B {b} has "
                         f"{b2[-2]} rows; transpose or reshape one operand")
    rows = a2[-2:-1] if len(a) > 1 else ()
    cols = b2[-1:] if len(b) > 1 else ()
    return (*broadcast_shapes(a2[:-2], b2[:-2], name=ctx.name), *rows, *cols)


class _IntegerMatMul(Kernel):
    """Shared body of MatMulInteger and QLinearMatMul: (A - a_zp) @ (B - b_zp) exactly, in float64.

    A 1-D zero point or scale of A holds one value per row, one of B one value per column.
    """

    slots: tuple[int, int, int, int]
    """Input indices of A, B, a_zero_point, b_zero_point."""

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        ia, ib = self.slots[:2]
        f64 = np.dtype(np.float64)
        self.specs = ((tuple(inputs[ia].shape), f64), (tuple(inputs[ib].shape), f64),
                      (tuple(outputs[0].shape), f64))

    def workspace(self) -> int:
        return carve_size(*self.specs)

    @staticmethod
    def _per_row(v: np.ndarray | None, a: np.ndarray) -> np.ndarray | None:
        """A parameter of A: a 1-D one (one value per row) made to broadcast over A's columns."""
        if v is not None and v.ndim == 1 and v.size > 1 and a.ndim >= 2:
            return v.reshape(-1, 1)
        return _scalar(v)

    def product(self, inputs: Sequence[np.ndarray | None], workspace: np.ndarray) -> np.ndarray:
        """(A - a_zp) @ (B - b_zp) as float64, in the workspace, shaped like the output."""
        ia, ib, iza, izb = self.slots
        a, b = inputs[ia], inputs[ib]
        za = self._per_row(inputs[iza] if iza < len(inputs) else None, a)
        zb = _scalar(inputs[izb] if izb < len(inputs) else None)
        af, bf, cf = carve(workspace, *self.specs)
        for src, zp, dst in ((a, za, af), (b, zb, bf)):
            if zp is None:
                np.copyto(dst, src, casting="unsafe")
            else:
                np.subtract(src, zp, out=dst, dtype=np.float64, casting="unsafe")
        np.matmul(af, bf, out=cf)
        return cf


@register("MatMulInteger", since=10)
class MatMulInteger(_IntegerMatMul):
    """int32 = (A - a_zero_point) @ (B - b_zero_point), numpy.matmul broadcasting."""

    slots = (0, 1, 2, 3)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        return [TensorInfo(np.dtype(np.int32), _matmul_shape(ctx, inputs[0].shape, inputs[1].shape))]

    def run(self, inputs, outputs, workspace):
        np.copyto(outputs[0], self.product(inputs, workspace), casting="unsafe")


@register("QLinearMatMul", since=10)
class QLinearMatMul(_IntegerMatMul):
    """y = saturate(round((a - a_zp) @ (b - b_zp) * a_scale * b_scale / y_scale) + y_zp)."""

    slots = (0, 3, 2, 5)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        y_zp = inputs[7] if len(inputs) > 7 else None
        dtype = y_zp.dtype if y_zp is not None else inputs[0].dtype
        return [TensorInfo(dtype, _matmul_shape(ctx, inputs[0].shape, inputs[3].shape))]

    def run(self, inputs, outputs, workspace):
        c = self.product(inputs, workspace)
        a_scale = self._per_row(inputs[1], inputs[0])
        np.multiply(c, a_scale * _scalar(inputs[4]) / _scalar(inputs[6]), out=c)
        _requantize(c, _scalar(inputs[7] if len(inputs) > 7 else None), outputs[0])


class _Columns:
    """The im2col of an integer convolution over its Window, for one image at a time.

    The image, its zero point taken off, lives padded in the workspace (its border is the zero
    point, i.e. 0 once the zero point is subtracted); the columns of a chunk of output rows
    (spatial dim 0, sized to stay under COLUMNS_CAP) are one strided copy of it, multiplied by one
    (grouped) matmul.
    """

    def __init__(self, win: Window, group: int, x: Shape, w: Shape) -> None:
        self.win = win
        self.group = group
        c, m = x[1], w[0]
        self.padded = (c, *(n + b + e for n, b, e in zip(x[2:], win.begin, win.end)))
        self.interior = (slice(None), *(slice(b, b + n) for b, n in zip(win.begin, x[2:])))
        self.depth = c // group * numel(win.kernel)
        self.weights = (group, m // group, self.depth)
        self.inner = numel(win.out[1:])
        row_bytes = (c * numel(win.kernel) + m) * self.inner * 8
        self.step = max(1, min(win.out[0], COLUMNS_CAP // max(row_bytes, 1)))
        self.cols = (group * self.depth * self.step * self.inner,)
        self.result = (m * self.step * self.inner,)

    def im2col(self, padded: np.ndarray, rows: tuple[int, int], cols: np.ndarray) -> np.ndarray:
        """Columns of output rows [r0, r1): cols[c, k.., o..] = padded[c, o*s + k*d], as (g, depth, L)."""
        columns = strided_columns(padded, self.win, *rows)
        view = cols[:columns.size].reshape(columns.shape)
        np.copyto(view, columns)
        return view.reshape(self.group, self.depth, -1)


class _IntegerConv(Kernel):
    """Shared body of ConvInteger and QLinearConv: (x - x_zp) conv (w - w_zp) exactly, in float64.

    The output shape, the checks of the inputs and the window are Conv's. The zero-point-free
    image is kept as int16 (|x - x_zp| <= 255); columns and products are float64, a chunk of
    output rows at a time.
    """

    slots: tuple[int, int, int, int]
    """Input indices of x, w, x_zero_point, w_zero_point."""

    @classmethod
    def output_shape(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> Shape:
        """Conv's output shape for this node's x and w (after Conv's checks of them)."""
        return Conv.infer(ctx, [inputs[cls.slots[0]], inputs[cls.slots[1]]])[0].shape

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, w = inputs[self.slots[0]], inputs[self.slots[1]]
        win = window_of(ctx, x.shape[2:], [int(k) for k in _kernel_shape(ctx, w)])
        self.columns = _Columns(win, int(ctx.attr("group", 1)), x.shape, w.shape)
        f64 = np.dtype(np.float64)
        columns = self.columns
        self.specs = ((columns.padded, np.dtype(np.int16)), (columns.weights, f64), (columns.cols, f64),
                      (columns.result, f64))

    def workspace(self) -> int:
        return carve_size(*self.specs)

    def blocks(self, inputs: Sequence[np.ndarray | None], y: np.ndarray, workspace: np.ndarray):
        """Yield (result, target): the float64 convolution of a chunk of output rows of one image,
        shaped (M, rows, rest), and the view of `y` it belongs in."""
        ix, iw, izx, izw = self.slots
        x, w = inputs[ix], inputs[iw]
        zx = inputs[izx] if izx < len(inputs) else None
        zw = inputs[izw] if izw < len(inputs) else None
        padded, wf, cols, res = carve(workspace, *self.specs)
        m = w.shape[0]
        if zw is None:
            np.copyto(wf.reshape(m, -1), w.reshape(m, -1), casting="unsafe")
        else:
            zw = zw.reshape(-1, 1) if zw.size > 1 else zw.reshape(())
            np.subtract(w.reshape(m, -1), zw, out=wf.reshape(m, -1), dtype=np.float64, casting="unsafe")
        if zx is not None and zx.size > 1:
            zx = zx.reshape(-1, *(1,) * (x.ndim - 2))
        padded.fill(0)
        columns = self.columns
        inner = padded[columns.interior]
        rows = columns.win.out[0]
        for n in range(x.shape[0]):
            if zx is None:
                np.copyto(inner, x[n], casting="unsafe")
            else:
                np.subtract(x[n], zx, out=inner, dtype=np.int16, casting="unsafe")
            target = y[n].reshape(m, rows, columns.inner)
            for r0, r1 in _chunks(rows, columns.step):
                cols_chunk = columns.im2col(padded, (r0, r1), cols)
                out = res[:m * cols_chunk.shape[2]].reshape(columns.group, m // columns.group, -1)
                np.matmul(wf, cols_chunk, out=out)
                yield out.reshape(m, r1 - r0, columns.inner), target[:, r0:r1]


@register("ConvInteger", since=10)
class ConvInteger(_IntegerConv):
    """int32 = (x - x_zero_point) conv (w - w_zero_point); w's zero point may be per output channel."""

    slots = (0, 1, 2, 3)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        shape = cls.output_shape(ctx, inputs)
        return [TensorInfo(np.dtype(np.int32), shape)]

    def run(self, inputs, outputs, workspace):
        for res, target in self.blocks(inputs, outputs[0], workspace):
            np.copyto(target, res, casting="unsafe")


@register("QLinearConv", since=10)
class QLinearConv(_IntegerConv):
    """y = saturate(round((conv + B) * x_scale * w_scale / y_scale) + y_zp); per-channel w_scale too."""

    slots = (0, 3, 2, 5)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        shape = cls.output_shape(ctx, inputs)
        y_zp = inputs[7] if len(inputs) > 7 else None
        return [TensorInfo(y_zp.dtype if y_zp is not None else inputs[0].dtype, shape)]

    def run(self, inputs, outputs, workspace):
        w_scale = inputs[4]
        w_scale = w_scale.reshape(-1, 1, 1) if w_scale.size > 1 else w_scale.reshape(())
        multiplier = inputs[1].reshape(()) * w_scale / inputs[6].reshape(())
        y_zp = _scalar(inputs[7] if len(inputs) > 7 else None)
        bias = inputs[8] if len(inputs) > 8 else None
        for res, target in self.blocks(inputs, outputs[0], workspace):
            if bias is not None:
                np.add(res, bias.reshape(-1, 1, 1), out=res)
            np.multiply(res, multiplier, out=res)
            _requantize(res, y_zp, target)
