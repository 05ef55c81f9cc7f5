"""A session: one arena, the caller's bound buffers, and the rules for using them in place.

Inputs and outputs whose buffers fit are used in place (the executor re-points only the task
arguments that refer to them); others are copied through fallback blocks (mode "auto") or refused
(mode "always"). Every copy is counted in `Session.stats` with its reason. Buffers may be arrays
or `omrt.Memory`; bound memory is synced around each run (a dma-buf's CPU access bracket), and
the arena itself may be caller memory, shared by sessions that run one after another.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..errors import BindError, InputError
from ..kernels.parallel import get_num_threads
from ..memory import ALIGN, Memory, align, aligned_empty
from ..plan import DYNAMIC
from .executor import Executor
from .io import Stats, as_array, as_value, owned, span
from .prepare import IOSpec, Prepared
from .profile import RUN, Tally, ThreadProfile, around_round_trips, pool_reader
from .stream import WeightStream

if TYPE_CHECKING:
    from .model import Model

MODES = ("auto", "always")


def _check_weight(name: str, array: np.ndarray, original: Any) -> None:
    """A replacement weight must be the original's dtype and shape, C-contiguous and aligned."""
    if array.dtype != original.dtype or tuple(array.shape) != tuple(original.shape):
        raise BindError(f"weight {name!r} is {original.dtype} {tuple(original.shape)}; the replacement is "
                        f"{array.dtype} {tuple(array.shape)}: pass one of exactly that dtype and shape")
    if not (array.flags.c_contiguous and array.flags.aligned):
        raise BindError(f"weight {name!r}: the replacement must be C-contiguous and aligned to "
                        f"{array.dtype.alignment} bytes; np.ascontiguousarray makes such a copy")


