"""Build omrt's C units into one shared library record, for a model's KERNELS partition, and a
model's generated fused kernels into another.

Needs a C compiler (`$CC`, else cc, gcc or clang), not onnx: the compiler hands over the units
its graph's kernels declare (`Kernel.native_units`).
"""

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

from ..format.kernelstore import FUSED, NATIVE, Packed
from .fused import EXTRA_FLAGS, UNIT
from .fusegen import Chain, library_source
from .library import CORE, SOURCES
from .loader import host_target

FLAGS = ["-O3", "-std=c11", "-shared", "-fPIC", "-pthread", "-fno-math-errno", "-fno-plt", "-Wall"]
"""The hot loops carry their own per-ISA clones (see csrc/omrt_native.h), so no -march: the
library runs on any host of the compiling host's architecture."""


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc, gcc or clang on the PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def compiler_version(cc: str) -> str:
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
    return _once(repr((cc, FLAGS, units)), lambda: _compile(cc, units, say))


def _once(what: str, make: Callable[[], Packed | None]) -> Packed | None:
    """A copy of the record `make` builds, made once per process for the same `what` (compiler,
    flags, sources) and the same C files in csrc/."""
    key = hashlib.sha256(what.encode())
    for name in sorted(os.listdir(SOURCES)):
        with open(os.path.join(SOURCES, name), "rb") as f:
            key.update(name.encode() + f.read())
    hit = _built.get(key.hexdigest())
    if hit is None:
        hit = make()
        if hit is None:
            return None
        _built[key.hexdigest()] = hit
    return dataclasses.replace(hit)


def _compile(cc: str, units: list[str], say: Callable[[str], None]) -> Packed | None:
    say(f"building native kernels ({', '.join(units)}) with {cc}")
    data = shared_library(cc, [os.path.join(SOURCES, f"{u}.c") for u in [CORE, *units]], "native kernels",
                          "on numpy kernels only")
    if data is None:
        return None
    return Packed(NATIVE, "omrt-native", "omrt",
                  {**host_target(), "units": units, "compiler": compiler_version(cc),
                   "python": platform.python_version()}, data)


def build_fused(chains: list[Chain], guards: dict[str, dict], say: Callable[[str], None]) -> Packed | None:
    """The KERNELS record (kind 3) of a model's fused chains, one C function each, its target
    listing every function's guard; None (with a warning) when it cannot be built: the chains
    then stay unfused."""
    cc = compiler()
    if cc is None or not chains:
        return None
    text = library_source(chains)
    return _once(repr((cc, FLAGS, EXTRA_FLAGS, text, guards)), lambda: _compile_fused(cc, text, guards, say))


def _compile_fused(cc: str, text: str, guards: dict[str, dict], say: Callable[[str], None]) -> Packed | None:
    say(f"building {len(guards)} fused kernels with {cc}")
    with tempfile.TemporaryDirectory(prefix="omrt-fused-") as tmp:
        path = os.path.join(tmp, "fused.c")
        with open(path, "w") as f:
            f.write(text)
        data = shared_library(cc, [path], "fused kernels", "its chains unfused", EXTRA_FLAGS)
    if data is None:
        return None
    target = {**host_target(), "units": [UNIT], "compiler": compiler_version(cc),
              "source_sha256": hashlib.sha256(text.encode()).hexdigest(), "kernels": guards}
    return Packed(FUSED, "omrt-fused", "omrt", target, data)


def shared_library(cc: str, sources: list[str], what: str, instead: str, extra: tuple[str, ...] = ()
                   ) -> bytes | None:
    """The bytes of a shared library `cc` builds from `sources` (with csrc/ on the include path,
    FLAGS and the `extra` flags); None when it fails, with a warning that shows the command, the
    compiler's message and what the model does `instead`."""
    with tempfile.TemporaryDirectory(prefix="omrt-build-") as tmp:
        target = os.path.join(tmp, "kernels.so")
        cmd = cc.split() + FLAGS + list(extra) + ["-I", SOURCES, "-o", target] + sources + ["-lm"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            done = None
            error = str(e)
        if done is None or done.returncode != 0:
            error = done.stderr.strip() if done is not None else error
            warnings.warn(f"omrt compile: building {what} failed, the model runs {instead}:\n"
                          f"{' '.join(cmd)}\n{error}", RuntimeWarning, stacklevel=5)
            return None
        with open(target, "rb") as f:
            return f.read()
