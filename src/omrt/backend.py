"""The ONNX backend interface (`onnx.backend.base.Backend`) over omrt's real path: compile, load, run."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

import omrt


class OmrtRep(BackendRep):
    """A model compiled to `.om` and loaded; `run` feeds inputs positionally."""

    def __init__(self, model: omrt.Model) -> None:
        self.model = model
        self.session = model.session()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        feeds = dict(inputs) if isinstance(inputs, dict) else {
            s.name: np.asarray(x) for s, x in zip(self.model.inputs, inputs)}
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
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = OmrtBackend.prepare
run_model = OmrtBackend.run_model
run_node = OmrtBackend.run_node
supports_device = OmrtBackend.supports_device
