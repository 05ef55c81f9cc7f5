"""The benchmark scripts run end to end (tiny run counts, no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from omrt.bench import matches

pytest.importorskip("onnxruntime")
pytest.importorskip("threadpoolctl")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def bench(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """benchmarks/`script` run with `args`, asserted to have exited 0."""
    proc = subprocess.run([sys.executable, os.path.join(BENCH, script), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _l2_sizes() -> set[str]:
    """The sizes (as "2048K") of the level-2 caches Linux describes for CPU 0."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    names = os.listdir(root) if os.path.isdir(root) else []
    read = lambda index, field: open(os.path.join(root, index, field)).read().strip()
    return {read(i, "size") for i in names if i.startswith("index") and read(i, "level") == "2"}


def test_compare_runs_on_squeezenet(tmp_path):
    out = tmp_path / "compare.json"
    proc = bench("compare.py", "--models", "squeezenet", "--runs", "2", "--warmup", "1", "--threads", "1",
                 "--json", str(out), timeout=120)
    assert "squeezenet" in proc.stdout and "geometric mean" in proc.stdout
    doc = json.loads(out.read_text())
    assert f"L2 {doc['l2']} per core" in proc.stdout
    if doc["l2"] != "unknown" and _l2_sizes():  # the C library's figure, as the kernel describes the cache
        number, unit = doc["l2"].split()
        assert f"{int(number) << {'KiB': 10, 'MiB': 20}[unit] >> 10}K" in _l2_sizes()
    (res,) = doc["results"]
    rec = res["threads"]["1"]
    for variant in ("omrt", "ort_run", "ort_iobinding"):
        assert rec[variant]["runs"] == 2 and rec[variant]["median_ms"] > 0
    assert rec["ratio_vs_run"] > 0 and rec["ratio_vs_iobinding"] > 0
    assert "bytes_copied_per_run" in rec and rec["check"]
    assert doc["summary"]["1"]["all"]["models"] == 1


def test_compare_beside_a_busy_neighbour_records_it_and_stops_it(tmp_path):
    out = tmp_path / "compare.json"
    proc = bench("compare.py", "--models", "squeezenet", "--runs", "2", "--warmup", "1", "--threads", "2",
                 "--neighbour", "3/10", "--json", str(out), timeout=120)
    assert "beside a neighbour busy 3 ms in every 10 ms" in proc.stdout
    (res,) = json.loads(out.read_text())["results"]
    beside = res["neighbour"]
    assert beside["cpu"] == max(os.sched_getaffinity(0)) and (beside["busy_ms"], beside["period_ms"]) == (3, 10)
    assert 0.05 < beside["cpu_share"] < 0.9  # it ran, busy part of the time
    assert res["threads"]["2"]["omrt"]["median_ms"] > 0
    trips = res["threads"]["2"]["round_trip_ns"]  # how far apart omrt's two cores were, before and after
    assert len(trips) == 2 and all(ns is None or ns > 0 for ns in trips)
    assert "(cores " in proc.stdout and "cores: a cache line from omrt's first thread" in proc.stdout
    running = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                running.append(f.read())
        except OSError:
            continue
    assert not any(b"os.sched_setaffinity(0, {int(sys.argv[1])})" in cmd for cmd in running)


def test_compare_marks_the_rows_measured_on_far_cores():
    sys.path.insert(0, BENCH)
    try:
        from compare import far_cores, round_trips, typical_round_trip
    finally:
        sys.path.remove(BENCH)
    near, far, lost = {"round_trip_ns": [60.0, 70.0]}, {"round_trip_ns": [60.0, 350.0]}, {"round_trip_ns": [None, 65.0]}
    results = [{"threads": {"1": {}, "2": near}}, {"threads": {"2": far}}, {"threads": {"2": lost}}, {"error": "x"}]
    assert sorted(round_trips(results)) == [60.0, 60.0, 65.0, 70.0, 350.0]
    assert typical_round_trip(results) == 65.0 and typical_round_trip([{"threads": {"1": {}}}]) == float("inf")
    # one quick probe does not make the usual ones far: 30 ns against 60-70, median 60
    quick = [{"threads": {"2": {"round_trip_ns": [30.0, 60.0]}}}, {"threads": {"2": near}}]
    assert far_cores(near, typical_round_trip(quick)) == ""
    assert far_cores(near, 60.0) == "" and far_cores(lost, 60.0) == "" and far_cores({}, 60.0) == ""
    assert far_cores(far, 60.0) == "  far cores (60 / 350 ns)"
    assert far_cores({"round_trip_ns": [None, 350.0]}, 60.0) == "  far cores (- / 350 ns)"


@pytest.mark.parametrize("spec, message", [("2", "give BUSY/PERIOD in ms"), ("12/10", "at most PERIOD")])
def test_compare_refuses_a_neighbour_it_cannot_make(spec, message):
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "compare.py"), "--models", "squeezenet",
                           "--neighbour", spec], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr


