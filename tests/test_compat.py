"""Compatibility of packed native libraries: what a record states about its target (host and
cross compilers), the loader's choice among several targets with a one-line reason for each one
skipped, deduplication and its counters, the ENV partition's notes, and `omrt repack`."""

from __future__ import annotations

import json
import platform
import re
import shutil
import struct
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import omrt
from omrt import cli
from omrt.format import HEADER, OmFile, Part, write
from omrt.format.container import VERSION
from omrt.format import kernelstore
from omrt.format.kernelstore import NATIVE, Packed, pack, unpack
from omrt.native import build, elf, loader, probe, target
from omrt.native.library import kernel_abi
from conftest import mlp_model, run_without_onnx

RNG = np.random.default_rng(13)
X = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)
HOST_CC = build.compiler()
needs_cc = pytest.mark.skipif(HOST_CC is None, reason="no C compiler on this host")


def pool_model() -> onnx.ModelProto:
    """x[1,4,16,16] -> MaxPool 3x3/2 -> AveragePool 2x2 -> y: its kernels use one C unit, pool."""
    nodes = [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[2, 2])]
    g = helper.make_graph(nodes, "pools", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def reference(x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(pool_model()).run(None, {"x": x})[0]


def run(path: str, trust: bool = True) -> tuple[omrt.Model, np.ndarray]:
    model = omrt.load(path, trust_kernels=trust)
    return model, model.session().run({"x": X})["y"]


def cross_compiler() -> str | None:
    """An installed cross compiler for a machine other than this host's."""
    for cc in ("aarch64-linux-gnu-gcc", "x86_64-linux-gnu-gcc", "riscv64-linux-gnu-gcc", "arm-linux-gnueabihf-gcc"):
        if shutil.which(cc) and probe.triple([cc]).split("-")[0] != platform.machine():
            return cc
    return None


CROSS_CC = cross_compiler()


def foreign_elf(machine: int) -> bytes:
    """A minimal valid ELF64 little-endian header of a shared object for `machine`, no more."""
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, 0, 0, 0, 64, 56, 0, 64, 0, 0)


def other_machine() -> tuple[int, str]:
    """An ELF machine number and triple that are not this host's."""
    return (62, "x86_64-linux-gnu") if target.host_elf()[2] != 62 else (183, "aarch64-linux-gnu")


def constructed_foreign_record() -> Packed:
    """A record whose ELF header and target both declare another machine (no real code: the
    loader must decide from them alone, before any byte is loaded)."""
    number, triple = other_machine()
    return Packed(NATIVE, "omrt-native", "omrt",
                  {"omrt": omrt.__version__, "abi": kernel_abi(), "units": ["pool"], "triple": triple,
                   **target.parse_triple(triple), "elf_machine": number, "compiler": "none (constructed)"},
                  foreign_elf(number))


@pytest.fixture(scope="module")
def host_om(tmp_path_factory) -> str:
    if HOST_CC is None:
        pytest.skip("no C compiler on this host")
    path = str(tmp_path_factory.mktemp("compat") / "host.om")
    omrt.compile(pool_model(), path)
    return path


@pytest.fixture(scope="module")
def foreign_om(tmp_path_factory) -> str:
    """The model with a library for another machine only: built by a real cross compiler when
    one is installed, else carrying the constructed record."""
    path = str(tmp_path_factory.mktemp("compat") / "foreign.om")
    if CROSS_CC is not None:
        omrt.compile(pool_model(), path, cc=CROSS_CC)
    else:
        omrt.compile(pool_model(), path, native=False)
        omrt.repack(path, path, add=[constructed_foreign_record()])
    return path


def records(path: str) -> list[Packed]:
    f = OmFile(path)
    try:
        return unpack(f.view(Part.KERNELS), path)
    finally:
        f.close()


def partitions(path: str) -> dict[int, bytes]:
    """Every partition's bytes, each checked against its digest."""
    f = OmFile(path)
    try:
        return {t: bytes(f.view(Part(t), verify=True)) for t in f.entries}
    finally:
        f.close()


def glibc_versions_by_objdump(data: bytes, tmp_path) -> str:
    """The newest GLIBC_x.y version reference objdump finds in a library (a second opinion)."""
    lib = tmp_path / "lib.so"
    lib.write_bytes(data)
    out = subprocess.run(["objdump", "-p", str(lib)], capture_output=True, text=True, check=True).stdout
    found = [tuple(map(int, v.split("."))) for v in re.findall(r"\bGLIBC_(\d+(?:\.\d+)+)\b", out)]
    return ".".join(map(str, max(found))) if found else ""


# --- what a record states -------------------------------------------------------------------


@needs_cc
def test_host_record_states_its_compiler_target_abi_libc_and_cpu(host_om, tmp_path):
    [record] = records(host_om)
    t = record.target
    triple = subprocess.run(HOST_CC.split() + ["-dumpmachine"], capture_output=True, text=True).stdout.strip()
    assert (t["omrt"], t["abi"], t["units"], t["triple"]) == (omrt.__version__, kernel_abi(), ["pool"], triple)
    assert (t["os"], t["machine"]) == (platform.system(), platform.machine())
    assert t["elf_machine"] == elf.identity(record.data)[2] == target.host_elf()[2]
    assert t["compiler"] == subprocess.run(HOST_CC.split() + ["--version"], capture_output=True,
                                           text=True).stdout.splitlines()[0]
    if shutil.which("objdump") and t["libc"] == "glibc":
        assert t["libc_version"] == glibc_versions_by_objdump(record.data, tmp_path) != ""
    flags = target.cpu_flags()
    assert flags is None or set(t["cpu"]["features"]) <= flags  # a library built here needs nothing this CPU lacks
    if platform.machine() == "x86_64" and "clang" not in t["compiler"]:
        assert t["cpu"]["baseline"] == "x86-64" and {"sse", "sse2"} <= set(t["cpu"]["features"])
        assert t["cpu"]["clones"] == ["x86-64-v4", "x86-64-v3"]  # csrc/omrt_native.h's OMRT_HOT


@pytest.mark.skipif(CROSS_CC is None, reason="no cross compiler installed (e.g. gcc-aarch64-linux-gnu)")
def test_cross_compiled_record_states_the_cross_target_not_the_host(foreign_om, tmp_path):
    [record] = records(foreign_om)
    t = record.target
    triple = probe.triple([CROSS_CC])
    machine = target.parse_triple(triple)["machine"]
    assert (t["triple"], t["machine"], t["os"], t["libc"]) == (triple, machine, "Linux", "glibc")
    assert machine != platform.machine()
    assert t["elf_machine"] == elf.identity(record.data)[2] != target.host_elf()[2]
    assert elf.machine_name(t["elf_machine"]) == machine
    if shutil.which("objdump"):
        assert t["libc_version"] == glibc_versions_by_objdump(record.data, tmp_path) != ""
    assert t["cpu"]["clones"] == []  # the per-ISA clones are x86-64 only


@pytest.mark.skipif(HOST_CC is None or CROSS_CC is None, reason="needs a C compiler and a cross compiler")
def test_fused_kernels_are_built_per_compiler_and_join_the_library_chosen(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])
    graph = helper.make_graph([helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
                               helper.make_node("Mul", ["x", "h"], ["y"])], "hardswish", [x], [y])
    path = str(tmp_path / "fused.om")
    res = omrt.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
                       cc=[HOST_CC, CROSS_CC])
    assert [(r.kind, r.target["triple"]) for r in res.libraries] == [
        (kernelstore.NATIVE, probe.triple([HOST_CC])), (kernelstore.NATIVE, probe.triple([CROSS_CC])),
        (kernelstore.FUSED, probe.triple([HOST_CC])), (kernelstore.FUSED, probe.triple([CROSS_CC]))]
    model = omrt.load(path, trust_kernels=True)
    fused = [r for r in model.kernels if r.kind == kernelstore.FUSED]
    assert fused[0].status == "loaded" and model.native.fused is not None
    assert fused[1].status == (f"not loaded: built for {target.label(fused[1])}, the native library chosen is for "
                               f"{target.label(fused[0])}; the fused chains run unfused")
    feed = np.linspace(-4, 4, 128, dtype=np.float32).reshape(2, 64)
    np.testing.assert_allclose(model.session().run({"x": feed})["y"], feed * np.clip(feed / 6 + 0.5, 0, 1),
                               rtol=1e-6, atol=1e-6)
    assert model.native.fused.calls()


