"""Scale omrt out with Ray: a `.om` file in Ray's object store once per node, a Ray Data callable
for `map_batches`, and a Ray Serve deployment that answers numpy and KServe v2 JSON over HTTP.

Needs `pip install omrt[ray]`; nothing else in omrt imports this module (docs/ray.md).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import mmap
import os
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence, Union

import numpy as np

try:
    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
except ImportError as e:
    raise ImportError(f"omrt.ray needs Ray Data and Ray Serve ({e}): pip install omrt[ray]") from e

from .errors import BindError, InputError, ShapeError
from .memory import Memory
from .runtime import Model, load
from .runtime.prepare import IOSpec


# ---------------------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class ModelRef:
    """A `.om` file's bytes in Ray's object store (`put_model`). Ray keeps one copy per node, in
    shared memory; every actor on the node reads the model in place from it. The process that put
    it owns the object: it must outlive the actors that load it."""

    ref: ray.ObjectRef
    name: str
    """The file's name without its suffix: the served model's name by default."""
    nbytes: int

    def load(self, trust_kernels: bool = False) -> Model:
        """The model, read in place from the object store: its weights are read-only views of the
        node's shared memory (`Model.weights_copied` is 0), kept mapped while the model lives."""
        return load(Memory.from_buffer(ray.get(self.ref)), trust_kernels=trust_kernels)


ModelSource = Union[ModelRef, str, os.PathLike]
"""A model for an actor: a ModelRef, or the path of a `.om` file that exists on every node."""


