"""Custom operators packed in the model file: Python and C kernels, declarative and Python shape
functions, on-demand packing, a registry per model, the trust rule, checked (debug) runs, the C
boundary, and a runtime that needs neither onnx nor the code that defined the operators."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.format import HEADER, Part
from omrt.format.container import VERSION, OmFile, write
from omrt.kernels import base as kernel_base
from omrt.format.kernelstore import NATIVE_OP, Packed
from omrt.native import custom as native_custom
from omrt.native import loader
from omrt.native.elf import exported_functions
from omrt.native.build import compiler
from conftest import run_without_onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(0)

needs_cc = pytest.mark.skipif(compiler() is None, reason="no C compiler on this host")


# ----------------------------------------------------------------------------- the operators

def mish(inputs, outputs, workspace, attrs):
    x = inputs[0]
    np.multiply(x, np.tanh(np.logaddexp(0, x)), out=outputs[0])


def same_as_input(inputs, attrs):
    return [(inputs[0].dtype, inputs[0].shape)]


def mish_reference(x):
    return x * np.tanh(np.logaddexp(0, x))


FAST_GELU_C = r"""
#include <math.h>
#include "omrt_custom.h"

OMRT_EXPORT int fast_gelu(const omrt_tensor *in, int n_in, const omrt_tensor *out, int n_out,
                          void *workspace, size_t workspace_bytes, const char *attrs,
                          char *error, size_t error_bytes) {
    if (n_in != 1 || n_out != 1) OMRT_FAIL("FastGelu takes one input and gives one output");
    if (in[0].dtype != OMRT_FLOAT) OMRT_FAIL("FastGelu takes float32, not dtype %d", in[0].dtype);
    const float scale = (float)omrt_attr_number(attrs, "scale", 1.0);
    const float *x = in[0].data;
    float *y = out[0].data;
    for (int64_t i = 0; i < in[0].size; i++) {
        float v = x[i] * scale;
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
    return 0;
}
"""


def fast_gelu_reference(x, scale=1.0):
    v = x.astype(np.float64) * scale
    return 0.5 * v * (1 + np.tanh(0.7978845608 * (v + 0.044715 * v ** 3)))


SWIGLU_C = r"""
#include <math.h>
#include "omrt_custom.h"

/* y[..., j] = a * silu(b), a = x[..., j], b = x[..., half + j]; row norms of y in the workspace */
OMRT_EXPORT int swiglu(const omrt_tensor *in, int n_in, const omrt_tensor *out, int n_out,
                       void *workspace, size_t workspace_bytes, const char *attrs,
                       char *error, size_t error_bytes) {
    const omrt_tensor *x = &in[0];
    int64_t cols = x->shape[x->rank - 1], half = cols / 2, rows = x->size / cols;
    if (workspace_bytes < (size_t)rows * sizeof(double)) OMRT_FAIL("workspace of %zu bytes", workspace_bytes);
    double *norms = workspace;
    const float *src = x->data;
    float *y = out[0].data;
    for (int64_t r = 0; r < rows; r++) {
        norms[r] = 0.0;
        for (int64_t j = 0; j < half; j++) {
            float a = src[r * cols + j], b = src[r * cols + half + j];
            y[r * half + j] = a * b / (1.0f + expf(-b));
            norms[r] += (double)y[r * half + j] * y[r * half + j];
        }
    }
    return 0;
}
"""


def swiglu_reference(x):
    a, b = np.split(x.astype(np.float64), 2, axis=-1)
    return a * b / (1 + np.exp(-b))


def mish_op(**kw) -> omrt.CustomOp:
    return omrt.CustomOp("com.acme", "Mish", infer=same_as_input, python=mish, **kw)


def fast_gelu_op(**kw) -> omrt.CustomOp:
    return omrt.CustomOp("com.acme", "FastGelu", infer=omrt.OutputRule(like=0), c_source=FAST_GELU_C,
                         symbol="fast_gelu", attrs={"scale": 1.0}, **kw)


def swiglu_op() -> omrt.CustomOp:
    return omrt.CustomOp("com.acme", "SwiGLU", infer=omrt.OutputRule(like=0, dims={-1: "in0[-1] // 2"}),
                         c_source=SWIGLU_C, symbol="swiglu", workspace="8 * size(in0) // in0[-1]")


# ----------------------------------------------------------------------------- the models

W = RNG.standard_normal((16, 16)).astype(np.float32) / 4


def chain_model(ops=("FastGelu", "Mish"), batch=4, attrs=None) -> "onnx.ModelProto":
    """x[batch, 16] -> MatMul(W) -> each custom op in turn -> Add(x) -> y."""
    nodes, prev = [helper.make_node("MatMul", ["x", "W"], ["h0"])], "h0"
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [prev], [f"h{i + 1}"], domain="com.acme", name=f"{op}_{i}",
                                      **(attrs or {}).get(op, {})))
        prev = f"h{i + 1}"
    nodes.append(helper.make_node("Add", [prev, "x"], ["y"]))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16])],
                          [numpy_helper.from_array(W, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])


def unary_model(op: str, dtype=TensorProto.FLOAT, shape=("N", 16), out_shape=None):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], domain="com.acme")], "unary",
                          [helper.make_tensor_value_info("x", dtype, list(shape))],
                          [helper.make_tensor_value_info("y", dtype, list(out_shape or shape))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])


def close(got, want):
    """Within float32 rounding of the result's magnitude, whatever the summation order."""
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)


