"""Autofuse: latency of two models compiled with and without fused kernels, beside ONNX Runtime,
and the bytes of intermediate tensors that fusion takes out of the arena.

    python benchmarks/autofuse.py                       # both models, 1 and 2 threads
    python benchmarks/autofuse.py --runs 200 --json autofuse.json
    python benchmarks/autofuse.py --models mobilenetv3 --profile

- mobilenetv3: the MobileNetV3-Small-style classifier of architectures.py (1x3x224x224), its
  HardSwish written as x * HardSigmoid(x) and as x * Clip(x + 3, 0, 6) / 6, as exporters do.
- bert: the BERT-style encoder of architectures.py (1x128 tokens, hidden 256, 4 heads, FFN 1024,
  4 layers), LayerNormalization and GELU written out, Softmax after the mask's Add.

Each model is compiled twice (autofuse on, and `autofuse=False`), both loaded with their kernels
trusted (this script built them); ONNX Runtime runs the same ONNX file (CPU provider, default
optimisations). At 1 and 2 threads (omrt.set_num_threads, ORT's intra_op_num_threads) the three
run after warm-up runs in interleaved blocks (omrt.bench.interleave); medians, and the ratios
unfused/fused and fused/ORT. Outputs are checked: fused against unfused and against ORT,
relative to the output's magnitude. Arena figures come from the stored plans: arena size, the sum
of the intermediate tensors that left it, and the lower bound.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from architectures import bert, mobilenetv3
from figures import cpu_name


# ----------------------------------------------------------------------------- measuring

MODELS = {"mobilenetv3": mobilenetv3, "bert": bert}
TINY = {"mobilenetv3": {"size": 64, "width": 0.5}, "bert": {"seq": 16, "hidden": 64, "layers": 1, "ffn": 128}}
"""Sizes for --tiny: the smoke test's, not figures to report."""


def _feeds(model) -> dict[str, np.ndarray]:
    """Seeded inputs: standard normal, and a mask of ones and zeros (nine in ten ones)."""
    rng = np.random.default_rng(1)
    feeds = {}
    for inp in model.graph.input:
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = (rng.random(shape) < 0.9).astype(np.float32) if inp.name == "mask" else \
            rng.standard_normal(shape).astype(np.float32)
    return feeds


def _session(path: str, feeds: dict[str, np.ndarray]):
    import omrt

    model = omrt.load(path, trust_kernels=True)
    sess = model.session()
    for k, v in feeds.items():
        sess.bind(k, v)
    outs = {s.name: np.empty(tuple(s.shape), s.dtype) for s in model.outputs}
    for k, v in outs.items():
        sess.bind(k, v)
    return model, sess, outs


def _arena(model, result) -> dict:
    p = model.default.program
    return {"arena_bytes": p.arena_size, "lower_bound": p.lower_bound, "naive_bytes": p.naive_size,
            "tasks": len(p.tasks), "chains": len(result.fused),
            "intermediate_bytes_removed": sum(f.intermediate_bytes for f in result.fused)}


