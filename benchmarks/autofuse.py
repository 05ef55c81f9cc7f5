"""Autofuse: latency of two models compiled with and without fused kernels, beside ONNX Runtime,
and the bytes of intermediate tensors that fusion takes out of the arena.

    python benchmarks/autofuse.py                       # both models, 1 and 2 threads
    python benchmarks/autofuse.py --runs 200 --json autofuse.json
    python benchmarks/autofuse.py --models mobilenetv3 --profile

- mobilenetv3: a MobileNetV3-Small-style classifier (1x3x224x224), built with onnx.helper from
  seeded weights: a stem, eleven inverted residual blocks (1x1 expansion, depthwise kxk,
  squeeze-excite with HardSigmoid * x, 1x1 projection, residual Add), a head and Softmax.
  HardSwish is written as x * HardSigmoid(x) in half the places and as
  x * Clip(x + 3, 0, 6) / 6 in the other half, as exporters write it.
- bert: a BERT-style encoder (1x128 tokens, hidden 256, 4 heads, FFN 1024, 4 layers): Q/K/V
  projections, scores / 8 + the mask's (1 - mask) * -10000, Softmax, output projection,
  residual Add, LayerNormalization written out as ReduceMean/Sub/Pow/Add/Sqrt/Div/Mul/Add,
  GELU as x * 0.5 * (1 + Erf(x / sqrt 2)).

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

from figures import cpu_name


class _Builder:
    """Nodes, seeded initializers and unique names for an onnx.helper graph."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, value: np.ndarray, stem: str = "c") -> str:
        from onnx import numpy_helper

        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32) if np.asarray(value).dtype.kind == "f"
                                                  else np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        from onnx import helper

        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 2.0) -> str:
        return self.const(self.rng.standard_normal(shape).astype(np.float32) * np.sqrt(gain / fan_in), "w")


# ----------------------------------------------------------------------------- MobileNetV3-style

MOBILENET_BLOCKS = [(3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
                    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
                    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
                    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1)]
"""MobileNetV3-Small: (kernel, expanded channels, output channels, squeeze-excite, activation, stride)."""


def _hardswish(b: _Builder, x: str) -> str:
    """HardSwish as exporters write it: x * HardSigmoid(x), or x * Clip(x + 3, 0, 6) / 6."""
    if b.count % 2:
        return b.op("Mul", [x, b.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)])
    clipped = b.op("Clip", [b.op("Add", [x, b.const(3.0)]), b.const(0.0), b.const(6.0)])
    return b.op("Mul", [x, b.op("Div", [clipped, b.const(6.0)])])


def _act(b: _Builder, x: str, kind: str) -> str:
    return b.op("Relu", [x]) if kind == "RE" else _hardswish(b, x)


def _conv(b: _Builder, x: str, cin: int, cout: int, k: int = 1, stride: int = 1, group: int = 1) -> str:
    w = b.weight((cout, cin // group, k, k), cin // group * k * k)
    bias = b.const(b.rng.standard_normal(cout).astype(np.float32) * 0.05, "b")
    return b.op("Conv", [x, w, bias], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                group=group)


def _squeeze_excite(b: _Builder, x: str, c: int) -> str:
    mid = max(8, c // 4)
    s = b.op("GlobalAveragePool", [x])
    s = b.op("Relu", [_conv(b, s, c, mid)])
    s = b.op("HardSigmoid", [_conv(b, s, mid, c)], alpha=1 / 6, beta=0.5)
    return b.op("Mul", [x, s])


def mobilenetv3(size: int = 224, width: float = 1.0, seed: int = 0):
    """The MobileNetV3-Small-style classifier (module docstring), input 1x3xSIZExSIZE."""
    from onnx import TensorProto, helper

    b = _Builder(seed)
    ch = lambda c: max(8, int(c * width) // 8 * 8)  # noqa: E731
    x = _hardswish(b, _conv(b, "image", 3, ch(16), 3, 2))
    cin = ch(16)
    for k, exp, out, se, nl, stride in MOBILENET_BLOCKS:
        exp, out = ch(exp), ch(out)
        y = _act(b, _conv(b, x, cin, exp), nl) if exp != cin else x
        y = _act(b, _conv(b, y, exp, exp, k, stride, group=exp), nl)
        if se:
            y = _squeeze_excite(b, y, exp)
        y = _conv(b, y, exp, out)
        x = b.op("Add", [x, y]) if stride == 1 and cin == out else y
        cin = out
    x = _hardswish(b, _conv(b, x, cin, ch(576)))
    x = b.op("GlobalAveragePool", [x])
    x = _hardswish(b, _conv(b, x, ch(576), 1024))
    x = b.op("Flatten", [_conv(b, x, 1024, 1000)])
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], axis=-1))
    graph = helper.make_graph(b.nodes, "mobilenetv3_style",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 1000])], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="omrt-bench")


