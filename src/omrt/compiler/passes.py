"""Graph rewrites run once at compile time: dead code, BatchNorm folding, producer fusion."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Iterator

import numpy as np

from ..ir import Graph, Node
from ..kernels import kernel_of, lookup, packed, recurrent, winograd
from ..kernels.base import FUSED_ACTIVATIONS, UnsupportedOpError
from ..kernels.linalg import PERMS
from ..native.bindings import activation_code


def remove_dead_code(graph: Graph) -> Graph:
    """Drop nodes none of whose outputs reach a graph output, and unused constants."""
    live = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(v for v in node.inputs if v)
    graph.nodes = kept[::-1]
    graph.constants = {k: v for k, v in graph.constants.items() if k in live}
    graph.infos = {k: v for k, v in graph.infos.items()
                   if k in live or k in graph.inputs or any(k in n.outputs for n in graph.nodes)}
    return graph


def _sole_consumer(graph: Graph, value: str, uses: dict[str, list[int]]) -> int | None:
    """The index of the only node reading `value`, if it is read once and is not a graph output."""
    readers = uses.get(value, [])
    if len(readers) != 1 or value in graph.outputs:
        return None
    return readers[0]


def _rewire(graph: Graph, old: str, new: str) -> None:
    """Make every reader of `old` read `new` instead (and graph outputs keep their names)."""
    for n in graph.nodes:
        n.inputs = [new if v == old else v for v in n.inputs]


def fold_batchnorm(graph: Graph) -> Graph:
    """Conv followed by inference BatchNormalization with constant statistics -> one Conv.

    W' = W * s, B' = (B - mean) * s + beta with s = scale / sqrt(var + epsilon), per output channel.
    """
    uses = graph.consumers()
    drop: set[int] = set()
    for i, conv in enumerate(graph.nodes):
        if conv.op_type != "Conv" or conv.domain or len(conv.inputs) < 2:
            continue
        j = _sole_consumer(graph, conv.outputs[0], uses)
        if j is None:
            continue
        bn = graph.nodes[j]
        if bn.op_type != "BatchNormalization" or len([o for o in bn.outputs if o]) != 1:
            continue
        if bn.attrs.get("training_mode", 0):
            continue
        stats = [graph.constants.get(v) for v in bn.inputs[1:5]]
        w = graph.constants.get(conv.inputs[1])
        b = graph.constants.get(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or any(s is None for s in stats) or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
            continue
        scale, beta, mean, var = (np.asarray(s, np.float64) for s in stats)
        s = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        new_w = (w * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        new_b = ((0.0 if b is None else b) - mean) * s + beta
        wname, bname = f"{conv.outputs[0]}__bn_w", f"{conv.outputs[0]}__bn_b"
        graph.add_constant(wname, new_w)
        graph.add_constant(bname, new_b.astype(w.dtype))
        conv.inputs = [conv.inputs[0], wname, bname]
        out = bn.outputs[0]
        graph.infos[out] = graph.infos[conv.outputs[0]]
        conv.outputs = [out]
        drop.add(j)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


def _per_channel(value: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """`value` as a (channels,) vector if it broadcasts along axis 1 only of a rank-`rank` tensor."""
    if value.ndim > rank or value.dtype.kind != "f":
        return None
    full = value.reshape((1,) * (rank - value.ndim) + value.shape)
    if any(d != 1 for i, d in enumerate(full.shape) if i != 1) or full.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(full.reshape(-1), (channels,)).astype(np.float64)


def fold_channel_affine(graph: Graph) -> Graph:
    """Fold a per-channel constant Mul or Add after Conv or inference BatchNormalization into it.

    Conv: W' = W * m (per output channel), B' = B * m + a. BatchNormalization:
    scale' = scale * m, B' = B * m + a. Repeats until nothing folds.
    """
    changed = True
    while changed:
        changed = False
        uses = graph.consumers()
        producers = graph.producers()
        for j, op in enumerate(graph.nodes):
            if op.op_type not in ("Mul", "Add") or op.domain or len(op.inputs) != 2:
                continue
            data = next((v for v in op.inputs if v in producers and v not in graph.constants), None)
            const = next((v for v in op.inputs if v in graph.constants), None)
            if data is None or const is None or _sole_consumer(graph, data, uses) != j:
                continue
            prod = graph.nodes[producers[data]]
            info = graph.infos[data]
            if (prod.op_type not in ("Conv", "BatchNormalization") or prod.domain or "_act" in prod.attrs
                    or info.rank < 2 or not isinstance(info.shape[1], int)
                    or graph.infos[op.outputs[0]].shape != info.shape
                    or len([o for o in prod.outputs if o]) != 1):
                continue
            vec = _per_channel(graph.constants[const], info.rank, info.shape[1])
            if vec is None:
                continue
            if prod.op_type == "Conv":
                w = graph.constants.get(prod.inputs[1])
                has_b = len(prod.inputs) > 2 and prod.inputs[2]
                b = graph.constants.get(prod.inputs[2]) if has_b else np.zeros(info.shape[1], info.dtype)
                if w is None or b is None or int(prod.attrs.get("group", 1)) < 1:
                    continue
                scale_name, bias_name = prod.inputs[1], prod.inputs[2] if has_b else ""
                scale = w.astype(np.float64)
                per = (-1,) + (1,) * (w.ndim - 1)
            else:
                if prod.attrs.get("training_mode", 0) or any(v not in graph.constants for v in prod.inputs[1:5]):
                    continue
                scale_name, bias_name = prod.inputs[1], prod.inputs[2]
                scale = graph.constants[scale_name].astype(np.float64)
                b = graph.constants[bias_name]
                per = (-1,)
            bias = b.astype(np.float64)
            if op.op_type == "Mul":
                scale = scale * vec.reshape(per)
                bias = bias * vec
            else:
                bias = bias + vec
            tag = f"{op.outputs[0]}__affine"
            graph.add_constant(f"{tag}_s", scale.astype(graph.constants.get(scale_name, b).dtype))
            graph.add_constant(f"{tag}_b", bias.astype(b.dtype))
            prod.inputs = [prod.inputs[0], f"{tag}_s", f"{tag}_b", *prod.inputs[3:]]
            prod.outputs = [op.outputs[0]]
            graph.nodes.pop(j)
            changed = True
            break
    return remove_dead_code(graph)


def _pointwise_conv_weights(graph: Graph, conv: Node | None, x: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(W, B) of `conv` when it is a 1x1 Conv of `x` without padding or groups, with constant
    weights (B zeros when absent): a map that is affine per pixel; else None."""
    if conv is None or conv.op_type != "Conv" or conv.domain or conv.inputs[0] != x or x in conv.inputs[1:]:
        return None
    w = graph.constants.get(conv.inputs[1])
    has_b = len(conv.inputs) > 2 and conv.inputs[2]
    b = graph.constants.get(conv.inputs[2]) if has_b else None
    if (w is None or w.dtype.kind != "f" or (has_b and b is None) or int(conv.attrs.get("group", 1)) != 1
            or any(d != 1 for d in w.shape[2:]) or any(conv.attrs.get("pads", ()))):
        return None
    return w, np.zeros(w.shape[0], w.dtype) if b is None else b


