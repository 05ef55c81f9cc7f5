"""Image sampling kernels: Resize, Upsample, GridSample, AffineGrid and RoiAlign.

Resize is separable: each resized axis gets a plan (for every output position, the input indices
it reads and their weights), built once from attributes and shapes; running is a chain of
`np.take` gathers along one axis at a time, weighted and summed in float.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..errors import ShapeError
from ..native.bindings import REPEAT2D
from . import parallel
from .base import (Dim, Kernel, OpContext, Shape, TensorInfo, carve, carve_size, normalize_axis, numel, register,
                   run_bound)

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def interp_dtype(dtype: np.dtype) -> np.dtype:
    """The float type interpolation of `dtype` values runs in (exact for every 16-bit integer)."""
    wide = dtype.itemsize > 2 and dtype.kind in "iu" or dtype == np.float64
    return np.dtype(np.float64) if wide else np.dtype(np.float32)


def cast_value(value: float, dtype: np.dtype) -> np.generic:
    """A float as `dtype`: rounded half to even and saturated for integers."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return dtype.type(min(max(round(value), info.min), info.max))
    return dtype.type(value)


def store(acc: np.ndarray, out: np.ndarray, convex: bool = False) -> None:
    """Write float results into `out`: rounded half to even and saturated for integer outputs.

    `convex` says every result is a convex combination of inputs, so it cannot leave the range.
    """
    if out.dtype.kind not in "iu":
        np.copyto(out, acc, casting="unsafe")
        return
    if not convex:
        info = np.iinfo(out.dtype)
        np.clip(acc, info.min, info.max, out=acc)
    np.rint(acc, out=out, casting="unsafe")