@pytest.mark.skipif(HOST_CC is None or CROSS_CC is None, reason="needs a C compiler and a cross compiler")
def test_a_custom_c_operator_for_this_host_only_says_so_when_other_targets_are_built(tmp_path):
    from test_custom_ops import fast_gelu_op, unary_model

    cross = probe.triple([CROSS_CC])
    with pytest.warns(RuntimeWarning, match=rf"is built for this host \({platform.machine()}\) only; on {cross} "
                                            r"the model's custom operators will not run"):
        omrt.compile(unary_model("FastGelu"), str(tmp_path / "m.om"), custom_ops=[fast_gelu_op()],
                     cc=[HOST_CC, CROSS_CC])


# --- the loader's choice -----------------------------------------------------------------------


@needs_cc
def test_a_file_for_two_targets_loads_the_one_for_this_host_and_says_why_not_the_other(host_om, foreign_om,
                                                                                      tmp_path):
    both = str(tmp_path / "both.om")
    omrt.repack(host_om, both, add=[foreign_om])
    _, want = run(host_om)
    model, got = run(both)
    host_record, foreign = model.kernels
    assert host_record.status == "loaded" and model.native is not None
    assert model.native.calls()  # the C pool loop ran
    assert foreign.status == (f"not loaded: built for {target.label(foreign)}, this host is {platform.machine()}")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, reference(X), rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_a_library_for_another_target_alone_is_skipped_with_a_one_line_warning(foreign_om):
    with pytest.warns(RuntimeWarning) as caught:
        model, got = run(foreign_om)
    [record] = model.kernels
    why = f"built for {target.label(record)}, this host is {platform.machine()}"
    assert record.status == f"not loaded: {why}"
    assert [str(w.message) for w in caught] == [
        f"omrt: the native library 'omrt-native' for {target.label(record)} packed in the model does not load "
        f"({why}); its kernels run on numpy"]
    assert model.native is None
    want = reference(X)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_the_constructed_foreign_record_is_refused_before_any_byte_is_loaded():
    """Whatever cross compilers this host has, a record whose header and target declare another
    machine is skipped on the header alone (it has no code that could load)."""
    record = constructed_foreign_record()
    before = loader.stats()
    with pytest.warns(RuntimeWarning, match="does not load"):
        assert loader.load([record], trusted=True) is None
    assert record.status == f"not loaded: built for {record.target['triple']}, this host is {platform.machine()}"
    assert loader.stats() == before


