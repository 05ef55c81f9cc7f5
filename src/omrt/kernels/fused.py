"""omrt::AutoFused: a chain of elementwise operators (ending, maybe, in reductions) that the
compiler fused into one generated C function (omrt.compiler.autofuse).

The node keeps the chain's original nodes as its sub-graph `body`, and its C function's name and
guard (the dtypes, shapes and layout it was generated for). The C function runs when the model's
fused kernels are loaded (trusted file, host that loads them) and the arrays of this call meet
the guard; otherwise, a guard miss, the body runs node by node on the built-in kernels, with the
same results within float rounding.
"""

from __future__ import annotations


import numpy as np

from . import parallel
from .base import Kernel, register, run_bound

BODY = "body"
"""The attribute holding the unfused chain."""


def is_fused(node) -> bool:
    """True for an omrt::AutoFused node (a profile names each by its own name, not its op type)."""
    return node.op_type == "AutoFused" and node.domain == "omrt"


def intermediate_bytes(node) -> int:
    """Bytes of the values a fused node's chain computes and no longer stores: its sub-graph's
    values that are neither its inputs, its outputs nor constants."""
    body = node.attrs[BODY]
    kept = set(body.inputs) | set(body.outputs) | set(body.constants)
    return sum(i.nbytes for v, i in body.infos.items() if v not in kept and i.static)


def _specs(spec: list) -> list[tuple[tuple[int, ...], np.dtype]]:
    return [(tuple(shape), np.dtype(dt)) for dt, shape in spec]


def _meets(arrays, specs) -> bool:
    """True when every array has its guard's shape and dtype and is C-contiguous."""
    return len(arrays) == len(specs) and all(
        type(a) is np.ndarray and a.shape == shape and a.dtype == dt and a.flags.c_contiguous
        for a, (shape, dt) in zip(arrays, specs))


@register("AutoFused", domain="omrt")
class AutoFused(Kernel):
    """The fused chain: its generated C function under its guard, else its unfused sub-graph."""

    inplace = {0: 0}
    """The compiler orders a chain's arrays so that output 0 may take input 0's buffer when they
    have one shape: its code reads each element of input 0 for the last time just before it
    writes that element of output 0 (omrt.compiler.autofuse)."""
    native_units = ("elementwise",)
    """Not for a function of that unit: the generated kernels run on the worker pool of the native
    library, which is built (with any unit) only when some kernel asks for one."""

    @classmethod
    def infer(cls, ctx, inputs):
        return ctx.subgraphs[BODY].infer(inputs, [])

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.body = ctx.subgraphs[BODY]
        self.guard = ctx.attr("guard") or {}
        self.symbol = ctx.attr("kernel", "")
        self.fused = None
        """The checked C function, when the fused kernels are loaded and the planned shapes meet
        the guard; None runs the body."""
        self.expect = _specs(self.guard.get("inputs", [])), _specs(self.guard.get("outputs", []))
        library = getattr(ctx.native, "fused", None)
        planned = ([(tuple(i.shape), i.dtype) for i in inputs if i is not None],
                   [(tuple(o.shape), o.dtype) for o in outputs if o is not None])
        if library is not None and planned == self.expect:
            self.fused = library.get(self.symbol, self.guard)
        self.nbytes = sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                          for shape, dt in self.expect[0] + self.expect[1])
        """Bytes the chain reads and writes: what sizes its work (a chain ending in a reduction
        writes little and reads much)."""

    def _meet(self, arrays: tuple) -> bool:
        """True when these arrays meet the guard: the shapes, dtypes and layout its code was
        generated for (the binding then checks sizes, writability and alignment again, as for
        every native call)."""
        ins, outs = self.expect
        n = len(ins)
        return _meets(arrays[:n], ins) and _meets(arrays[n:], outs)

    def bind(self, inputs, outputs, workspace):
        arrays = (*inputs, *outputs)
        if self.fused is None or not self._meet(arrays):
            return None
        return [self.fused.bind(*arrays, parallel.native_threads(nbytes=self.nbytes))]

    def run(self, inputs, outputs, workspace):
        if run_bound(self.bind(inputs, outputs, workspace)):
            return
        results = self.body.run(list(inputs), [])
        for out, value in zip(outputs, results):
            np.copyto(out, value, casting="no")
