"""What a C compiler builds for: its target triple, and the CPU features its code may use.

Asked of the compiler itself (`-dumpmachine`, its predefined macros, `-Q --help=target`), so a
cross compiler (`aarch64-linux-gnu-gcc`) describes the machine it builds for, not the host it
runs on. Build time only: the runtime reads what was recorded (`target`).
"""

from __future__ import annotations

import re
import subprocess

from .library import SOURCES

X86_FEATURES = {
    "MMX": "mmx", "FXSR": "fxsr", "SSE": "sse", "SSE2": "sse2", "SSE3": "pni", "SSSE3": "ssse3",
    "SSE4_1": "sse4_1", "SSE4_2": "sse4_2", "SSE4A": "sse4a", "POPCNT": "popcnt", "LZCNT": "abm",
    "MOVBE": "movbe", "XSAVE": "xsave", "AVX": "avx", "AVX2": "avx2", "FMA": "fma", "FMA4": "fma4",
    "XOP": "xop", "F16C": "f16c", "BMI": "bmi1", "BMI2": "bmi2", "AES": "aes", "PCLMUL": "pclmulqdq",
    "SHA": "sha_ni", "AVX512F": "avx512f", "AVX512CD": "avx512cd", "AVX512BW": "avx512bw",
    "AVX512DQ": "avx512dq", "AVX512VL": "avx512vl", "AVX512IFMA": "avx512ifma", "AVX512VBMI": "avx512vbmi",
    "AVX512VNNI": "avx512_vnni", "AVX512BF16": "avx512_bf16", "AVX512FP16": "avx512_fp16",
    "AVX512VP2INTERSECT": "avx512_vp2intersect", "AVX5124FMAPS": "avx512_4fmaps", "AVXVNNI": "avx_vnni",
}
"""x86 feature macros (`__AVX2__`) and the /proc/cpuinfo flags of a CPU that has the feature."""

ARM_FEATURES = {
    "__ARM_NEON": "asimd", "__ARM_FEATURE_CRC32": "crc32", "__ARM_FEATURE_ATOMICS": "atomics",
    "__ARM_FEATURE_DOTPROD": "asimddp", "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp",
    "__ARM_FEATURE_SVE": "sve", "__ARM_FEATURE_SVE2": "sve2", "__ARM_FEATURE_MATMUL_INT8": "i8mm",
    "__ARM_FEATURE_BF16_VECTOR_ARITHMETIC": "bf16", "__ARM_FEATURE_SHA2": "sha2", "__ARM_FEATURE_AES": "aes",
}
"""AArch64 feature macros and the /proc/cpuinfo `Features` of a CPU that has the feature."""

CLONE_PROBE = '#include "omrt_native.h"\nOMRT_HOT OMRT_HOT_AVX2\n'
"""The per-ISA clone attributes of omrt's hot loops, as this compiler expands them."""


def _ask(cmd: list[str], stdin: str = "") -> str:
    """The compiler's answer on stdout, or "" when it does not give one."""
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def triple(cc: list[str]) -> str:
    """The compiler's target triple (`cc -dumpmachine`): x86_64-linux-gnu, aarch64-linux-gnu, ..."""
    return _ask(cc + ["-dumpmachine"]).strip()


def features(cc: list[str], flags: list[str]) -> list[str]:
    """The CPU features code built with these flags may use anywhere (the /proc/cpuinfo names of
    the feature macros the compiler predefines), sorted. Features omrt cannot name are left out."""
    macros = set(re.findall(r"#define (\w+)", _ask(cc + flags + ["-dM", "-E", "-x", "c", "-"])))
    found = {flag for name, flag in X86_FEATURES.items() if f"__{name}__" in macros}
    found |= {flag for name, flag in ARM_FEATURES.items() if name in macros}
    return sorted(found)


def baseline(cc: list[str], flags: list[str]) -> str:
    """The ISA level the compiler targets by default with these flags (`-march`: x86-64,
    x86-64-v3, armv8-a), or "" when it does not tell (clang)."""
    found = re.search(r"^\s*-march=\s+(\S+)", _ask(cc + flags + ["-Q", "--help=target"]), re.MULTILINE)
    return found.group(1) if found else ""


def clones(cc: list[str], flags: list[str]) -> list[str]:
    """The ISA levels of the per-ISA clones of omrt's hot loops (csrc/omrt_native.h) this compiler
    builds, best first; the loader of the host picks one at run time, so none is required."""
    expanded = _ask(cc + flags + ["-E", "-P", "-I", SOURCES, "-x", "c", "-"], CLONE_PROBE).strip()
    last = expanded.splitlines()[-1] if expanded else ""
    return list(dict.fromkeys(re.findall(r'"arch=([\w.-]+)"', last)))
