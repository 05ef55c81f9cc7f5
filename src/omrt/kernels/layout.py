"""Layout kernels: joining, cutting, permuting, repeating, block moves, padding and cropping.

Concat, Split, Transpose, Expand, Tile, DepthToSpace, SpaceToDepth, ReverseSequence, Pad and
CenterCropPad copy elements to new positions without changing them; Trilu and EyeLike lay out a
triangle or a diagonal.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import KernelError, ShapeError
from ..native.bindings import COPY_BLOCKS
from .base import (Dim, Kernel, OpContext, Shape, TensorInfo, broadcast_shapes, normalize_axis,
                   onnx_dtype, register, run_bound)
from .shape import (_ints, _known, _length, _merge, _normalize_axes, _present, _same_memory,
                    _shape_from)


# ----------------------------------------------------------------------------- joining, cutting, repeating


@register("Concat", since=4)
@register("Concat", since=1)
class Concat(Kernel):
    """Join along `axis`: each input is written into its slice of the output.

    When all dims before `axis` are 1, each input's slice is one run of the output's bytes: the
    planner may place the input there (`input_offsets`), and `run` then leaves it alone.
    """

    @classmethod
    def infer(cls, ctx, inputs):
        xs = [x for x in inputs if x is not None]
        first = xs[0]
        axis = normalize_axis(int(ctx.attrs.get("axis", 1)), first.rank, ctx.name)
        dims = list(first.shape)
        for x in xs[1:]:
            if x.rank != first.rank:
                raise ShapeError(f"{ctx.name}: Concat inputs have ranks {first.rank} and {x.rank}; "
                                 f"all inputs need the same rank")
            for i, d in enumerate(x.shape):
                if i != axis:
                    dims[i] = _merge(dims[i], d, ctx.name, f"Concat inputs differ on axis {i}")
        along = [x.shape[axis] for x in xs]
        dims[axis] = sum(along) if all(isinstance(d, int) for d in along) else None
        return [TensorInfo(first.dtype, tuple(dims))]

    @classmethod
    def input_offsets(cls, ctx, inputs, outputs):
        axis = normalize_axis(int(ctx.attrs.get("axis", 1)), outputs[0].rank, ctx.name)
        if not all(d == 1 for d in outputs[0].shape[:axis]):
            return {}
        offsets, at = {}, 0
        for i, x in enumerate(inputs):
            if x is None:
                continue
            offsets[i] = at
            if not x.static:
                break
            at += x.nbytes
        return offsets

    native_units = ("elementwise",)

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attrs.get("axis", 1)), outputs[0].rank, ctx.name)
        float32 = outputs[0].dtype == np.float32 and ctx.native is not None
        self.native_copy = ctx.native.get(COPY_BLOCKS) if float32 else None

    def bind(self, inputs, outputs, workspace):
        """Each input's copy into its slice of the output, checked, when all are float32 and
        C-contiguous and none overlaps the output (but input 0 already in place); else None."""
        out = outputs[0]
        if self.native_copy is None or not out.flags.c_contiguous or out.size == 0:
            return None
        flat, blocks = out.reshape(-1), math.prod(out.shape[:self.axis])
        pitch, pos, calls = out.size // blocks, 0, []
        for x in inputs:
            if x is None or x.size == 0:
                continue
            size = x.size // blocks
            if not (blocks == 1 and _same_memory(x, flat[pos:])):
                if x.dtype != np.float32 or not x.flags.c_contiguous or np.may_share_memory(x, out):
                    return None
                calls.append(self.native_copy.bind(x, flat[pos:], blocks, size, pitch))
            pos += size
        return calls

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        out, pos = outputs[0], 0
        lead = (slice(None),) * self.axis
        in_place = all(d == 1 for d in out.shape[:self.axis])
        for x in inputs:
            if x is None:
                continue
            n = x.shape[self.axis]
            part = out[lead + (slice(pos, pos + n),)]
            if not (in_place and x.size and _same_memory(x, part)):
                part[...] = x
            pos += n


@register("Transpose", since=1)
class Transpose(Kernel):
    """Permute axes (default: reverse them)."""

    @staticmethod
    def perm(ctx: OpContext, rank: int) -> list[int]:
        perm = ctx.attrs.get("perm")
        if perm is None:
            return list(range(rank))[::-1]
        perm = _ints(perm)
        if sorted(perm) != list(range(rank)):
            raise ShapeError(f"{ctx.name}: Transpose perm {perm} is not a permutation of "
                             f"0..{rank - 1}; list each axis once")
        return perm

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, tuple(x.shape[p] for p in cls.perm(ctx, x.rank)))]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axes = self.perm(ctx, inputs[0].rank)

    def run(self, inputs, outputs, workspace):
        np.copyto(outputs[0], inputs[0].transpose(self.axes))


@register("Expand", since=8)
class Expand(Kernel):
    """Broadcast the input to a shape (numpy rules: either side's 1s stretch)."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        dims, n = _shape_from(inputs[1], ctx.name, "Expand")
        if dims is not None:
            return [TensorInfo(x.dtype, broadcast_shapes(x.shape, tuple(dims), name=ctx.name))]
        rank = max(n, x.rank)
        padded = (1,) * (rank - x.rank) + x.shape
        return [TensorInfo(x.dtype, tuple(None if d == 1 else d for d in padded))]

    def run(self, inputs, outputs, workspace):
        np.copyto(outputs[0], np.broadcast_to(inputs[0], outputs[0].shape))


@register("Tile", since=6)
class Tile(Kernel):
    """Repeat the input `repeats[i]` times along each axis i."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        reps = inputs[1].value
        if reps is None:
            return [TensorInfo(x.dtype, (None,) * x.rank)]
        reps = _ints(reps)
        if len(reps) != x.rank or min(reps, default=0) < 0:
            raise ShapeError(f"{ctx.name}: Tile repeats {reps} need one non-negative count per "
                             f"axis of the rank-{x.rank} input")
        return [TensorInfo(x.dtype, tuple(d if r == 1 else d * r if isinstance(d, int) else None
                                          for d, r in zip(x.shape, reps)))]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        reps = _ints(inputs[1])
        # out seen as (r0, d0, r1, d1, ...) receives x seen as (1, d0, 1, d1, ...) by broadcasting.
        tiled = [v for r, d in zip(reps, x.shape) for v in (r, d)]
        spread = [v for d in x.shape for v in (1, d)]
        np.copyto(out.reshape(tiled), x.reshape(spread))


@register("Split", since=18)
@register("Split", since=13)
@register("Split", since=2)
class Split(Kernel):
    """Cut along `axis` into parts of the given sizes, or into equal parts (the last one smaller).

    The number of parts without sizes comes from `num_outputs` (an attribute from opset 18),
    else from the node's number of outputs.
    """

    @classmethod
    def sizes(cls, ctx: OpContext, inputs: Sequence, dim: Dim) -> list[Dim]:
        """Part sizes along the axis (None entries when not known before run time)."""
        if ctx.opset < 13:
            split = ctx.attrs.get("split")
        elif _present(inputs, 1):
            split = _known(inputs, 1)
            if split is None:
                n = _length(inputs[1])
                if n is None:
                    raise ShapeError(f"{ctx.name}: Split needs the length of its split input at "
                                     f"compile time; it is the number of outputs")
                return [None] * n
        else:
            split = None
        if split is not None:
            split = _ints(split)
            if isinstance(dim, int) and sum(split) != dim:
                raise ShapeError(f"{ctx.name}: Split sizes {split} sum to {sum(split)}, the axis "
                                 f"has {dim}; make them add up")
            return list(split)
        n = int(ctx.attrs.get("num_outputs", ctx.n_outputs))
        if not isinstance(dim, int):
            return [None] * n
        part = -(-dim // n)
        last = dim - part * (n - 1)
        if last < 0 or (ctx.opset < 18 and dim % n):
            raise ShapeError(f"{ctx.name}: Split cannot cut an axis of {dim} into {n} parts")
        return [part] * (n - 1) + [last]

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        axis = normalize_axis(int(ctx.attrs.get("axis", 0)), x.rank, ctx.name)
        return [TensorInfo(x.dtype, x.shape[:axis] + (s,) + x.shape[axis + 1:])
                for s in cls.sizes(ctx, inputs, x.shape[axis])]

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attrs.get("axis", 0)), inputs[0].rank, ctx.name)

    def run(self, inputs, outputs, workspace):
        x, pos = inputs[0], 0
        lead = (slice(None),) * self.axis
        for out in outputs:
            n = out.shape[self.axis]
            np.copyto(out, x[lead + (slice(pos, pos + n),)])
            pos += n


# ----------------------------------------------------------------------------- generators, layout


@register("Trilu", since=14)
class Trilu(Kernel):
    """Keep the upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims; zero the rest."""

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        if x.rank < 2:
            raise ShapeError(f"{ctx.name}: Trilu needs a tensor of rank >= 2, got {x.shape}")
        return [TensorInfo(x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        k = int(inputs[1]) if _present(inputs, 1) else 0
        rows, cols = x.shape[-2:]
        diag = np.arange(cols)[None, :] - np.arange(rows)[:, None]
        drop = diag < k if self.ctx.attrs.get("upper", 1) else diag > k
        if not _same_memory(x, out):
            np.copyto(out, x)
        np.copyto(out, np.zeros((), out.dtype), where=drop)


@register("EyeLike", since=9)
class EyeLike(Kernel):
    """A 2-D tensor of the input's shape with ones on diagonal k, zeros elsewhere."""

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        if x.rank != 2:
            raise ShapeError(f"{ctx.name}: EyeLike needs a 2-D input, got shape {x.shape}")
        code = ctx.attrs.get("dtype")
        return [TensorInfo(x.dtype if code is None else onnx_dtype(code, ctx), x.shape)]

    def run(self, inputs, outputs, workspace):
        out = outputs[0]
        rows, cols = out.shape
        k = int(self.ctx.attrs.get("k", 0))
        out.fill(0)
        # Diagonal k starts at flat offset k (k >= 0) or -k * cols and steps by cols + 1.
        start, count = (k, min(rows, cols - k)) if k >= 0 else (-k * cols, min(cols, rows + k))
        if count > 0:
            out.reshape(-1)[start:start + count * (cols + 1):cols + 1] = 1


class _BlockMove(Kernel):
    """DepthToSpace / SpaceToDepth: a 6-D reshape and a transpose, copied once into `out`."""

    @classmethod
    def plan(cls, ctx: OpContext, shape: Shape) -> tuple[tuple, tuple[int, ...], Shape]:
        """(6-D view of the input, its permutation, the 4-D output shape)."""
        raise NotImplementedError

    @staticmethod
    def params(ctx: OpContext, shape: Shape) -> tuple[int, bool]:
        """(blocksize, DCR mode?) after checking the input is 4-D."""
        if len(shape) != 4:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs a 4-D NCHW input, got {tuple(shape)}")
        bs = int(ctx.attrs["blocksize"])
        mode = ctx.attrs.get("mode", "DCR")
        if bs < 1 or mode not in ("DCR", "CRD"):
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs blocksize >= 1 and mode DCR or CRD "
                             f"(got {bs}, {mode!r})")
        return bs, mode == "DCR"

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        return [TensorInfo(x.dtype, cls.plan(ctx, x.shape)[2])]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        six, perm, _ = self.plan(self.ctx, x.shape)
        np.copyto(out.reshape([six[p] for p in perm]), x.reshape(six).transpose(perm))


