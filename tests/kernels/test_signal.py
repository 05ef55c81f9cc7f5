"""Signal kernels against onnx.reference: DFT (opsets 17, 20), STFT, windows and MelWeightMatrix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

import omrt.kernels.signal  # noqa: F401  (registers the family before the library lists it)
from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import check, run_kernel

rng = np.random.default_rng(0)


def signal(shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def i64(v):
    return np.array(v, np.int64)


# ----------------------------------------------------------------------------- DFT

@pytest.mark.parametrize("last", [1, 2])
@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, 2, -2, -3])
def test_dft20_axes(last, inverse, axis):
    x = signal((3, 4, 5, last))
    check("DFT", [x, None, i64(axis)], {"inverse": inverse}, opset=20, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("length", [3, 5, 8])
@pytest.mark.parametrize("last", [1, 2])
def test_dft_length_crops_or_pads(length, last):
    x = signal((2, 5, last))
    check("DFT", [x, i64(length)], {"axis": 1}, opset=17, rtol=1e-4, atol=1e-5)
    check("DFT", [x, i64(length), i64(-2)], {}, opset=20, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n", [6, 7])
def test_rfft_and_irfft(n):
    x = signal((2, n, 1))
    spectrum = check("DFT", [x, None, i64(1)], {"onesided": 1}, opset=20, rtol=1e-4, atol=1e-5)[0]
    assert spectrum.shape == (2, n // 2 + 1, 2)
    back = check("DFT", [spectrum, i64(n), i64(1)], {"onesided": 1, "inverse": 1}, opset=20,
                 rtol=1e-4, atol=1e-5)[0]
    np.testing.assert_allclose(back, x, rtol=1e-4, atol=1e-5)
    check("DFT", [spectrum], {"onesided": 1, "inverse": 1, "axis": 1}, opset=17, rtol=1e-4, atol=1e-5)


def test_onesided_complex_input_keeps_first_bins():
    x = signal((3, 8, 2))
    check("DFT", [x, None, i64(1)], {"onesided": 1}, opset=20, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-10), (np.float16, 2e-2)])
def test_dft_dtypes(dtype, rtol):
    x = signal((2, 6, 2), dtype)
    check("DFT", [x], {"axis": 1}, opset=17, rtol=rtol, atol=rtol)
    check("DFT", [signal((2, 6, 1), dtype), None, i64(1)], {"onesided": 1}, opset=20,
          rtol=rtol, atol=rtol)
    check("DFT", [x, i64(10), i64(1)], {"onesided": 1, "inverse": 1}, opset=20, rtol=rtol, atol=rtol)


def test_dft_strided_complex_input():
    x = signal((4, 6, 4))[:, :, ::2]
    want = np.fft.fft(x[..., 0] + 1j * x[..., 1], axis=1)
    got = run_kernel("DFT", [x, None, i64(1)], opset=20)[0]
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=1e-4, atol=1e-5)


def test_dft_length_known_only_at_run_time():
    x, length, axis = signal((2, 5, 1)), i64(8), i64(1)
    ctx = OpContext({}, 20, "test", "DFT")
    cls = lookup("DFT", 20)
    infos = [TensorInfo(x.dtype, x.shape), TensorInfo(length.dtype, ()), TensorInfo.of(axis)]
    assert cls.infer(ctx, infos)[0].shape == (2, None, 2)
    out = np.empty((2, 8, 2), np.float32)
    kernel = cls(ctx, infos, [TensorInfo(out.dtype, out.shape)])
    kernel.run([x, length, axis], [out], np.empty(kernel.workspace(), np.uint8))
    want = np.fft.fft(x[..., 0], 8, axis=1)
    np.testing.assert_allclose(out[..., 0] + 1j * out[..., 1], want, rtol=1e-4, atol=1e-5)


def test_dft_bad_axis():
    with pytest.raises(ShapeError, match="axis"):
        run_kernel("DFT", [signal((2, 4, 2)), None, i64(2)], opset=20)
    with pytest.raises(ShapeError, match="real"):
        run_kernel("DFT", [signal((2, 4, 3))], opset=20)


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), last=st.sampled_from([1, 2]),
       inverse=st.booleans(), data=st.data())
def test_dft_any_shape(shape, last, inverse, data):
    rank = len(shape) + 1
    axis = data.draw(st.sampled_from(list(range(rank - 1)) + list(range(-rank, -1))))
    x = signal((*shape, last))
    check("DFT", [x, None, i64(axis)], {"inverse": int(inverse)}, opset=20, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- STFT

@pytest.mark.parametrize("onesided,last", [(0, 1), (1, 1), (0, 2)])
def test_stft_window(onesided, last):
    x = signal((2, 32, last))
    window = np.hanning(8).astype(np.float32)
    check("STFT", [x, i64(3), window], {"onesided": onesided}, rtol=1e-4, atol=1e-5)
    check("STFT", [x, i64(4), window, i64(8)], {"onesided": onesided}, rtol=1e-4, atol=1e-5)


def test_stft_frame_length_without_window():
    x = signal((1, 20, 1))
    check("STFT", [x, i64(5), None, i64(6)], rtol=1e-4, atol=1e-5)


def test_stft_float64_and_float16():
    check("STFT", [signal((1, 16, 1), np.float64), i64(4), np.hamming(4)], rtol=1e-10, atol=1e-12)
    check("STFT", [signal((1, 16, 1), np.float16), i64(4), np.hamming(4).astype(np.float16)],
          rtol=2e-2, atol=2e-2)


def test_stft_complex_one_sided_bins():
    x = signal((1, 12, 2))
    got = run_kernel("STFT", [x, i64(4), None, i64(4)], {"onesided": 1})[0]
    frames = np.stack([x[0, i:i + 4, 0] + 1j * x[0, i:i + 4, 1] for i in range(0, 9, 4)])
    want = np.fft.fft(frames, axis=-1)[:, :3]
    np.testing.assert_allclose(got[0, ..., 0] + 1j * got[0, ..., 1], want, rtol=1e-4, atol=1e-5)


def test_stft_bad_window():
    with pytest.raises(ShapeError, match="window"):
        run_kernel("STFT", [signal((1, 16, 1)), i64(2), np.ones(5, np.float32), i64(4)])


# ----------------------------------------------------------------------------- windows, MelWeightMatrix

@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [2, 5, 16])
def test_windows(op, periodic, size):
    check(op, [np.array(size, np.int32)], {"periodic": periodic}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [TensorProto.DOUBLE, TensorProto.FLOAT16])
def test_window_output_datatype(dtype):
    check("HannWindow", [i64(10)], {"output_datatype": dtype}, rtol=1e-3, atol=1e-3)


def test_window_edge_sizes():
    assert run_kernel("HammingWindow", [i64(0)])[0].shape == (0,)
    np.testing.assert_array_equal(run_kernel("BlackmanWindow", [i64(1)], {"periodic": 0})[0], [1.0])


@pytest.mark.parametrize("mels,length,rate,low,high", [
    (8, 16, 8192, 0.0, 4096.0),
    (10, 64, 16000, 20.0, 8000.0),
    (5, 33, 22050, 100.0, 5000.0),
])
def test_mel_weight_matrix(mels, length, rate, low, high):
    args = [np.array(mels, np.int32), np.array(length, np.int32), np.array(rate, np.int32),
            np.array(low, np.float32), np.array(high, np.float32)]
    check("MelWeightMatrix", args)
    check("MelWeightMatrix", args, {"output_datatype": TensorProto.DOUBLE})


def test_stft_frame_length_known_only_at_run_time():
    x, step, length = signal((2, 20, 1)), i64(4), i64(8)
    ctx = OpContext({}, 17, "test", "STFT")
    cls = lookup("STFT", 17)
    infos = [TensorInfo(x.dtype, x.shape), TensorInfo.of(step), None, TensorInfo(length.dtype, ())]
    assert cls.infer(ctx, infos)[0].shape == (2, None, None, 2)
    out = np.empty((2, 4, 5, 2), np.float32)
    kernel = cls(ctx, infos, [TensorInfo(out.dtype, out.shape)])
    kernel.run([x, step, None, length], [out], None)
    frames = np.stack([x[:, i:i + 8, 0] for i in range(0, 13, 4)], axis=1)
    want = np.fft.rfft(frames, axis=-1)
    np.testing.assert_allclose(out[..., 0] + 1j * out[..., 1], want, rtol=1e-4, atol=1e-5)


def test_empty_batch():
    assert run_kernel("DFT", [signal((0, 4, 1)), None, i64(1)], opset=20)[0].shape == (0, 4, 2)
    assert run_kernel("STFT", [signal((0, 16, 1)), i64(4), np.ones(4, np.float32)])[0].shape == (0, 4, 3, 2)
