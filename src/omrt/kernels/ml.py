"""Classic machine-learning kernels of the ai.onnx.ml domain: label encoding, tree ensembles,
feature selection and thresholding.

Lookups are prepared once at load (sorted key arrays, dicts for strings, flat node tables for
trees) so `run` is a handful of vectorized numpy calls; only string lookups go element by element.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import KernelError, ShapeError
from .base import Kernel, OpContext, TensorInfo, register

DOMAIN = "ai.onnx.ml"
_STRING = np.dtype(object)


def _is_string(dtype: np.dtype) -> bool:
    return dtype.kind in "OUS"


def _is_nan(key: Any) -> bool:
    return isinstance(key, (float, np.floating)) and key != key


# ----------------------------------------------------------------------------- LabelEncoder


def _label_mapping(ctx: OpContext) -> tuple[list, list, Any, np.dtype]:
    """(keys, values, default, output dtype) from whichever attributes the node's opset uses."""
    a = ctx.attrs
    if ctx.opset < 2:
        classes = list(a.get("classes_strings", []))
        if "default_string" in a:
            return list(range(len(classes))), classes, a["default_string"], _STRING
        return classes, list(range(len(classes))), int(a.get("default_int64", -1)), np.dtype(np.int64)
    keys = [a[k] for k in ("keys_tensor", "keys_strings", "keys_int64s", "keys_floats") if k in a]
    values = [(k, a[k]) for k in ("values_tensor", "values_strings", "values_int64s", "values_floats")
              if k in a]
    if len(keys) != 1 or len(values) != 1:
        raise ShapeError(f"{ctx.name}: LabelEncoder needs exactly one keys_* and one values_* "
                         f"attribute, got {len(keys)} and {len(values)}")
    (vkind, vals), = values
    if vkind == "values_tensor":
        dtype = _STRING if _is_string(vals.dtype) else vals.dtype
        if "default_tensor" in a:
            default = np.asarray(a["default_tensor"]).reshape(-1)[0]
        else:
            default = "_Unused" if dtype == _STRING else -1 if dtype.kind in "iu" else -0.0
    elif vkind == "values_strings":
        dtype, default = _STRING, a.get("default_string", "_Unused")
    elif vkind == "values_int64s":
        dtype, default = np.dtype(np.int64), int(a.get("default_int64", -1))
    else:
        dtype, default = np.dtype(np.float32), float(a.get("default_float", -0.0))
    keys_list, values_list = list(np.asarray(keys[0]).reshape(-1)), list(np.asarray(vals).reshape(-1))
    if len(keys_list) != len(values_list):
        raise ShapeError(f"{ctx.name}: LabelEncoder has {len(keys_list)} keys but "
                         f"{len(values_list)} values; they must pair up")
    return keys_list, values_list, default, dtype


