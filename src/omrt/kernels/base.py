"""The kernel contract: what every operator implementation states and how the library finds it.

A kernel is a class bound to one node: `infer` gives output dtypes and shapes from the inputs
(at compile time, dims may be symbolic strings); `__init__` prepares everything that depends only
on attributes and concrete shapes (done once, at load); `run` writes the result into the output
arrays it is handed (views into the arena or the caller's buffers) and returns nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

import numpy as np

from ..errors import ShapeError, UnsupportedOpError
from ..ir import Dim, Graph, Node, Shape, TensorInfo, dtype_from_name
from ..memory import align


class Subgraph(Protocol):
    """A graph attribute (If's branches, Loop's and Scan's body) as its node's kernel sees it.

    Inputs are the sub-graph's declared inputs in order; `captures` are the node's trailing inputs
    (the outer values the sub-graph reads, see `OpContext.captures`). Values are arrays, lists
    (sequences) or None (empty optionals).
    """

    graph: Graph

    def infer(self, inputs: Sequence[TensorInfo | None],
              captures: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        """The infos of the sub-graph's outputs when its inputs have these infos."""

    def run(self, inputs: Sequence[Any], captures: Sequence[Any]) -> list[Any]:
        """Execute the sub-graph once; its outputs are freshly allocated or immutable values."""


@dataclass(frozen=True)
class OpContext:
    """What a kernel knows about its node besides its tensors."""

    attrs: dict[str, Any]
    opset: int
    name: str = ""
    op_type: str = ""
    n_outputs: int = 1
    """How many outputs the node declares (absent optional ones included)."""
    subgraphs: Mapping[str, Subgraph] = field(default_factory=dict)
    """The node's graph attributes, ready to infer and run."""
    captures: int = 0
    """How many of the node's inputs, at the end, are outer values its sub-graphs read."""
    native: Any = None
    """The model's native library (`omrt.native.library.Library`) when it packs one and the caller
    trusts it; None otherwise, and always at compile time."""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


class Kernel:
    """Base of every built-in kernel. Subclasses set the class attributes and override methods."""

    op_type: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    inplace: ClassVar[dict[int, int]] = {}
    """output index -> input index it may overwrite when that input dies at this task."""
    view: ClassVar[bool] = False
    """True when output 0 is input 0 reinterpreted with another shape (an alias, no task), or
    the bytes of input 0 from `view_offset` on."""
    dynamic: ClassVar[bool] = False
    """True when output shapes depend on input values: `run` returns freshly allocated outputs.
    A kernel whose `infer` leaves an output shape unknown only for some nodes (If, Loop, Scan) is
    run the same way for those nodes: handed None outputs, it returns new arrays."""
    deterministic: ClassVar[bool] = True
    """False for random ops: never folded at compile time."""
    fuses: ClassVar[frozenset[str]] = frozenset()
    """Activations (from FUSED_ACTIVATIONS) this kernel applies to its output when fused into it."""
    native_units: ClassVar[tuple[str, ...]] = ()
    """C units (`native/csrc/<unit>.c`) this kernel can hand work to; `omrt compile` packs them."""
    derived: ClassVar[tuple[tuple[int, int], ...]] = ()
    """(input, source) pairs: input `input` was computed at compile time from input `source`
    (transformed or packed filters); see drop_derived."""
    derived_call: ClassVar[str] = ""
    """The attribute holding the native call that reads the `derived` inputs (None: not taken)."""

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        self.ctx = ctx
        self.inputs = list(inputs)
        self.outputs = list(outputs)

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        """Output dtypes and shapes from input infos; raise ShapeError naming the rule broken."""
        raise NotImplementedError(f"{cls.__name__}.infer")

    @classmethod
    def view_offset(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]) -> int:
        """For a view: the byte offset in input 0 at which output 0's bytes start."""
        return 0

    @classmethod
    def input_offsets(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                      outputs: Sequence[TensorInfo]) -> dict[int, int]:
        """Input index -> the byte offset in output 0 at which that input's bytes may already sit
        (the kernel then skips writing them): the planner may place the input there (Concat)."""
        return {}

    def workspace(self) -> int:
        """Scratch bytes this task needs in the arena (planned like any tensor)."""
        return 0

    def fit_workspace(self, nbytes: int) -> bool:
        """Make do with the `nbytes` of workspace a plan made earlier gives (a file compiled by
        an older omrt), dropping what only speeds the kernel up; False when it cannot run in them."""
        return self.workspace() <= nbytes

    def drop_derived(self) -> None:
        """Stop reading the `derived` inputs and compute from their sources alone: a source was
        swapped (`Session.set_weight`), so what the compiler derived from it is stale."""
        if self.derived_call:
            setattr(self, self.derived_call, None)

    def reads_derived(self) -> bool:
        """Whether run() takes the path that reads the `derived` inputs (not their sources)."""
        return bool(self.derived_call) and getattr(self, self.derived_call) is not None

    def unread_inputs(self) -> frozenset[int]:
        """Positions of the inputs run() never reads on the path it takes: the `derived` inputs,
        or their sources when it reads those; a weight budget need not hold them."""
        if self.reads_derived():
            return frozenset(source for _, source in self.derived)
        return frozenset(derived for derived, _ in self.derived)

    def run(self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
            workspace: np.ndarray | None) -> list[np.ndarray] | None:
        """Compute into `outputs` (dynamic kernels return new arrays instead)."""
        raise NotImplementedError(f"{type(self).__name__}.run")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A kernel with a `run` of its own and no `bind` of its own binds nothing: what its
        parent's native calls do need not be what its run does."""
        super().__init_subclass__(**kwargs)
        if "run" in cls.__dict__ and "bind" not in cls.__dict__:
            cls.bind = Kernel.bind

    def bind(self, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray],
             workspace: np.ndarray | None) -> list[Any] | None:
        """The native calls a run over these very arrays makes (omrt.native.library.Checked),
        checked now, when they are all it does: repeating them in order is the run, for as long
        as the arrays and the thread count stay the same (they do not look at the values). None
        when a run must go through `run` (a numpy path; the default)."""
        return None


