"""A loaded `.om` model: mapped weights, decoded graph, prepared programs shared by its sessions."""

from __future__ import annotations

import json
import os
import threading
from typing import Mapping, Sequence

from ..errors import FormatError, InputError
from ..format import OmFile, Part
from ..format.container import Source
from ..format.kernelstore import Packed, unpack
from ..format.modeldef import decode, decode_program
from ..ir import Graph, TensorInfo
from ..native.loader import load as load_kernels
from ..plan import lower, propagate
from ..version import __version__
from .prepare import IOSpec, Prepared, prepare
from .session import Session


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


def _signature_key(shapes: Mapping[str, Sequence[int]]) -> tuple:
    return tuple(sorted((k, tuple(int(d) for d in v)) for k, v in shapes.items()))


class Model:
    """A compiled model mapped from a `.om` file; make sessions to run it."""

    def __init__(self, source: Source, verify: bool = False, trust_kernels: bool = False) -> None:
        self._file = OmFile(source)
        self.path = self._file.path
        """The file's path, or a description of the buffer it was read from."""
        weights = self._file.view(Part.WEIGHTS, verify=verify)
        try:
            self.env = json.loads(bytes(self._file.view(Part.ENV)))
            plans = json.loads(bytes(self._file.view(Part.PLANS)))
        except ValueError as e:
            raise FormatError(f"{self.path!r}: ENV or PLANS partition is not valid JSON; the file is "
                              f"corrupted") from e
        check_environment(self.env, self.path)
        self.kernels: list[Packed] = unpack(self._file.view(Part.KERNELS), self.path)
        """The packed kernels, each with its load status."""
        self.native = load_kernels(self.kernels, trust_kernels)
        self.graph, program, self.metadata = decode(self._file.view(Part.MODEL_DEF), weights, self.path)
        self.file_size = self._file.size
        self.inputs = [self._spec(v) for v in self.graph.inputs]
        self.outputs = [self._spec(v) for v in self.graph.outputs]
        self._lock = threading.Lock()
        self._prepared: dict[tuple, Prepared] = {}
        stored = ([program] if program else []) + [decode_program(p) for p in plans.get("programs", [])]
        self._stored = {_signature_key(p.signature): p for p in stored}
        if program is not None:
            self.default = self.prepared(program.signature)
        else:
            self.default = None

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
            if program is not None:
                prep = prepare(self.graph, program, self.native)
            else:
                self.check_shapes(shapes)
                prep = self._specialize(shapes)
            self._prepared[key] = prep
            return prep

    def _specialize(self, shapes: Mapping[str, Sequence[int]]) -> Prepared:
        g = self.graph
        graph = Graph(list(g.nodes), list(g.inputs), list(g.outputs),
                      {**{v: g.infos[v] for v in g.outputs},
                       **{v: TensorInfo(g.infos[v].dtype, tuple(int(d) for d in shapes[v])) if v in shapes
                          else g.infos[v] for v in g.inputs}},
                      dict(g.constants), dict(g.opsets), g.name)
        propagate(graph, fold=True)
        return prepare(graph, lower(graph), self.native)

    def session(self, zero_copy: str = "auto") -> Session:
        """A new session: its own arena and bindings, sharing this model's weights and kernels."""
        return Session(self, zero_copy)


def load(source: Source, verify: bool = False, trust_kernels: bool = False) -> Model:
    """Map a `.om` file, or read one in place from a buffer holding its bytes (bytes, bytearray,
    mmap, memoryview, ...: the weights are then views into that buffer, kept alive by the model;
    do not change it while the model is in use). `verify=True` also checks the weights' digest
    (reads every byte).

    `trust_kernels=True` lets the native kernels packed in the file run (they are machine code:
    trust only files you compiled or got from someone you trust); otherwise, and where the host
    cannot load them, the built-in numpy kernels run instead. `Model.kernels` tells which happened.
    """
    return Model(source, verify, trust_kernels)
