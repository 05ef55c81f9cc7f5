"""Control flow: If, Loop and Scan run their sub-graphs through `OpContext.subgraphs`.

Where inference knows every output's shape ahead (both branches agree, a Scan over fixed-size
tensors), the node is planned like any other and its results are copied into its outputs, so
what follows stays planned too; otherwise (a Loop's scan outputs, branches of different shapes)
it runs late and returns what its sub-graphs produced. A node's inputs end with the outer
values its sub-graphs capture (`OpContext.captures` of them); the kernels hand those on unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import ShapeError
from .base import Kernel, OpContext, Subgraph, TensorInfo, fresh_dim, normalize_axis, register

_INT64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)


def split_captures(ctx: OpContext, inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The node's own inputs and the captured outer values that follow them."""
    n = len(inputs) - ctx.captures
    return list(inputs[:n]), list(inputs[n:])


def bare(info: TensorInfo) -> TensorInfo:
    """`info` without its value: what a sub-graph result says once it leaves its scope."""
    return TensorInfo(info.dtype, info.shape, kind=info.kind)


def merge(a: TensorInfo, b: TensorInfo, ctx: OpContext, what: str) -> TensorInfo:
    """One info that holds for both `a` and `b`: unknown dims where they differ.

    An optional and its element merge into the optional (a Loop's carried value may start as an
    optional and continue as what it holds).
    """
    if a.dtype != b.dtype:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} {what} is {a.dtype} on one path and {b.dtype} on "
                         f"another; both must have one type")
    kind = a.kind
    if a.kind != b.kind:
        if a.kind == f"optional.{b.kind}" or (a.kind == "optional" and b.is_tensor):
            kind = a.kind
        elif b.kind == f"optional.{a.kind}" or (b.kind == "optional" and a.is_tensor):
            kind = b.kind
        else:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} {what} is a {a.kind} on one path and a "
                             f"{b.kind} on another; both must have one type")
    if a.shape is None or b.shape is None or a.rank != b.rank:
        return TensorInfo(a.dtype, None, kind=kind)
    return TensorInfo(a.dtype, tuple(x if x == y else None for x, y in zip(a.shape, b.shape)), kind=kind)


def carried(declared: TensorInfo, outer: TensorInfo | None) -> TensorInfo:
    """What a sub-graph input that carries a value between iterations may hold, to start with.

    Type and kind come from the outer value; the shape from the sub-graph's declaration when it
    has the outer value's rank, else unknown dims. `infer_carried` then widens what the body
    changes: a carried value's shape may change from one iteration to the next, so the first
    one's must not be folded in.
    """
    if outer is None:
        return bare(declared)
    if outer.shape is not None and (declared.shape is None or declared.rank != outer.rank):
        return TensorInfo(outer.dtype, tuple(fresh_dim("carried") for _ in outer.shape), kind=outer.kind)
    return TensorInfo(outer.dtype, declared.shape, kind=outer.kind)


def _widen(info: TensorInfo, out: TensorInfo) -> TensorInfo | None:
    """A more general info for a carried input the body turns into `out`, or None if it holds."""
    if info.shape is None:
        return None
    if out.shape is None or len(out.shape) != len(info.shape):
        return TensorInfo(info.dtype, None, kind=info.kind)
    if all(not isinstance(d, int) or d == o for d, o in zip(info.shape, out.shape)):
        return None
    shape = tuple(d if not isinstance(d, int) or d == o else fresh_dim("carried")
                  for d, o in zip(info.shape, out.shape))
    return TensorInfo(info.dtype, shape, kind=info.kind)


def infer_carried(body: Subgraph, ins: list[TensorInfo], carried: Sequence[tuple[int, int]],
                  caps: Sequence[TensorInfo | None]) -> list[TensorInfo]:
    """The body's output infos once every carried value's info holds for all iterations.

    `carried` pairs the body input and output positions of each carried value. A dim the body
    changes is made unknown (a rank it changes, the rank) and the body inferred again; this ends,
    since every round turns at least one concrete dim or rank into an unknown one.
    """
    while True:
        outs = body.infer(ins, caps)
        wider = [(i, _widen(ins[i], outs[o])) for i, o in carried]
        if not any(w for _, w in wider):
            return outs
        for i, w in wider:
            if w is not None:
                ins[i] = w


