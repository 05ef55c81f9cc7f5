"""How a C function of omrt's native library is described, and checked before every call.

A `Function` names each argument of its C prototype, in order, with its kind:

- `Array`: a pointer to float32 data (int64 where it says so); the Python side passes a
  C-contiguous numpy array (or None where the argument may be NULL), and `size` says how many
  elements the C code may touch, as an expression of the integer arguments.
- `Matrix`: a pointer to a float32 matrix (or stack of them) that the C code reads through a
  pitch, as BLAS does; the array passed must be exactly the view those integers describe.
- `Int` (int64_t) and `Float` (float) scalars, and `Address` (void *) for entry points omrt
  found itself.

`requires` are conditions on the integers that the C code relies on (a group count dividing
the channels, a pitch long enough for a row); `derived` names intermediate values the other
expressions use. Before each call, `Function.check` proves that every array has the dtype,
layout and size the C code reads and writes, so native code never touches memory outside the
arrays it is handed; a violation is a KernelError naming the function, argument and rule. A
call checked once to be repeated on the same arrays (`library.Checked`) keeps them alive, and
the executor checks it again whenever one of them is replaced.

`prototype()` renders the C prototype; a test compares it with the sources, and the kernel ABI
is a digest of the sources themselves, so a library built from other C code is never called.
"""

from __future__ import annotations

import ctypes
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import KernelError

F32 = np.dtype(np.float32)

C_TYPES = {"float32": "float", "int64": "int64_t"}
"""The element types an Array may have, and how C declares them."""
DTYPES = {name: np.dtype(name) for name in C_TYPES}
"""The same as numpy dtypes: a call compares each array's dtype with one (a string would be
parsed again on every comparison)."""


@dataclass(frozen=True)
class Array:
    """`const float *name` (`float *name` when written; `int64_t` for int64), C-contiguous, `size`
    elements of `dtype`."""

    name: str
    size: str
    write: bool = False
    optional: bool = False
    scratch: bool = False
    """Workspace bytes of any dtype (sized in floats, 4-byte aligned), not a float32 tensor."""
    dtype: str = "float32"
    """The elements' type, a key of C_TYPES (int64: counters the C code fills)."""

    @property
    def unit(self) -> str:
        """What `size` counts, for messages: floats, or int64 values."""
        return "floats" if self.dtype == "float32" else f"{self.dtype} values"


@dataclass(frozen=True)
class Matrix:
    """A float32 matrix `rows` x `cols` read through pitch `pitch`, stored transposed when the
    integer named `transposed` is 1, and a stack of `batch` of them `stride` floats apart (stride
    0: one matrix for all)."""

    name: str
    rows: str
    cols: str
    pitch: str
    stride: str
    batch: str
    transposed: str = ""
    write: bool = False


@dataclass(frozen=True)
class Address:
    """`void *name`: an address omrt found itself (a BLAS entry point), passed as it is."""

    name: str


@dataclass(frozen=True)
class Int:
    """`int64_t name`, at least `minimum`."""

    name: str
    minimum: int = 0


@dataclass(frozen=True)
class Float:
    """`float name`."""

    name: str


Arg = Array | Matrix | Address | Int | Float

_CTYPES = {Array: ctypes.c_void_p, Matrix: ctypes.c_void_p, Address: ctypes.c_void_p, Int: ctypes.c_int64,
           Float: ctypes.c_float}

_SCALAR_DECLARATIONS = {Address: "void *", Int: "int64_t ", Float: "float "}


def declaration(arg: Arg) -> str:
    """How the C prototype declares `arg`: `const float *x`, `int64_t n`, ..."""
    if isinstance(arg, (Array, Matrix)):
        element = C_TYPES[arg.dtype] if isinstance(arg, Array) else "float"
        return f"{'' if arg.write else 'const '}{element} *{arg.name}"
    return _SCALAR_DECLARATIONS[type(arg)] + arg.name


THUNK_PREFIX = "omrt_thunk_"
"""The thunk of C function f is omrt_thunk_f (`Function.thunk`)."""


def thunk_source(functions: Sequence["Function"]) -> str:
    """A C file of the thunks of `functions`, built into the library that holds them."""
    return '#include "omrt_native.h"\n\n' + "\n".join(fn.thunk() for fn in functions)


PROVED = 256
"""Distinct scalar sets a function remembers as proved (a model calls it with a few each)."""

