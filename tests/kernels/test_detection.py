"""NonMaxSuppression against onnx.reference (a dynamic kernel: run returns the selected indices)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import omrt.kernels.detection  # noqa: F401  (registers the family before the library lists it)
from omrt.errors import ShapeError
from omrt.kernels import OpContext, TensorInfo, lookup
from tests.kernel_check import check, run_kernel

rng = np.random.default_rng(0)


def random_boxes(batches, n, center=False):
    """Boxes clustered enough to overlap, some with flipped corners."""
    if center:
        xy = rng.uniform(0, 10, (batches, n, 2))
        wh = rng.uniform(0.5, 4, (batches, n, 2))
        return np.concatenate([xy, wh], -1).astype(np.float32)
    a = rng.uniform(0, 10, (batches, n, 2))
    b = a + rng.uniform(-4, 4, (batches, n, 2))
    return np.concatenate([a, b], -1).astype(np.float32)


def nms_args(boxes, scores, limit=3, iou=0.5, score=None):
    args = [boxes, scores, np.array([limit], np.int64), np.array([iou], np.float32)]
    if score is not None:
        args.append(np.array([score], np.float32))
    return args


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("limit,iou,score", [(3, 0.5, None), (10, 0.3, 0.2), (1, 0.0, None),
                                             (100, 1.0, 0.5), (5, 0.0, 0.0)])
def test_nms_matches_reference(center, limit, iou, score):
    boxes = random_boxes(2, 12, bool(center))
    scores = rng.uniform(0, 1, (2, 3, 12)).astype(np.float32)
    check("NonMaxSuppression", nms_args(boxes, scores, limit, iou, score), {"center_point_box": center},
          opset=11)


def test_nms_opset10_and_equal_scores_prefer_lower_index():
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 1], [5, 5, 6, 6], [5, 5, 6, 6]]], np.float32)
    scores = np.array([[[0.5, 0.5, 0.5, 0.9]]], np.float32)
    got = check("NonMaxSuppression", nms_args(boxes, scores, 4, 0.5), opset=10)[0]
    np.testing.assert_array_equal(got, [[0, 0, 3], [0, 0, 0]])


def test_nms_iou_equal_to_threshold_is_kept():
    boxes = np.array([[[0, 0, 1, 2], [0, 1, 1, 3]]], np.float32)
    scores = np.array([[[0.9, 0.8]]], np.float32)
    got = check("NonMaxSuppression", nms_args(boxes, scores, 2, 1 / 3 + 1e-6))[0]
    assert len(got) == 2


def test_nms_defaults_select_nothing():
    boxes, scores = random_boxes(1, 4), rng.uniform(0, 1, (1, 2, 4)).astype(np.float32)
    got = run_kernel("NonMaxSuppression", [boxes, scores])[0]
    assert got.shape == (0, 3) and got.dtype == np.int64
    got = run_kernel("NonMaxSuppression", [boxes, scores, np.array(2, np.int64)])[0]
    assert got.shape == (4, 3)


def test_nms_no_boxes_and_zero_area_boxes():
    got = run_kernel("NonMaxSuppression", nms_args(np.zeros((1, 0, 4), np.float32),
                                                   np.zeros((1, 2, 0), np.float32)))[0]
    assert got.shape == (0, 3)
    boxes = np.array([[[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]]], np.float32)
    check("NonMaxSuppression", nms_args(boxes, np.array([[[0.9, 0.8, 0.7]]], np.float32), 3, 0.0))


def test_nms_infer_is_dynamic_and_checks_shapes():
    ctx = OpContext({}, 11, "test", "NonMaxSuppression")
    cls = lookup("NonMaxSuppression", 11)
    assert cls.dynamic
    out = cls.infer(ctx, [TensorInfo(np.dtype(np.float32), ("b", "n", 4)),
                          TensorInfo(np.dtype(np.float32), ("b", 3, "n"))])
    assert out[0].shape == (None, 3)
    with pytest.raises(ShapeError, match="boxes"):
        cls.infer(ctx, [TensorInfo(np.dtype(np.float32), (1, 5, 4)),
                        TensorInfo(np.dtype(np.float32), (1, 3, 6))])


@settings(max_examples=30, deadline=None)
@given(batches=st.integers(1, 2), classes=st.integers(1, 3), n=st.integers(0, 15),
       limit=st.integers(0, 6), iou=st.floats(0, 1, width=32), center=st.booleans(),
       use_score=st.booleans())
def test_nms_random(batches, classes, n, limit, iou, center, use_score):
    boxes = random_boxes(batches, n, center)
    scores = np.round(rng.uniform(0, 1, (batches, classes, n)), 1).astype(np.float32)
    check("NonMaxSuppression", nms_args(boxes, scores, limit, iou, 0.3 if use_score else None),
          {"center_point_box": int(center)})
