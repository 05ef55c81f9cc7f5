"""A session: one arena, the caller's bound buffers, and the task loop.

Binding re-points only the task arguments that refer to that tensor (address refresh), so its
cost is proportional to the tensor's uses. Inputs and outputs whose buffers fit are used in place;
others are copied through fallback blocks (mode "auto") or refused (mode "always").
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..errors import BindError, InputError, KernelError, OmrtError
from ..infer import context, execute, infer_outputs, info_of
from ..kernels import lookup
from ..lower import ARENA, DYNAMIC, INPUT, OUTPUT, WEIGHT
from .model import IOSpec, Model, Prepared

MODES = ("auto", "always")


@dataclass
class Stats:
    """What a session has done: runs, copies by reason and bytes copied, memory figures."""

    runs: int = 0
    copies: Counter = field(default_factory=Counter)
    bytes_copied: int = 0
    arena_bytes: int = 0
    lower_bound: int = 0
    io_fallback_bytes: int = 0

    def count(self, reason: str, nbytes: int) -> None:
        self.copies[reason] += 1
        self.bytes_copied += nbytes


def _aligned_bytes(n: int) -> np.ndarray:
    raw = np.empty(n + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + n]


def _as_array(obj: Any, name: str) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        return np.from_dlpack(obj)
    raise InputError(f"tensor {name!r}: expected a numpy array or a DLPack tensor, got "
                     f"{type(obj).__name__}; wrap buffers with np.frombuffer(...).reshape(...)")


def _span(a: np.ndarray) -> tuple[int, int]:
    start = a.ctypes.data
    return start, start + a.nbytes


def _as_value(obj: Any, spec: IOSpec) -> Any:
    """A sequence (list of C-contiguous arrays) or optional (None or element) fed for `spec`."""
    if obj is None:
        if not spec.kind.startswith("optional"):
            raise InputError(f"input {spec.name!r} is a {spec.kind} and cannot be None")
        return None
    holds_list = "sequence" in spec.kind
    if holds_list != isinstance(obj, (list, tuple)):
        raise InputError(f"input {spec.name!r} is a {spec.kind} of {spec.dtype} tensors; pass "
                         f"{'a list of arrays' if holds_list else 'an array'}"
                         f"{' or None' if spec.kind.startswith('optional') else ''}")
    items = [np.require(_as_array(x, spec.name), requirements="C")
             for x in (obj if holds_list else [obj])]
    for x in items:
        if x.dtype != spec.dtype:
            raise InputError(f"input {spec.name!r} holds a {x.dtype} tensor, the model needs {spec.dtype}; "
                             f"convert it with .astype(np.{spec.dtype.name})")
    return items if holds_list else items[0]


def _owned(value: Any) -> tuple[Any, int]:
    """A copy of a run-time value the caller may keep, and how many bytes were copied."""
    if value is None:
        return None, 0
    if isinstance(value, list):
        items = [np.array(x, copy=True) for x in value]
        return items, sum(x.nbytes for x in items)
    arr = np.array(value, copy=True)
    return arr, arr.nbytes


class Session:
    """Runs a model with its own arena; bind buffers once, then `run()` as often as you like."""

    def __init__(self, model: Model, zero_copy: str = "auto") -> None:
        if zero_copy not in MODES:
            raise InputError(f"zero_copy={zero_copy!r}: choose one of {MODES}")
        self.model = model
        self.zero_copy = zero_copy
        self.stats = Stats()
        self._specs: dict[str, IOSpec] = {s.name: s for s in model.inputs + model.outputs}
        self._is_output = {s.name: True for s in model.outputs}
        self._bound: dict[str, np.ndarray] = {}
        self._held: dict[str, Any] = {}
        self._target: dict[str, np.ndarray] = {}
        self._arena = np.empty(0, np.uint8)
        self._io: np.ndarray | None = None
        self._prep: Prepared | None = None
        if model.default is not None:
            self._use(model.default)

    # ------------------------------------------------------------------ program state

    def _use(self, prep: Prepared) -> None:
        """Lay the program's tensors over this session's arena and build the task arguments."""
        p = prep.program
        if self._arena.size < p.arena_size:
            self._arena = _aligned_bytes(p.arena_size)
        if self._io is not None and self._io.size < p.io_size:
            self._io = None
        self._prep = prep
        self._target = {}
        graph = prep.graph
        arrays: dict[str, np.ndarray] = {}
        for v, pl in p.places.items():
            info = prep.info(v) if v not in graph.constants else graph.infos[v]
            if pl.region == ARENA:
                arrays[v] = self._arena[pl.offset:pl.offset + info.nbytes].view(info.dtype).reshape(info.shape)
            elif pl.region == WEIGHT:
                arrays[v] = graph.constants[pl.key].reshape(info.shape)
        self._arrays = arrays
        self._uses: dict[str, list[tuple[list, int, tuple]]] = {}
        self._args = []
        for t, task in enumerate(p.tasks):
            ins = [arrays.get(v) if v else None for v in task.inputs]
            outs = [arrays.get(v) if v else None for v in task.outputs]
            for lst, names in ((ins, task.inputs), (outs, task.outputs)):
                for pos, v in enumerate(names):
                    pl = p.places.get(v) if v else None
                    if pl is not None and pl.region in (INPUT, OUTPUT):
                        self._uses.setdefault(pl.key, []).append((lst, pos, tuple(p.shapes[v])))
            ws = self._arena[task.ws_offset:task.ws_offset + task.ws_size] if task.ws_size else None
            self._args.append((prep.kernels[t], ins, outs, ws, task))
        self.stats.arena_bytes = p.arena_size
        self.stats.lower_bound = p.lower_bound
        for name, arr in self._bound.items():
            self._check(name, arr)

    def _point(self, name: str, buf: np.ndarray) -> None:
        """Address refresh: re-point every task argument that refers to I/O tensor `name`."""
        if self._target.get(name) is buf:
            return
        for lst, pos, shape in self._uses.get(name, ()):
            lst[pos] = buf.reshape(shape)
        self._target[name] = buf

    def _value(self, name: str) -> np.ndarray:
        """The array holding value `name` now (arena, weights, or an I/O tensor's current buffer)."""
        pl = self._prep.program.places[name]
        if pl.region in (INPUT, OUTPUT):
            return self._target[pl.key].reshape(self._prep.program.shapes[name])
        return self._arrays[name]

    def _fallback(self, name: str) -> np.ndarray:
        """The planned fallback block for I/O tensor `name` (allocated on first need)."""
        p = self._prep.program
        if self._io is None:
            self._io = _aligned_bytes(max(p.io_size, 1))
            self.stats.io_fallback_bytes = p.io_size
        spec = self._specs[name]
        shape = tuple(p.shapes[name])
        nbytes = int(np.prod(shape, dtype=np.int64)) * spec.dtype.itemsize
        off = p.io_offsets[name]
        return self._io[off:off + nbytes].view(spec.dtype).reshape(shape)

    # ------------------------------------------------------------------ binding

    def _misfit(self, name: str, arr: np.ndarray) -> str | None:
        """Why `arr` cannot be the tensor's memory in place (None when it can)."""
        if not arr.flags.c_contiguous:
            return "it is not C-contiguous"
        if not arr.flags.aligned:
            return f"it is not aligned to {arr.dtype.alignment} bytes"
        if self._is_output.get(name):
            lo, hi = _span(arr)
            for other, b in self._bound.items():
                if other != name and b.nbytes and arr.nbytes:
                    blo, bhi = _span(b)
                    if lo < bhi and blo < hi:
                        return f"it overlaps the buffer bound to {other!r}"
        return None

    def _check(self, name: str, arr: np.ndarray) -> None:
        """Dtype and shape rules (always errors), and the zero-copy rules in mode "always"."""
        spec = self._specs[name]
        if arr.dtype != spec.dtype:
            raise InputError(f"tensor {name!r} has dtype {arr.dtype}, the model needs {spec.dtype}; "
                             f"convert it with .astype(np.{spec.dtype.name})")
        if self._prep is not None and self._is_output.get(name):
            want = self._prep.program.shapes.get(name, arr.shape)
            if want is not None and tuple(arr.shape) != tuple(want):
                raise BindError(f"output {name!r}: the bound buffer has shape {arr.shape}, the result has "
                                f"shape {want}; bind an array of exactly that shape")
        if self.zero_copy == "always":
            why = self._misfit(name, arr)
            if why is None and self._prep is not None and name in self._prep.program.copy_only:
                why = f"the output must be copied: {self._prep.program.copy_only[name]}"
            if why:
                raise BindError(f"tensor {name!r} cannot be used without a copy: {why} "
                                f"(zero_copy='always'); pass a suitable buffer or use zero_copy='auto'")

    def bind(self, name: str, array: Any) -> None:
        """Make `array` the memory of input or output `name` for every following run.

        A sequence input takes a list of arrays and an optional one an array, list or None; they
        are kept, not bound as memory. Sequence and optional outputs cannot be bound.
        """
        if name not in self._specs:
            raise InputError(f"{name!r} is not an input or output of the model; they are "
                             f"{sorted(self._specs)}")
        spec = self._specs[name]
        if spec.kind != "tensor":
            if self._is_output.get(name):
                raise BindError(f"output {name!r} is a {spec.kind}: run() returns it; only tensors can "
                                f"be bound as outputs")
            self._held[name] = _as_value(array, spec)
            return
        arr = _as_array(array, name)
        if self._is_output.get(name) and not arr.flags.writeable:
            raise BindError(f"output {name!r}: the bound buffer is read-only; bind a writable array")
        self._check(name, arr)
        self._bound[name] = arr

    def unbind(self, name: str) -> None:
        """Forget the buffer bound to `name`; runs allocate (outputs) or need a feed (inputs) again."""
        if name in self._held:
            del self._held[name]
            return
        if name not in self._bound:
            raise InputError(f"nothing is bound to {name!r}; bound tensors are "
                             f"{sorted(self._bound) + sorted(self._held)}")
        del self._bound[name]
        self._target.pop(name, None)

    # ------------------------------------------------------------------ running

    def run(self, feeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run once; `feeds` are inputs for this run only. Returns every output by name (arrays;
        lists of arrays for sequences; None for an empty optional)."""
        feeds = dict(feeds or {})
        for name in feeds:
            if name not in self._specs or self._is_output.get(name):
                raise InputError(f"{name!r} is not an input of the model; the inputs are "
                                 f"{[s.name for s in self.model.inputs]}")
        arrays: dict[str, np.ndarray] = {}
        values: dict[str, Any] = {}
        for spec in self.model.inputs:
            if spec.kind != "tensor":
                if spec.name in feeds:
                    values[spec.name] = _as_value(feeds[spec.name], spec)
                elif spec.name in self._held:
                    values[spec.name] = self._held[spec.name]
                else:
                    raise InputError(f"input {spec.name!r} is missing: pass it in feeds or bind it (a "
                                     f"{spec.kind} of {spec.dtype} tensors)")
            elif spec.name in feeds:
                arrays[spec.name] = _as_array(feeds[spec.name], spec.name)
            elif spec.name in self._bound:
                arrays[spec.name] = self._bound[spec.name]
            else:
                raise InputError(f"input {spec.name!r} is missing: pass it in feeds or bind it "
                                 f"(dtype {spec.dtype}, shape {tuple(spec.shape)})")
        prep = self._prep
        if prep is None or any(tuple(prep.program.signature[n]) != a.shape for n, a in arrays.items()):
            prep = self.model.prepared({n: a.shape for n, a in arrays.items()})
            self._use(prep)
        program = prep.program
        for name, arr in arrays.items():
            if name in feeds:
                self._check(name, arr)
            why = self._misfit(name, arr)
            if why is None:
                self._point(name, arr)
            else:
                buf = self._fallback(name)
                np.copyto(buf, arr)
                self.stats.count(f"input {name}: {why}", arr.nbytes)
                self._point(name, buf)
        results: dict[str, np.ndarray] = {}
        late: list[tuple[str, np.ndarray]] = []
        for spec in self.model.outputs:
            name = spec.name
            bound = self._bound.get(name)
            if name in program.copy_only or program.places[name].region == DYNAMIC:
                results[name] = bound
                continue
            if bound is None:
                out = np.empty(program.shapes[name], spec.dtype)
                self._point(name, out)
                results[name] = out
            elif self._misfit(name, bound) is None:
                self._point(name, bound)
                results[name] = bound
            else:
                self._point(name, self._fallback(name))
                late.append((name, bound))
                results[name] = bound
        dyn = self._execute(prep, values)
        for name, bound in late:
            np.copyto(bound, self._target[name])
            self.stats.count(f"output {name}: {self._misfit(name, bound)}", bound.nbytes)
        for name, reason in program.copy_only.items():
            src = dyn[name] if name in dyn else self._value(name)
            if results[name] is None:
                results[name], nbytes = _owned(src)
            else:
                np.copyto(results[name], src)
                nbytes = src.nbytes
            self.stats.count(f"output {name}: {reason}", nbytes)
        for name, arr in dyn.items():
            if name in results and results[name] is None:
                results[name] = arr
        self.stats.runs += 1
        return results

    def profile(self, feeds: Mapping[str, Any] | None = None, repeat: int = 10) -> dict[str, float]:
        """Run `repeat` times timing every kernel; mean seconds per run by op type, slowest first."""
        totals: Counter = Counter()
        plain = self._args
        graph = self._prep.graph if self._prep else None
        self._args = [(_Timed(k, graph.nodes[t.node].op_type, totals) if k is not None else None,
                       ins, outs, ws, t) for k, ins, outs, ws, t in plain] if graph else plain
        try:
            for _ in range(repeat):
                self.run(feeds)
        finally:
            self._args = plain
        return {op: sec / repeat for op, sec in totals.most_common()}

    def _detach(self, value: Any) -> Any:
        """`value` with every array that lies in the arena copied out: a late value may outlive
        the arena block of the input it came from (an If returning a captured tensor, a sequence
        holding one)."""
        if isinstance(value, list):
            return [self._detach(v) for v in value]
        if isinstance(value, np.ndarray) and value.nbytes and self._arena.nbytes:
            lo, hi = _span(self._arena)
            start = value.ctypes.data
            if lo <= start < hi:
                return value.copy()
        return value

    def _execute(self, prep: Prepared, values: Mapping[str, Any]) -> dict[str, Any]:
        """The task loop; tasks downstream of data-dependent shapes are prepared as they run.

        `values` are the sequence and optional inputs; like every value of the dynamic region
        they are looked up by name rather than planned.
        """
        dyn: dict[str, Any] = dict(values)
        for kernel, ins, outs, ws, task in self._args:
            if kernel is not None:
                try:
                    kernel.run(ins, outs, ws)
                except OmrtError:
                    raise
                except Exception as e:
                    node = prep.graph.nodes[task.node]
                    raise KernelError(f"kernel {node.op_type} failed at node {node.label!r}: "
                                      f"{type(e).__name__}: {e}") from e
                continue
            graph = prep.graph
            node = graph.nodes[task.node]
            vals = [dyn.get(v, a) if v else None for v, a in zip(task.inputs, ins)]
            infos = [info_of(a, graph.infos.get(v)) if v else None for v, a in zip(task.inputs, vals)]
            cls = lookup(node.op_type, graph.opset(node.domain), node.domain, node.label)
            ctx = context(node, graph, self.model.native)
            results = execute(cls, ctx, vals, infos, infer_outputs(cls, ctx, infos))
            for v, r in zip(task.outputs, results):
                if v:
                    dyn[v] = self._detach(r)
        return dyn


class _Timed:
    """Wraps a kernel so each run adds its wall time to `totals[key]` (used by Session.profile)."""

    def __init__(self, kernel: Any, key: str, totals: Counter) -> None:
        self.kernel, self.key, self.totals = kernel, key, totals

    def run(self, inputs: Any, outputs: Any, workspace: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.kernel.run(inputs, outputs, workspace)
        finally:
            self.totals[self.key] += time.perf_counter() - t0
