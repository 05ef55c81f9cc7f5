"""omrt's own graph IR: what the importer produces, the passes rewrite and the `.om` file stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    return np.dtype(getattr(ml_dtypes, name))


@dataclass(frozen=True)
class TensorInfo:
    """What the planner knows about a tensor: dtype, shape and, for constants, the value."""

    dtype: np.dtype
    shape: Shape
    value: np.ndarray | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def of(array: np.ndarray) -> "TensorInfo":
        """The info of a known array (a constant)."""
        return TensorInfo(array.dtype, tuple(int(d) for d in array.shape), array)

    @property
    def static(self) -> bool:
        """True when every dim is a concrete size."""
        return all(isinstance(d, int) for d in self.shape)

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
