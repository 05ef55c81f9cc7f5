"""Text kernels: string normalization, splitting, concatenation and regex matching, n-gram
vectorization (TfIdfVectorizer), and BitCast, which reinterprets a tensor's raw bytes.

String tensors are numpy object arrays of Python `str`. Per-string work (case changes, splits,
regex matches, vocabulary look-ups) goes through Python's own string methods and `re`; everything
after the look-up, such as n-gram counting, is vectorized.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from ..errors import ShapeError
from .base import Kernel, OpContext, TensorInfo, broadcast_shapes, onnx_dtype, register

_STRING = np.dtype(object)
_BOOL = np.dtype(np.bool_)
_INT64 = np.dtype(np.int64)


def _require_strings(ctx: OpContext, *infos: TensorInfo) -> None:
    for info in infos:
        if info.dtype.kind not in "OUS":
            raise ShapeError(f"{ctx.name}: {ctx.op_type} takes string tensors, got {info.dtype}; "
                             f"it cannot run on numbers")


def _strings(x: np.ndarray) -> list[str]:
    """The elements of a string tensor as a flat list of str."""
    return x.reshape(-1).tolist() if x.dtype == _STRING else [str(s) for s in x.reshape(-1).tolist()]


@register("StringConcat", since=20)
class StringConcat(Kernel):
    """X + Y elementwise, with numpy broadcasting."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        _require_strings(ctx, *inputs)
        return [TensorInfo(_STRING, broadcast_shapes(inputs[0].shape, inputs[1].shape, name=ctx.name))]

    def run(self, inputs, outputs, workspace):
        a, b = (x if x.dtype == _STRING else x.astype(object) for x in inputs)
        np.add(a, b, out=outputs[0])