def fold_preactivation_batchnorm(graph: Graph) -> Graph:
    """BatchNormalization -> Relu -> 1x1 Conv (the pre-activation block) -> Max (and Min) -> Conv.

    With s = scale / sqrt(var + epsilon) and t = B - mean * s per channel, and the knee k = -t / s,
    Relu(s * x + t) = s * Max(x, k) + t where s > 0 and s * Min(x, k) + t where s < 0. The 1x1 Conv
    is affine per pixel, so it takes s and t: W' = W * s (per input channel), B' = B + W . t. What
    is left of the normalization and its activation is one broadcasting Max, a single pass over x
    instead of three (and a Min in place when some channels have s < 0).
    """
    uses = graph.consumers()
    drop: set[int] = set()
    for i, bn in enumerate(graph.nodes):
        if (bn.op_type != "BatchNormalization" or bn.domain or bn.attrs.get("training_mode", 0)
                or len([o for o in bn.outputs if o]) != 1 or graph.infos[bn.inputs[0]].dtype.kind != "f"
                or any(v not in graph.constants for v in bn.inputs[1:5])):
            continue
        j = _sole_consumer(graph, bn.outputs[0], uses)
        relu = graph.nodes[j] if j is not None else None
        if relu is None or relu.op_type != "Relu" or relu.domain:
            continue
        k = _sole_consumer(graph, relu.outputs[0], uses)
        conv = graph.nodes[k] if k is not None else None
        wb = _pointwise_conv_weights(graph, conv, relu.outputs[0])
        if wb is None:
            continue
        scale, beta, mean, var = (graph.constants[v].astype(np.float64) for v in bn.inputs[1:5])
        s = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        t = beta - mean * s
        with np.errstate(divide="ignore", invalid="ignore"):
            knee = -t / s
        if not np.all(np.isfinite(knee)):
            continue
        w, b = wb
        x, y = bn.inputs[0], relu.outputs[0]
        info = graph.infos[x]
        bounds = [(op, np.where(side, knee, far)) for op, side, far in
                  (("Max", s > 0, -np.inf), ("Min", s < 0, np.inf)) if side.any()]
        steps = []
        for n, (op, bound) in enumerate(bounds):
            name = f"{y}__{op.lower()}"
            graph.add_constant(name, bound.reshape((-1,) + (1,) * (info.rank - 2)).astype(info.dtype))
            out = y if n == len(bounds) - 1 else f"{y}__lower"
            graph.infos[out] = graph.infos[y]
            steps.append(Node(op, [steps[-1].outputs[0] if steps else x, name], [out], {}, "", bn.name))
        wname, bname = f"{conv.outputs[0]}__pre_w", f"{conv.outputs[0]}__pre_b"
        graph.add_constant(wname, (w * s.reshape((1, -1) + (1,) * (w.ndim - 2))).astype(w.dtype))
        graph.add_constant(bname, (b + w.reshape(w.shape[0], -1) @ t).astype(b.dtype))
        conv.inputs = [conv.inputs[0], wname, bname]
        graph.nodes[i] = steps[0]
        if len(steps) > 1:
            graph.nodes[j] = steps[1]
        else:
            drop.add(j)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


