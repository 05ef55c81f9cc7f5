"""Native kernels packed in the .om: build, KERNELS partition, trust, host checks, loading from memory."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.format import kernelstore
from omrt.native import build as native_build
from omrt.native import elf, loader
from omrt.format import HEADER, OmFile, Part
from omrt.kernels import parallel
from omrt.kernels.packed import gemm_tile
from omrt.native.library import kernel_abi
from conftest import mlp_model, run_without_onnx

RNG = np.random.default_rng(3)
DW = RNG.standard_normal((8, 1, 3, 3)).astype(np.float32)
DB = RNG.standard_normal(8).astype(np.float32)
DENSE = RNG.standard_normal((4, 8, 3, 3)).astype(np.float32)


def cnn_model() -> onnx.ModelProto:
    """x[1,8,12,12] -> depthwise Conv+Relu -> MaxPool -> AveragePool -> strided dense Conv -> y."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=8, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2], strides=[1, 1]),
             helper.make_node("Conv", ["a", "dense"], ["y"], strides=[2, 2], pads=[1, 0, 1, 1])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(DW, "w"), numpy_helper.from_array(DB, "b"),
                           numpy_helper.from_array(DENSE, "dense")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def reference(x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(cnn_model()).run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def cnn_om(tmp_path_factory) -> str:
    if native_build.compiler() is None:
        pytest.skip("no C compiler on this host")
    path = str(tmp_path_factory.mktemp("native") / "cnn.om")
    omrt.compile(cnn_model(), path)
    return path


def _kernels_partition(path: str) -> bytes:
    f = OmFile(path)
    try:
        return bytes(f.view(Part.KERNELS))
    finally:
        f.close()


def test_compile_packs_only_the_units_the_model_uses(cnn_om, tmp_path):
    records = kernelstore.unpack(memoryview(_kernels_partition(cnn_om)), cnn_om)
    assert [(r.kind, r.name, r.vendor, r.units) for r in records] == [(1, "omrt-native", "omrt", ["conv", "pool"])]
    target = records[0].target
    assert target["abi"] == kernel_abi() and target["os"] and target["compiler"]
    assert records[0].data[:4] == b"\x7fELF"
    with open(cnn_om, "rb") as f:
        assert HEADER.unpack(f.read(HEADER.size))[3] == 1  # flags: kind 1 (native library) present
    mlp = str(tmp_path / "mlp.om")
    omrt.compile(mlp_model(4), mlp)
    assert [r.units for r in kernelstore.unpack(memoryview(_kernels_partition(mlp)), mlp)] == [["linalg"]]
    plain = str(tmp_path / "relu.om")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), plain)
    assert kernelstore.unpack(memoryview(_kernels_partition(plain)), plain) == []


