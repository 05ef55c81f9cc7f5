"""The ONNX backend interface (`onnx.backend.base.Backend`) over omrt's real path: compile, load, run."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Callable, ContextManager, Iterator, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

import omrt
from omrt.kernels import parallel, winograd


# The one list of official ONNX backend tests omrt does not pass, each with the reason. Keys are
# regular expressions over test names; tests/test_onnx_backend.py excludes them and
# benchmarks/conformance.py reports them. Remove an entry when its tests pass.
UNSUPPORTED: dict[str, str] = {
    r"^test_bernoulli": "random output: the suite compares one particular seeded draw",
    r"^test_training_dropout": "random mask: the suite compares one particular seeded draw",
    r"^test_flexattention": "FlexAttention (ai.onnx.preview) takes score and mask sub-graphs: not implemented",
    r"^test_image_decoder_decode_(jpeg|jpeg2k|webp)_": "JPEG, JPEG 2000 and WebP need decoders the standard "
                                                        "library lacks (PNG, BMP, PNM, TIFF are decoded)",
    r"^test_gradient_of_": "Gradient (ai.onnx.preview.training) needs automatic differentiation",
    r"^test_loop16_seq_none": "the suite's comparison calls len() on the 0-d tensor inside the expected "
                              "sequence and raises for any backend (omrt's output equals the expected one)",
    r"^test_squeezenet": "the suite compares the softmax of 1,000 equal logits of about 9.5e9 (the shipped "
                         "weights are constant): uniform only when every class is summed in the same order, "
                         "which no BLAS promises across CPUs and thread splits (it fails on AVX2 kernels "
                         "and on two threads); omrt's logits match ONNX Runtime's to 3e-7 of their "
                         "magnitude (tests/test_light_models.py)",
}


class OmrtRep(BackendRep):
    """A model compiled to `.om` and loaded; `run` feeds inputs positionally."""

    def __init__(self, model: omrt.Model, running: Callable[[], ContextManager]) -> None:
        self.model = model
        self.running = running
        self.session = model.session()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        feeds = dict(inputs) if isinstance(inputs, dict) else {
            s.name: np.asarray(x) if s.kind == "tensor" else x for s, x in zip(self.model.inputs, inputs)}
        with self.running():
            out = self.session.run(feeds)
        if self.model.native is not None and self.model.native.calls():
            NATIVE_RUNS.append(self.model.native.calls())
        return tuple(out[s.name] for s in self.model.outputs)


NATIVE_RUNS: list[dict[str, int]] = []
"""Per model run that reached the native library: C function -> calls (the native backend's
report of how much of the suite exercised native code)."""


class OmrtBackend(Backend):
    """Compiles every model to a `.om` file in a temporary folder, then loads it like a user would.

    This one tests the numpy kernels: models are compiled without their native library."""

    native = False

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> OmrtRep:
        with tempfile.TemporaryDirectory(prefix="omrt-backend-") as tmp:
            path = os.path.join(tmp, "model.om")
            with cls.compiling():
                omrt.compile(model, path, native=cls.native)
            return OmrtRep(omrt.load(path, trust_kernels=cls.native), cls.running)

    @classmethod
    @contextlib.contextmanager
    def compiling(cls) -> Iterator[None]:
        """Settings the compile runs under (none for the numpy kernels)."""
        yield

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[None]:
        """Settings a run runs under (none for the numpy kernels)."""
        yield

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Sequence[np.ndarray], device: str = "CPU",
                 outputs_info: Any = None, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Wrap one node in a model (at the newest opset unless `opset_version` is given) and run it."""
        present = [(name, np.asarray(x)) for name, x in zip(node.input, inputs) if name]
        graph = helper.make_graph(
            [node], "node",
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
             for n, x in present],
            [helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n])
        opset = kwargs.get("opset_version") or onnx.defs.onnx_opset_version()
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
        return cls.run_model(model, [x for _, x in present], device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


class OmrtNativeBackend(OmrtBackend):
    """The same, with each model's native library packed, trusted and run on two threads, and the
    size thresholds that keep small layers off the native paths lowered so that the suite's small
    shapes reach the C code: every 3x3 stride-1 float convolution becomes a Winograd one, and
    every native call splits its work over the threads."""

    native = True

    @classmethod
    @contextlib.contextmanager
    def compiling(cls) -> Iterator[None]:
        saved = winograd.MIN_CHANNELS, winograd.MAX_FILTER_BYTES_PER_POSITION
        winograd.MIN_CHANNELS, winograd.MAX_FILTER_BYTES_PER_POSITION = 1, 1 << 62
        try:
            yield
        finally:
            winograd.MIN_CHANNELS, winograd.MAX_FILTER_BYTES_PER_POSITION = saved

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[None]:
        saved = omrt.get_num_threads(), parallel.NATIVE_SPLIT_FLOPS, parallel.NATIVE_SPLIT_BYTES
        omrt.set_num_threads(2)
        parallel.NATIVE_SPLIT_FLOPS = parallel.NATIVE_SPLIT_BYTES = 0
        try:
            yield
        finally:
            omrt.set_num_threads(saved[0])
            parallel.NATIVE_SPLIT_FLOPS, parallel.NATIVE_SPLIT_BYTES = saved[1:]


prepare = OmrtBackend.prepare
run_model = OmrtBackend.run_model
run_node = OmrtBackend.run_node
supports_device = OmrtBackend.supports_device