def measure(name: str, folder: str, threads: list[int], runs: int, warmup: int, tiny: bool,
            profile: bool) -> dict:
    """Compile the model both ways and time it beside ORT at each thread count (module docstring)."""
    import omrt
    import onnx
    from omrt.bench import import_ort, interleave, omrt_threads, ort_session, stats
    from omrt.zoo import scaled_error

    proto = MODELS[name](**(TINY[name] if tiny else {}))
    src = os.path.join(folder, f"{name}.onnx")
    onnx.save(proto, src)
    feeds = _feeds(proto)
    compiled = {v: omrt.compile(src, os.path.join(folder, f"{name}-{v}.om"), autofuse=v == "fused")
                for v in ("fused", "unfused")}
    sessions = {v: _session(os.path.join(folder, f"{name}-{v}.om"), feeds) for v in compiled}
    rec = {v: _arena(sessions[v][0], compiled[v]) for v in compiled}
    rec["fused"]["loaded"] = [(k.name, k.status) for k in sessions["fused"][0].kernels]
    ort = import_ort()
    for n in threads:
        fns = {v: sessions[v][1].run for v in compiled}
        with omrt_threads(n):
            got = {v: {k: a.copy() for k, a in sessions[v][1].run().items()} for v in compiled}
            row = {"check": {"fused_vs_unfused": max(scaled_error(got["fused"][k], got["unfused"][k])
                                                     for k in got["fused"])}}
            if ort is not None:
                osess = ort_session(ort, src, n)
                names = [o.name for o in osess.get_outputs()]
                ref = dict(zip(names, osess.run(names, feeds)))
                row["check"]["fused_vs_ort"] = max(scaled_error(got["fused"][k], ref[k]) for k in ref)
                fns["ort"] = lambda: osess.run(names, feeds)
            for fn in fns.values():
                for _ in range(warmup):
                    fn()
            times = interleave(fns, runs, 5, float("inf"))
            if profile and n == threads[0]:
                for v in compiled:
                    per_op = sessions[v][1].profile(repeat=max(runs // 4, 1))
                    key = "profile_ms" if v == "fused" else "profile_unfused_ms"
                    row[key] = {k: s * 1e3 for k, s in per_op.items()}
        row.update({k: stats(v) for k, v in times.items()})
        row["speedup_vs_unfused"] = row["unfused"]["median_ms"] / row["fused"]["median_ms"]
        if "ort" in row:
            row["fused_vs_ort"] = row["fused"]["median_ms"] / row["ort"]["median_ms"]
            row["unfused_vs_ort"] = row["unfused"]["median_ms"] / row["ort"]["median_ms"]
        rec[str(n)] = row
    return rec


def _report(name: str, rec: dict, threads: list[int]) -> list[str]:
    f, u = rec["fused"], rec["unfused"]
    lines = [f"{name}: {f['chains']} fused chains; arena {u['arena_bytes'] / 2**20:.2f} MiB unfused -> "
             f"{f['arena_bytes'] / 2**20:.2f} MiB fused; intermediate tensors removed from the arena: "
             f"{f['intermediate_bytes_removed'] / 2**20:.2f} MiB; tasks {u['tasks']} -> {f['tasks']}",
             f"  {'threads':>7} {'fused ms':>10} {'unfused ms':>11} {'ORT ms':>8} {'unfused/fused':>14} "
             f"{'fused/ORT':>10} {'unfused/ORT':>12}  check (scaled error)"]
    for n in threads:
        r = rec[str(n)]
        ort = r.get("ort", {}).get("median_ms")
        lines.append(f"  {n:>7} {r['fused']['median_ms']:>10.3f} {r['unfused']['median_ms']:>11.3f} "
                     f"{ort if ort is not None else float('nan'):>8.3f} {r['speedup_vs_unfused']:>13.2f}x "
                     f"{r.get('fused_vs_ort', float('nan')):>9.2f}x {r.get('unfused_vs_ort', float('nan')):>11.2f}x  "
                     + ", ".join(f"{k} {v:.1e}" for k, v in r["check"].items()))
        for key in ("profile_ms", "profile_unfused_ms"):
            if key in r:
                lines.append(f"    {key.replace('_ms', '')} (ms per run, top 12):")
                lines += [f"      {op:<60}{ms:8.3f}" for op, ms in list(r[key].items())[:12]]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--threads", type=lambda s: [int(t) for t in s.split(",")], default=[1, 2])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tiny", action="store_true", help="small models (a smoke test, not figures)")
    ap.add_argument("--profile", action="store_true", help="time per kernel, fused and unfused")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args(argv)
    doc = {"cpu": cpu_name(), "cores": os.cpu_count(), "results": {}}
    print(f"CPU: {doc['cpu']} ({doc['cores']} cores)")
    with tempfile.TemporaryDirectory(prefix="omrt-autofuse-") as folder:
        for name in args.models:
            rec = measure(name, folder, args.threads, args.runs, args.warmup, args.tiny, args.profile)
            doc["results"][name] = rec
            print("\n".join(_report(name, rec, args.threads)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