def test_untrusted_kernels_do_not_run_and_say_how_to_trust(cnn_om):
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    plain = omrt.load(cnn_om)
    assert plain.native is None
    assert plain.kernels[0].status == ("not loaded: not trusted: not signed: sign it (omrt sign) and trust its key, "
                                       "or load with trust_kernels=True")
    trusted = omrt.load(cnn_om, trust_kernels=True)
    assert trusted.kernels[0].status == "loaded" and trusted.native is not None
    depthwise, dense = (k for k in trusted.default.kernels if type(k).__name__ in ("Conv", "PackedConv"))
    assert depthwise.native_depthwise is not None and dense.native_conv is not None  # 3x3 positions: not packed
    want = reference(x)
    for model in (plain, trusted):
        np.testing.assert_allclose(model.session().run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


def test_same_library_loads_once_per_process(cnn_om):
    a, b = omrt.load(cnn_om, trust_kernels=True), omrt.load(cnn_om, trust_kernels=True)
    assert a.native is not b.native  # registered per model...
    assert a.native._cdll is b.native._cdll  # ...loaded once


def test_compile_without_native_kernels(tmp_path):
    path = str(tmp_path / "plain.om")
    omrt.compile(cnn_model(), path, native=False)
    assert omrt.load(path, trust_kernels=True).kernels == []


def test_no_c_compiler_warns_and_still_compiles(tmp_path, monkeypatch):
    monkeypatch.setattr(native_build, "compiler", lambda: None)
    path = str(tmp_path / "nocc.om")
    with pytest.warns(RuntimeWarning, match=r"no C compiler found \(set CC or install cc\); the model is "
                                            r"compiled without native kernels \(conv, pool\)"):
        omrt.compile(cnn_model(), path)
    model = omrt.load(path, trust_kernels=True)
    assert model.kernels == []
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(model.session().run({"x": x})["y"], reference(x), rtol=1e-5, atol=1e-5)


def test_failing_c_compiler_warns_with_its_message(tmp_path, monkeypatch):
    monkeypatch.setattr(native_build, "FLAGS", native_build.FLAGS + ["-DOMRT_NO_SUCH=\"", "-fno-such-flag"])
    path = str(tmp_path / "bad.om")
    with pytest.warns(RuntimeWarning, match="building native kernels failed, the model runs on numpy kernels") as got:
        omrt.compile(cnn_model(), path)
    assert "no-such-flag" in str(got[0].message)
    assert kernelstore.unpack(memoryview(_kernels_partition(path)), path) == []
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(omrt.load(path, trust_kernels=True).session().run({"x": x})["y"], reference(x),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change, why", [
    ({"abi": "0123456789abcdef"}, f"built by omrt {omrt.__version__} for kernel ABI 0123456789abcdef, this omrt "
                                  f"({omrt.__version__}) has {kernel_abi()}: recompile the model with this omrt"),
    ({"os": "Plan9"}, "built for Plan9, this host runs"),
    ({"libc_version": "999.0"}, "needs glibc 999.0, this host has"),
])
def test_host_mismatch_is_refused_with_the_reason(cnn_om, change, why):
    record = kernelstore.unpack(memoryview(_kernels_partition(cnn_om)), cnn_om)[0]
    if change.get("libc_version") and record.target.get("libc") != "glibc":
        pytest.skip("not a glibc host")
    record.target = {**record.target, **change}
    with pytest.warns(RuntimeWarning, match=r"the native library 'omrt-native' for \S+ packed in the model does "
                                            r"not load \(" + re.escape(why)):
        assert loader.load([record], trusted=True) is None
    assert record.status.startswith("not loaded: " + why)


def test_foreign_machine_code_is_refused(cnn_om):
    record = kernelstore.unpack(memoryview(_kernels_partition(cnn_om)), cnn_om)[0]
    data = bytearray(record.data)
    struct.pack_into("<H", data, 18, 183)  # EM_AARCH64 (or x86-64 on an aarch64 host)
    if elf.identity(bytes(data)) == elf.identity(record.data):
        struct.pack_into("<H", data, 18, 62)
    said, made = (elf.machine_name(elf.identity(d)[2]) for d in (record.data, bytes(data)))
    record.data = bytes(data)
    assert loader.load([record], trusted=True) is None
    assert record.status == f"not loaded: its target says {said} but its code is for {made}: the record is mislabelled"
    record.data = b"MZ not an elf"
    with pytest.warns(RuntimeWarning, match=r"does not load \(not an ELF shared library\); its kernels run on numpy"):
        loader.load([record], trusted=True)
    assert record.status == "not loaded: not an ELF shared library"


def test_a_library_that_is_not_omrts_is_refused(cnn_om, tmp_path):
    """A shared library with the right target but not built by omrt (no worker pool) is refused
    with the reason, not called."""
    source, target = tmp_path / "other.c", tmp_path / "other.so"
    source.write_text("int other(void) { return 1; }\n")
    subprocess.run(native_build.compiler().split() + ["-shared", "-fPIC", "-o", str(target), str(source)], check=True)
    record = kernelstore.unpack(memoryview(_kernels_partition(cnn_om)), cnn_om)[0]
    record.data = target.read_bytes()
    # a version (units) no library loaded so far has: otherwise the process reuses that one by name
    record.target = {**record.target, "units": ["other"]}
    assert loader.load([record], trusted=True) is None
    assert record.status.startswith("not loaded: the dynamic loader refused it: not an omrt kernel library of ABI")


