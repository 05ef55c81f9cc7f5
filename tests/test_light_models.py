"""The nine real networks the onnx package ships: compile, verify the plan, match ONNX Runtime.

Their shipped weights are constant, so their outputs are degenerate (equal logits of about 1e10
whose softmax depends on the last ulps of each sum). They are checked where that is
well-conditioned: the logits, relative to their magnitude. The same architectures with weights
redrawn (`omrt.zoo.redrawn`) are checked on every output, on 1 and 2 threads, numpy and native.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import omrt
from omrt import zoo
from omrt.plan import verify

TOLERANCE = 1e-4
"""Largest error relative to an output's magnitude: float32 networks stay near 1e-6 whatever
the summation order (AVX2 or AVX-512 kernels, thread split, numpy or native)."""


@pytest.fixture(scope="module")
def redrawn(tmp_path_factory):
    """name -> (.om path, feeds, ONNX Runtime's outputs) for the redrawn architectures."""
    folder = tmp_path_factory.mktemp("redrawn")
    cache: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in cache:
            model = zoo.redrawn(name)
            feeds = zoo.sample_input(model, seed=1)
            path = str(folder / f"{name}.om")
            omrt.compile(model, path)
            cache[name] = path, feeds, zoo.reference(model, feeds)
        return cache[name]

    return get


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    omrt.set_num_threads(request.param)
    yield request.param
    omrt.set_num_threads(1)


@pytest.mark.parametrize("trust", [False, True], ids=["numpy", "native"])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_redrawn_model_matches_onnxruntime(redrawn, name, threads, trust):
    path, feeds, want = redrawn(name)
    model = omrt.load(path, trust_kernels=trust)
    assert (model.native is not None) == trust
    verify(model.default.program, model.default.graph)
    sess = model.session(zero_copy="always")
    outputs = {s.name: np.empty(s.shape, s.dtype) for s in model.outputs}
    for binding in (feeds, outputs):
        for key, arr in binding.items():
            sess.bind(key, arr)
    results = sess.run()
    for key, arr in outputs.items():
        assert results[key] is arr
        assert zoo.scaled_error(arr, want[key]) <= TOLERANCE, (key, zoo.scaled_error(arr, want[key]))
    assert np.std(want.get(zoo.LOGITS, want[model.outputs[0].name])) > 1  # the check means something
    assert sess.stats.bytes_copied == 0


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """name -> (.om path, the backend test's input, ONNX Runtime's outputs) for the shipped models
    with their logits as an extra output."""
    folder = tmp_path_factory.mktemp("shipped")
    cache: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in cache:
            model = zoo.with_logits(onnx.load(zoo.shipped(name)[0]))
            path = str(folder / f"{name}.om")
            omrt.compile(model, path)
            (spec,) = omrt.load(path).inputs
            feeds = {spec.name: zoo.backend_input(tuple(spec.shape))}
            cache[name] = path, feeds, zoo.reference(model, feeds)
        return cache[name]

    return get


@pytest.mark.parametrize("trust", [False, True], ids=["numpy", "native"])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_shipped_model_logits_match_onnxruntime(shipped, name, trust):
    path, feeds, want = shipped(name)
    model = omrt.load(path, trust_kernels=trust)
    got = model.session().run(feeds)
    key = zoo.LOGITS if zoo.LOGITS in want else model.outputs[0].name
    assert zoo.scaled_error(got[key], want[key]) <= TOLERANCE
    expected = zoo.read_tensor(zoo.shipped(name)[1])
    first = model.outputs[0].name
    assert got[first].shape == expected.shape and got[first].dtype == expected.dtype


@pytest.mark.parametrize("name", zoo.NAMES)
def test_light_model_arena_is_near_the_lower_bound(shipped, name):
    p = omrt.load(shipped(name)[0]).default.program
    assert p.lower_bound <= p.arena_size <= 1.05 * p.lower_bound, (p.arena_size, p.lower_bound)
    assert p.arena_size < p.naive_size