@needs_cc
def test_a_baseline_cpu_feature_this_cpu_lacks_is_a_reason_to_skip(tmp_path):
    flags = target.cpu_flags()
    if platform.machine() != "x86_64" or flags is None or "clang" in build.compiler_version(HOST_CC):
        pytest.skip("the features probed here are x86-64 ones, named by gcc")
    missing = [(opt, flag) for opt, flag in [("-msse4a", "sse4a"), ("-mfma4", "fma4"), ("-mxop", "xop"),
                                             ("-mavx512vp2intersect", "avx512_vp2intersect")] if flag not in flags]
    if not missing:
        pytest.skip("this CPU has every feature the test knows how to ask for")
    opt, flag = missing[0]
    path = str(tmp_path / "needs.om")
    omrt.compile(pool_model(), path, cc=f"{HOST_CC} {opt}")
    with pytest.warns(RuntimeWarning, match=f"needs CPU features .*{flag}"):
        model, got = run(path)
    [record] = model.kernels
    assert flag in record.target["cpu"]["features"]
    lacking = sorted(set(record.target["cpu"]["features"]) - flags)
    assert record.status == (f"not loaded: needs CPU features {', '.join(lacking)} (baseline x86-64) that this CPU "
                             f"lacks (/proc/cpuinfo flags)")
    want = reference(X)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@needs_cc