def _mul(d: Dim, k: int) -> Dim:
    return d * k if isinstance(d, int) else d if k == 1 else None


def _div(d: Dim, k: int, ctx: OpContext, what: str) -> Dim:
    if isinstance(d, int):
        if d % k:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} {what} {d} is not divisible by {k}")
        return d // k
    return d if k == 1 else None


@register("DepthToSpace", since=11)
@register("DepthToSpace", since=1)
class DepthToSpace(_BlockMove):
    """Move channel blocks into blocksize x blocksize spatial blocks (DCR or CRD channel order)."""

    @classmethod
    def plan(cls, ctx, shape):
        bs, dcr = cls.params(ctx, shape)
        b, c, h, w = shape
        c2 = _div(c, bs * bs, ctx, "channels")
        if dcr:
            six, perm = (b, bs, bs, c2, h, w), (0, 3, 4, 1, 5, 2)
        else:
            six, perm = (b, c2, bs, bs, h, w), (0, 1, 4, 2, 5, 3)
        return six, perm, (b, c2, _mul(h, bs), _mul(w, bs))


@register("SpaceToDepth", since=28)
@register("SpaceToDepth", since=1)
class SpaceToDepth(_BlockMove):
    """Move blocksize x blocksize spatial blocks into channels (DCR; CRD from opset 28)."""

    @classmethod
    def plan(cls, ctx, shape):
        bs, dcr = cls.params(ctx, shape)
        b, c, h, w = shape
        h2, w2 = _div(h, bs, ctx, "height"), _div(w, bs, ctx, "width")
        perm = (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
        return (b, c, h2, bs, w2, bs), perm, (b, _mul(c, bs * bs), h2, w2)


@register("ReverseSequence", since=10)
class ReverseSequence(Kernel):
    """Reverse the first sequence_lens[b] steps along `time_axis` of each batch entry b."""

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx, inputs):
        x, lens = inputs[0], inputs[1]
        t, b = int(ctx.attrs.get("time_axis", 0)), int(ctx.attrs.get("batch_axis", 1))
        if x.rank < 2 or {t, b} != {0, 1}:
            raise ShapeError(f"{ctx.name}: ReverseSequence needs rank >= 2 and time/batch axes 0 "
                             f"and 1 in some order (got rank {x.rank}, time {t}, batch {b})")
        _merge(x.shape[b], lens.shape[0] if lens.rank == 1 else None, ctx.name,
               "sequence_lens needs one length per batch entry")
        return [TensorInfo(x.dtype, x.shape)]

    def run(self, inputs, outputs, workspace):
        x, lens = inputs[0], inputs[1]
        out = outputs[0]
        t = int(self.ctx.attrs.get("time_axis", 0))
        if not _same_memory(x, out):
            np.copyto(out, x)
        steps = x.shape[t]
        for i, n in enumerate(lens.tolist()):
            if not 0 <= n <= steps:
                raise KernelError(f"{self.ctx.name}: sequence length {n} of batch entry {i} is "
                                  f"outside [0, {steps}]")
            where = (slice(n), i) if t == 0 else (i, slice(n))
            out[where] = x[where][::-1]


