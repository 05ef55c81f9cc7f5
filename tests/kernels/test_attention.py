"""Attention-family kernels against onnx.reference: Attention, RotaryEmbedding, SwiGLU,
TensorScatter, LinearAttention, CausalConvWithState."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omrt.errors import KernelError, ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import RNG as rng
from tests.kernel_check import check, randn, reference, run_kernel

# ----------------------------------------------------------------------------- Attention


def attention_inputs(b=2, hq=3, hkv=3, sq=4, skv=6, d=8, dv=8, past=0, rank=4, mask=None,
                     nonpad=None, dtype=np.float32) -> tuple[list, dict]:
    """Q, K, V (+ mask, past, nonpad) and the head attributes a 3-D layout needs."""
    if rank == 4:
        q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, skv, d, dtype=dtype), \
            randn(b, hkv, skv, dv, dtype=dtype)
        attrs = {}
    else:
        q, k, v = randn(b, sq, hq * d, dtype=dtype), randn(b, skv, hkv * d, dtype=dtype), \
            randn(b, skv, hkv * dv, dtype=dtype)
        attrs = {"q_num_heads": hq, "kv_num_heads": hkv}
    inputs = [q, k, v, mask]
    if past:
        inputs += [randn(b, hkv, past, d, dtype=dtype), randn(b, hkv, past, dv, dtype=dtype)]
    if nonpad is not None:
        inputs += [None] * (6 - len(inputs)) + [np.asarray(nonpad, np.int64)]
    while inputs and inputs[-1] is None:
        inputs.pop()
    return inputs, attrs


def check_attention(inputs: list, attrs: dict, opset: int = 23, rtol: float = 1e-5,
                    atol: float = 1e-6) -> list[np.ndarray]:
    # with a softcap the reference's mode-0 scores come after it, not before as the spec says
    # (test_attention_mode_0_is_before_softcap): compare qk_matmul_output in the other modes only
    raw_after_softcap = attrs.get("softcap") and not attrs.get("qk_matmul_output_mode")
    return check("Attention", inputs, attrs, opset=opset, rtol=rtol, atol=atol,
                 n_outputs=3 if raw_after_softcap else 4)


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("heads", [(3, 3), (6, 3), (4, 1)])
@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}, {"scale": 0.1}, {"softcap": 2.0},
                                   {"qk_matmul_output_mode": 1, "softcap": 1.5},
                                   {"qk_matmul_output_mode": 3, "is_causal": 1}])
def test_attention_heads_and_attributes(rank, heads, attrs):
    inputs, head_attrs = attention_inputs(hq=heads[0], hkv=heads[1], rank=rank, dv=5)
    check_attention(inputs, {**head_attrs, **attrs})


@pytest.mark.parametrize("mask_shape", [(6,), (4, 6), (3, 4, 6), (2, 1, 4, 6), (2, 3, 4, 6), (4, 4), (1, 3)])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_masks(mask_shape, kind, causal):
    mask = rng.random(mask_shape) > 0.3 if kind == "bool" else randn(*mask_shape)
    inputs, attrs = attention_inputs(mask=mask)
    attrs = {**attrs, "is_causal": causal, "qk_matmul_output_mode": 2}
    got = run_kernel("Attention", inputs, attrs, opset=23)
    # the reference takes the causal mask's query length from the mask, so it gets the mask with
    # its query axis already broadcast (which means the same)
    inputs[3] = np.broadcast_to(mask, mask.shape[:-2] + (4, mask.shape[-1]))
    want = reference("Attention", inputs, attrs, opset=23, n_outputs=4)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mode", [0, 2, 3])
def test_attention_past_and_present(rank, causal, mode):
    inputs, attrs = attention_inputs(hq=6, hkv=3, sq=4, skv=2, past=5, rank=rank, dv=7,
                                     mask=randn(4, 7))
    check_attention(inputs, {**attrs, "is_causal": causal, "qk_matmul_output_mode": mode})


def test_attention_past_without_present_outputs():
    """The past cache is then read as a second block of keys and values."""
    inputs, attrs = attention_inputs(hq=4, hkv=2, skv=3, past=5, dv=6)
    cls = lookup("Attention", 23)
    ctx = OpContext(attrs, 23, "att", "Attention", 1)
    infos = [None if x is None else TensorInfo.of(x) for x in inputs]
    outs = cls.infer(ctx, infos)
    kernel = cls(ctx, infos, outs)
    y = np.full(outs[0].shape, np.nan, np.float32)
    kernel.run(inputs, [y], np.zeros(kernel.workspace(), np.uint8))
    np.testing.assert_allclose(y, reference("Attention", inputs, attrs, opset=23)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nonpad,causal,mask", [
    ([6, 3], 0, None), ([6, 3], 1, None), ([2, 5], 1, (2, 1, 4, 6)), ([1, 4], 1, (2, 3, 4, 4)),
    ([3, 6], 0, (4, 5)),
])
def test_attention_nonpad_kv_seqlen(nonpad, causal, mask):
    m = None if mask is None else rng.random(mask) > 0.2
    inputs, attrs = attention_inputs(mask=m, nonpad=nonpad)
    check_attention(inputs, {**attrs, "is_causal": causal}, opset=24)


@pytest.mark.parametrize("window", [(2, -1), (1, 2), (-1, 0), (0, 0), (-1, -1)])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("cache", ["none", "past", "nonpad"])
def test_attention_sliding_window(window, causal, cache):
    inputs, attrs = attention_inputs(hq=4, hkv=2, skv=3 if cache == "past" else 8,
                                     past=5 if cache == "past" else 0,
                                     nonpad=[8, 5] if cache == "nonpad" else None,
                                     mask=randn(4, 4, 8))
    attrs = {**attrs, "is_causal": causal, "left_window_size": window[0], "right_window_size": window[1]}
    check_attention(inputs, attrs, opset=25)


def test_attention_fully_masked_rows_give_zeros():
    mask = np.ones((4, 6), bool)
    mask[1] = False
    inputs, attrs = attention_inputs(mask=mask)
    y, _, _, probs = check_attention(inputs, {"qk_matmul_output_mode": 3})
    assert not np.isnan(y).any() and (y[:, :, 1] == 0).all() and (probs[:, :, 1] == 0).all()
    # more queries than valid keys: the leading rows of a causal external cache see nothing
    inputs, attrs = attention_inputs(sq=4, skv=4, nonpad=[2, 4])
    y = check_attention(inputs, {"is_causal": 1}, opset=24)[0]
    assert (y[0, :, :2] == 0).all()


def test_attention_mode_0_is_before_softcap():
    """The spec's mode 0 is the raw Q K^T * scale (the reference returns it after the softcap)."""
    inputs, attrs = attention_inputs(hq=2, hkv=2)
    qk = run_kernel("Attention", inputs, {"softcap": 1.0, "qk_matmul_output_mode": 0}, opset=23)[3]
    q, k = inputs[0].astype(np.float64), inputs[1].astype(np.float64)
    np.testing.assert_allclose(qk, q @ k.swapaxes(-1, -2) / np.sqrt(8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,precision", [(np.float64, None), (np.float16, None), (np.float16, 1),
                                             (np.float32, 11)])
