"""Caller-owned memory (`omrt.Memory`): what it costs and what it saves, figure by figure.

    python benchmarks/memory.py                              # every figure (about a minute)
    python benchmarks/memory.py --only frames                # one figure: each is described below
    python benchmarks/memory.py --only shared_arena
    python benchmarks/memory.py --only load_from_memory
    python benchmarks/memory.py --only weights_placement
    python benchmarks/memory.py --only run_op
    python benchmarks/memory.py --json memory.json           # every figure, also written as JSON

- frames: a producer process writes frames into shared memory (`Memory.allocate(shared=True)`,
  its fd passed with `pass_fds`), the consumer binds that memory as squeezenet's input
  (zero_copy="always") and runs on each frame, one pipe handshake per frame. Bytes copied per run
  (`Session.stats.bytes_copied`), and the median run time against runs on a plain numpy array
  bound in the same process, interleaved in blocks.
- shared_arena: squeezenet, shufflenet and inception_v1 run one after another (a detection ->
  classification -> recognition pipeline) on one arena (`omrt.arena_size`) or in three sessions
  of their own: arena bytes, and peak RSS (VmHWM and ru_maxrss) of a fresh process per variant
  after loading the three, making the sessions and running each once; medians of SHARED_REPS.
- load_from_memory: resnet50's .om loaded from a memfd, from bytes and from a `Memory`, against
  loading from its path: median load time (one process, page cache warm), that the working
  directory (a new empty one) stays empty, and that every weight array lies inside the source.
- weights_placement: resnet50 and a MiniLM-sized encoder loaded with their weights copied into
  `Memory.allocate(huge_pages=True)` or `(lock=True)` against the plain file mapping: huge-page
  bytes in /proc/self/smaps, bytes copied at load and its time, median run time (interleaved).
  A variant whose memory cannot be had (locking beyond RLIMIT_MEMLOCK without the privilege)
  is reported with omrt's error and left out.
- run_op: `omrt.run_op` (opset left to its default, and given as `opset=17`) against the same
  kernel through a one-node model's session and against numpy, for Conv, MatMul and Add: median
  call times, interleaved, and the outputs compared.

Every figure runs in worker processes of its own, started with OPENBLAS_NUM_THREADS=1 (omrt's
default of one thread), after WARMUP untimed runs; the parent imports neither numpy nor omrt, so
its memory never weighs on a worker's peak RSS. The models are compiled once, first, with their
native kernels, which the workers trust (`trust_kernels=True`): this script built them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import figures
from load import _maxrss_bytes, _vmhwm_bytes, mib

FIGURES = ("frames", "shared_arena", "load_from_memory", "weights_placement", "run_op")
ARENA_MODELS = ("squeezenet", "shufflenet", "inception_v1")
"""The pipeline of shared_arena: the three light models with the least weights, so that the arena
pages stand out in the RSS, and three different arena sizes."""
MODELS = {"frames": ("squeezenet",), "shared_arena": ARENA_MODELS, "load_from_memory": ("resnet50",),
          "weights_placement": ("resnet50", "minilm"), "run_op": ()}
"""The .om files each figure needs, compiled before any measurement."""
WARMUP = 10
FRAMES = 200
"""Frames per variant in `frames`."""
SHARED_REPS = 5
"""Fresh processes per variant in `shared_arena`."""
LOADS = 30
"""Loads per source in `load_from_memory`."""
PLACED_RUNS = {"resnet50": 30, "minilm": 60}
"""Timed runs per variant in `weights_placement`."""
PLACED_LOADS = 5
"""Loads per variant in `weights_placement` (each copies the weights into the caller's memory)."""
OP_CALLS = 100
"""Timed calls per variant in `run_op`."""
BLOCK = 5
"""Runs per variant in each interleaved block."""
ARENA_TARGET = 1.05
"""The shared arena may be at most the largest arena + 5%."""
MEMFD_NAME = "omrt-bench-model"
OPSET = 17
"""The one-node models' opset, also passed to run_op as `opset=` in the run_op_opset variant."""


# ---------------------------------------------------------------------------------------- models

def om_path(folder: str, name: str) -> str:
    return os.path.join(folder, f"{name}.om")


def onnx_source(name: str, folder: str) -> str:
    """The .onnx of a redrawn light model (compare.py's `build`), or of `minilm`: compare.py's
    encoder at MiniLM-L6 size (hidden 384, 12 heads, FFN 1536, 6 layers, sequence 128)."""
    import onnx

    from compare import build, transformer_model

    if name != "minilm":
        return build(name, folder)
    path = os.path.join(folder, "minilm.onnx")
    onnx.save(transformer_model(layers=6, hidden=384, heads=12, ffn=1536), path)
    return path


def worker_compile(folder: str, names: list[str]) -> dict:
    """Compile each model into `folder`; its compile time and memory sizes, and the versions."""
    import numpy as np

    import omrt

    models = {}
    for name in names:
        result = omrt.compile(onnx_source(name, folder), om_path(folder, name))
        sizes = omrt.load(om_path(folder, name), trust_kernels=True).memory_sizes()
        models[name] = {"compile_s": result.seconds, "om_bytes": os.path.getsize(result.path), **sizes}
    return {"models": models, "versions": {"omrt": omrt.__version__, "numpy": np.__version__,
                                           "python": platform.python_version()}}


def bound_session(model, feeds: dict, zero_copy: str = "auto"):
    """A session of `model` with `feeds` and fresh output arrays bound; returns it and the outputs."""
    import numpy as np

    session = model.session(zero_copy=zero_copy)
    outputs = {s.name: np.empty(s.shape, s.dtype) for s in model.outputs}
    for name, array in {**feeds, **outputs}.items():
        session.bind(name, array)
    return session, outputs


def timed(fns: dict, runs: int) -> dict:
    """WARMUP calls of each function, then `runs` timed ones in interleaved blocks (`bench`'s
    method, no pause between blocks: nothing here spins); `bench.stats` of each."""
    from omrt import bench

    for fn in fns.values():
        for _ in range(WARMUP):
            fn()
    times = bench.interleave(fns, runs, BLOCK, math.inf, settle=0.0)
    return {key: bench.stats(ts) for key, ts in times.items()}


# ---------------------------------------------------------------------------------------- frames

def frame(index: int, shape: tuple[int, ...]):
    """Frame `index`: seeded uniform floats (the same in producer and consumer)."""
    import numpy as np

    return np.random.default_rng(index).random(shape, dtype=np.float32)


def worker_producer(fd: int, shape: tuple[int, ...]) -> dict:
    """Map the consumer's memfd and write a frame into it for every b"n" on stdin, answering b"r";
    stop at anything else. Cycles through four frames, made before the first request."""
    import numpy as np

    from omrt import Memory

    memory = Memory.from_fd(fd)
    view = memory.view(np.float32, shape)
    frames = [frame(i, shape) for i in range(4)]
    written = 0
    while os.read(0, 1) == b"n":
        np.copyto(view, frames[written % len(frames)])
        written += 1
        os.write(1, b"r")
    return {"frames_written": written}


def start_producer(fd: int, shape: tuple[int, ...]) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "producer", "--fd", str(fd),
           "--shape", ",".join(map(str, shape))]
    return subprocess.Popen(cmd, pass_fds=(fd,), stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)


