"""Sampling kernels (Resize, Upsample, GridSample, AffineGrid, RoiAlign) against onnx.reference,
and against onnxruntime where the reference does not cover an opset or a mode."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import RNG as rng
from tests.kernel_check import check, randn, run_kernel

EMPTY = np.array([], np.float32)


def f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def ort_run(op_type: str, inputs: list[np.ndarray | None], attrs: dict, opset: int) -> np.ndarray:
    """One node through onnxruntime (for opsets and modes onnx.reference does not implement)."""
    ort = pytest.importorskip("onnxruntime")
    names = [f"x{i}" if v is not None else "" for i, v in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for n, v in zip(names, inputs) if v is not None]
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_value_info("y", onnx.TypeProto())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: v for n, v in zip(names, inputs) if v is not None})[0]


def check_ort(op_type: str, inputs: list[np.ndarray | None], attrs: dict, opset: int,
              const: list[int], atol: float = 1e-5) -> None:
    got = run_kernel(op_type, inputs, attrs, opset, const)[0]
    want = ort_run(op_type, inputs, attrs, opset)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)


# ----------------------------------------------------------------------------- Resize

COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
SCALES = [(1, 1, 2, 1.5), (1, 1, 0.5, 0.6), (1, 1, 1.7, 0.8), (1, 1, 3, 3), (1, 1, 0.2, 1)]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("scales", SCALES)
def test_resize_scales(mode, coord, scales):
    check("Resize", [randn(1, 2, 4, 5), EMPTY, f32(*scales)],
          {"mode": mode, "coordinate_transformation_mode": coord}, opset=19, const=[1, 2], atol=1e-5)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners"])
@pytest.mark.parametrize("scales", SCALES)
def test_resize_nearest_modes(nearest_mode, coord, scales):
    check("Resize", [randn(1, 2, 4, 5), EMPTY, f32(*scales)],
          {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": coord},
          opset=13, const=[1, 2])


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [(1, 2, 7, 3), (1, 2, 2, 9), (1, 1, 1, 1), (2, 2, 4, 5)])
def test_resize_sizes(mode, sizes):
    check("Resize", [randn(1, 2, 4, 5), EMPTY, EMPTY, i64(*sizes)], {"mode": mode}, opset=13,
          const=[1, 2, 3], atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_tf_crop_and_resize(mode):
    x = randn(1, 2, 4, 5)
    roi = f32(0, 0, 0.2, 0.3, 1, 1, 1.1, 0.8)
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": 7.5}
    check("Resize", [x, roi, EMPTY, i64(1, 2, 6, 4)], attrs, opset=13, const=[1, 2, 3], atol=1e-5)
    check("Resize", [x, roi, f32(1, 1, 1.5, 0.8)], attrs, opset=13, const=[1, 2], atol=1e-5)
    check("Resize", [x, f32(0.1, 0.2, 0.9, 0.7), None, i64(7, 3)], {**attrs, "axes": [2, 3]},
          opset=18, const=[1, 3], atol=1e-5)


@pytest.mark.parametrize("scales", [(1, 1, 2, 1.5), (1, 1, 0.5, 0.6)])
@pytest.mark.parametrize("a", [-0.75, -0.5])
def test_resize_cubic_exclude_outside(scales, a):
    check("Resize", [randn(1, 2, 5, 6), EMPTY, f32(*scales)],
          {"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": a}, opset=13, const=[1, 2],
          atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [(1, 1, 0.5, 0.6), (1, 1, 0.3, 2.0), (1, 1, 0.25, 0.34)])
@pytest.mark.parametrize("exclude", [0, 1])
def test_resize_antialias(mode, scales, exclude):
    check("Resize", [randn(1, 2, 12, 9), EMPTY, f32(*scales)],
          {"mode": mode, "antialias": 1, "exclude_outside": exclude}, opset=18, const=[1, 2], atol=1e-5)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_axes_and_aspect_policy(policy, mode):
    x = randn(1, 2, 4, 5)
    attrs = {"mode": mode, "axes": [2, 3], "keep_aspect_ratio_policy": policy}
    check("Resize", [x, EMPTY, EMPTY, i64(7, 3)], attrs, opset=18, const=[1, 2, 3], atol=1e-5)
    check("Resize", [x, None, None, i64(7, 3)], attrs, opset=19, const=[3], atol=1e-5)


def test_resize_negative_axes_match_positive():
    x = randn(1, 2, 4, 5)
    want = check("Resize", [x, EMPTY, f32(2, 0.5)], {"mode": "linear", "axes": [3, 2]}, opset=18,
                 const=[1, 2], atol=1e-5)[0]
    got = run_kernel("Resize", [x, EMPTY, f32(2, 0.5)], {"mode": "linear", "axes": [-1, -2]}, opset=18,
                     const=[1, 2])[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_integer_dtypes(dtype, mode):
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -5000), min(info.max, 5000)
    x = rng.integers(lo, hi, (1, 3, 9, 11), endpoint=True).astype(dtype)
    for scales in [(1, 1, 2, 1.5), (1, 1, 0.5, 0.6)]:
        # float32 accumulation may round an exact .5 differently from the float64 reference
        check("Resize", [x, EMPTY, f32(*scales)], {"mode": mode}, opset=13, const=[1, 2], atol=1)


def test_resize_uint8_saturates_cubic_overshoot():
    x = np.zeros((1, 1, 4, 8), np.uint8)
    x[..., 4:] = 255
    got = check("Resize", [x, EMPTY, f32(1, 1, 1, 3.3)], {"mode": "cubic"}, opset=13, const=[1, 2],
                atol=1)[0]
    assert got.min() == 0 and got.max() == 255


@pytest.mark.parametrize("dtype,mode,tol", [(np.float16, "cubic", 1e-2), (np.float64, "linear", 1e-12),
                                            (np.float64, "cubic", 1e-5)])
def test_resize_float_dtypes(dtype, mode, tol):
    # the reference evaluates cubic weights in float32 (cubic_coeff_a is a float32 attribute)
    check("Resize", [randn(1, 2, 4, 5, dtype=dtype), EMPTY, f32(1, 1, 2, 1.5)], {"mode": mode},
          opset=13, const=[1, 2], rtol=tol, atol=tol)


@pytest.mark.parametrize("shape,scales", [((7,), (1.6,)), ((3, 7), (0.7, 1.6)),
                                          ((2, 3, 4, 5, 6), (1, 1, 1.5, 0.5, 2)),
                                          ((5, 4, 3), (0.5, 2, 1))])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_ranks(shape, scales, mode):
    check("Resize", [randn(*shape), EMPTY, f32(*scales)], {"mode": mode}, opset=13, const=[1, 2],
          atol=1e-5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64, np.bool_])
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 3, 1), (1, 1, 1, 4), (2, 1, 2, 8), (1, 2, 1, 1)])
def test_resize_nearest_integer_upsampling(dtype, scales):
    x = (randn(2, 3, 4, 5) * 50).astype(dtype)
    got = run_kernel("Resize", [x, EMPTY, f32(*scales)],
                     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                      "nearest_mode": "floor"}, opset=13, const=[1, 2])[0]
    want = x
    for axis, k in enumerate(scales):
        want = np.repeat(want, k, axis=axis)
    np.testing.assert_array_equal(got, want)


def test_resize_nearest_strings():
    x = np.array([["a", "b"], ["c", "d"]], dtype=object)
    got = run_kernel("Resize", [x, EMPTY, f32(1.5, 1)], {"mode": "nearest"}, opset=13, const=[1, 2])[0]
    assert got.tolist() == [["a", "b"], ["a", "b"], ["c", "d"]]


def test_resize_identity_and_empty():
    x = randn(1, 2, 4, 5)
    same = run_kernel("Resize", [x, EMPTY, f32(1, 1, 1, 1)], {"mode": "cubic"}, const=[1, 2])[0]
    np.testing.assert_array_equal(same, x)
    got = run_kernel("Resize", [x, EMPTY, f32(1, 1, 0.1, 2)], {"mode": "linear"}, const=[1, 2])[0]
    assert got.shape == (1, 2, 0, 10)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       factors=st.lists(st.sampled_from([0.5, 0.75, 1.0, 1.25, 2.0, 3.0]), min_size=3, max_size=3),
       mode=st.sampled_from(["nearest", "linear", "cubic"]),
       coord=st.sampled_from(COORDS))
def test_resize_property(shape, factors, mode, coord):
    scales = f32(*factors[:len(shape)])
    check("Resize", [randn(*shape), EMPTY, scales], {"mode": mode, "coordinate_transformation_mode": coord},
          opset=19, const=[1, 2], atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 3), (1, 1, 0.5, 0.6), (1, 1, 1.7, 0.8)])
def test_resize_opset10_matches_onnxruntime(mode, scales):
    check_ort("Resize", [randn(1, 2, 4, 5), f32(*scales)], {"mode": mode}, 10, const=[1])


@pytest.mark.parametrize("scales", [(1, 1, 2, 1.5), (1, 1, 0.5, 0.6)])
def test_resize_tf_half_pixel_for_nn_matches_onnxruntime(scales):
    check_ort("Resize", [randn(1, 2, 4, 5), EMPTY, f32(*scales)],
              {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, 11,
              const=[1, 2])


def test_resize_scales_known_only_at_run_time():
    x = randn(1, 2, 4, 5)
    scales = f32(1, 1, 2, 1.5)
    cls = lookup("Resize", 13)
    ctx = OpContext({"mode": "linear"}, 13, name="r", op_type="Resize")
    infos = [TensorInfo(x.dtype, x.shape), None, TensorInfo(scales.dtype, scales.shape)]
    out_info = cls.infer(ctx, infos)[0]
    assert out_info.shape == (None,) * 4
    kernel = cls(ctx, infos, [TensorInfo(x.dtype, (1, 2, 8, 7))])
    out = np.empty((1, 2, 8, 7), np.float32)
    kernel.run([x, None, scales], [out], np.empty(kernel.workspace(), np.uint8))
    want = run_kernel("Resize", [x, EMPTY, scales], {"mode": "linear"}, opset=13, const=[1, 2])[0]
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_resize_symbolic_dims():
    cls = lookup("Resize", 13)
    ctx = OpContext({}, 13, name="r", op_type="Resize")
    infos = [TensorInfo(np.dtype(np.float32), ("N", 3, 4, 5)), None,
             TensorInfo.of(f32(1, 1, 2, 2)), None]
    assert cls.infer(ctx, infos)[0].shape == ("N", 3, 8, 10)


@pytest.mark.parametrize("inputs,attrs,match", [
    ([randn(1, 4), EMPTY, f32(1, 2), i64(1, 8)], {}, "exactly one"),
    ([randn(1, 4), EMPTY, f32(1, 1, 2)], {}, "3 scales for 2 axes"),
    ([randn(1, 4), EMPTY, f32(1, 2)], {"mode": "bilinear"}, "mode"),
    ([randn(1, 4), EMPTY, f32(1, 2)], {"coordinate_transformation_mode": "corner"}, "coordinate"),
    ([randn(1, 4), EMPTY, f32(1, 0)], {}, "positive"),
    ([np.array([[True]]), EMPTY, f32(1, 2)], {"mode": "linear"}, "numeric"),
])
def test_resize_errors(inputs, attrs, match):
    with pytest.raises(ShapeError, match=match):
        run_kernel("Resize", inputs, attrs, opset=13, const=[1, 2, 3])


# ----------------------------------------------------------------------------- Upsample

@pytest.mark.parametrize("scales", [(1, 1, 2, 3), (1, 1, 1.5, 2.5), (1, 1, 1, 1.5)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(scales, mode):
    x = randn(1, 2, 3, 4)
    check_ort("Upsample", [x, f32(*scales)], {"mode": mode}, 9, const=[1])
    check_ort("Upsample", [x], {"mode": mode, "scales": [float(s) for s in scales]}, 7, const=[])


def test_upsample_nearest_against_reference():
    check("Upsample", [randn(1, 2, 3, 4), f32(1, 1, 2, 3)], {"mode": "nearest"}, opset=9, const=[1])


def test_upsample_rejects_downscaling():
    with pytest.raises(ShapeError, match=">= 1"):
        run_kernel("Upsample", [randn(2, 4), f32(1, 0.5)], {}, opset=9, const=[1])


# ----------------------------------------------------------------------------- GridSample

def grid_for(n: int, *out: int) -> np.ndarray:
    return (rng.random((n, *out, len(out))) * 2.6 - 1.3).astype(np.float32)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_gridsample_2d(mode, padding, align):
    x, grid = randn(2, 3, 5, 6), grid_for(2, 4, 7)
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    if mode == "cubic" and padding != "zeros":
        legacy = {**attrs, "mode": "bicubic"}
        check_ort("GridSample", [x, grid], legacy, 16, const=[])
    else:
        check("GridSample", [x, grid], attrs, opset=20, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_gridsample_opset16_names(mode):
    x, grid = randn(1, 2, 4, 4), grid_for(1, 3, 5)
    check_ort("GridSample", [x, grid], {"mode": mode}, 16, const=[])


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_gridsample_3d(mode, padding):
    if mode == "cubic" and padding != "zeros":
        pytest.skip("onnx.reference clamps the cubic sampling point; omrt follows PyTorch (2-D test)")
    check("GridSample", [randn(1, 2, 3, 4, 5), grid_for(1, 2, 3, 4)],
          {"mode": mode, "padding_mode": padding, "align_corners": 1}, opset=20, atol=1e-5)


def test_gridsample_1d_and_dtypes():
    check("GridSample", [randn(2, 3, 7), grid_for(2, 5)], {"mode": "linear"}, opset=20, atol=1e-5)
    check("GridSample", [randn(1, 2, 4, 4, dtype=np.float16), grid_for(1, 3, 3).astype(np.float16)],
          {"mode": "linear", "padding_mode": "border"}, opset=20, rtol=1e-2, atol=1e-2)
    check("GridSample", [randn(1, 2, 4, 4, dtype=np.float64), grid_for(1, 3, 3).astype(np.float64)],
          {"mode": "cubic"}, opset=20, atol=1e-5)  # the reference denormalizes in float32
    x = rng.integers(0, 255, (1, 2, 4, 4)).astype(np.uint8)
    grid = grid_for(1, 3, 3)
    for mode in ["nearest", "linear", "cubic"]:
        got = run_kernel("GridSample", [x, grid], {"mode": mode}, opset=20)[0]
        as_float = run_kernel("GridSample", [x.astype(np.float32), grid], {"mode": mode}, opset=20)[0]
        np.testing.assert_array_equal(got, np.clip(np.rint(as_float), 0, 255).astype(np.uint8))


def test_gridsample_errors():
    with pytest.raises(ShapeError, match="rank 4"):
        run_kernel("GridSample", [randn(1, 2, 3, 4, 5), grid_for(1, 2, 2, 2)], {}, opset=16)
    with pytest.raises(ShapeError, match="grid"):
        run_kernel("GridSample", [randn(1, 2, 3, 4), grid_for(1, 2, 2, 2)], {}, opset=20)


# ----------------------------------------------------------------------------- AffineGrid

@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 1, 7), (2, 3, 4, 5, 3)])
def test_affine_grid(align, size):
    theta = randn(2, 2, 3) if len(size) == 4 else randn(2, 3, 4)
    check("AffineGrid", [theta, i64(*size)], {"align_corners": align}, opset=20, atol=1e-5)


def test_affine_grid_size_known_at_run_time():
    theta, size = randn(2, 2, 3), i64(2, 3, 4, 5)
    cls = lookup("AffineGrid", 20)
    ctx = OpContext({}, 20, name="a", op_type="AffineGrid")
    infos = [TensorInfo.of(theta), TensorInfo(size.dtype, size.shape)]
    assert cls.infer(ctx, infos)[0].shape == (2, None, None, 2)
    kernel = cls(ctx, infos, [TensorInfo(theta.dtype, (2, 4, 5, 2))])
    out = np.empty((2, 4, 5, 2), np.float32)
    kernel.run([theta, size], [out], None)
    np.testing.assert_allclose(out, run_kernel("AffineGrid", [theta, size], {}, opset=20)[0])


# ----------------------------------------------------------------------------- RoiAlign

ROIS = np.array([[0, 0, 9, 9], [0, 5, 4, 9], [5, 5, 9, 9], [1.3, 2.7, 11.5, 8.2], [-2, -3, 3, 14],
                 [3, 3, 3, 3], [9, 9, 1, 1]], np.float32)
BATCH = i64(0, 0, 1, 1, 0, 1, 0)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("coord", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 1, 2])
def test_roialign(mode, coord, ratio):
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, "sampling_ratio": ratio,
             "output_height": 3, "output_width": 4, "spatial_scale": 0.9}
    check("RoiAlign", [randn(2, 3, 10, 12), ROIS, BATCH], attrs, opset=16, atol=1e-5, const=[])


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roialign_opset10_has_no_half_pixel_shift(mode):
    attrs = {"mode": mode, "output_height": 2, "output_width": 3, "spatial_scale": 0.8}
    check_ort("RoiAlign", [randn(2, 3, 10, 12), ROIS[:5], BATCH[:5]], attrs, 10, const=[])


def test_roialign_float64_and_no_rois():
    check("RoiAlign", [randn(1, 2, 6, 6, dtype=np.float64), ROIS[:2].astype(np.float64), i64(0, 0)],
          {"output_height": 2, "output_width": 2}, opset=16, atol=1e-10, const=[])
    got = run_kernel("RoiAlign", [randn(1, 2, 6, 6), np.zeros((0, 4), np.float32), i64()], {}, opset=16)
    assert got[0].shape == (0, 2, 1, 1)