def test_of_two_libraries_for_this_host_the_one_using_more_of_the_cpu_is_chosen(tmp_path):
    flags = target.cpu_flags()
    v3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
    if platform.machine() != "x86_64" or flags is None or not v3 <= flags or "clang" in build.compiler_version(HOST_CC):
        pytest.skip("needs an x86-64-v3 CPU and gcc")
    path = str(tmp_path / "levels.om")
    omrt.compile(pool_model(), path, cc=[HOST_CC, f"{HOST_CC} -march=x86-64-v3"])
    model, got = run(path)
    plain, v3_record = model.kernels
    assert v3_record.target["cpu"]["baseline"] == "x86-64-v3" and v3 <= set(v3_record.target["cpu"]["features"])
    assert v3_record.status == "loaded"
    assert plain.status == (f"not loaded: omrt-native for {target.label(v3_record)} (x86-64-v3) was chosen for "
                            f"this host")
    want = reference(X)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@needs_cc
def test_a_library_needing_a_newer_glibc_is_skipped(host_om):
    [record] = records(host_om)
    here = target.host()
    if record.target["libc"] != "glibc" or here["libc"] != "glibc":
        pytest.skip("not a glibc host")
    newer = here["libc_version"].split(".")[0] + "." + str(int(here["libc_version"].split(".")[1]) + 2)
    record.target = {**record.target, "libc_version": newer}
    with pytest.warns(RuntimeWarning, match=f"needs glibc {newer}, this host has glibc {here['libc_version']}"):
        assert loader.load([record], trusted=True) is None
    assert record.status == f"not loaded: needs glibc {newer}, this host has glibc {here['libc_version']}"


# --- dedupe and counters -----------------------------------------------------------------------


@needs_cc
def test_built_in_libraries_load_once_by_name_and_version_even_when_bytes_differ(tmp_path):
    a = build.build(["pool"], lambda msg: None, HOST_CC)
    b = build.build(["pool"], lambda msg: None, f"{HOST_CC} -Wl,--build-id=none")
    other = build.build(["pool", "elementwise"], lambda msg: None, HOST_CC)
    assert a.data != b.data and loader.dedupe_key(a) == loader.dedupe_key(b) != loader.dedupe_key(other)
    fresh = sum(("name", loader.dedupe_key(r)[1]) not in loader._loaded for r in (a, other))  # not loaded so far
    before = loader.stats()["name"]
    first, second = loader.load([a], trusted=True), loader.load([b], trusted=True)
    assert first._cdll is second._cdll and first is not second
    third = loader.load([other], trusted=True)
    assert third._cdll is not first._cdll and third.units == frozenset({"pool", "elementwise"})
    after = loader.stats()["name"]
    assert (after["loads"] - before["loads"], after["reuses"] - before["reuses"]) == (fresh, 3 - fresh)


def test_custom_libraries_are_keyed_by_content():
    one = Packed(4, "com.acme.ops", "acme", {"version": "1"}, b"\x7fELF same bytes")
    renamed = Packed(4, "other", "someone", {"version": "2"}, b"\x7fELF same bytes")
    changed = Packed(4, "com.acme.ops", "acme", {"version": "1"}, b"\x7fELF other bytes")
    assert loader.dedupe_key(one) == loader.dedupe_key(renamed)
    assert loader.dedupe_key(one)[0] == "content" and loader.dedupe_key(one) != loader.dedupe_key(changed)


