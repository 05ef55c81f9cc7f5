"""The nine real networks the onnx package ships: compile, verify the plan, match the expected output."""

from __future__ import annotations

import numpy as np
import pytest

import omrt
from omrt.demo import backend_input, light_model, read_tensor
from omrt.plan import verify

# name, rtol, atol: the values onnx's backend test uses for these models
LIGHT = [("bvlc_alexnet", 1e-3, 1e-7), ("densenet121", 2e-3, 1e-7), ("inception_v1", 1e-3, 1e-7),
         ("inception_v2", 1e-3, 1e-7), ("resnet50", 1e-3, 1e-7), ("shufflenet", 1e-3, 1e-7),
         ("squeezenet", 1e-3, 1e-7), ("vgg19", 1e-3, 1e-7), ("zfnet512", 1e-3, 1e-7)]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("light")
    cache: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in cache:
            cache[name] = str(folder / f"{name}.om")
            omrt.compile(light_model(name)[0], cache[name])
        return cache[name]

    return get


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    omrt.set_num_threads(request.param)
    yield request.param
    omrt.set_num_threads(1)


@pytest.mark.parametrize("trust", [False, True], ids=["numpy", "native"])
@pytest.mark.parametrize("name, rtol, atol", LIGHT)
def test_light_model_matches_expected_output(compiled, name, rtol, atol, threads, trust):
    model = omrt.load(compiled(name), trust_kernels=trust)
    assert (model.native is not None) == trust
    verify(model.default.program, model.default.graph)
    (spec_in,), (spec_out,) = model.inputs, model.outputs
    x = backend_input(tuple(spec_in.shape))
    y = np.empty(spec_out.shape, spec_out.dtype)
    sess = model.session(zero_copy="always")
    sess.bind(spec_in.name, x)
    sess.bind(spec_out.name, y)
    assert sess.run()[spec_out.name] is y
    np.testing.assert_allclose(y, read_tensor(light_model(name)[1]), rtol=rtol, atol=atol)
    assert sess.stats.bytes_copied == 0


@pytest.mark.parametrize("name", [n for n, _, _ in LIGHT])
def test_light_model_arena_is_near_the_lower_bound(compiled, name):
    p = omrt.load(compiled(name)).default.program
    assert p.lower_bound <= p.arena_size <= 1.05 * p.lower_bound, (p.arena_size, p.lower_bound)
    assert p.arena_size < p.naive_size