# ----------------------------------------------------------------------------- padding and cropping


def _pad_source(mode: str, pos: np.ndarray, n: int, name: str) -> np.ndarray:
    """For positions outside [0, n) along an axis, the index in [0, n) whose value they copy."""
    if mode == "edge":
        return np.clip(pos, 0, n - 1)
    if mode == "wrap":
        return pos % n
    if mode == "reflect":
        if n == 1:
            return np.zeros_like(pos)
        period = 2 * (n - 1)
        m = pos % period
        return np.where(m < n, m, period - m)
    raise KernelError(f"{name}: Pad mode {mode!r} is unknown; use constant, reflect, edge or wrap")


@register("Pad", since=19)
@register("Pad", since=18)
@register("Pad", since=11)
@register("Pad", since=2)
@register("Pad", since=1)
class Pad(Kernel):
    """Pad (or, with negative pads, crop) each axis: constant, reflect, edge or wrap (opset 19).

    pads are [x1_begin, x2_begin, ..., x1_end, x2_end, ...] over `axes` (opset 18; all axes
    otherwise): an attribute before opset 11, an input after. Negative pads remove elements
    first; reflect, edge and wrap then read the remaining elements.
    """

    @staticmethod
    def widths(ctx: OpContext, inputs: Sequence, rank: int) -> tuple[list[int], list[int]] | None:
        """(before, after) per axis, or None when pads or axes are not known yet."""
        if ctx.opset < 11:
            pads, axes = ctx.attrs.get("pads" if ctx.opset >= 2 else "paddings"), None
        else:
            pads = _known(inputs, 1)
            axes = _known(inputs, 3) if ctx.opset >= 18 else None
            if pads is None or (axes is None and ctx.opset >= 18 and _present(inputs, 3)):
                return None
        pads = _ints(pads)
        axes = list(range(rank)) if axes is None else _normalize_axes(_ints(axes), rank, ctx.name)
        if len(pads) != 2 * len(axes):
            raise ShapeError(f"{ctx.name}: Pad needs 2 pads per padded axis ({len(axes)} axes), "
                             f"got {len(pads)}")
        before, after = [0] * rank, [0] * rank
        for i, a in enumerate(axes):
            before[a], after[a] = pads[i], pads[len(axes) + i]
        return before, after

    @classmethod
    def infer(cls, ctx, inputs):
        x = inputs[0]
        w = cls.widths(ctx, inputs, x.rank)
        if w is None:
            return [TensorInfo(x.dtype, (None,) * x.rank)]
        dims: list[Dim] = []
        for d, b, a in zip(x.shape, *w):
            if isinstance(d, int) and d + b + a < 0:
                raise ShapeError(f"{ctx.name}: Pad crops {-(b + a)} from an axis of size {d}")
            dims.append(d + b + a if isinstance(d, int) else d if b + a == 0 else None)
        return [TensorInfo(x.dtype, tuple(dims))]

    def fill_value(self, inputs: Sequence[np.ndarray | None]) -> object:
        if self.ctx.opset < 11:
            return self.ctx.attrs.get("value", 0.0)
        if _present(inputs, 2) and inputs[2].size:
            return inputs[2].reshape(-1)[0]
        return "" if inputs[0].dtype.kind == "O" else 0

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        before, after = self.widths(self.ctx, inputs, x.ndim)
        src = tuple(slice(max(-b, 0), d - max(-a, 0)) for d, b, a in zip(x.shape, before, after))
        core = tuple(slice(max(b, 0), max(b, 0) + s.stop - s.start) for b, s in zip(before, src))
        out[core] = x[src]
        mode = self.ctx.attrs.get("mode", "constant")
        for i, c in enumerate(core):
            size, lead = out.shape[i], (slice(None),) * i
            if c.start == 0 and c.stop == size:
                continue
            if mode == "constant":
                value = self.fill_value(inputs)
                out[lead + (slice(0, c.start),)] = value
                out[lead + (slice(c.stop, size),)] = value
                continue
            n = c.stop - c.start
            if n == 0:
                raise KernelError(f"{self.ctx.name}: Pad cannot {mode}-pad axis {i}: no elements "
                                  f"are left to copy from")
            # Axes before i are padded already (whole extent); axes after i only in their core.
            pads = np.r_[np.arange(c.start), np.arange(c.stop, size)]
            src_idx = _pad_source(mode, pads - c.start, n, self.ctx.name)
            band = out[lead + (c,) + core[i + 1:]]
            out[lead + (pads,) + core[i + 1:]] = np.take(band, src_idx, axis=i)


