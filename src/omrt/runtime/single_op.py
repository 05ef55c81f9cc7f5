"""`omrt.run_op`: one operator of omrt's kernel library, run straight into the caller's arrays.

Seed 000's single-operator execution forces zero copy: the caller owns every buffer. Here a
call is prepared once per signature (operator, attributes, input dtypes and shapes) and cached:
the kernel instance and its workspace are reused, and each call writes into the `outputs`
arrays given, like a numpy ufunc with `out=`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import BindError, InputError
from ..ir import TensorInfo
from ..kernels import OpContext, lookup
from ..kernels.base import Kernel, newest_opset
from ..memory import aligned_empty
from ..plan.infer import infer_outputs
from .executor import call_kernel


@dataclass
class _Prepared:
    kernel: Kernel
    outputs: list[TensorInfo]
    workspace: np.ndarray | None
    lock: threading.Lock


_CACHE: dict[tuple, _Prepared] = {}
_CACHE_LIMIT = 256
"""Signatures kept prepared; past that the cache starts afresh."""


def _frozen(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _prepare(op_type: str, domain: str, opset: int, attrs: dict,
             inputs: Sequence[np.ndarray | None]) -> _Prepared:
    ctx = OpContext(dict(attrs), opset, name=op_type, op_type=op_type)
    infos = [None if x is None else TensorInfo(x.dtype, x.shape) for x in inputs]
    cls = lookup(op_type, opset, domain)
    if cls.dynamic:
        raise InputError(f"{op_type}'s output shape depends on its input values; run_op writes into outputs "
                         f"the caller sized, so it cannot run {op_type}: compile a model instead")
    outs = infer_outputs(cls, ctx, infos)
    kernel = cls(ctx, infos, outs)
    size = kernel.workspace()
    return _Prepared(kernel, outs, aligned_empty(size) if size else None, threading.Lock())


def _check_inputs(op_type: str, inputs: Sequence[Any]) -> None:
    for i, x in enumerate(inputs):
        if x is not None and (not isinstance(x, np.ndarray) or not (x.flags.c_contiguous and x.flags.aligned)):
            raise InputError(f"{op_type} input {i}: pass an aligned, C-contiguous numpy array "
                             f"(np.ascontiguousarray copies one), or None for an absent optional input")


def _check_outputs(op_type: str, outputs: Sequence[Any], want: list[TensorInfo]) -> None:
    if len(outputs) != len(want):
        raise BindError(f"{op_type} gives {len(want)} outputs here; pass that many arrays")
    for i, (y, info) in enumerate(zip(outputs, want)):
        if not isinstance(y, np.ndarray) or y.dtype != info.dtype or y.shape != tuple(info.shape):
            got = f"{y.dtype} {y.shape}" if isinstance(y, np.ndarray) else type(y).__name__
            raise BindError(f"{op_type} output {i} is {info.dtype} {tuple(info.shape)}, the array given is "
                            f"{got}; pass np.empty({tuple(info.shape)}, np.{info.dtype.name})")
        if not (y.flags.c_contiguous and y.flags.writeable and y.flags.aligned):
            raise BindError(f"{op_type} output {i} must be a writable, aligned, C-contiguous array")


def _check_overlap(op_type: str, inputs: Sequence[Any], outputs: Sequence[np.ndarray]) -> None:
    """Refuse an output that shares memory with an input or another output: a kernel reads its
    inputs while it writes, and run_op does not copy to make that safe."""
    arrays = [x for x in inputs if x is not None]
    for i, y in enumerate(outputs):
        if any(np.may_share_memory(y, a) for a in arrays + list(outputs[:i])):
            raise BindError(f"{op_type} output {i} shares memory with an input or another output; pass an "
                            f"array of its own")


def run_op(op_type: str, inputs: Sequence[np.ndarray | None], outputs: Sequence[np.ndarray], *,
           domain: str = "", opset: int | None = None, **attrs: Any) -> Sequence[np.ndarray]:
    """Run one operator on `inputs`, writing into `outputs` (arrays of the result's dtype and
    shape, which the kernels write in place); returns `outputs`. Attributes are keywords, as ONNX
    names them; the opset defaults to the newest omrt has a kernel for."""
    _check_inputs(op_type, inputs)
    opset = newest_opset(op_type, domain) if opset is None else opset
    key = (op_type, domain, opset, _frozen(sorted(attrs.items())),
           tuple(None if x is None else (x.dtype.str, x.shape) for x in inputs))
    prepared = _CACHE.get(key)
    if prepared is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        prepared = _CACHE[key] = _prepare(op_type, domain, opset, attrs, inputs)
    _check_outputs(op_type, outputs, prepared.outputs)
    _check_overlap(op_type, inputs, outputs)
    with prepared.lock:
        call_kernel(prepared.kernel, op_type, op_type, list(inputs), list(outputs), prepared.workspace)
    return outputs
