"""Linear-algebra kernels: MatMul, Gemm, the compiler's FusedMatMul, Einsum and Det."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ShapeError
from ..native.bindings import MATMUL, activation_code
from ..native.library import Checked
from ..native.signature import address
from . import parallel
from .base import (FUSED_ACTIVATIONS, Kernel, OpContext, Shape, TensorInfo, apply_activation,
                   broadcast_shapes, carve, carve_size, numel, register)

_NO_ACTIVATION = (0, 0.0, 0.0)

SPLIT_OPERAND_BYTES = 1 << 20
"""Native products that read an operand of at least this many bytes split over omrt's threads
whatever their flops: a row times a big matrix is bound by reading the matrix, which two cores
do faster than one (inception_v2's 1024x1000 classifier, 2.05 million flops, just under
parallel.NATIVE_SPLIT_FLOPS, ran on one thread)."""


def _narrow(dtype: np.dtype) -> bool:
    """float16 and bfloat16: numpy has no BLAS (nor einsum) path for them, so omrt widens them."""
    return dtype == np.float16 or dtype.name == "bfloat16"


def _wide(shapes: Sequence[Shape]) -> list[tuple[Shape, np.dtype]]:
    """The `carve` specs of float32 copies of arrays of these shapes."""
    return [(s, np.dtype(np.float32)) for s in shapes]


def _same(a: object, b: object) -> bool:
    """False only for two known sizes that differ: symbolic and unknown dims may match anything."""
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


def _same_dtype(infos: Sequence[TensorInfo], op: str, name: str) -> np.dtype:
    """The one dtype all operands share, or a ShapeError (ONNX never promotes types)."""
    dtypes = {x.dtype for x in infos}
    if len(dtypes) > 1:
        raise ShapeError(f"{name}: {op} operands have dtypes {sorted(str(d) for d in dtypes)}; "
                         f"insert a Cast so that they match")
    return infos[0].dtype


def matmul_shape(a: Shape, b: Shape, name: str) -> Shape:
    """numpy.matmul's output shape: 1-D operands are promoted then their added dim removed."""
    if not a or not b:
        raise ShapeError(f"{name}: MatMul operands must have rank >= 1, got shapes {a} and {b}; "
                         f"use Mul for scalars")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    if not _same(a2[-1], b2[-2]):
        raise ShapeError(f"{name}: MatMul inner dims differ: A {tuple(a)} has {a2[-1]} columns, "
                         f"B {tuple(b)} has {b2[-2]} rows; transpose or reshape one operand")
    rows = a2[-2:-1] if len(a) > 1 else ()
    cols = b2[-1:] if len(b) > 1 else ()
    return (*broadcast_shapes(a2[:-2], b2[:-2], name=name), *rows, *cols)


def _blas_operand(x: np.ndarray, batch: int) -> tuple[int, int, int] | None:
    """(pitch, stored transposed, matrix stride) in floats of a float32 matrix, or stack of
    `batch` matrices (or one for all), that BLAS reads in place; None when it cannot."""
    if x.ndim not in (2, 3) or any(s % 4 for s in x.strides) or address(x) % 4:
        return None
    rows, cols = x.shape[-2:]
    r, c = x.strides[-2] // 4, x.strides[-1] // 4
    stride = x.strides[0] // 4 if x.ndim == 3 and x.shape[0] == batch and batch > 1 else 0
    if stride < 0 or (x.ndim == 3 and x.shape[0] not in (1, batch)):
        return None
    if c == 1 and r >= max(1, cols):
        return r, 0, stride
    if r == 1 and c >= max(1, rows):
        return c, 1, stride
    return None


def _drop_leading_ones(x: np.ndarray) -> np.ndarray:
    """x without leading axes of length 1 beyond a stack of matrices (attention's batch of 1)."""
    while x.ndim > 3 and x.shape[0] == 1:
        x = x[0]
    return x