@register("LabelEncoder", since=1, domain=DOMAIN)
class LabelEncoder(Kernel):
    """Maps every element through the keys -> values table, `default_*` for missing keys.

    "Float keys with value 'NaN' match any input 'NaN' value regardless of bit value. If a key is
    repeated, the last key takes precedence." Numeric keys are searched in a sorted array; opset 1
    maps strings to their index in `classes_strings` and back.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        return [TensorInfo(_label_mapping(ctx)[3], inputs[0].shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        keys, values, default, dtype = _label_mapping(ctx)
        self.string_keys = _is_string(inputs[0].dtype)
        if self.string_keys:
            self.table = dict(zip((str(k) for k in keys), values))
        else:
            table = dict(zip(keys, values))
            nan_keys = [k for k in table if _is_nan(k)]
            self.nan_value = table[nan_keys[-1]] if nan_keys else None
            finite = [k for k in table if not _is_nan(k)]
            order = np.argsort(np.asarray(finite, inputs[0].dtype), kind="stable")
            self.keys = np.asarray(finite, inputs[0].dtype)[order]
            self.values = np.asarray([table[finite[i]] for i in order], dtype)
        self.default = default

    def run(self, inputs, outputs, workspace):
        x, out = inputs[0].reshape(-1), outputs[0].reshape(-1)
        if self.string_keys:
            table, default = self.table, self.default
            out[:] = [table.get(k, default) for k in x.tolist()]
            return
        out.fill(self.default)
        if self.keys.size:
            pos = np.minimum(np.searchsorted(self.keys, x), self.keys.size - 1)
            hit = self.keys[pos] == x
            out[hit] = self.values[pos[hit]]
        if self.nan_value is not None:
            out[np.isnan(x)] = self.nan_value


# ----------------------------------------------------------------------------- TreeEnsemble

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_COMPARE = {_LEQ: np.less_equal, _LT: np.less, _GTE: np.greater_equal, _GT: np.greater,
            _EQ: np.equal, _NEQ: np.not_equal}
_AVERAGE, _SUM, _MIN, _MAX = range(4)
_TRANSFORMS = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO"}


def post_transform(y: np.ndarray, code: int) -> None:
    """Apply an ai.onnx.ml post_transform (NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO) to rows of `y`.

    SOFTMAX_ZERO is onnxruntime's: entries within 1e-7 of zero stay zero, the others share the
    softmax mass.
    """
    if code in (1, 3):
        top = np.max(y, axis=-1, keepdims=True)
        zero = np.abs(y) <= 1e-7 if code == 3 else None
        y -= top
        np.exp(y, out=y)
        if zero is not None:
            y[zero] = 0
        np.divide(y, np.sum(y, axis=-1, keepdims=True), out=y)
    elif code == 2:
        np.negative(y, out=y)
        np.exp(y, out=y)
        y += 1
        np.reciprocal(y, out=y)


@register("TreeEnsemble", since=5, domain=DOMAIN)
class TreeEnsemble(Kernel):
    """Sum/average/min/max of the leaves every tree routes each row of X [N, F] to, per target.

    All rows walk all trees together, one tree level per step: the current node of every
    (row, tree) pair is a vector, and one comparison per node mode moves the pairs on.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.dtype.kind != "f" or x.rank != 2:
            raise ShapeError(f"{ctx.name}: TreeEnsemble takes a float X of shape [N, F], got "
                             f"{x.dtype}{x.shape}")
        for a in ("n_targets", "tree_roots", "nodes_modes", "nodes_featureids", "nodes_splits",
                  "nodes_truenodeids", "nodes_falsenodeids", "leaf_weights", "leaf_targetids"):
            if a not in ctx.attrs:
                raise ShapeError(f"{ctx.name}: TreeEnsemble needs the attribute {a!r}")
        if int(ctx.attr("post_transform", 0)) not in _TRANSFORMS:
            raise ShapeError(f"{ctx.name}: TreeEnsemble post_transform {ctx.attrs['post_transform']} "
                             f"is not supported; use one of {_TRANSFORMS}")
        if int(ctx.attr("aggregate_function", _SUM)) not in (_AVERAGE, _SUM, _MIN, _MAX):
            raise ShapeError(f"{ctx.name}: TreeEnsemble aggregate_function must be 0-3")
        return [TensorInfo(x.dtype, (x.shape[0], int(ctx.attrs["n_targets"])))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        a = ctx.attrs
        dtype = inputs[0].dtype
        self.modes = np.asarray(a["nodes_modes"]).astype(np.int64).reshape(-1)
        n = self.modes.size
        self.features = np.asarray(a["nodes_featureids"], np.int64)
        self.splits = np.asarray(a["nodes_splits"]).astype(dtype).reshape(-1)
        self.true_ids = np.asarray(a["nodes_truenodeids"], np.int64)
        self.false_ids = np.asarray(a["nodes_falsenodeids"], np.int64)
        self.true_leaf = np.asarray(a.get("nodes_trueleafs", [0] * n), bool)
        self.false_leaf = np.asarray(a.get("nodes_falseleafs", [0] * n), bool)
        self.nan_true = np.asarray(a.get("nodes_missing_value_tracks_true") or [0] * n, bool)
        self.roots = np.asarray(a["tree_roots"], np.int64)
        self.weights = np.asarray(a["leaf_weights"]).astype(dtype).reshape(-1)
        self.targets = np.asarray(a["leaf_targetids"], np.int64)
        lengths = {len(v) for v in (self.features, self.splits, self.true_ids, self.false_ids,
                                    self.true_leaf, self.false_leaf, self.nan_true)}
        if lengths != {n} or self.weights.size != self.targets.size:
            raise ShapeError(f"{ctx.name}: TreeEnsemble nodes_* attributes must all have "
                             f"{n} entries and leaf_* attributes one length")
        self.members: dict[int, np.ndarray] = {}
        member_nodes = np.flatnonzero(self.modes == _MEMBER)
        if member_nodes.size:
            values = np.asarray(a.get("membership_values", np.zeros(0))).astype(dtype).reshape(-1)
            sets = np.split(values, np.flatnonzero(np.isnan(values)) + 1)
            sets = [s[~np.isnan(s)] for s in sets]
            if len([s for s in sets if s.size]) < member_nodes.size:
                raise ShapeError(f"{ctx.name}: TreeEnsemble has {member_nodes.size} BRANCH_MEMBER "
                                 f"nodes but fewer NaN-delimited membership_values sets")
            self.members = dict(zip(member_nodes.tolist(), sets))
        self.aggregate = int(a.get("aggregate_function", _SUM))
        self.transform = int(a.get("post_transform", 0))

    def _leaves(self, x: np.ndarray) -> np.ndarray:
        """The leaf index every (row, tree) pair ends in, shape [N, trees]."""
        rows = np.repeat(np.arange(x.shape[0]), self.roots.size)
        node = np.tile(self.roots, x.shape[0])
        leaf = np.empty(node.size, np.int64)
        active = np.arange(node.size)
        for _ in range(self.modes.size + 1):
            if not active.size:
                return leaf.reshape(x.shape[0], self.roots.size)
            at = node[active]
            value = x[rows[active], self.features[at]]
            mode = self.modes[at]
            take_true = np.zeros(at.size, bool)
            for m in np.unique(mode).tolist():
                sel = mode == m
                if m == _MEMBER:
                    for nid in np.unique(at[sel]).tolist():
                        one = at == nid
                        take_true[one] = np.isin(value[one], self.members[nid])
                else:
                    take_true[sel] = _COMPARE[m](value[sel], self.splits[at[sel]])
            take_true |= self.nan_true[at] & np.isnan(value)
            nxt = np.where(take_true, self.true_ids[at], self.false_ids[at])
            done = np.where(take_true, self.true_leaf[at], self.false_leaf[at])
            leaf[active[done]] = nxt[done]
            node[active[~done]] = nxt[~done]
            active = active[~done]
        raise KernelError(f"{self.ctx.name}: TreeEnsemble trees do not reach a leaf (a cycle in "
                         f"nodes_truenodeids/nodes_falsenodeids)")

    def run(self, inputs, outputs, workspace):
        x, y = inputs[0], outputs[0]
        leaves = self._leaves(x)
        rows = np.broadcast_to(np.arange(x.shape[0])[:, None], leaves.shape)
        cols, vals = self.targets[leaves], self.weights[leaves]
        if self.aggregate in (_SUM, _AVERAGE):
            y.fill(0)
            np.add.at(y, (rows, cols), vals)
            if self.aggregate == _AVERAGE:
                y /= self.roots.size
        elif self.aggregate == _MIN:
            y.fill(np.finfo(y.dtype).max)
            np.minimum.at(y, (rows, cols), vals)
        else:
            y.fill(np.finfo(y.dtype).min)
            np.maximum.at(y, (rows, cols), vals)
        post_transform(y, self.transform)


# ----------------------------------------------------------------------------- small ops


@register("ArrayFeatureExtractor", since=1, domain=DOMAIN)
class ArrayFeatureExtractor(Kernel):
    """Selects the (flattened) indices Y along the last axis of X; a 1-D X gives a [1, k] result,
    as onnxruntime does."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x, idx = inputs
        if idx.dtype != np.int64:
            raise ShapeError(f"{ctx.name}: ArrayFeatureExtractor indices must be int64, got {idx.dtype}")
        k = 1
        for d in idx.shape:
            k = k * d if isinstance(k, int) and isinstance(d, int) else None
        lead = (1,) if x.rank == 1 else tuple(x.shape[:-1])
        return [TensorInfo(x.dtype, lead + (k,))]

    def run(self, inputs, outputs, workspace):
        x, idx = inputs
        if x.ndim == 0 or (idx.size and (idx.min() < -x.shape[-1] or idx.max() >= x.shape[-1])):
            raise KernelError(f"{self.ctx.name}: ArrayFeatureExtractor index out of range for the "
                             f"last axis of X (size {x.shape[-1] if x.ndim else 0})")
        out = outputs[0]
        np.take(x, idx.reshape(-1), axis=-1, out=out.reshape(x.shape[:-1] + (idx.size,)))


@register("Binarizer", since=1, domain=DOMAIN)
class Binarizer(Kernel):
    """1 where X > threshold (0.0 by default), else 0, in X's dtype."""

    inplace = {0: 0}

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if x.dtype.kind not in "fiu":
            raise ShapeError(f"{ctx.name}: Binarizer takes a numeric tensor, got {x.dtype}")
        return [TensorInfo(x.dtype, x.shape)]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.threshold = float(ctx.attr("threshold", 0.0))

    def run(self, inputs, outputs, workspace):
        np.greater(inputs[0], self.threshold, out=outputs[0], casting="unsafe")