@needs_cc
def test_two_models_in_a_fresh_process_share_one_library_and_the_counter_says_so(host_om, tmp_path):
    copy = str(tmp_path / "copy.om")
    omrt.compile(pool_model(), copy)
    code = ("import numpy as np, omrt\n"
            "from omrt.native import loader\n"
            f"a = omrt.load({host_om!r}, trust_kernels=True)\n"
            f"b = omrt.load({copy!r}, trust_kernels=True)\n"
            "x = np.ones((1, 4, 16, 16), np.float32)\n"
            "assert (a.session().run({'x': x})['y'] == b.session().run({'x': x})['y']).all()\n"
            "print(a.native._cdll is b.native._cdll, loader.stats())\n")
    res = run_without_onnx(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ("True {'name': {'loads': 1, 'reuses': 1}, 'content': {'loads': 0, 'reuses': 0}}")


# --- ENV ------------------------------------------------------------------------------------------


def _with_abi(src: str, dst: str, abi: str) -> None:
    """`src` as an omrt with kernel ABI `abi` would have written it: ENV and the record say so."""
    f = OmFile(src)
    env = json.loads(bytes(f.view(Part.ENV)))
    kept = [r for r in unpack(f.view(Part.KERNELS), src)]
    for r in kept:
        r.target = {**r.target, "abi": abi}
    parts = {Part.ENV: json.dumps({**env, "kernel_abi": abi}).encode(), Part.KERNELS: pack(kept)}
    write(dst, [(Part(t), (lambda sink, t=t: sink(parts.get(Part(t), bytes(f.view(Part(t)))))))
                for t in sorted(f.entries, key=lambda t: f.entries[t].offset)], flags=f.flags)
    f.close()


@needs_cc
def test_env_explains_a_file_from_an_omrt_with_another_kernel_abi(host_om, tmp_path):
    old = str(tmp_path / "old.om")
    _with_abi(host_om, old, "0123456789abcdef")
    with pytest.warns(RuntimeWarning, match="kernel ABI 0123456789abcdef"):
        model, got = run(old)
    assert model.compatibility == [
        f"compiled by omrt {omrt.__version__} with kernel ABI 0123456789abcdef; this omrt {omrt.__version__} has "
        f"{kernel_abi()}: its packed native libraries cannot run here, the model runs on numpy kernels: recompile "
        f"it with this omrt (or omrt repack --add a library it built)"]
    want = reference(X)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    omrt.repack(old, old, add=[host_om])  # a library this omrt built
    model, _ = run(old)
    assert model.compatibility == [] and [r.status for r in model.kernels][-1] == "loaded"
    assert omrt.load(host_om).compatibility == []


# --- repack --------------------------------------------------------------------------------------


@needs_cc
def test_repack_round_trip_keeps_every_other_partition_and_the_outputs(host_om, foreign_om, tmp_path):
    _, want = run(host_om)
    path = str(tmp_path / "m.om")
    res = omrt.repack(host_om, path, add=[foreign_om])
    assert [r.target["triple"] for r in res.added] == [records(foreign_om)[0].target["triple"]]
    original, repacked = partitions(host_om), partitions(path)  # every digest checked
    assert set(original) == set(repacked)
    assert all(original[t] == repacked[t] for t in original if t != Part.KERNELS)
    assert [r.data for r in records(path)] == [r.data for r in records(host_om) + records(foreign_om)]
    with open(path, "rb") as f:
        _, major, minor, flags, *_ = HEADER.unpack(f.read(HEADER.size))
    assert (major, minor, flags) == (*VERSION, 1)
    np.testing.assert_array_equal(run(path)[1], want)

    host_target = records(host_om)[0].target["triple"]
    res = omrt.repack(path, path, remove=[f"omrt-native@{host_target}"])  # in place
    assert [r.target["triple"] for r in res.removed] == [host_target]
    assert all(partitions(path)[t] == original[t] for t in original if t != Part.KERNELS)
    with pytest.warns(RuntimeWarning, match="does not load"):
        model, got = run(path)
    assert model.native is None and len(model.kernels) == 1
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())

    omrt.repack(path, path, add=[host_om])  # added again
    model, got = run(path)
    assert [r.status for r in model.kernels][1] == "loaded" and model.native is not None
    np.testing.assert_array_equal(got, want)


