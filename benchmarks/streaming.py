"""Weight streaming and weight swapping: what a weight budget costs and saves, figure by figure.

    python benchmarks/streaming.py                        # every figure (about 3 minutes)
    python benchmarks/streaming.py --only big_mlp         # one figure: each is described below
    python benchmarks/streaming.py --only transformer
    python benchmarks/streaming.py --only swap_cost
    python benchmarks/streaming.py --only soak
    python benchmarks/streaming.py --json streaming.json  # every figure, also written as JSON

- big_mlp: compare.py's 8-layer 4096x4096 MLP (512 MiB of weights), compiled once per batch
  size (8 and 64), loaded with `omrt.load(path, weight_budget=B, keep_page_cache=K)` for two
  budgets: the planner's minimum (read from the InputError it raises for 64 MiB: one 64 MiB
  slot and the resident biases) and that minimum plus one more slot (room for two slots), each
  with K False (the default) and True. One fresh process per budget, K and batch size: the
  model file's pages are dropped first (posix_fadvise DONTNEED), so the first reads come from
  the disk; the streamed model runs once (cold) and WARMUP more times, then peak RSS is taken
  (VmHWM and ru_maxrss, absolute and minus the figure after the imports) and held against
  budget + arena + 10%. Then the fully resident model (the same bytes, loaded from a memfd so
  that its pages are not the streamed file's) and the streamed one run RUNS times each in
  interleaved blocks; medians, the ratio streamed / resident, the page cache the file holds
  after the runs (`cached_bytes`), and the read bandwidth: bytes per run over the time the
  filler thread spent reading them, and bytes per run over the streamed run's median.
- transformer: compare.py's BERT-base-like encoder (4 layers, 108 MiB of weights) under a
  budget of a quarter of its weights, K False and True: the same figures.
- swap_cost: refilling one fixed 16 MiB slot (`WeightSlots.fill` from an array, from a memfd
  and from a file whose pages are cached) against allocating a fresh buffer and copying the
  array into it (np.empty + copy, anonymous mmap + copy; the previous buffer is freed after the
  new one is filled, as a swap would); median per swap, interleaved, and the ratios.
- soak: 256 distinct experts of 16 MiB (4096x1024 float32, seeded) written to a temporary
  file and dropped from the page cache, then 1024 swaps in a seeded routing order (four
  permutations of the 256) into a one-MatMul model through `WeightSlots` (2 slots, filled from
  the file) + `Session.set_weight`. Each run is checked against a second session of the same
  model whose weight is a private array, refilled with the same expert by an ordinary file
  read: the same kernel on the same bits, so a correct swap gives 0 mismatches, bit for bit.
  Reported: mismatches, RSS sampled after every swap (mean of the first and last 10% of the
  samples), open fds and mappings before and after, bytes cycled, time per swap.

Every figure runs in worker processes of its own, started with OPENBLAS_NUM_THREADS=1 (omrt's
default of one thread; the weight filler is a thread of its own, so with two CPUs reading can
overlap computing); the parent imports neither numpy nor omrt, so its memory never weighs on a
worker's peak RSS. The models are compiled first with their native kernels, which the workers
trust (`trust_kernels=True`): this script built them. Temporary files live in a temporary
directory removed at the end.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import sys
import time

import figures
from load import _maxrss_bytes, _vmhwm_bytes, mib
from memory import BLOCK as TIMED_BLOCK
from memory import WARMUP as TIMED_WARMUP
from memory import bound_session, mapped_ranges, om_path, thp_mode, timed, verdict

FIGURES = ("big_mlp", "transformer", "swap_cost", "soak")
MODELS = {"big_mlp": ("mlp8", "mlp64"), "transformer": ("transformer",), "swap_cost": (), "soak": ("expert",)}
"""The .om files each figure needs, compiled before any measurement."""
BATCHES = (8, 64)
ISSUE_BUDGET = 64 << 20
"""The issue's budget class for big_mlp; the planner's minimum is a little above it."""
WARMUP = 2
"""Streamed runs after the cold one, and resident runs, before the timed ones."""
RUNS = 20
"""Timed runs per variant in big_mlp and transformer."""
BLOCK = 5
"""Runs per variant in each interleaved block."""
RSS_SLACK = 1.10
"""Peak RSS growth may be budget + arena + 10%."""
TARGET_RATIO = 1.5
"""Streamed big_mlp at batch 64 within 1.5x of the resident model."""
EXPERT_SHAPE = (4096, 1024)
EXPERTS = 256
SWAPS = 1024
SOAK_BATCH = 8
COST_SWAPS = 200
"""Timed swaps per variant in swap_cost."""
RSS_DRIFT = 0.05
"""The soak's last 10% of RSS samples may differ from its first 10% by at most 5%."""
MAP_SLACK = 2
"""Mappings the soak may end with beyond its start: Python's allocator maps and unmaps its 1 MiB
arenas as objects come and go (a leak of one mapping per swap would show as +1024)."""