def next_frame(producer: subprocess.Popen) -> None:
    """Ask the producer for the next frame and wait until it is written."""
    os.write(producer.stdin.fileno(), b"n")
    if os.read(producer.stdout.fileno(), 1) != b"r":
        raise SystemExit(f"the frame producer stopped (exit {producer.wait()})")


def frame_check(shared, plain, producer, plain_out: dict) -> dict:
    """Scaled error between frame 0 through shared memory and the plain run on the same data,
    and between frames 0 and 1 (non-zero: the consumer sees each new frame)."""
    from omrt.zoo import scaled_error

    next_frame(producer)
    first = {k: v.copy() for k, v in shared.run().items()}
    plain.run()
    next_frame(producer)
    second = shared.run()
    name = next(iter(first))
    return {"vs_plain": scaled_error(first[name], plain_out[name]),
            "frame1_vs_frame0": scaled_error(second[name], first[name])}


def worker_frames(folder: str) -> dict:
    """Consumer: squeezenet on frames a producer process writes into shared memory, against the
    same model on a plain bound array in this process."""
    import omrt
    from omrt import bench

    model = omrt.load(om_path(folder, "squeezenet"), trust_kernels=True)
    spec = model.inputs[0]
    plain, plain_out = bound_session(model, {spec.name: frame(0, spec.shape)}, zero_copy="always")
    shared, _ = bound_session(model, {}, zero_copy="always")
    memory = shared.alloc_io(spec.name, shared=True)
    producer = start_producer(memory.fd, spec.shape)
    check = frame_check(shared, plain, producer, plain_out)
    run_times: list[float] = []

    def on_frame() -> None:
        next_frame(producer)
        t = time.perf_counter()
        shared.run()
        run_times.append(time.perf_counter() - t)

    stats = timed({"frame": on_frame, "plain": plain.run}, FRAMES)
    stats["shared_run"] = bench.stats(run_times[WARMUP:])
    out, _ = producer.communicate(b"q")
    return {"stats": stats, "check": check, "producer": json.loads(out.decode().strip().splitlines()[-1]),
            "runs": shared.stats.runs, "bytes_copied": shared.stats.bytes_copied,
            "plain_bytes_copied": plain.stats.bytes_copied, "syncs": shared.stats.syncs, "memory": repr(memory)}


