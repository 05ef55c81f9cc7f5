"""The .om container: round trip, atomic writes, and clear errors for damaged or foreign files."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.format import HEADER, MAGIC, Part
from conftest import mlp_model, run_without_onnx


@pytest.fixture(scope="module")
def om_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fmt") / "m.om"
    omrt.compile(mlp_model(4), str(path))
    return path.read_bytes()


def _write(tmp_path, data: bytes) -> str:
    p = tmp_path / "x.om"
    p.write_bytes(data)
    return str(p)


def test_weights_are_mapped_not_copied(tmp_path, om_bytes):
    model = omrt.load(_write(tmp_path, om_bytes))
    w = model.graph.constants["W1"]
    assert not w.flags.writeable and not w.flags.owndata
    base = w
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert not isinstance(base, np.ndarray)  # the buffer is the file mapping, not a numpy copy
    f = model._file.entry(Part.WEIGHTS)
    addr = np.frombuffer(model._file.map, np.uint8, 1, f.offset).ctypes.data
    assert (w.ctypes.data - addr) % 64 == 0


def test_header_layout(om_bytes):
    magic, major, minor, flags, count, table_at, size = HEADER.unpack_from(om_bytes, 0)
    assert (magic, major, count, table_at, size) == (MAGIC, 1, 5, 64, len(om_bytes))


@pytest.mark.parametrize("cut", [0, 10, 63, 64, 100, 4096, -1])
def test_truncated_file_is_refused(tmp_path, om_bytes, cut):
    data = om_bytes[:cut] if cut >= 0 else om_bytes[:-1]
    with pytest.raises(omrt.FormatError, match=r"truncated"):
        omrt.load(_write(tmp_path, data))


def test_foreign_and_future_files_are_refused(tmp_path, om_bytes):
    with pytest.raises(omrt.FormatError, match=r"is not an omrt model \(bad magic"):
        omrt.load(_write(tmp_path, b"\x89PNG" + om_bytes[4:]))
    future = bytearray(om_bytes)
    struct.pack_into("<H", future, 8, 2)
    with pytest.raises(omrt.FormatError, match=r"has format version 2\.\d+; this omrt reads 1\.x"):
        omrt.load(_write(tmp_path, bytes(future)))
    with pytest.raises(omrt.FormatError, match=r"does not exist"):
        omrt.load(str(tmp_path / "missing.om"))


def test_a_model_loads_from_its_bytes_in_place(om_bytes):
    x = np.ones((4, 64), np.float32)
    want = omrt.load(om_bytes).session().run({"x": x})["y"]
    buffer = bytearray(om_bytes)
    model = omrt.load(buffer)
    np.testing.assert_array_equal(model.session().run({"x": x})["y"], want)
    assert np.shares_memory(model.graph.constants["W1"], np.frombuffer(buffer, np.uint8))
    assert omrt.load(memoryview(om_bytes)).file_size == len(om_bytes)
    assert "bytearray" in repr(model)


@pytest.mark.parametrize("source, why", [
    (b"...", r"'<bytes of the model>' is 3 bytes, too short for an omrt model"),
    ("a\0b.om", r"cannot open model file 'a\\x00b.om': embedded null byte"),
    (3.5, r"a model is a path or the bytes of a .om file, not a float"),
])
def test_what_is_not_a_model_is_refused_clearly(source, why):
    with pytest.raises(omrt.FormatError, match=why):
        omrt.load(source)


def _with_env(om_bytes: bytes, env: dict, path) -> str:
    """The same model with another ENV partition (digests recomputed)."""
    from omrt.format import OmFile, write

    f = OmFile(om_bytes)
    parts = [(kind, (lambda sink, k=kind: sink(bytes(f.view(k))))) for kind in Part if f.has(kind) and kind != Part.ENV]
    write(path, parts + [(Part.ENV, lambda sink: sink(json.dumps(env).encode()))])
    return str(path)


def test_a_file_from_a_newer_omrt_is_refused(tmp_path, om_bytes):
    env = json.loads(bytes(omrt.load(om_bytes)._file.view(Part.ENV)))
    assert env["omrt"] == omrt.__version__
    omrt.load(_with_env(om_bytes, {**env, "omrt": omrt.__version__ + ".post1"}, tmp_path / "same.om"))
    with pytest.raises(omrt.FormatError, match=r"was compiled by omrt 99\.0\.0, newer than this omrt "
                                               r"[0-9.]+: upgrade omrt"):
        omrt.load(_with_env(om_bytes, {**env, "omrt": "99.0.0"}, tmp_path / "future.om"))
    with pytest.raises(omrt.FormatError, match=r"the ENV partition does not name the omrt release"):
        omrt.load(_with_env(om_bytes, {"python": "3.11"}, tmp_path / "anonymous.om"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(min_value=0), value=st.integers(min_value=0, max_value=255))
def test_any_corrupted_byte_gives_a_clear_error_or_a_checked_model(tmp_path, om_bytes, pos, value):
    """Flip one byte anywhere: loading raises FormatError, or (weights, padding) loads and runs."""
    data = bytearray(om_bytes)
    pos %= len(data)
    if data[pos] == value:
        return
    data[pos] = value
    path = _write(tmp_path, bytes(data))
    try:
        model = omrt.load(path)
    except omrt.FormatError:
        return
    model.session().run({"x": np.zeros((4, 64), np.float32)})
    weights = model._file.entry(Part.WEIGHTS)
    if weights.offset <= pos < weights.offset + weights.size:
        with pytest.raises(omrt.FormatError, match="the WEIGHTS partition does not match its digest"):
            omrt.load(path, verify=True)


def test_failed_compile_leaves_nothing_behind(tmp_path):
    node = helper.make_node("NoSuchOp", ["x"], ["y"])
    g = helper.make_graph([node], "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    out = tmp_path / "bad.om"
    with pytest.raises(omrt.UnsupportedOpError,
                       match=r"no kernel in omrt for NoSuchOp at opset 17 \(node 'NoSuchOp_0'\)"):
        omrt.compile(m, str(out))
    assert os.listdir(tmp_path) == []


def test_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "m.om"
    omrt.compile(mlp_model(4), str(out))
    before = out.read_bytes()
    import omrt.compiler as compiler

    def boom(graph, layout):
        def produce(sink):
            sink(b"partial")
            raise KeyboardInterrupt
        return produce

    monkeypatch.setattr(compiler, "_weights_writer", boom)
    with pytest.raises(KeyboardInterrupt):
        omrt.compile(mlp_model(4), str(out))
    assert out.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.om"]


def test_runtime_needs_no_onnx(tmp_path, om_bytes):
    """Load and run with `onnx` made unimportable: the runtime reaches only numpy and the stdlib."""
    path = _write(tmp_path, om_bytes)
    code = (
        "import numpy as np, omrt\n"
        f"m = omrt.load({path!r})\n"
        "y = m.session().run({'x': np.ones((4, 64), np.float32)})['y']\n"
        "assert not any(k.split('.')[0] in ('onnx', 'onnxruntime') for k in sys.modules)\n"
        "print(y.shape)\n")
    res = run_without_onnx(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "(4, 10)"


def test_plan_from_an_omrt_with_other_kernels_is_refused(tmp_path, om_bytes, monkeypatch):
    from omrt.kernels.linalg import MatMulBase

    monkeypatch.setattr(MatMulBase, "workspace", lambda self: 1 << 20)  # PackedMatMul's too, where packed
    with pytest.raises(omrt.FormatError, match=r"\((Packed)?MatMul\) needs 1048576 bytes of workspace but the "
                                               r"plan in the file gives \d+: .* recompile it with this one"):
        omrt.load(_write(tmp_path, om_bytes))


def test_a_plan_without_room_for_a_speedup_still_runs(tmp_path, monkeypatch):
    """A file planned before Binary tiled short broadcasts (no workspace for the tile) loads, and
    the op runs with numpy's own broadcast."""
    from omrt.kernels import elementwise

    mean = np.array([0.25, 0.5, 0.75], np.float32)
    g = helper.make_graph([helper.make_node("Sub", ["x", "mean"], ["y"])], "sub",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, 50, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 50, 3])],
                          [numpy_helper.from_array(mean, "mean")])
    path = str(tmp_path / "sub.om")
    with monkeypatch.context() as m:
        m.setattr(elementwise, "TILE_RUN", 1)
        omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = omrt.load(path)
    kernel = next(k for k in model.default.kernels if k is not None)
    assert kernel.tile is None and kernel.workspace() == 0
    x = np.random.default_rng(1).standard_normal((40, 50, 3)).astype(np.float32)
    np.testing.assert_array_equal(model.session().run({"x": x})["y"], x - mean)
    omrt.compile(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert next(k for k in omrt.load(path).default.kernels if k is not None).tile is not None
