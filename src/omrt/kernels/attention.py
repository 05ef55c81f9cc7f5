"""Transformer building blocks: Attention (scaled dot product with masks, causal and sliding
windows, grouped KV heads, KV caches, softcap), RotaryEmbedding, SwiGLU, TensorScatter (KV cache
updates), LinearAttention and CausalConvWithState (recurrent blocks of linear-attention models).

Attention keeps one score matrix [B, Hq, Sq, T] in the workspace and does everything else in
place on it: grouped-query heads are a free reshape of Q ([B, Hkv, G, Sq, D] against
[B, Hkv, 1, T, D] keys), 3-D inputs are strided views, and a past cache is either concatenated
straight into present_key/present_value or read as a second block of keys and values.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import KernelError, ShapeError
from ..memory import align
from ..native.bindings import ATTENTION
from . import parallel
from .packed import PANEL, STRIP, gemm_tile
from .base import (Dim, Kernel, OpContext, Shape, TensorInfo, broadcast_shapes, normalize_axis, numel,
                   onnx_dtype, register, run_bound)

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def _is_float(dtype: np.dtype) -> bool:
    """float16/32/64 and ml_dtypes' bfloat16."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _native(dtype: np.dtype) -> bool:
    """True for the float types numpy computes with directly (no widening)."""
    return dtype in (_F32, _F64)


def _round_to(a: np.ndarray, dtype: np.dtype) -> None:
    """Round `a` to the precision of the narrower `dtype` in place (numpy's buffered cast, no copy)."""
    np.positive(a, out=a, dtype=dtype)


def _mul(*dims: Dim) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d if isinstance(out, int) and isinstance(d, int) else None
    return out


def _add(a: Dim, b: Dim) -> Dim:
    return a + b if isinstance(a, int) and isinstance(b, int) else None


def _div(ctx: OpContext, a: Dim, b: int, what: str) -> Dim:
    if not isinstance(a, int):
        return None
    if b <= 0 or a % b:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} {what} {a} is not a multiple of the head count {b}")
    return a // b


