"""Build the native kernels a model uses into one shared library, for the KERNELS partition."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from typing import Callable

from ..ir import Graph
from ..kernels import lookup, winograd
from ..kernels.native import CORE, SOURCES
from ..kernelstore import NATIVE, Packed, host_target

FLAGS = ["-O3", "-std=c11", "-shared", "-fPIC", "-pthread", "-fno-math-errno", "-fno-plt", "-Wall"]
"""The hot loops carry their own per-ISA clones (see csrc/omrt_native.h), so no -march: the
library runs on any host of the compiling host's architecture."""


def use_winograd(graph: Graph) -> Graph:
    """Rewrite the Convs that Winograd speeds up as omrt::WinogradConv, adding their transformed
    filters as weights (they keep their own: see omrt.kernels.winograd). Only worth it when the
    native library is packed, since the transforms are C loops."""
    for node in graph.nodes:
        if node.op_type != "Conv" or node.domain or len(node.inputs) < 2:
            continue
        w = graph.constants.get(node.inputs[1])
        if w is None or not winograd.eligible(node.attrs, graph.infos[node.inputs[0]], w):
            continue
        transformed = f"{node.inputs[1]}__winograd"
        if transformed not in graph.constants:
            graph.add_constant(transformed, winograd.filter_transform(w))
        bias = node.inputs[2] if len(node.inputs) > 2 else ""
        node.op_type, node.domain = "WinogradConv", "omrt"
        node.inputs = [node.inputs[0], node.inputs[1], bias, transformed]
        graph.opsets.setdefault("omrt", 1)
    return graph


def units_of(graph: Graph) -> list[str]:
    """The C units the kernels of `graph`'s nodes can use, sorted."""
    units: set[str] = set()
    for node in graph.nodes:
        units.update(lookup(node.op_type, graph.opset(node.domain), node.domain, node.label).native_units)
    return sorted(units)


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc, gcc or clang on the PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def _compiler_version(cc: str) -> str:
    try:
        out = subprocess.run(cc.split() + ["--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else cc
    except (OSError, subprocess.SubprocessError):
        return cc


_built: dict[str, Packed] = {}
"""Libraries built in this process, by compiler, flags and source text: compiling many models
builds each set of units once."""


def build(units: list[str], say: Callable[[str], None]) -> Packed | None:
    """Compile `units` into a shared library record; None (with a warning) when that cannot be done.

    A model without its native library still runs, on the built-in numpy kernels, so a missing or
    failing C compiler costs speed, never the compile.
    """
    if not units:
        return None
    cc = compiler()
    if cc is None:
        warnings.warn("omrt compile: no C compiler found (set CC or install cc); the model is compiled "
                      f"without native kernels ({', '.join(units)}) and runs on numpy kernels only",
                      RuntimeWarning, stacklevel=3)
        return None
    key = hashlib.sha256(repr((cc, FLAGS, units)).encode())
    for name in sorted(os.listdir(SOURCES)):
        with open(os.path.join(SOURCES, name), "rb") as f:
            key.update(name.encode() + f.read())
    hit = _built.get(key.hexdigest())
    if hit is None:
        hit = _compile(cc, units, say)
        if hit is None:
            return None
        _built[key.hexdigest()] = hit
    return dataclasses.replace(hit)


def _compile(cc: str, units: list[str], say: Callable[[str], None]) -> Packed | None:
    say(f"building native kernels ({', '.join(units)}) with {cc}")
    sources = [os.path.join(SOURCES, f"{u}.c") for u in [CORE, *units]]
    with tempfile.TemporaryDirectory(prefix="omrt-build-") as tmp:
        target = os.path.join(tmp, "kernels.so")
        cmd = cc.split() + FLAGS + ["-I", SOURCES, "-o", target] + sources + ["-lm"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            done = None
            error = str(e)
        if done is None or done.returncode != 0:
            error = done.stderr.strip() if done is not None else error
            warnings.warn(f"omrt compile: building native kernels failed, the model runs on numpy "
                          f"kernels only:\n{' '.join(cmd)}\n{error}", RuntimeWarning, stacklevel=4)
            return None
        with open(target, "rb") as f:
            data = f.read()
    return Packed(NATIVE, "omrt-native", "omrt",
                  {**host_target(), "units": units, "compiler": _compiler_version(cc),
                   "python": platform.python_version()}, data)


def native_library(graph: Graph, say: Callable[[str], None]) -> Packed | None:
    """The native library record for `graph`, after the rewrites that pay only with it (when a C
    compiler is there to build it)."""
    if compiler() is not None:
        use_winograd(graph)
    return build(units_of(graph), say)