def test_call_lists_benchmark_runs_the_three_ways(tmp_path):
    out = tmp_path / "calls.json"
    proc = bench("call_lists.py", "--models", "squeezenet", "--threads", "1", "--runs", "2", "--warmup", "1",
                 "--json", str(out))
    res = json.loads(out.read_text())["results"]["squeezenet"]["1"]
    assert set(res["median_ms"]) == {"per node", "per call", "call lists"} and min(res["median_ms"].values()) > 0
    assert res["max_relative_difference"] < 1e-4 and "call lists / per node" in proc.stdout


def test_pools_benchmark_times_both_paths_and_ort(tmp_path):
    out = tmp_path / "pools.json"
    proc = bench("pools.py", "--shapes", "8:27:2:0,8:27:1:1", "--runs", "2", "--json", str(out))
    first, second = json.loads(out.read_text())["results"]
    assert first["asks_for_vector_path"] and not second["asks_for_vector_path"]
    for res in (first, second):
        assert set(res["median_us"]) == {"vector path", "without it", "ORT"} and min(res["median_us"].values()) > 0
        assert res["vector_vs_without"] > 0 and res["vector_vs_ort"] > 0
    assert "vec/ORT" in proc.stdout


def inception_like_block():
    """x -> [1x1], [1x1 -> 3x3], [max pool -> 1x1] -> Concat -> 1x1, then a residual Add of the
    block's input to a 1x1 of the concatenation: one group of three branches (1, 2 and 2 nodes),
    and none at the Add (the Conv before it reads the Concat, which is not a branch of x)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def conv(name, x, c_in, c_out, k=1):
        w = numpy_helper.from_array(rng.standard_normal((c_out, c_in, k, k)).astype(np.float32) * 0.1, name + "_w")
        return helper.make_node("Conv", [x, w.name], [name], name=name, pads=[k // 2] * 4), w

    parts = [conv("a", "x", 8, 8), conv("b1", "x", 8, 4), conv("b2", "b1", 4, 8, 3),
             (helper.make_node("MaxPool", ["x"], ["p"], name="p", kernel_shape=[3, 3], pads=[1] * 4), None),
             conv("c", "p", 8, 8)]
    parts.append((helper.make_node("Concat", ["a", "b2", "c"], ["cat"], name="cat", axis=1), None))
    parts.append(conv("d", "cat", 24, 8))
    parts.append((helper.make_node("Add", ["d", "x"], ["y"], name="add"), None))
    graph = helper.make_graph([n for n, _ in parts], "block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [w for _, w in parts if w is not None])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_branches_benchmark_finds_the_blocks_branches(tmp_path):
    import onnx

    src, out = tmp_path / "block.onnx", tmp_path / "branches.json"
    onnx.save(inception_like_block(), str(src))
    proc = bench("branches.py", "--models", str(src), "--rounds", "2", "--json", str(out))
    (res,) = json.loads(out.read_text())["results"].values()
    (group,) = res["groups"]
    assert group["join"] == "cat" and group["branch_nodes"] == [1, 2, 2]
    assert group["now_2t_us"] > 0 and min(group["branches_1t_us"]) > 0
    loads = [0.0, 0.0]  # the branches longest first, each onto the less loaded of two threads
    for cost in sorted(group["branches_1t_us"], reverse=True):
        loads[loads.index(min(loads))] += cost
    assert group["at_once_us"] == pytest.approx(max(loads))
    assert group["gain_us"] == pytest.approx(group["now_2t_us"] - group["at_once_us"])
    assert res["gain_every_group_us"] == pytest.approx(group["gain_us"]) and "every group at once" in proc.stdout


def test_plans_benchmark_uses_the_stored_plans(tmp_path):
    out = tmp_path / "plans.json"
    bench("plans.py", "--reps", "1", "--json", str(out))
    for name, res in json.loads(out.read_text())["results"].items():
        assert res["stored_plans_used"] == {"runtime": 0, "stored": 3}, name
        assert res["median_ms"]["stored"] > 0 and res["median_ms"]["runtime"] > 0


@pytest.mark.parametrize("script, figure", [("memory.py", "run_op"), ("streaming.py", "swap_cost"),
                                            ("serving.py", "frame")])
def test_figure_benchmarks_measure_one_figure(tmp_path, script, figure):
    out = tmp_path / "figure.json"
    proc = bench(script, "--only", figure, "--json", str(out))
    doc = json.loads(out.read_text())
    assert list(doc["figures"]) == [figure] and doc["failures"] == [] and doc["cpu"]
    assert f"== {figure}" in proc.stdout


def test_custom_ops_benchmark_matches_and_times(tmp_path):
    from omrt.native.build import compiler

    if compiler() is None:
        pytest.skip("the benchmark builds a C operator; no C compiler on this host")
    out = tmp_path / "custom.json"
    bench("custom_ops.py", "--skip-venv", "--runs", "2", "--warmup", "1", "--json", str(out))
    lat = json.loads(out.read_text())["latency"]
    assert set(lat["median_ms"]) == {"omrt_c", "omrt_py", "ort"} and lat["ratio_vs_ort"]["ort"] == 1
    assert max(lat["error"].values()) < 1e-5 and lat["fast_gelu_ms"]["omrt_c"] > 0


def test_autofuse_benchmark_runs_both_models(tmp_path):
    out = tmp_path / "autofuse.json"
    proc = bench("autofuse.py", "--tiny", "--runs", "2", "--warmup", "1", "--threads", "1,2", "--json", str(out))
    assert "intermediate tensors removed from the arena" in proc.stdout
    for name, res in json.loads(out.read_text())["results"].items():
        assert res["fused"]["chains"] > 0 and res["unfused"]["chains"] == 0, name
        assert res["fused"]["intermediate_bytes_removed"] > 0, name
        assert res["fused"]["loaded"] == [["omrt-native", "loaded"], ["omrt-fused", "loaded"]], name
        for n in ("1", "2"):
            rec = res[n]
            assert rec["check"]["fused_vs_unfused"] < 1e-5 and rec["check"]["fused_vs_ort"] < 1e-4, name
            assert rec["fused"]["runs"] == 2 and rec["unfused"]["median_ms"] > 0 and rec["ort"]["median_ms"] > 0


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))


needs_cpuid_faulting = pytest.mark.skipif(
    sys.platform != "linux" or os.uname().machine != "x86_64" or "cpuid_fault" not in _cpu_flags(),
    reason="hiding AVX-512 needs Linux on x86-64 with CPUID faulting")

SEEN = """
import json, sys, threading
import numpy as np
try:
    from numpy._core._multiarray_umath import __cpu_features__ as numpy_features