# ----------------------------------------------------------------------------- running them

@needs_cc
def test_python_and_c_custom_ops_run_and_match_numpy(tmp_path):
    path = str(tmp_path / "chain.om")
    omrt.compile(chain_model(attrs={"FastGelu": {"scale": 0.5}}), path, custom_ops=[fast_gelu_op(), mish_op()])
    model = omrt.load(path, trust_kernels=True)
    assert [op.status for op in model.custom_ops] == ["ready", "ready"]
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    y = np.empty((4, 16), np.float32)
    sess = model.session(zero_copy="always")
    sess.bind("x", x)
    sess.bind("y", y)
    sess.run()
    close(y, mish_reference(fast_gelu_reference(x @ W, scale=0.5)) + x)
    assert sess.stats.bytes_copied == 0


@needs_cc
def test_declarative_shape_rule_and_workspace_expression(tmp_path):
    path = str(tmp_path / "swiglu.om")
    omrt.compile(unary_model("SwiGLU", shape=("N", 32), out_shape=("N", 16)), path, custom_ops=[swiglu_op()])
    model = omrt.load(path, trust_kernels=True)
    for n in (1, 5):
        x = RNG.standard_normal((n, 32)).astype(np.float32)
        close(model.session().run({"x": x})["y"], swiglu_reference(x))
        task = model.prepared({"x": (n, 32)}).program.tasks[0]
        assert task.workspace_size == 8 * n


@needs_cc
def test_a_prebuilt_shared_library_runs(tmp_path):
    (tmp_path / "gelu.c").write_text(FAST_GELU_C)
    subprocess.run(compiler().split() + ["-O2", "-shared", "-fPIC", "-I", native_custom.INCLUDE, "gelu.c", "-o",
                                         "libgelu.so", "-lm"], cwd=tmp_path, check=True)
    op = omrt.CustomOp("com.acme", "FastGelu", infer=omrt.OutputRule(), shared_library=tmp_path / "libgelu.so",
                       symbol="fast_gelu")
    omrt.compile(unary_model("FastGelu"), str(tmp_path / "m.om"), custom_ops=[op])
    model = omrt.load(str(tmp_path / "m.om"), trust_kernels=True)
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    close(model.session().run({"x": x})["y"], fast_gelu_reference(x))
    assert model.kernels[0].target["compiler"] == "prebuilt"


def test_a_custom_op_inside_a_subgraph_runs(tmp_path):
    then = helper.make_graph([helper.make_node("Mish", ["x"], ["t"], domain="com.acme")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 16])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 16])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "if",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.acme", 1)])
    omrt.compile(m, str(tmp_path / "if.om"), custom_ops=[mish_op()])
    sess = omrt.load(str(tmp_path / "if.om"), trust_kernels=True).session()
    x = RNG.standard_normal((2, 16)).astype(np.float32)
    close(sess.run({"c": np.array(True), "x": x})["y"], mish_reference(x))
    close(sess.run({"c": np.array(False), "x": x})["y"], -x)


def test_kernels_given_as_module_source_with_helpers(tmp_path):
    source = textwrap.dedent("""
        import math

        def _softplus(x):
            return np.logaddexp(0, x)

        def run(inputs, outputs, workspace, attrs):
            outputs[0][...] = inputs[0] * np.tanh(_softplus(inputs[0])) * attrs["gain"]
    """)
    op = omrt.CustomOp("com.acme", "Mish", infer=omrt.OutputRule(), python=source, symbol="run", attrs={"gain": 2.0})
    omrt.compile(unary_model("Mish"), str(tmp_path / "m.om"), custom_ops=[op])
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    y = omrt.load(str(tmp_path / "m.om"), trust_kernels=True).session().run({"x": x})["y"]
    close(y, 2 * mish_reference(x))


# ----------------------------------------------------------------------------- what is packed

@needs_cc
def test_only_the_operators_the_model_uses_are_packed(tmp_path):
    unused = omrt.CustomOp("com.acme", "Unused", infer=omrt.OutputRule(), python=mish)
    path = str(tmp_path / "m.om")
    omrt.compile(unary_model("Mish"), path, custom_ops=[fast_gelu_op(), unused, mish_op()])
    f = OmFile(path)
    entries = json.loads(bytes(f.view(Part.CUSTOM_OPS)))["ops"]
    assert [(e["domain"], e["op_type"], e["kind"]) for e in entries] == [("com.acme", "Mish", 2)]
    model = omrt.load(path)
    assert [(k.kind, k.name) for k in model.kernels] == [(2, "com.acme::Mish")]
    assert model.kernels[0].data.decode() == textwrap.dedent(
        "def mish(inputs, outputs, workspace, attrs):\n"
        "    x = inputs[0]\n"
        "    np.multiply(x, np.tanh(np.logaddexp(0, x)), out=outputs[0])\n")
    _, major, minor, flags, *_ = HEADER.unpack_from(f.map, 0)
    assert (major, minor) == VERSION and flags & 0b1110 == 0b0010


