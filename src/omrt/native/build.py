"""Build omrt's C units into one shared library record, for a model's KERNELS partition, and a
model's generated fused kernels into another.

Needs a C compiler (`$CC`, else cc, gcc or clang, or the one named: a cross compiler builds a
record for its own target), not onnx: the compiler hands over the units its graph's kernels
declare (`Kernel.native_units`).
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
from typing import Any, Callable

from ..errors import CompileError
from ..format.kernelstore import FUSED, NATIVE, Packed
from ..version import __version__
from . import elf, probe
from .bindings import FUNCTIONS
from .fused import EXTRA_FLAGS, UNIT, contract
from .fusegen import Chain, library_source
from .library import CORE, SOURCES, kernel_abi
from .signature import thunk_source
from .target import host, parse_triple

FLAGS = ["-O3", "-std=c11", "-ffp-contract=fast", "-shared", "-fPIC", "-pthread", "-fno-math-errno", "-fno-plt",
         "-Wall"]
"""The hot loops carry their own per-ISA clones (see csrc/omrt_native.h), so no -march: the
library runs on any host of its compiler's target architecture (a compiler named with flags,
`gcc -march=x86-64-v3`, raises that baseline, and the record says so). A product and a sum may be
one fused multiply-add where the clone's ISA has it: ISO C mode alone (-std=c11) would keep
them apart, and the loops written with plain vector arithmetic (the depthwise lanes, the
transposed convolution) then took two instructions, each rounding, for one (mobilenetv3's
depthwise layers 0.85-0.93 of the time with AVX-512 hidden). Where a loop must give numpy's bits
it says so (csrc/elementwise.c, Gelu)."""


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


_built: dict[str, Any] = {}
"""Libraries built in this process, by compiler, flags and source text: compiling many models
builds each set of units once."""


def build(units: list[str], say: Callable[[str], None], cc: str | None = None) -> Packed | None:
    """Compile `units` with `cc` (None: `compiler()`) into a shared library record for that
    compiler's target.

    A model without its native library still runs, on the built-in numpy kernels, so when no
    compiler was named a missing or failing one costs speed (a warning), never the compile. A
    compiler that was named must be there and must build: otherwise CompileError, with its message.
    """
    if not units:
        return None
    named, cc = cc is not None, cc or compiler()
    if cc is None:
        warnings.warn("omrt compile: no C compiler found (set CC or install cc); the model is compiled "
                      f"without native kernels ({', '.join(units)}) and runs on numpy kernels only",
                      RuntimeWarning, stacklevel=3)
        return None
    if named and not (cc.split() and shutil.which(cc.split()[0])):
        raise CompileError(f"cc={cc!r}: no such C compiler on the PATH; install it or name another")
    return once(repr((cc, FLAGS, units)), lambda: _compile(cc, units, say, named))


def once(what: str, make: Callable[[], Any]) -> Any:
    """What `make` builds (a record, a library), made once per process for the same `what`
    (compiler, flags, sources) and the same C files in csrc/; None is not kept. A record is
    handed out as a copy (its load status is its own)."""
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
    return dataclasses.replace(hit) if isinstance(hit, Packed) else hit


def _compile(cc: str, units: list[str], say: Callable[[str], None], named: bool) -> Packed | None:
    say(f"building native kernels ({', '.join(units)}) with {cc}")
    thunks = thunk_source([fn for fn in FUNCTIONS if fn.unit in (CORE, *units)])
    data = shared_library(cc, [os.path.join(SOURCES, f"{u}.c") for u in [CORE, *units]], "native kernels",
                          "on numpy kernels only", named, texts={"thunks.c": thunks})
    if data is None:
        return None
    return Packed(NATIVE, "omrt-native", "omrt", describe(cc, units, data), data)


def build_fused(chains: list[Chain], guards: dict[str, dict], say: Callable[[str], None],
                cc: str | None = None) -> Packed | None:
    """The KERNELS record (kind 3) of a model's fused chains, one C function each, built by `cc`
    (None: `compiler()`) like the native library, its target listing every function's guard;
    None (with a warning) when it cannot be built: the chains then stay unfused. A compiler that
    was named must build it (CompileError otherwise), as it must build the native library."""
    named, cc = cc is not None, cc or compiler()
    if cc is None or not chains:
        return None
    text = library_source(chains)
    return once(repr((cc, FLAGS, EXTRA_FLAGS, text, guards)),
                 lambda: _compile_fused(cc, text, guards, say, named))


def _compile_fused(cc: str, text: str, guards: dict[str, dict], say: Callable[[str], None],
                   named: bool) -> Packed | None:
    say(f"building {len(guards)} fused kernels with {cc}")
    thunks = thunk_source([contract(symbol, spec) for symbol, spec in guards.items()])
    data = shared_library(cc, [], "fused kernels", "its chains unfused", named, EXTRA_FLAGS,
                          {"fused.c": text, "thunks.c": thunks})
    if data is None:
        return None
    target = {**describe(cc, [UNIT], data, EXTRA_FLAGS),
              "source_sha256": hashlib.sha256(text.encode()).hexdigest(), "kernels": guards}
    return Packed(FUSED, "omrt-fused", "omrt", target, data)


def shared_library(cc: str, sources: list[str], what: str, instead: str, named: bool,
                   extra: tuple[str, ...] = (), texts: dict[str, str] | None = None) -> bytes | None:
    """The bytes of a shared library `cc` builds from `sources` and the generated files `texts`
    (name -> C text), with csrc/ on the include path, FLAGS and the `extra` flags. It builds in a
    folder of its own, the generated files and the library under fixed names, so that the same
    sources give the same bytes (their names are in the library). When it fails: CompileError
    with the compiler's message if `cc` was `named`, else None with a warning that shows the
    command, the message and what the model does `instead`."""
    with tempfile.TemporaryDirectory(prefix="omrt-build-") as tmp:
        for name, text in (texts or {}).items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        cmd = cc.split() + FLAGS + list(extra) + ["-I", SOURCES, "-o", "kernels.so"] + sources + list(texts or {})
        cmd += ["-lm"]
        target = os.path.join(tmp, "kernels.so")
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp)
        except (OSError, subprocess.SubprocessError) as e:
            done = None
            error = str(e)
        if done is None or done.returncode != 0:
            error = done.stderr.strip() if done is not None else error
            if named:
                raise CompileError(f"building {what} with {cc} failed:\n{' '.join(cmd)}\n{error}")
            warnings.warn(f"omrt compile: building {what} failed, the model runs {instead}:\n"
                          f"{' '.join(cmd)}\n{error}", RuntimeWarning, stacklevel=5)
            return None
        with open(target, "rb") as f:
            return f.read()


def describe(cc: str, units: list[str], data: bytes, extra: tuple[str, ...] = ()) -> dict:
    """The target of a library `cc` built from `units` (with FLAGS and the `extra` flags): what
    omrt, kernel ABI and compiler made it, the machine, OS and C library its compiler targets (the
    host's when the compiler does not tell its triple), the newest glibc its symbols need, and the
    CPU features it may use."""
    argv, flags = cc.split(), FLAGS + list(extra)
    triple = probe.triple(argv)
    meant = parse_triple(triple) if triple else {}
    ident = elf.identity(data)
    libc = meant.get("libc", "") if triple else host()["libc"]
    return {"omrt": __version__, "abi": kernel_abi(), "units": units, "compiler": compiler_version(cc),
            "triple": triple, "os": meant.get("os") or host()["os"],
            "machine": meant.get("machine") or (elf.machine_name(ident[2]) if ident else ""),
            "elf_machine": ident[2] if ident else 0,
            "libc": libc, "libc_version": elf.glibc_needed(data) if libc == "glibc" else "",
            "cpu": {"baseline": probe.baseline(argv, flags), "features": probe.features(argv, flags),
                    "clones": probe.clones(argv, flags)},
            "python": platform.python_version()}
