"""Optimizer update kernels of the ai.onnx.preview.training domain: Momentum, Adagrad, Adam.

Each node updates n tensors at once: inputs are R (learning rate), T (update count), then the n
tensors X, their n gradients G and their n optimizer states (one or two groups); outputs are the
n new X followed by the new states. Every update is a few ufuncs into the outputs, with one
workspace buffer (the size of the largest X) for the regularized gradient.
(Gradient, the remaining op of the domain, needs automatic differentiation of the graph and is
not provided.)
"""

from __future__ import annotations

import math
from typing import ClassVar, Sequence

import numpy as np

from ..errors import ShapeError
from .base import Kernel, OpContext, TensorInfo, numel, register

DOMAIN = "ai.onnx.preview.training"


class _Optimizer(Kernel):
    """Shared input layout, checks and per-tensor loop; subclasses implement `update`."""

    states: ClassVar[int] = 1
    """Optimizer state tensors per optimized tensor (V, H, or both)."""

    @classmethod
    def count(cls, ctx: OpContext, n_inputs: int) -> int:
        n, rest = divmod(n_inputs - 2, 2 + cls.states)
        if n < 1 or rest:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} takes R, T and then {2 + cls.states} "
                             f"groups of n tensors (X, G{', V' if cls.states else ''}...), got "
                             f"{n_inputs} inputs; give every optimized tensor its gradient and state")
        return n

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        n = cls.count(ctx, len(inputs))
        r, t = inputs[0], inputs[1]
        if r.dtype.kind != "f" or t.dtype != np.int64 or r.rank > 1 or t.rank > 1:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs a float scalar R and an int64 scalar "
                             f"T, got {r.dtype}{r.shape} and {t.dtype}{t.shape}")
        groups = [inputs[2 + k * n:2 + (k + 1) * n] for k in range(2 + cls.states)]
        for i, x in enumerate(groups[0]):
            for g in groups[1:]:
                if g[i].dtype != x.dtype or g[i].rank != x.rank or any(
                        isinstance(a, int) and isinstance(b, int) and a != b
                        for a, b in zip(g[i].shape, x.shape)):
                    raise ShapeError(f"{ctx.name}: {ctx.op_type} tensor {i} has X {x.dtype}{x.shape} "
                                     f"but gradient/state {g[i].dtype}{g[i].shape}; they must match")
        return [TensorInfo(x.dtype, x.shape) for x in groups[0]] + [
            TensorInfo(s.dtype, s.shape) for g in groups[2:] for s in g]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.n = self.count(ctx, len(inputs))
        self.norm = float(ctx.attr("norm_coefficient", 0.0))

    def workspace(self) -> int:
        return max(numel(x.shape) * x.dtype.itemsize for x in self.inputs[2:2 + self.n])

    def run(self, inputs, outputs, workspace):
        n = self.n
        r, t = float(inputs[0].reshape(-1)[0]), int(inputs[1].reshape(-1)[0])
        for i in range(n):
            x = inputs[2 + i]
            if x.size == 0:
                continue
            ins = [inputs[2 + k * n + i] for k in range(2 + self.states)]
            outs = [outputs[k * n + i] for k in range(1 + self.states)]
            scratch = workspace[:x.nbytes].view(x.dtype).reshape(x.shape)
            np.multiply(x, self.norm, out=scratch)
            scratch += ins[1]
            self.update(r, t, x, scratch, ins[2:], outs[0], outs[1:])

    def update(self, r: float, t: int, x: np.ndarray, g: np.ndarray, states: list[np.ndarray],
               x_new: np.ndarray, new_states: list[np.ndarray]) -> None:
        """Write X_new and the new states; `g` is the regularized gradient (scratch, may be reused)."""
        raise NotImplementedError


@register("Momentum", since=1, domain=DOMAIN)
class Momentum(_Optimizer):
    """SG with momentum: V_new = alpha * V + beta' * G_reg (beta' = 1 on the first update, T = 0);
    "standard" mode X_new = X - R * V_new, "nesterov" X_new = X - R * (G_reg + alpha * V_new)."""

    @classmethod
    def infer(cls, ctx, inputs):
        for a in ("alpha", "beta", "mode", "norm_coefficient"):
            if a not in ctx.attrs:
                raise ShapeError(f"{ctx.name}: Momentum needs the attribute {a!r}")
        if ctx.attrs["mode"] not in ("standard", "nesterov"):
            raise ShapeError(f"{ctx.name}: Momentum mode {ctx.attrs['mode']!r} is neither "
                             f"'standard' nor 'nesterov'")
        return super().infer(ctx, inputs)

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.alpha = float(ctx.attrs["alpha"])
        self.beta = float(ctx.attrs["beta"])
        self.nesterov = ctx.attrs["mode"] == "nesterov"

    def update(self, r, t, x, g, states, x_new, new_states):
        (v,), (v_new,) = states, new_states
        np.multiply(g, self.beta if t > 0 else 1.0, out=x_new)
        np.multiply(v, self.alpha, out=v_new)
        v_new += x_new
        if self.nesterov:
            np.multiply(v_new, self.alpha, out=x_new)
            x_new += g
            x_new *= r
        else:
            np.multiply(v_new, r, out=x_new)
        np.subtract(x, x_new, out=x_new)


@register("Adagrad", since=1, domain=DOMAIN)
class Adagrad(_Optimizer):
    """H_new = H + G_reg^2; X_new = X - R / (1 + T * decay_factor) * G_reg / (sqrt(H_new) + epsilon)."""

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.decay = float(ctx.attr("decay_factor", 0.0))
        self.epsilon = float(ctx.attr("epsilon", 1e-6))

    def update(self, r, t, x, g, states, x_new, new_states):
        (h,), (h_new,) = states, new_states
        np.multiply(g, g, out=h_new)
        h_new += h
        np.sqrt(h_new, out=x_new)
        x_new += self.epsilon
        np.divide(g, x_new, out=x_new)
        x_new *= r / (1 + t * self.decay)
        np.subtract(x, x_new, out=x_new)


@register("Adam", since=1, domain=DOMAIN)
class Adam(_Optimizer):
    """V_new = alpha * V + (1 - alpha) * G_reg, H_new = beta * H + (1 - beta) * G_reg^2,
    X_new = (1 - norm_coefficient_post) * (X - R' * V_new / (sqrt(H_new) + epsilon)) with the
    bias-corrected R' = R * sqrt(1 - beta^T) / (1 - alpha^T) once T > 0."""

    states = 2

    def __init__(self, ctx, inputs, outputs):
        super().__init__(ctx, inputs, outputs)
        self.alpha = float(ctx.attr("alpha", 0.9))
        self.beta = float(ctx.attr("beta", 0.999))
        self.epsilon = float(ctx.attr("epsilon", 1e-6))
        self.post = float(ctx.attr("norm_coefficient_post", 0.0))

    def update(self, r, t, x, g, states, x_new, new_states):
        (v, h), (v_new, h_new) = states, new_states
        np.multiply(h, self.beta, out=h_new)
        np.multiply(g, g, out=x_new)
        x_new *= 1 - self.beta
        h_new += x_new
        np.multiply(v, self.alpha, out=v_new)
        g *= 1 - self.alpha
        v_new += g
        if t > 0:
            r = r * math.sqrt(1 - self.beta ** t) / (1 - self.alpha ** t)
        np.sqrt(h_new, out=x_new)
        x_new += self.epsilon
        np.divide(v_new, x_new, out=x_new)
        x_new *= r
        np.subtract(x, x_new, out=x_new)
        x_new *= 1 - self.post
