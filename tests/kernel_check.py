"""Shared helpers for kernel tests: run one kernel through the full contract, compare to onnx.reference."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from omrt.kernels import OpContext, TensorInfo, lookup

RNG = np.random.default_rng(0)
"""Shared test data source; tests/conftest.py rewinds it before every test, so a test
draws the same data whatever ran before it (hypothesis runs vary in number)."""

GUARD = 256
"""Bytes after a kernel's workspace that run_kernel checks it left alone."""


def randn(*shape: int, dtype: type = np.float32) -> np.ndarray:
    """Standard-normal test data of `shape` in `dtype`, from RNG."""
    return RNG.standard_normal(shape).astype(dtype)


def _infos(inputs: Sequence[np.ndarray | None], const: Sequence[int] | None) -> list[TensorInfo | None]:
    infos: list[TensorInfo | None] = []
    for i, x in enumerate(inputs):
        if x is None:
            infos.append(None)
            continue
        known = (i in const) if const is not None else x.dtype.kind in "iub" and x.size <= 64
        infos.append(TensorInfo(x.dtype, tuple(x.shape), x if known else None))
    return infos


def run_kernel(op_type: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None,
               opset: int = 21, const: Sequence[int] | None = None, domain: str = "",
               native: Any = None, n_outputs: int | None = None) -> list[np.ndarray]:
    """infer -> prepare -> workspace -> run, the way the executor does; outputs pre-filled with junk.

    `const` lists the input indices whose values are known at plan time (default: small int tensors);
    `native` is the loaded native library the kernel may use; `n_outputs` how many outputs the node
    declares (default: all that infer gives). Also checks that `infer` agrees with what `run`
    produced, and that in-place declarations hold.
    """
    cls = lookup(op_type, opset, domain)
    ctx = OpContext(dict(attrs or {}), opset, name="test", op_type=op_type, n_outputs=n_outputs or 1,
                    native=native)
    infos = _infos(inputs, const)
    outs = cls.infer(ctx, infos)[:n_outputs]
    kernel = cls(ctx, infos, outs)
    nws = kernel.workspace()
    guarded = np.full(nws + GUARD, 0xCD, np.uint8)
    ws = guarded[:nws] if nws else None
    if cls.dynamic:
        results = kernel.run(list(inputs), [None] * len(outs), ws)
    else:
        results = []
        for o in outs:
            a = np.empty(o.shape, o.dtype)
            if a.dtype.kind == "f":
                a.fill(np.nan)
            results.append(a)
        assert kernel.run(list(inputs), results, ws) is None
        for oi, ii in cls.inplace.items():
            x = inputs[ii]
            if x is None or x.dtype != results[oi].dtype or x.shape != results[oi].shape:
                continue
            work = [np.array(v, copy=True) if v is not None else None for v in inputs]
            outs2 = [np.empty(o.shape, o.dtype) for o in outs]
            outs2[oi] = work[ii]
            kernel.run(work, outs2, ws)
            np.testing.assert_array_equal(outs2[oi], results[oi], err_msg=f"{op_type} in place")
    assert (guarded[nws:] == 0xCD).all(), f"{op_type} wrote past its {nws}-byte workspace"
    for o, r in zip(outs, results):
        assert r.dtype == o.dtype, (op_type, r.dtype, o.dtype)
        if o.static:
            assert tuple(r.shape) == tuple(o.shape), (op_type, r.shape, o.shape)
    return results


def reference(op_type: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None,
              opset: int = 21, n_outputs: int = 1, domain: str = "") -> list[np.ndarray]:
    """The onnx reference implementation's outputs for one node."""
    in_names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    out_names = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, in_names, out_names, domain=domain or None, **(attrs or {}))
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                    for n, x in zip(in_names, inputs) if x is not None]
    graph_outputs = [helper.make_value_info(n, onnx.TypeProto()) for n in out_names]
    graph = helper.make_graph([node], "g", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    feeds = {n: x for n, x in zip(in_names, inputs) if x is not None}
    return list(ReferenceEvaluator(model).run(None, feeds))


def check(op_type: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any] | None = None,
          opset: int = 21, rtol: float = 1e-5, atol: float = 1e-6, const: Sequence[int] | None = None,
          n_outputs: int = 1, native: Any = None) -> list[np.ndarray]:
    """Assert omrt's kernel matches onnx.reference in dtype, shape and values."""
    got = run_kernel(op_type, inputs, attrs, opset, const, native=native)
    want = reference(op_type, inputs, attrs, opset, n_outputs or len(got))
    assert len(got) >= len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype, (op_type, g.dtype, w.dtype)
        assert g.shape == w.shape, (op_type, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=op_type)
    return got
