"""C source for fused chains: one function per chain, a loop over rows and, in each row, over
its elements, evaluating the chain's expression with no intermediate tensor.

A chain is described in primitives (`Step`), over a frame of `rows` x `cols` elements: every full
value of the chain has that many elements, stored row after row; a row value has one per row
(what a reduction over the row leaves, or an operand that is constant along the row). Operands
are read through `Operand`: a per-row offset, plus the element index when they vary along the
row, which is how broadcasting (a per-channel vector, an attention mask) is handled.

A chain without reductions is one loop; a chain with reductions runs in phases, one loop over
the row per phase: a reduction's result is known after the loop of the phase its input is
computed in. Full values are recomputed in later phases from the operands (cheap arithmetic), or
stored in a row buffer on the stack when they are dear (exp, erf, tanh) and it is small.

Used at compile time only (omrt/native/fused.py builds the library); needs only the stdlib.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRELUDE = "omrt_fused.h"
"""The header every generated library includes (csrc/): the pool hook and branch-free math."""

UNARY = {
    "neg": "(-{0})", "abs": "fabsf({0})", "sqrt": "sqrtf({0})", "recip": "(1.0f / {0})",
    "relu": "({0} < 0.0f ? 0.0f : {0})", "exp": "omrt_fx_exp({0})", "erf": "omrt_fx_erf({0})",
    "tanh": "omrt_fx_tanh({0})", "sigmoid": "omrt_fx_sigmoid({0})", "copy": "{0}",
    "leaky": "({0} < 0.0f ? {0} * {p0} : {0})", "clip": "omrt_fx_clip({0}, {p0}, {p1})",
    "hardsigmoid": "omrt_fx_clip({0} * {p0} + {p1}, 0.0f, 1.0f)",
    "hardswish": "({0} * omrt_fx_clip({0} * {p0} + {p1}, 0.0f, 1.0f))",
    "gelu": "(0.5f * {0} * (1.0f + omrt_fx_erf({0} * 0.707106781f)))",
}
"""Elementwise primitives of one operand; {pK} are the step's parameters. NaN goes through
Relu, Clip and Max/Min as it does through numpy's."""

BINARY = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
          "max": "({0} > {1} || {0} != {0} ? {0} : {1})", "min": "({0} < {1} || {0} != {0} ? {0} : {1})"}

REDUCE = {"sum": ("0.0f", "{a} + {v}"), "rmax": ("-INFINITY", "({a} > {v} ? {a} : {v})")}
"""Reductions over the row: the accumulator's start and its update with value v."""

DEAR = frozenset({"exp", "erf", "tanh", "sigmoid", "gelu"})
"""Primitives worth storing rather than computing again in a later phase."""

LANES = 16
"""Accumulators per reduction: independent partial results the loop can keep in one vector."""

CHUNK = 1024
"""Elements of a row a reducing loop computes before it reduces them (a buffer in L1 cache)."""

STORE_BYTES = 1 << 16
"""Stack bytes a row's stored values may take (per thread)."""


@dataclass(frozen=True)
class Operand:
    """How one input array is read: at row i, offset sum((i // div) % mod * stride) over `terms`,
    plus the element index j when `full` (it varies along the row); else one value per row."""

    name: str
    terms: tuple[tuple[int, int, int], ...]
    full: bool


@dataclass(frozen=True)
class Step:
    """out = op(args), args being value names or float literals; `params` are op constants."""

    out: str
    op: str
    args: tuple[str | float, ...]
    params: tuple[float, ...] = ()


@dataclass(frozen=True)
class Chain:
    """A fused chain: its C symbol, frame, operands, steps and outputs (name, full)."""

    symbol: str
    rows: int
    cols: int
    inputs: tuple[Operand, ...]
    steps: tuple[Step, ...]
    outputs: tuple[tuple[str, bool], ...]

    @property
    def reduces(self) -> bool:
        return any(s.op in REDUCE for s in self.steps)