def cubic_weights(t: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution weights of the taps at offsets -1, 0, 1, 2 from floor(x), t = x - floor(x)."""
    s = 1 - t
    return np.stack([((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                     ((a + 2) * t - (a + 3)) * t * t + 1,
                     ((a + 2) * s - (a + 3)) * s * s + 1,
                     ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a], axis=-1)


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


# ----------------------------------------------------------------------------- Resize plans

@dataclass(frozen=True)
class ResizeParams:
    """The attributes that shape Resize's per-axis sampling."""

    mode: str = "nearest"
    coord: str = "half_pixel"
    nearest: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation: float = 0.0


@dataclass(frozen=True)
class AxisPlan:
    """How one axis is resampled: output i reads input `taps[k][i]` with weight `weights[k][i]`."""

    axis: int
    taps: tuple[np.ndarray, ...]
    weights: tuple[np.ndarray, ...] | None
    outside: np.ndarray | None
    repeat: int
    """k > 0 when the axis is nearest upsampling by the integer k (each input copied k times)."""

    @property
    def out_len(self) -> int:
        return len(self.taps[0])


def source_coords(p: ResizeParams, out_len: int, in_len: int, scale: float,
                  roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray | None]:
    """x_original for every output coordinate, and the tf_crop_and_resize out-of-range mask.

    As in the reference, `output_width = scale * length_original` (a float when scales are given)
    stands for length_resized in the align_corners, pytorch_half_pixel and crop formulas.
    """
    y = np.arange(out_len, dtype=np.float64)
    width = scale * in_len
    mode = p.coord
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":
        return (np.full(out_len, -0.5) if width == 1 else (y + 0.5) / scale - 0.5), None
    if mode == "align_corners":
        return (np.zeros(out_len) if width == 1 else y * (in_len - 1) / (width - 1)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    start, end = roi
    if width == 1:
        x = np.full(out_len, (end - start) * (in_len - 1) / 2)
    else:
        x = y * (end - start) * (in_len - 1) / (width - 1)
    x = x + start * (in_len - 1)
    return x, (x < 0) | (x > in_len - 1)


def axis_plan(p: ResizeParams, axis: int, in_len: int, out_len: int, scale: float,
              roi: tuple[float, float], dtype: np.dtype) -> AxisPlan:
    """The gather indices and weights (in `dtype`) of one resized axis.

    Neighbours are taken around left = ceil(x) - 1 with ratio = x - left in (0, 1]: the reference
    prefers the pixel on the left of x_original, which matters for ties and `exclude_outside`.
    """
    x, outside = source_coords(p, out_len, in_len, scale, roi)
    left = np.ceil(x) - 1
    ratio = x - left
    left = left.astype(np.intp)
    if p.mode == "nearest":
        rule = p.nearest if p.nearest != "simple" else ("ceil" if scale < 1 else "floor")
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
              "floor": ratio == 1, "ceil": np.ones_like(ratio, bool)}[rule]
        index = np.clip(left + up, 0, in_len - 1)
        k = out_len // in_len if in_len else 0
        repeat = k if k > 1 and out_len == k * in_len and np.array_equal(
            index, np.repeat(np.arange(in_len), k)) else 0
        return AxisPlan(axis, (index,), None, outside, repeat)
    s = min(scale, 1.0) if p.antialias else 1.0
    if p.mode == "linear":
        first = math.floor(-1 / s) + 1
        offsets = np.arange(first, 2 - first)
        w = np.clip(1 - np.abs((offsets - ratio[:, None]) * s), 0, 1)
    else:
        first = math.floor(-2 / s) + 1 if p.antialias else -1
        offsets = np.arange(first, 2 - first)
        if p.antialias:
            w = _cubic_kernel((offsets - ratio[:, None]) * s, p.cubic_a)
        else:
            w = cubic_weights(ratio, p.cubic_a)
    if p.antialias:
        w = w / w.sum(axis=1, keepdims=True)
    index = left[:, None] + offsets
    if p.exclude_outside:
        w = np.where((index < 0) | (index >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, in_len - 1)
    return AxisPlan(axis, tuple(np.ascontiguousarray(index[:, k]) for k in range(index.shape[1])),
                    tuple(np.ascontiguousarray(w[:, k], dtype=dtype) for k in range(w.shape[1])),
                    outside, 0)


class Resampler:
    """Runs a list of axis plans over arrays of one shape and dtype, through a workspace."""

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype: np.dtype,
                 plans: Sequence[AxisPlan], params: ResizeParams) -> None:
        self.dtype = dtype
        self.nearest = params.mode == "nearest"
        self.convex = params.mode == "linear"
        self.ct = interp_dtype(dtype)
        self.ndim = len(in_shape)
        # Shrinking axes first keeps the intermediates small.
        self.plans = sorted(plans, key=lambda p: p.out_len / max(in_shape[p.axis], 1))
        self.repeat_all = self.nearest and bool(plans) and all(p.repeat for p in plans)
        self.shapes: list[tuple[int, ...]] = []
        shape = list(in_shape)
        for p in self.plans:
            shape[p.axis] = p.out_len
            self.shapes.append(tuple(shape))
        self.out_shape = out_shape
        self.extrap = [(p.axis, p.outside) for p in plans if p.outside is not None and p.outside.any()]
        self.fill = cast_value(params.extrapolation, dtype) if dtype.kind in "iufb" else None
        self.layout = self._layout()

    def _layout(self) -> list[tuple[np.dtype, int]]:
        """(dtype, elements) of the workspace regions: ping, pong, and gather scratch."""
        steps = len(self.plans)
        if self.repeat_all or not steps:
            return []
        sizes = [numel(s) for s in self.shapes]
        buf = self.dtype if self.nearest else self.ct
        final_direct = self.nearest or self.dtype == self.ct
        last = steps - 1 if final_direct else steps
        ping = max([sizes[k] for k in range(0, last, 2)], default=0)
        pong = max([sizes[k] for k in range(1, last, 2)], default=0)
        regions = [(buf, ping), (buf, pong)]
        if not self.nearest:
            regions.append((self.ct, max(sizes)))
            if self.dtype != self.ct:
                regions.append((self.dtype, sizes[0]))
        return regions

    def workspace_size(self) -> int:
        return sum(carve_size(((n,), dt)) for dt, n in self.layout if not dt.hasobject)

    def _regions(self, workspace: np.ndarray | None) -> list[np.ndarray]:
        """The layout's arrays, carved from the workspace (object arrays cannot live there)."""
        need = self.workspace_size()
        if workspace is None or workspace.size < need:
            workspace = np.empty(need, np.uint8)
        views, offset = [], 0
        for dt, n in self.layout:
            if dt.hasobject:
                views.append(np.empty(n, dt))
                continue
            size = carve_size(((n,), dt))
            views.append(carve(workspace[offset:offset + size], ((n,), dt))[0])
            offset += size
        return views

    def run(self, x: np.ndarray, out: np.ndarray, workspace: np.ndarray | None) -> None:
        if out.size == 0:
            return
        if not self.plans:
            np.copyto(out, x)
        elif self.repeat_all:
            self._repeat(x, out)
        else:
            regions = self._regions(workspace)
            if self.nearest:
                self._gather(x, out, regions)
            else:
                self._interpolate(x, out, regions)
        for axis, mask in self.extrap:
            out[(slice(None),) * axis + (mask,)] = self.fill

    def _repeat(self, x: np.ndarray, out: np.ndarray) -> None:
        """Integer nearest upsampling on every resized axis, with copies instead of gathers.

        The output is viewed with a (size, factor) pair per repeated axis. Slot 0 of every
        factor is written from `x`, then duplicated axis by axis from the innermost outward.
        """
        factors = {p.axis: p.repeat for p in self.plans}
        last = x.ndim - 1
        view, slot, src_shape = [], {}, []
        for axis, n in enumerate(x.shape):
            view.append(n)
            src_shape.append(n)
            if axis in factors:
                slot[axis] = len(view)
                view.append(factors[axis])
                src_shape.append(1)
        full = out.reshape(view)
        sel: list[slice] = [slice(None)] * len(view)
        outer = sorted((a for a in factors if a != last), reverse=True)
        for a in outer:
            sel[slot[a]] = slice(0, 1)
        base = full[tuple(sel)]
        if not (last in factors and self._fill_pairs(x, base, factors[last])):
            np.copyto(base, x.reshape(src_shape))
        for a in outer:
            dst, src = list(sel), list(sel)
            dst[slot[a]] = slice(1, None)
            np.copyto(full[tuple(dst)], full[tuple(src)])
            sel[slot[a]] = slice(None)

    @staticmethod
    def _fill_pairs(x: np.ndarray, base: np.ndarray, k: int) -> bool:
        """Repeat the last axis k times as one wide-integer multiply (k copies of the bit pattern).

        Works when k * itemsize is 2, 4 or 8 bytes; returns False when it does not apply.
        """
        size = x.dtype.itemsize
        if x.dtype.kind not in "biuf" or k * size not in (2, 4, 8) or not x.flags.c_contiguous:
            return False
        narrow, wide = np.dtype(f"u{size}"), np.dtype(f"u{k * size}")
        pattern = sum(1 << (8 * size * j) for j in range(k))
        np.multiply(x.view(narrow).reshape(base.shape[:-1]), wide.type(pattern),
                    out=base.view(wide).reshape(base.shape[:-1]))
        return True

    def _step_out(self, k: int, out: np.ndarray, regions: list[np.ndarray], direct: bool) -> np.ndarray:
        if k == len(self.plans) - 1 and direct:
            return out
        return regions[k % 2][:numel(self.shapes[k])].reshape(self.shapes[k])

    def _gather(self, x: np.ndarray, out: np.ndarray, regions: list[np.ndarray]) -> None:
        src = x
        for k, p in enumerate(self.plans):
            dst = self._step_out(k, out, regions, True)
            np.take(src, p.taps[0], axis=p.axis, out=dst)
            src = dst

    def _interpolate(self, x: np.ndarray, out: np.ndarray, regions: list[np.ndarray]) -> None:
        direct = out.dtype == self.ct
        src = x
        for k, p in enumerate(self.plans):
            dst = self._step_out(k, out, regions, direct)
            n = numel(self.shapes[k])
            scratch = regions[2][:n].reshape(self.shapes[k])
            gathered = regions[3][:n].reshape(self.shapes[k]) if src.dtype != self.ct else scratch
            tail = (1,) * (self.ndim - p.axis - 1)
            for j, (idx, w) in enumerate(zip(p.taps, p.weights)):
                np.take(src, idx, axis=p.axis, out=gathered)
                w = w.reshape(w.shape + tail)
                if j == 0:
                    np.multiply(gathered, w, out=dst)
                else:
                    np.multiply(gathered, w, out=scratch)
                    np.add(dst, scratch, out=dst)
            src = dst
        if src is not out:
            store(src, out, self.convex)


# ----------------------------------------------------------------------------- Resize / Upsample

def _present(info: TensorInfo | np.ndarray | None) -> bool:
    """An optional input given with at least one element (empty tensors stand for absent)."""
    if info is None:
        return False
    shape = info.shape
    return not (len(shape) == 1 and shape[0] == 0)


@dataclass(frozen=True)
class ResizeGeometry:
    """Output sizes and the per-axis scale the coordinate transform uses."""

    out_shape: tuple[Dim, ...]
    scales: tuple[float, ...]
    roi: tuple[tuple[float, float], ...]


class _ResizeBase(Kernel):
    """Shared by Resize and Upsample: geometry from attributes and inputs, then a cached Resampler.

    Nearest upsampling of float32 by whole factors of the last two axes (a feature pyramid's 2x,
    4x and 8x) runs natively on omrt's threads when the plan fixes the shapes."""

    native_units = ("elementwise",)

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.params = self.resize_params(ctx)
        self.cache: dict[bytes, Resampler] = {}
        self.resampler: Resampler | None = None
        x = inputs[0]
        if x.static:
            values = [i.value if i is not None else None for i in inputs]
            geometry = self.geometry(ctx, x.shape, values, inputs)
            if geometry is not None:
                self.resampler = self.make_resampler(x.shape, x.dtype, geometry)
        self.native_repeat, self.factors = None, (1, 1)
        r = self.resampler
        last_two = {x.rank - 2, x.rank - 1}
        if (r is not None and r.repeat_all and not r.extrap and ctx.native is not None and x.dtype == np.float32
                and {p.axis for p in r.plans} <= last_two):
            self.native_repeat = ctx.native.get(REPEAT2D)
            factors = {p.axis: p.repeat for p in r.plans}
            self.factors = (factors.get(x.rank - 2, 1), factors.get(x.rank - 1, 1))

    def bind(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        if (self.native_repeat is None or y.size == 0 or y.shape != self.resampler.out_shape
                or not (x.flags.c_contiguous and y.flags.c_contiguous)):
            return None
        kh, kw = self.factors
        return [self.native_repeat.bind(x, y, x.size // x.shape[-1], x.shape[-1], kh, kw,
                                        parallel.native_threads(nbytes=y.nbytes))]

    @classmethod
    def resize_params(cls, ctx: OpContext) -> ResizeParams:
        raise NotImplementedError

    @classmethod
    def geometry(cls, ctx: OpContext, shape: Shape, values: Sequence[np.ndarray | None],
                 infos: Sequence[TensorInfo | None]) -> ResizeGeometry | None:
        """Sizes, scales and roi per axis; None when a needed input value is not known."""
        raise NotImplementedError

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        params = cls.resize_params(ctx)
        if params.mode != "nearest" and x.dtype.kind not in "iuf":
            raise ShapeError(f"{ctx.name}: {params.mode} {ctx.op_type} needs a numeric input, got "
                             f"{x.dtype}; use mode 'nearest' or Cast the input")
        values = [i.value if i is not None else None for i in inputs]
        geometry = cls.geometry(ctx, x.shape, values, inputs)
        shape = geometry.out_shape if geometry is not None else (None,) * x.rank
        return [TensorInfo(x.dtype, tuple(shape))]

    def make_resampler(self, shape: tuple[int, ...], dtype: np.dtype, geometry: ResizeGeometry) -> Resampler:
        """The plans for one input shape and geometry."""
        ct = interp_dtype(dtype)
        plans = []
        for axis, (n_in, n_out, scale, roi) in enumerate(zip(shape, geometry.out_shape, geometry.scales,
                                                             geometry.roi)):
            crop = self.params.coord == "tf_crop_and_resize" and roi != (0.0, 1.0)
            if n_out == n_in and math.isclose(scale, 1.0) and not crop:
                continue
            if n_in == 0 and n_out:
                raise ShapeError(f"{self.ctx.name}: cannot resize the empty axis {axis} to {n_out}")
            if n_out:
                plans.append(axis_plan(self.params, axis, n_in, n_out, scale, roi, ct))
        return Resampler(shape, tuple(geometry.out_shape), dtype, plans, self.params)

    def workspace(self) -> int:
        if self.resampler is not None:
            return self.resampler.workspace_size()
        return 0

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        x = inputs[0]
        resampler = self.resampler
        if resampler is None:
            values = [np.asarray(v) if v is not None else None for v in inputs]
            key = repr(x.shape).encode() + b"".join(v.tobytes() for v in values[1:] if v is not None)
            resampler = self.cache.get(key)
            if resampler is None:
                infos = [TensorInfo.of(v) if v is not None else None for v in values]
                geometry = self.geometry(self.ctx, x.shape, values, infos)
                resampler = self.cache[key] = self.make_resampler(x.shape, x.dtype, geometry)
        if resampler.out_shape != outputs[0].shape:
            raise ShapeError(f"{self.ctx.name}: Resize output buffer has shape {outputs[0].shape}, "
                             f"the scales/sizes give {resampler.out_shape}")
        resampler.run(x, outputs[0], workspace)


def _floor_dims(shape: Shape, scales: Sequence[float]) -> tuple[Dim, ...]:
    """output_dimension = floor(input_dimension * scale); symbolic dims survive a scale of 1."""
    out: list[Dim] = []
    for d, s in zip(shape, scales):
        if isinstance(d, int):
            out.append(int(np.floor(np.float64(s) * d)))
        else:
            out.append(d if s == 1 else None)
    return tuple(out)


@register("Resize", since=10)
class Resize(_ResizeBase):
    """Resize by scales or sizes with nearest, (n-)linear or (n-)cubic sampling.

    Opset 10 has only X and scales, and behaves as 'asymmetric' coordinates with nearest
    rounding down when upsampling and up when downsampling; opset 11 adds roi, sizes and the
    coordinate attributes; opset 18 adds axes, antialias and keep_aspect_ratio_policy.
    """

    @classmethod
    def resize_params(cls, ctx: OpContext) -> ResizeParams:
        mode = str(ctx.attr("mode", "nearest"))
        if mode not in ("nearest", "linear", "cubic"):
            raise ShapeError(f"{ctx.name}: Resize mode {mode!r} is not one of nearest, linear, cubic")
        if ctx.opset < 11:
            return ResizeParams(mode, "asymmetric", "simple")
        coord = str(ctx.attr("coordinate_transformation_mode", "half_pixel"))
        nearest = str(ctx.attr("nearest_mode", "round_prefer_floor"))
        if coord not in _COORD_MODES:
            raise ShapeError(f"{ctx.name}: coordinate_transformation_mode {coord!r} is not one of "
                             f"{', '.join(_COORD_MODES)}")
        if nearest not in _NEAREST_MODES[:4]:
            raise ShapeError(f"{ctx.name}: nearest_mode {nearest!r} is not one of "
                             f"{', '.join(_NEAREST_MODES[:4])}")
        return ResizeParams(mode, coord, nearest, float(ctx.attr("cubic_coeff_a", -0.75)),
                            bool(ctx.attr("exclude_outside", 0)),
                            bool(ctx.attr("antialias", 0)) and mode != "nearest",
                            float(ctx.attr("extrapolation_value", 0.0)))

    @classmethod
    def geometry(cls, ctx: OpContext, shape: Shape, values: Sequence[np.ndarray | None],
                 infos: Sequence[TensorInfo | None]) -> ResizeGeometry | None:
        rank = len(shape)
        if ctx.opset < 11:
            roi_i, scales_i, sizes_i = None, 1, None
        else:
            roi_i, scales_i, sizes_i = 1, 2, 3

        def get(i: int | None) -> tuple[bool, np.ndarray | None]:
            info = infos[i] if i is not None and i < len(infos) else None
            return _present(info), (values[i] if _present(info) else None)

        has_sizes, sizes = get(sizes_i)
        has_scales, scales = get(scales_i)
        has_roi, roi = get(roi_i)
        axes = list(range(rank))
        if ctx.opset >= 18 and ctx.attr("axes") is not None:
            axes = [normalize_axis(int(a), rank, ctx.name) for a in ctx.attr("axes")]
        if has_sizes == has_scales:
            raise ShapeError(f"{ctx.name}: Resize needs exactly one of 'scales' and 'sizes' "
                             f"(give the other as an empty name or empty tensor)")
        given = sizes if has_sizes else scales
        crop = ctx.opset >= 11 and ctx.attr("coordinate_transformation_mode") == "tf_crop_and_resize"
        has_roi = has_roi and crop
        if given is None or (has_roi and roi is None):
            return None
        given = np.asarray(given).reshape(-1)
        if len(given) != len(axes):
            raise ShapeError(f"{ctx.name}: Resize got {len(given)} {'sizes' if has_sizes else 'scales'} "
                             f"for {len(axes)} axes; give one per axis")
        roi_pairs = [(0.0, 1.0)] * rank
        if has_roi and np.asarray(roi).size:
            r = np.asarray(roi, np.float64).reshape(-1)
            if len(r) != 2 * len(axes):
                raise ShapeError(f"{ctx.name}: Resize roi needs {2 * len(axes)} values "
                                 f"(starts then ends), got {len(r)}")
            for i, a in enumerate(axes):
                roi_pairs[a] = (float(r[i]), float(r[len(axes) + i]))
        scale = [1.0] * rank
        if has_scales:
            for a, s in zip(axes, given):
                if not s > 0:
                    raise ShapeError(f"{ctx.name}: Resize scales must be positive, got {given.tolist()}")
                scale[a] = float(s)
            return ResizeGeometry(_floor_dims(shape, scale), tuple(scale), tuple(roi_pairs))
        out: list[Dim] = list(shape)
        policy = str(ctx.attr("keep_aspect_ratio_policy", "stretch")) if ctx.opset >= 18 else "stretch"
        if policy == "stretch":
            for a, n in zip(axes, given):
                out[a] = int(n)
                scale[a] = int(n) / shape[a] if isinstance(shape[a], int) and shape[a] else 1.0
        else:
            if policy not in ("not_larger", "not_smaller"):
                raise ShapeError(f"{ctx.name}: keep_aspect_ratio_policy {policy!r} is not one of "
                                 f"stretch, not_larger, not_smaller")
            if not all(isinstance(shape[a], int) and shape[a] for a in axes):
                return ResizeGeometry(tuple(None if a in axes else d for a, d in enumerate(shape)),
                                      tuple(scale), tuple(roi_pairs))
            ratios = [int(n) / shape[a] for a, n in zip(axes, given)]
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                out[a] = int(common * shape[a] + 0.5)
                scale[a] = common
        return ResizeGeometry(tuple(out), tuple(scale), tuple(roi_pairs))


@register("Upsample", since=7)
class Upsample(_ResizeBase):
    """Upsample (opset 7: scales attribute, 9: scales input): Resize-10 semantics, scales >= 1."""

    @classmethod
    def resize_params(cls, ctx: OpContext) -> ResizeParams:
        mode = str(ctx.attr("mode", "nearest"))
        if mode not in ("nearest", "linear", "bilinear"):
            raise ShapeError(f"{ctx.name}: Upsample mode {mode!r} is not one of nearest, linear")
        return ResizeParams("nearest" if mode == "nearest" else "linear", "asymmetric", "simple")

    @classmethod
    def geometry(cls, ctx: OpContext, shape: Shape, values: Sequence[np.ndarray | None],
                 infos: Sequence[TensorInfo | None]) -> ResizeGeometry | None:
        if ctx.opset < 9:
            scales = ctx.attr("scales")
            if scales is None:
                raise ShapeError(f"{ctx.name}: Upsample-7 needs the 'scales' attribute")
        else:
            scales = values[1] if len(values) > 1 else None
            if scales is None:
                return None
        scales = [float(s) for s in np.asarray(scales, np.float32).reshape(-1)]
        if len(scales) != len(shape) or min(scales, default=1) < 1:
            raise ShapeError(f"{ctx.name}: Upsample needs one scale >= 1 per input axis "
                             f"({len(shape)}), got {scales}")
        return ResizeGeometry(_floor_dims(shape, scales), tuple(scales), ((0.0, 1.0),) * len(shape))


# ----------------------------------------------------------------------------- GridSample

def reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect coordinates by the borders [lo, hi] until they fall inside."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below = x < lo
    dx = np.where(below, lo - x, x - hi)
    n = np.floor(dx / span)
    r = dx - n * span
    even = n % 2 == 0
    inside_low = np.where(even, lo + r, hi - r)
    inside_high = np.where(even, hi - r, lo + r)
    return np.where(below, inside_low, np.where(x > hi, inside_high, x))


_Tap = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]
"""(index, weight or None, validity mask or None) of one sampling tap."""


@register("GridSample", since=16)
class GridSample(Kernel):
    """Sample X at the normalized positions of `grid` (x, y, ... order, i.e. last spatial axis first).

    Opset 16 supports 4-D inputs with modes bilinear/nearest/bicubic; opset 20 is N-D with
    linear/nearest/cubic. Padding applies twice, as in the reference: a sampling point outside
    the border range is clamped (border) or reflected (reflection), then each tap outside the
    image reads 0, the clamped pixel, or the reflected pixel. Cubic sampling pads only the taps,
    as PyTorch's grid_sample (which the spec follows) and onnxruntime do.
    """

    MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic",
             "nearest": "nearest"}

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, grid = inputs[:2]
        r = x.rank - 2
        if r < 1 or (ctx.opset < 20 and r != 2):
            raise ShapeError(f"{ctx.name}: GridSample needs X of rank {'4' if ctx.opset < 20 else '>= 3'} "
                             f"(N, C, spatial...), got shape {x.shape}")
        if grid.rank != r + 2 or grid.shape[-1] not in (r, None) or isinstance(grid.shape[-1], str):
            raise ShapeError(f"{ctx.name}: GridSample grid must have shape (N, *out_spatial, {r}) "
                             f"for X of shape {x.shape}, got {grid.shape}")
        mode = cls.MODES.get(str(ctx.attr("mode", "bilinear" if ctx.opset < 20 else "linear")))
        if mode is None or (mode != "nearest" and x.dtype.kind not in "iuf"):
            raise ShapeError(f"{ctx.name}: GridSample mode {ctx.attr('mode')!r} is not supported "
                             f"for {x.dtype}; use linear, nearest or cubic on numeric inputs")
        return [TensorInfo(x.dtype, (x.shape[0], x.shape[1]) + tuple(grid.shape[1:-1]))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.mode = self.MODES[str(ctx.attr("mode", "bilinear" if ctx.opset < 20 else "linear"))]
        self.padding = str(ctx.attr("padding_mode", "zeros"))
        if self.padding not in ("zeros", "border", "reflection"):
            raise ShapeError(f"{ctx.name}: padding_mode {self.padding!r} is not one of zeros, border, "
                             f"reflection")
        self.align = bool(ctx.attr("align_corners", 0))
        x = inputs[0]
        self.ct = interp_dtype(x.dtype)
        self.dims = tuple(x.shape[2:])
        self.plane = (x.shape[1], numel(tuple(outputs[0].shape[2:])))
        self.widen = x.dtype != self.ct

    def workspace(self) -> int:
        if self.mode == "nearest":
            return 0
        x = self.inputs[0]
        acc = (x.shape[0],) + self.plane
        widened = carve_size((acc, self.ct), (self.plane, self.ct)) if self.widen else 0
        return carve_size((self.plane, x.dtype)) + widened

    def _taps(self, coord: np.ndarray, d: int) -> list[_Tap]:
        """(index, weight, valid) per tap along one spatial axis of length d.

        The weight is None for nearest sampling; `valid` is None unless padding is zeros.
        """
        lo, hi = (0.0, d - 1.0) if self.align else (-0.5, d - 0.5)
        if self.mode == "nearest":
            coord = np.rint(coord)
        if self.padding != "zeros" and self.mode != "cubic":
            fixed = np.clip(coord, 0, d - 1) if self.padding == "border" else reflect(coord, lo, hi)
            coord = np.where((coord < lo) | (coord > hi), fixed, coord)
        if self.mode == "nearest":
            base, offsets, weights = coord.astype(np.int64), [0], [None]
        else:
            fl = np.floor(coord)
            t = coord - fl
            base = fl.astype(np.int64)
            if self.mode == "linear":
                offsets, weights = [0, 1], [1 - t, t]
            else:
                w = cubic_weights(t, -0.75)
                offsets, weights = [-1, 0, 1, 2], [w[..., k] for k in range(4)]
        taps = []
        for off, w in zip(offsets, weights):
            i = base + off
            valid = None
            if self.padding == "zeros":
                valid = (i >= 0) & (i < d)
            elif self.padding == "reflection":
                i = reflect(i.astype(np.float64), lo, hi).astype(np.int64)
            taps.append((np.clip(i, 0, d - 1), w, valid))
        return taps

    def _combos(self, grid: np.ndarray) -> Iterator[_Tap]:
        """Per combination of taps over the spatial axes: flat index, weight and validity, all (N, P)."""
        n, r = grid.shape[0], len(self.dims)
        g = grid.reshape(n, -1, r).astype(self.ct, copy=False)
        per_axis = []
        for i, d in enumerate(self.dims):
            v = g[..., r - 1 - i]
            coord = (v + 1) / 2 * (d - 1) if self.align else ((v + 1) * d - 1) / 2
            per_axis.append(self._taps(coord, d))
        strides = [numel(self.dims[i + 1:]) for i in range(r)]
        for combo in itertools.product(*per_axis):
            flat = sum(idx * s for (idx, _, _), s in zip(combo, strides))
            valid = [v for _, _, v in combo if v is not None]
            mask = np.logical_and.reduce(valid) if valid else None
            weights = [w for _, w, _ in combo if w is not None]
            weight = np.prod(weights, axis=0) if weights else None
            if weight is not None and mask is not None:
                weight = np.where(mask, weight, 0).astype(self.ct)
            yield flat, weight, mask

    def run(self, inputs, outputs, workspace):
        x, grid = inputs[:2]
        y = outputs[0]
        if y.size == 0:
            return
        n, (c, p) = x.shape[0], self.plane
        xs = x.reshape(n, c, -1)
        ys = y.reshape(n, c, p)
        if self.mode == "nearest":
            flat, _, mask = next(self._combos(grid))
            for b in range(n):
                np.take(xs[b], flat[b], axis=1, out=ys[b])
                if mask is not None:
                    np.copyto(ys[b], y.dtype.type(0), where=~mask[b])
            return
        gathered = carve(workspace, (self.plane, x.dtype))[0]
        acc, scratch = ys, gathered
        if self.widen:
            acc, scratch = carve(workspace[carve_size((self.plane, x.dtype)):], ((n, c, p), self.ct),
                                 (self.plane, self.ct))
        for j, (flat, weight, _) in enumerate(self._combos(grid)):
            for b in range(n):
                np.take(xs[b], flat[b], axis=1, out=gathered)
                if j == 0:
                    np.multiply(gathered, weight[b], out=acc[b])
                else:
                    np.multiply(gathered, weight[b], out=scratch)
                    np.add(acc[b], scratch, out=acc[b])
        if acc is not ys:
            store(acc, ys, self.mode == "linear")


@register("AffineGrid", since=20)
class AffineGrid(Kernel):
    """grid[n, ..., :] = theta[n] @ (x, y[, z], 1) over a regular grid of positions in [-1, 1].

    The base positions depend only on `size` and `align_corners` and are built once when `size`
    is known at load.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        theta, size = inputs[:2]
        if theta.rank != 3 or theta.shape[1:] not in ((2, 3), (3, 4)):
            raise ShapeError(f"{ctx.name}: AffineGrid theta must be (N, 2, 3) or (N, 3, 4), got "
                             f"{theta.shape}")
        r = theta.shape[1]
        if size.value is None:
            return [TensorInfo(theta.dtype, (theta.shape[0],) + (None,) * r + (r,))]
        dims = [int(v) for v in np.asarray(size.value).reshape(-1)]
        if len(dims) != r + 2:
            raise ShapeError(f"{ctx.name}: AffineGrid size must hold {r + 2} values (N, C, spatial...) "
                             f"for theta {theta.shape}, got {dims}")
        return [TensorInfo(theta.dtype, (theta.shape[0],) + tuple(dims[2:]) + (r,))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.align = bool(ctx.attr("align_corners", 0))
        size = inputs[1].value
        self.base = self.base_grid(tuple(int(v) for v in np.asarray(size)[2:]), inputs[0].dtype) \
            if size is not None else None

    def base_grid(self, dims: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """(prod(dims), r + 1) homogeneous positions, last spatial axis varying fastest, x first."""
        axes = []
        for d in dims:
            if self.align:
                axes.append(np.linspace(-1, 1, d) if d > 1 else np.full(d, -1.0))
            else:
                axes.append((2 * np.arange(d) + 1) / d - 1)
        mesh = np.meshgrid(*axes, indexing="ij")
        cols = [m.reshape(-1) for m in reversed(mesh)] + [np.ones(numel(dims))]
        return np.stack(cols, axis=1).astype(dtype)

    def run(self, inputs, outputs, workspace):
        theta = inputs[0]
        out = outputs[0]
        base = self.base
        if base is None:
            base = self.base_grid(tuple(out.shape[1:-1]), theta.dtype)
        n, r = theta.shape[0], theta.shape[1]
        np.matmul(base, theta.transpose(0, 2, 1), out=out.reshape(n, -1, r))


# ----------------------------------------------------------------------------- RoiAlign

@register("RoiAlign", since=10)
class RoiAlign(Kernel):
    """Average or max of bilinear samples over each bin of each region of interest.

    Opset 10 behaves as coordinate_transformation_mode 'output_half_pixel' (no -0.5 pixel shift,
    regions at least 1x1); from opset 16 the default is 'half_pixel'. Averaging is separable:
    per region, rows and columns get a weight matrix and the bins are two matrix products.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, rois, idx = inputs[:3]
        if x.rank != 4 or rois.rank != 2 or rois.shape[1] not in (4, None) or idx.rank != 1:
            raise ShapeError(f"{ctx.name}: RoiAlign needs X (N, C, H, W), rois (R, 4) and "
                             f"batch_indices (R,), got {x.shape}, {rois.shape}, {idx.shape}")
        if x.dtype.kind != "f":
            raise ShapeError(f"{ctx.name}: RoiAlign needs a float X, got {x.dtype}")
        return [TensorInfo(x.dtype, (rois.shape[0], x.shape[1], int(ctx.attr("output_height", 1)),
                                     int(ctx.attr("output_width", 1))))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        mode = str(ctx.attr("coordinate_transformation_mode",
                            "half_pixel" if ctx.opset >= 16 else "output_half_pixel"))
        if mode not in ("half_pixel", "output_half_pixel"):
            raise ShapeError(f"{ctx.name}: coordinate_transformation_mode {mode!r} is not one of "
                             f"half_pixel, output_half_pixel")
        self.half_pixel = mode == "half_pixel"
        self.mode = str(ctx.attr("mode", "avg")).lower()
        if self.mode not in ("avg", "max"):
            raise ShapeError(f"{ctx.name}: RoiAlign mode {self.mode!r} is not one of avg, max")
        self.oh = int(ctx.attr("output_height", 1))
        self.ow = int(ctx.attr("output_width", 1))
        self.ratio = int(ctx.attr("sampling_ratio", 0))
        self.spatial_scale = float(ctx.attr("spatial_scale", 1.0))

    @staticmethod
    def _samples(start: np.floating, length: np.floating, bins: int, size: int,
                 grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Along one axis, for the bins * grid samples: low and high pixel and their weights.

        Samples outside [-1, size] get zero weights, as in the reference.
        """
        bin_size = length / bins
        pos = (start + np.arange(bins)[:, None] * bin_size
               + (np.arange(grid)[None, :] + 0.5) * bin_size / grid).reshape(-1)
        valid = (pos >= -1.0) & (pos <= size)
        pos = np.maximum(pos, 0)
        low = pos.astype(np.int64)
        edge = low >= size - 1
        low = np.where(edge, size - 1, low)
        high = np.where(edge, size - 1, low + 1)
        frac = np.where(edge, 0, pos - low).astype(pos.dtype)
        return low, high, (1 - frac) * valid, frac * valid

    def run(self, inputs, outputs, workspace):
        x, rois, batch = inputs[:3]
        y = outputs[0]
        h, w = x.shape[2:]
        ft = rois.dtype
        offset = ft.type(0.5 if self.half_pixel else 0.0)
        scale = ft.type(self.spatial_scale)
        for r in range(rois.shape[0]):
            x0, y0, x1, y1 = (v * scale - offset for v in rois[r])
            rw, rh = x1 - x0, y1 - y0
            if not self.half_pixel:
                rw, rh = max(rw, ft.type(1)), max(rh, ft.type(1))
            gh = self.ratio if self.ratio > 0 else int(np.ceil(rh / self.oh))
            gw = self.ratio if self.ratio > 0 else int(np.ceil(rw / self.ow))
            if gh <= 0 or gw <= 0:
                y[r] = 0
                continue
            img = x[int(batch[r])]
            ylo, yhi, wyl, wyh = self._samples(y0, rh, self.oh, h, gh)
            xlo, xhi, wxl, wxh = self._samples(x0, rw, self.ow, w, gw)
            if self.mode == "avg":
                wy = np.zeros((self.oh, h), np.float64)
                bins_y = np.repeat(np.arange(self.oh), gh)
                np.add.at(wy, (bins_y, ylo), wyl)
                np.add.at(wy, (bins_y, yhi), wyh)
                wx = np.zeros((self.ow, w), np.float64)
                bins_x = np.repeat(np.arange(self.ow), gw)
                np.add.at(wx, (bins_x, xlo), wxl)
                np.add.at(wx, (bins_x, xhi), wxh)
                rows = np.flatnonzero(wy.any(axis=0))
                cols = np.flatnonzero(wx.any(axis=0))
                if not len(rows) or not len(cols):
                    y[r] = 0
                    continue
                r0, r1, c0, c1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
                part = np.matmul(wy[:, r0:r1].astype(x.dtype), img[:, r0:r1, c0:c1])
                np.matmul(part, (wx[:, c0:c1].T / (gh * gw)).astype(x.dtype), out=y[r])
            else:
                best = None
                for yi, wyi in ((ylo, wyl), (yhi, wyh)):
                    for xi, wxi in ((xlo, wxl), (xhi, wxh)):
                        v = img[:, yi[:, None], xi[None, :]] * (wyi[:, None] * wxi[None, :])
                        best = v if best is None else np.maximum(best, v)
                y[r] = best.reshape(-1, self.oh, gh, self.ow, gw).max(axis=(2, 4))
