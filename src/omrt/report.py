"""Human-readable views of a loaded model: partitions, I/O, plan figures, and a plot of the arena."""

from __future__ import annotations

import html
from collections import Counter

from .format import Part
from .errors import FormatError
from .format.signature import part_name, signed_parts
from .format.signature import read as read_signature
from .format.kernelstore import Packed
from .kernels.fused import BODY, intermediate_bytes, is_fused
from .native import loader
from .native.target import label
from .plan import Program, picture
from .plan.stream import StreamPlan
from .runtime import Model
from .signing import short


def mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def plan_figures(p: Program) -> str:
    """Arena, lower bound and naive size on one line, with the ratio the planner is judged by."""
    ratio = p.arena_size / p.lower_bound if p.lower_bound else 1.0
    return (f"arena {mib(p.arena_size)}  lower bound {mib(p.lower_bound)}  (x{ratio:.3f})  "
            f"naive {mib(p.naive_size)}  I/O fallback {mib(p.io_size)}")


def library_line(record: Packed) -> str:
    """A packed record on one line: name and target, who built it from what, what it needs."""
    t = record.target
    cpu = t.get("cpu") or {}
    made = [f"{record.vendor} {t.get('omrt', '')}".strip(), ", ".join(record.units), t.get("compiler", "")]
    needs = [f"{t['libc']} {t.get('libc_version', '')}".strip()] if t.get("libc") else []
    if cpu.get("baseline") or cpu.get("features"):
        needs.append(f"cpu {cpu.get('baseline') or '?'} ({', '.join(cpu.get('features', [])) or 'no listed features'})")
    parts = ["; ".join(p for p in made if p)] + ([f"needs {', '.join(needs)}"] if needs else [])
    if cpu.get("clones"):
        parts.append(f"clones {', '.join(cpu['clones'])}")
    return f"{record.name} for {label(record)}: {'; '.join(parts)}"


def loads_line() -> str:
    """The libraries this process loaded from model files, and reused, per dedupe strategy."""
    counts = loader.stats()
    return "native libraries in this process: " + "; ".join(
        f"by {strategy} {c['loads']} loaded, {c['reuses']} reused" for strategy, c in counts.items())


def describe(model: Model, plan: bool = False) -> str:
    """The text `omrt inspect` prints."""
    f = model._file
    lines = [f"{model.path}: omrt format {f.version[0]}.{f.version[1]}, {mib(model.file_size)}"]
    lines.append("partitions:")
    for e in sorted(f.entries.values(), key=lambda e: e.offset):
        name = Part(e.type).name if e.type in Part._value2member_map_ else f"type {e.type}"
        lines.append(f"  {name:<10} offset {e.offset:>12}  size {e.size:>12}  sha256 {e.digest.hex()[:16]}")
    lines.append("inputs:")
    lines += [f"  {s.name}: {s.dtype.name} {list(s.shape)}" for s in model.inputs]
    lines.append("outputs:")
    lines += [f"  {s.name}: {s.dtype.name} {list(s.shape)}" for s in model.outputs]
    ops = Counter(n.op_type for n in model.graph.nodes)
    lines.append(f"kernels: {len(model.graph.nodes)} nodes, " +
                 ", ".join(f"{op} x{c}" for op, c in ops.most_common()))
    lines.append(f"weights: {len(model.graph.constants)} tensors")
    lines.append(f"packed kernels: {len(model.kernels) or 'none'}")
    for k in model.kernels:
        lines += [f"  {library_line(k)}", f"    {k.status}"]
    if model.kernels:
        lines.append(loads_line())
    if len(model.custom_ops):
        lines.append("custom operators:")
        lines += [f"  {op}" for op in model.custom_ops]
    lines += fused_chains(model)
    lines += signature(model)
    lines.append("environment: " + ", ".join(f"{k} {v}" for k, v in model.env.items()))
    lines += [f"compatibility: {note}" for note in model.compatibility]
    prep = model.default
    if prep is None:
        lines.append(f"plans: {len(model.stored_plans) or 'none'} stored for input signatures (shapes are "
                     f"symbolic; others are planned at run time)")
        lines += [f"  {dict(p.signature)}: {plan_figures(p)}" for p in model.stored_plans]
        return "\n".join(lines)
    p = prep.program
    lines.append(f"plan: {len(p.tasks)} tasks, {len(p.blocks)} feature-map blocks")
    lines.append("  " + plan_figures(p))
    for name, why in p.copy_only.items():
        lines.append(f"  copy-only output {name!r}: {why}")
    if prep.stream is not None:
        lines += streaming(prep.stream, plan)
    if plan:
        lines.append("tasks:")
        for t, task in enumerate(p.tasks):
            node = model.graph.nodes[task.node]
            workspace = (f"  workspace {task.workspace_size}@{task.workspace_offset}" if task.workspace_size
                         else "")
            outs = ", ".join(f"{v}->{p.places[v].region}@{p.places[v].offset}"
                             for v in task.outputs if v in p.places)
            lines.append(f"  {t:4d} {node.op_type:<20} {outs}{workspace}")
        lines.append("arena over time (rows: tasks, columns: bytes):")
        lines.append(picture(p.blocks, p.arena_size, len(p.tasks)))
    return "\n".join(lines)


