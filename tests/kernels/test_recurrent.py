"""RNN, GRU and LSTM against onnx.reference, and against onnxruntime for what the reference ignores
(sequence_lens, activations and their alpha/beta, clip, input_forget)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
import onnx
from onnx import helper

import omrt
import omrt.kernels.recurrent  # noqa: F401  (registers the family before the library lists it)
from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup, packed, parallel, recurrent
from omrt.zoo import scaled_error
from tests.kernel_check import check, reference, run_kernel

rng = np.random.default_rng(0)

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}

TOLERANCE = 1e-4
"""Scaled error (relative to the largest output) between the C loops, the numpy path and
onnx.reference over the random shapes below: float32 gates summed over up to 80 terms, through up
to 12 steps, in whatever order BLAS or the tile takes them, against outputs that may be a tenth of
the gates' scale. 1e-5 failed a reverse LSTM (8 steps, 36 inputs, 3 hidden) at 1.3e-5 against the
numpy path on one call and held on the next; a wrong gate or bias is off by 1e-2 or more."""


def make_inputs(op, seq=4, batch=3, inp=5, hidden=4, dirs=1, layout=0, bias=True, initial=True,
                peepholes=False, lens=None, dtype=np.float32):
    """X, W, R, B, sequence_lens, initial_h (, initial_c, P) for an op, absent ones as None."""
    g = GATES[op]
    x_shape = (batch, seq, inp) if layout else (seq, batch, inp)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    ins = [rng.standard_normal(x_shape), rng.standard_normal((dirs, g * hidden, inp)) * 0.5,
           rng.standard_normal((dirs, g * hidden, hidden)) * 0.5,
           rng.standard_normal((dirs, 2 * g * hidden)) * 0.3 if bias else None,
           None if lens is None else np.array(lens, np.int32),
           rng.standard_normal(state) if initial else None]
    if op == "LSTM":
        ins += [rng.standard_normal(state) if initial else None,
                rng.standard_normal((dirs, 3 * hidden)) * 0.5 if peepholes else None]
    ins = [a if a is None or a.dtype.kind == "i" else a.astype(dtype) for a in ins]
    while ins[-1] is None:
        ins.pop()
    return ins


def attrs_for(direction, hidden=4, **extra):
    return {"direction": direction, "hidden_size": hidden, **extra}


def n_out(op):
    return 3 if op == "LSTM" else 2


def ort_run(op, inputs, attrs, opset=14):
    """onnxruntime's outputs for one recurrent node."""
    ort = pytest.importorskip("onnxruntime")
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    outs = [f"y{i}" for i in range(n_out(op))]
    node = helper.make_node(op, names, outs, **attrs)
    g_in = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
            for n, x in zip(names, inputs) if x is not None]
    g_out = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(inputs[0].dtype), None)
             for n in outs]
    model = helper.make_model(helper.make_graph([node], "g", g_in, g_out),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: x for n, x in zip(names, inputs) if x is not None})


