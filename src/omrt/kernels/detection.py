"""Detection kernels: NonMaxSuppression (its output size depends on the scores, so it is dynamic)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ShapeError
from .base import Kernel, OpContext, TensorInfo, register


def _first(a: np.ndarray | None) -> np.generic | None:
    """The value of an optional scalar (or one-element) input, None when absent or empty."""
    return None if a is None or a.size == 0 else a.reshape(-1)[0]


@register("NonMaxSuppression", since=10)
class NonMaxSuppression(Kernel):
    """Greedy per-batch, per-class selection of high-scoring boxes that overlap no better one.

    Spec: "Boxes are suppressed if their IOU with a previously selected box is strictly greater
    than iou_threshold"; only boxes scoring strictly above score_threshold (when given) compete,
    best first (equal scores: lower index first), at most max_output_boxes_per_class (default 0)
    per class. Boxes of zero area, or not overlapping, never suppress. Output rows are
    [batch_index, class_index, box_index], batch-major, then class, then selection order.
    """

    dynamic = True

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        boxes, scores = inputs[0], inputs[1]
        if boxes.rank != 3 or boxes.shape[2] not in (4, None) or scores.rank != 3:
            raise ShapeError(f"{ctx.name}: NonMaxSuppression needs boxes [batches, boxes, 4] and scores "
                             f"[batches, classes, boxes], got {boxes.shape} and {scores.shape}")
        for i, j in ((0, 0), (1, 2)):
            a, b = boxes.shape[i], scores.shape[j]
            if isinstance(a, int) and isinstance(b, int) and a != b:
                raise ShapeError(f"{ctx.name}: boxes {boxes.shape} and scores {scores.shape} disagree "
                                 f"on the number of {'batches' if i == 0 else 'boxes'}")
        return [TensorInfo(np.dtype(np.int64), (None, 3))]

    def _corners(self, boxes: np.ndarray) -> tuple[np.ndarray, ...]:
        """(y_min, x_min, y_max, x_max) arrays of shape [batches, boxes], in the boxes' dtype."""
        if self.ctx.attr("center_point_box", 0):
            xc, yc, w, h = np.moveaxis(boxes, -1, 0)
            half_w, half_h = w / 2, h / 2
            return yc - half_h, xc - half_w, yc + half_h, xc + half_w
        y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
        return np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)

    def run(self, inputs, outputs, workspace):
        inputs = list(inputs) + [None] * (5 - len(inputs))
        boxes, scores = inputs[0], inputs[1]
        limit = _first(inputs[2])
        limit = 0 if limit is None else max(int(limit), 0)
        iou_threshold = _first(inputs[3])
        iou_threshold = boxes.dtype.type(0) if iou_threshold is None else iou_threshold
        score_threshold = _first(inputs[4])
        selected: list[tuple[int, int, int]] = []
        if limit:
            y0, x0, y1, x1 = self._corners(boxes)
            areas = (x1 - x0) * (y1 - y0)
            for b in range(scores.shape[0]):
                corners = (y0[b], x0[b], y1[b], x1[b])
                for c in range(scores.shape[1]):
                    keep = _select(scores[b, c], corners, areas[b], limit, iou_threshold,
                                   score_threshold)
                    selected.extend((b, c, int(i)) for i in keep)
        return [np.array(selected, np.int64).reshape(-1, 3)]


def _select(scores: np.ndarray, corners: tuple[np.ndarray, ...], areas: np.ndarray, limit: int,
            iou_threshold: np.generic, score_threshold: np.generic | None) -> list[int]:
    """Indices kept for one batch and class, in selection order."""
    order = np.arange(scores.shape[0])
    if score_threshold is not None:
        order = order[scores > score_threshold]
    order = order[np.argsort(-scores[order], kind="stable")]
    y0, x0, y1, x1 = corners
    keep: list[int] = []
    while order.size and len(keep) < limit:
        best, rest = order[0], order[1:]
        keep.append(int(best))
        height = np.minimum(y1[rest], y1[best]) - np.maximum(y0[rest], y0[best])
        width = np.minimum(x1[rest], x1[best]) - np.maximum(x0[rest], x0[best])
        inter = width * height
        union = areas[rest] + areas[best] - inter
        overlap = ((width > 0) & (height > 0) & (inter > 0) & (areas[rest] > 0) & (areas[best] > 0)
                   & (union > 0))
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=overlap)
        order = rest[~(overlap & (iou > iou_threshold))]
    return keep