def _scalar(value: np.ndarray, ctx: OpContext, what: str) -> np.generic:
    arr = np.asarray(value)
    if arr.size != 1:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} {what} must hold exactly one element, it has shape "
                         f"{arr.shape}")
    return arr.reshape(-1)[0]


def _stack(parts: list[np.ndarray], axis: int, info: TensorInfo) -> np.ndarray:
    """Per-iteration outputs stacked along a new `axis`; zero iterations give an empty tensor."""
    if parts:
        return np.stack(parts, axis=axis)
    elem = [d if isinstance(d, int) else 0 for d in info.shape]
    return np.empty(elem[:axis] + [0] + elem[axis:], info.dtype)


class _Subgraphs(Kernel):
    """Base of the kernels that run sub-graphs: `results` computes, `run` delivers."""

    def results(self, inputs: Sequence[Any]) -> list[Any]:
        raise NotImplementedError(f"{type(self).__name__}.results")

    def run(self, inputs, outputs, workspace):
        results = self.results(inputs)
        if all(o is None for o in outputs):
            return results
        for out, r in zip(outputs, results):
            if out is not None:
                np.copyto(out, r)
        return None


@register("If", since=1)
class If(_Subgraphs):
    """Runs `then_branch` or `else_branch` on a one-element boolean condition.

    "then_branch and else_branch ... must produce the same number of outputs"; from opset 11 the
    shapes may differ between them, so the merged infos leave those dims unknown. An If whose
    condition is a constant is replaced by its branch at compile time.

    A branch whose shape inference fails for the shapes at hand (exporters emit one branch per
    case, each valid only for its own inputs: a Squeeze of a dim that may be 1, a Reshape per
    sample rate) does not fail the node: it is planned from the other branch, and the failing
    one raises its ShapeError if it is ever taken.
    """

    @classmethod
    def infer(cls, ctx, inputs):
        _, caps = split_captures(ctx, inputs)
        inferred, failed = {}, {}
        for key in ("then_branch", "else_branch"):
            try:
                inferred[key] = ctx.subgraphs[key].infer([], caps)
            except ShapeError as e:
                failed[key] = e
        if len(failed) == 2:
            raise ShapeError(f"{ctx.name}: neither branch of the If holds for these shapes: then: "
                             f"{failed['then_branch']}; else: {failed['else_branch']}")
        if failed:
            return [bare(o) for o in next(iter(inferred.values()))]
        then, other = inferred["then_branch"], inferred["else_branch"]
        if len(then) != len(other):
            raise ShapeError(f"{ctx.name}: If branches produce {len(then)} and {len(other)} outputs; "
                             f"both must produce the node's {ctx.n_outputs}")
        return [merge(a, b, ctx, f"output {i}") for i, (a, b) in enumerate(zip(then, other))]

    def results(self, inputs):
        (cond, *_), caps = split_captures(self.ctx, inputs)
        branch = "then_branch" if _scalar(cond, self.ctx, "condition") else "else_branch"
        return self.ctx.subgraphs[branch].run([], caps)