def test_attention_precisions(dtype, precision):
    inputs, attrs = attention_inputs(hq=4, hkv=2, mask=rng.random((4, 6)) > 0.2, dtype=dtype)
    if precision:
        attrs["softmax_precision"] = precision
    tol = 1e-3 if dtype == np.float16 else 1e-5
    check_attention(inputs, {**attrs, "is_causal": 1, "qk_matmul_output_mode": 3}, opset=24, rtol=tol,
                    atol=tol)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 6),
       st.integers(0, 4), st.sampled_from([3, 4]), st.booleans(), st.booleans())
def test_attention_random_shapes(b, hkv, g, sq, skv, past, rank, causal, with_mask):
    mask = randn(sq, past + skv) if with_mask else None
    inputs, attrs = attention_inputs(b, hkv * g, hkv, sq, skv, 4, 3, past, rank, mask)
    check_attention(inputs, {**attrs, "is_causal": int(causal)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 40), st.integers(1, 40),
       st.integers(1, 24), st.sampled_from([1, 7, 16, 24, 32, 48]), st.sampled_from([3, 4]),
       st.sampled_from([None, "keys", "queries", "heads", "batch", "all"]), st.sampled_from([None, 0.3]),
       st.integers(1, 3))
def test_the_native_loop_matches_the_reference(native, b, hkv, g, sq, skv, d, dv, rank, mask_over, scale,
                                               threads):
    """Float32 attention with a float mask broadcast over (batch, heads, queries) or none, grouped
    heads, 3-D and 4-D layouts: one native call per node, values as the reference's, through BLAS
    and (value heads of a multiple of 16) on the GEMM tile, queries and keys past its panels and
    strips; at 3 threads, more than the tile path has slots for, through BLAS on all of them (the
    slots could not hold a third thread: the call's contract would refuse it)."""
    import omrt
    from omrt.kernels import parallel

    shapes = {"keys": (skv,), "queries": (sq, skv), "heads": (hkv * g, 1, skv), "batch": (b, 1, 1, skv),
              "all": (b, hkv * g, sq, skv)}
    mask = None if mask_over is None else randn(*shapes[mask_over])
    inputs, attrs = attention_inputs(b, hkv * g, hkv, sq, skv, d, dv, 0, rank, mask)
    attrs = attrs if scale is None else {**attrs, "scale": scale}
    before = native.calls().get("omrt_attention_f32", 0)
    omrt.set_num_threads(threads)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(parallel, "NATIVE_SPLIT_FLOPS", 0)  # even these small nodes on every thread
            got = run_kernel("Attention", inputs, attrs, opset=23, native=native, n_outputs=1)[0]
    finally:
        omrt.set_num_threads(1)
    assert native.calls().get("omrt_attention_f32", 0) == before + 1
    want = reference("Attention", inputs, attrs, opset=23)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("dv", [8, 16])