@needs_cc
def test_repack_replace_swaps_a_library_for_another_build(host_om, tmp_path):
    rebuilt = str(tmp_path / "rebuilt.om")
    omrt.compile(pool_model(), rebuilt, cc=f"{HOST_CC} -Wl,--build-id=none")
    path = str(tmp_path / "replaced.om")
    res = omrt.repack(host_om, path, replace={"omrt-native": rebuilt})
    assert [r.data for r in res.removed] == [records(host_om)[0].data]
    assert [r.data for r in records(path)] == [records(rebuilt)[0].data] != [records(host_om)[0].data]
    # in a fresh process, so that the replacement's own bytes load (here, host_om's library of the
    # same version would be reused)
    code = ("import numpy as np, omrt\nfrom omrt.native import loader\n"
            f"m = omrt.load({path!r}, trust_kernels=True)\n"
            f"y = m.session().run({{'x': np.load({str(tmp_path / 'x.npy')!r})}})['y']\n"
            f"np.save({str(tmp_path / 'y.npy')!r}, y)\n"
            "print(m.kernels[0].status, loader.stats()['name']['loads'], m.native.calls() != {})")
    np.save(tmp_path / "x.npy", X)
    done = run_without_onnx(code)
    assert done.stdout.split() == ["loaded", "1", "True"], done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), run(host_om)[1])


@needs_cc
def test_repack_refuses_what_it_cannot_do_and_writes_nothing(host_om, foreign_om, tmp_path):
    out = tmp_path / "out.om"
    with pytest.raises(omrt.InputError, match=re.escape(f"{host_om} carries no packed library 'omrt-native@nowhere'; "
                                                        f"it carries: omrt-native@{records(host_om)[0].target['triple']}")):
        omrt.repack(host_om, out, remove=["omrt-native@nowhere"])
    rebuilt = str(tmp_path / "rebuilt.om")
    omrt.compile(pool_model(), rebuilt, cc=f"{HOST_CC} -Wl,--build-id=none")
    label = f"omrt-native@{records(host_om)[0].target['triple']}"
    res = omrt.repack(host_om, out, add=[rebuilt])  # the same version, other bytes: the file keeps its own
    assert res.added == [] and [r.data for r in res.kernels] == [records(host_om)[0].data]
    assert res.notes == [f"{label}: kept the one {host_om} carries, of the same version (kernel ABI, units, CPU "
                         f"features): the loader takes either"]
    assert omrt.repack(host_om, out, add=[host_om]).notes == []  # the very same record: nothing to add or say
    out.unlink()
    so = tmp_path / "bare.so"
    so.write_bytes(records(host_om)[0].data)
    with pytest.raises(omrt.InputError, match="is a bare shared library: a packed library needs its target and units"):
        omrt.repack(host_om, out, add=[str(so)])
    custom = Packed(4, "com.acme.ops", "acme", {}, b"code")
    with_custom = str(tmp_path / "custom.om")
    omrt.repack(host_om, with_custom, add=[custom])
    with pytest.raises(omrt.InputError, match=re.escape(f"{with_custom} already carries com.acme.ops@any target "
                                                        f"(other bytes): custom operators change by recompiling")):
        omrt.repack(with_custom, out, add=[Packed(4, "com.acme.ops", "acme", {}, b"fixed code")])
    refused = re.escape("com.acme.ops@any target holds custom operators (kind 4): the model cannot run without "
                        "them, and its CUSTOM_OPS partition pins their code by digest")
    with pytest.raises(omrt.InputError, match=refused):
        omrt.repack(with_custom, out, remove=["com.acme.ops"])
    with pytest.raises(omrt.InputError, match=refused):  # a replaced record would not be the one pinned
        omrt.repack(with_custom, out, replace={"com.acme.ops": Packed(4, "com.acme.ops", "acme", {}, b"fixed")})
    assert not out.exists()


