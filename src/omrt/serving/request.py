"""A RUN request, checked against the model before it is queued: every tensor is an array by
then (a view of registered memory, or of the message's data part), of the model's dtype and a
shape the model takes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BindError, InputError
from ..plan import DYNAMIC
from ..runtime import Model
from .protocol import Message, Ref, parse_refs
from .registry import Registry


@dataclass
class Request:
    """One RUN request: its inputs, the outputs written in place into the client's memory, and
    the outputs its answer carries as bytes."""

    connection: Any
    id: int
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    """Views of the client's registered memory: the result is written there."""
    returned: list[str]
    """Outputs not in `outputs`: sent back in the answer's data part."""
    copied: int
    """Bytes copied to get it here: inputs sent as bytes."""
    arrived: float = field(default_factory=time.monotonic)

    @property
    def rows(self) -> int:
        """Its size along the batch dimension (dim 0 of every input)."""
        return next(iter(self.inputs.values())).shape[0]

    def batch_key(self) -> tuple | None:
        """Requests with equal keys can run as one batch (None: this one cannot): every input
        has the same number of rows, and the same dims after the first as theirs."""
        if any(a.ndim == 0 or a.shape[0] != self.rows for a in self.inputs.values()):
            return None
        return tuple((name, a.shape[1:]) for name, a in sorted(self.inputs.items()))


def build(message: Message, connection: Any, model: Model, registry: Registry) -> Request:
    """A checked Request from a RUN message: names, dtypes and shapes against the model, each
    tensor inside its memory or the data part, outputs writable and of the planned shape."""
    inputs = parse_refs(message.meta, "inputs", message.data.size)
    outputs = parse_refs(message.meta, "outputs", message.data.size)
    specs = {s.name: s for s in model.inputs}
    _check_names(inputs, specs, "inputs")
    arrays = {name: _input(name, ref, specs[name].dtype, message, registry) for name, ref in inputs.items()}
    model.check_shapes({name: a.shape for name, a in arrays.items()})
    planned = model.prepared({name: a.shape for name, a in arrays.items()}).program
    out_specs = {s.name: s for s in model.outputs if s.name not in specs}
    _check_names(outputs, out_specs, "outputs", every=False)
    written = {name: _output(name, ref, out_specs[name].dtype, planned, registry) for name, ref in outputs.items()}
    copied = sum(a.nbytes for name, a in arrays.items() if inputs[name].memory is None)
    return Request(connection, message.request, arrays, written,
                   [s.name for s in model.outputs if s.name not in written], copied)


def _check_names(refs: dict[str, Ref], specs: dict, key: str, every: bool = True) -> None:
    unknown = sorted(set(refs) - set(specs))
    missing = sorted(set(specs) - set(refs)) if every else []
    if unknown or missing:
        raise InputError(f"the request's {key} name {unknown or missing}, "
                         f"{'which are not' if unknown else 'but lack'} tensors of the model: its {key} are "
                         f"{sorted(specs)}")
    for name in refs:
        if specs[name].kind != "tensor":
            raise InputError(f"{key[:-1]} {name!r} is a {specs[name].kind}: a server passes tensors only")


def _input(name: str, ref: Ref, dtype: np.dtype, message: Message, registry: Registry) -> np.ndarray:
    if ref.dtype != dtype:
        raise InputError(f"input {name!r} is {ref.dtype}, the model needs {dtype}: convert it with "
                         f".astype(np.{dtype.name})")
    if ref.memory is not None:
        return registry.view(ref, f"input {name!r}", output=False)
    return message.data[ref.offset:ref.offset + ref.nbytes].view(ref.dtype).reshape(ref.shape)


def _output(name: str, ref: Ref, dtype: np.dtype, planned: Any, registry: Registry) -> np.ndarray:
    """The client's memory an output is written into, once checked against the planned result."""
    if ref.memory is None:
        raise InputError(f"output {name!r} names bytes of the data part: outputs go into registered memory; "
                         f"leave it out of the request's outputs to get it back as bytes")
    if planned.places[name].region == DYNAMIC or planned.shapes.get(name) is None:
        raise BindError(f"output {name!r} is sized by the input values: it cannot be written into memory "
                        f"given in advance; leave it out of the request's outputs to get it back as bytes")
    want = tuple(planned.shapes[name])
    if ref.dtype != dtype or ref.shape != want:
        raise BindError(f"output {name!r}: the memory is given as {ref.dtype} {list(ref.shape)}, the result is "
                        f"{dtype} {list(want)} for these inputs: pass a view of exactly that dtype and shape")
    return registry.view(ref, f"output {name!r}", output=True)