# ---------------------------------------------------------------------------------------- models

def expert(index: int, out):
    """Expert `index`, seeded: uniform in [-0.5, 0.5), written into `out` (float32)."""
    import numpy as np

    np.random.default_rng(index).random(out=out, dtype=np.float32)
    out -= 0.5
    return out


def expert_model():
    """One MatMul layer, x (SOAK_BATCH, 4096) @ W (4096, 1024), W being expert 0."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = expert(0, np.empty(EXPERT_SHAPE, np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "expert",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SOAK_BATCH, EXPERT_SHAPE[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SOAK_BATCH, EXPERT_SHAPE[1]])],
        [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def onnx_model(name: str):
    """The ONNX model behind each .om this script compiles."""
    from compare import mlp_model, transformer_model

    if name.startswith("mlp"):
        return mlp_model(layers=8, width=4096, batch=int(name[3:]))
    return transformer_model() if name == "transformer" else expert_model()


def minimum_budget(path: str, budget: int) -> dict:
    """The planner's answer to `budget`: the minimum budget its InputError names (or `budget`
    when it fits), and the error."""
    import omrt

    try:
        omrt.load(path, weight_budget=budget)
    except omrt.InputError as e:
        return {"minimum": int(re.search(r"minimum of (\d+) bytes", str(e)).group(1)), "error": str(e)}
    return {"minimum": budget, "error": None}


def worker_compile(folder: str, names: list[str]) -> dict:
    """Compile each model into `folder`; its sizes, weight bytes, largest weight and the
    planner's minimum budget; and the versions."""
    import platform

    import numpy as np

    import omrt

    models = {}
    for name in names:
        result = omrt.compile(onnx_model(name), om_path(folder, name))
        model = omrt.load(result.path)
        arrays = [a for a in model.graph.constants.values() if a.dtype != object]
        models[name] = {"compile_s": result.seconds, "om_bytes": os.path.getsize(result.path),
                        "weight_bytes": sum(a.nbytes for a in arrays),
                        "largest": max(a.nbytes for a in arrays), **model.memory_sizes(),
                        **minimum_budget(result.path, ISSUE_BUDGET)}
    return {"models": models, "versions": {"omrt": omrt.__version__, "numpy": np.__version__,
                                           "python": platform.python_version()}}


# ---------------------------------------------------------------------------------------- streaming

def memfd_copy(path: str) -> int:
    """A memfd holding the file's bytes (copied by the kernel), whose pages are not the file's."""
    fd, size = os.open(path, os.O_RDONLY), os.path.getsize(path)
    copy = os.memfd_create("omrt-bench-resident")
    done = 0
    while done < size:
        done += os.sendfile(copy, fd, done, size - done)
    os.close(fd)
    return copy


