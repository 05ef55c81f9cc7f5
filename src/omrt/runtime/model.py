"""A loaded `.om` model: mapped weights, decoded graph, prepared programs shared by its sessions."""

from __future__ import annotations

import json
import mmap
import os
import threading
import weakref
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import AllocationError, FormatError, InputError
from ..format import OmFile, Part
from ..format.container import Source
from ..format.customops import decode as decode_custom_ops
from ..format.kernelstore import NATIVE, Packed, unpack
from ..format.modeldef import decode, decode_program
from ..ir import Graph
from ..memory import Memory
from ..native.library import kernel_abi
from ..native.loader import load as load_kernels
from ..plan import Program, lower, specialize
from ..plan import verify as verify_program
from ..signing import KeySource
from ..version import __version__
from .custom import CustomOps, load_custom_ops, use_custom_ops
from .prepare import IOSpec, Prepared, prepare
from .session import Session
from .stream import WeightFile
from .trust import decide as decide_trust


def _release(version: object) -> tuple[int, ...]:
    """(major, minor) of a version string; () when it is not one."""
    parts = str(version).split(".")[:2]
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) and len(parts) == 2 else ()


def check_environment(env: dict, where: str) -> None:
    """Refuse a file this omrt cannot run: written by a newer release (which may use kernels,
    attributes or plan rules this one lacks), or whose ENV does not say which omrt wrote it."""
    written = _release(env.get("omrt")) if isinstance(env, dict) else ()
    if not written:
        raise FormatError(f"{where}: the ENV partition does not name the omrt release that wrote the "
                          f"file; it is damaged or foreign: recompile the model")
    if written > _release(__version__):
        raise FormatError(f"{where} was compiled by omrt {env['omrt']}, newer than this omrt "
                          f"{__version__}: upgrade omrt (pip install -U omrt) or compile the model with "
                          f"this one")


def environment_notes(env: dict, kernels: Sequence[Packed]) -> list[str]:
    """What the ENV partition explains that is no reason to refuse the file: a model compiled by
    an omrt whose kernel ABI differs from this one's, with no native library of this ABI packed,
    runs on numpy kernels (each record's status says so too; this says why, and what to do)."""
    written = env.get("kernel_abi")
    native = [k for k in kernels if k.kind == NATIVE]
    if not native or written == kernel_abi() or any(k.target.get("abi") == kernel_abi() for k in native):
        return []
    return [f"compiled by omrt {env.get('omrt')} with kernel ABI {written}; this omrt {__version__} has "
            f"{kernel_abi()}: its packed native libraries cannot run here, the model runs on numpy kernels: "
            f"recompile it with this omrt (or omrt repack --add a library it built)"]


def _signature_key(shapes: Mapping[str, Sequence[int]]) -> tuple:
    return tuple(sorted((k, tuple(int(d) for d in v)) for k, v in shapes.items()))