@register("RegexFullMatch", since=20)
class RegexFullMatch(Kernel):
    """True where the whole string matches `pattern` (Python `re`, which reads RE2 syntax except
    RE2's few extensions)."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        _require_strings(ctx, inputs[0])
        cls.compile(ctx)
        return [TensorInfo(_BOOL, inputs[0].shape)]

    @staticmethod
    def compile(ctx: OpContext) -> re.Pattern:
        if "pattern" not in ctx.attrs:
            raise ShapeError(f"{ctx.name}: RegexFullMatch needs the attribute 'pattern'")
        try:
            return re.compile(ctx.attrs["pattern"])
        except re.error as e:
            raise ShapeError(f"{ctx.name}: RegexFullMatch pattern {ctx.attrs['pattern']!r} is not a "
                             f"valid regular expression: {e}") from None

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.regex = self.compile(ctx)

    def run(self, inputs, outputs, workspace):
        match = self.regex.fullmatch
        outputs[0].reshape(-1)[:] = [match(s) is not None for s in _strings(inputs[0])]


@register("StringSplit", since=20)
class StringSplit(Kernel):
    """Splits every string on `delimiter` (Python's str.split: unset or "" splits on runs of
    whitespace), at most `maxsplit` times; Y pads each row with "" to the longest, Z counts."""

    dynamic = True

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        _require_strings(ctx, inputs[0])
        x = inputs[0]
        return [TensorInfo(_STRING, tuple(x.shape) + (None,)), TensorInfo(_INT64, x.shape)]

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        sep = self.ctx.attr("delimiter") or None
        maxsplit = self.ctx.attr("maxsplit")
        maxsplit = -1 if maxsplit is None else int(maxsplit)
        parts = [s.split(sep, maxsplit) for s in _strings(x)]
        counts = np.array([len(p) for p in parts], np.int64).reshape(x.shape)
        width = max((len(p) for p in parts), default=0)
        y = np.full((len(parts), width), "", dtype=object)
        for row, p in zip(y, parts):
            row[:len(p)] = p
        return [y.reshape(tuple(x.shape) + (width,)), counts]


@register("StringNormalizer", since=10)
class StringNormalizer(Kernel):
    """Drops the elements of X ([C] or [1, C]) that are stop words, then lower- or upper-cases.

    "If all elements in X are dropped, the output will be the empty value of string tensor with
    shape [1] if input shape is [C] and shape [1, 1] if input shape is [1, C]." Case changes and
    case-insensitive matching use Python's Unicode rules; `locale` is not consulted.
    """

    dynamic = True

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        _require_strings(ctx, x)
        if x.rank not in (1, 2) or (x.rank == 2 and isinstance(x.shape[0], int) and x.shape[0] != 1):
            raise ShapeError(f"{ctx.name}: StringNormalizer takes a [C] or [1, C] tensor, got shape "
                             f"{x.shape}; reshape it first")
        if ctx.attr("case_change_action", "NONE") not in ("NONE", "LOWER", "UPPER"):
            raise ShapeError(f"{ctx.name}: StringNormalizer case_change_action must be NONE, LOWER or "
                             f"UPPER, got {ctx.attrs['case_change_action']!r}")
        return [TensorInfo(_STRING, tuple(x.shape[:-1]) + (None,))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        self.sensitive = bool(ctx.attr("is_case_sensitive", 0))
        words = [str(w) for w in ctx.attr("stopwords", None) or []]
        self.stopwords = set(words) if self.sensitive else {w.lower() for w in words}
        self.case = ctx.attr("case_change_action", "NONE")

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        words = _strings(x)
        if self.stopwords:
            key = (lambda w: w) if self.sensitive else str.lower
            words = [w for w in words if key(w) not in self.stopwords]
        if self.case == "LOWER":
            words = [w.lower() for w in words]
        elif self.case == "UPPER":
            words = [w.upper() for w in words]
        y = np.array(words or [""], dtype=object)
        return [y.reshape((1, -1)) if x.ndim == 2 else y]


@register("TfIdfVectorizer", since=9)
class TfIdfVectorizer(Kernel):
    """Counts the pool's n-grams (min_gram_length..max_gram_length tokens, taken every 1 to
    max_skip_count + 1 positions; 1-grams only once) in each row of X, then weighs the counts.

    The pool is a trie kept as one sorted table of (parent node * vocabulary + token) codes per
    n-gram length, so a step of the walk advances every start position of every row at once with
    one `searchsorted`. Weights are indexed by output coordinate, as onnxruntime does.
    """

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        a = ctx.attrs
        if ("pool_strings" in a) == ("pool_int64s" in a):
            raise ShapeError(f"{ctx.name}: TfIdfVectorizer needs exactly one of pool_strings and "
                             f"pool_int64s")
        strings = "pool_strings" in a
        if strings != (x.dtype.kind in "OUS") or (not strings and x.dtype.kind not in "iu"):
            raise ShapeError(f"{ctx.name}: TfIdfVectorizer input of type {x.dtype} does not match a "
                             f"{'string' if strings else 'int64'} pool")
        if x.rank not in (1, 2):
            raise ShapeError(f"{ctx.name}: TfIdfVectorizer takes a [C] or [N, C] input, got {x.shape}")
        if a.get("mode") not in ("TF", "IDF", "TFIDF"):
            raise ShapeError(f"{ctx.name}: TfIdfVectorizer mode must be TF, IDF or TFIDF, "
                             f"got {a.get('mode')!r}")
        for k in ("ngram_counts", "ngram_indexes", "max_gram_length", "min_gram_length",
                  "max_skip_count"):
            if k not in a:
                raise ShapeError(f"{ctx.name}: TfIdfVectorizer needs the attribute {k!r}")
        size = max(a["ngram_indexes"], default=-1) + 1
        return [TensorInfo(np.dtype(np.float32), (size,) if x.rank == 1 else (x.shape[0], size))]

    def __init__(self, ctx: OpContext, inputs: Sequence[TensorInfo | None],
                 outputs: Sequence[TensorInfo]) -> None:
        super().__init__(ctx, inputs, outputs)
        a = ctx.attrs
        pool = list(a["pool_strings"]) if "pool_strings" in a else [int(v) for v in a["pool_int64s"]]
        self.strings = "pool_strings" in a
        self.min_n, self.max_n = int(a["min_gram_length"]), int(a["max_gram_length"])
        self.skips = int(a["max_skip_count"])
        self.mode = a["mode"]
        self.size = max(a["ngram_indexes"], default=-1) + 1
        weights = a.get("weights")
        self.weights = None if not weights else np.asarray(weights, np.float32)
        vocab = sorted(set(pool))
        self.vocab_size = max(len(vocab), 1)
        self.index = {t: i for i, t in enumerate(vocab)}
        self.sorted_vocab = None if self.strings else np.asarray(vocab, np.int64)
        self.levels = self._trie(pool, [int(c) for c in a["ngram_counts"]],
                                 [int(i) for i in a["ngram_indexes"]])

    def _trie(self, pool: list, starts: list[int], columns: list[int]) -> list[tuple[np.ndarray, ...]]:
        """Per n-gram length: (sorted edge codes, child node of each edge, output column or -1)."""
        edges: list[dict[int, int]] = [dict() for _ in range(self.max_n)]
        column_of: dict[int, int] = {}
        nodes, ngram_id = 1, 0
        for n, start in enumerate(starts, 1):
            end = starts[n] if n < len(starts) else len(pool)
            count = max(end - start, 0) // n
            if not self.min_n <= n <= self.max_n:
                ngram_id += count
                continue
            for g in range(count):
                parent = 0
                for k, token in enumerate(pool[start + g * n:start + (g + 1) * n]):
                    code = parent * self.vocab_size + self.index[token]
                    if code not in edges[k]:
                        edges[k][code] = nodes
                        nodes += 1
                    parent = edges[k][code]
                if ngram_id < len(columns):
                    column_of[parent] = columns[ngram_id]
                ngram_id += 1
        levels = []
        for level in edges:
            codes = np.array(sorted(level), np.int64)
            children = np.array([level[c] for c in codes.tolist()], np.int64)
            cols = np.array([column_of.get(c, -1) for c in children.tolist()], np.int64)
            levels.append((codes, children, cols))
        return levels

    def _token_ids(self, x: np.ndarray) -> np.ndarray:
        """Vocabulary index of every token of X ([rows, C]), -1 when the pool does not hold it."""
        if self.strings:
            index = self.index
            return np.array([index.get(t, -1) for t in _strings(x)], np.int64).reshape(x.shape)
        vocab = self.sorted_vocab
        if not vocab.size:
            return np.full(x.shape, -1, np.int64)
        pos = np.minimum(np.searchsorted(vocab, x), vocab.size - 1)
        return np.where(vocab[pos] == x, pos, -1)

    def run(self, inputs, outputs, workspace):
        x = inputs[0]
        out = outputs[0].reshape(-1, self.size)
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        ids = self._token_ids(rows)
        n_rows, width = ids.shape
        hits = []
        for skip in range(1, self.skips + 2):
            lowest = max(self.min_n, 1 if skip == 1 else 2)
            if lowest > self.max_n:
                break
            node = np.zeros(ids.shape, np.int64)
            alive = np.ones(ids.shape, bool)
            for k, (codes, children, cols) in enumerate(self.levels):
                span = width - k * skip
                if span <= 0 or not codes.size:
                    break
                node, alive = node[:, :span], alive[:, :span]
                token = ids[:, k * skip:k * skip + span]
                code = node * self.vocab_size + token
                at = np.minimum(np.searchsorted(codes, code), codes.size - 1)
                alive &= (token >= 0) & (codes[at] == code)
                if not alive.any():
                    break
                node = np.where(alive, children[at], 0)
                if k + 1 >= lowest:
                    col = np.where(alive, cols[at], -1)
                    r, c = np.nonzero(col >= 0)
                    hits.append(r * self.size + col[r, c])
        flat = np.concatenate(hits) if hits else np.zeros(0, np.int64)
        counts = np.bincount(flat, minlength=out.size).reshape(out.shape)
        if self.mode == "TF":
            np.copyto(out, counts, casting="unsafe")
        elif self.mode == "IDF":
            np.copyto(out, counts > 0, casting="unsafe")
            if self.weights is not None:
                out *= self.weights
        else:
            np.copyto(out, counts, casting="unsafe")
            if self.weights is not None:
                out *= self.weights


_SUB_BYTE = {"int4", "uint4", "int2", "uint2", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"}


@register("BitCast", since=26)
class BitCast(Kernel):
    """The input's bytes reinterpreted as type `to` of the same bit width ("preserves the exact
    bit pattern without any value conversion"); a copy into the output, not an alias, because
    the planner's aliases keep one dtype."""

    @classmethod
    def infer(cls, ctx: OpContext, inputs: Sequence[TensorInfo | None]) -> list[TensorInfo]:
        x = inputs[0]
        if "to" not in ctx.attrs:
            raise ShapeError(f"{ctx.name}: BitCast needs the attribute 'to'")
        to = onnx_dtype(ctx.attrs["to"], ctx)
        for dt in (x.dtype, to):
            if dt.kind in "OUS" or dt.name in _SUB_BYTE:
                raise ShapeError(f"{ctx.name}: BitCast does not support {dt.name} (strings and "
                                 f"types narrower than a byte have no byte-wise reinterpretation)")
        if to.itemsize != x.dtype.itemsize:
            raise ShapeError(f"{ctx.name}: BitCast from {x.dtype.name} ({x.dtype.itemsize * 8} bits) to "
                             f"{to.name} ({to.itemsize * 8} bits): the bit widths must match")
        return [TensorInfo(to, x.shape)]

    def run(self, inputs, outputs, workspace):
        out = outputs[0]
        out.view(inputs[0].dtype)[...] = inputs[0]
