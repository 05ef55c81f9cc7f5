"""The exceptions omrt raises: every one names the tensor or field, the rule broken and the fix."""

from __future__ import annotations


class OmrtError(Exception):
    """Base of every error omrt raises on purpose."""


class CompileError(OmrtError):
    """The ONNX model cannot be compiled as given."""


class UnsupportedOpError(CompileError):
    """An operator (or an operator version) has no kernel in omrt's library."""


class ShapeError(OmrtError):
    """Shapes or dtypes do not agree with what an operator or the model requires."""


class FormatError(OmrtError):
    """A `.om` file is truncated, corrupted, foreign or of an unsupported version."""


class InputError(OmrtError):
    """A feed or bound buffer has the wrong name, dtype or shape, or an input is missing."""


class BindError(OmrtError):
    """A bound buffer cannot serve as the tensor's memory (size, layout, writability, overlap)."""


class KernelError(OmrtError):
    """A kernel failed while running, or a packed kernel cannot be trusted or loaded."""


class AllocationError(OmrtError):
    """Memory cannot be allocated, mapped, locked or imported as asked (a limit, a size, an fd)."""


class SignatureError(KernelError):
    """A file loaded with require_signature=True is not signed by a trusted key, or its signature
    does not hold."""


class ServingError(OmrtError):
    """A request to an omrt server failed: no server, a broken or malformed exchange, a server
    that stops or was killed, or an answer the server refused to give (shutting down)."""


class BusyError(ServingError):
    """The server's request queue is full: it answered at once instead of waiting; retry later,
    or start the server with more --workers or a longer --queue."""