def literal(x: float) -> str:
    """A C float literal for x (infinities and NaN spelled as macros)."""
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    text = repr(float(x))
    return f"{text}f" if "e" in text or "." in text else f"{text}.0f"


class _Writer:
    """The C text of one chain."""

    def __init__(self, chain: Chain) -> None:
        self.c = chain
        self.var: dict[str, str] = {}
        self.full: dict[str, bool] = {}
        self.ready: dict[str, int] = {}
        self.by_out = {s.out: s for s in chain.steps}
        for k, op in enumerate(chain.inputs):
            self.var[op.name] = f"x{k}"
            self.full[op.name], self.ready[op.name] = op.full, 0
        for k, s in enumerate(chain.steps):
            self.var[s.out] = f"v{k}"
            names = [a for a in s.args if isinstance(a, str)]
            if s.op in REDUCE:
                self.full[s.out], self.ready[s.out] = False, self.ready[names[0]] + 1
            else:
                self.full[s.out] = any(self.full[a] for a in names)
                self.ready[s.out] = max((self.ready[a] for a in names), default=0)
        self.written: set[str] = set()
        """Row outputs already written (once per row, as soon as they are known)."""
        self.phases = 1 + max((self.ready[s.out] - 1 for s in chain.steps if s.op in REDUCE), default=-1)
        self.stored = self._stored()

    def _stored(self) -> set[str]:
        """Dear full values read in a later phase than theirs, while the stack allows."""
        later = {a for s in self.c.steps for a in s.args if isinstance(a, str) and self.full.get(a)
                 and self._phase_of(s) > self.ready[a]}
        dear = sorted(v for v in later if v in self.by_out and self.by_out[v].op in DEAR)
        room = STORE_BYTES // (4 * self.c.cols)
        return set(dear[:room])

    def _phase_of(self, s: Step) -> int:
        """The loop a full step's value is needed in: its reduction's, else its own."""
        return self.ready[s.out] - 1 if s.op in REDUCE else self.ready[s.out]

    def expr(self, s: Step) -> str:
        args = [a if isinstance(a, str) else None for a in s.args]
        vals = [self.var[a] if a is not None else literal(x) for a, x in zip(args, s.args)]
        fields = {f"p{k}": literal(p) for k, p in enumerate(s.params)}
        table = UNARY if len(vals) == 1 else BINARY
        return table[s.op].format(*vals, **fields)

    def _loop_body(self, phase: int, targets: list[str]) -> list[str]:
        """Statements computing `targets` (full values) at element jj in this phase."""
        lines, done = [], set()

        def need(v: str) -> None:
            if v in done or not self.full.get(v):
                return
            done.add(v)
            if v in self.stored and self.ready[v] < phase:
                lines.append(f"const float {self.var[v]} = s_{self.var[v]}[jj];")
                return
            if v not in self.by_out:
                lines.append(f"const float {self.var[v]} = p{self.var[v]}[jj];")
                return
            s = self.by_out[v]
            for a in s.args:
                if isinstance(a, str):
                    need(a)
            lines.append(f"const float {self.var[v]} = {self.expr(s)};")

        for v in targets:
            need(v)
        return lines

    def _row_steps(self, emitted: set[str], phase: int) -> list[str]:
        """Row values computable before the loop of `phase`, in order, and row outputs written."""
        lines = []
        for s in self.c.steps:
            if s.out in emitted or self.full[s.out] or s.op in REDUCE or self.ready[s.out] > phase:
                continue
            emitted.add(s.out)
            lines.append(f"const float {self.var[s.out]} = {self.expr(s)};")
        for name, full in self.c.outputs:
            if not full and name in emitted and name not in self.written:
                self.written.add(name)
                # one writer per row: a chain split over its columns runs each row in every part
                lines.append(f"if (c0 == 0) o{self._out_index(name)}[i] = {self.var[name]};")
        return lines

    def _out_index(self, name: str) -> int:
        return [n for n, _ in self.c.outputs].index(name)

    def row_function(self) -> str:
        c = self.c
        lines = [f"static OMRT_INLINE void row_{c.symbol}(const job_{c.symbol} *J, int64_t i, int64_t c0, "
                 f"int64_t c1) {{"]
        for k, op in enumerate(c.inputs):
            off = " + ".join(f"(i / {d} % {m}) * {st}" for d, m, st in op.terms) or "0"
            if op.full:  # input 0 may be output 0's buffer (AutoFused.inplace): no restrict on those two
                lines.append(f"    const float *{'' if k == 0 else 'restrict '}px{k} = J->in{k} + {off};")
            else:
                lines.append(f"    const float x{k} = J->in{k}[{off}];")
        for k, (name, full) in enumerate(c.outputs):
            if full:
                lines.append(f"    float *{'' if k == 0 else 'restrict '}o{k} = J->out{k} + i * {c.cols};")
            else:
                lines.append(f"    float *restrict o{k} = J->out{k};")
        for v in sorted(self.stored):
            lines.append(f"    float s_{self.var[v]}[{c.cols}];")
        lines.append("    (void)c0; (void)c1;")
        emitted: set[str] = {op.name for op in c.inputs if not op.full}
        for phase in range(self.phases + 1):
            lines += ["    " + s for s in self._row_steps(emitted, phase)]
            lines += self._phase_loop(phase, emitted)
        lines += ["    " + s for s in self._row_steps(emitted, self.phases + 1)]
        lines.append("}")
        return "\n".join(lines)

    def _phase_loop(self, phase: int, emitted: set[str]) -> list[str]:
        """The loop over the row of one phase: reductions, stores and full outputs of the phase."""
        c = self.c
        reds = [s for s in c.steps if s.op in REDUCE and self.ready[s.out] - 1 == phase]
        stores = [v for v in sorted(self.stored) if self.ready[v] == phase]
        outs = [n for n, full in c.outputs if full and self.ready[n] == phase]
        if not (reds or stores or outs):
            return []
        targets = [s.args[0] for s in reds] + stores + outs
        body = self._loop_body(phase, targets)
        body += [f"s_{self.var[v]}[jj] = {self.var[v]};" for v in stores]
        body += [f"o{self._out_index(n)}[jj] = {self.var[n]};" for n in outs]
        out: list[str] = []
        if not reds:
            lo, hi = ("c0", "c1") if not c.reduces else ("0", str(c.cols))
            out.append(f"    for (int64_t jj = {lo}; jj < {hi}; jj++) {{")
            out += ["        " + s for s in body]
            out.append("    }")
            return out
        return self._reducing_loop(reds, body, emitted)

    def _reducing_loop(self, reds: list[Step], body: list[str], emitted: set[str]) -> list[str]:
        """A phase with reductions, CHUNK elements at a time: one plain loop computes the chunk's
        values into buffers (and writes the phase's stores and outputs), then each reduction
        adds its buffer into LANES partial results; both loops vectorize."""
        c, out = self.c, []
        for s in reds:
            start, _ = REDUCE[s.op]
            out.append(f"    float a_{self.var[s.out]}[{LANES}];")
            out.append(f"    for (int l = 0; l < {LANES}; l++) a_{self.var[s.out]}[l] = {start};")
        out.append(f"    for (int64_t j0 = 0; j0 < {c.cols}; j0 += {CHUNK}) {{")
        out.append(f"        const int64_t n = j0 + {CHUNK} < {c.cols} ? {CHUNK} : {c.cols} - j0;")
        out += [f"        float r_{self.var[s.out]}[{CHUNK}];" for s in reds]
        out.append("        for (int64_t jj = j0; jj < j0 + n; jj++) {")
        out += ["            " + line for line in body]
        out += [f"            r_{self.var[s.out]}[jj - j0] = {self.var[s.args[0]]};" for s in reds]
        out.append("        }")
        out.append("        int64_t j = 0;")
        out.append(f"        for (; j + {LANES} <= n; j += {LANES})")
        out.append(f"            for (int l = 0; l < {LANES}; l++) {{")
        out += ["                " + self._accumulate(s, "l", "j + l") for s in reds]
        out.append("            }")
        out.append("        for (; j < n; j++) {")
        out += ["            " + self._accumulate(s, "0", "j") for s in reds]
        out.append("        }")
        out.append("    }")
        for s in reds:
            a, v = f"a_{self.var[s.out]}", self.var[s.out]
            _, update = REDUCE[s.op]
            out.append(f"    float {v} = {a}[0];")
            out.append(f"    for (int l = 1; l < {LANES}; l++) {v} = {update.format(a=v, v=f'{a}[l]')};")
            emitted.add(s.out)
        return out

    def _accumulate(self, s: Step, lane: str, at: str) -> str:
        a = f"a_{self.var[s.out]}[{lane}]"
        _, update = REDUCE[s.op]
        return f"{a} = {update.format(a=a, v=f'r_{self.var[s.out]}[{at}]')};"