class Scratch:
    """Named, 64-byte aligned arrays of mixed dtypes laid out in one workspace."""

    def __init__(self) -> None:
        self.specs: list[tuple[str, np.dtype, tuple[int, ...], int]] = []
        self.size = 0

    def add(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.specs.append((name, np.dtype(dtype), tuple(shape), self.size))
        self.size += align(numel(shape) * np.dtype(dtype).itemsize)

    def views(self, workspace: np.ndarray | None) -> dict[str, np.ndarray]:
        return {name: workspace[off:off + numel(shape) * dt.itemsize].view(dt).reshape(shape)
                for name, dt, shape, off in self.specs}


TILE_VALUES = 16
"""The native loop runs on omrt's GEMM tile (csrc/attention.c) when each head's values are a
multiple of this many (the tile reads V's rows where they lie, 16 floats at a time), its keys at
most TILE_KEYS and its threads at most parallel.MAX_SLOTS (a slot each). Elsewhere, or where the
CPU has no vector tile, it multiplies through BLAS."""

TILE_KEYS = 512
"""Keys at most for the tile path: its softmax passes over the whole transposed score block of a
head (4 MiB over 1024 queries and keys), past L2, where BLAS's path keeps each row of scores in
L1. On an Intel Xeon (AVX-512, 2 MiB L2), one Attention node, heads of 64, one thread: 128 queries
and keys took 0.83-0.84 of the BLAS path's time, 512 0.87-0.88, 1024 0.96-1.05 (runs apart), 2048
0.99-1.01: past 512 the gain is gone."""


def tile_slot_floats(queries: int, keys: int, head: int) -> int:
    """Floats of a thread's slot on the native loop's tile path (csrc/attention.c, attention_slot):
    Q^T and K^T, the queries padded to whole strips and panels, the keys to panels; the scores
    transposed; two rows of padded queries."""
    sp = max(-(-queries // STRIP) * STRIP, -(-queries // PANEL) * PANEL)
    tp = -(-keys // PANEL) * PANEL
    return head * (sp + tp) + keys * sp + 2 * sp


def _padded(inputs: Sequence, n: int) -> list:
    return list(inputs) + [None] * (n - len(inputs))


# ----------------------------------------------------------------------------- Attention


@register("Attention", since=1, domain="omrt")
@register("Attention", since=23)
class Attention(Kernel):
    """softmax(Q K^T * scale + bias) V per head, with optional past/present KV caches.

    omrt::Attention is the same op for models of any opset: the compiler rewrites the unfused
    form (MatMul, scale, mask Add, Softmax, MatMul; omrt.compiler.passes.fuse_attention) into it.
    In float32 without caches, causal or window masks, softcap or the scores as an output, the
    native loop (csrc/attention.c) does each (batch, head) in one pass on the workers.

    The bias composes `attn_mask` (boolean: False -> -inf; float: added; a last axis shorter
    than the total sequence is padded with -inf), `is_causal` ("query i attends key j iff
    j <= i + offset", offset = past length, or nonpad_kv_seqlen - q_sequence_length per batch
    for an external cache), the opset-25 sliding window and the nonpad_kv_seqlen padding.
    "A fully-masked query row ... produces a zero output row, not NaN", also in mode 3 of
    qk_matmul_output (0: scores, 1: after softcap, 2: after the bias, 3: after softmax).
    float16/bfloat16 inputs compute in float32 with results rounded where the reference rounds
    (scaled Q and K, scores, probabilities).
    """

    native_units = ("attention",)

    @staticmethod
    def _dims(ctx: OpContext, q: TensorInfo, k: TensorInfo, v: TensorInfo) -> tuple[Dim, ...]:
        """(batch, q heads, kv heads, q length, kv length, head size, v head size)."""
        if q.rank == 4:
            if ctx.opset >= 25 and ("q_num_heads" in ctx.attrs or "kv_num_heads" in ctx.attrs):
                raise ShapeError(f"{ctx.name}: q_num_heads and kv_num_heads must not be given for "
                                 f"4-D Attention inputs (opset 25)")
            return (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3])
        if "q_num_heads" not in ctx.attrs or "kv_num_heads" not in ctx.attrs:
            raise ShapeError(f"{ctx.name}: 3-D Attention inputs need the q_num_heads and kv_num_heads "
                             f"attributes")
        hq, hkv = int(ctx.attrs["q_num_heads"]), int(ctx.attrs["kv_num_heads"])
        return (q.shape[0], hq, hkv, q.shape[1], k.shape[1], _div(ctx, q.shape[2], hq, "Q hidden size"),
                _div(ctx, v.shape[2], hkv, "V hidden size"))

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        q, k, v, mask, past_k, past_v, nonpad = _padded(inputs, 7)
        if not (q.rank == k.rank == v.rank) or q.rank not in (3, 4):
            raise ShapeError(f"{ctx.name}: Attention Q, K, V must all be 3-D or all 4-D, got ranks "
                             f"{q.rank}, {k.rank}, {v.rank}")
        if not _is_float(q.dtype) or k.dtype != q.dtype or v.dtype != q.dtype:
            raise ShapeError(f"{ctx.name}: Attention Q, K, V must share one float type, got "
                             f"{q.dtype}, {k.dtype}, {v.dtype}")
        if (past_k is None) != (past_v is None):
            raise ShapeError(f"{ctx.name}: Attention past_key and past_value go together; give both "
                             f"or neither")
        if nonpad is not None and past_k is not None:
            raise ShapeError(f"{ctx.name}: Attention nonpad_kv_seqlen cannot be combined with a past "
                             f"cache")
        if mask is not None and mask.dtype != np.bool_ and mask.dtype != q.dtype:
            raise ShapeError(f"{ctx.name}: Attention attn_mask must be bool or {q.dtype}, got {mask.dtype}")
        b, hq, hkv, sq, skv, d, dv = cls._dims(ctx, q, k, v)
        if isinstance(hq, int) and isinstance(hkv, int) and (hkv < 1 or hq % hkv):
            raise ShapeError(f"{ctx.name}: Attention needs q heads ({hq}) to be a multiple of kv heads "
                             f"({hkv})")
        t = _add(past_k.shape[2] if past_k is not None else 0, skv)
        y = (b, sq, _mul(hq, dv)) if q.rank == 3 else (b, hq, sq, dv)
        return [TensorInfo(q.dtype, y), TensorInfo(q.dtype, (b, hkv, t, d)),
                TensorInfo(q.dtype, (b, hkv, t, dv)), TensorInfo(q.dtype, (b, hq, sq, t))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        q, k, v, mask, past_k, past_v, nonpad = _padded(inputs, 7)
        self.rank = q.rank
        b, hq, hkv, sq, skv, d, dv = self._dims(ctx, q, k, v)
        self.b, self.hq, self.hkv, self.sq, self.skv, self.d, self.dv = b, hq, hkv, sq, skv, d, dv
        self.g = hq // hkv
        self.past = past_k.shape[2] if past_k is not None else 0
        self.t = t = self.past + skv
        scale = ctx.attr("scale")
        self.scale = float(scale) if scale is not None else 1 / math.sqrt(d)
        self.softcap = float(ctx.attr("softcap", 0.0))
        self.causal = bool(ctx.attr("is_causal", 0))
        self.left = int(ctx.attr("left_window_size", -1))
        self.right = int(ctx.attr("right_window_size", -1))
        self.mode = int(ctx.attr("qk_matmul_output_mode", 0))
        if self.mode not in (0, 1, 2, 3):
            raise ShapeError(f"{ctx.name}: Attention qk_matmul_output_mode must be 0-3, got {self.mode}")
        self.io = q.dtype
        self.mm = q.dtype if _native(q.dtype) else _F32
        precision = ctx.attr("softmax_precision")
        self.precision = None if precision is None else onnx_dtype(precision, ctx)
        self.ct = _F64 if self.mm == _F64 or (precision is not None and self.precision == _F64) else _F32
        kd = k.shape[3] if k.rank == 4 else _div(ctx, k.shape[2], hkv, "K hidden size")
        if kd != d or k.shape[:-1] != v.shape[:-1] or (past_k is not None and (
                tuple(past_k.shape) != (b, hkv, self.past, d) or
                tuple(past_v.shape) != (b, hkv, self.past, dv))):
            raise ShapeError(f"{ctx.name}: Attention shapes disagree: Q {q.shape}, K {k.shape}, V {v.shape}"
                             f", past_key {past_k and past_k.shape}, past_value {past_v and past_v.shape};"
                             f" Q and K need one head size, K and V one length, the caches "
                             f"(batch, kv_heads, past_length, head_size)")
        if mask is not None:
            if mask.rank > 4 or mask.shape[-1] > t:
                raise ShapeError(f"{ctx.name}: Attention attn_mask of shape {mask.shape} must broadcast "
                                 f"to (batch, heads, {sq}, {t}) with a last axis of at most {t}")
            self.mask4 = (1,) * (4 - mask.rank) + tuple(mask.shape)
        parts: list[Shape] = []
        if mask is not None:
            parts.append(self.mask4[:3] + (t,))
        if self.causal or self.left >= 0 or self.right >= 0:
            parts.append((sq, t))
        if nonpad is not None:
            parts.append((b, 1, 1, t))
        self.bias_shape = None
        if parts:
            shape = broadcast_shapes(*parts, name=ctx.name)
            self.bias_shape = (1,) * (4 - len(shape)) + tuple(shape)
            if any(got not in (1, want) for got, want in zip(self.bias_shape, (b, hq, sq))):
                raise ShapeError(f"{ctx.name}: Attention attn_mask of shape {mask.shape} does not "
                                 f"broadcast to (batch, heads, q_sequence_length, total_length) = "
                                 f"({b}, {hq}, {sq}, {t})")
        scratch = Scratch()
        scratch.add("s", self.ct, (b, hq, sq, t))
        if self.ct != self.mm:
            scratch.add("p", self.mm, (b, hq, sq, t))
        if self.bias_shape is not None:
            scratch.add("bias", self.ct, self.bias_shape)
        self.cast = not _native(q.dtype)
        if self.cast:
            scratch.add("q", _F32, (b, hkv, self.g, sq, d))
            scratch.add("k", _F32, (b, hkv, t, d))
            scratch.add("v", _F32, (b, hkv, t, dv))
        # Y accumulates in scratch when it needs a cast or when a past cache may be read as a
        # second block (whether present_key/present_value exist is only known at run time)
        y5 = (b, hkv, self.g, sq, dv)
        if self.cast or self.past:
            scratch.add("acc", self.mm, y5)
        if self.past and not self.cast:
            scratch.add("part", self.mm, y5)
        self.scratch = scratch
        self.native_attention = self._native_attention(ctx, q, mask, past_k, nonpad)
        on_tile = self.native_attention is not None and dv % TILE_VALUES == 0 and t <= TILE_KEYS
        self.slot_floats = tile_slot_floats(sq, t, d) if on_tile else 0
        self.tiles = on_tile and gemm_tile(ctx.native) > 0

    def _native_attention(self, ctx: OpContext, q: TensorInfo, mask: TensorInfo | None, past_k: TensorInfo | None,
                          nonpad: TensorInfo | None):
        """The native loop when it computes this node: float32, no cache, no causal, window or
        padding bias, no softcap, the softmax in float32, and a float mask over every key or none."""
        fn = ctx.native.get(ATTENTION) if ctx.native is not None else None
        plain = (q.dtype == _F32 and past_k is None and nonpad is None and not self.causal and self.left < 0
                 and self.right < 0 and self.softcap == 0 and self.ct == _F32)
        masked = mask is None or (mask.dtype == _F32 and mask.shape[-1] == self.t)
        static = all(isinstance(d, int) for d in (self.b, self.hq, self.hkv, self.sq, self.t, self.d, self.dv))
        return fn if plain and masked and static else None

    def workspace(self) -> int:
        return max(self.scratch.size, align(parallel.MAX_SLOTS * self.slot_floats * 4))

    def fit_workspace(self, nbytes: int) -> bool:
        """A plan without room for the tile path's slots (an older omrt's) runs through BLAS."""
        if align(parallel.MAX_SLOTS * self.slot_floats * 4) > nbytes:
            self.slot_floats, self.tiles = 0, False
        return super().fit_workspace(nbytes)

    def bind(self, inputs, outputs, workspace):
        """The native loop's call over these arrays, checked, when it computes the node (no
        other output asked for, contiguous arrays); else None."""
        q, k, v, mask = _padded(inputs, 7)[:4]
        y = outputs[0]
        if (self.native_attention is None or any(o is not None for o in outputs[1:])
                or not all(x.flags.c_contiguous for x in (q, k, v, y) + ((mask,) if mask is not None else ()))):
            return None
        strides = [[s // 4 for s in self._heads_first(x, heads).strides[:3]]
                   for x, heads in ((q, self.hq), (k, self.hkv), (v, self.hkv), (y, self.hq))]
        mask_strides = [0, 0, 0]
        if mask is not None:
            m4 = mask.reshape(self.mask4)
            mask_strides = [s // 4 if n > 1 else 0 for s, n in zip(m4.strides[:3], m4.shape[:3])]
        threads = parallel.native_threads(2 * self.b * self.hq * self.sq * self.t * (self.d + self.dv))
        # the tile path has a slot for MAX_SLOTS threads; per head it is not so much faster (about
        # 1.15x) that it should give up more threads that BLAS's path would use
        tiles = self.tiles and threads <= parallel.MAX_SLOTS
        scores = workspace if tiles else self.scratch.views(workspace)["s"]
        return [self.native_attention.bind(q, k, v, mask, y, scores, self.b, self.hq, self.g, self.sq, self.t, self.d,
                                           self.dv, *strides[0], *strides[1], *strides[2], *strides[3],
                                           *mask_strides, self.scale, int(tiles), threads)]

    # -- layout helpers

    def _heads_first(self, x: np.ndarray, heads: int) -> np.ndarray:
        """[B, S, H*D] (3-D input) or [B, H, S, D] as a [B, H, S, D] view."""
        if self.rank == 4:
            return x
        return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)

    def _grouped(self, x: np.ndarray, last: int) -> np.ndarray:
        """Q or Y ([B, Sq, Hq*last] or [B, Hq, Sq, last]) as a [B, Hkv, G, Sq, last] view."""
        if self.rank == 4:
            return x.reshape(self.b, self.hkv, self.g, self.sq, last)
        return x.reshape(self.b, self.sq, self.hkv, self.g, last).transpose(0, 2, 3, 1, 4)

    def _blocks(self, past: np.ndarray | None, new: np.ndarray, present: np.ndarray | None
                ) -> list[tuple[int, np.ndarray]]:
        """Keys or values as (start position, [B, Hkv, n, d] array) pieces covering all T positions."""
        if present is not None:
            if past is not None:
                present[:, :, :self.past] = past
            present[:, :, self.past:] = new
            return [(0, present)]
        if past is None or self.past == 0:
            return [(0, new)]
        return [(0, past), (self.past, new)]

    # -- steps

    def _bias(self, bias: np.ndarray, mask: np.ndarray | None, nonpad: np.ndarray | None) -> None:
        bias.fill(0)
        if mask is not None:
            m = mask.shape[-1]
            mk = mask.reshape(self.mask4)
            head = bias[..., :m]
            if mask.dtype == np.bool_:
                np.copyto(head, -np.inf, where=~mk)
            else:
                head += mk.astype(self.ct)
            bias[..., m:] = -np.inf
        t = np.arange(self.t)
        if nonpad is not None:
            lengths = nonpad.reshape(-1, 1, 1, 1).astype(np.int64)
            offset = lengths - self.sq
        else:
            offset = self.past
        allowed = None
        if self.causal or self.left >= 0 or self.right >= 0:
            pos = np.arange(self.sq)[:, None] + offset
            allowed = np.ones(np.shape(pos)[:-1] + (self.t,), bool)
            if self.causal:
                allowed &= t <= pos
            if self.left >= 0:
                allowed &= pos - t <= self.left
            if self.right >= 0:
                allowed &= t - pos <= self.right
        if nonpad is not None:
            valid = t < lengths
            allowed = valid if allowed is None else allowed & valid
        if allowed is not None:
            np.copyto(bias, -np.inf, where=~allowed)

    @staticmethod
    def _softmax(s: np.ndarray, dead: np.ndarray | None, rounding: np.dtype | None) -> None:
        """Row softmax in place; with `rounding`, every step rounds as if computed in that type."""
        top = np.max(s, axis=-1, keepdims=True)
        top[np.isneginf(top)] = 0
        s -= top
        if rounding is not None:
            _round_to(s, rounding)
        np.exp(s, out=s)
        if rounding is not None:
            _round_to(s, rounding)
        total = np.sum(s, axis=-1, keepdims=True)
        total[total == 0] = 1
        if rounding is not None:
            _round_to(total, rounding)
        s /= total
        if dead is not None:
            np.copyto(s, 0, where=dead)

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        q, k, v, mask, past_k, past_v, nonpad = _padded(inputs, 7)
        y, present_k, present_v, qk = _padded(outputs, 4)
        bufs = self.scratch.views(workspace)
        s = bufs["s"]
        s5 = s.reshape(self.b, self.hkv, self.g, self.sq, self.t)
        keys = self._blocks(past_k, self._heads_first(k, self.hkv), present_k)
        values = self._blocks(past_v, self._heads_first(v, self.hkv), present_v)
        q5 = self._grouped(q, self.d)
        if self.cast:
            # the reference scales Q and K by sqrt(scale) in their own (half) precision
            root = self.io.type(math.sqrt(self.scale))
            np.multiply(q5, root, out=bufs["q"])
            for start, blk in keys:
                np.multiply(blk, root, out=bufs["k"][:, :, start:start + blk.shape[2]])
            for start, blk in values:
                bufs["v"][:, :, start:start + blk.shape[2]] = blk
            q5, keys, values = bufs["q"], [(0, bufs["k"])], [(0, bufs["v"])]
        with np.errstate(all="ignore"):
            for start, blk in keys:
                np.matmul(q5, blk[:, :, None].swapaxes(-1, -2), out=s5[..., start:start + blk.shape[2]])
            if self.cast:
                _round_to(s, self.io)
            else:
                s *= self.scale
            self._scores(s, qk, 0)
            if self.softcap > 0:
                s /= self.softcap
                np.tanh(s, out=s)
                s *= self.softcap
            self._scores(s, qk, 1)
            dead = None
            if self.bias_shape is not None:
                bias = bufs["bias"]
                self._bias(bias, mask, nonpad)
                s += bias
                if self.cast:
                    _round_to(s, self.io)
                dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
            self._scores(s, qk, 2)
            self._softmax(s, dead, self.io if self.cast and self.precision is None else None)
            self._scores(s, qk, 3)
            p = s
            if "p" in bufs:
                p = bufs["p"]
                np.copyto(p, s, casting="same_kind")
            if self.cast:
                _round_to(p, self.io)
            self._values(p, values, y, bufs)

    def _scores(self, s: np.ndarray, qk: np.ndarray | None, stage: int) -> None:
        if qk is not None and self.mode == stage:
            np.copyto(qk, s, casting="unsafe")

    def _values(self, p: np.ndarray, values: list[tuple[int, np.ndarray]], y: np.ndarray,
                bufs: dict[str, np.ndarray]) -> None:
        """Y = P V, straight into Y when one block of values in Y's dtype covers T."""
        p5 = p.reshape(self.b, self.hkv, self.g, self.sq, self.t)
        y5 = self._grouped(y, self.dv)
        direct = len(values) == 1 and not self.cast
        acc = y5 if direct else bufs["acc"]
        for i, (start, blk) in enumerate(values):
            n = blk.shape[2]
            out = acc if i == 0 else bufs["part"]
            np.matmul(p5[..., start:start + n], blk[:, :, None], out=out)
            if i:
                acc += out
        if not direct:
            np.copyto(y5, acc, casting="unsafe")


# ----------------------------------------------------------------------------- RotaryEmbedding


@register("RotaryEmbedding", since=23)
class RotaryEmbedding(Kernel):
    """Rotates the first `rotary_embedding_dim` features of every head (all by default) by the
    cos/sin of its position: halves (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos), where the
    halves are the two halves of the rotated part or, with `interleaved`, its even and odd
    features. cos_cache/sin_cache are indexed by position_ids ([max_pos, rot/2]) or given per
    token ([B, S, rot/2]). Works on strided views of X; one workspace buffer holds products.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, cos, sin, pos = _padded(inputs, 4)
        if x.rank not in (3, 4) or not _is_float(x.dtype):
            raise ShapeError(f"{ctx.name}: RotaryEmbedding takes a float [B, H, S, D] or [B, S, H*D] "
                             f"input, got {x.dtype}{x.shape}")
        if x.rank == 3 and not ctx.attr("num_heads"):
            raise ShapeError(f"{ctx.name}: RotaryEmbedding needs num_heads for a 3-D input")
        if cos.shape != sin.shape or cos.rank != (2 if pos is not None else 3):
            raise ShapeError(f"{ctx.name}: RotaryEmbedding cos/sin caches must be [max_position, rot/2] "
                             f"with position_ids or [B, S, rot/2] without; got {cos.shape}, {sin.shape}")
        return [TensorInfo(x.dtype, x.shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, cos, _, pos = _padded(inputs, 4)
        if x.rank == 4:
            b, self.heads, s, d = x.shape
        else:
            self.heads = int(ctx.attrs["num_heads"])
            b, s = x.shape[:2]
            d = _div(ctx, x.shape[2], self.heads, "hidden size")
        self.rot = int(ctx.attr("rotary_embedding_dim", 0)) or d
        if self.rot % 2 or self.rot > d or cos.shape[-1] != self.rot // 2:
            raise ShapeError(f"{ctx.name}: RotaryEmbedding rotates {self.rot} of {d} features per head, "
                             f"which needs an even count and caches of last dim {self.rot // 2}, got "
                             f"{cos.shape[-1]}")
        tokens = tuple(pos.shape) if pos is not None else tuple(cos.shape[:2])
        if tokens != (b, s):
            raise ShapeError(f"{ctx.name}: RotaryEmbedding needs position_ids (or per-token caches) for "
                             f"({b}, {s}) tokens, got {tokens}")
        self.interleaved = bool(ctx.attr("interleaved", 0))
        # the half-rotation [B, S, H, rot/2] in the token-major layout of the 3-D input
        self.half = (b, s, self.heads, self.rot // 2) if x.rank == 3 else (b, self.heads, s, self.rot // 2)

    def workspace(self) -> int:
        return numel(self.half) * self.inputs[0].dtype.itemsize

    def _split(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The two rotated halves and the pass-through part of X or Y, as views."""
        if a.ndim == 3:
            a = a.reshape(a.shape[0], a.shape[1], self.heads, -1)
        rot = a[..., :self.rot]
        if self.interleaved:
            return rot[..., 0::2], rot[..., 1::2], a[..., self.rot:]
        return rot[..., :self.rot // 2], rot[..., self.rot // 2:], a[..., self.rot:]

    def run(self, inputs, outputs, workspace):
        x, cos, sin, pos = _padded(inputs, 4)
        if pos is not None:
            cos, sin = cos[pos], sin[pos]
        # [B, S, rot/2] broadcast over heads: axis 2 of [B, S, H, .], axis 1 of [B, H, S, .]
        cos, sin = ((c[:, :, None] if x.ndim == 3 else c[:, None]) for c in (cos, sin))
        x1, x2, xp = self._split(x)
        y1, y2, yp = self._split(outputs[0])
        yp[...] = xp
        tmp = workspace[:numel(self.half) * x.dtype.itemsize].view(x.dtype).reshape(self.half)
        np.multiply(x2, sin, out=tmp)
        np.multiply(x1, cos, out=y1)
        y1 -= tmp
        np.multiply(x2, cos, out=tmp)
        np.multiply(x1, sin, out=y2)
        y2 += tmp


# ----------------------------------------------------------------------------- SwiGLU


@register("SwiGLU", since=28)
class SwiGLU(Kernel):
    """Y = A * sigmoid(alpha * A) * B (A and B of one shape, no broadcasting), chunk by chunk
    through a small scratch buffer, in the inputs' own precision as the reference computes it."""

    inplace = {0: 0}
    chunk = 1 << 14

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        a, b = inputs
        if not _is_float(a.dtype) or a.dtype != b.dtype or a.rank != b.rank or any(
                isinstance(p, int) and isinstance(q, int) and p != q for p, q in zip(a.shape, b.shape)):
            raise ShapeError(f"{ctx.name}: SwiGLU needs A and B of one float type and one shape "
                             f"(no broadcasting), got {a.dtype}{a.shape} and {b.dtype}{b.shape}")
        return [TensorInfo(a.dtype, a.shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.alpha = float(ctx.attr("alpha", 1.0))
        self.step = max(min(numel(inputs[0].shape), self.chunk), 1)

    def workspace(self) -> int:
        return self.step * self.inputs[0].dtype.itemsize

    def run(self, inputs, outputs, workspace):
        a, b = (x.reshape(-1) for x in inputs)
        out = outputs[0].reshape(-1)
        buf = workspace[:self.step * a.dtype.itemsize].view(a.dtype)
        with np.errstate(over="ignore"):
            for lo in range(0, a.size, self.step):
                hi = min(lo + self.step, a.size)
                t = buf[:hi - lo]
                np.multiply(a[lo:hi], -self.alpha, out=t)
                np.exp(t, out=t)
                t += 1
                np.reciprocal(t, out=t)
                t *= a[lo:hi]
                np.multiply(t, b[lo:hi], out=out[lo:hi])


# ----------------------------------------------------------------------------- TensorScatter


@register("TensorScatter", since=24)
class TensorScatter(Kernel):
    """present = past with `update` written along `axis` at write_indices[batch] (0 by default),
    wrapping modulo the cache length in "circular" mode."""

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        past, update = inputs[0], inputs[1]
        axis = normalize_axis(int(ctx.attr("axis", -2)), past.rank, ctx.name)
        if axis == 0 or update.rank != past.rank or update.dtype != past.dtype:
            raise ShapeError(f"{ctx.name}: TensorScatter needs an update of the cache's rank and type "
                             f"and a sequence axis other than 0, got {update.dtype}{update.shape} for "
                             f"{past.dtype}{past.shape}, axis {axis}")
        for i, (p, u) in enumerate(zip(past.shape, update.shape)):
            if isinstance(p, int) and isinstance(u, int) and (u > p if i == axis else u != p):
                raise ShapeError(f"{ctx.name}: TensorScatter update {update.shape} does not fit cache "
                                 f"{past.shape} (dim {i})")
        if ctx.attr("mode", "linear") not in ("linear", "circular"):
            raise ShapeError(f"{ctx.name}: TensorScatter mode must be linear or circular")
        return [TensorInfo(past.dtype, past.shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.axis = normalize_axis(int(ctx.attr("axis", -2)), inputs[0].rank, ctx.name)
        self.circular = ctx.attr("mode", "linear") == "circular"

    def run(self, inputs, outputs, workspace):
        past, update, where = _padded(inputs, 3)
        out = outputs[0]
        if out is not past:
            np.copyto(out, past)
        length, n = past.shape[self.axis], update.shape[self.axis]
        starts = np.zeros(past.shape[0], np.int64) if where is None else where.reshape(-1)
        for b, start in enumerate(starts.tolist()):
            rows = start + np.arange(n)
            if self.circular:
                rows %= length
            elif start < 0 or start + n > length:
                raise KernelError(f"{self.ctx.name}: TensorScatter writes positions {start}..{start + n - 1}"
                                  f" of batch {b} into a cache of length {length} (linear mode)")
            np.moveaxis(out[b], self.axis - 1, 0)[rows] = np.moveaxis(update[b], self.axis - 1, 0)


# ----------------------------------------------------------------------------- recurrent blocks


@register("LinearAttention", since=27)
class LinearAttention(Kernel):
    """Linear attention recurrence over the T tokens, state [B, Hkv, d_k, d_v] kept in float32:

    "linear": S_t = S_{t-1} + k_t v_t^T; "gated": S_t = exp(g_t) S_{t-1} + k_t v_t^T;
    "delta": S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T; "gated_delta": both;
    o_t = scale * q_t^T S_t, each KV head's state shared by q_num_heads / kv_num_heads query heads.
    Tokens are sequential; batch and heads are vectorized.
    """

    rules = ("linear", "gated", "delta", "gated_delta")

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        q, k, v, past, decay, beta = _padded(inputs, 6)
        rule = ctx.attr("update_rule", "gated_delta")
        if rule not in cls.rules:
            raise ShapeError(f"{ctx.name}: LinearAttention update_rule {rule!r} is not one of {cls.rules}")
        if (decay is not None) != ("gated" in rule) or (beta is not None) != ("delta" in rule):
            raise ShapeError(f"{ctx.name}: LinearAttention rule {rule!r} takes decay only for gated rules "
                             f"and beta only for delta rules")
        if "q_num_heads" not in ctx.attrs or "kv_num_heads" not in ctx.attrs:
            raise ShapeError(f"{ctx.name}: LinearAttention needs q_num_heads and kv_num_heads")
        hq, hkv = int(ctx.attrs["q_num_heads"]), int(ctx.attrs["kv_num_heads"])
        if hkv < 1 or hq % hkv or q.rank != 3 or k.rank != 3 or v.rank != 3:
            raise ShapeError(f"{ctx.name}: LinearAttention takes 3-D query/key/value and q heads that "
                             f"are a multiple of kv heads")
        dk = _div(ctx, k.shape[2], hkv, "key hidden size")
        dv = _div(ctx, v.shape[2], hkv, "value hidden size")
        state = past.dtype if past is not None else q.dtype
        return [TensorInfo(q.dtype, (q.shape[0], q.shape[1], _mul(hq, dv))),
                TensorInfo(state, (q.shape[0], hkv, dk, dv))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        q, k, v, past, decay, beta = _padded(inputs, 6)
        self.hq, self.hkv = int(ctx.attrs["q_num_heads"]), int(ctx.attrs["kv_num_heads"])
        self.b, self.t = q.shape[:2]
        self.dk, self.dv = k.shape[2] // self.hkv, v.shape[2] // self.hkv
        if q.shape[2] != self.hq * self.dk:
            raise ShapeError(f"{ctx.name}: LinearAttention query hidden size {q.shape[2]} is not "
                             f"q_num_heads * d_k = {self.hq * self.dk}")
        if decay is not None and decay.shape[2] not in (self.hkv, self.hkv * self.dk):
            raise ShapeError(f"{ctx.name}: LinearAttention decay last dim must be kv_num_heads or "
                             f"kv_num_heads * d_k, got {decay.shape[2]}")
        if beta is not None and beta.shape[2] not in (self.hkv, 1):
            raise ShapeError(f"{ctx.name}: LinearAttention beta last dim must be kv_num_heads or 1")
        scale = float(ctx.attr("scale", 0.0))
        self.scale = scale if scale else 1 / math.sqrt(self.dk)
        state = (self.b, self.hkv, self.dk, self.dv)
        self.scratch = Scratch()
        self.scratch.add("state", _F32, state)
        self.scratch.add("outer", _F32, state)

    def workspace(self) -> int:
        return self.scratch.size

    def run(self, inputs, outputs, workspace):
        q, k, v, past, decay, beta = _padded(inputs, 6)
        y, present = outputs[0], outputs[1]
        b, hkv, g, dk, dv = self.b, self.hkv, self.hq // self.hkv, self.dk, self.dv
        bufs = self.scratch.views(workspace)
        state, outer = bufs["state"], bufs["outer"]
        if past is None:
            state.fill(0)
        else:
            np.copyto(state, past, casting="unsafe")
        y4 = y.reshape(b, self.t, hkv, g, dv)
        for i in range(self.t):
            k_t = k[:, i].reshape(b, hkv, dk).astype(_F32)
            v_t = v[:, i].reshape(b, hkv, dv).astype(_F32)
            if decay is not None:
                gate = np.exp(decay[:, i].reshape(b, hkv, -1).astype(_F32))
                state *= gate[..., None]
            if beta is not None:
                v_t -= np.matmul(k_t[:, :, None], state)[:, :, 0]
                v_t *= beta[:, i].reshape(b, -1, 1)
            np.multiply(k_t[..., None], v_t[:, :, None], out=outer)
            state += outer
            q_t = q[:, i].reshape(b, hkv, g, dk).astype(_F32) * np.float32(self.scale)
            np.matmul(q_t, state, out=y4[:, i], casting="same_kind")
        np.copyto(present, state, casting="unsafe")


@register("CausalConvWithState", since=27)
class CausalConvWithState(Kernel):
    """Depthwise causal 1-D convolution of X [B, C, L] with weight [C, 1, K] over the carried
    state (or zeros) followed by X, plus bias and optional SiLU; present_state holds the last K - 1
    positions of that padded sequence. One multiply-add per tap on shifted views."""

    activations = ("none", "silu", "swish")

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, w, bias, past = _padded(inputs, 4)
        if ctx.attr("activation", "none") not in cls.activations:
            raise ShapeError(f"{ctx.name}: CausalConvWithState activation must be one of {cls.activations}")
        if x.rank != 3 or w.rank != 3 or not _is_float(x.dtype):
            raise ShapeError(f"{ctx.name}: CausalConvWithState takes a float [B, C, L] input and a "
                             f"[C, 1, K] weight, got {x.shape} and {w.shape}")
        k = w.shape[2]
        return [TensorInfo(x.dtype, x.shape),
                TensorInfo(x.dtype, (x.shape[0], x.shape[1], k - 1 if isinstance(k, int) else None))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        x, w, bias, past = _padded(inputs, 4)
        b, c, n = x.shape
        self.k = w.shape[2]
        if w.shape[:2] != (c, 1) or (past is not None and tuple(past.shape) != (b, c, self.k - 1)):
            raise ShapeError(f"{ctx.name}: CausalConvWithState weight must be ({c}, 1, K) and "
                             f"past_state ({b}, {c}, K - 1); got {w.shape} and "
                             f"{None if past is None else past.shape}")
        self.silu = ctx.attr("activation", "none") != "none"
        self.ct = x.dtype if _native(x.dtype) else _F32
        self.scratch = Scratch()
        self.scratch.add("padded", self.ct, (b, c, n + self.k - 1))
        self.scratch.add("acc", self.ct, (b, c, n))
        self.scratch.add("tap", self.ct, (b, c, n))

    def workspace(self) -> int:
        return self.scratch.size

    def run(self, inputs, outputs, workspace):
        x, w, bias, past = _padded(inputs, 4)
        y, present = outputs[0], outputs[1]
        bufs = self.scratch.views(workspace)
        padded, acc, tap = bufs["padded"], bufs["acc"], bufs["tap"]
        k, n = self.k, x.shape[2]
        padded[..., :k - 1] = 0 if past is None else past
        padded[..., k - 1:] = x
        taps = w[:, 0].astype(self.ct)
        if bias is None:
            acc.fill(0)
        else:
            np.copyto(acc, bias.astype(self.ct)[:, None])
        for j in range(k):
            np.multiply(padded[..., j:j + n], taps[:, j:j + 1], out=tap)
            acc += tap
        if self.silu:
            with np.errstate(over="ignore"):
                np.negative(acc, out=tap)
                np.exp(tap, out=tap)
                tap += 1
                acc /= tap
        np.copyto(y, acc, casting="unsafe")
        np.copyto(present, padded[..., n:], casting="unsafe")