# ---------------------------------------------------------------------------------------- shared arena

def worker_arena(folder: str, variant: str) -> dict:
    """Load the pipeline's three models, make their sessions (one shared arena, or each its own),
    run each once in order; peak RSS then, and after the imports."""
    import omrt
    from omrt import bench

    rss_imports = _maxrss_bytes()
    models = [omrt.load(om_path(folder, n), trust_kernels=True) for n in ARENA_MODELS]
    feeds = [bench.random_inputs(m.inputs) for m in models]
    arena = omrt.Memory.allocate(omrt.arena_size(models)) if variant == "shared" else None
    sessions = [m.session(arena=arena) for m in models]
    for session, feed in zip(sessions, feeds):
        session.run(feed)
    arena_bytes = arena.nbytes if arena else sum(s.stats.arena_bytes for s in sessions)
    return {"arena_bytes": arena_bytes, "rss_imports": rss_imports, "maxrss": _maxrss_bytes(),
            "vmhwm": _vmhwm_bytes(), "arenas": [m.memory_sizes()["arena"] for m in models]}


def measure_shared_arena(folder: str, env: dict) -> dict:
    """SHARED_REPS fresh processes per variant, alternating which goes first; medians."""
    reps: dict[str, list[dict]] = {"separate": [], "shared": []}
    for rep in range(SHARED_REPS):
        for variant in (("separate", "shared") if rep % 2 == 0 else ("shared", "separate")):
            reps[variant].append(spawn(["arena", "--dir", folder, "--variant", variant], env))
    keys = ("arena_bytes", "rss_imports", "maxrss", "vmhwm")
    return {"arenas": reps["shared"][0]["arenas"], "reps": reps,
            "median": {v: {k: statistics.median(r[k] for r in rs) for k in keys} for v, rs in reps.items()}}


# ---------------------------------------------------------------------------------------- load from memory

def mapped_ranges(token: str) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings whose /proc/self/maps line names `token`."""
    with open("/proc/self/maps") as f:
        return [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f if token in line]


def weights_inside(model, ranges: list[tuple[int, int]]) -> dict:
    """How many of the model's weight arrays (and bytes) lie wholly inside `ranges`."""
    arrays = list(model.graph.constants.values())
    spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays]
    inside = [any(lo <= s and e <= hi for lo, hi in ranges) for s, e in spans]
    return {"arrays": len(arrays), "inside": sum(inside), "bytes": sum(a.nbytes for a in arrays)}