class Session:
    """Runs a model with its own arena (or `arena`, caller memory); bind buffers once, then `run()`
    as often as you like.

    `sync_inputs` / `sync_outputs` False skip the device sync of bound memory around runs (the
    caller guarantees coherence, as the seed's disable-flush flags)."""

    def __init__(self, model: "Model", zero_copy: str = "auto", arena: Memory | None = None,
                 sync_inputs: bool = True, sync_outputs: bool = True) -> None:
        if zero_copy not in MODES:
            raise InputError(f"zero_copy={zero_copy!r}: choose one of {MODES}")
        self.model = model
        self.zero_copy = zero_copy
        self.stats = Stats()
        self.sync = {"input": sync_inputs, "output": sync_outputs}
        self._specs: dict[str, IOSpec] = {s.name: s for s in model.outputs + model.inputs}
        self._outputs = {s.name for s in model.outputs} - {s.name for s in model.inputs}
        """Outputs that are not also inputs (a graph may return an input: binding that name binds
        the input, and the output is a copy of it)."""
        self._bound: dict[str, np.ndarray] = {}
        self._memories: dict[str, Memory] = {}
        self._held: dict[str, Any] = {}
        self._arena_memory = arena
        self._arena = np.empty(0, np.uint8) if arena is None else self._caller_arena(arena)
        self._running = arena.run_lock if arena is not None else threading.Lock()
        """Held while a run uses the arena: runs of sessions sharing one arena take turns."""
        self._io: np.ndarray | None = None
        self._weights: dict[str, tuple[np.ndarray, Memory | None]] = {}
        self._stream: WeightStream | None = None
        self._executor: Executor | None = None
        if model.default is not None:
            self._use(model.default)

    def _caller_arena(self, arena: Memory) -> np.ndarray:
        """The caller's memory as this session's arena: writable, aligned, held while in use."""
        return arena.region(arena.nbytes, self, self._role("the arena"))

    def _role(self, use: str) -> str:
        """How this session names a use of caller memory (held and released by that name)."""
        return f"{use} of a session of {self.model!r}"

    @property
    def _prep(self) -> Prepared | None:
        return None if self._executor is None else self._executor.prep

    def _use(self, prep: Prepared) -> None:
        """Run `prep` from now on: grow the arena if it needs more, and lay the program over it."""
        p = prep.program
        if self._arena.size < p.arena_size:
            if self._arena_memory is not None:
                raise BindError(f"{self._arena_memory!r} is too small for this model's arena: it needs "
                                f"{p.arena_size} bytes for inputs of shapes {dict(p.signature)}; size it with "
                                f"omrt.arena_size([...models], shapes) or Model.memory_sizes()")
            self._arena = aligned_empty(p.arena_size)
        if self._io is not None and self._io.size < p.io_size:
            self._io = None
        self._executor = None  # holds views of the old slots
        if self._stream is not None:
            self._stream.close()
        self._stream = (WeightStream(prep.stream, self.model.weight_source, prep.graph.infos)
                        if prep.stream is not None and prep.stream.fills else None)
        self._executor = Executor(prep, self._arena, self._stream)
        for name, (array, _) in self._weights.items():
            self._executor.swap_weight(name, array)
        self.stats.arena_bytes = p.arena_size
        self.stats.lower_bound = p.lower_bound
        for name, arr in self._bound.items():
            self._check(name, arr)

    def _fallback(self, name: str) -> np.ndarray:
        """The planned fallback block for I/O tensor `name` (allocated on first need)."""
        p = self._prep.program
        if self._io is None:
            self._io = aligned_empty(max(p.io_size, 1))
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
        if name in self._outputs:
            lo, hi = span(arr)
            for other, b in self._bound.items():
                if other != name and b.nbytes and arr.nbytes:
                    blo, bhi = span(b)
                    if lo < bhi and blo < hi:
                        return f"it overlaps the buffer bound to {other!r}"
        return None

    def _check(self, name: str, arr: np.ndarray) -> None:
        """Dtype and shape rules (always errors), and the zero-copy rules in mode "always"."""
        spec = self._specs[name]
        if arr.dtype != spec.dtype:
            raise InputError(f"tensor {name!r} has dtype {arr.dtype}, the model needs {spec.dtype}; "
                             f"convert it with .astype(np.{spec.dtype.name})")
        if self._prep is not None and name in self._outputs:
            want = self._prep.program.shapes.get(name, arr.shape)
            if want is not None and tuple(arr.shape) != tuple(want):
                raise BindError(f"output {name!r}: the bound buffer has shape {arr.shape}, the result has "
                                f"shape {want}; bind an array of exactly that shape")
        if self.zero_copy == "always":
            why = self._misfit(name, arr)
            if why is None and name in self._outputs:
                why = self._copy_only(name)
            if why:
                raise BindError(f"tensor {name!r} cannot be used without a copy: {why} "
                                f"(zero_copy='always'); pass a suitable buffer or use zero_copy='auto'")

    def _copy_only(self, name: str) -> str | None:
        """Why output `name` is copied every run whatever buffer it has (None when it is not)."""
        reason = None if self._prep is None else self._prep.program.copy_only.get(name)
        return None if reason is None else f"the output must be copied: {reason}"

    def bind(self, name: str, array: Any, offset: int = 0) -> None:
        """Make `array` the memory of input or output `name` for every following run: an array, a
        DLPack tensor, or an `omrt.Memory` (viewed from byte `offset` with the tensor's dtype and
        shape; it stays held, and synced around runs, until unbound).

        A sequence input takes a list of arrays and an optional one an array, list or None; they
        are kept, not bound as memory. Sequence and optional outputs cannot be bound.
        """
        spec = self._spec(name)
        if spec.kind != "tensor":
            if name in self._outputs:
                raise BindError(f"output {name!r} is a {spec.kind}: run() returns it; only tensors can "
                                f"be bound as outputs")
            self._held[name] = as_value(array, spec)
            return
        memory = array if isinstance(array, Memory) else None
        arr = self._memory_view(name, memory, offset) if memory is not None else as_array(array, name)
        self._bind_view(name, arr, memory)

    def _bind_view(self, name: str, arr: np.ndarray, memory: Memory | None) -> None:
        """Bind the array `arr` (a view of `memory`, when given, which it then holds) to tensor
        `name`: `bind` once it has the array; an `IOSet` with the views it made once."""
        if name in self._outputs and not arr.flags.writeable:
            raise BindError(f"output {name!r}: the bound buffer is read-only; bind a writable array")
        self._check(name, arr)
        self._release(name)
        self._bound[name] = arr
        if memory is not None:
            memory.hold(self, self._io_role(name))
            self._memories[name] = memory

    def _spec(self, name: str) -> IOSpec:
        if name not in self._specs:
            raise InputError(f"{name!r} is not an input or output of the model; they are "
                             f"{sorted(self._specs)}")
        return self._specs[name]

    def _shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in the current plan (or as declared, when fixed)."""
        shape = self._prep.program.shapes.get(name) if self._prep is not None else None
        shape = tuple(self._specs[name].shape) if shape is None else tuple(shape)
        if not all(isinstance(d, int) for d in shape):
            raise BindError(f"tensor {name!r} has symbolic dims {list(shape)}: memory does not say its shape; "
                            f"bind an array of the shape you want, or a view of the memory")
        return shape

    def _memory_view(self, name: str, memory: Memory, offset: int) -> np.ndarray:
        return memory.view(self._specs[name].dtype, self._shape(name), offset)

    def bound_memory(self, name: str) -> Memory | None:
        """The `Memory` bound to tensor `name`, if it was bound as one."""
        return self._memories.get(name)

    def alloc_io(self, name: str, **flags: Any) -> Memory:
        """New memory of exactly the size and alignment tensor `name` needs, already bound;
        `flags` are those of `Memory.allocate` (shared=True to send it to another process)."""
        spec = self._spec(name)
        nbytes = int(np.prod(self._shape(name), dtype=np.int64)) * spec.dtype.itemsize
        memory = Memory.allocate(max(align(nbytes), ALIGN), name=f"omrt-{name}", **flags)
        self.bind(name, memory)
        return memory

    def prepare(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """Switch now, not at the next run, to the plan for these input shapes (of a model with
        symbolic dims), so that outputs of the shapes it gives can be bound before the run;
        buffers still bound are checked against it."""
        shapes = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
        prep = self._prep
        if prep is None or any(tuple(prep.program.signature.get(n, ())) != s for n, s in shapes.items()):
            self._use(self.model.prepared(shapes))

    def set_weight(self, name: str, weight: Any, offset: int = 0) -> None:
        """Read weight `name` from `weight` (an array, or a `Memory` from byte `offset`) in the
        following runs, without a copy: the kernels that read it are pointed at it (address
        refresh) and prepared again without its old value. None goes back to the model's own."""
        original = self._weight_info(name)
        memory = weight if isinstance(weight, Memory) else None
        array = None
        if weight is not None:  # checked before anything changes: a refused weight leaves the swap in place
            array = weight.view(original.dtype, original.shape, offset) if memory else as_array(weight, name)
            _check_weight(name, array, original)
        old = self._weights.pop(name, (None, None))[1]
        if old is not None:
            old.release(self, self._role(f"weight {name!r}"))
        if memory is not None:
            memory.hold(self, self._role(f"weight {name!r}"))
        if array is not None:
            self._weights[name] = (array, memory)
        if self._executor is not None:
            self._executor.swap_weight(name, self.model.graph.constants[name] if array is None else array)

    def _weight_info(self, name: str) -> Any:
        """The info of a weight a session can swap, or an InputError listing them."""
        graph = self.model.graph
        readers = {v for n in graph.nodes for v in n.inputs}
        swappable = sorted(k for k, a in graph.constants.items() if k in readers and a.dtype != object)
        if name not in swappable:
            shown = ", ".join(repr(k) for k in swappable[:12]) + (", ..." if len(swappable) > 12 else "")
            raise InputError(f"{name!r} is not a weight the model's kernels read; they are {shown}")
        if self._prep is not None and name in self._prep.streamed:
            raise BindError(f"weight {name!r} streams through slots under the weight budget; it cannot also "
                            f"be swapped: load the model with a budget that keeps it resident")
        return graph.infos[name]

    def unbind(self, name: str) -> None:
        """Forget the buffer bound to `name`; runs allocate (outputs) or need a feed (inputs) again."""
        if name in self._held:
            del self._held[name]
            return
        if name not in self._bound:
            raise InputError(f"nothing is bound to {name!r}; bound tensors are "
                             f"{sorted(self._bound) + sorted(self._held)}")
        self._release(name)
        del self._bound[name]

    def _release(self, name: str) -> None:
        """Let go of what is bound to `name`: the kernels' pointers at it (until the next run
        points them again) and the hold on its memory, which can then be closed."""
        if self._executor is not None:
            self._executor.forget(name)
        memory = self._memories.pop(name, None)
        if memory is not None:
            memory.release(self, self._io_role(name))

    def _io_role(self, name: str) -> str:
        return self._role(f"{'output' if name in self._outputs else 'input'} {name!r}")

    def close(self) -> None:
        """Unbind everything, stop streaming weights and let go of the arena: memory it held can
        then be closed."""
        for name in list(self._bound):
            self.unbind(name)
        for name in list(self._weights):
            self.set_weight(name, None)
        self._held.clear()
        self._executor = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self._arena_memory is not None:
            self._arena_memory.release(self, self._role("the arena"))
        self._arena = np.empty(0, np.uint8)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ running

    def run(self, feeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run once; `feeds` are inputs for this run only. Returns every output by name (arrays;
        lists of arrays for sequences; None for an empty optional)."""
        return self._run(feeds)

    def profile(self, feeds: Mapping[str, Any] | None = None, repeat: int = 10, by: str = "op") -> dict[str, float]:
        """Run `repeat` times timing every kernel; mean seconds per run by op type (each fused chain
        by its name), or with by="node" by node (its name; an unnamed ONNX node is
        `<op type>_<index>`, and nodes that share a name add up), slowest first."""
        tally = self._profiled(feeds, repeat, Tally(by=by))
        return {op: sec / repeat for op, sec in tally.wall.most_common() if op != RUN}

    def profile_threads(self, feeds: Mapping[str, Any] | None = None, repeat: int = 10,
                        by: str = "op") -> ThreadProfile:
        """Run `repeat` times on omrt's threads (`omrt.set_num_threads`), timing every kernel and
        reading how long each thread spent on omrt's split work meanwhile: per op type (or node,
        as `profile`; slowest first) and for the whole run, mean wall seconds, each thread's busy
        seconds, and the share of the second and later threads' time they idled. Work outside
        omrt's threads (numpy, OpenBLAS, kernels that do not split) idles them: that is where to
        look. With several threads it also times how far apart the cores are, before and after
        (`ThreadProfile.round_trip_ns`). The counters belong to the process, so profile with no
        other run going."""
        threads, native = get_num_threads(), self.model.native
        tally, trips = around_round_trips(
            native, threads, lambda: self._profiled(feeds, repeat, Tally(pool_reader(native, threads), by)))
        return tally.profile(threads, repeat, trips)

    def _profiled(self, feeds: Mapping[str, Any] | None, repeat: int, tally: Tally) -> Tally:
        """`tally` after `repeat` runs that add every task's figures to it, and each run's."""
        for _ in range(repeat):
            mark = tally.start()
            self._run(feeds, tally)
            tally.stop(RUN, mark)
        return tally

    def _run(self, feeds: Mapping[str, Any] | None, tally: Tally | None = None) -> dict[str, Any]:
        feeds = dict(feeds or {})
        arrays, values = self._gather_inputs(feeds)
        if not self._running.acquire(blocking=False):
            raise BindError(f"the arena of this session of {self.model!r} is in use by another run right now; "
                            f"runs that share an arena must take turns (or give each its own session)")
        try:
            prep = self._prep
            if prep is None or any(tuple(prep.program.signature[n]) != a.shape for n, a in arrays.items()):
                self._use(self.model.prepared({n: a.shape for n, a in arrays.items()}))
            self._place_inputs(arrays, feeds)
            results, late = self._place_outputs()
            self._bracket("begin")
            try:
                found = self._executor.run(values, tally)
            finally:
                self._bracket("end")  # a failed run closes the device bracket too
            self._finish_outputs(results, late, found)
        finally:
            self._running.release()
        self.stats.runs += 1
        return results

    def _bracket(self, edge: str) -> None:
        """Open (begin) or close (end) the device sync of bound memory around the kernels."""
        for name, memory in self._memories.items():
            role = "output" if name in self._outputs else "input"
            if self.sync[role]:
                step = memory.begin if edge == "begin" else memory.end
                self.stats.syncs += step("to_device" if role == "output" else "from_device")

    def _gather_inputs(self, feeds: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """This run's tensor inputs (fed or bound) and its sequence and optional inputs."""
        for name in feeds:
            if name not in self._specs or name in self._outputs:
                raise InputError(f"{name!r} is not an input of the model; the inputs are "
                                 f"{[s.name for s in self.model.inputs]}")
        arrays: dict[str, np.ndarray] = {}
        values: dict[str, Any] = {}
        for spec in self.model.inputs:
            if spec.kind != "tensor":
                if spec.name in feeds:
                    values[spec.name] = as_value(feeds[spec.name], spec)
                elif spec.name in self._held:
                    values[spec.name] = self._held[spec.name]
                else:
                    raise InputError(f"input {spec.name!r} is missing: pass it in feeds or bind it (a "
                                     f"{spec.kind} of {spec.dtype} tensors)")
            elif spec.name in feeds:
                arrays[spec.name] = as_array(feeds[spec.name], spec.name)
            elif spec.name in self._bound:
                arrays[spec.name] = self._bound[spec.name]
            else:
                raise InputError(f"input {spec.name!r} is missing: pass it in feeds or bind it "
                                 f"(dtype {spec.dtype}, shape {tuple(spec.shape)})")
        return arrays, values

    def _place_inputs(self, arrays: dict[str, np.ndarray], feeds: dict[str, Any]) -> None:
        """Point each input at its buffer, or copy it into its fallback block when it misfits."""
        for name, arr in arrays.items():
            if name in feeds:
                self._check(name, arr)
            why = self._misfit(name, arr)
            if why is None:
                self._executor.point(name, arr)
            else:
                buf = self._fallback(name)
                np.copyto(buf, arr)
                self.stats.count(f"input {name}: {why}", arr.nbytes)
                self._executor.point(name, buf)

    def _place_outputs(self) -> tuple[dict[str, Any], list[tuple[str, np.ndarray]]]:
        """Point each output at the bound buffer, a fresh array or its fallback block; returns the
        results so far and the bound outputs to copy back after the run."""
        program = self._prep.program
        results: dict[str, Any] = {}
        late: list[tuple[str, np.ndarray]] = []
        for spec in self.model.outputs:
            name = spec.name
            bound = self._bound.get(name) if name in self._outputs else None
            results[name] = bound
            if name in program.copy_only or program.places[name].region == DYNAMIC:
                if self.zero_copy == "always":
                    raise BindError(f"output {name!r} cannot be returned without a copy: "
                                    f"{self._copy_only(name)} (zero_copy='always'); use zero_copy='auto' "
                                    f"for this model")
                continue
            if bound is None:
                results[name] = np.empty(program.shapes[name], spec.dtype)
                self._executor.point(name, results[name])
            elif self._misfit(name, bound) is None:
                self._executor.point(name, bound)
            else:
                self._executor.point(name, self._fallback(name))
                late.append((name, bound))
        return results, late

    def _finish_outputs(self, results: dict[str, Any], late: list[tuple[str, np.ndarray]],
                        found: dict[str, Any]) -> None:
        """Copy what could not be written in place into the results, counting every copy."""
        program = self._prep.program
        for name, bound in late:
            np.copyto(bound, self._executor.targets[name])
            self.stats.count(f"output {name}: {self._misfit(name, bound)}", bound.nbytes)
        for name, reason in program.copy_only.items():
            src = found[name] if name in found else self._executor.value(name)
            if results[name] is None:
                results[name], nbytes = owned(src)
            else:
                np.copyto(results[name], src)
                nbytes = src.nbytes
            self.stats.count(f"output {name}: {reason}", nbytes)
        for name, arr in found.items():
            if name in results and results[name] is None:
                results[name] = arr