@needs_cc
def test_partition_records_kinds_digests_and_attributes(tmp_path):
    path = str(tmp_path / "m.om")
    table = np.arange(4, dtype=np.float32)
    op = fast_gelu_op(version="2.1")
    op.attrs["table"] = table
    omrt.compile(chain_model(), path, custom_ops=[op, mish_op()])
    f = OmFile(path)
    assert f.flags & 0b1010 == 0b1010  # kinds 2 and 4
    model = omrt.load(path)
    gelu, mish_entry = (op.entry for op in model.custom_ops)
    library = next(k for k in model.kernels if k.kind == 4)
    assert (gelu.kind, gelu.record, gelu.symbol, gelu.version) == (4, library.name, "fast_gelu", "2.1")
    assert gelu.infer == {"rules": [{"like": 0, "dtype": None, "shape": None, "dims": {}}]}
    assert gelu.attributes["scale"] == 1.0 and np.array_equal(gelu.attributes["table"], table)
    assert library.target["symbols"] == ["fast_gelu"] and library.target["custom_abi"] == 1
    assert mish_entry.infer["symbol"] == "same_as_input" and "def same_as_input" in mish_entry.infer["python"]
    assert gelu.digest == hashlib.sha256(library.data).hexdigest()


@needs_cc
def test_one_library_per_distinct_binary(tmp_path):
    twice = omrt.CustomOp("com.acme", "Gelu2", infer=omrt.OutputRule(), c_source=FAST_GELU_C, symbol="fast_gelu")
    path = str(tmp_path / "m.om")
    omrt.compile(chain_model(ops=("FastGelu", "Gelu2")), path, custom_ops=[fast_gelu_op(), twice])
    model = omrt.load(path, trust_kernels=True)
    assert [k.kind for k in model.kernels if k.kind != 1] == [4]  # 1: omrt's own, for the MatMul
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    close(model.session().run({"x": x})["y"], fast_gelu_reference(fast_gelu_reference(x @ W)) + x)


# ----------------------------------------------------------------------------- one registry per model

def _foo(version: int, language: str) -> omrt.CustomOp:
    if language == "python":
        source = (f"def foo(inputs, outputs, workspace, attrs):\n"
                  f"    outputs[0][...] = inputs[0] * {version} + {version}\n")
        return omrt.CustomOp("com.acme", "Foo", infer=omrt.OutputRule(), python=source, symbol="foo",
                             version=str(version))
    source = ('#include "omrt_custom.h"\n'
              "OMRT_EXPORT int foo(const omrt_tensor *in, int ni, const omrt_tensor *out, int no, void *ws,\n"
              "                    size_t wsb, const char *attrs, char *error, size_t error_bytes) {\n"
              "    const float *x = in[0].data; float *y = out[0].data;\n"
              f"    for (int64_t i = 0; i < in[0].size; i++) y[i] = x[i] * {version} + {version};\n"
              "    return 0;\n}\n")
    return omrt.CustomOp("com.acme", "Foo", infer=omrt.OutputRule(), c_source=source, symbol="foo",
                         version=str(version))


@pytest.mark.parametrize("language", ["python", pytest.param("c", marks=needs_cc)])
def test_two_models_run_their_own_version_and_never_the_global_one(tmp_path, language):
    class GlobalFoo(kernel_base.Kernel):
        @classmethod
        def infer(cls, ctx, inputs):
            return [inputs[0]]

        def run(self, inputs, outputs, workspace):
            raise AssertionError("the process-global com.acme::Foo ran")

    kernel_base.register("Foo", domain="com.acme")(GlobalFoo)
    try:
        paths = []
        for version in (1, 2):
            paths.append(str(tmp_path / f"foo{version}.om"))
            omrt.compile(unary_model("Foo"), paths[-1], custom_ops=[_foo(version, language)])
        one, two = (omrt.load(p, trust_kernels=True) for p in paths)
        x = RNG.standard_normal((3, 16)).astype(np.float32)
        for _ in range(2):  # interleaved: neither model's load changes the other's operator
            close(one.session().run({"x": x})["y"], x * 1 + 1)
            close(two.session().run({"x": x})["y"], x * 2 + 2)
        assert [op.entry.version for op in one.custom_ops] == ["1"]
        assert [op.entry.version for op in two.custom_ops] == ["2"]
    finally:
        del kernel_base._REGISTRY[("com.acme", "Foo")]
    assert ("com.acme", "Foo") not in {(d, op) for d, op, _ in omrt.kernels.registered_ops()}


@needs_cc
def test_models_sharing_a_library_load_it_once_per_process(tmp_path):
    omrt.compile(chain_model(ops=("FastGelu",)), str(tmp_path / "a.om"), custom_ops=[fast_gelu_op()])
    omrt.compile(unary_model("FastGelu"), str(tmp_path / "b.om"), custom_ops=[fast_gelu_op()])
    omrt.compile(unary_model("Foo"), str(tmp_path / "c.om"), custom_ops=[_foo(3, "c")])
    code = textwrap.dedent(f"""
        import numpy as np, omrt
        from omrt.native.loader import stats
        before = stats()["content"]
        models = [omrt.load(path, trust_kernels=True) for path in {[str(tmp_path / n) for n in ("a.om", "b.om")]!r}]
        shared = stats()["content"]
        third = omrt.load({str(tmp_path / 'c.om')!r}, trust_kernels=True)
        x = np.ones((4, 16), np.float32)
        for m in models + [third]:
            m.session().run({{"x": x}})
        print(before, shared, stats()["content"])
    """)
    res = run_without_onnx(code)
    assert res.returncode == 0, res.stderr
    before, shared, after = (eval(part + "}") for part in res.stdout.strip().rstrip("}").split("} "))
    assert before == {"loads": 0, "reuses": 0}
    assert shared == {"loads": 1, "reuses": 1}  # two models, one dlopen
    assert after == {"loads": 2, "reuses": 1}  # another library is another load