class _Product:
    """A @ B into `out`, planned once for the shapes at hand.

    When B is a matrix or a vector, A's batch dims are folded into its rows so one BLAS call
    does the whole product; float16 and bfloat16 operands are multiplied in float32 inside
    the workspace. With the model's native library, float32 products of matrices (or stacks of
    them) that BLAS can read in place run in one C call on the native workers, a bias over the
    columns and the fused activation included. Otherwise, on several omrt threads a big product
    is split into blocks of the output, one BLAS call each (parallel.matmul).
    """

    def __init__(self, a: Shape, b: Shape, out: Shape, dtype: np.dtype, fold: bool = True,
                 ctx: OpContext | None = None, fuse: bool = True) -> None:
        self.fold = fold and len(b) <= 2 and len(a) > 2
        if self.fold:
            a = (numel(a[:-1]), a[-1])
            out = (a[0], *b[1:])
        self.shapes = (tuple(a), tuple(b), tuple(out))
        self.wide = _narrow(np.dtype(dtype))
        self.workspace_bytes = carve_size(*_wide(self.shapes)) if self.wide else 0
        native = ctx.native.get(MATMUL) if ctx is not None and ctx.native is not None else None
        self.native = native if np.dtype(dtype) == np.float32 else None
        self.act = activation_code(ctx.attrs) if self.native is not None and fuse else None

    def _bind_native(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, bias: np.ndarray | None,
                     act: tuple[int, float, float]) -> Checked | None:
        """The native call of a @ b (+ bias, then the activation `act`) into out, checked; None
        when the operands are not matrices BLAS reads in place."""
        a, b, out = (_drop_leading_ones(x) for x in (a, b, out))
        batch = out.shape[0] if out.ndim == 3 else 1
        views = [_blas_operand(x, batch) for x in (a, b, out)]
        if None in views or views[2][1]:  # a vector (1-d operand), or a layout BLAS cannot read
            return None
        m, n = out.shape[-2:]
        k = a.shape[-1]
        if (0 in (m, n, k) or a.ndim > out.ndim or b.ndim > out.ndim
                or np.may_share_memory(out, a) or np.may_share_memory(out, b)):
            return None
        (lda, ta, sa), (ldb, tb, sb), (ldc, _, sc) = views
        streamed = max(a.nbytes, b.nbytes) >= SPLIT_OPERAND_BYTES
        threads = parallel.native_threads(parallel.NATIVE_SPLIT_FLOPS if streamed else 2 * batch * m * n * k)
        return self.native.bind(a, b, bias, out, batch, m, n, k, lda, ldb, ldc, ta, tb, sa, sb, sc, threads, *act)

    def _fused(self, out: np.ndarray, bias: np.ndarray | None) -> bool:
        """Whether the native call also adds `bias` and applies the node's activation: the
        activation is one it fuses (and the product was made with fuse=True) and the bias a
        float32 vector over the columns."""
        return self.act is not None and (bias is None or (
            bias.dtype == np.float32 and bias.flags.c_contiguous and bias.size == out.shape[-1] == bias.shape[-1]))

    def _folded(self, a: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (a.reshape(self.shapes[0]), out.reshape(self.shapes[2])) if self.fold else (a, out)

    def bind(self, a: np.ndarray, b: np.ndarray, out: np.ndarray,
             bias: np.ndarray | None = None) -> list[Checked] | None:
        """The native call of out = act(a @ b + bias), checked, when it does all of that; else None."""
        a, out = self._folded(a, out)
        if self.native is None or not self._fused(out, bias):
            return None
        call = self._bind_native(a, b, out, bias, self.act)
        return None if call is None else [call]

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, workspace: np.ndarray | None,
                 bias: np.ndarray | None = None) -> bool:
        """out = a @ b; True when it also added `bias` and applied the node's activation (`_fused`).
        On False the caller does both."""
        a, out = self._folded(a, out)
        if self.native is not None:
            fuse = self._fused(out, bias)
            call = self._bind_native(a, b, out, bias if fuse else None, self.act if fuse else _NO_ACTIVATION)
            if call is not None:
                call()
                return fuse
        if not self.wide:
            parallel.matmul(a, b, out)
            return False
        a32, b32, o32 = carve(workspace, *_wide(self.shapes))
        np.copyto(a32, a)
        np.copyto(b32, b)
        parallel.matmul(a32, b32, o32)
        np.copyto(out, o32, casting="same_kind")
        return False