def compare_ort(op, inputs, attrs, rtol=1e-4, atol=1e-5):
    got = run_kernel(op, inputs, attrs, opset=14)
    want = ort_run(op, inputs, attrs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=op)
    return got


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(op, direction, layout):
    dirs = 2 if direction == "bidirectional" else 1
    ins = make_inputs(op, dirs=dirs, layout=layout)
    check(op, ins, attrs_for(direction, layout=layout), opset=14, n_outputs=n_out(op),
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_defaults_without_bias_and_initial_state_opset7(op):
    ins = make_inputs(op, bias=False, initial=False)
    check(op, ins, attrs_for("forward"), opset=7, n_outputs=n_out(op), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_float64_and_single_step(op):
    ins = make_inputs(op, seq=1, batch=1, dtype=np.float64)
    check(op, ins, attrs_for("forward"), n_outputs=n_out(op), rtol=1e-10, atol=1e-12)


def test_gru_linear_before_reset():
    for direction, dirs in (("forward", 1), ("bidirectional", 2)):
        ins = make_inputs("GRU", dirs=dirs)
        check("GRU", ins, attrs_for(direction, linear_before_reset=1), n_outputs=2, rtol=1e-4, atol=1e-5)


def test_lstm_peepholes():
    ins = make_inputs("LSTM", dirs=2, peepholes=True)
    check("LSTM", ins, attrs_for("bidirectional"), n_outputs=3, rtol=1e-4, atol=1e-5)


def test_empty_sequence_keeps_initial_state():
    ins = make_inputs("LSTM", seq=0)
    y, yh, yc = run_kernel("LSTM", ins, attrs_for("forward"))
    assert y.shape == (0, 1, 3, 4)
    np.testing.assert_array_equal(yh, ins[5])
    np.testing.assert_array_equal(yc, ins[6])


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens(op, direction):
    dirs = 2 if direction == "bidirectional" else 1
    ins = make_inputs(op, seq=5, batch=4, dirs=dirs, lens=[5, 2, 1, 3])
    y = compare_ort(op, ins, attrs_for(direction))[0]
    assert not y[2:, :, 1].any() and not y[1:, :, 2].any()


@pytest.mark.parametrize("op,activations,alpha,beta", [
    ("RNN", ["Relu"], None, None),
    ("RNN", ["LeakyRelu"], [0.2], None),
    ("RNN", ["ThresholdedRelu"], [0.3], None),
    ("RNN", ["Affine"], [0.5], [0.1]),
    ("RNN", ["Softsign"], None, None),
    ("RNN", ["Softplus"], None, None),
    ("RNN", ["Elu"], [0.7], None),
    ("RNN", ["Sigmoid"], None, None),
    ("GRU", ["HardSigmoid", "ScaledTanh"], [0.3, 1.5], [0.4, 0.8]),
    ("GRU", ["Sigmoid", "Relu"], None, None),
    ("LSTM", ["HardSigmoid", "Tanh", "Softsign"], [0.25], [0.45]),
    ("LSTM", ["Sigmoid", "Elu", "LeakyRelu"], [0.9, 0.05], None),
])
def test_activations(op, activations, alpha, beta):
    attrs = attrs_for("forward", activations=activations)
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    compare_ort(op, make_inputs(op), attrs)


def test_bidirectional_activations_per_direction():
    attrs = attrs_for("bidirectional", activations=["Sigmoid", "Tanh", "Sigmoid", "Relu"])
    compare_ort("GRU", make_inputs("GRU", dirs=2), attrs)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_clip(op):
    ins = make_inputs(op, dirs=2)
    ins[0] = ins[0] * 10
    compare_ort(op, ins, attrs_for("bidirectional", clip=0.5))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_one_hidden_unit_over_a_batch(op):
    """Each gate a column of the gates' scratch, 4 floats apart for an LSTM, which numpy's
    in-place negative misreads."""
    ins = make_inputs(op, seq=3, batch=3, hidden=1, dirs=2)
    for g, w in zip(run_kernel(op, ins, attrs_for("bidirectional", 1)),
                    reference(op, ins, attrs_for("bidirectional", 1), opset=14, n_outputs=n_out(op))):
        assert scaled_error(g, w) < 1e-5


def test_lstm_input_forget_with_peepholes():
    compare_ort("LSTM", make_inputs("LSTM", peepholes=True), attrs_for("forward", input_forget=1))


def run_recurrent(op, ins, attrs, present=None, native=None) -> list[np.ndarray | None]:
    """The kernel's outputs, with only the `present` ones (default: all) handed to it (None for
    the others)."""
    kernel_cls = lookup(op, 14)
    ctx = OpContext(attrs, 14, "test", op, n_outputs=n_out(op), native=native)
    infos = [None if a is None else TensorInfo(a.dtype, a.shape) for a in ins]
    outs = kernel_cls.infer(ctx, infos)
    kernel = kernel_cls(ctx, infos, outs)
    ws = np.empty(kernel.workspace(), np.uint8)
    present = present or (True,) * len(outs)
    results = [np.full(o.shape, np.nan, o.dtype) if p else None for o, p in zip(outs, present)]
    kernel.run(ins, results, ws)
    return results


def run_lstm(ins, attrs, present=(True, True, True), native=None) -> list[np.ndarray | None]:
    """The LSTM kernel's outputs, with only the `present` ones handed to it (None for the others)."""
    return run_recurrent("LSTM", ins, attrs, present, native)


def test_optional_outputs_may_be_missing():
    ins = make_inputs("LSTM")
    full = run_kernel("LSTM", ins, attrs_for("forward"))
    _, yh, _ = run_lstm(ins, attrs_for("forward"), present=(False, True, False))
    np.testing.assert_array_equal(yh, full[1])


def test_errors():
    ins = make_inputs("GRU", dirs=1)
    with pytest.raises(ShapeError, match="directions"):
        run_kernel("GRU", ins, attrs_for("bidirectional"))
    with pytest.raises(ShapeError, match="activation"):
        run_kernel("RNN", make_inputs("RNN"), attrs_for("forward", activations=["Gelu"]))
    with pytest.raises(ShapeError, match="rows"):
        run_kernel("LSTM", make_inputs("LSTM"), attrs_for("forward", hidden=5))


def test_empty_batch():
    y, yh = run_kernel("GRU", make_inputs("GRU", batch=0), attrs_for("forward"))
    assert y.shape == (4, 1, 0, 4) and yh.shape == (1, 0, 4)


# ------------------------------------------------------------------ LSTM's native time loop

NATIVE = "omrt_lstm_f32"


@pytest.fixture
def threads(request):
    """Run at request.param threads, splitting even the small layers of these tests."""
    omrt.set_num_threads(request.param)
    patch = pytest.MonkeyPatch()
    patch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)
    yield request.param
    patch.undo()


def native_agrees(native, ins, attrs, present=(True, True, True), ran=True, op="LSTM") -> list[np.ndarray | None]:
    """The native kernel's outputs, asserted to match the numpy path's and onnx.reference's to
    float32 rounding (whatever order the sums take), and to come from the C loop when `ran`."""
    loop = {"LSTM": NATIVE, "GRU": "omrt_gru_f32"}[op]
    present = present[:n_out(op)]
    before = native.calls().get(loop, 0)
    got = run_recurrent(op, ins, attrs, present, native)
    assert native.calls().get(loop, 0) == before + ran
    numpy_path = run_recurrent(op, ins, attrs, present)
    want = reference(op, ins, attrs, opset=14, n_outputs=n_out(op))
    for g, n, w in zip(got, numpy_path, want):
        if g is not None:
            assert scaled_error(g, n) < TOLERANCE and scaled_error(g, w) < TOLERANCE, (scaled_error(g, n),
                                                                                    scaled_error(g, w))
    return got


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("batch,hidden", [(1, 1), (3, 7), (1, 128), (3, 33), (6, 20), (9, 3)])
@pytest.mark.parametrize("initial", [True, False])
def test_lstm_native_loop(native, threads, direction, batch, hidden, initial):
    dirs = 2 if direction == "bidirectional" else 1
    ins = make_inputs("LSTM", seq=6, batch=batch, inp=5, hidden=hidden, dirs=dirs, initial=initial)
    native_agrees(native, ins, attrs_for(direction, hidden))


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("batch,hidden", [(1, 1), (3, 7), (1, 70), (6, 20), (9, 33)])
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("bias,initial", [(True, True), (False, False)])
def test_gru_native_loop(native, threads, direction, batch, hidden, lbr, bias, initial):
    """Both readings of the reset gate (linear_before_reset), the candidate's rows in panels of
    their own (hidden 70: 140 update and reset rows, 70 candidate rows, each past one panel)."""
    dirs = 2 if direction == "bidirectional" else 1
    ins = make_inputs("GRU", seq=5, batch=batch, inp=6, hidden=hidden, dirs=dirs, bias=bias, initial=initial)
    native_agrees(native, ins, attrs_for(direction, hidden, linear_before_reset=lbr), op="GRU")


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("layout", [0, 1])
def test_gru_native_layouts_and_outputs(native, threads, layout):
    ins = make_inputs("GRU", batch=3, hidden=9, dirs=2, layout=layout)
    attrs = attrs_for("bidirectional", 9, layout=layout, linear_before_reset=1)
    native_agrees(native, ins, attrs, op="GRU")
    got = native_agrees(native, ins, attrs, present=(False, True), op="GRU")
    assert got[0] is None


@pytest.mark.parametrize("attrs,lens", [
    (attrs_for("bidirectional", clip=0.5), None),
    (attrs_for("forward", activations=["Sigmoid", "Relu"]), None),
    (attrs_for("bidirectional"), [5, 2, 1, 3]),
])
def test_gru_cases_the_native_loop_leaves_to_numpy(native, attrs, lens):
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    ins = make_inputs("GRU", seq=5, batch=4, dirs=dirs, lens=lens)
    before = native.calls().get("omrt_gru_f32", 0)
    got = run_recurrent("GRU", ins, attrs, native=native)
    assert native.calls().get("omrt_gru_f32", 0) == before
    for g, w in zip(got, compare_ort("GRU", ins, attrs)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("layout", [0, 1])
def test_lstm_native_peepholes_and_layouts(native, threads, layout):
    ins = make_inputs("LSTM", batch=3, hidden=9, dirs=2, layout=layout, peepholes=True)
    native_agrees(native, ins, attrs_for("bidirectional", 9, layout=layout))


@pytest.mark.parametrize("present", [(False, True, True), (False, False, True), (True, False, False)])
def test_lstm_native_without_some_outputs(native, present):
    ins = make_inputs("LSTM", dirs=2)
    got = native_agrees(native, ins, attrs_for("bidirectional"), present)
    assert [g is not None for g in got] == list(present)


def test_lstm_native_full_sequence_lens(native):
    native_agrees(native, make_inputs("LSTM", seq=5, batch=3, lens=[5, 5, 5]), attrs_for("forward"))


def test_lstm_native_empty_sequence_keeps_initial_state(native):
    ins = make_inputs("LSTM", seq=0, dirs=2)
    y, yh, yc = run_lstm(ins, attrs_for("bidirectional"), native=native)
    assert y.shape == (0, 2, 3, 4) and native.calls()[NATIVE]
    np.testing.assert_array_equal(yh, ins[5])
    np.testing.assert_array_equal(yc, ins[6])


@pytest.mark.parametrize("attrs,lens", [
    (attrs_for("bidirectional", clip=0.5), None),
    (attrs_for("forward", input_forget=1), None),
    (attrs_for("forward", activations=["Sigmoid", "Tanh", "Relu"]), None),
    (attrs_for("bidirectional"), [5, 2, 1, 3]),
])
def test_lstm_cases_the_native_loop_leaves_to_numpy(native, attrs, lens):
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    ins = make_inputs("LSTM", seq=5, batch=4, dirs=dirs, lens=lens)
    before = native.calls().get(NATIVE, 0)
    got = run_lstm(ins, attrs, native=native)
    assert native.calls().get(NATIVE, 0) == before
    for g, w in zip(got, compare_ort("LSTM", ins, attrs)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("layout", [0, 1])
def test_the_input_projection_runs_on_the_native_workers(native, threads, op, layout):
    """X @ W^T of the whole sequence is one native product when X is a matrix BLAS reads in place
    (layout 0); batch-first X (layout 1) is read as a strided stack, by numpy."""
    ins = make_inputs(op, seq=7, batch=3, inp=19, hidden=8, dirs=2, layout=layout)
    attrs = attrs_for("bidirectional", 8, layout=layout)
    before = native.calls().get("omrt_matmul_f32", 0)
    got = run_recurrent(op, ins, attrs, native=native)
    assert native.calls().get("omrt_matmul_f32", 0) == before + (layout == 0)
    for g, w in zip(got, reference(op, ins, attrs, opset=14, n_outputs=n_out(op))):
        assert scaled_error(g, w) < 1e-5


# ------------------------------------------------------------------ PackedLSTM: weights packed by the compiler

PACKED = "omrt_lstm_packed_f32"


def test_recurrence_panels_hold_sixty_four_rows_of_r_per_column_and_zeros_past_the_last():
    r = rng.standard_normal((2, 20, 5)).astype(np.float32)
    panels = recurrent.pack_recurrence(r)
    assert panels.shape == (2, 1, 5, 64) and panels.flags.c_contiguous
    np.testing.assert_array_equal(panels[:, 0, :, :20], r.transpose(0, 2, 1))
    assert not panels[:, :, :, 20:].any()
    assert recurrent.pack_recurrence(rng.standard_normal((1, 132, 33)).astype(np.float32)).shape == (1, 3, 33, 64)


def _plain(op: str, ins: list, attrs: dict):
    """The kernel of `op` over the infos of `ins`."""
    cls = lookup(op, 14)
    ctx = OpContext(attrs, 14, "t", op, n_outputs=n_out(op))
    infos = [None if a is None else TensorInfo(a.dtype, a.shape) for a in ins]
    return cls(ctx, infos, cls.infer(ctx, infos))


def test_a_grus_candidate_rows_have_panels_of_their_own_and_rbh_follows_its_folded_bias():
    r = rng.standard_normal((2, 30, 10)).astype(np.float32)
    panels = recurrent.pack_recurrence(r, (20, 10))
    assert panels.shape == (2, 2, 10, 64)
    np.testing.assert_array_equal(panels[:, 0, :, :20], r[:, :20].transpose(0, 2, 1))
    np.testing.assert_array_equal(panels[:, 1, :, :10], r[:, 20:].transpose(0, 2, 1))
    assert not panels[:, 0, :, 20:].any() and not panels[:, 1, :, 10:].any()
    ins = make_inputs("GRU", seq=8, batch=1, hidden=10, dirs=2)
    b = ins[3]
    for lbr in (False, True):
        kernel = _plain("GRU", ins, attrs_for("bidirectional", 10, linear_before_reset=int(lbr)))
        assert kernel.panel_rows() == 128
        folded = kernel.fold_bias(b)
        rbh = b[:, 50:] * (not lbr)
        np.testing.assert_array_equal(folded[:60].reshape(2, 30), b[:, :30] + np.concatenate([b[:, 30:50], rbh], 1))
        np.testing.assert_array_equal(folded[60:].reshape(2, 10), b[:, 50:])


def test_the_projection_reads_every_directions_gates_side_by_side_and_the_biases_summed():
    ins = make_inputs("LSTM", seq=8, batch=1, inp=5, hidden=4, dirs=2)
    w, b = ins[1], ins[3]
    strips = recurrent.pack_input_weights(w)
    assert strips.shape == (1, 5, 32)
    np.testing.assert_array_equal(strips[0], np.concatenate([w[0], w[1]]).T)
    kernel = _plain("LSTM", ins, attrs_for("bidirectional"))
    np.testing.assert_array_equal(kernel.fold_bias(b), np.concatenate([b[0, :16] + b[0, 16:], b[1, :16] + b[1, 16:]]))
    assert [suffix for _, suffix, _ in kernel.packed_weights()] == ["__lstm_strips", "__lstm_bias", "__lstm_panels"]


def packed_kernel(op: str, ins: list, attrs: dict, native) -> tuple[recurrent._PackedRecurrence, list]:
    """The packed kernel of `op` over `ins` (its inputs) and the inputs it reads: the op's own,
    then the weights derived as the compiler derives them (the plain kernel's packed_weights)."""
    cls = recurrent.PACKED[op]
    ins = list(ins) + [None] * (cls.own_inputs - len(ins))
    plain = recurrent.packable(op, attrs, [None if a is None else TensorInfo(a.dtype, a.shape) for a in ins])
    assert plain is not None
    ins += [None if ins[source] is None else derive(ins[source]) for source, _, derive in plain.packed_weights()]
    ctx = OpContext(attrs, 1, "t", f"Packed{op}", n_outputs=n_out(op), native=native)
    infos = [None if a is None else TensorInfo(a.dtype, a.shape) for a in ins]
    return cls(ctx, infos, cls.infer(ctx, infos)), ins


def run_packed(kernel: recurrent._PackedRecurrence, ins: list, present=(True, True, True)) -> list:
    """The kernel's outputs (NaN before, so every float must be written) over a workspace of
    garbage."""
    outs = [np.full(o.shape, np.nan, o.dtype) if p else None for o, p in zip(kernel.outputs, present)]
    kernel.run(ins, outs, np.full(kernel.workspace(), 0xCD, np.uint8))
    return outs


LOOPS = {"LSTM": (PACKED, NATIVE), "GRU": ("omrt_gru_packed_f32", "omrt_gru_f32")}
"""Each packed op's C loops: over R's panels as the compiler packed them, over R as it is."""


@pytest.mark.parametrize("threads", [1, 2], indirect=True)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["LSTM", "GRU"]), direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
       seq=st.integers(1, 12), batch=st.integers(1, 9), inp=st.integers(1, 40), hidden=st.integers(1, 40),
       layout=st.integers(0, 1), bias=st.booleans(), initial=st.booleans(), peepholes=st.booleans(),
       lbr=st.booleans(), present=st.sampled_from([(True, True, True), (False, True, True), (True, False, False)]))
def test_packed_recurrences_match_the_ops_they_were(native, threads, op, direction, seq, batch, inp, hidden, layout,
                                                    bias, initial, peepholes, lbr, present):
    """Over any shape the compiler packs, on omrt's GEMM and the time loop over packed R when the
    CPU has the vector tile (else as the op it was): the numpy path's and onnx.reference's
    outputs to float32 rounding."""
    batch = 1 if layout else batch
    dirs = 2 if direction == "bidirectional" else 1
    assume(seq * batch >= packed.MIN_ROWS)
    ins = make_inputs(op, seq, batch, inp, hidden, dirs, layout, bias, initial, peepholes and op == "LSTM")
    attrs = attrs_for(direction, hidden, layout=layout, **({"linear_before_reset": int(lbr)} if op == "GRU" else {}))
    present = present[:n_out(op)]
    kernel, packed_ins = packed_kernel(op, ins, attrs, native)
    calls = native.calls()
    got = run_packed(kernel, packed_ins, present)
    tile = packed.gemm_tile(native) > 0
    assert [native.calls().get(f, 0) - calls.get(f, 0) for f in (*LOOPS[op], "omrt_pmatmul_f32")] == \
        ([1, 0, 1] if tile else [0, 1, 0])
    want = reference(op, ins, attrs, opset=14, n_outputs=n_out(op))
    for g, n, w in zip(got, run_recurrent(op, ins, attrs, present), want):
        assert (g is None) == (n is None)
        if g is not None:
            assert scaled_error(g, n) < TOLERANCE and scaled_error(g, w) < TOLERANCE, (scaled_error(g, n),
                                                                                    scaled_error(g, w))


@pytest.mark.parametrize("op,attrs,lens,layout_batch,seq,dtype", [
    ("LSTM", attrs_for("bidirectional", clip=0.5), None, None, 8, np.float32),
    ("LSTM", attrs_for("forward", input_forget=1), None, None, 8, np.float32),
    ("LSTM", attrs_for("forward", activations=["Sigmoid", "Tanh", "Relu"]), None, None, 8, np.float32),
    ("LSTM", attrs_for("forward"), [8, 8, 8, 8], None, 8, np.float32),
    ("LSTM", attrs_for("forward", layout=1), None, 4, 8, np.float32),
    ("LSTM", attrs_for("forward"), None, None, 1, np.float32),
    ("LSTM", attrs_for("forward"), None, None, 8, np.float64),
    ("GRU", attrs_for("bidirectional", clip=0.5), None, None, 8, np.float32),
    ("GRU", attrs_for("forward", activations=["Sigmoid", "Relu"]), None, None, 8, np.float32),
    ("GRU", attrs_for("reverse"), [8, 8, 8, 8], None, 8, np.float32),
    ("GRU", attrs_for("forward", layout=1), None, 4, 8, np.float32),
    ("GRU", attrs_for("forward"), None, None, 8, np.float64),
])
def test_only_layers_the_c_loop_takes_whole_in_time_order_with_enough_rows_are_packed(op, attrs, lens, layout_batch,
                                                                                      seq, dtype):
    ins = make_inputs(op, seq=seq, batch=layout_batch or 4, dirs=2 if attrs["direction"] == "bidirectional" else 1,
                      layout=attrs.get("layout", 0), lens=lens, dtype=dtype)
    infos = [None if a is None else TensorInfo(a.dtype, a.shape) for a in ins]
    assert recurrent.packable(op, attrs, infos) is None
    x = TensorInfo(np.float32, (1, 8, 5) if attrs.get("layout") else (8, 4, 5))  # the same layer, packable
    weights = [TensorInfo(np.float32, i.shape) for i in infos[1:4]]
    assert recurrent.packable(op, attrs_for(attrs["direction"], layout=attrs.get("layout", 0)), [x] + weights)


def _lstm_model(seq: int = 10, inp: int = 12, hidden: int = 9) -> onnx.ModelProto:
    """A bidirectional LSTM with peepholes and a bias over constant weights, then a second LSTM
    without bias reading the first one's Y as its input: both packed by the compiler."""
    from onnx import TensorProto, numpy_helper

    r = np.random.default_rng(5)
    weights = {"w": r.standard_normal((2, 4 * hidden, inp)) / 3, "r": r.standard_normal((2, 4 * hidden, hidden)) / 3,
               "b": r.standard_normal((2, 8 * hidden)) / 3, "p": r.standard_normal((2, 3 * hidden)) / 3,
               "w2": r.standard_normal((1, 4 * hidden, 2 * hidden)) / 3,
               "r2": r.standard_normal((1, 4 * hidden, hidden)) / 3}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    nodes = [helper.make_node("LSTM", ["x", "w", "r", "b", "", "", "", "p"], ["y", "yh"], direction="bidirectional",
                              hidden_size=hidden),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "shape"], ["y2"]),
             helper.make_node("LSTM", ["y2", "w2", "r2"], ["z", "zh", "zc"], hidden_size=hidden)]
    inits.append(numpy_helper.from_array(np.array([seq, 1, 2 * hidden], np.int64), "shape"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, inp])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("yh", "z", "zc")],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def _gru_model(seq: int = 10, inp: int = 12, hidden: int = 9) -> onnx.ModelProto:
    """A bidirectional GRU with a bias and linear_before_reset (as PyTorch exports them), then a
    GRU without either reading the first one's Y: both packed by the compiler."""
    from onnx import TensorProto, numpy_helper

    r = np.random.default_rng(6)
    weights = {"w": r.standard_normal((2, 3 * hidden, inp)) / 3, "r": r.standard_normal((2, 3 * hidden, hidden)) / 3,
               "b": r.standard_normal((2, 6 * hidden)) / 3, "w2": r.standard_normal((1, 3 * hidden, 2 * hidden)) / 3,
               "r2": r.standard_normal((1, 3 * hidden, hidden)) / 3}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    inits.append(numpy_helper.from_array(np.array([seq, 1, 2 * hidden], np.int64), "shape"))
    nodes = [helper.make_node("GRU", ["x", "w", "r", "b"], ["y", "yh"], direction="bidirectional", hidden_size=hidden,
                              linear_before_reset=1),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "shape"], ["y2"]),
             helper.make_node("GRU", ["y2", "w2", "r2"], ["z", "zh"], hidden_size=hidden)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, inp])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("yh", "z")],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def reference_model(model: onnx.ModelProto, feeds: dict) -> dict:
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in model.graph.output]
    return dict(zip(names, ReferenceEvaluator(model).run(names, feeds)))