def last_written(chain: Chain) -> list[str]:
    """The full outputs written in the chain's last loop, after every operand is read for good:
    an operand of their shape may share their buffer (read at element j just before it is written)."""
    w = _Writer(chain)
    return [n for n, full in chain.outputs if full and w.ready[n] == w.phases]


def source(chain: Chain) -> str:
    """The C of one chain: its job struct, row function, item function and exported entry."""
    c, w = chain, _Writer(chain)
    fields = [f"    const float *in{k};" for k in range(len(c.inputs))]
    fields += [f"    float *out{k};" for k in range(len(c.outputs))]
    fields += ["    int64_t parts;"]
    by_rows = c.reduces or c.rows >= 2
    part = (f"    int64_t r0 = omrt_part({c.rows}, J->parts, item), r1 = omrt_part({c.rows}, J->parts, item + 1);\n"
            f"    for (int64_t i = r0; i < r1; i++) row_{c.symbol}(J, i, 0, {c.cols});" if by_rows else
            f"    int64_t c0 = omrt_part({c.cols}, J->parts, item), c1 = omrt_part({c.cols}, J->parts, item + 1);\n"
            f"    for (int64_t i = 0; i < {c.rows}; i++) row_{c.symbol}(J, i, c0, c1);")
    params = [f"const float *in{k}" for k in range(len(c.inputs))]
    params += [f"float *out{k}" for k in range(len(c.outputs))] + ["int64_t threads"]
    init = ", ".join([f".in{k} = in{k}" for k in range(len(c.inputs))]
                     + [f".out{k} = out{k}" for k in range(len(c.outputs))])
    limit = c.rows if by_rows else c.cols
    return "\n".join([
        f"/* {c.symbol}: {c.rows} rows x {c.cols} */",
        "typedef struct {\n" + "\n".join(fields) + f"\n}} job_{c.symbol};",
        w.row_function(),
        f"static OMRT_HOT void part_{c.symbol}(void *p, int64_t item, int64_t thread) {{",
        f"    const job_{c.symbol} *J = (const job_{c.symbol} *)p;",
        "    (void)thread;",
        part,
        "}",
        f"OMRT_EXPORT void {c.symbol}({', '.join(params)}) {{",
        f"    int64_t parts = threads < {limit} ? threads : {limit};",
        f"    job_{c.symbol} J = {{{init}, .parts = parts < 1 ? 1 : parts}};",
        f"    omrt_fused_run(part_{c.symbol}, &J, J.parts, threads);",
        "}",
        "",
    ])


def library_source(chains: list[Chain]) -> str:
    """The C file of a model's fused library: the prelude, then every chain."""
    return "\n".join([f'#include "{PRELUDE}"', ""] + [source(c) for c in chains])