def _activation_attrs(node: Node, graph: Graph) -> dict | None:
    """The `_act*` attributes that fold activation `node` into its producer, or None if it cannot."""
    op = node.op_type
    if op not in FUSED_ACTIVATIONS or node.domain:
        return None
    if op == "LeakyRelu":
        return {"_act": op, "_act_alpha": float(node.attrs.get("alpha", 0.01))}
    if op == "HardSigmoid":
        return {"_act": op, "_act_alpha": float(node.attrs.get("alpha", 0.2)),
                "_act_beta": float(node.attrs.get("beta", 0.5))}
    if op == "Clip":
        if graph.opset("") < 11:
            lo, hi = node.attrs.get("min", -np.inf), node.attrs.get("max", np.inf)
        else:
            names = (list(node.inputs[1:3]) + ["", ""])[:2]
            if any(v and v not in graph.constants for v in names):
                return None
            lo, hi = (graph.constants[v] if v else d for v, d in zip(names, (-np.inf, np.inf)))
        return {"_act": op, "_act_alpha": float(lo), "_act_beta": float(hi)}
    return {"_act": op}


def fuse_activations(graph: Graph) -> Graph:
    """Fold an activation into the producer of its input when the producer's kernel applies it."""
    uses = graph.consumers()
    producers = graph.producers()
    drop: set[int] = set()
    for j, act in enumerate(graph.nodes):
        attrs = _activation_attrs(act, graph)
        if attrs is None or not act.inputs or act.inputs[0] not in producers:
            continue
        i = producers[act.inputs[0]]
        prod = graph.nodes[i]
        if i in drop or "_act" in prod.attrs or _sole_consumer(graph, act.inputs[0], uses) != j:
            continue
        cls = kernel_of(prod, graph)
        if attrs["_act"] not in cls.fuses or graph.infos[act.inputs[0]].dtype.kind != "f":
            continue
        prod.attrs = {**prod.attrs, **attrs}
        prod.outputs = [act.outputs[0]] + prod.outputs[1:]
        drop.add(j)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


def fuse_matmul_bias(graph: Graph) -> Graph:
    """MatMul(A, B) + bias (a constant over the last dim) -> omrt::FusedMatMul(A, B, bias)."""
    try:
        lookup("FusedMatMul", 1, "omrt")
    except UnsupportedOpError:
        return graph
    uses = graph.consumers()
    drop: set[int] = set()
    for i, mm in enumerate(graph.nodes):
        if mm.op_type != "MatMul" or mm.domain:
            continue
        j = _sole_consumer(graph, mm.outputs[0], uses)
        if j is None:
            continue
        add = graph.nodes[j]
        if add.op_type != "Add" or add.domain:
            continue
        bias = next((v for v in add.inputs if v != mm.outputs[0]), None)
        bval = graph.constants.get(bias) if bias else None
        out_info = graph.infos[add.outputs[0]]
        if (bval is None or bval.ndim != 1 or out_info != graph.infos[mm.outputs[0]]
                or bval.shape[0] != out_info.shape[-1] or bval.dtype != out_info.dtype):
            continue
        graph.nodes[i] = Node("FusedMatMul", [mm.inputs[0], mm.inputs[1], bias], [add.outputs[0]],
                              {}, "omrt", mm.name)
        graph.opsets.setdefault("omrt", 1)
        drop.add(j)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


def _scalar(graph: Graph, value: str) -> float | None:
    """The value of a one-element float constant, else None."""
    c = graph.constants.get(value)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 and c.dtype.kind == "f" else None


def _other(node: Node, value: str) -> str | None:
    """The input of binary `node` that is not `value` (None when `value` is not an input)."""
    if len(node.inputs) != 2 or value not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == value else node.inputs[0]


def _gelu_tail(graph: Graph, x: str, plus: str, uses: dict[str, list[int]]) -> list[int] | None:
    """The Mul nodes that turn `plus` = 1 + erf into x * 0.5 * (1 + erf), the last one last.

    Accepted: (x * 0.5) * plus, (x * plus) * 0.5 and x * (plus * 0.5), operands in either order.
    """
    first = _sole_consumer(graph, plus, uses)
    mul = graph.nodes[first] if first is not None else None
    if mul is None or mul.op_type != "Mul" or mul.domain:
        return None
    other = _other(mul, plus)
    if other == x or _scalar(graph, other) == 0.5:
        second = _sole_consumer(graph, mul.outputs[0], uses)
        last = graph.nodes[second] if second is not None else None
        if last is None or last.op_type != "Mul" or last.domain:
            return None
        rest = _other(last, mul.outputs[0])
        fits = _scalar(graph, rest) == 0.5 if other == x else rest == x
        return [first, second] if fits else None
    producers = graph.producers()
    half = graph.nodes[producers[other]] if other in producers else None
    if (half is None or half.op_type != "Mul" or half.domain or _scalar(graph, _other(half, x)) != 0.5
            or _sole_consumer(graph, other, uses) != first):
        return None
    return [producers[other], first]