# ----------------------------------------------------------------------------- trust

@needs_cc
def test_an_untrusted_file_loads_but_its_custom_ops_do_not_run(tmp_path):
    path = str(tmp_path / "chain.om")
    omrt.compile(chain_model(), path, custom_ops=[fast_gelu_op(), mish_op()])
    model = omrt.load(path)
    assert all(op.status.startswith("cannot run: its kernel is") for op in model.custom_ops)
    assert all(k.status.startswith("not loaded: its kernel is") for k in model.kernels if k.kind != 1)
    sess = model.session()
    with pytest.raises(omrt.KernelError, match=r"custom operator com\.acme::FastGelu \(node 'FastGelu_0'\) cannot "
                                               r"run: its kernel is machine code packed in the file, which is not "
                                               r"trusted: load it with trust_kernels=True"):
        sess.run({"x": np.ones((4, 16), np.float32)})


def test_untrusted_python_shape_functions_do_not_run_but_rules_still_plan(tmp_path):
    ran = tmp_path / "ran"
    source = (f"def infer(inputs, attrs):\n    open({str(ran)!r}, 'w').close()\n"
              f"    return [(inputs[0].dtype, inputs[0].shape)]\n")
    op = omrt.CustomOp("com.acme", "Mish", infer=_python_infer(source), python=mish)
    omrt.compile(unary_model("Mish"), str(tmp_path / "py.om"), custom_ops=[op])
    ran.unlink()
    model = omrt.load(str(tmp_path / "py.om"))
    with pytest.raises(omrt.KernelError, match=r"its shape function is Python code packed in the file, which runs "
                                               r"only when the file is trusted: load it with trust_kernels=True"):
        model.session().run({"x": np.ones((2, 16), np.float32)})
    assert not ran.exists()  # no code of an untrusted file ran
    omrt.compile(unary_model("Mish"), str(tmp_path / "rules.om"),
                 custom_ops=[omrt.CustomOp("com.acme", "Mish", infer=omrt.OutputRule(), python=mish)])
    model = omrt.load(str(tmp_path / "rules.om"))
    assert model.memory_sizes({"x": (8, 16)})["io_fallback"] > 0  # planned without trust
    with pytest.raises(omrt.KernelError, match=r"com\.acme::Mish .* cannot run: its kernel is Python source"):
        model.session().run({"x": np.ones((8, 16), np.float32)})


def _python_infer(source: str):
    """An infer function defined by `source` (its packed source is `source` itself)."""
    import linecache

    name = f"<infer {abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace: dict = {}
    exec(compile(source, name, "exec"), namespace)
    return namespace["infer"]


# ----------------------------------------------------------------------------- bad input

def _bad_op(kernel: str, shape_rule: omrt.OutputRule | None = None) -> omrt.CustomOp:
    return omrt.CustomOp("com.acme", "Bad", infer=shape_rule or omrt.OutputRule(), python=kernel, symbol="run")


@pytest.mark.parametrize("kernel, message", [
    ("def run(inputs, outputs, workspace, attrs):\n    outputs[0][:, :8] = inputs[0][:, :8]\n",
     r"custom operator com\.acme::Bad \(node 'Bad_0'\): its kernel left 16 of 32 elements of output 0 unwritten "
     r"\(float32 \(2, 16\), as its infer function gives it\); make infer and the kernel agree"),
    ("def run(inputs, outputs, workspace, attrs):\n    outputs[0][...] = np.concatenate([inputs[0], inputs[0]], 1)\n",
     r"custom operator com\.acme::Bad \(node 'Bad_0'\): in a checked run its kernel wrote a value that does not fit "
     r"its outputs float32 \(2, 16\)"),
])
def test_a_checked_run_catches_a_kernel_that_disagrees_with_its_infer(tmp_path, kernel, message):
    omrt.compile(unary_model("Bad", shape=(2, 16)), str(tmp_path / "bad.om"), custom_ops=[_bad_op(kernel)])
    model = omrt.load(str(tmp_path / "bad.om"), trust_kernels=True)
    x = np.ones((2, 16), np.float32)
    model.custom_ops.debug = True
    with pytest.raises(omrt.KernelError, match=message):
        model.session().run({"x": x})