CONSTANTS = {
    "MAX_TAPS": 1 << 16,
    "GELU_NODES": 13 * 1024 + 1,
    "POOL_THREADS": 64,
    "LSTM_PANEL": 64,
    "GEMM_PANEL": 12,
    "GEMM_MAX_NR": 32,
    "GEMM_TAIL_COLS": 4,
    "DECONV_MAX_K": 8,
    "WINOGRAD_SKEW": 16,
}
"""Names the contracts may use: the widest window the loops take (they keep one or two int64 per
tap on the stack), the nodes of Gelu's table (1/1024 apart over [-7, 6], csrc/elementwise.c), the
threads of the worker pool, the caller's included (csrc/workers.c), the rows of R in each
panel of the LSTM loop (csrc/recurrent.c), the rows of a packed weight panel, the widest
column strip of omrt's GEMM and the most columns past a multiple of 16 it takes through its
narrow tail (csrc/omrt_gemm.h), and the widest kernel of the stride-K transposed
convolution, whose taps' sums it keeps on the stack (csrc/conv.c), and the floats between one
element of Winograd's transformed tiles and the next past their strips (csrc/winograd.c)."""


def _tuple(items: Sequence[str]) -> str:
    """Python source of a tuple of these expressions."""
    return f"({', '.join(items)},)" if items else "()"


_ADDRESSES: dict[int, tuple[weakref.ref, int]] = {}
"""Data pointers of arrays seen before: numpy takes microseconds to tell one (it builds the whole
array interface), and a layer hands the same arena views and weights to C run after run."""


def address(a: np.ndarray) -> int:
    """The data pointer a C function receives for an array."""
    hit = _ADDRESSES.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    if len(_ADDRESSES) >= 4096:
        _ADDRESSES.clear()
    start = a.__array_interface__["data"][0]
    _ADDRESSES[id(a)] = (weakref.ref(a), start)
    return start