COMPILED = {"LSTM": (_lstm_model, ["w__lstm_strips", "b__lstm_bias", "r__lstm_panels"],
                     ["w2__lstm_strips", "", "r2__lstm_panels"]),
            "GRU": (_gru_model, ["w__gru_strips", "b__gru_bias_lbr", "r__gru_panels"],
                    ["w2__gru_strips", "", "r2__gru_panels"])}
"""Each packed op's two-layer model, and the weights its two layers read past their own inputs."""


@pytest.fixture(scope="module", params=sorted(COMPILED))
def compiled(request, tmp_path_factory, native) -> tuple[str, str]:
    """(op, path of its two-layer model compiled)."""
    path = str(tmp_path_factory.mktemp("recurrent") / f"{request.param}.om")
    omrt.compile(COMPILED[request.param][0](), path, progress=None)
    return request.param, path


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((10, 1, 12)).astype(np.float32)


def test_a_compiled_recurrence_reads_its_weights_as_packed_and_agrees_untrusted(compiled):
    op, path = compiled
    build, first, second = COMPILED[op]
    model = omrt.load(path, trust_kernels=True)
    layers = [n for n in model.graph.nodes if op in n.op_type]
    assert [(n.op_type, n.domain) for n in layers] == [(f"Packed{op}", "omrt")] * 2
    own = recurrent.PACKED[op].own_inputs
    assert layers[0].inputs[own:] == first and layers[1].inputs[own:] == second
    want = reference_model(build(), {"x": _x()})
    for got in (model.session().run({"x": _x()}), omrt.load(path).session().run({"x": _x()})):
        for name, w in want.items():
            assert scaled_error(got[name], w) < 1e-5, name
    tile = packed.gemm_tile(model.native) > 0
    assert model.native.calls().get(LOOPS[op][0], 0) == (2 if tile else 0)


