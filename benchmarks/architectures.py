"""Real architectures built with onnx.helper from seeded, well-conditioned weights, for the
benchmarks (compare.py, autofuse.py): no file is downloaded, every run builds the same model.

- `mobilenetv3`: a MobileNetV3-Small-style classifier (1x3x224x224): a stem, eleven inverted
  residual blocks (1x1 expansion, depthwise kxk, squeeze-excite with HardSigmoid * x, 1x1
  projection, residual Add), a head and Softmax. HardSwish is written as x * HardSigmoid(x) in
  half the places and as x * Clip(x + 3, 0, 6) / 6 in the other half, as exporters write it.
- `bert`: a BERT-style encoder (1x128 tokens, hidden 256, 4 heads, FFN 1024, 4 layers): Q/K/V
  projections, scores / sqrt(head size) + the mask's (1 - mask) * -10000, Softmax, output
  projection, residual Add, LayerNormalization written out as
  ReduceMean/Sub/Pow/Add/Sqrt/Div/Mul/Add, GELU as x * 0.5 * (1 + Erf(x / sqrt 2)).
  `minilm` is the same with MiniLM-L6's sizes (6 layers, hidden 384, 12 heads, FFN 1536) and a
  constant mask.
- `dbnet`: a DBNet-style text detector (1x3x320x320): a ResNet-18-style backbone (basic blocks,
  BatchNormalization after every convolution), an FPN (1x1 laterals, nearest 2x Resize and Add
  top-down, 3x3 smoothing, every level resized to 1/4 and concatenated), and the probability
  head (3x3 conv, BN, Relu, two 2x2 stride-2 ConvTransposes, Sigmoid).
- `crnn`: a CRNN-style text recognizer (1x1x32x320 grey text line): a VGG-style conv stack with
  BatchNormalization and MaxPools down to height 1 (width / 4), the columns as a sequence of 80 steps, two
  bidirectional LSTMs (hidden 128) and a per-step classifier over 97 symbols with Softmax.

Weights are He-normal for convolutions and products (so activations keep their scale through
the depth), batch-norm statistics near identity, and classifier layers scaled so that outputs
are well-conditioned: a comparison against ONNX Runtime scaled to the output's magnitude means
something on any host.
"""

from __future__ import annotations

import numpy as np