def timed_reads(source) -> list[tuple[int, float]]:
    """Time every read the filler thread makes from the model's weight source: (bytes, seconds)
    per read, appended as they happen."""
    reads, read = [], source.read

    def timed_read(key, into):
        t = time.perf_counter()
        read(key, into)
        reads.append((into.nbytes, time.perf_counter() - t))

    source.read = timed_read
    return reads


def status_bytes(*fields: str) -> dict:
    """These fields of /proc/self/status ("VmRSS", "RssAnon", ...), in bytes."""
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f) if k in fields}


def rss_figures() -> dict:
    """Peak RSS (VmHWM, ru_maxrss) and the current anonymous and file-backed RSS, in bytes."""
    parts = status_bytes("RssAnon", "RssFile")
    return {"vmhwm": _vmhwm_bytes(), "maxrss": _maxrss_bytes(), "anon": parts["RssAnon"], "file": parts["RssFile"]}


def file_mapping(path: str) -> dict:
    """RSS of this process's mappings of `path`, and the part mapped as whole 2 MiB page-cache folios."""
    from omrt.memory.system import smaps_bytes

    ranges = mapped_ranges(path)
    return {k: sum(smaps_bytes(lo, hi - lo, field) for lo, hi in ranges)
            for k, field in (("rss", "Rss"), ("pmd", "FilePmdMapped"))}


def run_streamed(session, runs: int) -> list[float]:
    """Run the streamed session `runs` times; the time of each run."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run()
        times.append(time.perf_counter() - t)
    return times


def plan_figures(model) -> dict:
    """The stream plan of the model's stored program: resident bytes, slots, fills, bytes streamed."""
    plan = model.default.stream
    return {"resident": plan.resident_bytes, "slots": plan.slots, "slot_size": plan.slot_size,
            "fills": len(plan.fills), "streamed": plan.streamed_bytes}


def worker_stream(folder: str, name: str, budget: int, keep: bool) -> dict:
    """One variant: cold file, streamed runs and peak RSS, then the streamed model against the
    resident one, interleaved; the page cache after and the filler's read times."""
    import omrt
    from omrt import bench
    from omrt.memory.system import cached_bytes

    rss_imports = rss_figures()
    path = om_path(folder, name)
    resident_fd = memfd_copy(path)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    model = omrt.load(path, weight_budget=budget, keep_page_cache=keep, trust_kernels=True)
    reads = timed_reads(model.weight_source)
    feeds = bench.random_inputs(model.inputs)
    session, outputs = bound_session(model, feeds)
    warm = run_streamed(session, 1 + WARMUP)
    peak, mapped, warm_reads = rss_figures(), file_mapping(path), len(reads)
    identical, times = against_resident(session, outputs, resident_fd, feeds)
    timed_part = reads[warm_reads:]
    out = {"plan": plan_figures(model), "arena": model.memory_sizes()["arena"], "budget": budget, "keep": keep,
           "rss_imports": rss_imports, "peak": peak, "mapped": mapped, "cold_run_s": warm[0],
           "identical": identical, "stats": times, "cached": cached_bytes(fd), "file_bytes": os.path.getsize(path),
           "reads": session._stream.reads, "runs": session.stats.runs,
           "read_bytes": sum(n for n, _ in timed_part), "read_s": sum(s for _, s in timed_part)}
    os.close(fd)
    return out


def against_resident(session, outputs: dict, resident_fd: int, feeds: dict) -> tuple[bool, dict]:
    """Load the resident model from its memfd, warm it up, check the streamed outputs equal its
    own bit for bit, then time both interleaved; (identical, `bench.stats` of each)."""
    import numpy as np

    import omrt
    from omrt import bench

    resident, resident_outputs = bound_session(omrt.load(resident_fd, trust_kernels=True), feeds)
    for _ in range(WARMUP):
        resident.run()
    identical = all(np.array_equal(outputs[k], resident_outputs[k]) for k in outputs)
    times = bench.interleave({"streamed": session.run, "resident": resident.run}, RUNS, BLOCK, math.inf,
                             settle=0.0)
    return identical, {k: bench.stats(v) for k, v in times.items()}