def signature(model: Model) -> list[str]:
    """Who signed the file and what the signature covers, whether its packed code runs, and why."""
    try:
        record = read_signature(model._file)
    except FormatError as e:
        record, lines = None, [f"signature: damaged ({e})"]
    else:
        lines = [] if record is None else [
            f"signature: {record.algorithm} by key {short(record.fingerprint)}, over the header and "
            + ", ".join(part_name(t) for t in signed_parts(model._file.entries))]
    return lines + [f"trust: {'yes' if model.trust else 'no'}, {model.trust.reason}"]


def _arrays(spec: list) -> str:
    return ", ".join(f"{dt} {'x'.join(str(d) for d in shape) or 'scalar'}" for dt, shape in spec)


def fused_chains(model: Model) -> list[str]:
    """The fused chains of the model: name, C function, guard, intermediates saved, and whether
    they run fused here (else their unfused nodes run)."""
    nodes = [n for n in model.graph.nodes if is_fused(n)]
    if not nodes:
        return []
    library = getattr(model.native, "fused", None)
    lines = [f"fused chains: {len(nodes)}, {mib(sum(intermediate_bytes(n) for n in nodes))} of intermediate "
             f"tensors out of the arena"]
    for n in nodes:
        guard = n.attrs.get("guard", {})
        runs = ("unfused (fused kernels not loaded)" if library is None else
                "fused" if library.get(n.attrs.get("kernel", ""), guard) is not None else
                "unfused (the loaded library has no function for this guard)")
        lines.append(f"  {n.name}: {n.attrs.get('kernel')}, {len(n.attrs[BODY].nodes)} nodes, runs {runs}")
        lines.append(f"    guard: in [{_arrays(guard.get('inputs', []))}] out [{_arrays(guard.get('outputs', []))}] "
                     f"{guard.get('layout', '?')}")
    return lines


def streaming(stream: StreamPlan, schedule: bool) -> list[str]:
    """Resident against streamed weights under the budget, and with `schedule` each fill."""
    lines = [f"weights under a budget of {mib(stream.budget)}: {mib(stream.resident_bytes)} resident "
             f"({len(stream.resident)} tensors), {mib(stream.streamed_bytes)} streamed ({len(stream.fills)} "
             f"tensors) through {stream.slots} slot{'s' if stream.slots != 1 else ''} of {mib(stream.slot_size)}"]
    if schedule:
        lines += [f"  slot {f.slot}: {f.key!r} ({mib(f.nbytes)}) read for tasks {f.first}-{f.last}"
                  + (f", after {stream.fills[f.previous].key!r} is done" if f.previous is not None else "")
                  for f in stream.fills]
    return lines


def plot(model: Model, path: str) -> None:
    """Draw which block holds which arena bytes at which task, as SVG (stdlib) or PNG (matplotlib)."""
    p = model.default.program
    if path.endswith(".svg"):
        with open(path, "w") as f:
            f.write(_svg(p))
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    for k, b in enumerate(p.blocks):
        ax.add_patch(plt.Rectangle((b.first, b.offset / 2**20), b.last - b.first + 1, b.size / 2**20,
                                   color=plt.cm.tab20(k % 20), alpha=0.8))
    ax.set_xlim(0, max(len(p.tasks), 1))
    ax.set_ylim(0, max(p.arena_size, 1) / 2**20)
    ax.set_xlabel("task")
    ax.set_ylabel("arena offset (MiB)")
    ax.set_title(plan_figures(p), fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _svg(p: Program, w: int = 900, h: int = 500) -> str:
    sx = w / max(len(p.tasks), 1)
    sy = h / max(p.arena_size, 1)
    rects = []
    for k, b in enumerate(p.blocks):
        hue = (k * 47) % 360
        rects.append(f'<rect x="{b.first * sx:.1f}" y="{b.offset * sy:.1f}" '
                     f'width="{(b.last - b.first + 1) * sx:.1f}" height="{max(b.size * sy, 0.5):.1f}" '
                     f'fill="hsl({hue},60%,60%)"><title>{html.escape(b.label)}: {b.size} bytes, '
                     f'tasks {b.first}-{b.last}</title></rect>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 20}">'
            f'<text x="0" y="{h + 15}" font-size="11">{html.escape(plan_figures(p))}</text>'
            + "".join(rects) + "</svg>")