def test_the_native_loop_gives_zeros_for_fully_masked_rows(native, dv):
    mask = np.zeros((4, 6), np.float32)
    mask[1] = -np.inf
    inputs, attrs = attention_inputs(mask=mask, dv=dv)
    got = run_kernel("Attention", inputs, attrs, opset=23, native=native, n_outputs=1)[0]
    assert (got[:, :, 1] == 0).all() and np.isfinite(got).all()
    np.testing.assert_allclose(got, reference("Attention", inputs, attrs, opset=23)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("keys", [5, 16, 37])
@pytest.mark.parametrize("dv", [4, 16])
def test_the_native_loop_subtracts_each_rows_largest_score(native, keys, dv):
    """Scores up to 10 * keys, past where exp overflows float32: finite probabilities only when the
    softmax subtracts each row's largest score, whether it lies in the rows' whole vectors or
    in their tails (the last key for q = +1, the first for q = -1), or (16 values per head, on the
    tile) down the columns of the transposed scores."""
    q = np.array([1.0, -1.0, 0.5], np.float32).reshape(1, 1, 3, 1)
    k = (np.arange(keys, dtype=np.float32) * 10).reshape(1, 1, keys, 1)
    v = randn(1, 1, keys, dv)
    before = native.calls().get("omrt_attention_f32", 0)
    got = run_kernel("Attention", [q, k, v], {}, opset=23, native=native, n_outputs=1)[0]
    assert native.calls().get("omrt_attention_f32", 0) == before + 1
    scores = q[0, 0].astype(np.float64) @ k[0, 0].T.astype(np.float64)
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    want = (probs / probs.sum(axis=1, keepdims=True)) @ v[0, 0].astype(np.float64)
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-5, atol=1e-5 * float(np.abs(v).max()))