@register("CenterCropPad", since=18)
class CenterCropPad(Kernel):
    """Crop or zero-pad the listed axes to the given sizes, keeping the content centred.

    Odd differences put the extra element at the end: a crop starts at (dim - size) // 2 and a
    pad puts (size - dim) // 2 zeros first.
    """

    @staticmethod
    def axes(ctx: OpContext, rank: int) -> list[int]:
        axes = ctx.attrs.get("axes")
        return list(range(rank)) if axes is None else _normalize_axes(_ints(axes), rank, ctx.name)

    @classmethod
    def infer(cls, ctx, inputs):
        x, target = inputs[0], inputs[1]
        axes = cls.axes(ctx, x.rank)
        dims = list(x.shape)
        sizes = [None] * len(axes) if target.value is None else _ints(target.value)
        if len(sizes) != len(axes) or any(s is not None and s < 0 for s in sizes):
            raise ShapeError(f"{ctx.name}: CenterCropPad needs one non-negative size per axis "
                             f"{axes}, got {sizes}")
        for a, s in zip(axes, sizes):
            dims[a] = s
        return [TensorInfo(x.dtype, tuple(dims))]

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        for a in self.axes(self.ctx, x.ndim):
            d, t = x.shape[a], out.shape[a]
            if t < d:
                src[a] = slice((d - t) // 2, (d - t) // 2 + t)
            elif t > d:
                dst[a] = slice((t - d) // 2, (t - d) // 2 + d)
        if any(s != slice(None) for s in dst):
            out.fill(0)
        out[tuple(dst)] = x[tuple(src)]