@pytest.mark.parametrize("cut, why", [(2, "no record count"), (10, "record 0 is cut short"),
                                      (-1, "record 0 runs past the partition's end")])
def test_damaged_store_is_a_format_error(cnn_om, cut, why):
    data = _kernels_partition(cnn_om)
    with pytest.raises(omrt.FormatError, match=f"the KERNELS partition is damaged \\({why}\\); recompile"):
        kernelstore.unpack(memoryview(data[:cut]), "m.om")
    bad = bytearray(data)
    bad[4] ^= 0xFF
    with pytest.raises(omrt.FormatError, match=r"record 0 has a bad magic"):
        kernelstore.unpack(memoryview(bytes(bad)), "m.om")


def test_trusted_runtime_needs_no_onnx(cnn_om):
    code = ("import numpy as np, omrt\n"
            f"m = omrt.load({cnn_om!r}, trust_kernels=True)\n"
            "y = m.session().run({'x': np.ones((1, 8, 12, 12), np.float32)})['y']\n"
            "print(m.kernels[0].status, y.shape)\n")
    res = run_without_onnx(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "loaded (1, 4, 3, 2)"


W1 = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.2
W2 = RNG.standard_normal((24, 32, 3, 3)).astype(np.float32) * 0.2
B2 = RNG.standard_normal(24).astype(np.float32)


def winograd_model() -> onnx.ModelProto:
    """x[2,16,15,13] -> Conv3x3+Relu (16->32) -> Conv3x3 (32->24, bias) -> MaxPool -> y."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[0, 1, 2, 0]),
             helper.make_node("MaxPool", ["c2"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    g = helper.make_graph(nodes, "wino", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 15, 13])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2"),
                           numpy_helper.from_array(B2, "b2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_network_matches_reference(cnn_om, tmp_path, threads):
    from onnx.reference import ReferenceEvaluator

    path = str(tmp_path / "wino.om")
    omrt.compile(winograd_model(), path)
    x = RNG.standard_normal((2, 16, 15, 13)).astype(np.float32)
    want = ReferenceEvaluator(winograd_model()).run(None, {"x": x})[0]
    omrt.set_num_threads(threads)
    try:
        for trust in (False, True):
            model = omrt.load(path, trust_kernels=trust)
            assert [n.op_type for n in model.graph.nodes].count("WinogradConv") == 2
            assert model.kernels[0].units == ["pool", "winograd"]
            convs = [k for k in model.default.kernels if type(k).__name__ == "WinogradConv"]
            tile = trust and gemm_tile(model.native) > 0  # Winograd's products need a vector tile
            assert all((k.native_winograd is not None) == tile for k in convs)
            got = model.session().run({"x": x})["y"]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    finally:
        omrt.set_num_threads(1)


def test_native_workers_serve_concurrent_runs_and_forked_children(cnn_om, monkeypatch):
    """Sessions on several Python threads share the native workers (a call that finds them busy
    runs its own items), and a forked child makes workers of its own."""
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    monkeypatch.setattr(parallel, "NATIVE_SPLIT_BYTES", 0)
    model = omrt.load(cnn_om, trust_kernels=True)
    xs = [RNG.standard_normal((1, 8, 12, 12)).astype(np.float32) for _ in range(4)]
    want = [reference(x) for x in xs]

    def runs(i: int) -> bool:
        session = model.session()
        return all(np.allclose(session.run({"x": xs[i]})["y"], want[i], rtol=1e-4, atol=1e-4) for _ in range(30))

    omrt.set_num_threads(2)
    try:
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(runs, range(4))) == [True] * 4
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)
            os._exit(0 if runs(0) and runs(1) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        omrt.set_num_threads(1)


def test_c_units_compile_without_warnings(monkeypatch):
    if native_build.compiler() is None:
        pytest.skip("no C compiler on this host")
    monkeypatch.setattr(native_build, "FLAGS", native_build.FLAGS + ["-Wextra", "-Werror"])
    record = native_build.build(["conv", "pool", "winograd"], lambda msg: None)
    assert record is not None and record.units == ["conv", "pool", "winograd"]