def test_attention_scores_are_the_only_large_scratch():
    """No mask, float32: the workspace is exactly the [B, Hq, Sq, T] score matrix."""
    inputs, attrs = attention_inputs(b=2, hq=8, hkv=2, sq=16, skv=32, d=64, dv=64)
    cls = lookup("Attention", 23)
    ctx = OpContext(attrs, 23, "att", "Attention", 1)
    infos = [None if x is None else TensorInfo.of(x) for x in inputs]
    kernel = cls(ctx, infos, cls.infer(ctx, infos))
    assert kernel.workspace() == 2 * 8 * 16 * 32 * 4


@pytest.mark.parametrize("b,hq,sq,skv,slots", [(2, 8, 128, 128, False), (1, 1, 16, 32, True), (1, 1, 16, 600, False)])
def test_the_tile_path_adds_at_most_two_slots_to_the_scores(native, b, hq, sq, skv, slots):
    """With the native loop and 64 values per head, the workspace holds the [B, Hq, Sq, T] scores
    (what numpy's path takes) or two threads' slots of the tile path, whichever is larger: many
    heads take no more than the scores, and past TILE_KEYS keys (BLAS's path) no slots at all."""
    from omrt.kernels.attention import TILE_KEYS, tile_slot_floats
    from omrt.memory.alignment import align

    inputs, attrs = attention_inputs(b=b, hq=hq, hkv=hq, sq=sq, skv=skv, d=64, dv=64)
    cls = lookup("Attention", 23)
    ctx = OpContext(attrs, 23, "att", "Attention", 1, native=native)
    infos = [None if x is None else TensorInfo.of(x) for x in inputs]
    kernel = cls(ctx, infos, cls.infer(ctx, infos))
    # 16 queries padded to a strip of 32, 32 keys to 3 panels of 12: 64 x (32 + 36) + 32 x 32 + 2 x 32
    assert tile_slot_floats(16, 32, 64) == 5440
    scores, slot_bytes = b * hq * sq * skv * 4, align(2 * tile_slot_floats(sq, skv, 64) * 4)
    assert (slot_bytes > scores) == (slots or skv > TILE_KEYS)
    assert kernel.workspace() == (max(scores, slot_bytes) if skv <= TILE_KEYS else scores)


@pytest.mark.parametrize("inputs,attrs,opset,match", [
    (attention_inputs(rank=3)[0], {}, 23, "q_num_heads"),
    (attention_inputs(hq=4, hkv=3)[0], {}, 23, "multiple"),
    (attention_inputs()[0], {"q_num_heads": 3, "kv_num_heads": 3}, 25, "must not"),
    (attention_inputs(past=2)[0][:5], {}, 23, "together"),
    (attention_inputs(mask=np.zeros((4, 9), np.float32))[0], {}, 23, "attn_mask"),
    ([randn(2, 3, 4, 8), randn(2, 3, 6), randn(2, 3, 6, 8)], {}, 23, "ranks"),
    ([randn(2, 3, 4, 8), randn(2, 3, 6, 6), randn(2, 3, 6, 8)], {}, 23, "disagree"),
    ([randn(2, 3, 4, 8), randn(2, 3, 6, 8), randn(2, 3, 5, 8)], {}, 23, "disagree"),
])
def test_attention_rejects(inputs, attrs, opset, match):
    with pytest.raises(ShapeError, match=match):
        run_kernel("Attention", inputs, attrs, opset=opset)