def put_model(path: str | os.PathLike) -> ModelRef:
    """Put the `.om` file at `path` in Ray's object store, once (copied from the page cache into
    the store, with no copy in this process); hand the ModelRef to `Predictor`, `deployment` or
    your own actors instead of the path."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        contents = np.frombuffer(data, np.uint8)
        ref, nbytes = ray.put(contents), contents.nbytes
        del contents  # the mapping closes only once no array uses it
    return ModelRef(ref, Path(path).stem, nbytes)


def load_model(model: ModelSource, trust_kernels: bool = False) -> Model:
    """Load a ModelRef in place from the object store, or a path from the file system."""
    if isinstance(model, ModelRef):
        return model.load(trust_kernels)
    return load(model, trust_kernels=trust_kernels)


# ---------------------------------------------------------------------------------------- batches

def _fixed_batch(model: Model) -> int | None:
    """The rows a model takes at a time when every input and output has fixed dims and the same
    first one (None otherwise: a batch then runs whole)."""
    specs = model.inputs + model.outputs
    if not all(s.shape and all(isinstance(d, int) for d in s.shape) for s in specs):
        return None
    firsts = {s.shape[0] for s in specs}
    return firsts.pop() if len(firsts) == 1 else None


class Runner:
    """One session of a model, run over batches of any number of rows, reading every input in
    place (read-only arrays too: inputs are never written to). A model with a free batch dim runs
    a batch at once; one of fixed batch B runs it B rows at a time, each step writing straight into
    the rows of one output array per output."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.inputs: list[IOSpec] = model.inputs
        self.outputs: list[IOSpec] = model.outputs
        self.session = model.session()
        self.step = _fixed_batch(model)

    @property
    def bytes_copied(self) -> int:
        """Bytes omrt copied in every run so far (an input that misfits, an output that must be copied)."""
        return self.session.stats.bytes_copied

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output of the model for these inputs, by name (arrays of the caller's)."""
        rows = {a.shape[0] if a.ndim else None for a in feeds.values()}
        if self.step is None or rows == {self.step}:
            return self.session.run(feeds)
        return self._in_steps(feeds, rows)

    def _in_steps(self, feeds: Mapping[str, np.ndarray], rows: set[int | None]) -> dict[str, np.ndarray]:
        (n,) = rows if len(rows) == 1 else (None,)
        if n is None or n % self.step:
            raise InputError(f"the model takes {self.step} rows at a time (inputs "
                             f"{', '.join(f'{s.name!r} {list(s.shape)}' for s in self.inputs)}) and this batch has "
                             f"{sorted(rows, key=str)} rows: give batches a multiple of {self.step} rows "
                             f"(map_batches(batch_size=...)), or compile the model with a free batch dim")
        outputs = {s.name: np.empty((n, *s.shape[1:]), s.dtype) for s in self.outputs}
        bound: set[str] = set()
        try:
            for start in range(0, n, self.step):
                part = slice(start, start + self.step)
                for name, array in outputs.items():
                    self.session.bind(name, array[part])
                    bound.add(name)
                self.session.run({name: array[part] for name, array in feeds.items()})
        finally:
            for name in bound:  # a later batch must not write into these arrays
                self.session.unbind(name)
        return outputs


class Predictor:
    """A Ray Data callable for `map_batches`: each actor loads the model once (a ModelRef in place
    from the object store), then runs every batch's columns as the model's inputs, read in place
    from the object store, and returns the batch's other columns with one column per output.

        ds.map_batches(omrt.ray.Predictor, fn_constructor_kwargs={"model": ref},
                       concurrency=2, batch_format="numpy")

    columns: model input -> batch column, for inputs whose column has another name.
    copies_column: the name of a column to add holding, on every row, the bytes omrt copied for
    its batch (0 when every input was read in place).
    """

    def __init__(self, model: ModelSource, columns: Mapping[str, str] | None = None,
                 copies_column: str | None = None, trust_kernels: bool = False) -> None:
        self.runner = Runner(load_model(model, trust_kernels))
        names = [s.name for s in self.runner.inputs]
        unknown = sorted(set(columns or {}) - set(names))
        if unknown:
            raise InputError(f"columns= maps {unknown}, which are not inputs of the model; its inputs are {names}")
        self.columns = {name: (columns or {}).get(name, name) for name in names}
        self.copies_column = copies_column

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = {name: column for name, column in self.columns.items() if column not in batch}
        if missing:
            raise InputError(f"the batch has no column {sorted(missing.values())} for the model's inputs "
                             f"{sorted(missing)}; its columns are {sorted(batch)}: pass "
                             f"columns={{input: column}} to Predictor")
        before = self.runner.bytes_copied
        outputs = self.runner({name: batch[column] for name, column in self.columns.items()})
        result = {k: v for k, v in batch.items() if k not in self.columns.values()}
        result.update(outputs)
        if self.copies_column is not None:
            rows = len(next(iter(outputs.values())))
            result[self.copies_column] = np.full(rows, self.runner.bytes_copied - before, np.int64)
        return result


# ---------------------------------------------------------------------------------------- payloads

DATATYPES = {"BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
             "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
             "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
             "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64)}
"""KServe v2 tensor datatypes and their numpy dtypes (BYTES, strings, is not a tensor omrt runs)."""
DATATYPE_OF = {dtype: name for name, dtype in DATATYPES.items()}
NPY_MAGIC = b"\x93NUMPY"
NPZ_MAGIC = b"PK\x03\x04"
FORMATS = ("send KServe v2 JSON with Content-Type application/json, or an .npy (one input) or .npz (one array per "
           "input name) with Content-Type application/octet-stream")


@dataclass
class Payload:
    """An inference request, decoded: the inputs, whether it came as JSON (and is answered so),
    the outputs asked for (None: all) and the request's id."""

    feeds: dict[str, np.ndarray]
    json: bool
    outputs: list[str] | None = None
    id: str | None = None


def decode(body: bytes, content_type: str, inputs: Sequence[IOSpec]) -> Payload:
    """The request in `body`: KServe v2 JSON, or .npy/.npz bytes; InputError naming the tensor and
    the fix for anything else, or for inputs of another datatype than the model's."""
    if content_type.split(";")[0].strip() == "application/json":
        payload = _decode_json(body)
    elif body.startswith((NPY_MAGIC, NPZ_MAGIC)):
        payload = Payload(_decode_numpy(body, inputs), json=False)
    else:
        raise InputError(f"the body is neither JSON (Content-Type {content_type or 'missing'}) nor .npy/.npz bytes: "
                         f"{FORMATS}")
    for spec in inputs:
        given = payload.feeds.get(spec.name)
        if given is not None and given.dtype != spec.dtype:
            raise InputError(f"input {spec.name!r} is {_datatype(given.dtype)}; the model takes "
                             f"{_datatype(spec.dtype)}: send it as that datatype")
    return payload


def _datatype(dtype: np.dtype) -> str:
    name = DATATYPE_OF.get(dtype)
    return f"{name} ({dtype})" if name else str(dtype)


def _decode_numpy(body: bytes, inputs: Sequence[IOSpec]) -> dict[str, np.ndarray]:
    if body.startswith(NPZ_MAGIC):
        try:
            with np.load(io.BytesIO(body), allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise InputError(f"the .npz body cannot be read ({e}): write it with np.savez(f, **{{input: array}})")
    if len(inputs) != 1:
        raise InputError(f"an .npy body holds one array and the model has inputs {[s.name for s in inputs]}: send "
                         f"an .npz with one array per input name")
    return {inputs[0].name: _npy_view(body, inputs[0].name)}


def _npy_view(body: bytes, name: str) -> np.ndarray:
    """The array of an .npy body, read in place: a read-only view of the body, not a copy."""
    f = io.BytesIO(body)
    headers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = headers[version](f)
    except (ValueError, KeyError) as e:
        raise InputError(f"input {name!r}: the .npy body cannot be read ({e}): write it with np.save "
                         f"(format 1.0 or 2.0)") from None
    count = math.prod(shape)
    if dtype.hasobject or len(body) - f.tell() != count * dtype.itemsize:
        raise InputError(f"input {name!r}: the .npy body holds {len(body) - f.tell()} bytes of data, its header "
                         f"says {dtype} {shape}: send a whole np.save of a numeric array")
    array = np.frombuffer(body, dtype, count, f.tell())
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _decode_json(body: bytes) -> Payload:
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise InputError(f"the body is not JSON ({e}): {FORMATS}") from None
    tensors = doc.get("inputs") if isinstance(doc, dict) else None
    if not isinstance(tensors, list) or not tensors:
        raise InputError('the JSON has no "inputs" list: send {"inputs": [{"name": ..., "shape": [...], '
                         '"datatype": "FP32", "data": [...]}]}')
    wanted = doc.get("outputs")
    if wanted is not None and not (isinstance(wanted, list) and all(isinstance(o, dict) and "name" in o
                                                                    for o in wanted)):
        raise InputError('"outputs" is a list of {"name": output}: leave it out to get every output')
    return Payload(dict(_kserve_tensor(t, i) for i, t in enumerate(tensors)), json=True,
                   outputs=None if wanted is None else [o["name"] for o in wanted], id=doc.get("id"))


def _kserve_tensor(tensor: Any, index: int) -> tuple[str, np.ndarray]:
    """One KServe v2 input tensor as (name, array)."""
    fields = ("name", "shape", "datatype", "data")
    lacking = [k for k in fields if not isinstance(tensor, dict) or k not in tensor]
    if lacking:
        raise InputError(f"inputs[{index}] lacks {lacking}: each input is {{\"name\", \"shape\", \"datatype\", "
                         f"\"data\"}}")
    name, shape, datatype = tensor["name"], tensor["shape"], tensor["datatype"]
    if datatype not in DATATYPES:
        raise InputError(f"input {name!r}: datatype {datatype!r} is not one omrt takes; use one of {list(DATATYPES)}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in shape)):
        raise InputError(f"input {name!r}: shape {shape!r} is not a list of dims (non-negative integers)")
    try:
        array = np.asarray(tensor["data"], DATATYPES[datatype])
    except (TypeError, ValueError, OverflowError) as e:
        raise InputError(f"input {name!r}: \"data\" is not a list of {datatype} values ({e})") from None
    if array.size != math.prod(shape):
        raise InputError(f"input {name!r}: shape {shape} holds {math.prod(shape)} values and \"data\" has "
                         f"{array.size}: send every value, flat in row-major order")
    return name, array.reshape(shape)


def encode_json(model_name: str, outputs: Mapping[str, np.ndarray], request_id: str | None) -> dict[str, Any]:
    """A KServe v2 inference response: each output flat, in row-major order."""
    doc: dict[str, Any] = {"model_name": model_name, "outputs": [
        {"name": name, "datatype": DATATYPE_OF[a.dtype], "shape": list(a.shape), "data": a.ravel().tolist()}
        for name, a in outputs.items()]}
    if request_id is not None:
        doc["id"] = request_id
    return doc


def encode_numpy(outputs: Mapping[str, np.ndarray]) -> bytes:
    """One output as .npy bytes; several as an .npz, one array per output name."""
    buffer = io.BytesIO()
    if len(outputs) == 1:
        np.save(buffer, next(iter(outputs.values())), allow_pickle=False)
    else:
        np.savez(buffer, **outputs)
    return buffer.getvalue()


def _spec_json(spec: IOSpec) -> dict[str, Any]:
    """A tensor's KServe v2 metadata: a free dim is -1."""
    return {"name": spec.name, "datatype": DATATYPE_OF.get(spec.dtype, str(spec.dtype)),
            "shape": [d if isinstance(d, int) else -1 for d in spec.shape]}


# ---------------------------------------------------------------------------------------- serving

class ModelServer:
    """The body of omrt's Ray Serve deployment (`deployment` makes one): each replica loads the
    model once (a ModelRef in place from the object store) and answers, under its route prefix,

        POST /v2/models/{name}/infer, or POST /   KServe v2 JSON, or .npy/.npz bytes
        GET  /v2/models/{name}                    the model's KServe v2 metadata
        GET  /v2/health/live, /v2/health/ready, /v2/models/{name}/ready    200 once loaded

    A bad payload is answered with HTTP 400 and {"error": a message naming the tensor and the fix}.
    Requests take turns on the replica's one session; the header omrt-bytes-copied tells what omrt
    copied for a request.
    """

    def __init__(self, model: ModelSource, name: str, trust_kernels: bool = False) -> None:
        self.name = name
        self.runner = self.open(model, trust_kernels)
        self._turn = threading.Lock()
        infer, ready = self._infer, self._ready
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("POST", ""): infer, ("POST", f"/v2/models/{name}/infer"): infer,
            ("GET", f"/v2/models/{name}"): self._metadata, ("GET", f"/v2/models/{name}/ready"): ready,
            ("GET", "/v2/health/live"): ready, ("GET", "/v2/health/ready"): ready}

    def open(self, model: ModelSource, trust_kernels: bool) -> Runner:
        """What runs the requests: a Runner of the model. (Anything with the same `inputs`,
        `outputs`, `bytes_copied` and call can stand in, in a subclass: another engine, to compare.)"""
        return Runner(load_model(model, trust_kernels))

    async def __call__(self, request: Request) -> Response:
        path = request.url.path[len(request.scope.get("root_path", "")):].rstrip("/")
        route = self._routes.get((request.method, path))
        if route is None:
            return JSONResponse({"error": f"no route {request.method} {path or '/'}: this replica serves POST "
                                          f"/v2/models/{self.name}/infer and GET /v2/models/{self.name}"}, 404)
        return await route(request)

    async def _infer(self, request: Request) -> Response:
        try:
            payload = decode(await request.body(), request.headers.get("content-type", ""), self.runner.inputs)
            outputs, copied = await asyncio.to_thread(self._run, payload.feeds)
            if payload.outputs is not None:
                outputs = {name: outputs[name] for name in self._known_outputs(payload.outputs)}
        except (InputError, ShapeError, BindError) as e:
            return JSONResponse({"error": str(e)}, 400)
        headers = {"omrt-bytes-copied": str(copied)}
        if payload.json:
            return JSONResponse(encode_json(self.name, outputs, payload.id), headers=headers)
        return Response(encode_numpy(outputs), media_type="application/octet-stream", headers=headers)

    def _run(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
        """The outputs, and the bytes omrt copied for them."""
        with self._turn:
            before = self.runner.bytes_copied
            return self.runner(feeds), self.runner.bytes_copied - before

    def _known_outputs(self, names: list[str]) -> list[str]:
        outputs = [s.name for s in self.runner.outputs]
        unknown = [n for n in names if n not in outputs]
        if unknown:
            raise InputError(f"\"outputs\" asks for {unknown}; the model's outputs are {outputs}")
        return names

    async def _metadata(self, request: Request) -> Response:
        return JSONResponse({"name": self.name, "versions": [], "platform": "omrt",
                             "inputs": [_spec_json(s) for s in self.runner.inputs],
                             "outputs": [_spec_json(s) for s in self.runner.outputs]})

    async def _ready(self, request: Request) -> Response:
        return Response(status_code=200)


def deployment(model: ModelSource, name: str | None = None, trust_kernels: bool = False,
               **options: Any) -> serve.Application:
    """A Ray Serve application that serves `model` over HTTP (`ModelServer`): `serve.run(app)`.
    `name` names the deployment and the model in its routes (default: the file's name without its
    suffix); `options` go to `serve.deployment` (num_replicas, ray_actor_options, ...)."""
    name = name or (model.name if isinstance(model, ModelRef) else Path(model).stem)
    return serve.deployment(ModelServer, name=name, **options).bind(model, name, trust_kernels)