def test_repack_refuses_a_damaged_file_rather_than_give_it_new_digests(tmp_path):
    """Loading does not check the weights' digest (it would read them all): repack does."""
    source = str(tmp_path / "mlp.om")
    omrt.compile(mlp_model(4), source, native=False)
    data = bytearray(open(source, "rb").read())
    f = OmFile(source)
    weights = f.entry(Part.WEIGHTS)
    f.close()
    data[weights.offset + weights.size // 2] ^= 0xFF
    damaged = tmp_path / "damaged.om"
    damaged.write_bytes(bytes(data))
    with pytest.raises(omrt.FormatError, match="does not match its digest"):
        omrt.repack(damaged, damaged, add=[constructed_foreign_record()])
    assert damaged.read_bytes() == bytes(data)  # in place, and untouched


@needs_cc
def test_repack_drops_a_signature_and_says_to_sign_again(host_om, tmp_path):
    signed = str(tmp_path / "signed.om")
    f = OmFile(host_om)
    parts = [(Part(t), (lambda sink, t=t: sink(bytes(f.view(Part(t)))))) for t in f.entries]
    write(signed, parts + [(Part.SIGNATURE, lambda sink: sink(b"a signature over the packed code"))], flags=f.flags)
    f.close()
    res = omrt.repack(signed, signed, add=[constructed_foreign_record()])
    assert res.notes == [f"{signed} was signed; its packed code changed, so the signature was dropped: sign the new "
                         f"file again (omrt sign)"]
    assert Part.SIGNATURE not in partitions(signed)
    assert len(records(signed)) == 2


# --- compile options and the command line --------------------------------------------------------


def test_a_named_compiler_must_exist_and_build(tmp_path):
    path = tmp_path / "m.om"
    with pytest.raises(omrt.CompileError, match=re.escape("cc='no-such-cc-omrt': no such C compiler on the PATH; "
                                                          "install it or name another")):
        omrt.compile(pool_model(), path, cc="no-such-cc-omrt")
    with pytest.raises(omrt.CompileError, match=r"native=False builds none"):
        omrt.compile(pool_model(), path, cc="gcc", native=False)
    with pytest.raises(omrt.CompileError, match=r"name one or more distinct C compilers"):
        omrt.compile(pool_model(), path, cc=["gcc", "gcc"])
    if HOST_CC is not None:
        with pytest.raises(omrt.CompileError, match=r"building native kernels with .* -fno-such-flag-omrt failed:"):
            omrt.compile(pool_model(), path, cc=f"{HOST_CC} -fno-such-flag-omrt")
        with pytest.raises(omrt.CompileError, match=re.escape(f"cc {HOST_CC!r} and '{HOST_CC} -O2' build the same "
                                                              f"library (omrt-native for ")):
            omrt.compile(pool_model(), path, cc=[HOST_CC, f"{HOST_CC} -O2"])
    assert not path.exists()


@needs_cc
def test_cli_compiles_for_several_compilers_then_repacks_and_inspects(tmp_path, capsys):
    ccs = [HOST_CC] + ([CROSS_CC] if CROSS_CC else [])
    model, path = tmp_path / "m.onnx", str(tmp_path / "m.om")
    onnx.save(pool_model(), model)
    assert cli.main(["compile", str(model), path, "-q"] + [a for cc in ccs for a in ("--cc", cc)]) == 0
    out = capsys.readouterr().out
    triples = [probe.triple(cc.split()) for cc in ccs]
    assert [line.split(":")[0] for line in out.splitlines() if "native kernels" in line] == [
        f"  native kernels omrt-native for {t}" for t in triples]
    assert cli.main(["repack", path, path, "--remove", f"omrt-native@{triples[0]}"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"removed omrt-native for {triples[0]}: omrt {omrt.__version__}; pool; ")
    assert f"{path}: {len(ccs) - 1} packed librar" in out
    assert cli.main(["repack", path, path, "--remove", "omrt-native@nowhere"]) == 2
    assert "carries no packed library 'omrt-native@nowhere'" in capsys.readouterr().err
    if CROSS_CC:
        with pytest.warns(RuntimeWarning, match="does not load"):
            assert cli.main(["inspect", path, "--trust-kernels"]) == 0
        out = capsys.readouterr().out
        assert f"    not loaded: built for {triples[1]}, this host is {platform.machine()}" in out.splitlines()
        assert re.search(r"native libraries in this process: by name \d+ loaded, \d+ reused; by content", out)
