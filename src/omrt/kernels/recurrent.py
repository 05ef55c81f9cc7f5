"""Recurrent kernels: RNN, GRU and LSTM on one base (directions, layouts, sequence lengths, activations).

The input projection X @ W^T + biases of every time step and direction is one matrix product into
the workspace (on the native workers, split over omrt's threads, when the model has the linalg
unit and the operands are float32 matrices BLAS reads in place); the time loop then only
multiplies the hidden state by R, gate by gate in place, in small scratch arrays carved from the
workspace. LSTM and GRU run their time loops in C (csrc/recurrent.c) when the model has it and
the layer is their common case.

A compiled model's LSTMs and GRUs of that case are omrt::PackedLSTM and omrt::PackedGRU nodes: the
compiler stored W^T in strips for omrt's own GEMM, the biases folded, and R in the time loop's
panels, so that a run projects the inputs with the bias in the tile's registers and never repacks R.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Iterator, Sequence

import numpy as np

from ..errors import ShapeError
from ..native.bindings import GRU as NATIVE_GRU
from ..native.bindings import LSTM as NATIVE_LSTM
from ..native.bindings import GRU_PACKED, LSTM_PACKED, PMATMUL, activation_code
from ..native.signature import Function
from ..native.signature import CONSTANTS
from . import packed, parallel
from .base import Kernel, OpContext, TensorInfo, carve, carve_size, register, run_bound
from .linalg import _Product

PANEL = CONSTANTS["LSTM_PANEL"]
"""Rows of R per panel of the C time loop."""

Activation = Callable[[np.ndarray], None]
"""Applies an activation to an array in place."""

PACKED_SOURCES = (1, 3, 2)
"""The inputs a packed LSTM's or GRU's three derived weights come from, in the order they follow
its own inputs: W, B, R."""


def _sigmoid(x: np.ndarray, alpha: float, beta: float) -> None:
    # Not np.negative: in place over a gate of one unit (a column 4 floats apart) numpy (2.3, 2.4)
    # negates the wrong elements. Multiplying by -1 is as exact.
    with np.errstate(over="ignore"):
        np.multiply(x, -1, out=x)
        np.exp(x, out=x)
    np.add(x, 1, out=x)
    np.reciprocal(x, out=x)


def _tanh(x: np.ndarray, alpha: float, beta: float) -> None:
    np.tanh(x, out=x)


def _relu(x: np.ndarray, alpha: float, beta: float) -> None:
    np.maximum(x, 0, out=x)


def _affine(x: np.ndarray, alpha: float, beta: float) -> None:
    np.multiply(x, alpha, out=x)
    np.add(x, beta, out=x)


def _leaky_relu(x: np.ndarray, alpha: float, beta: float) -> None:
    np.multiply(x, alpha, out=x, where=x < 0)


def _thresholded_relu(x: np.ndarray, alpha: float, beta: float) -> None:
    x[x < alpha] = 0


def _scaled_tanh(x: np.ndarray, alpha: float, beta: float) -> None:
    np.multiply(x, beta, out=x)
    np.tanh(x, out=x)
    np.multiply(x, alpha, out=x)


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> None:
    _affine(x, alpha, beta)
    np.clip(x, 0, 1, out=x)


def _elu(x: np.ndarray, alpha: float, beta: float) -> None:
    negative = x < 0
    x[negative] = alpha * np.expm1(x[negative])


def _softsign(x: np.ndarray, alpha: float, beta: float) -> None:
    np.divide(x, 1 + np.abs(x), out=x)


def _softplus(x: np.ndarray, alpha: float, beta: float) -> None:
    np.logaddexp(x, 0, out=x)


_Fn = Callable[[np.ndarray, float, float], None]

_ACTIVATIONS: dict[str, tuple[_Fn, float | None, float | None]] = {
    "relu": (_relu, None, None),
    "tanh": (_tanh, None, None),
    "sigmoid": (_sigmoid, None, None),
    "affine": (_affine, 1.0, 0.0),
    "leakyrelu": (_leaky_relu, 0.01, None),
    "thresholdedrelu": (_thresholded_relu, 1.0, None),
    "scaledtanh": (_scaled_tanh, 1.0, 1.0),
    "hardsigmoid": (_hard_sigmoid, 0.2, 0.5),
    "elu": (_elu, 1.0, None),
    "softsign": (_softsign, None, None),
    "softplus": (_softplus, None, None),
}
"""name -> (function, default alpha, default beta); None marks a parameter the function does not take."""


def _activation(name: str, alphas: Iterator[float], betas: Iterator[float], node: str) -> Activation:
    """The activation `name`, taking its alpha and beta (if it has them) from the attribute lists.

    Spec: "activation_alpha: Optional scaling values used by some activation functions. The values
    are consumed in the order of activation functions". Only functions that take a parameter
    consume one (as onnxruntime does); a list that runs out leaves the operator defaults.
    """
    entry = _ACTIVATIONS.get(name.lower())
    if entry is None:
        raise ShapeError(f"{node}: unknown recurrent activation {name!r}; use one of "
                         f"Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, "
                         f"HardSigmoid, Elu, Softsign, Softplus")
    fn, alpha, beta = entry
    alpha = next(alphas, alpha) if alpha is not None else 0.0
    beta = next(betas, beta) if beta is not None else 0.0
    return lambda x: fn(x, alpha, beta)


class _Recurrent(Kernel):
    """One-layer recurrence over a sequence: forward, reverse or both, with optional per-batch lengths.

    Inputs are X, W, R, B, sequence_lens, initial_h (then initial_c, P for LSTM); outputs Y, Y_h
    (then Y_c). With `layout` 1 (opset 14) the batch dim comes first in X, Y and the states.
    Past a batch entry's sequence length its Y rows are 0 and its state stops changing, so Y_h is
    the state after the last valid step (for the reverse direction, after step 0).
    """

    gates: ClassVar[int]
    native_units = ("linalg",)
    default_activations: ClassVar[tuple[str, ...]]
    states: ClassVar[int] = 1
    scratch: ClassVar[tuple[int, ...]]
    """Widths, in hidden sizes, of the (batch x width) scratch arrays one time step needs."""

    @staticmethod
    def _dims(ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> tuple:
        """(num_directions, seq_length, batch, hidden_size) as far as they are known."""
        x, w, r = inputs[0], inputs[1], inputs[2]
        direction = ctx.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ShapeError(f"{ctx.name}: direction {direction!r} must be forward, reverse or "
                             f"bidirectional")
        dirs = 2 if direction == "bidirectional" else 1
        hidden = ctx.attr("hidden_size") or r.shape[-1]
        if x.rank != 3 or w.rank != 3 or r.rank != 3:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} needs X, W and R of rank 3, got {x.shape}, "
                             f"{w.shape} and {r.shape}")
        if isinstance(w.shape[0], int) and w.shape[0] != dirs:
            raise ShapeError(f"{ctx.name}: W has {w.shape[0]} directions but direction={direction!r} "
                             f"needs {dirs}; fix the weights or the direction attribute")
        seq, batch = (x.shape[1], x.shape[0]) if ctx.attr("layout", 0) else (x.shape[0], x.shape[1])
        return dirs, seq, batch, hidden

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        dirs, seq, batch, hidden = cls._dims(ctx, inputs)
        w = inputs[1]
        if isinstance(w.shape[1], int) and isinstance(hidden, int) and w.shape[1] != cls.gates * hidden:
            raise ShapeError(f"{ctx.name}: W has {w.shape[1]} rows, {ctx.op_type} with hidden_size "
                             f"{hidden} needs {cls.gates * hidden} ({cls.gates} gates)")
        dtype = inputs[0].dtype
        if ctx.attr("layout", 0):
            y, state = (batch, seq, dirs, hidden), (batch, dirs, hidden)
        else:
            y, state = (seq, dirs, batch, hidden), (dirs, batch, hidden)
        return [TensorInfo(dtype, y)] + [TensorInfo(dtype, state)] * cls.states

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.dirs, seq, batch, self.hidden = self._dims(ctx, inputs)
        self.layout = int(ctx.attr("layout", 0))
        reverse = ctx.attr("direction", "forward") == "reverse"
        self.backward = [d == 1 or reverse for d in range(self.dirs)]
        clip = ctx.attr("clip")
        self.clip = None if clip is None else float(clip)
        names = list(ctx.attr("activations") or self.default_activations * self.dirs)
        per_dir = len(self.default_activations)
        if len(names) == per_dir and self.dirs == 2:
            names *= 2
        if len(names) != per_dir * self.dirs:
            raise ShapeError(f"{ctx.name}: {ctx.op_type} takes {per_dir} activations per direction, "
                             f"got {names}")
        self.default_acts = [n.lower() for n in names] == [n.lower() for n in self.default_activations] * self.dirs
        """Whether every direction runs the operator's default activations."""
        alphas = iter(ctx.attr("activation_alpha") or ())
        betas = iter(ctx.attr("activation_beta") or ())
        acts = [_activation(n, alphas, betas, ctx.name) for n in names]
        self.acts = [acts[d * per_dir:(d + 1) * per_dir] for d in range(self.dirs)]
        dtype = inputs[0].dtype
        h = self.hidden
        self.specs = ([((seq, batch, self.dirs * self.gates * h), dtype)] + [((batch, h), dtype)] * self.states
                      + [((batch, k * h), dtype) for k in self.scratch])
        """The projection (every direction's gates side by side), the states, the scratch."""
        dims = (seq, batch, inputs[0].shape[-1], self.dirs * self.gates * h)
        self.product = None
        """X (every step's rows) @ W^T as one product, on the native workers where it can be; None:
        numpy's matmul (other dtypes, symbolic dims)."""
        if dtype == np.float32 and all(isinstance(d, int) for d in dims):
            rows, width, gates = seq * batch, dims[2], dims[3]
            self.product = _Product((rows, width), (width, gates), (rows, gates), dtype, ctx=ctx, fuse=False)
        floats = all(i is None or i.dtype == np.float32 for k, i in enumerate(inputs[:8]) if k != 4)
        self.native_case = (self.native_function is not None and floats and self.default_acts and self.clip is None
                            and self.native_takes())
        """Whether the op's C time loop (csrc/recurrent.c) takes this layer: float32, the default
        activations, no clip (and what native_takes adds)."""
        self.native_loop = (ctx.native.get(self.native_function) if ctx.native is not None and self.native_case
                            else None)
        if self.native_case:
            padded = self.panel_rows()
            self.work_spec = ((self.dirs * (batch * (2 * h + padded) + padded * h),), np.dtype(np.float32))
            """The C loop's work, each direction's states and gates, then R in panels: planned for
            every layer it takes, whether or not the model has it."""
            self.flops = 2 * self.gates * seq * batch * self.dirs * h * h
            """Of the recurrence, R by h at every step."""
            self.slots = self.dirs * max(batch, 1)
            """Threads the C loop can use: one per direction and batch entry."""

    native_function: ClassVar[Function | None] = None
    """The op's C time loop; None: numpy's alone."""

    def native_takes(self) -> bool:
        """What else the C time loop needs of the layer's attributes."""
        return True

    def panel_groups(self) -> tuple[int, ...]:
        """R's rows per direction in the C loop's groups of panels, each group rounded up to whole
        panels: all its gates' rows."""
        return (self.gates * self.hidden,)

    def panel_rows(self) -> int:
        """Rows of R's panels per direction in the C loop."""
        return sum(-(-rows // PANEL) * PANEL for rows in self.panel_groups())

    def fold_bias(self, b: np.ndarray) -> np.ndarray:
        """B as the packed projection's bias: what add_input_bias adds to each direction's gates,
        the directions side by side; then what the C loop reads of B itself (loop_bias)."""
        folded = np.zeros((self.dirs, self.gates * self.hidden), b.dtype)
        for d in range(self.dirs):
            self.add_input_bias(b[d], folded[d])
        return np.concatenate([folded.reshape(-1), self.loop_bias(b)])

    def loop_bias(self, b: np.ndarray) -> np.ndarray:
        """The part of B the C loop reads, every direction's (stored after the folded bias)."""
        return np.zeros(0, b.dtype)

    def packed_weights(self) -> list[tuple[int, str, Callable[[np.ndarray], np.ndarray]]]:
        """How the packed op's three weights derive from its inputs, in its input order: (source
        input, suffix of the source's name, derive); the sources are PACKED_SOURCES."""
        op = self.ctx.op_type.lower()
        how = [(f"__{op}_strips", pack_input_weights), (f"__{op}_bias{self.bias_tag()}", self.fold_bias),
               (f"__{op}_panels", lambda r: pack_recurrence(r, self.panel_groups()))]
        return [(source, suffix, derive) for source, (suffix, derive) in zip(PACKED_SOURCES, how)]

    def bias_tag(self) -> str:
        """What tells this op's folded bias from another fold of the same B."""
        return ""

    def loop_bias_in(self, b: np.ndarray | None) -> np.ndarray | None:
        """The part of B (as given: a view, each direction's `loop_flags` apart) the C loop reads;
        None when B is absent or the loop reads none of it."""
        return None

    def loop_arrays(self, inputs: list, loop_bias: np.ndarray | None) -> tuple:
        """The arrays the C loop reads between R and the outputs, in its arguments' order; `loop_bias`
        is the part of B it reads, in B (loop_bias_in) or after the folded bias (fold_bias)."""
        return ()

    def loop_flags(self, packed: bool = False) -> tuple:
        """The C loop's integer arguments after `reverse`, before `threads` (of its packed form when
        `packed`)."""
        return ()

    def workspace(self) -> int:
        numpy_path = carve_size(*self.specs)
        if not self.native_case:
            return numpy_path
        return max(numpy_path, carve_size(self.specs[0], self.work_spec))

    def bounded(self, a: np.ndarray) -> np.ndarray:
        """Clip an activation's input to [-clip, clip] in place when the clip attribute is set."""
        if self.clip is not None:
            np.clip(a, -self.clip, self.clip, out=a)
        return a

    def add_input_bias(self, b: np.ndarray, proj: np.ndarray) -> None:
        """Add the bias folded into the input projection, Wb + Rb, to one direction's `proj` in
        place (no array is made per run)."""
        half = b.shape[0] // 2
        np.add(proj, b[:half], out=proj)
        np.add(proj, b[half:], out=proj)

    def direction(self, inputs: Sequence[np.ndarray | None], d: int) -> tuple:
        """What the cell needs for direction d besides R (biases kept out of the projection, P)."""
        return ()

    def cell(self, d: int, xp: np.ndarray, states: list[np.ndarray], rt: np.ndarray, extra: tuple,
             scratch: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        """One time step: the new states (views of scratch) from the projected input `xp`."""
        raise NotImplementedError

    def _state_view(self, a: np.ndarray | None, d: int) -> np.ndarray | None:
        if a is None:
            return None
        return a[:, d] if self.layout else a[d]

    def project(self, xs: np.ndarray, w: np.ndarray, b: np.ndarray | None, proj: np.ndarray) -> None:
        """proj = X W^T + the input biases, every direction's gates side by side: one product for
        the whole sequence and both directions (of two 2-d matrices when X allows: numpy would
        take a stack of them one by one)."""
        wt = w.reshape(-1, w.shape[-1]).T
        if xs.flags.c_contiguous and self.product is not None:
            self.product(xs.reshape(-1, xs.shape[-1]), wt, proj.reshape(-1, proj.shape[-1]), None)
        elif xs.flags.c_contiguous:
            np.matmul(xs.reshape(-1, xs.shape[-1]), wt, out=proj.reshape(-1, proj.shape[-1]))
        else:
            np.matmul(xs, wt, out=proj)
        if b is not None:
            width = proj.shape[-1] // self.dirs
            for d in range(self.dirs):
                self.add_input_bias(b[d], proj[..., d * width:(d + 1) * width])

    def run(self, inputs, outputs, workspace):
        inputs = list(inputs) + [None] * (8 - len(inputs))
        outputs = list(outputs) + [None] * (1 + self.states - len(outputs))
        x, w, _, b, lens = inputs[:5]
        proj = carve(workspace, self.specs[0])[0]
        self.project(x.swapaxes(0, 1) if self.layout else x, w, b, proj)
        seq = proj.shape[0]
        masks = None
        if lens is not None and (np.asarray(lens) < seq).any():
            masks = (np.arange(seq)[:, None] < np.asarray(lens)[None, :])[:, :, None]
        if masks is not None or not self.recur_native(inputs, outputs, proj, workspace):
            self.recur(inputs, outputs, proj, masks, workspace)

    def recur_native(self, inputs: list, outputs: list, proj: np.ndarray, workspace: np.ndarray | None) -> bool:
        """The time loop of every direction in C, when this kernel has it for this layer and the
        arrays fit; False when it did not run (the numpy loop then does)."""
        if self.native_loop is None:
            return False
        r, arrays = inputs[2], self.loop_arrays(inputs, self.loop_bias_in(inputs[3]))
        if not all(a is None or a.flags.c_contiguous for a in (r, *arrays, *outputs)):
            return False
        work = carve(workspace, self.specs[0], self.work_spec)[1]
        seq, batch = proj.shape[:2]
        self.native_loop(proj, r, *arrays, *outputs, work, self.dirs, seq, batch, self.hidden, self.layout,
                         int(self.backward[0]), *self.loop_flags(),
                         parallel.native_threads(self.flops, slots=self.slots))
        return True

    def recur(self, inputs: list, outputs: list, proj: np.ndarray, masks: np.ndarray | None,
              workspace: np.ndarray | None) -> None:
        """The time loop of every direction, one numpy cell per step; past a batch entry's length
        (`masks`, seq x batch x 1) its state stays and its Y rows are 0."""
        r = inputs[2]
        initial = inputs[5:5 + self.states]
        _, *rest = carve(workspace, *self.specs)
        states, scratch = rest[:self.states], rest[self.states:]
        y = outputs[0]
        seq, width = proj.shape[0], proj.shape[2] // self.dirs
        for d in range(self.dirs):
            for s, init in zip(states, initial):
                if init is None:
                    s.fill(0)
                else:
                    np.copyto(s, self._state_view(init, d))
            rt = r[d].T
            extra = self.direction(inputs, d)
            steps = range(seq - 1, -1, -1) if self.backward[d] else range(seq)
            for t in steps:
                new = self.cell(d, proj[t, :, d * width:(d + 1) * width], states, rt, extra, scratch)
                mask = None if masks is None else masks[t]
                for s, n in zip(states, new):
                    np.copyto(s, n, where=True if mask is None else mask)
                if y is not None:
                    dst = y[:, t, d] if self.layout else y[t, d]
                    if mask is None:
                        np.copyto(dst, states[0])
                    else:
                        np.multiply(states[0], mask, out=dst)
            for s, out in zip(states, outputs[1:]):
                if out is not None:
                    np.copyto(self._state_view(out, d), s)


@register("RNN", since=7)
class RNN(_Recurrent):
    """Ht = f(Xt W^T + Ht-1 R^T + Wb + Rb)."""

    gates = 1
    default_activations = ("Tanh",)
    scratch = (1,)

    def cell(self, d, xp, states, rt, extra, scratch):
        (pre,) = scratch
        np.matmul(states[0], rt, out=pre)
        np.add(pre, xp, out=pre)
        self.acts[d][0](self.bounded(pre))
        return (pre,)


@register("GRU", since=7)
class GRU(_Recurrent):
    """Gates z, r and candidate h; linear_before_reset applies r after the recurrence product.

    Spec: ht = g(Xt Wh^T + (rt (.) Ht-1) Rh^T + Rbh + Wbh) by default, and
    ht = g(Xt Wh^T + (rt (.) (Ht-1 Rh^T + Rbh)) + Wbh) when linear_before_reset != 0;
    Ht = (1 - zt) (.) ht + zt (.) Ht-1.
    """

    gates = 3
    default_activations = ("Sigmoid", "Tanh")
    scratch = (2, 1, 1)
    native_units = ("recurrent", "linalg")
    native_function = NATIVE_GRU

    def panel_groups(self):
        """The update and reset rows, then the candidate rows: without linear_before_reset the
        candidate's product waits for the reset gate."""
        return 2 * self.hidden, self.hidden

    def loop_bias(self, b):
        """Rbh, which the C loop adds to R_h h with linear_before_reset (add_input_bias leaves it
        out of the projection then)."""
        return b[:, 5 * self.hidden:].reshape(-1)

    def bias_tag(self):
        return "_lbr" if self.ctx.attr("linear_before_reset", 0) else ""

    def loop_bias_in(self, b):
        return None if b is None else b.reshape(-1)[5 * self.hidden:]

    def loop_arrays(self, inputs, loop_bias):
        return loop_bias, inputs[5]

    def loop_flags(self, packed=False):
        """linear_before_reset, and how far apart each direction's Rbh is: in B, or after the
        folded bias (fold_bias)."""
        return int(bool(self.ctx.attr("linear_before_reset", 0))), self.hidden if packed else 6 * self.hidden

    def add_input_bias(self, b, proj):
        h = self.hidden
        np.add(proj, b[:3 * h], out=proj)
        np.add(proj[..., :2 * h], b[3 * h:5 * h], out=proj[..., :2 * h])
        if not self.ctx.attr("linear_before_reset", 0):
            np.add(proj[..., 2 * h:], b[5 * h:], out=proj[..., 2 * h:])

    def direction(self, inputs, d):
        b = inputs[3]
        lbr = bool(self.ctx.attr("linear_before_reset", 0))
        return (lbr, b[d, 5 * self.hidden:] if lbr and b is not None else None)

    def cell(self, d, xp, states, rt, extra, scratch):
        lbr, rbh = extra
        h = self.hidden
        zr, cand, tmp = scratch
        prev = states[0]
        np.matmul(prev, rt[:, :2 * h], out=zr)
        np.add(zr, xp[:, :2 * h], out=zr)
        f, g = self.acts[d]
        f(self.bounded(zr))
        z, reset = zr[:, :h], zr[:, h:]
        if lbr:
            np.matmul(prev, rt[:, 2 * h:], out=cand)
            if rbh is not None:
                np.add(cand, rbh, out=cand)
            np.multiply(cand, reset, out=cand)
        else:
            np.multiply(reset, prev, out=tmp)
            np.matmul(tmp, rt[:, 2 * h:], out=cand)
        np.add(cand, xp[:, 2 * h:], out=cand)
        g(self.bounded(cand))
        np.multiply(z, prev, out=tmp)
        np.subtract(1, z, out=z)
        np.multiply(z, cand, out=z)
        np.add(z, tmp, out=z)
        return (z,)


@register("LSTM", since=7)
class LSTM(_Recurrent):
    """Gates i, o, f and cell c with optional peepholes P[iof]; input_forget couples f = 1 - i.

    Spec: it = f(Xt Wi^T + Ht-1 Ri^T + Pi (.) Ct-1 + Wbi + Rbi), ft likewise with Pf,
    ct = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc), Ct = ft (.) Ct-1 + it (.) ct,
    ot = f(Xt Wo^T + Ht-1 Ro^T + Po (.) Ct + Wbo + Rbo), Ht = ot (.) h(Ct).
    The clip bounds the inputs of f and g (the gates), not the cell state.
    """

    gates = 4
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    states = 2
    scratch = (4, 1, 1)
    native_units = ("recurrent", "linalg")
    native_function = NATIVE_LSTM

    def native_takes(self) -> bool:
        """No coupled input and forget gates."""
        return not self.ctx.attr("input_forget", 0)

    def loop_arrays(self, inputs, loop_bias):
        return inputs[7], inputs[5], inputs[6]

    def direction(self, inputs, d):
        p = inputs[7]
        h = self.hidden
        return None if p is None else (p[d, :h], p[d, h:2 * h], p[d, 2 * h:])

    def cell(self, d, xp, states, rt, extra, scratch):
        h = self.hidden
        gates, cell, tmp = scratch
        prev_h, prev_c = states
        np.matmul(prev_h, rt, out=gates)
        np.add(gates, xp, out=gates)
        i, o, f, c = gates[:, :h], gates[:, h:2 * h], gates[:, 2 * h:3 * h], gates[:, 3 * h:]
        act_f, act_g, act_h = self.acts[d]
        if extra is not None:
            p_i, p_o, p_f = extra
            np.add(i, np.multiply(p_i, prev_c, out=tmp), out=i)
            np.add(f, np.multiply(p_f, prev_c, out=tmp), out=f)
        act_f(self.bounded(i))
        if self.ctx.attr("input_forget", 0):
            np.subtract(1, i, out=f)
        else:
            act_f(self.bounded(f))
        act_g(self.bounded(c))
        np.multiply(f, prev_c, out=cell)
        np.add(cell, np.multiply(i, c, out=tmp), out=cell)
        if extra is not None:
            np.add(o, np.multiply(p_o, cell, out=tmp), out=o)
        act_f(self.bounded(o))
        np.copyto(tmp, cell)
        act_h(tmp)
        np.multiply(tmp, o, out=tmp)
        return tmp, cell


def pack_input_weights(w: np.ndarray) -> np.ndarray:
    """W (dirs, gates x h, input) as the strips of omrt's GEMM read W^T (input, dirs x gates x h):
    every direction's gates side by side, as the projection writes them."""
    return packed.pack_strips(np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T))


def _panels(r: np.ndarray) -> np.ndarray:
    """R's rows (dirs, rows, h) in panels (dirs, ceil(rows / PANEL), h, PANEL), zero past the last."""
    dirs, rows, hidden = r.shape
    padded = np.zeros((dirs, -(-rows // PANEL) * PANEL, hidden), r.dtype)
    padded[:, :rows] = r
    return padded.reshape(dirs, -1, PANEL, hidden).transpose(0, 1, 3, 2)


def pack_recurrence(r: np.ndarray, groups: Sequence[int] | None = None) -> np.ndarray:
    """R (dirs, G, h) as the C time loop's panels (dirs, panels, h, PANEL): element [d, p, k, l] is
    R[d, PANEL p + l, k], zero past the last row; with `groups` (row counts: a GRU's update and
    reset rows, then its candidate rows) each group in panels of its own."""
    bounds = np.cumsum([0, *(groups or (r.shape[1],))])
    return np.ascontiguousarray(np.concatenate([_panels(r[:, a:b]) for a, b in zip(bounds, bounds[1:])], axis=1))


def packable(op_type: str, attrs: dict, inputs: Sequence[TensorInfo | None]) -> "_Recurrent | None":
    """The LSTM or GRU kernel (`op_type`) over these inputs (X, W, R, B, sequence_lens, ... as
    infos) when it can run packed (PackedLSTM, PackedGRU), else None: the C time loop's case,
    every sequence full length (no sequence_lens), X's rows one matrix in time order (layout 0,
    or a batch of one), and enough of them for the GEMM's panels. Its packed_weights say how
    the packed weights derive."""
    x = inputs[0]
    if (len(inputs) > 4 and inputs[4] is not None) or x is None or not x.static or x.rank != 3:
        return None
    cls = {"LSTM": LSTM, "GRU": GRU}[op_type]
    ctx = OpContext(attrs, 14, "packable", op_type, n_outputs=1 + cls.states)
    kernel = cls(ctx, inputs, cls.infer(ctx, inputs))
    seq, batch = kernel.specs[0][0][:2]
    fits = kernel.native_case and (not kernel.layout or batch == 1) and seq * batch >= packed.MIN_ROWS
    return kernel if fits else None


def _derived_after(own_inputs: int) -> tuple[tuple[int, int], ...]:
    """A packed op's `derived` pairs: its derived weights follow its `own_inputs` inputs."""
    return tuple((own_inputs + i, source) for i, source in enumerate(PACKED_SOURCES))


class _PackedRecurrence:
    """An LSTM or GRU (its own inputs, absent ones "") followed by the weights the compiler derived
    (the op's packed_weights): pack_input_weights(W), its fold_bias(B) (or "" without B) and
    pack_recurrence(R), in the case `packable` takes. The projection runs on omrt's GEMM over W's
    strips with the bias in its epilogue, the time loop over R's panels. Without the native
    library (or its vector tile) it runs as the op it was."""

    own_inputs: ClassVar[int]
    packed_function: ClassVar[Function]
    derived_call = "native_packed"

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs[:self.own_inputs], outputs)
        self.inputs = list(inputs)
        seq, batch, columns = self.specs[0][0]
        self.rows, self.depth, self.columns = seq * batch, inputs[0].shape[-1], columns
        self.panels_spec = ((-(-self.rows // packed.PANEL) * packed.PANEL * self.depth,), np.dtype(np.float32))
        self.states_spec = ((self.dirs * batch * (2 * self.hidden + self.panel_rows()),), np.dtype(np.float32))
        """A's panels for the GEMM, then each direction's states and gates for the time loop."""
        library = ctx.native
        gemm = library.get(PMATMUL) if library is not None else None
        usable = (gemm is not None and self.native_loop is not None and packed.gemm_tile(library) > 0
                  and self.rows >= packed.MIN_ROWS)
        self.native_packed = gemm if usable else None
        self.native_recurrence = library.get(self.packed_function) if usable else None

    def workspace(self) -> int:
        return max(super().workspace(), carve_size(self.specs[0], self.panels_spec, self.states_spec))

    def bind(self, inputs, outputs, workspace):
        if self.native_packed is None:
            return None
        own = self.own_inputs
        inputs = list(inputs) + [None] * (own + 3 - len(inputs))
        x, (strips, bias, panels) = inputs[0], inputs[own:own + 3]
        arrays = self.loop_arrays(inputs, None if bias is None else bias[self.columns:])
        outputs = list(outputs) + [None] * (1 + self.states - len(outputs))
        if not all(a is None or a.flags.c_contiguous for a in (x, strips, bias, panels, *arrays, *outputs)):
            return None
        proj, a_panels, work = carve(workspace, self.specs[0], self.panels_spec, self.states_spec)
        m, n, k = self.rows, self.columns, self.depth
        project = self.native_packed.bind(x.reshape(m, k), strips, None if bias is None else bias[:n],
                                          proj.reshape(m, n), a_panels, m, n, k, k, n, n, m * n,
                                          parallel.native_threads(2 * m * n * k), *activation_code({}))
        seq, batch = proj.shape[:2]
        recur = self.native_recurrence.bind(proj, panels, *arrays, *outputs, work, self.dirs, seq, batch,
                                            self.hidden, self.layout, int(self.backward[0]),
                                            *self.loop_flags(packed=True),
                                            parallel.native_threads(self.flops, slots=self.slots))
        return [project, recur]

    def run(self, inputs, outputs, workspace):
        if not run_bound(self.bind(inputs, outputs, workspace)):
            super().run(inputs[:self.own_inputs], outputs, workspace)


@register("PackedLSTM", since=1, domain="omrt")
class PackedLSTM(_PackedRecurrence, LSTM):
    """An LSTM's eight inputs, then its three packed weights (see _PackedRecurrence)."""

    own_inputs = 8
    derived = _derived_after(own_inputs)
    packed_function = LSTM_PACKED


@register("PackedGRU", since=1, domain="omrt")
class PackedGRU(_PackedRecurrence, GRU):
    """A GRU's six inputs, then its three packed weights (see _PackedRecurrence)."""

    own_inputs = 6
    derived = _derived_after(own_inputs)
    packed_function = GRU_PACKED


PACKED: dict[str, type[_PackedRecurrence]] = {"LSTM": PackedLSTM, "GRU": PackedGRU}
"""The packed kernel of each recurrent op the compiler packs."""