@register("Loop", since=1)
class Loop(_Subgraphs):
    """Runs `body` while the condition holds and fewer than M iterations ran (either may be absent).

    Body: (iteration_num, condition, carried...) -> (condition, carried..., scan_outputs...). The
    node returns the final carried values and, per scan output, the values of every iteration
    stacked along a new first axis. Carried values may change shape between iterations; a value
    the body never assigns keeps its initial value when the loop runs zero times.
    """

    @classmethod
    def infer(cls, ctx, inputs):
        (_, _, *init), caps = split_captures(ctx, inputs)
        body = ctx.subgraphs["body"]
        declared = [body.graph.infos[v] for v in body.graph.inputs]
        if len(declared) != 2 + len(init):
            raise ShapeError(f"{ctx.name}: Loop body takes {len(declared)} inputs; it must take the "
                             f"iteration number, the condition and the {len(init)} carried values")
        ins = [TensorInfo(_INT64, ()), TensorInfo(_BOOL, ())]
        ins += [carried(d, i) for d, i in zip(declared[2:], init)]
        n = len(init)
        outs = infer_carried(body, ins, [(2 + k, 1 + k) for k in range(n)], caps)
        finals = [bare(o) if i is None else merge(bare(o), bare(i), ctx, f"carried value {k}")
                  for k, (o, i) in enumerate(zip(outs[1:1 + n], init))]
        scans = [TensorInfo(o.dtype, None if o.shape is None else (fresh_dim("iterations"),) + o.shape)
                 for o in outs[1 + n:]]
        return (finals + scans)[:ctx.n_outputs]

    def results(self, inputs):
        (m, cond, *values), caps = split_captures(self.ctx, inputs)
        body = self.ctx.subgraphs["body"]
        n = len(values)
        limit = None if m is None else int(_scalar(m, self.ctx, "M"))
        go = True if cond is None else bool(_scalar(cond, self.ctx, "condition"))
        scans: list[list[np.ndarray]] = [[] for _ in body.graph.outputs[1 + n:]]
        i = 0
        while go and (limit is None or i < limit):
            outs = body.run([np.array(i, np.int64), np.array(go), *values], caps)
            go = bool(_scalar(outs[0], self.ctx, "condition from the body"))
            values = outs[1:1 + n]
            for parts, v in zip(scans, outs[1 + n:]):
                parts.append(v)
            i += 1
        elems = [TensorInfo(o.dtype, () if o.shape is None else o.shape[1:]) for o in self.outputs[n:]]
        return (values + [_stack(p, 0, e) for p, e in zip(scans, elems)])[:self.ctx.n_outputs]


@register("Scan", since=9)
class Scan(_Subgraphs):
    """Runs `body` once per slice of the scan inputs, carrying state from one slice to the next.

    Inputs: N initial states then `num_scan_inputs` tensors scanned along `scan_input_axes`
    (default 0), forwards or, where `scan_input_directions` says 1, backwards. Body: (states...,
    slices...) -> (states..., scan_output_elements...). Scan outputs stack the elements along
    `scan_output_axes` (which "accepts negative values" counted on the output's rank), in reverse
    iteration order where `scan_output_directions` says 1.
    """

    @classmethod
    def _layout(cls, ctx: OpContext, n_in: int, ranks: Sequence[int]) -> tuple[int, list[int], list[int]]:
        k = int(ctx.attr("num_scan_inputs"))
        if not 0 < k <= n_in:
            raise ShapeError(f"{ctx.name}: Scan has num_scan_inputs={k} but {n_in} inputs")
        n = n_in - k
        axes = list(ctx.attr("scan_input_axes") or [0] * k)
        dirs = list(ctx.attr("scan_input_directions") or [0] * k)
        axes = [normalize_axis(a, r, ctx.name) for a, r in zip(axes, ranks[n:])]
        return n, axes, dirs

    @classmethod
    def infer(cls, ctx, inputs):
        ins, caps = split_captures(ctx, inputs)
        n, axes, _ = cls._layout(ctx, len(ins), [i.rank for i in ins])
        steps = ins[n].shape[axes[0]]
        slices = [TensorInfo(x.dtype, x.shape[:a] + x.shape[a + 1:]) for x, a in zip(ins[n:], axes)]
        body = [bare(s) for s in ins[:n]] + slices
        outs = infer_carried(ctx.subgraphs["body"], body, [(k, k) for k in range(n)], caps)
        out_axes = list(ctx.attr("scan_output_axes") or [0] * (len(outs) - n))
        scans = []
        for o, a in zip(outs[n:], out_axes):
            a = normalize_axis(a, o.rank + 1, ctx.name)
            scans.append(TensorInfo(o.dtype, o.shape[:a] + (steps,) + o.shape[a:]))
        return [bare(o) for o in outs[:n]] + scans

    def results(self, inputs):
        ins, caps = split_captures(self.ctx, inputs)
        n, axes, dirs = self._layout(self.ctx, len(ins), [np.ndim(x) for x in ins])
        body = self.ctx.subgraphs["body"]
        states = ins[:n]
        steps = ins[n].shape[axes[0]]
        scans: list[list[np.ndarray]] = [[] for _ in self.outputs[n:]]
        for t in range(steps):
            slices = [np.take(x, steps - 1 - t if d else t, axis=a) for x, a, d in zip(ins[n:], axes, dirs)]
            outs = body.run(states + slices, caps)
            states = outs[:n]
            for parts, v in zip(scans, outs[n:]):
                parts.append(v)
        out_axes = list(self.ctx.attr("scan_output_axes") or [0] * len(scans))
        out_dirs = list(self.ctx.attr("scan_output_directions") or [0] * len(scans))
        results = list(states)
        for parts, info, a, d in zip(scans, self.outputs[n:], out_axes, out_dirs):
            a = normalize_axis(a, info.rank, self.ctx.name)
            elem = TensorInfo(info.dtype, info.shape[:a] + info.shape[a + 1:])
            results.append(_stack(parts[::-1] if d else parts, a, elem))
        return results