class Model:
    """A compiled model mapped from a `.om` file (or read in place from memory); make sessions to
    run it."""

    def __init__(self, source: Source | int | Memory, verify: bool = False, trust_kernels: bool = False,
                 weights: Memory | None = None, weight_budget: int | None = None,
                 keep_page_cache: bool = False, trusted_keys: Iterable[KeySource] | None = None,
                 require_signature: bool = False) -> None:
        if weight_budget is not None and (weights is not None or not isinstance(weight_budget, int)
                                          or weight_budget < 0):
            raise InputError("weight_budget= is a number of bytes, and streams weights from the model file, "
                             "where weights= places every weight in caller memory: pass one of the two"
                             if weights is not None else
                             f"weight_budget={weight_budget!r}: pass a number of bytes (0 or more)")
        self._source = _as_memory(source)
        self._file = OmFile(source if self._source is None else self._source.as_array(), _describe(source))
        self.path = self._file.path
        """The file's path, or a description of the memory it was read from."""
        if self._source is not None:
            self._source.hold(self, f"the file of the model {self.path}")
        partition = self._file.view(Part.WEIGHTS, verify=verify)
        self.weights_copied = 0
        """Bytes copied at load into the `weights` memory the caller gave (0: weights are read in
        place from the file's mapping or memory)."""
        if weights is not None:
            partition = self._place_weights(partition, weights)
        self.env = self._json(Part.ENV)
        check_environment(self.env, self.path)
        self.kernels: list[Packed] = unpack(memoryview(self._file.read(Part.KERNELS)), self.path)
        """The packed kernels, each with its load status."""
        self.compatibility = environment_notes(self.env, self.kernels)
        """Why packed code cannot run here, as far as the ENV partition tells (one line each)."""
        self.trust = decide_trust(self._file, trust_kernels, trusted_keys, require_signature)
        """Whether the file's packed code may run, and why (`bool(model.trust)`, `str(model.trust)`):
        the one decision every loader of packed code takes."""
        self.native = load_kernels(self.kernels, self.trust.trusted, self._untrusted())
        self.custom_ops = self._custom_ops(self.trust.trusted)
        """The custom operators the file carries, with whether each can run (`CustomOps.debug`
        checks their writes)."""
        self.graph, program, self.metadata = decode(self._file.view(Part.MODEL_DEF), partition, self.path)
        use_custom_ops(self.graph, self.custom_ops)
        self.file_size = self._file.size
        self.weight_budget = weight_budget
        """Bytes of weights sessions keep resident or in slots (None: every weight stays mapped)."""
        self.weight_source = (self._weight_file(partition, source, keep_page_cache)
                              if weight_budget is not None else None)
        """Where streamed weights are read from (the model file), under a weight budget."""
        self.inputs = [self._spec(v) for v in self.graph.inputs]
        self.outputs = [self._spec(v) for v in self.graph.outputs]
        self._lock = threading.Lock()
        self._prepared: dict[tuple, Prepared] = {}
        self._resident: dict[str, np.ndarray] = {}
        self._resident_memory: list[Memory] = []
        try:
            stored = ([program] if program else []) + [decode_program(p)
                                                       for p in self._json(Part.PLANS).get("programs", [])]
            self._stored = {_signature_key(p.signature): p for p in stored}
            self.stored_plans = tuple(stored)
            """The programs the file carries, planned at compile time: its static plan or the
            `shapes_for` signatures of a symbolic model; sessions for them plan nothing at load."""
            self.default = self.prepared(program.signature) if program is not None else None
        except (KeyError, IndexError, AttributeError, TypeError) as e:
            raise FormatError(f"{self.path!r}: its graph and plans do not fit together ({type(e).__name__}: {e}); "
                              f"the file is corrupted or was written by an incompatible omrt") from e

    def _custom_ops(self, trusted: bool) -> CustomOps:
        """The model's own operators (none in files without a CUSTOM_OPS partition), decoded from
        the checked copy of the partition, like the kernels: the code that runs is the code signed."""
        has = self._file.has(Part.CUSTOM_OPS)
        entries = decode_custom_ops(memoryview(self._file.read(Part.CUSTOM_OPS)), self.path) if has else []
        return load_custom_ops(entries, self.kernels, trusted, self.path)

    def _untrusted(self) -> str:
        """Why packed code does not run, as a record's status says it (with the fix, when unsigned)."""
        fix = "" if self._file.has(Part.SIGNATURE) else ": sign it (omrt sign) and trust its key, or load with " \
                                                       "trust_kernels=True"
        return f"not trusted: {self.trust.reason}{fix}"

    def _json(self, part: Part) -> dict:
        try:
            return json.loads(bytes(self._file.view(part)))
        except ValueError as e:
            raise FormatError(f"{self.path!r}: the {part.name} partition is not valid JSON; the file is "
                              f"corrupted") from e

    def _weight_file(self, partition: memoryview, source: Any, keep_cache: bool) -> WeightFile:
        """The model file, opened for streaming weights, and where each weight lies in it."""
        at = 0  # where the model file starts in the fd (a Memory mapped from an offset)
        if self._source is not None and self._source.fd is not None:
            fd, at = self._source.fd, self._source.fd_offset
        elif isinstance(source, (str, os.PathLike)):
            fd = os.open(source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            weakref.finalize(self, os.close, fd)
        else:
            raise InputError(f"weight_budget= streams weights from the model file; {self.path} is memory: load "
                             f"the model from a path or an fd")
        base = np.frombuffer(partition, np.uint8).__array_interface__["data"][0] if len(partition) else 0
        start = at + self._file.entry(Part.WEIGHTS).offset
        offsets = {k: start + a.__array_interface__["data"][0] - base
                   for k, a in self.graph.constants.items() if a.dtype != object and a.nbytes}
        if isinstance(self._file.map, mmap.mmap):
            self._file.map.madvise(mmap.MADV_DONTNEED)  # pages verify= read: resident weights refault
        return WeightFile(fd, offsets, os.fstat(fd).st_size, keep_cache)

    def _place_weights(self, partition: memoryview, memory: Memory) -> memoryview:
        """Copy the weights into the caller's memory (once, at load) and read them from there."""
        placed = memory.region(len(partition), self, f"the weights of the model {self.path} "
                                                     f"(Model.memory_sizes()['weights'])", AllocationError)
        placed[:] = np.frombuffer(partition, np.uint8)
        self.weights_copied = len(partition)
        return memoryview(placed).toreadonly()

    def _spec(self, v: str) -> IOSpec:
        info = self.graph.infos[v]
        return IOSpec(v, info.dtype, () if info.shape is None else info.shape, info.kind)

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.dtype.name}{list(s.shape)}" for s in self.inputs)
        outs = ", ".join(f"{s.name}: {s.dtype.name}{list(s.shape)}" for s in self.outputs)
        return f"<omrt.Model {os.path.basename(self.path)} ({ins}) -> ({outs})>"

    def check_shapes(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """Raise InputError unless every shape agrees with the input's declared rank and fixed dims."""
        for spec in self.inputs:
            if spec.kind != "tensor":
                continue
            shape = shapes[spec.name]
            ok = len(shape) == len(spec.shape) and all(
                not isinstance(d, int) or d == s for d, s in zip(spec.shape, shape))
            if not ok:
                raise InputError(f"input {spec.name!r} has shape {tuple(shape)}, the model expects "
                                 f"{tuple(spec.shape)} (strings are free dims); pass an array of that "
                                 f"shape or recompile with --shape")

    def prepared(self, shapes: Mapping[str, Sequence[int]]) -> Prepared:
        """The prepared program for these input shapes: stored in the file, cached, or planned now."""
        key = _signature_key(shapes)
        with self._lock:
            hit = self._prepared.get(key)
            if hit is not None:
                return hit
            program = self._stored.get(key)
            if program is None:
                self.check_shapes(shapes)
            prep = self._prepare(shapes, program)
            self._prepared[key] = prep
            return prep

    def _prepare(self, shapes: Mapping[str, Sequence[int]], program: Program | None) -> Prepared:
        """Prepare a program for these shapes: a stored one (made at compile time, for the graph
        specialized to them) or one planned now."""
        static = all(isinstance(d, int) for s in self.inputs if s.kind == "tensor" for d in s.shape)
        graph = self.graph if static else specialize(self.graph, shapes)
        if program is not None and _matches(program, graph):
            verify_program(program, graph)  # a stored plan is proved like a new one
        else:
            program = lower(graph)
        prep = prepare(graph, program, self.native, self.weight_budget, self._hold_resident)
        if self.weight_budget is not None and isinstance(self._file.map, mmap.mmap):
            self._file.map.madvise(mmap.MADV_DONTNEED)  # what preparing read stays out of RSS
            self.weight_source.forget()
        return prep

    def _hold_resident(self, graph: Graph, keys: Iterable[str]) -> None:
        """Under a weight budget, read the weights that stay resident once into anonymous memory.
        Read through the file's mapping instead, each would hold the page-cache block around it
        (up to 2 MiB, streamed neighbours included) in RSS and in the page cache."""
        source = self.weight_source
        todo = {k: graph.constants[k] for k in keys if k in source.offsets and k not in self._resident}
        if todo:
            memory, arrays = source.read_resident(todo)
            self._resident_memory.append(memory)
            self._resident.update(arrays)
        for g in {id(graph): graph, id(self.graph): self.graph}.values():
            for k in keys:
                if k in self._resident:
                    g.add_constant(k, self._resident[k])

    def session(self, zero_copy: str = "auto", arena: Memory | None = None, sync_inputs: bool = True,
                sync_outputs: bool = True) -> Session:
        """A new session: its own arena (or `arena`, caller memory that sessions run one after
        another may share) and bindings, sharing this model's weights and kernels."""
        return Session(self, zero_copy, arena, sync_inputs, sync_outputs)

    def memory_sizes(self, shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, int]:
        """Bytes of each region, for the stored plan or the input `shapes` given: "weights",
        "arena" (feature map and workspaces), "workspace" (the largest one task needs),
        "io_fallback" (blocks for inputs and outputs that are not bound in place): what a caller
        allocates to hand omrt its own memory."""
        prep = self.default if shapes is None else self.prepared(shapes)
        if prep is None:
            raise InputError(f"{self!r} has symbolic input shapes: pass shapes={{name: shape}} to size its "
                             f"memory")
        p = prep.program
        return {"weights": self._file.entry(Part.WEIGHTS).size, "arena": p.arena_size,
                "workspace": max((t.workspace_size for t in p.tasks), default=0), "io_fallback": p.io_size}


def _matches(program: Program, graph: Graph) -> bool:
    """Whether a stored program was planned for this graph (the same tasks over the same nodes);
    a file written by another omrt may specialize differently: then it is planned again."""
    return all(t.node < len(graph.nodes) and all(v in graph.infos or not v for v in t.inputs + t.outputs)
               for t in program.tasks) and set(program.places) <= set(graph.infos)


def arena_size(models: Sequence[Model], shapes: Sequence[Mapping[str, Sequence[int]] | None] | None = None) -> int:
    """Bytes of one arena that sessions of all these models can share, run one after another:
    the largest of their arenas (for the input shapes given per model, else their stored plans)."""
    shapes = list(shapes) if shapes is not None else [None] * len(models)
    return max((m.memory_sizes(s)["arena"] for m, s in zip(models, shapes)), default=0)


def _as_memory(source: Any) -> Memory | None:
    """The Memory a model is read from: an fd is mapped read-only; a path or bytes are not Memory."""
    if isinstance(source, Memory):
        return source
    if isinstance(source, int) and not isinstance(source, bool):
        return Memory.from_fd(source, writable=False)
    return None


def _describe(source: Any) -> str | None:
    """How errors name a model read from memory (None: the container names paths and buffers)."""
    if isinstance(source, Memory):
        return f"<{source!r}>"
    if isinstance(source, int) and not isinstance(source, bool):
        return f"<fd {source}>"
    return None


def load(source: Source | int | Memory, verify: bool = False, trust_kernels: bool = False,
         weights: Memory | None = None, weight_budget: int | None = None, keep_page_cache: bool = False,
         trusted_keys: Iterable[KeySource] | None = None, require_signature: bool = False) -> Model:
    """Map a `.om` file, or read one in place from an fd (a memfd received over a socket, say), a
    `Memory`, or a buffer holding its bytes (bytes, bytearray, mmap, memoryview, ...): the weights
    are then views into that memory, kept alive by the model; do not change it while the model
    is in use. `weights=` copies the weights once into memory the caller provides (locked,
    huge-page or shared) and reads them from there (`Model.weights_copied`). `verify=True` also
    checks the weights' digest (reads every byte).

    `weight_budget=` (bytes) keeps only that many bytes of weights in memory per session: the
    most reused and smallest stay mapped, the others stream from the file through fixed slots, read
    ahead of the task that needs them (docs/memory.md). The pages read are dropped from the page
    cache unless `keep_page_cache=True`.

    The code packed in the file (native kernels: machine code) runs only when the file is trusted
    (`Model.trust` says whether and why): `trust_kernels=True` trusts it outright (for files you
    compiled); otherwise it is trusted when signed (`omrt sign`) by one of `trusted_keys` (raw
    32-byte public keys, their hex or base64 text, or paths of key files) or of the keys in the
    user's trusted keys file (`omrt.signing`). A signed file that is not trusted (an unknown key,
    or changed since it was signed) warns with the reason; `require_signature=True` raises
    SignatureError for any file not signed by a trusted key. Where the file is not trusted, or the
    host cannot load its code, the built-in numpy kernels run instead; `Model.kernels` tells
    which happened.
    """
    return Model(source, verify, trust_kernels, weights, weight_budget, keep_page_cache, trusted_keys,
                 require_signature)