def run_bound(calls: list[Any] | None) -> bool:
    """Make the native calls `Kernel.bind` gave; False (nothing done) when it gave None."""
    if calls is None:
        return False
    for call in calls:
        call()
    return True


@dataclass(frozen=True)
class _Entry:
    since: int
    cls: type[Kernel]


_REGISTRY: dict[tuple[str, str], list[_Entry]] = {}


def register(op_type: str, since: int = 1, domain: str = "") -> Callable[[type[Kernel]], type[Kernel]]:
    """Class decorator: this kernel implements `op_type` for opsets >= `since` (until a newer entry)."""

    def deco(cls: type[Kernel]) -> type[Kernel]:
        entries = _REGISTRY.setdefault((domain, op_type), [])
        entries.append(_Entry(since, cls))
        entries.sort(key=lambda e: e.since)
        if not cls.op_type:
            cls.op_type = op_type
        cls.domain = domain
        return cls

    return deco


def lookup(op_type: str, opset: int, domain: str = "", node: str = "") -> type[Kernel]:
    """The kernel class for an op at a model's opset, or UnsupportedOpError naming op, node and opset."""
    domain = "" if domain == "ai.onnx" else domain
    entries = _REGISTRY.get((domain, op_type))
    where = f" (node {node!r})" if node else ""
    qual = f"{domain}::{op_type}" if domain else op_type
    if not entries:
        raise UnsupportedOpError(
            f"operator {qual}{where} at opset {opset} has no kernel in omrt; "
            f"see docs/conformance.md for the supported operators, or define it as a custom operator "
            f"(omrt.CustomOp, docs/custom_ops.md)")
    best = None
    for e in entries:
        if e.since <= opset:
            best = e
    if best is None:
        raise UnsupportedOpError(
            f"operator {qual}{where} is supported from opset {entries[0].since}, "
            f"the model uses opset {opset}; convert the model to a newer opset")
    return best.cls


def kernel_of(node: Node, graph: Graph) -> type[Kernel]:
    """The kernel class that runs `node` of `graph`: the model's own operator of that name when it
    has one (`Graph.custom`: packed custom operators win over anything registered in the process),
    else omrt's library at the model's opset. Every place that resolves a node's kernel asks here."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    own = graph.custom.get((domain, node.op_type))
    if own is not None:
        return own
    return lookup(node.op_type, graph.opset(domain), domain, node.label)


def newest_opset(op_type: str, domain: str = "") -> int:
    """The newest opset an op has a kernel for, or UnsupportedOpError naming it."""
    entries = _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type))
    if not entries:
        lookup(op_type, 1, domain)  # raises, naming the op
    return entries[-1].since


def registered_ops() -> list[tuple[str, str, int]]:
    """(domain, op_type, since) for every registration: the supported-operator table."""
    return sorted((d, op, e.since) for (d, op), es in _REGISTRY.items() for e in es)


# ----------------------------------------------------------------------------- shape helpers

_fresh = itertools.count()


def fresh_dim(prefix: str = "unk") -> str:
    """A new symbolic dim name for a size no rule can tell before run time."""
    return f"{prefix}_{next(_fresh)}"


def broadcast_shapes(*shapes: Shape, name: str = "") -> Shape:
    """Numpy (multidirectional) broadcasting over possibly symbolic shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = {d for d in dims if d != 1}
        if not known:
            out.append(1)
        elif len(known) == 1:
            out.append(known.pop())
        else:
            ints = {d for d in known if isinstance(d, int)}
            if len(ints) > 1:
                raise ShapeError(f"{name}: shapes {[tuple(s) for s in shapes]} cannot be broadcast "
                                 f"together (dim {i} differs); make the sizes equal or 1")
            out.append(ints.pop() if ints else sorted(str(d) for d in known)[0])
    return tuple(out)