def memory_sources(path: str) -> tuple[dict, dict, object]:
    """The four sources of one .om file: loaders and the address ranges each must read from; and
    the file's bytes as a uint8 array."""
    import numpy as np

    import omrt

    data = open(path, "rb").read()
    fd = os.memfd_create(MEMFD_NAME)
    with open(fd, "wb", closefd=False) as f:
        f.write(data)
    memory = omrt.Memory.allocate(len(data))
    memory.as_array()[:] = np.frombuffer(data, np.uint8)
    array = np.frombuffer(data, np.uint8)
    loaders = {"path": lambda: omrt.load(path, trust_kernels=True),
               "memfd": lambda: omrt.load(fd, trust_kernels=True),
               "bytes": lambda: omrt.load(data, trust_kernels=True),
               "Memory": lambda: omrt.load(memory, trust_kernels=True)}
    ranges = {"path": lambda: mapped_ranges(path), "memfd": lambda: mapped_ranges(f"/memfd:{MEMFD_NAME}"),
              "bytes": lambda: [(array.ctypes.data, array.ctypes.data + array.nbytes)],
              "Memory": lambda: [(memory.address, memory.address + memory.nbytes)]}
    return loaders, ranges, array


def worker_load(folder: str) -> dict:
    """Time loading resnet50 from each source in a new empty working directory; check the
    weights lie in the source and the outputs agree; list the directory after."""
    import numpy as np

    from omrt import bench
    from omrt.zoo import scaled_error

    path = os.path.abspath(om_path(folder, "resnet50"))
    os.mkdir(os.path.join(folder, "empty"))
    os.chdir(os.path.join(folder, "empty"))
    loaders, ranges, array = memory_sources(path)
    scratch = np.empty_like(array)
    stats = timed({**loaders, "copy": lambda: np.copyto(scratch, array)}, LOADS)
    checks, reference = {}, None
    for source, load in loaders.items():
        model = load()
        feeds = bench.random_inputs(model.inputs)
        out = next(iter(model.session().run(feeds).values()))
        reference = out if reference is None else reference
        checks[source] = {**weights_inside(model, ranges[source]()), "vs_path": scaled_error(out, reference)}
    return {"stats": stats, "checks": checks, "file_bytes": array.nbytes, "cwd_after": os.listdir(".")}


# ---------------------------------------------------------------------------------------- weights placement

def placed_weights(size: int) -> tuple[dict, dict]:
    """The caller memory of each variant (None: the plain mapping), its allocation time, and why
    a variant could not be allocated."""
    import omrt

    memories, notes = {"mapped": None}, {"mapped": {}}
    for variant, flags in (("huge_pages", {"huge_pages": True}), ("locked", {"lock": True})):
        t = time.perf_counter()
        try:
            memories[variant] = omrt.Memory.allocate(size, **flags)
            notes[variant] = {"allocate_s": time.perf_counter() - t}
        except omrt.AllocationError as e:
            notes[variant] = {"error": str(e)}
    return memories, notes


def load_placed(path: str, memory) -> tuple[object, list[float]]:
    """PLACED_LOADS loads of `path` with its weights in `memory`; the last model and the times."""
    import omrt

    times, model = [], None
    for _ in range(PLACED_LOADS):
        model = None
        t = time.perf_counter()
        model = omrt.load(path, trust_kernels=True, weights=memory)
        times.append(time.perf_counter() - t)
    return model, times


def huge_bytes(model, memory) -> int:
    """Huge-page bytes behind the weights: the caller's memory, or the file mapping they lie in."""
    import omrt

    if memory is not None:
        return memory.huge_page_bytes
    spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in model.graph.constants.values()]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    return omrt.Memory.from_address(lo, hi - lo, owner=model, writable=False).huge_page_bytes


def worker_placed(folder: str, name: str) -> dict:
    """Load `name` with each weights placement, run all interleaved; then the huge-page bytes
    and the outputs against the mapped variant's."""
    from omrt import bench
    from omrt.zoo import scaled_error

    path = om_path(folder, name)
    memories, notes = placed_weights(bench.load_compiled(path).memory_sizes()["weights"])
    feeds, sessions, outputs = None, {}, {}
    for variant, memory in memories.items():
        model, times = load_placed(path, memory)
        feeds = feeds or bench.random_inputs(model.inputs)
        sessions[variant], outputs[variant] = bound_session(model, feeds)
        sessions[variant].run()
        notes[variant].update(load_s=statistics.median(times), copied=model.weights_copied)
    stats = timed({v: s.run for v, s in sessions.items()}, PLACED_RUNS[name])
    first = next(iter(outputs["mapped"]))
    for variant, session in sessions.items():
        notes[variant].update(huge_bytes=huge_bytes(session.model, memories[variant]),
                              vs_mapped=scaled_error(outputs[variant][first], outputs["mapped"][first]))
    return {"stats": stats, "variants": notes}


