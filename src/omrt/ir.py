"""omrt's own graph IR: what the importer produces, the passes rewrite and the `.om` file stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

Dim = int | str | None
"""A dimension: a size, a symbolic name, or None for "not known until run time"."""

Shape = tuple[Dim, ...]


def dtype_name(dtype: np.dtype) -> str:
    """A string that names `dtype` across processes: numpy's type string, or the ml_dtypes name."""
    try:
        if np.dtype(dtype.str) == dtype:
            return dtype.str
    except TypeError:
        pass
    return dtype.name


def dtype_from_name(name: str) -> np.dtype:
    """Inverse of `dtype_name`; narrow types (bfloat16, float8, int4, ...) need ml_dtypes."""
    try:
        return np.dtype(name)
    except TypeError:
        pass
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError(f"dtype {name!r} needs the ml_dtypes package (pip install ml_dtypes)") from None
    if not isinstance(getattr(ml_dtypes, name, None), type):
        raise TypeError(f"unknown dtype {name!r}")
    return np.dtype(getattr(ml_dtypes, name))


TENSOR, SEQUENCE, OPTIONAL = "tensor", "sequence", "optional"

CAPTURES = "_captures"
"""Attribute of a node with sub-graphs: the outer names its sub-graphs read (free variables). The
node's inputs end with the same values, in the same order, so the planner keeps them alive and the
runtime hands them over; the sub-graphs bind them by position to these names."""


@dataclass(frozen=True)
class TensorInfo:
    """What the planner knows about a value: dtype, shape and, for constants, the value.

    Besides tensors, a value may be a sequence of tensors or an optional: `kind` names the
    containers outermost first, joined by dots ("sequence", "optional", "optional.sequence"),
    around a tensor of `dtype` and `shape` (for a sequence, the shape its elements share, with
    None where they differ). At run time a sequence is a Python list of arrays and an optional is
    None or its element; neither ever lives in the arena.

    `shape` is None where not even the rank is known before run time: elements of sequences and
    optionals whose type leaves the shape out, and what is computed from them. A kernel may be
    handed one at compile time; when its `infer` fails on it, `omrt.plan.infer.propagate` leaves the
    outputs unknown in the same way (they are computed at run time anyway).
    """

    dtype: np.dtype
    shape: Shape | None
    value: Any = field(default=None, compare=False, repr=False)
    kind: str = TENSOR

    @staticmethod
    def of(array: np.ndarray) -> "TensorInfo":
        """The info of a known array (a constant)."""
        return TensorInfo(array.dtype, tuple(int(d) for d in array.shape), array)

    @property
    def is_tensor(self) -> bool:
        return self.kind == TENSOR

    @property
    def container(self) -> str:
        """The outermost container ("sequence" or "optional"), or "tensor"."""
        return self.kind.split(".", 1)[0]

    def element(self) -> "TensorInfo":
        """What the outermost container holds (a tensor's element is itself), without value."""
        rest = self.kind.split(".", 1)[1] if "." in self.kind else TENSOR
        return TensorInfo(self.dtype, self.shape, kind=rest)

    def wrapped(self, container: str) -> "TensorInfo":
        """This info inside `container` ("sequence" or "optional"), without value."""
        kind = container if self.is_tensor else f"{container}.{self.kind}"
        return TensorInfo(self.dtype, self.shape, kind=kind)

    @property
    def static(self) -> bool:
        """True for a tensor whose every dim is a concrete size."""
        return self.is_tensor and self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor; only for static shapes."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass
class Node:
    """One operator application; absent optional inputs are empty strings."""

    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    name: str = ""

    @property
    def label(self) -> str:
        """How errors name the node."""
        return self.name or f"{self.op_type}->{','.join(self.outputs)}"


@dataclass
class Graph:
    """A topologically ordered graph with the dtype and shape of every value."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    infos: dict[str, TensorInfo]
    constants: dict[str, np.ndarray]
    opsets: dict[str, int]
    name: str = "main"
    custom: dict[tuple[str, str], Any] = field(default_factory=dict)
    """The model's own operators, (domain, op_type) -> kernel class: the custom operators packed
    in its file (or given to the compiler), looked up before omrt's library
    (`omrt.kernels.base.kernel_of`). One dict shared by the graph, its sub-graphs and their copies,
    so every node of one model resolves the same way and no model sees another's."""

    def opset(self, domain: str) -> int:
        """The opset the model imports for `domain` (omrt-internal ops use 1)."""
        return self.opsets.get("" if domain == "ai.onnx" else domain, 1)

    def add_constant(self, name: str, value: np.ndarray) -> None:
        """Add (or replace) a constant together with its info."""
        self.constants[name] = value
        self.infos[name] = TensorInfo.of(value)

    def consumers(self) -> dict[str, list[int]]:
        """Value name -> indices of the nodes that read it."""
        uses: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for v in n.inputs:
                if v:
                    uses.setdefault(v, []).append(i)
        return uses

    def producers(self) -> dict[str, int]:
        """Value name -> index of the node that writes it."""
        return {v: i for i, n in enumerate(self.nodes) for v in n.outputs if v}

    def free_names(self) -> list[str]:
        """Names the graph reads but does not define: values a sub-graph captures from outer scopes."""
        defined = set(self.inputs) | set(self.constants)
        free: dict[str, None] = {}
        for n in self.nodes:
            free.update((v, None) for v in n.inputs if v and v not in defined)
            defined.update(v for v in n.outputs if v)
        free.update((v, None) for v in self.outputs if v not in defined)
        return list(free)


def subgraphs(node: Node) -> dict[str, Graph]:
    """A node's graph attributes by name."""
    return {key: v for key, v in node.attrs.items() if isinstance(v, Graph)}


def all_graphs(graph: Graph) -> Iterator[Graph]:
    """`graph` and every sub-graph nested in its nodes, outermost first."""
    yield graph
    for node in graph.nodes:
        for sub in subgraphs(node).values():
            yield from all_graphs(sub)