except ImportError:  # numpy before 2.0
    from numpy.core._multiarray_umath import __cpu_features__ as numpy_features
import omrt
from omrt.kernels.packed import gemm_tile
from omrt.native.blas import openblas
from hide_avx512 import cpuid_answers
seen = {}
def import_in_a_thread():  # a thread started after the trap was set sees it too
    import onnxruntime
    seen["ort"] = onnxruntime.__version__
thread = threading.Thread(target=import_in_a_thread)
thread.start()
thread.join()
model = omrt.load(sys.argv[1], trust_kernels=True)
print(json.dumps({"numpy": {k: bool(numpy_features[k]) for k in ("AVX512F", "AVX2", "FMA3")},
                  "blas": openblas().core, "tile": gemm_tile(model.native), "answers": cpuid_answers(),
                  "ort": seen["ort"]}))
"""


@needs_cpuid_faulting
def test_hide_avx512_hides_it_from_every_library_and_keeps_avx2(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    import omrt

    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8, 1, 1], np.ones(128, np.float32))
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32, 32])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    omrt.compile(str(tmp_path / "m.onnx"), str(tmp_path / "m.om"))
    script = tmp_path / "seen.py"
    script.write_text(SEEN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([BENCH, os.environ.get("PYTHONPATH", "")])}
    plain, hidden = (json.loads(subprocess.run([sys.executable, *launcher, str(script), str(tmp_path / "m.om")],
                                               capture_output=True, text=True, timeout=120, env=env,
                                               check=True).stdout.splitlines()[-1])
                     for launcher in ([], [os.path.join(BENCH, "hide_avx512.py")]))
    assert plain["answers"] is None and hidden["answers"] > 0
    assert not hidden["numpy"]["AVX512F"] and hidden["tile"] < 2
    assert hidden["blas"] not in ("SkylakeX", "Cooperlake", "SapphireRapids")
    assert hidden["numpy"]["AVX2"] == plain["numpy"]["AVX2"] and hidden["numpy"]["FMA3"] == plain["numpy"]["FMA3"]
    assert hidden["tile"] == min(plain["tile"], 1)


@needs_cpuid_faulting
def test_hide_avx512_leaves_other_faults_to_kill_the_process(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import ctypes\nctypes.string_at(8)\n")  # reads address 8: a real segmentation fault
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "hide_avx512.py"), str(script)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -11


@needs_cpuid_faulting
def test_compare_with_avx512_hidden_says_so_and_records_what_the_worker_saw(tmp_path):
    out = tmp_path / "compare.json"
    proc = bench("compare.py", "--models", "squeezenet", "--runs", "2", "--warmup", "1", "--threads", "1",
                 "--hide-avx512", "--json", str(out), timeout=120)
    assert "hidden from the workers" in proc.stdout and "AVX-512 hidden (" in proc.stdout
    (res,) = json.loads(out.read_text())["results"]
    view = res["cpu_view"]
    assert view["cpuid_hidden"] > 0 and not view["numpy_avx512f"] and view["omrt_tile"] != "AVX-512"
    assert matches(res["threads"]["1"])


def test_cpu_name_gives_the_family_and_model_a_virtual_machine_name_leaves_out():
    sys.path.insert(0, BENCH)
    try:
        from figures import cpu_name
    finally:
        sys.path.remove(BENCH)
    x86 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
           "model name\t: AMD EPYC\nflags\t\t: fpu avx2\n\n"
           "processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: Other\n")
    assert cpu_name(x86) == "AMD EPYC (family 25, model 17)"  # the first processor's, not the last's
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\nmodel name\t: Neoverse\n"
    assert cpu_name(arm) == "Neoverse"
    assert cpu_name(open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else "") == cpu_name()