def measure_big_mlp(folder: str, env: dict, models: dict) -> dict:
    """A fresh process per budget (minimum, minimum + one slot), keep_page_cache and batch."""
    info = models["mlp8"]
    slot = -(-info["largest"] // mmap.PAGESIZE) * mmap.PAGESIZE
    budgets = {"minimum": info["minimum"], "minimum + 1 slot": info["minimum"] + slot}
    variants = []
    for label, budget in budgets.items():
        for keep in (False, True):
            for batch in BATCHES:
                res = spawn(["stream", "--dir", folder, "--model", f"mlp{batch}", "--budget", str(budget),
                             "--keep", str(int(keep))], env)
                variants.append({"label": label, "batch": batch, **res})
    return {"planner": info["error"], "weights": info["weight_bytes"], "variants": variants}


def measure_transformer(folder: str, env: dict, models: dict) -> dict:
    """A fresh process per keep_page_cache, at a budget of a quarter of the weights."""
    budget = models["transformer"]["weight_bytes"] // 4
    variants = [{"label": "weights / 4", "batch": 1,
                 **spawn(["stream", "--dir", folder, "--model", "transformer", "--budget", str(budget),
                          "--keep", str(int(keep))], env)} for keep in (False, True)]
    return {"weights": models["transformer"]["weight_bytes"], "variants": variants}


# ---------------------------------------------------------------------------------------- swap cost

def write_all(fd: int, data) -> None:
    """Write every byte of `data` at the fd's position."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def fresh_array(source):
    """A new array holding a copy of `source` (np.empty + copy)."""
    import numpy as np

    buffer = np.empty_like(source)
    np.copyto(buffer, source)
    return buffer


def fresh_mapping(source):
    """A new anonymous mapping holding a copy of `source`'s bytes (mmap + copy)."""
    import numpy as np

    mapping = mmap.mmap(-1, source.nbytes)
    np.frombuffer(mapping, np.uint8)[:] = source.reshape(-1).view(np.uint8)
    return mapping


def replace_mapping(held: dict, source) -> None:
    """Swap in a fresh mapping, unmapping the previous one after the new one is filled."""
    old, held["mapping"] = held.get("mapping"), fresh_mapping(source)
    if old is not None:
        old.close()


def worker_swap_cost(folder: str) -> dict:
    """Refill one fixed 16 MiB slot from an array, a memfd and a cached file, against np.empty
    + copy and mmap + copy of a fresh buffer; interleaved, and the contents checked."""
    import numpy as np

    import omrt

    source = expert(0, np.empty(EXPERT_SHAPE, np.float32))
    n = source.nbytes
    memfd = os.memfd_create("omrt-bench-expert")
    write_all(memfd, source)
    file_fd = os.open(os.path.join(folder, "expert.bin"), os.O_RDWR | os.O_CREAT, 0o600)
    write_all(file_fd, source)
    slots = omrt.WeightSlots(n, count=1)
    held: dict = {}

    def keep_array() -> None:
        held["array"] = fresh_array(source)

    fns = {"fill_array": lambda: slots.fill(0, source), "fill_memfd": lambda: slots.fill(0, (memfd, 0, n)),
           "fill_file": lambda: slots.fill(0, (file_fd, 0, n)), "empty_copy": keep_array,
           "mmap_copy": lambda: replace_mapping(held, source)}
    stats = timed(fns, COST_SWAPS)
    same = [np.array_equal(slots.view(0, np.float32, EXPERT_SHAPE), source),
            np.array_equal(held["array"], source),
            np.array_equal(np.frombuffer(held["mapping"], np.float32).reshape(EXPERT_SHAPE), source)]
    os.close(file_fd)
    os.close(memfd)
    return {"stats": stats, "bytes": n, "identical": all(same), "thp": thp_mode()}


# ---------------------------------------------------------------------------------------- soak

def write_experts(path: str) -> float:
    """Write the EXPERTS experts to `path`, flush them to the disk and drop them from the page
    cache (so swaps read them back); seconds taken."""
    import numpy as np

    t = time.perf_counter()
    buffer = np.empty(EXPERT_SHAPE, np.float32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for index in range(EXPERTS):
        write_all(fd, expert(index, buffer))
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return time.perf_counter() - t


def handles() -> dict:
    """Open fds and mappings of this process."""
    from omrt.memory.system import map_count

    return {"fds": len(os.listdir("/proc/self/fd")), "maps": map_count()}


class Soak:
    """The swapped session, its reference, the slots and the expert file."""

    def __init__(self, folder: str) -> None:
        import numpy as np

        import omrt
        from omrt import bench

        self.path = os.path.join(folder, "experts.bin")
        self.write_s = write_experts(self.path)
        model = omrt.load(om_path(folder, "expert"), trust_kernels=True)
        feeds = bench.random_inputs(model.inputs)
        self.session, self.out = bound_session(model, feeds)
        self.reference, self.ref_out = bound_session(model, feeds)
        self.private = np.empty(EXPERT_SHAPE, np.float32)
        self.reference.set_weight("W", self.private)
        self.slots = omrt.WeightSlots(self.private.nbytes, count=2)
        self.fd = os.open(self.path, os.O_RDONLY)
        self.file = open(self.path, "rb", buffering=0)

    def swap(self, step: int, index: int) -> tuple[float, float, bool]:
        """Swap expert `index` into slot step % 2 and run; the swap's and the run's seconds, and
        whether the output matches the reference's bit for bit."""
        import numpy as np

        n, slot = self.private.nbytes, step % 2
        t = time.perf_counter()
        self.slots.fill(slot, (self.fd, index * n, n))
        self.session.set_weight("W", self.slots.view(slot, np.float32, EXPERT_SHAPE))
        t1 = time.perf_counter()
        self.session.run()
        t2 = time.perf_counter()
        self.file.seek(index * n)
        self.file.readinto(self.private)
        os.posix_fadvise(self.fd, index * n, n, os.POSIX_FADV_DONTNEED)
        self.reference.run()
        return t1 - t, t2 - t1, bool(np.array_equal(self.out["y"], self.ref_out["y"]))

    def close(self) -> None:
        """Close the sessions and the slots, and remove the expert file."""
        self.session.close()
        self.reference.close()
        self.slots.close()
        self.file.close()
        os.close(self.fd)
        os.unlink(self.path)


def routing() -> list[int]:
    """SWAPS expert indices: seeded permutations of the EXPERTS, one after another."""
    import numpy as np

    rng = np.random.default_rng(12)
    return [int(i) for _ in range(SWAPS // EXPERTS) for i in rng.permutation(EXPERTS)]


def worker_soak(folder: str) -> dict:
    """SWAPS swaps through two slots, each run checked; RSS per swap, handles before and every
    eighth of the way.
    The samples go into arrays allocated before the first measurement, so that the loop itself
    allocates nothing that lasts."""
    import numpy as np

    from omrt import bench

    soak, order = Soak(folder), routing()
    soak.swap(1, 0)  # warm-up: both sessions prepared, slot 1 touched
    soak.swap(0, 1)
    samples, mismatches, counts = np.zeros((3, SWAPS)), 0, [handles()]
    t = time.perf_counter()
    for step, index in enumerate(order):
        samples[0, step], samples[1, step], same = soak.swap(step, index)
        samples[2, step] = status_bytes("VmRSS")["VmRSS"]
        mismatches += not same
        if (step + 1) % (SWAPS // 8) == 0:
            counts.append(handles())
    wall = time.perf_counter() - t
    soak.close()
    return {"write_s": soak.write_s, "mismatches": mismatches, "rss": samples[2].tolist(), "handles": counts,
            "swap": bench.stats(samples[0]), "run": bench.stats(samples[1]), "wall_s": wall,
            "bytes": SWAPS * soak.private.nbytes, "swap_s_total": float(samples[0].sum())}


# ---------------------------------------------------------------------------------------- the parent

def spawn(args: list[str], env: dict) -> dict:
    """Run one of this script's workers in a fresh process; its JSON answer."""
    return figures.spawn(__file__, args, env)


def mb_s(nbytes: float, seconds: float) -> str:
    """A bandwidth in MiB/s ("-" for no time)."""
    return f"{nbytes / 2**20 / seconds:,.0f} MiB/s" if seconds else "-"


def plan_line(v: dict) -> str:
    """What the planner made of a variant's budget."""
    p = v["plan"]
    return (f"budget {v['label']} = {mib(v['budget'])}: {mib(p['resident'])} resident + {p['slots']} slot(s) of "
            f"{mib(p['slot_size'])}; {p['fills']} weights ({mib(p['streamed'])}) streamed per run")


def rss_rows(variants: list[dict], failures: list[str]) -> list[str]:
    """Peak RSS per variant against budget + arena + 10%, what grew (anonymous memory, the model
    file's mapping), and the page cache the file holds after the runs."""
    lines = [f"{'budget':<18}{'keep':>6}{'batch':>6}{'peak RSS':>11}{'growth':>11}{'limit':>11}  verdict"
             f"{'anon':>11}{'file':>10}{'.om mapped':>12}{'(2M folios)':>12}  page cache after"]
    for v in variants:
        peak, base = v["peak"], v["rss_imports"]
        growth = peak["vmhwm"] - base["vmhwm"]
        limit = RSS_SLACK * (v["budget"] + v["arena"])
        ok = growth <= limit
        verdict(ok, f"{v['label']}, keep={v['keep']}, batch {v['batch']}: RSS growth {mib(growth)} <= "
                f"{mib(limit)}", failures)
        lines.append(f"{v['label']:<18}{str(v['keep']):>6}{v['batch']:>6}{mib(peak['vmhwm']):>11}{mib(growth):>11}"
                     f"{mib(limit):>11}  {'PASS' if ok else 'FAIL':<7}{mib(peak['anon'] - base['anon']):>11}"
                     f"{mib(peak['file'] - base['file']):>10}{mib(v['mapped']['rss']):>12}"
                     f"{mib(v['mapped']['pmd']):>12}  {mib(v['cached'])} of {mib(v['file_bytes'])} "
                     f"({v['cached'] / v['file_bytes']:.1%})")
    return lines


def latency_rows(variants: list[dict], failures: list[str], target_batch: int | None) -> list[str]:
    """Streamed against resident medians, the filler's bandwidth and the issue's target."""
    lines = [f"{'budget':<18}{'keep':>6}{'batch':>6}{'cold run':>11}{'streamed':>11}{'resident':>11}{'ratio':>7}"
             f"{'reads/run':>11}{'filler read':>14}{'bytes/run':>14}  same bits"]
    verdicts = []
    for v in variants:
        s, r = v["stats"]["streamed"]["median_ms"], v["stats"]["resident"]["median_ms"]
        per_run = reads_per_run(v)
        lines.append(f"{v['label']:<18}{str(v['keep']):>6}{v['batch']:>6}{v['cold_run_s'] * 1e3:>8.0f} ms"
                     f"{s:>8.0f} ms{r:>8.0f} ms{s / r:>7.2f}{per_run * 1e3:>8.0f} ms"
                     f"{mb_s(v['read_bytes'], v['read_s']):>14}{mb_s(v['plan']['streamed'], s / 1e3):>14}  "
                     f"{'yes' if v['identical'] else 'NO'}")
        if v["batch"] == target_batch:
            verdicts.append(verdict(s / r <= TARGET_RATIO, f"{v['label']}, keep={v['keep']}, batch {v['batch']}: "
                                    f"streamed / resident {s / r:.2f} (target <= {TARGET_RATIO})", failures))
    return lines + verdicts


def reads_per_run(v: dict) -> float:
    """Seconds the filler spends reading one run's streamed bytes (at its timed-phase bandwidth)."""
    return v["read_s"] * v["plan"]["streamed"] / v["read_bytes"] if v["read_bytes"] else 0.0


def overlap_bound(variants: list[dict], batch: int) -> list[str]:
    """Why a ratio is what it is: the filler's read time per run against the resident compute,
    serialised (one slot) and, as a bound, perfectly overlapped."""
    lines = []
    for v in (v for v in variants if v["batch"] == batch and v["read_bytes"]):
        r = v["stats"]["resident"]["median_ms"]
        reads = reads_per_run(v) * 1e3
        lines.append(f"  {v['label']}, keep={v['keep']}: reads {reads:.0f} ms + compute {r:.0f} ms = "
                     f"{(reads + r) / r:.2f}x serialised, {max(reads, r) / r:.2f}x if every read overlapped "
                     f"compute; measured {v['stats']['streamed']['median_ms'] / r:.2f}x")
    return lines


def report_stream(res: dict, failures: list[str], what: str, target_batch: int | None) -> list[str]:
    """The plans, the RSS table and the latency table of a streamed model's variants."""
    variants = res["variants"]
    lines = [what] + sorted({plan_line(v) for v in variants})
    lines += ["", f"peak RSS: VmHWM over load, session, a cold run and {WARMUP} more (ru_maxrss agrees within "
              f"{max(abs(v['peak']['maxrss'] - v['peak']['vmhwm']) for v in variants) / 2**20:.1f} MiB), "
              f"after imports {mib(variants[0]['rss_imports']['vmhwm'])}; growth = peak - after imports, of it "
              f"anonymous and file-backed; limit = (budget + arena) x {RSS_SLACK}; .om mapped = RSS of the model "
              f"file's mapping, of it in whole 2 MiB page-cache folios"]
    lines += rss_rows(variants, failures)
    lines += ["", f"latency: median of {RUNS} runs per variant in interleaved blocks of {BLOCK}, after {WARMUP} "
              f"warm-up runs each; cold run = the first streamed run after the file's pages were dropped; "
              f"reads/run and filler read = time in the filler's reads (os.preadv + fadvise); bytes/run = "
              f"bytes streamed per run / streamed median"]
    lines += latency_rows(variants, failures, target_batch)
    lines += ["", f"reads against compute at batch {target_batch or variants[0]['batch']}:"]
    return lines + overlap_bound(variants, target_batch or variants[0]["batch"])


def report_big_mlp(res: dict, failures: list[str]) -> list[str]:
    """big_mlp's figures, with the issue's latency target at batch 64."""
    head = (f"big_mlp: 8 layers of 4096x4096, {mib(res['weights'])} of weights; the planner for 64 MiB: "
            f"{res['planner']}")
    return report_stream(res, failures, head, 64)


def report_transformer(res: dict, failures: list[str]) -> list[str]:
    """transformer's figures."""
    head = f"transformer: 4 encoder layers, {mib(res['weights'])} of weights, batch 1, sequence 128"
    return report_stream(res, failures, head, None)


def report_swap_cost(res: dict, failures: list[str]) -> list[str]:
    """Median per swap of each variant, and its ratio to each way of refilling the slot."""
    s = {k: v["median_ms"] for k, v in res["stats"].items()}
    fills = ("fill_array", "fill_memfd", "fill_file")
    lines = [f"one {mib(res['bytes'])} slot; median per swap of {res['stats']['fill_array']['runs']} after "
             f"{TIMED_WARMUP} warm-up, interleaved blocks of {TIMED_BLOCK}; transparent huge pages: {res['thp']}; "
             f"contents {'identical' if res['identical'] else 'DIFFER'}",
             f"{'':<28}{'median':>11}{'p90':>11}{'GiB/s':>8}" + "".join(f"{'/ ' + f[5:]:>10}" for f in fills)]
    for key, rec in res["stats"].items():
        ratios = "".join(f"{s[key] / s[f]:>10.2f}" for f in fills)
        lines.append(f"{key:<28}{rec['median_ms']:>8.3f} ms{rec['p90_ms']:>8.3f} ms"
                     f"{res['bytes'] / 2**30 / (rec['median_ms'] / 1e3):>8.1f}{ratios}")
    return lines


def report_soak(res: dict, failures: list[str]) -> list[str]:
    """The soak's checks: mismatches, RSS drift, handles; and its times."""
    rss, tenth = res["rss"], max(1, len(res["rss"]) // 10)
    first, last = sum(rss[:tenth]) / tenth, sum(rss[-tenth:]) / tenth
    b, a = res["handles"][0], res["handles"][-1]
    series = ", ".join(str(h["maps"]) for h in res["handles"])
    return [
        f"{EXPERTS} experts of {mib(res['bytes'] // SWAPS)} written and dropped from the page cache in "
        f"{res['write_s']:.1f} s; {SWAPS} swaps through 2 slots in {res['wall_s']:.1f} s",
        f"  bytes cycled through the slots: {res['bytes'] / 2**30:.1f} GiB",
        f"  swap (fill from the file + set_weight): median {res['swap']['median_ms']:.2f} ms, p90 "
        f"{res['swap']['p90_ms']:.2f} ms; {mb_s(res['bytes'], res['swap_s_total'])} over all swaps",
        f"  run after a swap: median {res['run']['median_ms']:.2f} ms",
        f"  RSS: first 10% {mib(first)}, last 10% {mib(last)}, min {mib(min(rss))}, max {mib(max(rss))}",
        verdict(res["mismatches"] == 0, f"mismatches against the reference session (same kernel, private "
                f"copy): {res['mismatches']} of {SWAPS} (target 0)", failures),
        verdict(abs(last / first - 1) <= RSS_DRIFT, f"RSS last 10% / first 10% = {last / first:.4f} (target "
                f"within {RSS_DRIFT:.0%})", failures),
        verdict(a["fds"] == b["fds"] and a["maps"] <= b["maps"] + MAP_SLACK,
                f"open fds {b['fds']} -> {a['fds']}, mappings {b['maps']} -> {a['maps']} (every eighth: {series}; "
                f"target no growth, mappings within +{MAP_SLACK} for Python's allocator arenas)", failures),
    ]


WORKERS = {
    "compile": lambda a: worker_compile(a.dir, a.models.split(",")),
    "stream": lambda a: worker_stream(a.dir, a.model, int(a.budget), a.keep == "1"),
    "swap_cost": lambda a: worker_swap_cost(a.dir),
    "soak": lambda a: worker_soak(a.dir),
}
MEASURES = {
    "big_mlp": measure_big_mlp,
    "transformer": measure_transformer,
    "swap_cost": lambda d, env, models: spawn(["swap_cost", "--dir", d], env),
    "soak": lambda d, env, models: spawn(["soak", "--dir", d], env),
}
REPORTS = {"big_mlp": report_big_mlp, "transformer": report_transformer, "swap_cost": report_swap_cost,
           "soak": report_soak}


def main(argv=None) -> int:
    """Compile the models the figures need, measure each figure in its workers, report."""
    args = figures.parse(__doc__.splitlines()[0], FIGURES, ("--model", "--budget", "--keep"), argv)
    return figures.run(__file__, "weight streaming", args, MODELS, MEASURES, REPORTS, WORKERS)


if __name__ == "__main__":
    sys.exit(main())