# ----------------------------------------------------------------------------- BERT-style


def _layernorm(b: _Builder, x: str, d: int) -> str:
    """LayerNormalization over the last axis, written out as pre-opset-17 exporters do."""
    mean = b.op("ReduceMean", [x], axes=[-1])
    dev = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Pow", [dev, b.const(2.0)])], axes=[-1])
    std = b.op("Sqrt", [b.op("Add", [var, b.const(1e-12)])])
    y = b.op("Mul", [b.op("Div", [dev, std]), b.const(1 + 0.1 * b.rng.standard_normal(d))])
    return b.op("Add", [y, b.const(0.1 * b.rng.standard_normal(d))])


def _dense(b: _Builder, x: str, din: int, dout: int) -> str:
    y = b.op("MatMul", [x, b.weight((din, dout), din, 1.0)])
    return b.op("Add", [y, b.const(0.02 * b.rng.standard_normal(dout))])


def _gelu(b: _Builder, x: str) -> str:
    """x * 0.5 * (1 + Erf(x / sqrt 2))."""
    erf = b.op("Erf", [b.op("Div", [x, b.const(np.sqrt(2.0))])])
    return b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), b.op("Add", [erf, b.const(1.0)])])


def _heads(b: _Builder, x: str, seq: int, heads: int, dh: int, perm: list[int]) -> str:
    return b.op("Transpose", [b.op("Reshape", [x, b.const(np.array([1, seq, heads, dh], np.int64), "shape")])],
                perm=perm)


def bert(seq: int = 128, hidden: int = 256, heads: int = 4, layers: int = 4, ffn: int = 1024, seed: int = 0):
    """The BERT-style encoder (module docstring): inputs embeddings 1xSEQxHIDDEN and mask 1xSEQ."""
    from onnx import TensorProto, helper

    b = _Builder(seed)
    dh = hidden // heads
    mask = b.op("Mul", [b.op("Sub", [b.const(1.0), "mask"]), b.const(-10000.0)])
    mask = b.op("Unsqueeze", [mask, b.const(np.array([1, 2], np.int64), "axes")])
    x = _layernorm(b, "embeddings", hidden)
    for _ in range(layers):
        q = _heads(b, _dense(b, x, hidden, hidden), seq, heads, dh, [0, 2, 1, 3])
        k = _heads(b, _dense(b, x, hidden, hidden), seq, heads, dh, [0, 2, 3, 1])
        v = _heads(b, _dense(b, x, hidden, hidden), seq, heads, dh, [0, 2, 1, 3])
        scores = b.op("Add", [b.op("Div", [b.op("MatMul", [q, k]), b.const(float(np.sqrt(dh)))]), mask])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]),
                               b.const(np.array([1, seq, hidden], np.int64), "shape")])
        x = _layernorm(b, b.op("Add", [x, _dense(b, ctx, hidden, hidden)]), hidden)
        h = _dense(b, _gelu(b, _dense(b, x, hidden, ffn)), ffn, hidden)
        x = _layernorm(b, b.op("Add", [x, h]), hidden)
    b.nodes.append(helper.make_node("Identity", [x], ["hidden"]))
    graph = helper.make_graph(b.nodes, "bert_style",
                              [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, [1, seq, hidden]),
                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, seq])],
                              [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, hidden])],
                              b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="omrt-bench")


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