@dataclass(frozen=True)
class Function:
    """A C function of a unit, its arguments and the conditions its C code relies on; `blas`
    when it multiplies through BLAS."""

    unit: str
    symbol: str
    args: tuple[Arg, ...]
    requires: tuple[str, ...] = ()
    derived: tuple[tuple[str, str], ...] = ()
    blas: bool = False
    _figures: Callable = field(init=False, repr=False, compare=False)
    _scalars: Callable = field(init=False, repr=False, compare=False)
    _proved: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lets = [f"({name} := {expr})" for name, expr in self.derived]
        sizes = [a.size for a in self.args if isinstance(a, Array)]
        shapes = [f"({a.rows}, {a.cols}, {a.pitch}, {a.stride}, {a.batch}, {a.transposed or 0})"
                  for a in self.args if isinstance(a, Matrix)]
        body = ", ".join(_tuple(part) for part in (lets, sizes, shapes, self.requires))
        names = ", ".join(a.name for a in self.args)
        code = compile(f"lambda {names}: ({body})", f"<{self.symbol} contract>", "eval")
        object.__setattr__(self, "_figures", eval(code, {"min": min, "max": max, **CONSTANTS}))
        scalars = tuple(i for i, a in enumerate(self.args) if isinstance(a, (Int, Float)))
        object.__setattr__(self, "_scalars", operator.itemgetter(*scalars) if scalars else lambda values: ())
        object.__setattr__(self, "_proved", {})

    @property
    def argtypes(self) -> list:
        return [_CTYPES[type(a)] for a in self.args]

    def prototype(self) -> str:
        """The C prototype this binding calls, e.g. `void f(const float *x, int64_t n)`."""
        return f"void {self.symbol}({', '.join(declaration(a) for a in self.args)})"

    def thunk(self) -> str:
        """C source of this function's thunk (THUNK_PREFIX + symbol): it calls the function with
        the arguments of an `omrt_arg` vector laid out by `pack` (csrc/omrt_native.h), so that a
        call list can hold any function (omrt_run_calls)."""
        fields = [f"(float)a[{i}].f" if type(arg) is Float else f"a[{i}].{'i' if type(arg) is Int else 'p'}"
                  for i, arg in enumerate(self.args)]
        return (f"{self.prototype()};\nOMRT_EXPORT void {THUNK_PREFIX}{self.symbol}(const omrt_arg *a) "
                f"{{ {self.symbol}({', '.join(fields)}); }}\n")

    def pack(self, checked: Sequence[Any]) -> np.ndarray:
        """The argument vector of a thunk for C arguments `checked` (what `check` returns): one
        int64 per argument, an address or integer as it is (NULL as 0), a float as a double."""
        vector = np.zeros(len(self.args), np.int64)
        doubles = vector.view(np.float64)
        for i, (arg, value) in enumerate(zip(self.args, checked)):
            if type(arg) is Float:
                doubles[i] = value
            else:
                vector[i] = value or 0
        return vector

    def _fail(self, why: str) -> KernelError:
        return KernelError(f"native {self.symbol}: {why}; the kernel's arguments break the C function's "
                           f"contract (a bug in omrt: please report it)")

    def check(self, values: Sequence[Any]) -> list:
        """The C arguments for `values` (arrays become addresses), after proving every rule.

        The integer rules are proved once per distinct set of scalars (a layer calls with the
        same geometry run after run); the arrays are checked on every call."""
        if len(values) != len(self.args):
            raise self._fail(f"takes {len(self.args)} arguments, got {len(values)}")
        key = self._scalars(values)
        needs = self._proved.get(key)
        if needs is None:
            needs = self._prove(values, key)
        out = list(values)
        for i, check, arg, need in needs:
            out[i] = check(arg, values[i], need)
        return out

    def _prove(self, values: Sequence[Any], key: Any) -> list[tuple[int, Callable, Arg, Any]]:
        """Check the scalars against their minima and the requirements; (position, its check,
        argument, what it must hold: bytes and dtype, or its matrix figures) for every array
        argument, remembered for `key`."""
        for arg, value in zip(self.args, values):
            if isinstance(arg, Int) and not (isinstance(value, (int, np.integer)) and value >= arg.minimum):
                raise self._fail(f"{arg.name} must be an integer >= {arg.minimum}, got {value!r}")
        try:
            _, sizes, shapes, requires = self._figures(*values)
        except (ArithmeticError, TypeError) as e:
            raise self._fail(f"its contract cannot be evaluated on these arguments ({e})") from None
        for rule, ok in zip(self.requires, requires):
            if not ok:
                raise self._fail(f"requires {rule}")
        figures = {Array: iter(sizes), Matrix: iter(self._layout(f) for f in shapes)}
        needs = [(i, self._array, a, self._holds(a, next(figures[Array]))) if type(a) is Array
                 else (i, self._matrix, a, next(figures[Matrix]))
                 for i, a in enumerate(self.args) if type(a) in figures]
        if len(self._proved) >= PROVED:
            self._proved.clear()
        self._proved[key] = needs
        return needs

    @staticmethod
    def _holds(arg: Array, count: int) -> tuple[int, int, np.dtype | None, int]:
        """What an Array argument must be, for `_array`: its element count, the bytes that makes,
        its dtype (None: scratch, any) and alignment."""
        size = 4 if arg.scratch else DTYPES[arg.dtype].itemsize
        return count, size * count, None if arg.scratch else DTYPES[arg.dtype], size

    def _array(self, arg: Array, a: Any, holds: tuple[int, int, np.dtype | None, int]) -> int | None:
        count, nbytes, dtype, size = holds
        if a is None:
            if arg.optional or count == 0:
                return None
            raise self._fail(f"{arg.name} may not be NULL: it must hold {arg.size} = {count} {arg.unit}")
        if type(a) is not np.ndarray or (dtype is not None and a.dtype != dtype):
            article = "an" if arg.dtype[0] in "aeiou" else "a"
            raise self._fail(f"{arg.name} must be {article} {arg.dtype} array, got "
                             f"{a.dtype if isinstance(a, np.ndarray) else type(a).__name__}")
        flags = a.flags
        if not flags.c_contiguous:
            raise self._fail(f"{arg.name} must be C-contiguous")
        if arg.write and not flags.writeable:
            raise self._fail(f"{arg.name} is written but the array is read-only")
        if a.nbytes < nbytes:
            raise self._fail(f"{arg.name} must hold {arg.size} = {count} {arg.unit}, the array holds "
                             f"{a.nbytes // size}")
        start = address(a)
        if start % size:
            raise self._fail(f"{arg.name} must be aligned to {size} bytes")
        return start

    @staticmethod
    def _layout(figures: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(shape, byte strides) of the view a Matrix argument with these figures must be."""
        rows, cols, pitch, stride, batch, transposed = figures
        shape, strides = (rows, cols), ((1, pitch) if transposed else (pitch, 1))
        if stride:
            shape, strides = (batch, *shape), (stride, *strides)
        return shape, tuple(4 * s for s in strides)

    def _matrix(self, arg: Matrix, a: Any, layout: tuple[tuple[int, ...], tuple[int, ...]]) -> int:
        shape, strides = layout
        if type(a) is not np.ndarray or a.dtype != F32:
            raise self._fail(f"{arg.name} must be a float32 array")
        if len(shape) == 2 and a.ndim == 3 and a.shape[0] == 1:
            a = a[0]  # one matrix for the whole batch
        if a.shape != shape or (a.strides != strides and any(n > 1 and s != w for n, s, w
                                                              in zip(a.shape, a.strides, strides))):
            raise self._fail(f"{arg.name} must be a {shape} view with strides {strides}, got {a.shape} with "
                             f"strides {a.strides}")
        if arg.write and not a.flags.writeable:
            raise self._fail(f"{arg.name} is written but the array is read-only")
        start = address(a)
        if start % 4:
            raise self._fail(f"{arg.name} must be aligned to 4 bytes")
        return start