def measure_weights_placement(folder: str, env: dict) -> dict:
    return {name: spawn(["placed", "--dir", folder, "--model", name], env) for name in PLACED_RUNS}


# ---------------------------------------------------------------------------------------- run_op

def one_node_model(op: str, inputs: list, shape: tuple[int, ...], **attrs):
    """An ONNX model of one `op` node whose operands are all graph inputs (so the session runs
    the kernel `run_op` runs, not one specialised for constant weights)."""
    from onnx import TensorProto, helper

    names = [f"x{i}" for i in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], op,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def numpy_conv(x, w, b, y) -> None:
    """Conv with pads 1, stride 1 in numpy: im2col by a sliding window view, one matmul, bias."""
    import numpy as np

    k = w.shape[2]
    padded = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(1, 2))
    columns = windows.transpose(0, 3, 4, 1, 2).reshape(w[0].size, -1)
    np.matmul(w.reshape(len(w), -1), columns, out=y.reshape(len(w), -1))
    y += b[:, None, None]


def op_cases() -> list[dict]:
    """Conv 1x64x56x56 with 64 3x3 filters (pads 1), MatMul 256x512 @ 512x512, Add of two
    1x64x112x112: seeded inputs, the output shape, attributes and the numpy reference."""
    import numpy as np

    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    return [
        {"op": "Conv", "inputs": [f32(1, 64, 56, 56), f32(64, 64, 3, 3) * 0.06, f32(64)],
         "shape": (1, 64, 56, 56), "attrs": {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}, "numpy": numpy_conv},
        {"op": "MatMul", "inputs": [f32(256, 512), f32(512, 512)], "shape": (256, 512), "attrs": {},
         "numpy": lambda a, b, y: np.matmul(a, b, out=y)},
        {"op": "Add", "inputs": [f32(1, 64, 112, 112), f32(1, 64, 112, 112)], "shape": (1, 64, 112, 112),
         "attrs": {}, "numpy": lambda a, b, y: np.add(a, b, out=y)},
    ]


def measure_op(case: dict, folder: str) -> dict:
    """run_op, the one-node session (compiled without native kernels: the same numpy kernel) and
    numpy, each into an output array of its own; times and scaled errors against numpy."""
    import numpy as np

    import omrt
    from omrt.zoo import scaled_error

    ins, attrs = case["inputs"], case["attrs"]
    path = os.path.join(folder, f"{case['op']}.om")
    omrt.compile(one_node_model(case["op"], ins, case["shape"], **attrs), path, native=False)
    session, outs = bound_session(omrt.load(path), {f"x{i}": a for i, a in enumerate(ins)}, zero_copy="always")
    outs = {"session": outs["y"], **{k: np.empty(case["shape"], np.float32)
                                     for k in ("run_op", "run_op_opset", "numpy")}}
    fns = {"run_op": lambda: omrt.run_op(case["op"], ins, [outs["run_op"]], **attrs),
           "run_op_opset": lambda: omrt.run_op(case["op"], ins, [outs["run_op_opset"]], opset=OPSET, **attrs),
           "session": session.run, "numpy": lambda: case["numpy"](*ins, outs["numpy"])}
    stats = timed(fns, OP_CALLS)
    return {"stats": stats, "errors": {k: scaled_error(outs[k], outs["numpy"]) for k in fns}}


def worker_run_op(folder: str) -> dict:
    return {case["op"]: measure_op(case, folder) for case in op_cases()}


# ---------------------------------------------------------------------------------------- the parent

def spawn(args: list[str], env: dict) -> dict:
    """Run one of this script's workers in a fresh process; its JSON answer."""
    return figures.spawn(__file__, args, env)


