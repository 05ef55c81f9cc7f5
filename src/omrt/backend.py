"""The ONNX backend interface (`onnx.backend.base.Backend`) over omrt's real path: compile, load, run."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

import omrt


# The one list of official ONNX backend tests omrt does not pass, each with the reason. Keys are
# regular expressions over test names; tests/test_onnx_backend.py excludes them and
# benchmarks/conformance.py reports them. Remove an entry when its tests pass.
UNSUPPORTED: dict[str, str] = {
    r"^test_bernoulli": "random output: the suite compares one particular seeded draw",
    r"^test_training_dropout": "random mask: the suite compares one particular seeded draw",
    r"^test_cast_e8m0_": "casting to float8e8m0 is not implemented",
    r"^test_flexattention": "FlexAttention (ai.onnx.preview) takes score and mask sub-graphs: not implemented",
    r"^test_image_decoder_decode_(jpeg|jpeg2k|webp)_": "JPEG, JPEG 2000 and WebP need decoders the standard "
                                                        "library lacks (PNG, BMP, PNM, TIFF are decoded)",
    r"^test_gradient_of_": "Gradient (ai.onnx.preview.training) needs automatic differentiation",
    r"^test_loop16_seq_none": "the suite's comparison calls len() on the 0-d tensor inside the expected "
                              "sequence and raises for any backend (omrt's output equals the expected one)",
}


class OmrtRep(BackendRep):
    """A model compiled to `.om` and loaded; `run` feeds inputs positionally."""

    def __init__(self, model: omrt.Model) -> None:
        self.model = model
        self.session = model.session()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        feeds = dict(inputs) if isinstance(inputs, dict) else {
            s.name: np.asarray(x) if s.kind == "tensor" else x for s, x in zip(self.model.inputs, inputs)}
        out = self.session.run(feeds)
        return tuple(out[s.name] for s in self.model.outputs)


class OmrtBackend(Backend):
    """Compiles every model to a `.om` file in a temporary folder, then loads it like a user would."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> OmrtRep:
        with tempfile.TemporaryDirectory(prefix="omrt-backend-") as tmp:
            path = os.path.join(tmp, "model.om")
            omrt.compile(model, path)
            return OmrtRep(omrt.load(path))

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


prepare = OmrtBackend.prepare
run_model = OmrtBackend.run_model
run_node = OmrtBackend.run_node
supports_device = OmrtBackend.supports_device