PERMS = ("_perm_a", "_perm_b", "_perm_y")
"""omrt-internal MatMul attributes: the compiler folds a Transpose of A or B, or of the product,
into the node. A is read as transpose(A, _perm_a), B likewise, and the product is stored as
transpose(product, _perm_y); numpy multiplies the strided views with BLAS, no copy is made."""


def _permuted(shape: Shape, perm: Sequence[int] | None, name: str) -> Shape:
    if perm is None:
        return tuple(shape)
    if sorted(perm) != list(range(len(shape))):
        raise ShapeError(f"{name}: permutation {list(perm)} does not fit a tensor of rank {len(shape)}; "
                         f"it must list each axis once")
    return tuple(shape[p] for p in perm)


class MatMulBase(Kernel):
    """Shared by MatMul and FusedMatMul: numpy matmul semantics straight into the output."""

    fuses = frozenset(FUSED_ACTIVATIONS)
    native_units = ("linalg",)

    @classmethod
    def product_shape(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> Shape:
        """The shape of A @ B before `_perm_y` stores it transposed."""
        a, b = (_permuted(x.shape, ctx.attr(k), ctx.name) for x, k in zip(inputs[:2], PERMS))
        return matmul_shape(a, b, ctx.name)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        dtype = _same_dtype(inputs[:2], ctx.op_type, ctx.name)
        return [TensorInfo(dtype, _permuted(cls.product_shape(ctx, inputs), ctx.attr("_perm_y"), ctx.name))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.perm_a, self.perm_b, perm_y = (ctx.attr(k) for k in PERMS)
        self.unperm_y = None if perm_y is None else tuple(int(i) for i in np.argsort(perm_y))
        a, b = (_permuted(x.shape, p, ctx.name) for x, p in zip(inputs, (self.perm_a, self.perm_b)))
        y = _permuted(outputs[0].shape, self.unperm_y, ctx.name)
        self.product = _Product(a, b, y, outputs[0].dtype, fold=not any(ctx.attr(k) for k in PERMS), ctx=ctx)

    def workspace(self) -> int:
        return self.product.workspace_bytes

    def views(self, inputs: Sequence[np.ndarray],
              out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A, B and the product's shape over the output, as the folded Transposes ask."""
        a, b = inputs[0], inputs[1]
        return (a if self.perm_a is None else a.transpose(self.perm_a),
                b if self.perm_b is None else b.transpose(self.perm_b),
                out if self.unperm_y is None else out.transpose(self.unperm_y))


@register("MatMul", since=1)
class MatMul(MatMulBase):
    """Matrix product with numpy.matmul semantics (1-D promotion, batch broadcasting)."""

    def bind(self, inputs, outputs, workspace):
        return self.product.bind(*self.views(inputs, outputs[0]))

    def run(self, inputs, outputs, workspace):
        a, b, out = self.views(inputs, outputs[0])
        if not self.product(a, b, out, workspace):
            apply_activation(outputs[0], self.ctx)


@register("FusedMatMul", since=1, domain="omrt")
class FusedMatMul(MatMulBase):
    """omrt-internal MatMul(A, B) + bias (broadcast over the output, usually 1-D over its last dim).

    The compiler makes it from MatMul followed by Add, so the bias lands in the product's output
    while it is still in cache, and an activation after the Add can be fused too.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        out = super().infer(ctx, inputs)
        bias, product = inputs[2], cls.product_shape(ctx, inputs)
        if broadcast_shapes(product, bias.shape, name=ctx.name) != product \
                and all(isinstance(d, int) for d in (*product, *bias.shape)):
            raise ShapeError(f"{ctx.name}: FusedMatMul bias {bias.shape} must broadcast to the "
                             f"product's shape {product} without growing it; keep MatMul and Add")
        return out

    def bind(self, inputs, outputs, workspace):
        return self.product.bind(*self.views(inputs, outputs[0]), inputs[2])

    def run(self, inputs, outputs, workspace):
        a, b, out = self.views(inputs, outputs[0])
        if not self.product(a, b, out, workspace, inputs[2]):
            np.add(out, inputs[2], out=out)
            apply_activation(outputs[0], self.ctx)


@register("Gemm", since=1)
class Gemm(Kernel):
    """Y = alpha * A' @ B' + beta * C, with A' and B' optionally transposed and C broadcast to Y.

    Before opset 7 `broadcast=0` asked for C of Y's exact shape; broadcasting any C that fits
    is a superset of that rule. The product goes straight into Y, then is scaled and C is added
    in place.
    """

    fuses = frozenset(FUSED_ACTIVATIONS)
    native_units = ("linalg",)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        a, b = inputs[0], inputs[1]
        c = inputs[2] if len(inputs) > 2 else None
        if a.rank != 2 or b.rank != 2:
            raise ShapeError(f"{ctx.name}: Gemm needs 2-D A and B, got {a.shape} and {b.shape}; "
                             f"use MatMul for other ranks")
        m, ka = a.shape[::-1] if ctx.attr("transA", 0) else a.shape
        kb, n = b.shape[::-1] if ctx.attr("transB", 0) else b.shape
        if not _same(ka, kb):
            raise ShapeError(f"{ctx.name}: Gemm inner dims differ ({ka} vs {kb}) for A {a.shape}, "
                             f"B {b.shape}; check transA/transB")
        if c is not None and (c.rank > 2 or not all(
                d == 1 or _same(d, y) for d, y in zip(c.shape[::-1], (n, m)))):
            raise ShapeError(f"{ctx.name}: Gemm C {c.shape} does not broadcast to Y ({m}, {n}); "
                             f"C must be scalar, (N,), (1, N), (M, 1) or (M, N)")
        return [TensorInfo(_same_dtype([x for x in (a, b, c) if x is not None], "Gemm", ctx.name),
                           (m, n))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.trans_a = bool(ctx.attr("transA", 0))
        self.trans_b = bool(ctx.attr("transB", 0))
        self.alpha = float(ctx.attr("alpha", 1.0))
        self.beta = float(ctx.attr("beta", 1.0))
        a, b = inputs[0].shape, inputs[1].shape
        c = inputs[2] if len(inputs) > 2 else None
        self.has_c = c is not None and self.beta != 0
        # Y = A' @ B' + c over the columns (a fully connected layer) is one native call.
        self.as_bias = self.alpha == 1 and (not self.has_c or (
            self.beta == 1 and c.rank in (1, 2) and all(d == 1 for d in c.shape[:-1])))
        self.product = _Product(a[::-1] if self.trans_a else a, b[::-1] if self.trans_b else b,
                                outputs[0].shape, outputs[0].dtype, ctx=ctx, fuse=self.as_bias)
        # beta * C as a temporary when that is cheap (C smaller than Y) or exactness needs it.
        self.scale_c = self.has_c and self.beta != 1 and (
            numel(c.shape) < numel(outputs[0].shape) or outputs[0].dtype.kind in "iu")

    def workspace(self) -> int:
        return self.product.workspace_bytes

    def bind(self, inputs, outputs, workspace):
        if self.has_c and not self.as_bias:
            return None
        a, b = inputs[0], inputs[1]
        bias = inputs[2] if self.has_c else None
        return self.product.bind(a.T if self.trans_a else a, b.T if self.trans_b else b, outputs[0], bias)

    def run(self, inputs, outputs, workspace):
        a, b, out = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if self.has_c and self.as_bias else None
        if self.product(a.T if self.trans_a else a, b.T if self.trans_b else b, out, workspace, bias):
            return
        alpha, beta = self.alpha, self.beta
        if self.has_c:
            c = inputs[2]
            if beta == 1 or self.scale_c:
                if alpha != 1:
                    np.multiply(out, alpha, out=out, casting="unsafe")
                if self.scale_c:
                    c = np.multiply(c, beta)
                np.add(out, c, out=out, casting="unsafe")
            else:
                # Y = beta * (alpha/beta * AB + C): no temporary the size of Y.
                np.multiply(out, alpha / beta, out=out, casting="unsafe")
                np.add(out, c, out=out, casting="unsafe")
                np.multiply(out, beta, out=out, casting="unsafe")
        elif alpha != 1:
            np.multiply(out, alpha, out=out, casting="unsafe")
        apply_activation(out, self.ctx)


def _einsum_terms(equation: str, ranks: Sequence[int], name: str) -> tuple[list[str], str]:
    """The input terms and the output term of an einsum equation, ellipses spelled out.

    Each "..." becomes the same run of fresh symbols (aligned to the right, as numpy broadcasts);
    the implicit output is the ellipsis then the letters used once, in ASCII order.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ShapeError(f"{name}: Einsum equation {equation!r} has {len(terms)} operand terms but "
                         f"the node has {len(ranks)} inputs; make them agree")
    ell_rank = max((r - len(t) + 3 for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = "".join(chr(0x100 + i) for i in range(ell_rank))
    spelled = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", ell[ell_rank - (r - len(t) + 3):])
        if len(t) != r:
            raise ShapeError(f"{name}: Einsum term {t!r} names {len(t)} dims for an input of rank {r}; "
                             f"fix the equation {equation!r}")
        spelled.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = [c for c in lhs if c.isalpha()]
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return spelled, out


@register("Einsum", since=12)
class Einsum(Kernel):
    """Einstein summation via numpy.einsum into the output, contraction order planned at load."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        terms, out = _einsum_terms(ctx.attr("equation", ""), [x.rank for x in inputs], ctx.name)
        dims: dict[str, list[Shape]] = {}
        for t, x in zip(terms, inputs):
            for c, d in zip(t, x.shape):
                dims.setdefault(c, []).append((d,))
        unknown = [c for c in out if c not in dims]
        if unknown:
            raise ShapeError(f"{ctx.name}: Einsum output names {unknown} that no input has; "
                             f"fix the equation")
        sizes = {c: broadcast_shapes(*d, name=ctx.name)[0] for c, d in dims.items()}
        return [TensorInfo(_same_dtype(inputs, "Einsum", ctx.name), tuple(sizes[c] for c in out))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.equation = ctx.attr("equation", "").replace(" ", "")
        self.wide = _narrow(outputs[0].dtype)
        self.shapes = [x.shape for x in (*inputs, *outputs)]
        self.optimize: bool | list = False
        if len(inputs) > 1:
            ghosts = [np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), x.shape, (0,) * x.rank)
                      for x in inputs]
            self.optimize = np.einsum_path(self.equation, *ghosts, optimize="greedy")[0]

    def workspace(self) -> int:
        return carve_size(*_wide(self.shapes)) if self.wide else 0

    def run(self, inputs, outputs, workspace):
        if not self.wide:
            np.einsum(self.equation, *inputs, out=outputs[0], optimize=self.optimize)
            return
        *wide_in, wide_out = carve(workspace, *_wide(self.shapes))
        for w, x in zip(wide_in, inputs):
            np.copyto(w, x)
        np.einsum(self.equation, *wide_in, out=wide_out, optimize=self.optimize)
        np.copyto(outputs[0], wide_out, casting="same_kind")


@register("Det", since=11)
class Det(Kernel):
    """Determinant of each trailing square matrix (LU factorisation by numpy.linalg)."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.rank < 2 or not _same(x.shape[-1], x.shape[-2]):
            raise ShapeError(f"{ctx.name}: Det needs square matrices in the last two dims, got "
                             f"shape {x.shape}")
        return [TensorInfo(x.dtype, x.shape[:-2])]

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        if _narrow(x.dtype):
            x = x.astype(np.float32)
        outputs[0][...] = np.linalg.det(x)