def fuse_gelu(graph: Graph) -> Graph:
    """x * 0.5 * (1 + Erf(x / sqrt(2))), the Gelu that exporters write before opset 20, -> omrt::Gelu.

    The division may be a multiplication by 1 / sqrt(2), and the three products may associate in
    any order. One node instead of five runs the whole formula chunk by chunk in cache.
    """
    try:
        lookup("Gelu", 1, "omrt")
    except UnsupportedOpError:
        return graph
    uses = graph.consumers()
    producers = graph.producers()
    drop: set[int] = set()
    for k, erf in enumerate(graph.nodes):
        if erf.op_type != "Erf" or erf.domain or erf.inputs[0] not in producers:
            continue
        i = producers[erf.inputs[0]]
        scale = graph.nodes[i]
        if scale.domain or len(scale.inputs) != 2 or _sole_consumer(graph, erf.inputs[0], uses) != k:
            continue
        if scale.op_type == "Div":
            x, c, want = scale.inputs[0], _scalar(graph, scale.inputs[1]), np.sqrt(2)
        elif scale.op_type == "Mul":
            x = next((v for v in scale.inputs if v not in graph.constants), scale.inputs[0])
            c, want = _scalar(graph, _other(scale, x)), np.sqrt(0.5)
        else:
            continue
        if c is None or not np.isclose(c, want, rtol=1e-6) or graph.infos[x].dtype.kind != "f":
            continue
        j = _sole_consumer(graph, erf.outputs[0], uses)
        add = graph.nodes[j] if j is not None else None
        if (add is None or add.op_type != "Add" or add.domain
                or _scalar(graph, _other(add, erf.outputs[0])) != 1):
            continue
        tail = _gelu_tail(graph, x, add.outputs[0], uses)
        if tail is None or drop & {i, k, j, *tail}:
            continue
        out = graph.nodes[tail[-1]].outputs[0]
        if graph.infos[out] != graph.infos[x]:
            continue
        graph.nodes[tail[-1]] = Node("Gelu", [x], [out], {}, "omrt", erf.name)
        graph.opsets.setdefault("omrt", 1)
        drop.update({i, k, j, *tail[:-1]})
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


_LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def _is_matmul(node: Node) -> bool:
    return (node.op_type, node.domain) in (("MatMul", ""), ("FusedMatMul", "omrt"))


def _projection(graph: Graph, value: str, uses: dict[str, list[int]],
                producers: dict[str, int]) -> Node | None:
    """The MatMul or FusedMatMul with constant weight (and bias) that `value` is a re-layout of,
    every value on the way read once; None if there is none."""
    while value in producers:
        i = producers[value]
        if _sole_consumer(graph, value, uses) is None:
            return None
        node = graph.nodes[i]
        if node.op_type in _LAYOUT_OPS and not node.domain:
            value = node.inputs[0]
            continue
        constant = all(v in graph.constants for v in node.inputs[1:])
        return node if _is_matmul(node) and constant and "_act" not in node.attrs else None
    return None


def fold_matmul_scale(graph: Graph) -> Graph:
    """MatMul(A, B) / c (or * c), c a scalar constant, -> c folded into the projection A or B is.

    Attention divides its scores by sqrt(head size); when the query (or the key) is a projection
    with constant weight and bias, reached through layout ops only (Reshape, Transpose, ...), its
    weight and bias are scaled instead and the division disappears. For a power of two, as in
    BERT's sqrt(64), the result is bit for bit the same.
    """
    uses = graph.consumers()
    producers = graph.producers()
    drop: set[int] = set()
    for j, op in enumerate(graph.nodes):
        if op.op_type not in ("Div", "Mul") or op.domain or len(op.inputs) != 2:
            continue
        data, const = op.inputs
        if op.op_type == "Mul" and _scalar(graph, const) is None:
            data, const = const, data
        c = _scalar(graph, const)
        mm = graph.nodes[producers[data]] if data in producers else None
        # a plain product only: a bias or an activation in it would not scale with the operand
        if (not c or mm is None or (mm.op_type, mm.domain) != ("MatMul", "") or "_act" in mm.attrs
                or _sole_consumer(graph, data, uses) != j or graph.infos[op.outputs[0]] != graph.infos[data]):
            continue
        proj = next((p for p in (_projection(graph, v, uses, producers) for v in mm.inputs[:2]) if p), None)
        if proj is None:
            continue
        factor = 1 / c if op.op_type == "Div" else c
        scaled = []
        for k, v in enumerate(proj.inputs[1:], 1):
            w = graph.constants[v]
            name = f"{proj.outputs[0]}__scaled_{k}"
            graph.add_constant(name, (w.astype(np.float64) * factor).astype(w.dtype))
            scaled.append(name)
        proj.inputs = [proj.inputs[0], *scaled]
        mm.outputs = [op.outputs[0]]
        drop.add(j)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


def _transpose_perm(graph: Graph, node: Node | None) -> list[int] | None:
    """The permutation of a Transpose node of rank >= 2 (reversed axes by default), else None."""
    if node is None or node.op_type != "Transpose" or node.domain:
        return None
    perm = node.attrs.get("perm")
    if perm is None:
        info = graph.infos.get(node.inputs[0])
        if info is None or info.shape is None:
            return None
        perm = range(info.rank - 1, -1, -1)
    perm = [int(p) for p in perm]
    return perm if len(perm) >= 2 else None


