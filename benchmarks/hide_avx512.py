"""Run a Python script (or `-m module`) on this CPU as an AVX2-only CPU would look to it.

    python benchmarks/hide_avx512.py benchmarks/compare.py --models resnet50
    python benchmarks/hide_avx512.py -m omrt.cli run model.om --trust-kernels

On an AVX-512 host, every library in the process then picks the kernels it would run on an AVX2
host: numpy's dispatch, OpenBLAS (Haswell kernels), ONNX Runtime's MLAS, omrt's GEMM tile and its
target_clones, and the C library's string functions (through GLIBC_TUNABLES, set before the
process starts again). It works by Linux's CPUID faulting (hide_avx512.c): the CPUID instruction
traps, and the answer is this CPU's own with the AVX-512 and AMX bits cleared. It is a stand-in
for an AVX2 host with the same caches, clocks and memory, not a different CPU; both runtimes see
the same CPU, which is what a side-by-side comparison needs. Linux x86-64 only, and the CPU (or
its hypervisor) must offer CPUID faulting (`cpuid_fault` among /proc/cpuinfo's flags).
"""

from __future__ import annotations

import ctypes
import os
import runpy
import subprocess
import sys
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hide_avx512.c")
GLIBC_HIDDEN = "glibc.cpu.hwcaps=-AVX512F,-AVX512CD,-AVX512BW,-AVX512DQ,-AVX512VL,-AVX512_VNNI"
"""The C library chose its string functions before any of this process's code ran: they are
chosen again, without AVX-512, by starting over with this tunable."""
MARK = "OMRT_AVX512_HIDDEN"
"""Set in the environment of the process started over with GLIBC_HIDDEN, so that it starts over
only once."""


def build(folder: str) -> str:
    """hide_avx512.c built as a shared library in `folder` by $CC (else cc); its path. (Not through
    omrt's own build: importing omrt imports numpy, whose dispatch would see AVX-512 first.)"""
    lib = os.path.join(folder, "hide_avx512.so")
    cc = os.environ.get("CC") or "cc"
    try:
        proc = subprocess.run([*cc.split(), "-O2", "-shared", "-fPIC", "-o", lib, SOURCE], capture_output=True,
                              text=True)
    except FileNotFoundError:
        raise SystemExit(f"hide_avx512: no C compiler {cc!r} to build {os.path.basename(SOURCE)} with: "
                         f"set CC") from None
    if proc.returncode != 0:
        raise SystemExit(f"hide_avx512: building {os.path.basename(SOURCE)} with {cc} failed:\n{proc.stderr}")
    return lib


def hide() -> ctypes.CDLL:
    """Make every CPUID this process runs from now on answer without AVX-512; the loaded shim."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "AMD64"):
        raise SystemExit("hide_avx512: needs Linux on x86-64 (CPUID faulting)")
    with tempfile.TemporaryDirectory() as folder:  # global: cpuid_answers() finds it by name
        shim = ctypes.CDLL(build(folder), mode=ctypes.RTLD_GLOBAL)
    status = shim.omrt_hide_avx512()
    if status != 0:
        raise SystemExit("hide_avx512: this CPU or kernel offers no CPUID faulting (no cpuid_fault among "
                         "/proc/cpuinfo's flags): AVX-512 cannot be hidden here")
    return shim


def cpuid_answers() -> int | None:
    """How many CPUID instructions this process ran with AVX-512 hidden (answered from the table),
    or None when it does not hide AVX-512."""
    try:
        return int(ctypes.c_long.in_dll(ctypes.CDLL(None), "omrt_cpuid_answers").value)
    except (OSError, ValueError, AttributeError):
        return None


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__)
    if os.environ.get(MARK) != "1":
        tunables = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), GLIBC_HIDDEN]))
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "GLIBC_TUNABLES": tunables, MARK: "1"})
    hide()
    if sys.argv[1] == "-m":
        if len(sys.argv) < 3:
            raise SystemExit("hide_avx512: -m needs a module name")
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