def normalize_axis(axis: int, rank: int, name: str = "") -> int:
    """An axis in [-rank, rank) made non-negative, or a ShapeError."""
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{name}: axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def numel(shape: Shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


# ----------------------------------------------------------------------------- fused activations

FUSED_ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid")
"""Activations the compiler may fold into a producer that lists them in `Kernel.fuses`.

The producer's node then carries the omrt-internal attributes `_act` (one of these names),
`_act_alpha` and `_act_beta` (floats; for Clip they are min and max), and applies the activation
to its own output in place with `apply_activation`.
"""


ZERO_BYTES = 1 << 18
"""Bytes of the block of zeros `relu` compares against: one chunk, in the CPU's L2 cache."""
_ZEROS: dict[np.dtype, np.ndarray] = {}


def relu(x: np.ndarray, out: np.ndarray) -> None:
    """max(x, 0) into `out`, chunk by chunk against a read-only block of zeros.

    numpy's maximum of an array and a scalar runs a loop about three times slower than its
    maximum of two arrays, so the scalar is made an array.
    """
    zeros = _ZEROS.get(x.dtype)
    if zeros is None:
        zeros = np.zeros(ZERO_BYTES // x.dtype.itemsize, x.dtype)
        zeros.flags.writeable = False
        zeros = _ZEROS.setdefault(x.dtype, zeros)
    src, dst = x.reshape(-1), out.reshape(-1)
    step = zeros.size
    for lo in range(0, src.size, step):
        hi = min(lo + step, src.size)
        np.maximum(src[lo:hi], zeros[:hi - lo], out=dst[lo:hi])


def apply_activation(out: np.ndarray, ctx: OpContext) -> None:
    """Apply the fused activation named in `ctx` (if any) to `out` in place."""
    act = ctx.attrs.get("_act")
    if act is None:
        return
    alpha = ctx.attrs.get("_act_alpha")
    beta = ctx.attrs.get("_act_beta")
    if act == "Relu":
        relu(out, out)
    elif act == "LeakyRelu":
        np.multiply(out, np.where(out < 0, out.dtype.type(alpha), out.dtype.type(1)), out=out)
    elif act == "Clip":
        np.clip(out, alpha, beta, out=out)
    elif act == "Sigmoid":
        np.negative(out, out=out)
        np.exp(out, out=out)
        np.add(out, 1, out=out)
        np.reciprocal(out, out=out)
    elif act == "Tanh":
        np.tanh(out, out=out)
    elif act == "HardSigmoid":
        np.multiply(out, alpha, out=out)
        np.add(out, beta, out=out)
        np.clip(out, 0, 1, out=out)
    else:
        raise ValueError(f"unknown fused activation {act!r}")


# ----------------------------------------------------------------------------- dtypes and scratch

ONNX_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "object", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz",
    19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4_e2m1fn",
    24: "float8_e8m0fnu", 25: "uint2", 26: "int2", 27: "float6_e2m3fn", 28: "float6_e3m2fn",
}
"""ONNX TensorProto data types by number; strings are numpy object arrays."""


def onnx_dtype(code: int, ctx: OpContext) -> np.dtype:
    """The numpy dtype of an ONNX data type number, or a ShapeError naming the node and the fix."""
    name = ONNX_DTYPES.get(int(code))
    if name is None:
        raise ShapeError(f"{ctx.name}: {ctx.op_type} names data type {code}, which ONNX does not "
                         f"define; use a TensorProto.DataType value")
    try:
        return dtype_from_name(name)
    except (TypeError, AttributeError):
        raise ShapeError(f"{ctx.name}: {ctx.op_type} needs type {name}, which numpy only knows "
                         f"through the ml_dtypes package; install it, or cast to float32 instead") from None


def carve(workspace: np.ndarray | None, *specs: tuple[tuple[int, ...], np.dtype]) -> list[np.ndarray]:
    """Consecutive ALIGN-aligned C-contiguous arrays of the given (shape, dtype) in a workspace."""
    if workspace is None:
        workspace = np.empty(0, np.uint8)
    views = []
    offset = 0
    for shape, dtype in specs:
        nbytes = numel(shape) * np.dtype(dtype).itemsize
        views.append(workspace[offset:offset + nbytes].view(dtype).reshape(shape))
        offset += align(nbytes)
    return views


def carve_size(*specs: tuple[tuple[int, ...], np.dtype]) -> int:
    """Workspace bytes `carve` needs for these arrays."""
    return sum(align(numel(shape) * np.dtype(dtype).itemsize) for shape, dtype in specs)
