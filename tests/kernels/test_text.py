"""Text kernels and BitCast against onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omrt.errors import ShapeError
from tests.kernel_check import reference, run_kernel

rng = np.random.default_rng(0)


def strings(*rows) -> np.ndarray:
    return np.array(rows, dtype=object)


def check(op: str, inputs: list[np.ndarray], attrs: dict | None = None, opset: int = 20,
          n_outputs: int = 1) -> list[np.ndarray]:
    got = run_kernel(op, inputs, attrs, opset=opset, const=[])
    want = reference(op, inputs, attrs, opset=opset, n_outputs=n_outputs)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind in "OU":
            assert g.dtype == object
            assert g.tolist() == w.astype(object).tolist()
        else:
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    return got


# ----------------------------------------------------------------------------- strings


@pytest.mark.parametrize("a,b", [
    (strings("ab", "c"), strings("x", "yz")),
    (strings(["a", "b"], ["c", "d"]), strings("!")),
    (strings("héllo", "日本"), strings("", "語")),
    (np.array("x", dtype=object), strings("1", "2", "3")),
    (np.zeros((0, 2), object), strings("q", "r")),
])
def test_string_concat(a, b):
    check("StringConcat", [a, b])


def test_string_ops_reject_numbers():
    with pytest.raises(ShapeError, match="string"):
        run_kernel("StringConcat", [np.zeros(2, np.float32), strings("a", "b")], opset=20)


@pytest.mark.parametrize("pattern,x", [
    (r"www\.[\w.-]+\.\bcom\b", strings("www.google.com", "www.bbc.co.uk", "xwww.a.com")),
    (r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)", strings(["a@gmail.com", "b@hotmail.com"],
                                                               ["not email", "c2@yahoo.com"])),
    (r"a*", np.zeros((2, 0), object)),
    (r"\d+", strings("123", "12a", "")),
])
def test_regex_full_match(pattern, x):
    check("RegexFullMatch", [x], {"pattern": pattern})


def test_regex_full_match_bad_pattern():
    with pytest.raises(ShapeError, match="regular expression"):
        run_kernel("RegexFullMatch", [strings("a")], {"pattern": "(unclosed"}, opset=20)


@pytest.mark.parametrize("attrs,x", [
    ({"delimiter": "."}, strings("abc.com", "def.net")),
    ({"maxsplit": 2}, strings(["hello world", "def.net"], ["o n n x", "the quick brown fox"])),
    ({"delimiter": "-"}, strings("o-n-n--x-", "o-n----nx")),
    ({"delimiter": ""}, strings("hello world !", "  hello   world !", " hello world   ! ")),
    ({}, strings("a  b", "")),
    ({"delimiter": "ab", "maxsplit": 1}, strings("xabyabz", "ab")),
    ({}, np.zeros(0, object)),
])
def test_string_split(attrs, x):
    check("StringSplit", [x], attrs, n_outputs=2)


@pytest.mark.parametrize("attrs,x", [
    ({"is_case_sensitive": 1}, strings("monday", "tuesday")),
    ({"is_case_sensitive": 1, "stopwords": ["monday"]}, strings("monday", "tuesday", "Monday")),
    ({"case_change_action": "LOWER", "is_case_sensitive": 1, "stopwords": ["monday"]},
     strings("monday", "TUESDAY")),
    ({"case_change_action": "UPPER", "stopwords": ["monday"]}, strings(["Monday", "tuesday", "MONDAY"])),
    ({"case_change_action": "UPPER", "is_case_sensitive": 1, "stopwords": ["monday"]},
     strings("monday", "monday")),
])
def test_string_normalizer(attrs, x):
    check("StringNormalizer", [x], attrs, opset=10)


def test_string_normalizer_case_insensitive_without_case_change():
    # the reference compares case-sensitively when no case change is asked; the spec does not
    got = run_kernel("StringNormalizer", [strings(["A", "b", "a"])], {"stopwords": ["a"]}, opset=10)[0]
    assert got.tolist() == [["b"]]


def test_string_normalizer_rejects_matrices():
    with pytest.raises(ShapeError, match=r"\[1, C\]"):
        run_kernel("StringNormalizer", [strings(["a"], ["b"])], {}, opset=10)
    with pytest.raises(ShapeError, match="case_change_action"):
        run_kernel("StringNormalizer", [strings("a")], {"case_change_action": "TITLE"}, opset=10)


# ----------------------------------------------------------------------------- TfIdfVectorizer

POOL = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]
WEIGHTS = [0.5, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("attrs", [
    dict(min_gram_length=2, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 4]),
    dict(min_gram_length=2, max_gram_length=2, max_skip_count=5, ngram_counts=[0, 4]),
    dict(min_gram_length=1, max_gram_length=2, max_skip_count=5, ngram_counts=[0, 4]),
    dict(min_gram_length=1, max_gram_length=1, max_skip_count=3, ngram_counts=[0, 4]),
])
@pytest.mark.parametrize("mode,weights", [("TF", None), ("IDF", None), ("TFIDF", None),
                                          ("IDF", WEIGHTS), ("TFIDF", WEIGHTS)])
@pytest.mark.parametrize("x", [np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], np.int32),
                               np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], np.int64)])
def test_tfidf_int_pool(attrs, mode, weights, x):
    attrs = dict(attrs, mode=mode, ngram_indexes=list(range(7)), pool_int64s=POOL)
    if weights:
        attrs["weights"] = weights
    check_tfidf(x, attrs)


def check_tfidf(x: np.ndarray, attrs: dict) -> None:
    """Against the reference, which fails on IDF/TFIDF without weights: there, from its TF counts."""
    if attrs["mode"] == "TF" or attrs.get("weights"):
        check("TfIdfVectorizer", [x], attrs, opset=9)
        return
    tf = reference("TfIdfVectorizer", [x], dict(attrs, mode="TF"), opset=9)[0]
    got = run_kernel("TfIdfVectorizer", [x], attrs, opset=9)[0]
    np.testing.assert_array_equal(got, (tf > 0).astype(np.float32) if attrs["mode"] == "IDF" else tf)


def test_tfidf_empty_level_and_permuted_indexes():
    attrs = dict(min_gram_length=2, max_gram_length=2, max_skip_count=0, mode="TF", ngram_counts=[0, 0],
                 ngram_indexes=[2, 0, 1], pool_int64s=[5, 6, 7, 8, 6, 7])
    check("TfIdfVectorizer", [np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], np.int32)], attrs, opset=9)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_tfidf_random_pools(data):
    """Random pools of 1- to 3-grams, string or int vocabularies, all skips and lengths."""
    words = ["a", "b", "c", "d", "e"]
    use_strings = data.draw(st.booleans())
    counts = [data.draw(st.integers(0, 4)) for _ in range(3)]
    pool, starts = [], []
    for n, c in enumerate(counts, 1):
        starts.append(len(pool))
        for _ in range(c):
            pool.extend(data.draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)))
    total = sum(counts)
    if total == 0:
        return
    lo = data.draw(st.integers(1, 3))
    hi = data.draw(st.integers(lo, 3))
    attrs = dict(min_gram_length=lo, max_gram_length=hi, max_skip_count=data.draw(st.integers(0, 3)),
                 mode=data.draw(st.sampled_from(["TF", "IDF", "TFIDF"])), ngram_counts=starts,
                 ngram_indexes=data.draw(st.permutations(range(total))))
    tokens = np.array(data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=12)))
    if data.draw(st.booleans()) and tokens.size % 2 == 0:
        tokens = tokens.reshape(2, -1)
    if use_strings:
        attrs["pool_strings"] = [words[i] for i in pool]
        x = np.array([("a", "b", "c", "d", "e", "zz")[i] for i in tokens.reshape(-1)],
                     dtype=object).reshape(tokens.shape)
    else:
        attrs["pool_int64s"] = pool
        x = tokens.astype(np.int64)
    check_tfidf(x, attrs)


def test_tfidf_checks():
    base = dict(min_gram_length=1, max_gram_length=1, max_skip_count=0, mode="TF", ngram_counts=[0],
                ngram_indexes=[0])
    with pytest.raises(ShapeError, match="exactly one"):
        run_kernel("TfIdfVectorizer", [np.zeros(3, np.int64)], base, opset=9)
    with pytest.raises(ShapeError, match="does not match"):
        run_kernel("TfIdfVectorizer", [strings("a")], dict(base, pool_int64s=[1]), opset=9)
    with pytest.raises(ShapeError, match="mode"):
        run_kernel("TfIdfVectorizer", [np.zeros(3, np.int64)], dict(base, pool_int64s=[1], mode="BM25"),
                   opset=9)


# ----------------------------------------------------------------------------- BitCast


@pytest.mark.parametrize("src,to", [
    (np.float32, 6), (np.int32, 1), (np.float64, 7), (np.int64, 11), (np.uint32, 6), (np.int8, 2),
    (np.uint16, 5), (np.bool_, 2), (np.float16, 4), (np.uint64, 11),
])
@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (0, 4)])
def test_bitcast(src, to, shape):
    x = rng.integers(0, 100, shape).astype(src) if np.dtype(src).kind != "f" else \
        rng.normal(size=shape).astype(src)
    check("BitCast", [x], {"to": to}, opset=26)


def test_bitcast_of_non_contiguous_input_and_bad_widths():
    x = rng.normal(size=(4, 6)).astype(np.float32)[:, ::2]
    got = run_kernel("BitCast", [x], {"to": 6}, opset=26)[0]
    np.testing.assert_array_equal(got, np.ascontiguousarray(x).view(np.int32))
    with pytest.raises(ShapeError, match="bit widths"):
        run_kernel("BitCast", [np.zeros(2, np.float32)], {"to": 7}, opset=26)
    with pytest.raises(ShapeError, match="strings"):
        run_kernel("BitCast", [strings("a")], {"to": 7}, opset=26)