def fold_transposes_into_matmul(graph: Graph) -> Graph:
    """Transposes of a MatMul's operands or of its product -> read and written as strided views.

    Attention splits heads with Transpose before its two MatMuls and merges them with one after.
    A Transpose of an operand folds when the operand's last (contiguous) axis stays one of the two
    matrix axes, and one of the product when the stored last axis is one of them: numpy then hands
    every matrix to BLAS with a unit stride, and the transposed copies are never made.
    """
    uses = graph.consumers()
    producers = graph.producers()
    drop: set[int] = set()
    for mm in graph.nodes:
        if not _is_matmul(mm) or any(k in mm.attrs for k in PERMS):
            continue
        attrs = dict(mm.attrs)
        for k, key in enumerate(PERMS[:2]):
            src = graph.nodes[producers[mm.inputs[k]]] if mm.inputs[k] in producers else None
            perm = _transpose_perm(graph, src)
            if perm is not None and len(perm) - 1 in perm[-2:]:
                mm.inputs = [src.inputs[0] if i == k else v for i, v in enumerate(mm.inputs)]
                attrs[key] = perm
        j = _sole_consumer(graph, mm.outputs[0], uses)
        perm = _transpose_perm(graph, graph.nodes[j] if j is not None else None)
        if perm is not None and perm[-1] >= len(perm) - 2:
            attrs["_perm_y"] = perm
            mm.outputs = [graph.nodes[j].outputs[0]]
            drop.add(j)
        mm.attrs = attrs
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