# ----------------------------------------------------------------------------- RotaryEmbedding


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot", [0, 4])
@pytest.mark.parametrize("positions", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rotary_embedding(rank, interleaved, rot, positions, dtype):
    b, h, s, d = 2, 3, 5, 8
    x = randn(b, h, s, d, dtype=dtype) if rank == 4 else randn(b, s, h * d, dtype=dtype)
    half = (rot or d) // 2
    if positions:
        cos, sin = randn(20, half, dtype=dtype), randn(20, half, dtype=dtype)
        inputs = [x, cos, sin, rng.integers(0, 20, (b, s)).astype(np.int64)]
    else:
        inputs = [x, randn(b, s, half, dtype=dtype), randn(b, s, half, dtype=dtype)]
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rot}
    if rank == 3:
        attrs["num_heads"] = h
    tol = 2e-3 if dtype == np.float16 else 1e-6
    check("RotaryEmbedding", inputs, attrs, opset=23, rtol=tol, atol=tol, const=[3])


def test_rotary_embedding_rejects():
    with pytest.raises(ShapeError, match="num_heads"):
        run_kernel("RotaryEmbedding", [randn(2, 3, 8), randn(3, 4), randn(3, 4)], opset=23)
    with pytest.raises(ShapeError, match="caches"):
        run_kernel("RotaryEmbedding", [randn(1, 2, 3, 8), randn(9, 3), randn(9, 3),
                                       np.zeros((1, 3), np.int64)], opset=23)
    with pytest.raises(ShapeError, match="tokens"):
        run_kernel("RotaryEmbedding", [randn(1, 2, 3, 8), randn(1, 2, 4), randn(1, 2, 4)], opset=23)