class Builder:
    """Nodes, seeded initializers and unique names for an onnx.helper graph."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, value: np.ndarray, stem: str = "c") -> str:
        from onnx import numpy_helper

        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32) if np.asarray(value).dtype.kind == "f"
                                                  else np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        from onnx import helper

        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 2.0) -> str:
        return self.const(self.rng.standard_normal(shape).astype(np.float32) * np.sqrt(gain / fan_in), "w")


# ----------------------------------------------------------------------------- MobileNetV3-style

MOBILENET_BLOCKS = [(3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
                    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
                    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
                    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1)]
"""MobileNetV3-Small: (kernel, expanded channels, output channels, squeeze-excite, activation, stride)."""


def _hardswish(b: Builder, x: str) -> str:
    """HardSwish as exporters write it: x * HardSigmoid(x), or x * Clip(x + 3, 0, 6) / 6."""
    if b.count % 2:
        return b.op("Mul", [x, b.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)])
    clipped = b.op("Clip", [b.op("Add", [x, b.const(3.0)]), b.const(0.0), b.const(6.0)])
    return b.op("Mul", [x, b.op("Div", [clipped, b.const(6.0)])])


def _act(b: Builder, x: str, kind: str) -> str:
    return b.op("Relu", [x]) if kind == "RE" else _hardswish(b, x)


def _conv(b: Builder, x: str, cin: int, cout: int, k: int = 1, stride: int = 1, group: int = 1) -> str:
    w = b.weight((cout, cin // group, k, k), cin // group * k * k)
    bias = b.const(b.rng.standard_normal(cout).astype(np.float32) * 0.05, "b")
    return b.op("Conv", [x, w, bias], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
                group=group)


def _squeeze_excite(b: Builder, x: str, c: int) -> str:
    mid = max(8, c // 4)
    s = b.op("GlobalAveragePool", [x])
    s = b.op("Relu", [_conv(b, s, c, mid)])
    s = b.op("HardSigmoid", [_conv(b, s, mid, c)], alpha=1 / 6, beta=0.5)
    return b.op("Mul", [x, s])


def mobilenetv3(size: int = 224, width: float = 1.0, seed: int = 0):
    """The MobileNetV3-Small-style classifier (module docstring), input 1x3xSIZExSIZE."""
    from onnx import TensorProto, helper

    b = Builder(seed)
    ch = lambda c: max(8, int(c * width) // 8 * 8)  # noqa: E731
    x = _hardswish(b, _conv(b, "image", 3, ch(16), 3, 2))
    cin = ch(16)
    for k, exp, out, se, nl, stride in MOBILENET_BLOCKS:
        exp, out = ch(exp), ch(out)
        y = _act(b, _conv(b, x, cin, exp), nl) if exp != cin else x
        y = _act(b, _conv(b, y, exp, exp, k, stride, group=exp), nl)
        if se:
            y = _squeeze_excite(b, y, exp)
        y = _conv(b, y, exp, out)
        x = b.op("Add", [x, y]) if stride == 1 and cin == out else y
        cin = out
    x = _hardswish(b, _conv(b, x, cin, ch(576)))
    x = b.op("GlobalAveragePool", [x])
    x = _hardswish(b, _conv(b, x, ch(576), 1024))
    x = b.op("Flatten", [_conv(b, x, 1024, 1000)])
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], axis=-1))
    graph = helper.make_graph(b.nodes, "mobilenetv3_style",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 1000])], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="omrt-bench")


# ----------------------------------------------------------------------------- BERT-style


def _layernorm(b: Builder, x: str, d: int) -> str:
    """LayerNormalization over the last axis, written out as pre-opset-17 exporters do."""
    mean = b.op("ReduceMean", [x], axes=[-1])
    dev = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Pow", [dev, b.const(2.0)])], axes=[-1])
    std = b.op("Sqrt", [b.op("Add", [var, b.const(1e-12)])])
    y = b.op("Mul", [b.op("Div", [dev, std]), b.const(1 + 0.1 * b.rng.standard_normal(d))])
    return b.op("Add", [y, b.const(0.1 * b.rng.standard_normal(d))])


def _dense(b: Builder, x: str, din: int, dout: int) -> str:
    y = b.op("MatMul", [x, b.weight((din, dout), din, 1.0)])
    return b.op("Add", [y, b.const(0.02 * b.rng.standard_normal(dout))])


def _gelu(b: Builder, x: str) -> str:
    """x * 0.5 * (1 + Erf(x / sqrt 2))."""
    erf = b.op("Erf", [b.op("Div", [x, b.const(np.sqrt(2.0))])])
    return b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), b.op("Add", [erf, b.const(1.0)])])


def _heads(b: Builder, x: str, seq: int, heads: int, dh: int, perm: list[int]) -> str:
    return b.op("Transpose", [b.op("Reshape", [x, b.const(np.array([1, seq, heads, dh], np.int64), "shape")])],
                perm=perm)


def bert(seq: int = 128, hidden: int = 256, heads: int = 4, layers: int = 4, ffn: int = 1024, seed: int = 0,
         mask_input: bool = True):
    """The BERT-style encoder (module docstring): input embeddings 1xSEQxHIDDEN and, with
    `mask_input`, the attention mask 1xSEQ (else a constant mask: the last SEQ/8 positions are
    padding)."""
    from onnx import TensorProto, helper

    b = Builder(seed)
    dh = hidden // heads
    padding = np.arange(seq) >= seq - seq // 8
    mask = b.op("Mul", [b.op("Sub", [b.const(1.0), "mask" if mask_input else b.const(1.0 - padding[None])]),
                        b.const(-10000.0)])
    mask = b.op("Unsqueeze", [mask, b.const(np.array([1, 2], np.int64), "axes")])
    x = _layernorm(b, "embeddings", hidden)
    for _ in range(layers):
        q = _heads(b, _dense(b, x, hidden, hidden), seq, heads, dh, [0, 2, 1, 3])
        k = _heads(b, _dense(b, x, hidden, hidden), seq, heads, dh, [0, 2, 3, 1])
        v = _heads(b, _dense(b, x, hidden, hidden), seq, heads, dh, [0, 2, 1, 3])
        scores = b.op("Add", [b.op("Div", [b.op("MatMul", [q, k]), b.const(float(np.sqrt(dh)))]), mask])
        ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]),
                               b.const(np.array([1, seq, hidden], np.int64), "shape")])
        x = _layernorm(b, b.op("Add", [x, _dense(b, ctx, hidden, hidden)]), hidden)
        h = _dense(b, _gelu(b, _dense(b, x, hidden, ffn)), ffn, hidden)
        x = _layernorm(b, b.op("Add", [x, h]), hidden)
    b.nodes.append(helper.make_node("Identity", [x], ["hidden"]))
    graph = helper.make_graph(b.nodes, "bert_style",
                              [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, [1, seq, hidden])]
                              + ([helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, seq])]
                                 if mask_input else []),
                              [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, hidden])],
                              b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="omrt-bench")


def minilm(seq: int = 128, seed: int = 0):
    """A MiniLM-L6-style sentence encoder: `bert` with its sizes and a constant mask."""
    return bert(seq=seq, hidden=384, heads=12, layers=6, ffn=1536, seed=seed, mask_input=False)


# ----------------------------------------------------------------------------- DBNet-style


def _conv_bn(b: Builder, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, relu: bool = True) -> str:
    """Convolution without bias, BatchNormalization near identity, and Relu."""
    w = b.weight((cout, cin, k, k), cin * k * k)
    y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    stats = [1 + 0.1 * b.rng.standard_normal(cout), 0.1 * b.rng.standard_normal(cout),
             0.1 * b.rng.standard_normal(cout), 1 + 0.1 * np.abs(b.rng.standard_normal(cout))]
    y = b.op("BatchNormalization", [y, *(b.const(s) for s in stats)], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def _basic_block(b: Builder, x: str, cin: int, cout: int, stride: int) -> str:
    """ResNet's basic block: two 3x3 conv-BNs, the shortcut (projected when the shape changes),
    Add, Relu. The residual branch is scaled down so that depth does not grow the activations."""
    y = _conv_bn(b, _conv_bn(b, x, cin, cout, 3, stride), cout, cout, 3, relu=False)
    y = b.op("Mul", [y, b.const(0.5)])
    short = x if stride == 1 and cin == cout else _conv_bn(b, x, cin, cout, 1, stride, relu=False)
    return b.op("Relu", [b.op("Add", [short, y])])


def _upsample(b: Builder, x: str, factor: int) -> str:
    scales = b.const(np.array([1, 1, factor, factor], np.float32), "scales")
    return b.op("Resize", [x, "", scales], mode="nearest")


def dbnet(size: int = 320, seed: int = 0):
    """The DBNet-style detector (module docstring), input 1x3xSIZExSIZE, output the probability
    map 1x1xSIZExSIZE."""
    from onnx import TensorProto, helper

    b = Builder(seed)
    x = b.op("MaxPool", [_conv_bn(b, "image", 3, 64, 7, 2)], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    levels, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        x = _basic_block(b, _basic_block(b, x, cin, cout, stride), cout, cout, 1)
        levels.append((x, cout))
        cin = cout
    laterals = [_conv(b, f, c, 64) for f, c in levels]
    for i in range(len(laterals) - 2, -1, -1):
        laterals[i] = b.op("Add", [laterals[i], _upsample(b, laterals[i + 1], 2)])
    pyramid = [_upsample(b, _conv(b, f, 64, 16, 3), 2 ** i) if i else _conv(b, f, 64, 16, 3)
               for i, f in enumerate(laterals)]
    y = _conv_bn(b, b.op("Concat", pyramid, axis=1), 64, 16)
    for cout, last in ((16, False), (1, True)):
        w = b.weight((16, cout, 2, 2), 16 * 4)
        y = b.op("ConvTranspose", [y, w, b.const(np.zeros(cout), "b")], kernel_shape=[2, 2], strides=[2, 2])
        if not last:
            y = b.op("Relu", [y])
    b.nodes.append(helper.make_node("Sigmoid", [y], ["prob"]))
    graph = helper.make_graph(b.nodes, "dbnet_style",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, size, size])],
                              b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="omrt-bench")


# ----------------------------------------------------------------------------- CRNN-style

CRNN_STACK = [(32, (2, 2)), (64, (2, 2)), (128, None), (128, (2, 1)), (256, None), (256, (2, 1))]
"""The conv stack: (channels, MaxPool kernel and stride, or None); a last 2x1 MaxPool ends at
height 1."""


def _bilstm(b: Builder, x: str, din: int, hidden: int) -> str:
    """A bidirectional LSTM over x (steps, 1, din); the output (steps, 1, 2 * hidden)."""
    scale = 1 / np.sqrt(hidden)
    w = b.const(b.rng.standard_normal((2, 4 * hidden, din)) / np.sqrt(din), "lstm_w")
    r = b.const(b.rng.standard_normal((2, 4 * hidden, hidden)) * scale, "lstm_r")
    bias = b.const(b.rng.standard_normal((2, 8 * hidden)) * 0.1, "lstm_b")
    y = b.op("LSTM", [x, w, r, bias], hidden_size=hidden, direction="bidirectional")  # (steps, 2, 1, hidden)
    y = b.op("Transpose", [y], perm=[0, 2, 1, 3])
    return b.op("Reshape", [y, b.const(np.array([0, 1, 2 * hidden], np.int64), "shape")])


def crnn(width: int = 320, hidden: int = 128, classes: int = 97, seed: int = 0):
    """The CRNN-style recognizer (module docstring), input 1x1x32xWIDTH, output per-step class
    probabilities (WIDTH/4, 1, CLASSES)."""
    from onnx import TensorProto, helper

    b = Builder(seed)
    x, cin = "line", 1
    for cout, pool in CRNN_STACK:
        x = _conv_bn(b, x, cin, cout)
        if pool:
            x = b.op("MaxPool", [x], kernel_shape=list(pool), strides=list(pool))
        cin = cout
    x = b.op("MaxPool", [x], kernel_shape=[2, 1], strides=[2, 1])         # height 1
    x = b.op("Squeeze", [x, b.const(np.array([2], np.int64), "axes")])     # (1, C, steps)
    x = b.op("Transpose", [x], perm=[2, 0, 1])                              # (steps, 1, C)
    x = _bilstm(b, _bilstm(b, x, cin, hidden), 2 * hidden, hidden)
    logits = b.op("MatMul", [x, b.weight((2 * hidden, classes), 2 * hidden, 1.0)])
    b.nodes.append(helper.make_node("Softmax", [logits], ["probs"], axis=-1))
    steps = width // 4
    graph = helper.make_graph(b.nodes, "crnn_style",
                              [helper.make_tensor_value_info("line", TensorProto.FLOAT, [1, 1, 32, width])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [steps, 1, classes])],
                              b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="omrt-bench")


MODELS = {"mobilenetv3": mobilenetv3, "dbnet": dbnet, "crnn": crnn, "minilm": minilm}
"""The real architectures of compare.py's suite."""