def test_swapped_recurrence_weights_are_used_not_what_was_packed_from_them(compiled):
    _, path = compiled
    trusted, plain = omrt.load(path, trust_kernels=True).session(), omrt.load(path).session()
    r = np.random.default_rng(3)
    for name in ("w", "b", "r", "w2", "r2"):
        new = (r.standard_normal(plain.model.graph.constants[name].shape) / 3).astype(np.float32)
        trusted.set_weight(name, new)
        plain.set_weight(name, new)
        got, want = trusted.run({"x": _x()}), plain.run({"x": _x()})
        assert all(scaled_error(got[k], want[k]) < 1e-5 for k in want), name


@pytest.mark.parametrize("trust", [True, False])
def test_a_weight_budget_holds_only_the_recurrence_weights_that_are_read(compiled, trust):
    op, path = compiled
    model = omrt.load(path, trust_kernels=trust, weight_budget=1 << 20)
    plan = model.default.stream
    held = set(plan.resident) | {f.key for f in plan.fills}
    sources = {"w", "b", "r", "w2", "r2"}
    derived = {n for n in COMPILED[op][1] + COMPILED[op][2] if n}
    packed_path = trust and packed.gemm_tile(model.native) > 0
    assert held & (sources | derived) == (derived if packed_path else sources)
    got, want = model.session().run({"x": _x()}), omrt.load(path).session().run({"x": _x()})
    assert all(scaled_error(got[k], want[k]) < 1e-5 for k in want)
