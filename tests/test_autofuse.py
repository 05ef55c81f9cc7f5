"""Autofuse: chains found per kind, generated kernels that agree with the unfused nodes and the
ONNX reference at 1 and 2 threads, their guards, and every path that runs the unfused nodes
instead (a guard miss, an untrusted file, a host that cannot load the kernels)."""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import omrt
from omrt.cli import main as cli
from omrt.errors import KernelError
from omrt.format import kernelstore
from omrt.ir import TensorInfo
from omrt.kernels import parallel
from omrt.kernels.fused import AutoFused, intermediate_bytes, is_fused
from omrt.native import build as native_build
from omrt.native import fused as native_fused
from omrt.native import loader
from omrt.native.fusegen import library_source
from omrt.plan import verify
from omrt.plan.infer import context
from omrt.zoo import scaled_error

pytestmark = pytest.mark.skipif(native_build.compiler() is None, reason="autofuse needs a C compiler")

RNG = np.random.default_rng(7)
TOL = 2e-6
"""Largest difference relative to the output's magnitude: a few float32 ulps, whatever the order
of sums and the thread count."""


def _model(nodes, inputs, outputs, inits=(), opset=17):
    vi = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph(nodes, "chain", [vi(n, s) for n, s in inputs], [vi(n, s) for n, s in outputs],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


X = [1, 8, 12, 12]


def hardsigmoid_mul():
    """x * HardSigmoid(x) (HardSwish as MobileNetV3 exporters write it)."""
    return _model([_n("Relu", ["x"], ["r"]), _n("HardSigmoid", ["r"], ["h"], alpha=1 / 6, beta=0.5),
                   _n("Mul", ["r", "h"], ["y"])], [("x", X)], [("y", X)])


def hardswish_arithmetic():
    """x * Clip(x + 3, 0, 6) / 6: the Clip is folded into the Add first, and taken from there."""
    return _model([_n("Add", ["x", "three"], ["a"]), _n("Clip", ["a", "zero", "six"], ["c"]),
                   _n("Div", ["c", "six"], ["d"]), _n("Mul", ["x", "d"], ["y"])], [("x", X)], [("y", X)],
                  [("three", 3.0), ("zero", 0.0), ("six", 6.0)])


def squeeze_excite():
    """x * HardSigmoid(s) with s per channel: the chain takes the feature map's shape."""
    return _model([_n("HardSigmoid", ["s"], ["h"], alpha=1 / 6, beta=0.5), _n("Mul", ["x", "h"], ["y"])],
                  [("x", X), ("s", [1, 8, 1, 1])], [("y", X)])


def residual_relu():
    """Add + Relu (the Relu folded into the Add by the activation pass), with a per-channel bias."""
    return _model([_n("Add", ["x", "r"], ["a"]), _n("Relu", ["a"], ["y"])], [("x", X), ("r", X)], [("y", X)])


def layernorm():
    """Residual Add, then LayerNormalization written out (ReduceMean/Sub/Pow/Add/Sqrt/Div/Mul/Add)."""
    d = 48
    return _model([_n("Add", ["x", "r"], ["s"]), _n("ReduceMean", ["s"], ["m"], axes=[-1]),
                   _n("Sub", ["s", "m"], ["dev"]), _n("Pow", ["dev", "two"], ["sq"]),
                   _n("ReduceMean", ["sq"], ["var"], axes=[-1]), _n("Add", ["var", "eps"], ["ve"]),
                   _n("Sqrt", ["ve"], ["sd"]), _n("Div", ["dev", "sd"], ["nrm"]), _n("Mul", ["nrm", "g"], ["sc"]),
                   _n("Add", ["sc", "b"], ["y"])], [("x", [2, 5, d]), ("r", [2, 5, d])], [("y", [2, 5, d])],
                  [("two", 2.0), ("eps", 1e-5), ("g", 1 + 0.1 * RNG.standard_normal(d)),
                   ("b", 0.1 * RNG.standard_normal(d))])


def masked_softmax():
    """Attention scores + the mask (broadcast over heads and queries), Softmax over the keys."""
    return _model([_n("Add", ["scores", "mask"], ["a"]), _n("Softmax", ["a"], ["y"], axis=-1)],
                  [("scores", [2, 3, 7, 37]), ("mask", [2, 1, 1, 37])], [("y", [2, 3, 7, 37])])


def gelu_residual():
    """Gelu written as Erf arithmetic (the Gelu pass makes it one node), then a residual Add."""
    return _model([_n("Div", ["x", "sqrt2"], ["q"]), _n("Erf", ["q"], ["e"]), _n("Add", ["e", "one"], ["p"]),
                   _n("Mul", ["x", "half"], ["xh"]), _n("Mul", ["xh", "p"], ["g"]), _n("Add", ["g", "r"], ["y"])],
                  [("x", [4, 40]), ("r", [4, 40])], [("y", [4, 40])],
                  [("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)])


def pooled():
    """A chain that ends in a reduction over the spatial axes, its elementwise part also read
    outside (so it is an output of the fused node too)."""
    return _model([_n("Sigmoid", ["x"], ["s"]), _n("Mul", ["x", "s"], ["y"]),
                   _n("GlobalAveragePool", ["y"], ["p"]), _n("Tanh", ["p"], ["t"])],
                  [("x", X)], [("y", X), ("t", [1, 8, 1, 1])])


def softmax_alone():
    """A classifier's last Softmax (opset 11: over the flattened axes from 1 on), a node alone:
    fused all the same, since numpy takes several passes over its rows."""
    return _model([_n("Softmax", ["x"], ["y"], axis=1)], [("x", [1, 1000, 1, 1])], [("y", [1, 1000, 1, 1])],
                  opset=11)


def layernorm_alone():
    """LayerNormalization as one node (opset 17), alone."""
    d = 48
    return _model([_n("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)], [("x", [2, 5, d])],
                  [("y", [2, 5, d])], [("g", 1 + 0.1 * RNG.standard_normal(d)), ("b", 0.1 * RNG.standard_normal(d))])


def sigmoid_alone():
    """A detector's last Sigmoid over its probability map, a node alone: fused all the same, since
    numpy takes four passes over its elements."""
    return _model([_n("Sigmoid", ["x"], ["y"])], [("x", [1, 1, 40, 40])], [("y", [1, 1, 40, 40])])


CHAINS = {
    "hardsigmoid_mul": (hardsigmoid_mul, ["Relu+HardSigmoid+Mul"]),
    "hardswish_arithmetic": (hardswish_arithmetic, ["Add+Clip+Div+Mul"]),
    "squeeze_excite": (squeeze_excite, ["HardSigmoid+Mul"]),
    "residual_relu": (residual_relu, ["Add+Relu"]),
    "layernorm": (layernorm, ["Add+ReduceMean+Sub+Pow+ReduceMean+Add+Sqrt+Div+Mul+Add"]),
    "masked_softmax": (masked_softmax, ["Add+Softmax"]),
    "gelu_residual": (gelu_residual, ["Gelu+Add"]),
    "pooled": (pooled, ["Sigmoid+Mul+GlobalAveragePool+Tanh"]),
    "softmax_alone": (softmax_alone, ["Softmax"]),
    "layernorm_alone": (layernorm_alone, ["LayerNormalization"]),
    "sigmoid_alone": (sigmoid_alone, ["Sigmoid"]),
}


def _feeds(model):
    return {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) * 3
            for i in model.graph.input}


@contextlib.contextmanager
def _threads(n):
    before = omrt.get_num_threads()
    omrt.set_num_threads(n)
    try:
        yield
    finally:
        omrt.set_num_threads(before)


def _compiled(tmp_path, make, autofuse=True, model=None):
    """(ONNX model, .om path, compile result) of `make()`, or of `model` when given."""
    model = make() if model is None else model
    path = str(tmp_path / f"{make.__name__}-{autofuse}.om")
    return model, path, omrt.compile(model, path, autofuse=autofuse)


@pytest.mark.parametrize("kind", list(CHAINS))
def test_each_chain_kind_is_found_and_fused(kind, tmp_path):
    make, labels = CHAINS[kind]
    _, path, res = _compiled(tmp_path, make)
    fused = [n for n in res.graph.nodes if is_fused(n)]
    assert [n.attrs["chain"] for n in fused] == labels
    assert [f.node.attrs["chain"] for f in res.fused] == labels
    model = omrt.load(path, trust_kernels=True)
    assert [k.status for k in model.kernels] == ["loaded", "loaded"]
    assert [k.kind for k in model.kernels] == [kernelstore.NATIVE, kernelstore.FUSED]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", list(CHAINS))
def test_fused_agrees_with_unfused_and_the_reference(kind, threads, tmp_path, monkeypatch):
    model, path, _ = _compiled(tmp_path, CHAINS[kind][0])
    _, plain, _ = _compiled(tmp_path, CHAINS[kind][0], autofuse=False, model=model)
    feeds = _feeds(model)
    want = dict(zip([o.name for o in model.graph.output], ReferenceEvaluator(model).run(None, feeds)))
    fused, unfused = omrt.load(path, trust_kernels=True), omrt.load(plain, trust_kernels=True)
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_BYTES", 0)  # these chains are small: split them anyway
    asked = []
    monkeypatch.setattr(parallel, "native_threads", lambda *a, _f=parallel.native_threads, **k: asked.append(
        _f(*a, **k)) or asked[-1])
    with _threads(threads):
        got = fused.session().run(feeds)
        base = unfused.session().run(feeds)
    assert sum(fused.native.fused.calls().values()) == 1
    assert asked[0] == threads  # the generated code ran on that many threads
    for name, w in want.items():
        assert scaled_error(got[name], w) <= TOL, name
        assert scaled_error(got[name], base[name]) <= TOL, name


def test_intermediates_leave_the_arena_and_the_plan_is_proved(tmp_path):
    model, path, res = _compiled(tmp_path, layernorm)
    _, plain, _ = _compiled(tmp_path, layernorm, autofuse=False, model=model)
    fused, unfused = omrt.load(path), omrt.load(plain)
    program = fused.default.program
    verify(program, fused.graph)
    (node,) = [n for n in fused.graph.nodes if is_fused(n)]
    intermediates = ["m", "dev", "sq", "var", "ve", "sd", "nrm", "sc", "s"]
    assert not set(intermediates) & set(program.places)
    assert set(intermediates) <= set(unfused.default.program.places)
    assert intermediate_bytes(node) == res.fused[0].intermediate_bytes == sum(
        unfused.graph.infos[v].nbytes for v in intermediates)
    assert program.arena_size <= unfused.default.program.arena_size
    assert len(program.tasks) == 1


def test_an_intermediate_read_outside_becomes_an_output(tmp_path):
    """The chain stops holding a value once it is read elsewhere: the value is written."""
    model = _model([_n("Mul", ["x", "x"], ["sq"]), _n("Add", ["sq", "one"], ["a"]), _n("Sqrt", ["a"], ["y"]),
                    _n("MatMul", ["sq", "w"], ["z"])], [("x", [6, 6])], [("y", [6, 6]), ("z", [6, 6])],
                   [("one", 1.0), ("w", RNG.standard_normal((6, 6)))])
    path = str(tmp_path / "m.om")
    res = omrt.compile(model, path)
    (node,) = [n for n in res.graph.nodes if is_fused(n)]
    assert set(node.outputs) == {"sq", "y"} and "a" not in res.graph.infos
    feeds = _feeds(model)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = omrt.load(path, trust_kernels=True).session().run(feeds)
    assert scaled_error(got["y"], want[0]) <= TOL and scaled_error(got["z"], want[1]) <= TOL


def test_autofuse_off_keeps_the_graph(tmp_path):
    _, path, res = _compiled(tmp_path, hardswish_arithmetic, autofuse=False)
    assert res.fused == [] and not any(is_fused(n) for n in res.graph.nodes)
    assert [k for k in omrt.load(path).kernels if k.kind == kernelstore.FUSED] == []


@pytest.mark.parametrize("kind", ["squeeze_excite", "layernorm", "masked_softmax"])
def test_untrusted_file_runs_the_unfused_nodes(kind, tmp_path):
    model, path, _ = _compiled(tmp_path, CHAINS[kind][0])
    feeds = _feeds(model)
    loaded = omrt.load(path)
    assert loaded.native is None
    fused_record = [k for k in loaded.kernels if k.kind == kernelstore.FUSED][0]
    assert fused_record.status == (f"not loaded: not trusted: {loaded.trust.reason}: sign it (omrt sign) and trust "
                                   f"its key, or load with trust_kernels=True; the fused chains run unfused")
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    assert scaled_error(loaded.session().run(feeds)["y"], want) <= TOL


def _fused_record(path):
    model = omrt.load(path)
    records = model.kernels
    return records, [r for r in records if r.kind == kernelstore.FUSED][0]


def test_a_host_that_cannot_load_the_kernels_runs_the_unfused_nodes(tmp_path):
    model, path, _ = _compiled(tmp_path, masked_softmax)
    records, record = _fused_record(path)
    record.target = {**record.target, "abi": "0" * 16}
    with pytest.warns(RuntimeWarning, match=r"fused kernels 'omrt-fused' packed in the model do not load "
                                            r"\(built by omrt \S+ for kernel ABI 0000000000000000"):
        library = loader.load(records, trusted=True)
    assert library is not None and library.fused is None
    assert record.status.endswith("; the fused chains run unfused")


def test_fused_kernels_need_the_native_library(tmp_path):
    _, path, _ = _compiled(tmp_path, masked_softmax)
    _, record = _fused_record(path)
    with pytest.warns(RuntimeWarning, match="the model's native library is not loaded"):
        assert loader.load([record], trusted=True) is None


def _kernel(model, node, shapes):
    infos = [TensorInfo(np.dtype(np.float32), tuple(s)) for s in shapes]
    outs = AutoFused.infer(context(node, model.graph, model.native), infos)
    return AutoFused(context(node, model.graph, model.native), infos, outs), outs


def test_a_guard_miss_runs_the_unfused_nodes(tmp_path):
    """Other shapes than the guard's (the kernel is prepared without its C function), and arrays
    of the guard's shapes in another layout (checked at every call), both run the sub-graph."""
    model, path, _ = _compiled(tmp_path, masked_softmax)
    loaded = omrt.load(path, trust_kernels=True)
    (node,) = [n for n in loaded.graph.nodes if is_fused(n)]
    calls = loaded.native.fused.calls

    def softmax(a):
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    kernel, outs = _kernel(loaded, node, [(1, 2, 5, 37), (1, 1, 1, 37)])
    assert kernel.fused is None
    s, m = RNG.standard_normal((1, 2, 5, 37)).astype(np.float32), RNG.standard_normal((1, 1, 1, 37)).astype(np.float32)
    out = np.empty(outs[0].shape, np.float32)
    kernel.run([s, m], [out], None)
    assert scaled_error(out, softmax(s + m)) <= TOL and calls() == {}

    kernel, outs = _kernel(loaded, node, [(2, 3, 7, 37), (2, 1, 1, 37)])
    assert kernel.fused is not None
    s = np.asfortranarray(RNG.standard_normal((2, 3, 7, 37)).astype(np.float32))
    m = RNG.standard_normal((2, 1, 1, 37)).astype(np.float32)
    out = np.empty((2, 3, 7, 37), np.float32)
    kernel.run([s, m], [out], None)
    assert scaled_error(out, softmax(s + m)) <= TOL and calls() == {}
    kernel.run([np.ascontiguousarray(s), m], [out], None)
    assert scaled_error(out, softmax(s + m)) <= TOL and calls() == {"omrt_fused_0": 1}


def test_every_array_handed_to_a_fused_kernel_is_checked(tmp_path):
    _, path, _ = _compiled(tmp_path, masked_softmax)
    loaded = omrt.load(path, trust_kernels=True)
    (node,) = [n for n in loaded.graph.nodes if is_fused(n)]
    fn = loaded.native.fused.get(node.attrs["kernel"], node.attrs["guard"])
    s, m = np.zeros((2, 3, 7, 37), np.float32), np.zeros((2, 1, 1, 37), np.float32)
    out = np.empty_like(s)
    with pytest.raises(KernelError, match=r"native omrt_fused_0: in1 must hold 74 = 74 floats, the array holds 37"):
        fn(s, m[:1], out, 1)
    with pytest.raises(KernelError, match="in0 must be a float32 array, got float64"):
        fn(s.astype(np.float64), m, out, 1)
    with pytest.raises(KernelError, match="out0 must be C-contiguous"):
        fn(s, m, np.empty((37, 7, 3, 2), np.float32).T, 1)
    with pytest.raises(KernelError, match="out0 is written but the array is read-only"):
        ro = np.empty_like(s)
        ro.flags.writeable = False
        fn(s, m, ro, 1)
    assert loaded.native.fused.get(node.attrs["kernel"], {**node.attrs["guard"], "layout": "F"}) is None


def test_generated_prototypes_match_their_contracts(tmp_path):
    _, _, res = _compiled(tmp_path, pooled)
    text = library_source([f.chain for f in res.fused])
    for f in res.fused:
        proto = native_fused.contract(f.chain.symbol, f.node.attrs["guard"]).prototype()
        assert f"OMRT_EXPORT {proto} {{" in text


def test_inspect_lists_the_chains_and_their_guards(tmp_path):
    _, path, _ = _compiled(tmp_path, squeeze_excite)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["inspect", path, "--trust-kernels"]) == 0
    text = out.getvalue()
    assert "fused chains: 1, 0.00 MiB of intermediate tensors out of the arena" in text
    assert "  fused0[HardSigmoid+Mul]: omrt_fused_0, 2 nodes, runs fused" in text
    assert "    guard: in [<f4 1x8x12x12, <f4 1x8x1x1] out [<f4 1x8x12x12] C-contiguous" in text
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["inspect", path]) == 0
    assert "runs unfused (fused kernels not loaded)" in out.getvalue()


def test_profile_names_each_fused_chain(tmp_path):
    model, path, _ = _compiled(tmp_path, pooled)
    sess = omrt.load(path, trust_kernels=True).session()
    profile = sess.profile(_feeds(model), repeat=2)
    assert list(profile) == ["fused0[Sigmoid+Mul+GlobalAveragePool+Tanh]"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["run", path, "--trust-kernels", "--profile", "--repeat", "1"]) == 0
    assert re.search(r"fused0\[Sigmoid\+Mul\+GlobalAveragePool\+Tanh\] +\d+\.\d+ ms", out.getvalue())


def test_cli_compile_no_autofuse(tmp_path):
    src = tmp_path / "m.onnx"
    src.write_bytes(hardswish_arithmetic().SerializeToString())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["compile", str(src), str(tmp_path / "a.om"), "-q"]) == 0
        assert cli(["compile", str(src), str(tmp_path / "b.om"), "-q", "--no-autofuse"]) == 0
    assert "1 fused chains" in out.getvalue()
    assert [is_fused(n) for n in omrt.load(str(tmp_path / "a.om")).graph.nodes] == [True]
    assert not any(is_fused(n) for n in omrt.load(str(tmp_path / "b.om")).graph.nodes)


def test_chains_break_where_they_must(tmp_path):
    """A value whose producer comes after the chain started cannot join it (the fused node
    stands where the chain began); non-float and symbolic shapes are left alone."""
    model = _model([_n("Relu", ["x"], ["r"]), _n("Sigmoid", ["r"], ["s"]), _n("MatMul", ["r", "w"], ["m"]),
                    _n("Add", ["s", "m"], ["y"])], [("x", [4, 4])], [("y", [4, 4])],
                   [("w", RNG.standard_normal((4, 4)))])
    res = omrt.compile(model, str(tmp_path / "a.om"))
    assert [n.op_type for n in res.graph.nodes] == ["AutoFused", "PackedMatMul", "Add"]
    sym = _model([_n("Relu", ["x"], ["r"]), _n("Sigmoid", ["r"], ["y"])], [("x", ["N", 4])], [("y", ["N", 4])])
    res = omrt.compile(sym, str(tmp_path / "b.om"))
    assert [n.op_type for n in res.graph.nodes] == ["Relu", "Sigmoid"]


def test_a_compiler_that_fails_on_the_fused_kernels_leaves_the_chains_unfused(tmp_path, monkeypatch):
    """The compiler's message is shown, the model is written without fused nodes, and it runs."""
    cc = tmp_path / "cc-no-fused"
    cc.write_text(f"#!/bin/sh\nfor a in \"$@\"; do case $a in *fused.c) echo 'fused.c:1: error: no' >&2; exit 1;; "
                  f"esac; done\nexec {native_build.compiler()} \"$@\"\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    model = squeeze_excite()
    path = str(tmp_path / "m.om")
    with pytest.warns(RuntimeWarning, match=r"building fused kernels failed, the model runs its chains unfused:"
                                            r"(.|\n)*fused.c:1: error: no"):
        res = omrt.compile(model, path)
    assert res.fused == [] and [n.op_type for n in res.graph.nodes] == ["HardSigmoid", "Mul"]
    feeds = _feeds(model)
    got = omrt.load(path, trust_kernels=True).session().run(feeds)["y"]
    assert scaled_error(got, ReferenceEvaluator(model).run(None, feeds)[0]) <= TOL


def test_nan_and_infinities_go_through_as_unfused(tmp_path):
    model = _model([_n("Relu", ["x"], ["r"]), _n("Max", ["r", "b"], ["m"]), _n("Exp", ["m"], ["e"]),
                    _n("Clip", ["e", "lo", "hi"], ["y"])], [("x", [2, 8]), ("b", [2, 8])], [("y", [2, 8])],
                   [("lo", 0.5), ("hi", 1e30)])
    x = np.array([np.nan, -np.inf, np.inf, -1, 0, 1, 50, 100] * 2, np.float32).reshape(2, 8)
    b = np.array([0, np.nan, 0, np.nan, -1, 2, 0, 0] * 2, np.float32).reshape(2, 8)
    path = str(tmp_path / "m.om")
    omrt.compile(model, path)
    loaded = omrt.load(path, trust_kernels=True)
    got = loaded.session().run({"x": x, "b": b})["y"]
    assert loaded.native.fused.calls() == {"omrt_fused_0": 1}
    want = omrt.load(path).session().run({"x": x, "b": b})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_output_takes_the_buffer_of_an_input_that_dies(threads, tmp_path):
    """Output 0 over input 0, in the arena: the chain reads each element before it writes it,
    also with a reduction (LayerNormalization's last loop) and on two threads."""
    d = 64
    model = _model([_n("MatMul", ["x", "w"], ["h"]), _n("Sigmoid", ["h"], ["s"]), _n("Mul", ["h", "s"], ["a"]),
                    _n("ReduceMean", ["a"], ["m"], axes=[-1]), _n("Sub", ["a", "m"], ["c"]),
                    _n("MatMul", ["c", "w"], ["y"])], [("x", [32, d])], [("y", [32, d])],
                   [("w", RNG.standard_normal((d, d)) / 8)])
    path = str(tmp_path / "m.om")
    res = omrt.compile(model, path)
    (node,) = [n for n in res.graph.nodes if is_fused(n)]
    assert node.inputs == ["h"] and node.outputs == ["c"]
    loaded = omrt.load(path, trust_kernels=True)
    places = loaded.default.program.places
    assert places["c"].region == places["h"].region == "arena" and places["c"].offset == places["h"].offset
    feeds = _feeds(model)
    with _threads(threads):
        got = loaded.session().run(feeds)["y"]
    assert loaded.native.fused.calls() == {"omrt_fused_0": 1}
    assert scaled_error(got, ReferenceEvaluator(model).run(None, feeds)[0]) <= TOL