@needs_cc
def test_a_checked_run_catches_a_c_kernel_writing_past_its_output(tmp_path, monkeypatch):
    source = ('#include "omrt_custom.h"\n'
              "OMRT_EXPORT int run(const omrt_tensor *in, int ni, const omrt_tensor *out, int no, void *ws,\n"
              "                    size_t wsb, const char *attrs, char *error, size_t error_bytes) {\n"
              "    float *y = out[0].data;\n"
              "    for (int64_t i = 0; i < in[0].size + 4; i++) y[i] = 1.0f;  /* 4 floats too many */\n"
              "    return 0;\n}\n")
    op = omrt.CustomOp("com.acme", "Bad", infer=omrt.OutputRule(), c_source=source, symbol="run")
    omrt.compile(unary_model("Bad", shape=(2, 16)), str(tmp_path / "bad.om"), custom_ops=[op])
    monkeypatch.setenv("OMRT_CHECK_CUSTOM_OPS", "1")  # checks from load on, no code change
    model = omrt.load(str(tmp_path / "bad.om"), trust_kernels=True)
    assert model.custom_ops.debug
    with pytest.raises(omrt.KernelError, match=r"custom operator com\.acme::Bad \(node 'Bad_0'\): its kernel wrote "
                                               r"past the end of output 0 \(float32 \(2, 16\), as its infer "
                                               r"function gives it\)"):
        model.session().run({"x": np.ones((2, 16), np.float32)})


def test_a_kernel_that_returns_or_rebinds_instead_of_writing_is_an_error(tmp_path):
    for body, message in (("return inputs[0] * 2", r"its kernel returned a value; a kernel writes into the outputs"),
                          ("outputs[0] = inputs[0] * 2", r"its kernel replaced outputs\[0\] instead of writing"),
                          ("outputs.clear()", r"its kernel changed the list of outputs \(1 given, 0 left\)")):
        kernel = f"def run(inputs, outputs, workspace, attrs):\n    {body}\n"
        omrt.compile(unary_model("Bad"), str(tmp_path / "bad.om"), custom_ops=[_bad_op(kernel)])
        with pytest.raises(omrt.KernelError, match=message):
            omrt.load(str(tmp_path / "bad.om"), trust_kernels=True).session().run({"x": np.ones((2, 16), np.float32)})