# ----------------------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("shape", [(2, 4), (3, 20000), (0, 5), ()])
@pytest.mark.parametrize("alpha", [None, 0.5, 1.702])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_swiglu(shape, alpha, dtype):
    a, b = randn(*shape, dtype=dtype) * 4, randn(*shape, dtype=dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    check("SwiGLU", [a, b], {} if alpha is None else {"alpha": alpha}, opset=28, rtol=tol, atol=tol)


def test_swiglu_rejects_broadcasting():
    with pytest.raises(ShapeError, match="no broadcasting"):
        run_kernel("SwiGLU", [randn(2, 4), randn(1, 4)], opset=28)


# ----------------------------------------------------------------------------- TensorScatter


@pytest.mark.parametrize("shape,update_len,axis", [((2, 3, 8, 4), 3, -2), ((3, 8, 5), 2, 1),
                                                    ((2, 4, 3, 6), 2, 3), ((2, 1, 4, 5), 4, 2)])
@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("indexed", [True, False])
def test_tensor_scatter(shape, update_len, axis, mode, indexed):
    past = randn(*shape)
    ushape = list(shape)
    ushape[axis] = update_len
    inputs = [past, randn(*ushape)]
    length = shape[axis]
    if indexed:
        high = length if mode == "circular" else length - update_len + 1
        inputs.append(rng.integers(0, high, shape[0]).astype(np.int64))
    check("TensorScatter", inputs, {"mode": mode, "axis": axis}, opset=24)


def test_tensor_scatter_linear_overflow_and_bad_axis():
    with pytest.raises(KernelError, match="linear"):
        run_kernel("TensorScatter", [randn(2, 4, 3), randn(2, 2, 3), np.array([3, 0], np.int64)],
                   {"axis": 1}, opset=24)
    with pytest.raises(ShapeError, match="axis"):
        run_kernel("TensorScatter", [randn(2, 4, 3), randn(2, 4, 3)], {"axis": 0}, opset=24)


# ----------------------------------------------------------------------------- LinearAttention


def linear_inputs(rule: str, b=2, t=4, hq=4, hkv=2, dk=8, dv=6, past=False, decay="key",
                  beta="head", dtype=np.float32) -> list:
    q, k, v = randn(b, t, hq * dk, dtype=dtype), randn(b, t, hkv * dk, dtype=dtype), \
        randn(b, t, hkv * dv, dtype=dtype)
    k /= np.linalg.norm(k.reshape(b, t, hkv, dk), axis=-1).repeat(dk, -1).astype(dtype)
    inputs = [q, k, v, randn(b, hkv, dk, dv, dtype=dtype) if past else None]
    if "gated" in rule:
        width = hkv * dk if decay == "key" else hkv
        inputs.append((-np.abs(randn(b, t, width)) * 0.5).astype(dtype))
    else:
        inputs.append(None)
    if "delta" in rule:
        width = hkv if beta == "head" else 1
        inputs.append((1 / (1 + np.exp(-randn(b, t, width)))).astype(dtype))
    while inputs[-1] is None:
        inputs.pop()
    return inputs


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("past", [False, True])
def test_linear_attention(rule, heads, past):
    inputs = linear_inputs(rule, hq=heads[0], hkv=heads[1], past=past)
    check("LinearAttention", inputs, {"update_rule": rule, "q_num_heads": heads[0], "kv_num_heads": heads[1]},
          opset=27, rtol=1e-5, atol=1e-5, n_outputs=2)


@pytest.mark.parametrize("decay,beta", [("head", "one"), ("key", "one"), ("head", "head")])
def test_linear_attention_gate_shapes_scale_and_fp16(decay, beta):
    attrs = {"q_num_heads": 4, "kv_num_heads": 2, "scale": 0.3}
    check("LinearAttention", linear_inputs("gated_delta", decay=decay, beta=beta, t=1), attrs, opset=27,
          rtol=1e-5, atol=1e-5, n_outputs=2)
    check("LinearAttention", linear_inputs("gated_delta", decay=decay, beta=beta, dtype=np.float16), attrs,
          opset=27, rtol=2e-3, atol=2e-3, n_outputs=2)


def test_linear_attention_rejects():
    attrs = {"q_num_heads": 4, "kv_num_heads": 2}
    with pytest.raises(ShapeError, match="decay only"):
        run_kernel("LinearAttention", linear_inputs("linear"), dict(attrs, update_rule="gated"), opset=27)
    with pytest.raises(ShapeError, match="update_rule"):
        run_kernel("LinearAttention", linear_inputs("linear"), dict(attrs, update_rule="rwkv"), opset=27)
    with pytest.raises(ShapeError, match="multiple"):
        run_kernel("LinearAttention", linear_inputs("linear"), {"q_num_heads": 3, "kv_num_heads": 2,
                                                                "update_rule": "linear"}, opset=27)


# ----------------------------------------------------------------------------- CausalConvWithState


@pytest.mark.parametrize("k,length", [(4, 8), (1, 8), (5, 2), (3, 1)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("activation", [None, "silu", "swish", "none"])
def test_causal_conv_with_state(k, length, bias, past, activation):
    b, c = 2, 3
    inputs = [randn(b, c, length), randn(c, 1, k), randn(c) if bias else None,
              randn(b, c, k - 1) if past else None]
    while inputs[-1] is None:
        inputs.pop()
    attrs = {} if activation is None else {"activation": activation}
    check("CausalConvWithState", inputs, attrs, opset=27, n_outputs=2)


def test_causal_conv_with_state_fp16_and_rejects():
    check("CausalConvWithState", [randn(2, 3, 6, dtype=np.float16), randn(3, 1, 3, dtype=np.float16)],
          {"activation": "silu"}, opset=27, rtol=2e-3, atol=2e-3, n_outputs=2)
    with pytest.raises(ShapeError, match="activation"):
        run_kernel("CausalConvWithState", [randn(1, 2, 3), randn(2, 1, 2)], {"activation": "gelu"}, opset=27)
    with pytest.raises(ShapeError, match="past_state"):
        run_kernel("CausalConvWithState", [randn(1, 2, 3), randn(2, 1, 2), None, randn(1, 2, 3)], opset=27)