def _shuffle_of(graph: Graph, conv: Node, uses: dict[str, list[int]]) -> list[int] | None:
    """The indices of the Reshape, Transpose and Reshape that shuffle the channels of `conv`'s
    output across its G groups (ShuffleNet's channel shuffle), when they do exactly that and
    nothing else reads what they pass on; else None."""
    group = int(conv.attrs.get("group", 1))
    shape = graph.infos[conv.outputs[0]].shape
    if group < 2 or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
        return None
    n, m, h, w = shape
    expected = [("Reshape", (n, group, m // group, h, w)), ("Transpose", (n, m // group, group, h, w)),
                ("Reshape", (n, m, h, w))]
    chain, value = [], conv.outputs[0]
    for op_type, out_shape in expected:
        j = _sole_consumer(graph, value, uses)
        node = graph.nodes[j] if j is not None else None
        if (node is None or node.op_type != op_type or node.domain or node.inputs[0] != value
                or tuple(graph.infos[node.outputs[0]].shape) != out_shape
                or (op_type == "Transpose" and list(node.attrs.get("perm", [])) != [0, 2, 1, 3, 4])):
            return None
        chain.append(j)
        value = node.outputs[0]
    return chain


def fold_channel_shuffles(graph: Graph) -> Graph:
    """A grouped Conv followed by the channel shuffle across its groups (Reshape, Transpose,
    Reshape) -> one omrt::ShuffledConv, which writes each filter's plane where the shuffle puts it:
    the shuffle's copy goes."""
    uses = graph.consumers()
    drop: set[int] = set()
    for conv in graph.nodes:
        if conv.op_type != "Conv" or conv.domain or conv.outputs[0] not in graph.infos:
            continue
        chain = _shuffle_of(graph, conv, uses)
        if chain is None:
            continue
        conv.op_type, conv.domain = "ShuffledConv", "omrt"
        conv.outputs = [graph.nodes[chain[-1]].outputs[0]]
        graph.opsets.setdefault("omrt", 1)
        drop.update(chain)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return remove_dead_code(graph)


def optimize(graph: Graph) -> Graph:
    """The compile-time pipeline, in the order that exposes the most fusion."""
    for rewrite in (remove_dead_code, fold_batchnorm, fold_channel_affine, fold_preactivation_batchnorm,
                    fuse_matmul_bias, fuse_activations, fold_channel_shuffles, fuse_gelu, fold_matmul_scale,
                    fold_transposes_into_matmul):
        graph = rewrite(graph)
    return graph


def _derive_weight(graph: Graph, node: Node, op_type: str, suffix: str, derive: Callable[[np.ndarray], np.ndarray]
                   ) -> None:
    """Rewrite `node` (X, W[, B]) as omrt::`op_type` (X, W, B or "", W') with W' = derive(W) added
    as the weight W + `suffix`, once for all the nodes that share W. The node keeps W: without
    the native library it runs as the op it was."""
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    derived = _derived(graph, node.inputs[1], suffix, derive)
    _become(graph, node, op_type, [node.inputs[0], node.inputs[1], bias, derived])


def _derived(graph: Graph, source: str, suffix: str, derive: Callable[[np.ndarray], np.ndarray]) -> str:
    """The name of the weight derive(`source`), named `source` + `suffix`: added once, for every
    node that reads it."""
    name = f"{source}{suffix}"
    if name not in graph.constants:
        graph.add_constant(name, derive(graph.constants[source]))
    return name


def _become(graph: Graph, node: Node, op_type: str, inputs: list[str]) -> None:
    """Make `node` omrt::`op_type` over `inputs`."""
    node.op_type, node.domain, node.inputs = op_type, "omrt", inputs
    graph.opsets.setdefault("omrt", 1)


def _convs(graph: Graph, shuffled: bool = False) -> Iterator[tuple[Node, np.ndarray]]:
    """The plain Convs (and with `shuffled`, the omrt::ShuffledConvs) with constant filters, and
    their filters."""
    for node in graph.nodes:
        kind = (node.op_type, node.domain or "")
        plain = (kind == ("Conv", "") or (shuffled and kind == ("ShuffledConv", "omrt"))) and len(node.inputs) > 1
        w = graph.constants.get(node.inputs[1]) if plain else None
        if w is not None:
            yield node, w


def use_winograd(graph: Graph) -> Graph:
    """Rewrite the Convs that Winograd speeds up as omrt::WinogradConv, adding their transformed
    filters as weights (see omrt.kernels.winograd). Only worth it when the native library is
    packed, since the transforms are C loops."""
    for node, w in list(_convs(graph)):
        if winograd.eligible(node.attrs, graph.infos[node.inputs[0]], w):
            tile = winograd.tile_for(node.attrs, graph.infos[node.inputs[0]], w)
            _derive_weight(graph, node, "WinogradConv", f"__winograd{tile}",
                           lambda w, tile=tile: winograd.packed_transform(w, tile))
    return graph


def use_packed_filters(graph: Graph) -> Graph:
    """Rewrite the 2-d Convs left after use_winograd as omrt::PackedConv (ShuffledConvs as
    omrt::PackedShuffledConv), adding their filters packed for omrt's own GEMM, group by group, as
    weights (see omrt.kernels.packed): in panels, or for layers of few positions (7x7, 14x14)
    in strips with the filters in the vector lanes (attribute `lanes`). Only worth it when the
    native library is packed."""
    for node, w in list(_convs(graph, shuffled=True)):
        if packed.eligible(node.attrs, graph.infos[node.inputs[0]], w):
            group = int(node.attrs.get("group", 1))
            out = graph.infos[node.outputs[0]].shape
            lanes = packed.filter_lanes(math.prod(out[2:]), w.shape[0] // group, math.prod(w.shape[1:]))
            kind = "__lanes" if lanes else "__panels"
            pack = packed.pack_filter_strips if lanes else packed.pack_panels
            _derive_weight(graph, node, f"Packed{node.op_type}", kind if group == 1 else f"{kind}{group}",
                           lambda w, group=group, pack=pack: pack(w, group))
            if lanes:
                node.attrs["lanes"] = 1
    return graph


def use_packed_products(graph: Graph) -> Graph:
    """Rewrite the MatMuls and FusedMatMuls by a constant matrix as omrt::PackedMatMul, adding the
    matrix packed for omrt's own GEMM as a weight (see omrt.kernels.packed). Only worth it when
    the native library is packed."""
    for node in graph.nodes:
        if (node.op_type, node.domain) not in (("MatMul", ""), ("FusedMatMul", "omrt")):
            continue
        b = graph.constants.get(node.inputs[1])
        bias = node.inputs[2] if len(node.inputs) > 2 else ""
        if b is not None and packed.product_eligible(node.attrs, graph.infos[node.inputs[0]], b,
                                                     graph.infos[bias] if bias else None):
            _derive_weight(graph, node, "PackedMatMul", "__strips", packed.pack_strips)
    return graph


def use_packed_recurrences(graph: Graph) -> Graph:
    """Rewrite the LSTMs and GRUs whose weights are constants and whose time loop runs in C as
    omrt::PackedLSTM and omrt::PackedGRU, adding W^T in strips for omrt's own GEMM, the folded
    biases and R in the time loop's panels as weights (see omrt.kernels.recurrent). Only worth it
    when the native library is packed."""
    for node in graph.nodes:
        if node.domain or node.op_type not in recurrent.PACKED:
            continue
        own = recurrent.PACKED[node.op_type].own_inputs
        names = list(node.inputs) + [""] * (own - len(node.inputs))
        if any(n and n not in graph.constants for n in names[1:4]):
            continue
        kernel = recurrent.packable(node.op_type, node.attrs, [graph.infos[n] if n else None for n in names])
        if kernel is not None:
            derived = [_derived(graph, names[source], suffix, derive) if names[source] else ""
                       for source, suffix, derive in kernel.packed_weights()]
            _become(graph, node, f"Packed{node.op_type}", names + derived)
    return graph


class _Chain:
    """Walks back from a value through nodes each read by one node only, for a pattern match."""

    def __init__(self, graph: Graph) -> None:
        self.graph, self.uses, self.producers = graph, graph.consumers(), graph.producers()

    def sole(self, value: str, op_types: tuple[str, ...], reader: int) -> tuple[int, Node] | None:
        """(index, node) of the plain ONNX node of one of `op_types` writing `value`, when node
        `reader` alone reads `value`; else None."""
        i = self.producers.get(value)
        node = self.graph.nodes[i] if i is not None else None
        if (node is None or node.domain or node.op_type not in op_types
                or _sole_consumer(self.graph, value, self.uses) != reader):
            return None
        return i, node

    def heads(self, value: str, reader: int) -> str | None:
        """The [B, S, H * D] value that `value` ([B, S, H, D], read by node `reader` alone) is a
        Reshape of; else None."""
        found = self.sole(value, ("Reshape",), reader)
        if found is None:
            return None
        src, out = self.graph.infos[found[1].inputs[0]], self.graph.infos[value]
        if not (src.static and out.static and src.rank == 3 and out.rank == 4):
            return None
        return found[1].inputs[0] if src.shape[:2] == out.shape[:2] and out.shape[2] * out.shape[3] == src.shape[2] \
            else None


_HEADS_FIRST, _KEYS_LAST = [0, 2, 1, 3], [0, 2, 3, 1]


def _attention_mask(graph: Graph, mask: str, scores: str) -> bool:
    """Whether `mask` can be an Attention's attn_mask for `scores` [B, H, S, T]: float32, at most
    4-D, T keys on its last axis, broadcasting to the scores without growing them."""
    info, out = graph.infos[mask], graph.infos[scores]
    if info.dtype != np.float32 or not info.static or info.rank > 4 or info.shape[-1] != out.shape[-1]:
        return False
    return all(d in (1, o) for d, o in zip(info.shape[::-1], out.shape[::-1]))


def _unfused_attention(chain: _Chain, j: int) -> tuple[list[str], float, list[int]] | None:
    """When node `j` is the value product of an unfused attention, Reshape(MatMul(softmax(Q K^T
    [* or / c] [+ mask]), V)) with heads split and merged by Transposes folded into both MatMuls:
    ([Q, K, V, mask or ""] as [B, S, H * D] values, the scale, the indices of the nodes it takes)."""
    graph, out = chain.graph, chain.graph.nodes[j]
    attrs = out.attrs
    if ((out.op_type, out.domain) != ("MatMul", "") or set(attrs) != {"_perm_b", "_perm_y"}
            or list(attrs["_perm_b"]) != _HEADS_FIRST or list(attrs["_perm_y"]) != _HEADS_FIRST):
        return None
    merge = _sole_consumer(graph, out.outputs[0], chain.uses)
    softmax = chain.sole(out.inputs[0], ("Softmax",), j)
    if (merge is None or (graph.nodes[merge].op_type, graph.nodes[merge].domain) != ("Reshape", "")
            or graph.infos[graph.nodes[merge].outputs[0]].rank != 3 or softmax is None
            or int(softmax[1].attrs.get("axis", -1)) not in (-1, 3)):
        return None
    taken, mask, scale = [j, softmax[0]], "", 1.0
    at, value = softmax
    added = chain.sole(value.inputs[0], ("Add",), at)
    if added is not None:
        for scores, other in (added[1].inputs, added[1].inputs[::-1]):
            if (other != scores and chain.sole(scores, ("MatMul", "Mul", "Div"), added[0])
                    and _attention_mask(graph, other, scores)):
                taken.append(added[0])
                at, value, mask = added[0], added[1], other
                break
    x = value.inputs[0] if not mask else next(v for v in value.inputs if v != mask)
    scaled = chain.sole(x, ("Mul", "Div"), at)
    if scaled is not None:
        data, const = scaled[1].inputs
        if scaled[1].op_type == "Mul" and _scalar(graph, const) is None:
            data, const = const, data
        c = _scalar(graph, const)
        if c:
            taken.append(scaled[0])
            at, x, scale = scaled[0], data, c if scaled[1].op_type == "Mul" else 1 / c
    product = chain.sole(x, ("MatMul",), at)
    if product is None or set(product[1].attrs) != {"_perm_a", "_perm_b"} \
            or list(product[1].attrs["_perm_a"]) != _HEADS_FIRST or list(product[1].attrs["_perm_b"]) != _KEYS_LAST:
        return None
    q, k = (chain.heads(v, product[0]) for v in product[1].inputs)
    v = chain.heads(out.inputs[1], j)
    if None in (q, k, v) or graph.infos[q].dtype != np.float32:
        return None
    return [q, k, v, mask], scale, [*taken, product[0], merge]


def fuse_attention(graph: Graph) -> Graph:
    """Unfused attention (see _unfused_attention) -> one omrt::Attention node over the 3-D
    projections, in the place of the Reshape that merged the heads: with the native library,
    each (batch, head) is scores, mask, softmax and value product in one pass (csrc/attention.c)."""
    chain = _Chain(graph)
    replaced: dict[int, Node] = {}
    drop: set[int] = set()
    for j in range(len(graph.nodes)):
        found = _unfused_attention(chain, j)
        if found is None:
            continue
        inputs, scale, taken = found
        merge = graph.nodes[taken[-1]]
        heads = graph.infos[graph.nodes[taken[-2]].inputs[0]].shape[2]
        replaced[taken[-1]] = Node("Attention", [*inputs] if inputs[3] else inputs[:3], merge.outputs,
                                   {"q_num_heads": heads, "kv_num_heads": heads, "scale": scale}, "omrt",
                                   merge.name or graph.nodes[j].name)
        drop.update(taken[:-1])
    if replaced:
        graph.nodes = [replaced.get(i, node) for i, node in enumerate(graph.nodes) if i not in drop]
        graph.opsets.setdefault("omrt", 1)
    return remove_dead_code(graph)


def _stackable(graph: Graph, node: Node) -> tuple | None:
    """What a PackedMatMul must share with its siblings to be stacked with them (its A, its
    attributes, its B's shape and whether it has a bias), or None when it cannot be: B's columns
    must fill whole strips, so that each part's columns start a strip."""
    if (node.op_type, node.domain) != ("PackedMatMul", "omrt") or "parts" in node.attrs:
        return None
    depth, cols = graph.constants[node.inputs[1]].shape
    if cols % packed.STRIP:
        return None
    return node.inputs[0], tuple(sorted(node.attrs.items())), depth, cols, bool(node.inputs[2])


def stack_sibling_products(graph: Graph) -> Graph:
    """PackedMatMuls of one A by constant matrices of one shape (attention's Q, K and V
    projections) -> one PackedMatMul with `parts`, whose output stacks the products, and an
    omrt::Part per product, an alias of its slice: A is copied into panels once, and the workers
    share one product instead of waiting at the end of each."""
    groups: dict[tuple, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        key = _stackable(graph, node)
        if key is not None:
            groups.setdefault(key, []).append(i)
    replaced: dict[int, list[Node]] = {}
    for members in groups.values():
        if len(members) > 1:
            replaced[members[0]] = _stacked(graph, [graph.nodes[i] for i in members])
            replaced.update((i, []) for i in members[1:])
    graph.nodes = [n for i, node in enumerate(graph.nodes) for n in replaced.get(i, [node])]
    if replaced:
        graph.opsets.setdefault("omrt", 1)
    return remove_dead_code(graph)


def _stacked(graph: Graph, nodes: list[Node]) -> list[Node]:
    """The stacked product of `nodes` (see stack_sibling_products) and its Parts, in their place."""
    first, parts = nodes[0], len(nodes)
    weight = np.concatenate([graph.constants[n.inputs[1]] for n in nodes], axis=1)
    names = [f"{first.inputs[1]}__stacked{parts}", "", f"{first.inputs[1]}__stacked{parts}__strips"]
    graph.add_constant(names[0], weight)
    graph.add_constant(names[2], packed.pack_strips(weight))
    if first.inputs[2]:
        names[1] = f"{first.inputs[2]}__stacked{parts}"
        graph.add_constant(names[1], np.concatenate([graph.constants[n.inputs[2]] for n in nodes]))
    stacked = f"{first.outputs[0]}__stacked{parts}"
    out = graph.infos[first.outputs[0]]
    graph.infos[stacked] = replace(out, shape=(parts, *out.shape))
    product = Node("PackedMatMul", [first.inputs[0], *names], [stacked], {**first.attrs, "parts": parts}, "omrt",
                   f"{first.name}__stacked{parts}")
    return [product, *(Node("Part", [stacked], [n.outputs[0]], {"index": g}, "omrt", f"{n.name}__part")
                       for g, n in enumerate(nodes))]


def _residual_operand(graph: Graph, j: int, producers: dict[str, int], uses: dict[str, list[int]]
                      ) -> tuple[int, str] | None:
    """(index of the PackedConv, the other operand) when node `j` adds a PackedConv's output (read
    by nothing else, no activation fused) and a value of exactly its shape and dtype."""
    add = graph.nodes[j]
    if (add.op_type not in ("Add", "Sum") or add.domain or len(add.inputs) != 2
            or activation_code(add.attrs) is None):
        return None
    out = graph.infos[add.outputs[0]]
    for value, other in (add.inputs, add.inputs[::-1]):
        i = producers.get(value)
        conv = graph.nodes[i] if i is not None else None
        if (conv is not None and (conv.op_type, conv.domain) == ("PackedConv", "omrt")
                and "_act" not in conv.attrs
                and _sole_consumer(graph, value, uses) == j and other != value
                and graph.infos[value] == out == graph.infos.get(other)):
            return i, other
    return None


def fuse_residual_adds(graph: Graph) -> Graph:
    """PackedConv then Add (or Sum) of its output and a value of its shape, then an activation ->
    one omrt::PackedResidualConv that adds the value in its tile's epilogue, before the activation
    (a residual block's shortcut): the layer's output is never written and read back. The fused
    node takes the Add's place in the order, where both operands are ready."""
    uses = graph.consumers()
    producers = graph.producers()
    drop: set[int] = set()
    for j, add in enumerate(graph.nodes):
        found = _residual_operand(graph, j, producers, uses)
        if found is None or found[0] in drop:
            continue
        i, residual = found
        conv = graph.nodes[i]
        conv.op_type = "PackedResidualConv"
        conv.inputs = [*conv.inputs, residual]
        conv.attrs = {**conv.attrs, **{k: v for k, v in add.attrs.items() if k.startswith("_act")}}
        conv.outputs = [add.outputs[0]]
        graph.nodes[j] = conv
        drop.add(i)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in drop]
    return graph