def thp_mode() -> str:
    """The transparent huge page mode (the bracketed word of the sysfs setting)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return next(w.strip("[]") for w in f.read().split() if w.startswith("["))
    except (OSError, StopIteration):
        return "unknown"


def ms(rec: dict) -> str:
    return f"{rec['median_ms']:.3f} ms"


def verdict(ok: bool, text: str, failures: list[str]) -> str:
    """A PASS/FAIL line; a failed target is also recorded in `failures`."""
    if not ok:
        failures.append(text)
    return f"{'PASS' if ok else 'FAIL'}  {text}"


def report_frames(res: dict, failures: list[str]) -> list[str]:
    s = res["stats"]
    run, plain, cycle = s["shared_run"]["median_ms"], s["plain"]["median_ms"], s["frame"]["median_ms"]
    return [
        f"squeezenet, 1 thread; {s['plain']['runs']} frames per variant after {WARMUP} warm-up, blocks of "
        f"{BLOCK}; input {res['memory']}; the producer wrote {res['producer']['frames_written']} frames",
        f"  run on the shared memory (median)      {run:9.3f} ms",
        f"  run on a plain bound numpy array       {plain:9.3f} ms",
        f"  difference / ratio                     {run - plain:+9.3f} ms   {run / plain:.3f}",
        f"  whole frame (handshake + run)          {cycle:9.3f} ms   handshake {cycle - run:.3f} ms",
        f"  syncs {res['syncs']}; frame 0 vs the plain run: scaled error "
        f"{res['check']['vs_plain']:.1e}; frame 1 vs frame 0: {res['check']['frame1_vs_frame0']:.2f} "
        f"({'differs: the new frame was read' if res['check']['frame1_vs_frame0'] else 'SAME: not read'})",
        verdict(res["bytes_copied"] == 0, f"bytes copied on the shared frames: {res['bytes_copied']} in "
                f"{res['runs']} runs (target 0); on the plain array: {res['plain_bytes_copied']}", failures),
    ]


def report_shared_arena(res: dict, failures: list[str]) -> list[str]:
    sep, sh = res["median"]["separate"], res["median"]["shared"]
    largest = max(res["arenas"])
    lines = [f"{' -> '.join(ARENA_MODELS)}: arenas {', '.join(mib(a) for a in res['arenas'])}; "
             f"medians of {SHARED_REPS} fresh processes per variant",
             f"{'':34}{'separate':>12}{'shared':>12}{'shared/sep':>12}"]
    for key, label in (("arena_bytes", "arena bytes"), ("vmhwm", "peak RSS (VmHWM)"),
                       ("maxrss", "peak RSS (ru_maxrss)"), ("rss_imports", "RSS after imports")):
        lines.append(f"{label:<34}{mib(sep[key]):>12}{mib(sh[key]):>12}{sh[key] / sep[key]:>12.3f}")
    grown = {v: r["vmhwm"] - r["rss_imports"] for v, r in (("separate", sep), ("shared", sh))}
    lines.append(f"{'peak RSS minus after imports':<34}{mib(grown['separate']):>12}{mib(grown['shared']):>12}"
                 f"{grown['shared'] / grown['separate']:>12.3f}")
    lines.append(f"peak RSS saved {mib(sep['vmhwm'] - sh['vmhwm'])} (VmHWM) for "
                 f"{mib(sep['arena_bytes'] - sh['arena_bytes'])} of arena bytes saved")
    lines.append(verdict(sh["arena_bytes"] <= ARENA_TARGET * largest,
                         f"shared arena {mib(sh['arena_bytes'])} = {sh['arena_bytes'] / largest:.3f} x the "
                         f"largest arena (target <= {ARENA_TARGET})", failures))
    return lines


def report_load(res: dict, failures: list[str]) -> list[str]:
    s, path = res["stats"], res["stats"]["path"]["median_ms"]
    lines = [f"resnet50 .om, {mib(res['file_bytes'])}; median of {LOADS} loads per source after {WARMUP} "
             f"warm-up, one process, page cache warm, blocks of {BLOCK}",
             f"{'source':<28}{'load':>12}{'vs path':>9}  weights inside the source"]
    for source, check in res["checks"].items():
        lines.append(f"{source:<28}{ms(s[source]):>12}{s[source]['median_ms'] / path:>9.3f}  "
                     f"{check['inside']} of {check['arrays']} arrays ({mib(check['bytes'])}); "
                     f"output vs path {check['vs_path']:.1e}")
    lines.append(f"{'(a copy of the file, scale)':<28}{ms(s['copy']):>12}{s['copy']['median_ms'] / path:>9.3f}")
    lines.append(verdict(not res["cwd_after"], f"files in the working directory after: {res['cwd_after']}",
                         failures))
    copied = [k for k, c in res["checks"].items() if c["inside"] != c["arrays"]]
    lines.append(verdict(not copied, f"weights outside their source: {copied or 'none'}", failures))
    return lines


def report_weights_placement(res: dict, failures: list[str]) -> list[str]:
    lines = [f"transparent huge pages: {thp_mode()}; median run after {WARMUP} warm-up, interleaved blocks "
             f"of {BLOCK}; load: median of {PLACED_LOADS}, +load = load - the mapped load (the copy)"]
    for name, rec in res.items():
        s, mapped = rec["stats"], rec["variants"]["mapped"]
        lines.append(f"{name + ' (' + str(s['mapped']['runs']) + ' runs each)':<24}{'allocate':>10}{'load':>10}"
                     f"{'+load':>10}{'copied':>11}{'huge pages':>12}{'run':>12}{'vs mapped':>10}  output vs mapped")
        for variant, note in rec["variants"].items():
            if "error" in note:
                lines.append(f"  {variant:<22}not measured: {note['error']}")
                continue
            lines.append(f"  {variant:<22}{note.get('allocate_s', 0) * 1e3:>7.1f} ms{note['load_s'] * 1e3:>7.1f} ms"
                         f"{(note['load_s'] - mapped['load_s']) * 1e3:>7.1f} ms{mib(note['copied']):>11}"
                         f"{mib(note['huge_bytes']):>12}{ms(s[variant]):>12}"
                         f"{s[variant]['median_ms'] / s['mapped']['median_ms']:>10.3f}  {note['vs_mapped']:.1e}")
    return lines


def report_run_op(res: dict, failures: list[str]) -> list[str]:
    lines = [f"median per call after {WARMUP} warm-up, {OP_CALLS} calls per variant in interleaved blocks "
             f"of {BLOCK}; session = one-node model, I/O bound, zero_copy='always'; run_op(opset) = "
             f"run_op(..., opset={OPSET})",
             f"{'op':<8}{'run_op':>11}{'run_op(opset)':>14}{'session':>11}{'numpy':>11}{'run_op/sess':>12}"
             f"{'run_op/np':>10}{'(opset)/sess':>13}  largest scaled error vs numpy"]
    for op, rec in res.items():
        s = {k: v["median_ms"] for k, v in rec["stats"].items()}
        lines.append(f"{op:<8}{s['run_op']:>8.3f} ms{s['run_op_opset']:>11.3f} ms{s['session']:>8.3f} ms"
                     f"{s['numpy']:>8.3f} ms{s['run_op'] / s['session']:>12.3f}{s['run_op'] / s['numpy']:>10.3f}"
                     f"{s['run_op_opset'] / s['session']:>13.3f}  {max(rec['errors'].values()):.1e}")
    return lines


WORKERS = {
    "compile": lambda a: worker_compile(a.dir, a.models.split(",")),
    "producer": lambda a: worker_producer(a.fd, tuple(int(d) for d in a.shape.split(","))),
    "frames": lambda a: worker_frames(a.dir),
    "arena": lambda a: worker_arena(a.dir, a.variant),
    "load_from_memory": lambda a: worker_load(a.dir),
    "placed": lambda a: worker_placed(a.dir, a.model),
    "run_op": lambda a: worker_run_op(a.dir),
}
MEASURES = {
    "frames": lambda d, env, models: spawn(["frames", "--dir", d], env),
    "shared_arena": lambda d, env, models: measure_shared_arena(d, env),
    "load_from_memory": lambda d, env, models: spawn(["load_from_memory", "--dir", d], env),
    "weights_placement": lambda d, env, models: measure_weights_placement(d, env),
    "run_op": lambda d, env, models: spawn(["run_op", "--dir", d], env),
}
REPORTS = {"frames": report_frames, "shared_arena": report_shared_arena, "load_from_memory": report_load,
           "weights_placement": report_weights_placement, "run_op": report_run_op}


def main(argv=None) -> int:
    args = figures.parse(__doc__.splitlines()[0], FIGURES, ("--variant", "--model", "--shape"), argv)
    return figures.run(__file__, "caller-owned memory", args, MODELS, MEASURES, REPORTS, WORKERS)


if __name__ == "__main__":
    sys.exit(main())
