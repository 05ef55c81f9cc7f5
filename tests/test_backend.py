"""omrt.backend: the ONNX backend interface goes through compile -> .om -> load -> run."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from omrt.backend import OmrtBackend


def test_run_node_and_model():
    node = helper.make_node("Relu", ["x"], ["y"])
    x = np.array([-1.0, 2.0], np.float32)
    (y,) = OmrtBackend.run_node(node, [x])
    np.testing.assert_array_equal(y, [0.0, 2.0])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    rep = OmrtBackend.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    np.testing.assert_array_equal(rep.run([x])[0], [0.0, 2.0])
    assert rep.model.path.endswith("model.om")
    assert OmrtBackend.supports_device("CPU") and not OmrtBackend.supports_device("CUDA")