@needs_cc
def test_the_python_side_of_the_header_is_the_headers_layout(tmp_path):
    """omrt_tensor's fields and the OMRT_* dtype codes, as the C compiler lays them out, against
    the ctypes structure and the table the calls are made with."""
    from omrt.native import build
    from omrt.native.custom import DTYPE_CODES, Tensor
    from omrt.native.library import SOURCES

    names = {1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 9: "BOOL",
             10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64"}
    fields = [name for name, _ in Tensor._fields_]
    program = "\n".join(["#include <stdio.h>", "#include <stddef.h>", '#include "omrt_custom.h"', "int main(void) {",
                         '  printf("%zu\\n", sizeof(omrt_tensor));',
                         *[f'  printf("%zu\\n", offsetof(omrt_tensor, {f}));' for f in fields],
                         *[f'  printf("%d\\n", OMRT_{n});' for n in names.values()], "  return 0;", "}"])
    (tmp_path / "layout.c").write_text(program)
    exe = tmp_path / "layout"
    subprocess.run(build.compiler().split() + ["-I", SOURCES, "-o", str(exe), str(tmp_path / "layout.c")], check=True)
    printed = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert printed[0] == ctypes.sizeof(Tensor)
    assert printed[1:1 + len(fields)] == [getattr(Tensor, f).offset for f in fields]
    assert printed[1 + len(fields):] == list(names)
    assert sorted(DTYPE_CODES.values()) == list(names)
    assert all(code == helper.np_dtype_to_tensor_dtype(dt) for dt, code in DTYPE_CODES.items())


@needs_cc
def test_a_c_library_states_what_it_needs_not_what_built_it(tmp_path):
    from omrt.native import elf

    omrt.compile(unary_model("FastGelu"), str(tmp_path / "m.om"), custom_ops=[fast_gelu_op()])
    [record] = [r for r in _records(str(tmp_path / "m.om")) if r.kind == NATIVE_OP]
    assert record.target["elf_machine"] == elf.identity(record.data)[2]
    if record.target["libc"] == "glibc":  # the glibc its symbols need, older than the build host's
        assert record.target["libc_version"] == elf.glibc_needed(record.data)


def _records(path: str) -> list[Packed]:
    from omrt.format import OmFile, Part
    from omrt.format.kernelstore import unpack

    return unpack(OmFile(path).view(Part.KERNELS), path)


@needs_cc
def test_a_c_kernel_error_is_raised_with_its_message(tmp_path):
    omrt.compile(unary_model("FastGelu", dtype=TensorProto.DOUBLE), str(tmp_path / "m.om"), custom_ops=[fast_gelu_op()])
    with pytest.raises(omrt.KernelError, match=r"custom operator com\.acme::FastGelu \(node 'FastGelu_0'\): its C "
                                               r"kernel fast_gelu failed \(returned 1\): FastGelu takes float32, not "
                                               r"dtype 11"):
        omrt.load(str(tmp_path / "m.om"), trust_kernels=True).session().run({"x": np.ones((2, 16))})


@needs_cc
def test_c_source_that_does_not_compile_gives_the_compilers_message_and_writes_nothing(tmp_path):
    op = omrt.CustomOp("com.acme", "FastGelu", infer=omrt.OutputRule(), symbol="fast_gelu",
                       c_source=FAST_GELU_C.replace("float v = x[i] * scale;", "float v = x[i] * scael;"))
    with pytest.raises(omrt.CompileError, match=r"(?s)building the C source of custom operator com\.acme::FastGelu "
                                                r"with .* failed:.*op\.c:\d+:\d+: error: .scael. undeclared"):
        omrt.compile(unary_model("FastGelu"), str(tmp_path / "m.om"), custom_ops=[op])
    assert os.listdir(tmp_path) == []


@needs_cc
def test_a_library_without_the_entry_point_is_refused(tmp_path):
    op = omrt.CustomOp("com.acme", "FastGelu", infer=omrt.OutputRule(), c_source=FAST_GELU_C, symbol="gelu_fast")
    with pytest.raises(omrt.CompileError, match=r"custom operator library custom-[0-9a-f]{16}: the library has no "
                                                r"entry point 'gelu_fast' \(it exports fast_gelu\)"):
        omrt.compile(unary_model("FastGelu"), str(tmp_path / "m.om"), custom_ops=[op])
    assert os.listdir(tmp_path) == []


@needs_cc
def test_a_file_whose_library_lacks_the_entry_point_is_refused_at_load(tmp_path):
    """A file put together by hand (or repacked): the library is never loaded, the op never runs."""
    path = str(tmp_path / "m.om")
    omrt.compile(unary_model("FastGelu"), path, custom_ops=[fast_gelu_op()])
    entries = json.loads(bytes(OmFile(path).view(Part.CUSTOM_OPS)))
    entries["ops"][0]["symbol"] = "gelu_fast"
    _rewrite(path, {Part.CUSTOM_OPS: json.dumps(entries).encode()}, kernels=lambda k: {**k, "symbols": ["gelu_fast"]})
    before = loader.stats()["content"]["loads"]
    with pytest.warns(RuntimeWarning, match=r"it has no entry point 'gelu_fast'"):
        model = omrt.load(path, trust_kernels=True)
    assert loader.stats()["content"]["loads"] == before
    assert model.custom_ops.ops[0].status.startswith("cannot run: its C library does not load on this host (it "
                                                     "has no entry point 'gelu_fast')")


def test_a_damaged_custom_ops_partition_is_a_format_error(tmp_path):
    path = str(tmp_path / "m.om")
    omrt.compile(unary_model("Mish"), path, custom_ops=[mish_op()])
    entries = json.loads(bytes(OmFile(path).view(Part.CUSTOM_OPS)))
    for field, value, message in (("digest", "00" * 32, r"does not match the digest custom operator com\.acme::Mish "
                                                        r"names"),
                                  ("record", "nothing", r"names the kernel record 'nothing' of kind 2, which the "
                                                        r"KERNELS partition does not hold"),
                                  ("workspace", [1], r"has a 'workspace' of type list"),
                                  ("infer", {"rules": [{"like": "x"}]}, r"has a malformed shape function")):
        broken = json.loads(json.dumps(entries))
        broken["ops"][0][field] = value
        _rewrite(path, {Part.CUSTOM_OPS: json.dumps(broken).encode()})
        with pytest.raises(omrt.FormatError, match=message):
            omrt.load(path)
        _rewrite(path, {Part.CUSTOM_OPS: json.dumps(entries).encode()})
    omrt.load(path)


def _rewrite(path: str, parts: dict, kernels=None) -> None:
    """Write `path` again with some partitions replaced (digests recomputed, as a forger would)."""
    from omrt.format.kernelstore import pack, unpack

    f = OmFile(path)
    data = {Part(t): bytes(f.view(Part(t), verify=False)) for t in f.entries}
    if kernels is not None:
        records = unpack(memoryview(data[Part.KERNELS]), path)
        for r in records:
            r.target = kernels(r.target)
        data[Part.KERNELS] = pack(records)
    data.update(parts)
    flags = f.flags
    f.close()
    write(path, [(t, lambda sink, b=b: sink(b)) for t, b in data.items()], flags=flags)


@pytest.mark.parametrize("kw, message", [
    ({"domain": "", "python": mish}, r"give it a domain of its own"),
    ({"domain": "omrt", "python": mish}, r"give it a domain of its own"),
    ({"domain": "ai.onnx.ml", "python": mish}, r"give it a domain of its own"),
    ({"python": mish, "c_source": "int x;"}, r"give exactly one kernel, python=, c_source= or shared_library= "
                                              r"\(got python, c_source\)"),
    ({"c_source": "int x;"}, r"name the kernel's function with symbol="),
    ({"python": mish, "infer": "like input 0"}, r"infer must be a function or omrt.OutputRule\(s\)"),
    ({"python": mish, "workspace": -1}, r"workspace must be a number of bytes"),
])
def test_bad_definitions_are_refused(kw, message):
    kw = {"domain": "com.acme", "op_type": "Op", "infer": omrt.OutputRule(), **kw}
    with pytest.raises(omrt.CompileError, match=message):
        omrt.CustomOp(**kw)


def test_code_that_cannot_be_packed_is_refused_at_compile(tmp_path):
    factor = 3.0

    def scaled(inputs, outputs, workspace, attrs):
        outputs[0][...] = inputs[0] * factor

    cases = [(omrt.CustomOp("com.acme", "Mish", infer=lambda inputs, attrs: [inputs[0]], python=mish),
              r"its infer function must be a function defined with def"),
             (omrt.CustomOp("com.acme", "Mish", infer=omrt.OutputRule(), python=scaled),
              r"its kernel scaled uses variables of the function around it \(factor\); packed source runs on its own: "
              r"pass values as attrs= instead"),
             (omrt.CustomOp("com.acme", "Mish", infer=omrt.OutputRule(), python="def f(:\n", symbol="f"),
              r"its kernel: its Python source does not run: SyntaxError"),
             (omrt.CustomOp("com.acme", "Mish", infer=omrt.OutputRule(), python=mish, since=3),
              r"custom operator com\.acme::Mish exists from opset 3 of 'com\.acme'; the model imports opset 1"),
             (omrt.CustomOp("com.acme", "Mish", infer=omrt.OutputRule(dims={0: "__import__('os')"}), python=mish),
              r"custom operator com\.acme::Mish \(node 'Mish_0'\): \"__import__\('os'\)\" uses Call, which is not "
              r"allowed")]
    for op, message in cases:
        with pytest.raises(omrt.OmrtError, match=message):
            omrt.compile(unary_model("Mish", shape=(2, 16)), str(tmp_path / "m.om"), custom_ops=[op])
    assert os.listdir(tmp_path) == []
    with pytest.raises(omrt.CompileError, match=r"node 'FastGelu_0' sets attribute 'sclae', which custom operator "
                                                r"com\.acme::FastGelu does not declare \(it declares "
                                                r"\['scale'\]\): add it to attrs= with its default"):
        omrt.compile(chain_model(ops=("FastGelu",), attrs={"FastGelu": {"sclae": 2.0}}), str(tmp_path / "m.om"),
                     custom_ops=[fast_gelu_op()])
    with pytest.raises(omrt.CompileError, match=r"custom operator com\.acme::Mish is given twice"):
        omrt.compile(unary_model("Mish"), str(tmp_path / "m.om"), custom_ops=[mish_op(), mish_op()])


def test_a_model_whose_op_is_not_defined_names_the_way_to_define_it(tmp_path):
    with pytest.raises(omrt.UnsupportedOpError, match=r"no kernel in omrt for com\.acme::Mish at opset 1 \(node "
                                                      r"'Mish_0'\); .* or define it as a custom operator "
                                                      r"\(omrt\.CustomOp, docs/custom_ops\.md\)"):
        omrt.compile(unary_model("Mish"), str(tmp_path / "m.om"))


@pytest.mark.parametrize("text, want", [
    ("in0[-1] // 2", 8), ("size(in0) * 4", 512), ("rank(in1)", 1), ("max(in0[0], heads) - 1", 7),
    ("in0[0]", "N"), ("in0[0] * 2", "custom_"),
])
def test_rule_expressions(text, want):
    from omrt.ir import TensorInfo
    from omrt.kernels.custom import evaluate

    inputs = [TensorInfo(np.dtype(np.float32), (8, 16)), TensorInfo(np.dtype(np.float32), (3,))]
    if isinstance(want, str):
        inputs[0] = TensorInfo(np.dtype(np.float32), ("N", 16))
        got = evaluate(text, inputs, {}, "op")
        assert got == want if want == "N" else got.startswith(want)
    else:
        assert evaluate(text, inputs, {"heads": 4}, "op") == want


@pytest.mark.parametrize("text, why", [
    ("in0", r"uses the shape in0 as a number"), ("in2[0]", r"reads input 2, which the node does not have"),
    ("in0[5]", r"reads axis 5 of a rank-2 input"), ("x.y", r"uses Attribute"), ("2 ** 8", r"uses BinOp"),
    ("in0[0] // 0", r"divides by zero"), ("9" * 300, r"is not an expression of at most 256 characters"),
    ("alpha", r"names 'alpha', which is neither an input nor an integer attribute"),
])
def test_bad_rule_expressions_are_shape_errors(text, why):
    from omrt.ir import TensorInfo
    from omrt.kernels.custom import evaluate

    with pytest.raises(omrt.ShapeError, match=why):
        evaluate(text, [TensorInfo(np.dtype(np.float32), (8, 16))], {"alpha": 0.5}, "op")


# ----------------------------------------------------------------------------- the C boundary

@needs_cc
def test_the_c_entry_checks_every_tensor_before_the_call():
    data, _ = native_custom.compile_source(FAST_GELU_C, "test")
    record = Packed(NATIVE_OP, "test", "test", {"symbols": ["fast_gelu"]}, data)
    entry = native_custom.Entry(loader.open_library(record, "fast_gelu"), "fast_gelu")
    x = np.ones((4, 4), np.float32)
    y = np.empty((4, 4), np.float32)
    entry([x], [y], None, b"{}", "op")
    close(y, fast_gelu_reference(x))
    for inputs, outputs, message in (([x], [y[:, :2]], r"output 0 is not a writable, aligned, C-contiguous array"),
                                     ([x.T], [y], r"input 0 is not an aligned, C-contiguous array"),
                                     ([x], [np.empty(4, object)], r"output 0 has dtype object, which omrt_custom.h "
                                                                  r"has no code for"),
                                     ([y], [y], r"output 0 overlaps another tensor"),
                                     ([x], [_read_only(y)], r"output 0 is not a writable")):
        with pytest.raises(omrt.KernelError, match=message):
            entry(inputs, outputs, None, b"{}", "op")


def _read_only(a):
    v = a.view()
    v.flags.writeable = False
    return v


@needs_cc
def test_exported_functions_are_read_from_the_elf_without_loading_it():
    data, _ = native_custom.compile_source(SWIGLU_C + FAST_GELU_C.replace('#include "omrt_custom.h"', ""), "test")
    assert {"swiglu", "fast_gelu"} <= exported_functions(data)
    with pytest.raises(ValueError, match="no ELF header"):
        exported_functions(b"MZ" + data[2:])
    with pytest.raises(ValueError, match="cut short"):
        exported_functions(data[:200])


# ----------------------------------------------------------------------------- command line

@needs_cc
def test_cli_compile_with_custom_op_file(tmp_path):
    import onnx

    onnx.save(chain_model(), str(tmp_path / "chain.onnx"))
    (tmp_path / "gelu.c").write_text(FAST_GELU_C)
    (tmp_path / "ops.py").write_text(textwrap.dedent('''
        import pathlib
        import numpy as np
        import omrt

        HERE = pathlib.Path(__file__).parent

        def mish(inputs, outputs, workspace, attrs):
            x = inputs[0]
            np.multiply(x, np.tanh(np.logaddexp(0, x)), out=outputs[0])

        OPS = [
            omrt.CustomOp("com.acme", "Mish", infer=omrt.OutputRule(), python=mish),
            omrt.CustomOp("com.acme", "FastGelu", infer=omrt.OutputRule(), c_source=(HERE / "gelu.c").read_text(),
                          symbol="fast_gelu", attrs={"scale": 1.0}),
        ]
    '''))
    omrt_cli = [sys.executable, "-m", "omrt.cli"]
    res = subprocess.run(omrt_cli + ["compile", "chain.onnx", "chain.om", "--custom-op", "ops.py"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "packing custom operators com.acme::Mish, com.acme::FastGelu" in res.stderr
    np.save(tmp_path / "x.npy", np.full((4, 16), 0.5, np.float32))
    res = subprocess.run(omrt_cli + ["run", "chain.om", "--input", "x=x.npy", "--trust-kernels", "--output-dir", "out"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    x = np.full((4, 16), 0.5, np.float32)
    close(np.load(tmp_path / "out" / "y.npy"), mish_reference(fast_gelu_reference(x @ W)) + x)
    res = subprocess.run(omrt_cli + ["inspect", "chain.om", "--trust-kernels"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert "custom operators:\n  com.acme::Mish (python kernel, output rules): ready\n  com.acme::FastGelu " \
           "(native kernel, output rules): ready" in res.stdout
    res = subprocess.run(omrt_cli + ["compile", "chain.onnx", "x.om", "--custom-op", "missing.py"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == "omrt: error: --custom-op missing.py: no such file"


# ----------------------------------------------------------------------------- without onnx, without the user's code

@needs_cc
def test_the_runtime_needs_neither_onnx_nor_the_code_that_defined_the_ops(tmp_path):
    omrt.compile(chain_model(), str(tmp_path / "chain.om"), custom_ops=[fast_gelu_op(), mish_op()])
    code = textwrap.dedent(f"""
        import sys, numpy as np, omrt
        x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
        y = omrt.load({str(tmp_path / 'chain.om')!r}, trust_kernels=True).session().run({{"x": x}})["y"]
        np.save({str(tmp_path / 'y.npy')!r}, y)
        assert not any(m.startswith(("onnx", "tests", "test_custom_ops", "conftest")) for m in sys.modules)
    """)
    res = run_without_onnx(code)
    assert res.returncode == 0, res.stderr
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    close(np.load(tmp_path / "y.npy"), mish_reference(fast_gelu_reference(x @ W)) + x)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory):
    """A virtual environment holding only numpy and this omrt (installed from a copy of the tree)."""
    root = tmp_path_factory.mktemp("venv")
    tree = root / "omrt-src"
    shutil.copytree(os.path.join(ROOT, "src"), tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), tree / name)
    venv = root / "env"
    python = str(venv / "bin" / "python")
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [python, "-m", "pip", "install", "-q", "--no-deps", str(tree)],
             [python, "-m", "pip", "install", "-q", "numpy"]]
    for step in steps:
        res = subprocess.run(step, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            pytest.skip(f"cannot build a fresh environment here ({' '.join(step[-3:])} failed: "
                        f"{res.stderr.strip().splitlines()[-1] if res.stderr.strip() else 'no message'})")
    return python


@needs_cc
def test_a_fresh_environment_with_only_numpy_runs_both_kinds_of_custom_op(tmp_path, fresh_venv):
    omrt.compile(unary_model("FastGelu"), str(tmp_path / "c.om"), custom_ops=[fast_gelu_op()])
    omrt.compile(unary_model("Mish"), str(tmp_path / "py.om"), custom_ops=[mish_op()])
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent("""
        import importlib.util, sys
        import numpy as np, omrt
        assert importlib.util.find_spec("onnx") is None, "onnx is installed"
        x = np.linspace(-4, 4, 48, dtype=np.float32).reshape(3, 16)
        for name in ("c", "py"):
            model = omrt.load(name + ".om", trust_kernels=True)
            np.save(name + ".npy", model.session().run({"x": x})["y"])
        print(omrt.__file__)
    """))
    res = subprocess.run([fresh_venv, "-I", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert ROOT not in res.stdout  # the environment's own omrt ran, not this tree's
    x = np.linspace(-4, 4, 48, dtype=np.float32).reshape(3, 16)
    close(np.load(tmp_path / "c.npy"), fast_gelu_reference(x))
    close(np.load(tmp_path / "py.npy"), mish_reference(x))