@register("Scan", since=8)
class Scan8(_Subgraphs):
    """Scan of opset 8: every input has a batch axis first and is scanned along axis 1.

    The optional first input `sequence_lens` gives each batch entry's length; scan outputs past
    that length are zero. `directions` (per scan input) reverses the scan.
    """

    @classmethod
    def infer(cls, ctx, inputs):
        (_, *ins), caps = split_captures(ctx, inputs)
        k = int(ctx.attr("num_scan_inputs"))
        n = len(ins) - k
        batch, steps = ins[n].shape[0], ins[n].shape[1]
        body = [TensorInfo(x.dtype, x.shape[1:]) for x in ins[:n]]
        body += [TensorInfo(x.dtype, x.shape[2:]) for x in ins[n:]]
        outs = infer_carried(ctx.subgraphs["body"], body, [(k, k) for k in range(n)], caps)
        return ([TensorInfo(o.dtype, (batch,) + o.shape) for o in outs[:n]]
                + [TensorInfo(o.dtype, (batch, steps) + o.shape) for o in outs[n:]])

    def results(self, inputs):
        (lens, *ins), caps = split_captures(self.ctx, inputs)
        n = len(ins) - int(self.ctx.attr("num_scan_inputs"))
        dirs = list(self.ctx.attr("directions") or [0] * (len(ins) - n))
        body = self.ctx.subgraphs["body"]
        batch, steps = ins[n].shape[0], ins[n].shape[1]
        per_batch: list[list[np.ndarray]] = []
        for b in range(batch):
            length = steps if lens is None else int(np.asarray(lens).reshape(-1)[b])
            states = [s[b] for s in ins[:n]]
            scans: list[list[np.ndarray]] = [[] for _ in self.outputs[n:]]
            for t in range(length):
                slices = [x[b, length - 1 - t if d else t] for x, d in zip(ins[n:], dirs)]
                outs = body.run(states + slices, caps)
                states = outs[:n]
                for parts, v in zip(scans, outs[n:]):
                    parts.append(v)
            per_batch.append(states + scans)
        results = [np.stack([pb[j] for pb in per_batch]) for j in range(n)]
        for j, info in enumerate(self.outputs[n:]):
            out = np.zeros((batch, steps) + tuple(np.shape(per_batch[0][n + j][0]))
                           if per_batch and per_batch[0][n + j] else (batch, steps) + (0,) * (info.rank - 2),
                           info.dtype)
            for b, pb in enumerate(per_batch):
                if pb[n + j]:
                    out[b, :len(pb[n + j])] = np.stack(pb[n + j])
            results.append(out)
        return results
