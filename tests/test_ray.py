"""omrt.ray on a local Ray: the model in the object store read in place by two actors, the Ray
Data callable over a dataset, and the Serve deployment over real HTTP (KServe v2 JSON, .npy, .npz)."""

from __future__ import annotations

import io
import json
import socket
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.zoo import scaled_error

ray = pytest.importorskip("ray", reason="omrt.ray needs Ray (pip install omrt[ray]); CI installs it")
from ray import serve  # noqa: E402

import omrt.ray  # noqa: E402

TOL = 1e-5
"""Scaled error between runs that may sum in another order (another batch split, another BLAS path)."""
RNG = np.random.default_rng(7)
PAIR_W = RNG.standard_normal((8, 4)).astype(np.float32)
PAIR_B = RNG.standard_normal(4).astype(np.float32)
IMG_W = RNG.integers(-3, 4, (48, 10)).astype(np.float32)
"""Small integers: the image model's sums are exact in float32, whatever their order."""
WIDE_W = (RNG.standard_normal((1024, 4096)) / 32).astype(np.float32)
"""16 MiB of weights: large enough to tell a shared mapping from a private copy in RSS."""


def _model(nodes, inputs, outputs, weights):
    graph = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pair_model():
    """x float32 [N,8], m uint8 [N,4] -> y = Relu(x @ W + b), z = y * m."""
    f, u = TensorProto.FLOAT, TensorProto.UINT8
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"]), helper.make_node("Cast", ["m"], ["mf"], to=f),
             helper.make_node("Mul", ["y", "mf"], ["z"])]
    return _model(nodes, [helper.make_tensor_value_info("x", f, ["N", 8]),
                          helper.make_tensor_value_info("m", u, ["N", 4])],
                  [helper.make_tensor_value_info("y", f, ["N", 4]), helper.make_tensor_value_info("z", f, ["N", 4])],
                  {"W": PAIR_W, "b": PAIR_B})


def pair_reference(x, m):
    y = np.maximum(x @ PAIR_W + PAIR_B, 0)
    return {"y": y, "z": y * m}


def img_model():
    """x uint8 [N,3,4,4] -> y = Flatten(float(x)) @ W (float32 [N,10]), k = ArgMax(y) (int64 [N])."""
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("Flatten", ["xf"], ["flat"]), helper.make_node("MatMul", ["flat", "W"], ["y"]),
             helper.make_node("ArgMax", ["y"], ["k"], axis=1, keepdims=0)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, ["N", 3, 4, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10]),
                   helper.make_tensor_value_info("k", TensorProto.INT64, ["N"])], {"W": IMG_W})


def wide_model():
    """x float32 [N,1024] -> Relu(x @ W), W 1024x4096."""
    f = TensorProto.FLOAT
    return _model([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                  [helper.make_tensor_value_info("x", f, ["N", 1024])],
                  [helper.make_tensor_value_info("y", f, ["N", 4096])],
                  {"W": WIDE_W})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The .om files: pair (free batch), pair1 and pair4 (fixed batch 1 and 4), img, wide."""
    folder = tmp_path_factory.mktemp("ray_models")
    paths = {name: str(folder / f"{name}.om") for name in ("pair", "pair1", "pair4", "img", "wide")}
    omrt.compile(pair_model(), paths["pair"], native=False)
    omrt.compile(pair_model(), paths["pair1"], shapes={"x": (1, 8), "m": (1, 4)}, native=False)
    omrt.compile(pair_model(), paths["pair4"], shapes={"x": (4, 8), "m": (4, 4)}, native=False)
    omrt.compile(img_model(), paths["img"], native=False)
    omrt.compile(wide_model(), paths["wide"], native=False)
    return paths


@pytest.fixture(scope="module")
def cluster():
    """A local Ray of its own (address="local": never one another process started), shut down
    whatever the tests did. Its workers cannot import this test module: its functions go by value."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def pair_batch(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 8), dtype=np.float32), "m": rng.integers(0, 4, (rows, 4), np.uint8)}


# ---------------------------------------------------------------------------------------- object store

def _status(key: str) -> int:
    """A /proc/self/status figure, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def _mapped_at(array: np.ndarray) -> tuple[str, str, int, bool]:
    """The device, inode and file offset of the mapping that holds `array`'s first byte, and
    whether that mapping is shared: the same triple in two processes is the same memory."""
    address = array.ctypes.data
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms, offset, device, inode = line.split()[:5]
            lo, hi = (int(a, 16) for a in span.split("-"))
            if lo <= address < hi:
                return device, inode, int(offset, 16) + address - lo, perms.endswith("s")
    raise AssertionError("the array lies in no mapping")


@ray.remote(num_cpus=0)
class Reader:
    """Loads a ModelRef in place and reports how its weights relate to the object-store bytes."""

    def read(self, model: omrt.ray.ModelRef, x: np.ndarray) -> dict:
        anon = _status("RssAnon")
        loaded = model.load()
        y = loaded.session().run({"x": x})["y"]
        data = ray.get(model.ref)
        weights = [a for a in loaded.graph.constants.values() if a.nbytes]
        return {"y": y, "anon_growth": _status("RssAnon") - anon, "copied": loaded.weights_copied,
                "writeable": data.flags.writeable, "owndata": data.flags.owndata,
                "weights_in_place": all(np.shares_memory(w, data) for w in weights),
                "weight_bytes": sum(w.nbytes for w in weights), "mapped_at": _mapped_at(data),
                "file_bytes": bytes(data)[:16]}


def test_two_actors_read_the_model_in_place_from_one_object(cluster, models):
    ref = omrt.ray.put_model(models["wide"])
    assert (ref.name, ref.nbytes) == ("wide", len(open(models["wide"], "rb").read()))
    x = np.random.default_rng(1).standard_normal((2, 1024), dtype=np.float32)
    want = np.maximum(x @ WIDE_W, 0)
    first, second = ray.get([reader.read.remote(ref, x) for reader in (Reader.remote(), Reader.remote())])
    for got in (first, second):
        assert scaled_error(got["y"], want) <= TOL
        assert got["copied"] == 0 and got["weights_in_place"]
        assert not got["writeable"] and not got["owndata"]
        assert got["weight_bytes"] == WIDE_W.nbytes
        assert got["anon_growth"] < WIDE_W.nbytes / 2, got["anon_growth"]  # not a private copy per actor
    assert first["mapped_at"] == second["mapped_at"] and first["mapped_at"][3]  # one shared mapping
    assert first["file_bytes"] == open(models["wide"], "rb").read(16)


# ---------------------------------------------------------------------------------------- Ray Data

def test_predictor_maps_a_dataset_with_two_actors(cluster, models):
    rows = 200
    batch = pair_batch(rows)
    items = [{"features": batch["x"][i], "m": batch["m"][i], "id": i} for i in range(rows)]
    ds = ray.data.from_items(items).map_batches(
        omrt.ray.Predictor, fn_constructor_kwargs={"model": omrt.ray.put_model(models["pair"]),
                                                   "columns": {"x": "features"}, "copies_column": "copied"},
        concurrency=2, batch_size=16, batch_format="numpy")
    out = ds.to_pandas().sort_values("id")
    assert set(out.columns) == {"id", "y", "z", "copied"}
    assert list(out["id"]) == list(range(rows)) and (out["copied"] == 0).all()
    want = omrt.load(models["pair"]).session().run(batch)
    for name in ("y", "z"):
        assert scaled_error(np.stack(out[name].to_numpy()), want[name]) <= TOL, name
        assert scaled_error(want[name], pair_reference(**batch)[name]) <= TOL, name


def test_predictor_reads_object_store_columns_in_place(cluster, models):
    batch = ray.get(ray.put(pair_batch(32)))  # read-only arrays in shared memory, as map_batches hands them
    assert not batch["x"].flags.writeable
    predictor = omrt.ray.Predictor(omrt.ray.put_model(models["pair"]))
    out = predictor({**batch, "label": np.arange(32)})
    assert predictor.runner.session.stats.bytes_copied == 0
    assert (out["label"] == np.arange(32)).all()
    want = pair_reference(batch["x"], batch["m"])
    assert all(scaled_error(out[name], want[name]) <= TOL for name in ("y", "z"))


def test_predictor_runs_a_fixed_batch_1_model_row_by_row_into_its_outputs(models):
    batch = pair_batch(5, seed=3)
    predictor = omrt.ray.Predictor(models["pair1"])
    assert predictor.runner.step == 1
    out = predictor(batch)
    want = pair_reference(**batch)
    assert sorted(out) == ["y", "z"]
    assert all(scaled_error(out[name], want[name]) <= TOL for name in ("y", "z"))
    assert predictor.runner.session.stats.runs == 5 and predictor.runner.bytes_copied == 0
    again = predictor(pair_batch(1, seed=4))  # one row: one run, into arrays of its own
    assert not np.shares_memory(again["y"], out["y"])
    assert scaled_error(again["y"], pair_reference(**pair_batch(1, seed=4))["y"]) <= TOL


def test_predictor_tells_what_a_fixed_batch_needs(models):
    with pytest.raises(omrt.InputError, match=r"the model takes 4 rows at a time .* this batch has \[6\] rows: "
                                              r"give batches a multiple of 4 rows"):
        omrt.ray.Predictor(models["pair4"])(pair_batch(6))
    with pytest.raises(omrt.InputError, match=r"the batch has no column \['x'\] for the model's inputs \['x'\]; "
                                              r"its columns are \['data', 'm'\]: pass columns="):
        omrt.ray.Predictor(models["pair"])({"data": np.ones((2, 8), np.float32), "m": np.ones((2, 4), np.uint8)})
    with pytest.raises(omrt.InputError, match=r"columns= maps \['q'\], which are not inputs of the model"):
        omrt.ray.Predictor(models["pair"], columns={"q": "data"})


# ---------------------------------------------------------------------------------------- payloads

def test_payloads_decode_in_place_and_name_what_is_wrong(models):
    inputs = omrt.load(models["pair"]).inputs
    arrays = pair_batch(3)
    npz = io.BytesIO()
    np.savez(npz, **arrays)
    payload = omrt.ray.decode(npz.getvalue(), "application/octet-stream", inputs)
    assert not payload.json and all((payload.feeds[k] == v).all() for k, v in arrays.items())
    img_inputs = omrt.load(models["img"]).inputs
    npy = io.BytesIO()
    np.save(npy, np.arange(96, dtype=np.uint8).reshape(2, 3, 4, 4))
    body = npy.getvalue()
    view = omrt.ray.decode(body, "application/octet-stream", img_inputs).feeds["x"]
    assert np.shares_memory(view, np.frombuffer(body, np.uint8)) and view.flags.c_contiguous
    with pytest.raises(omrt.InputError, match=r"an .npy body holds one array and the model has inputs \['x', 'm'\]"):
        omrt.ray.decode(body, "application/octet-stream", inputs)
    with pytest.raises(omrt.InputError, match=r"input 'x': the .npy body holds 95 bytes of data, its header says "
                                              r"uint8 \(2, 3, 4, 4\)"):
        omrt.ray.decode(body[:-1], "application/octet-stream", img_inputs)
    with pytest.raises(omrt.InputError, match=r"the body is neither JSON \(Content-Type text/plain\) nor .npy/.npz"):
        omrt.ray.decode(b"x=1", "text/plain", inputs)
    with pytest.raises(omrt.InputError, match=r"input 'x' is FP64 \(float64\); the model takes FP32 \(float32\)"):
        omrt.ray.decode(json.dumps({"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP64",
                                                "data": [0.0] * 8}]}).encode(), "application/json", inputs)


# ---------------------------------------------------------------------------------------- Serve

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(cluster, models):
    """The img model served from the object store by one replica, under /omrt; its base URL."""
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = omrt.ray.deployment(omrt.ray.put_model(models["img"]), ray_actor_options={"num_cpus": 0})
        serve.run(app, name="omrt", route_prefix="/omrt")
        yield f"http://127.0.0.1:{port}/omrt"
    finally:
        serve.shutdown()


def _post(url: str, body: bytes, content_type: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def images(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).integers(0, 256, (rows, 3, 4, 4), np.uint8)


def test_serve_answers_kserve_v2_json(served, models):
    x = images(3)
    request = {"id": "r1", "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "UINT8",
                                       "data": x.ravel().tolist()}]}
    status, headers, body = _post(f"{served}/v2/models/img/infer", json.dumps(request).encode(), "application/json")
    assert status == 200, body
    doc = json.loads(body)
    want = omrt.load(models["img"]).session().run({"x": x})
    assert (doc["model_name"], doc["id"]) == ("img", "r1")
    got = {o["name"]: o for o in doc["outputs"]}
    assert (got["y"]["datatype"], got["y"]["shape"]) == ("FP32", [3, 10])
    assert (got["k"]["datatype"], got["k"]["shape"]) == ("INT64", [3])
    assert (np.array(got["y"]["data"], np.float32).reshape(3, 10) == want["y"]).all()
    assert (np.array(got["k"]["data"]) == want["k"]).all()
    assert (want["y"] == x.reshape(3, -1).astype(np.float32) @ IMG_W).all()
    assert headers["omrt-bytes-copied"] == "0"
    request["outputs"] = [{"name": "k"}]
    status, _, body = _post(f"{served}/v2/models/img/infer", json.dumps(request).encode(), "application/json")
    assert status == 200 and [o["name"] for o in json.loads(body)["outputs"]] == ["k"]


def test_serve_answers_npy_and_npz_bodies(served, models):
    x = images(4)
    want = omrt.load(models["img"]).session().run({"x": x})
    for order, copied in (("C", 0), ("F", x.nbytes)):  # a Fortran-order .npy is read in place, then copied to fit
        body = io.BytesIO()
        np.save(body, np.asarray(x, order=order))
        status, headers, answer = _post(served, body.getvalue(), "application/octet-stream")
        assert status == 200, answer
        assert headers["omrt-bytes-copied"] == str(copied)
        with np.load(io.BytesIO(answer)) as npz:
            assert (npz["y"] == want["y"]).all() and (npz["k"] == want["k"]).all()
    body = io.BytesIO()
    np.savez(body, x=x)
    status, _, answer = _post(f"{served}/v2/models/img/infer", body.getvalue(), "application/octet-stream")
    with np.load(io.BytesIO(answer)) as npz:
        assert status == 200 and (npz["y"] == want["y"]).all()


def kserve(name: str = "x", **fields) -> bytes:
    """A KServe v2 request of one input tensor: 48 zeros of UINT8 [1,3,4,4], with `fields` replaced."""
    tensor = {"name": name, "shape": [1, 3, 4, 4], "datatype": "UINT8", "data": [0] * 48, **fields}
    return json.dumps({"inputs": [{k: v for k, v in tensor.items() if v is not None}]}).encode()


@pytest.mark.parametrize("body, content_type, message", [
    (kserve(datatype="FP32"), "application/json",
     "input 'x' is FP32 (float32); the model takes UINT8 (uint8): send it as that datatype"),
    (kserve(data=[1, 2]), "application/json",
     "input 'x': shape [1, 3, 4, 4] holds 48 values and \"data\" has 2: send every value, flat in row-major order"),
    (kserve(shape=[1, 48]), "application/json", "input 'x' has shape (1, 48), the model expects ('N', 3, 4, 4)"),
    (kserve(shape=None), "application/json", "inputs[0] lacks ['shape']"),
    (kserve(shape=[1], data=[256]), "application/json", "input 'x': \"data\" is not a list of UINT8 values"),
    (kserve(datatype="BYTES"), "application/json", "input 'x': datatype 'BYTES' is not one omrt takes"),
    (kserve("q"), "application/json", "'q' is not an input of the model; the inputs are ['x']"),
    (b'{"instances": [1]}', "application/json", 'the JSON has no "inputs" list'),
    (b"not json", "application/json", "the body is not JSON"),
    (b"\x00\x01", "application/octet-stream", "the body is neither JSON (Content-Type application/octet-stream) "
                                              "nor .npy/.npz bytes"),
])
def test_serve_answers_a_bad_payload_with_400_and_the_fix(served, body, content_type, message):
    status, _, answer = _post(f"{served}/v2/models/img/infer", body, content_type)
    assert status == 400
    assert message in json.loads(answer)["error"]


def test_serve_tells_metadata_health_and_unknown_routes(served):
    status, body = _get(f"{served}/v2/models/img")
    assert status == 200
    assert json.loads(body) == {"name": "img", "versions": [], "platform": "omrt",
                                "inputs": [{"name": "x", "datatype": "UINT8", "shape": [-1, 3, 4, 4]}],
                                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 10]},
                                            {"name": "k", "datatype": "INT64", "shape": [-1]}]}
    assert _get(f"{served}/v2/health/ready")[0] == 200 and _get(f"{served}/v2/models/img/ready")[0] == 200
    status, body = _get(f"{served}/v2/models/other")
    assert status == 404 and "this replica serves POST /v2/models/img/infer" in json.loads(body)["error"]
    request = {**json.loads(kserve()), "outputs": [{"name": "logits"}]}
    status, _, body = _post(f"{served}/v2/models/img/infer", json.dumps(request).encode(), "application/json")
    assert status == 400
    assert "\"outputs\" asks for ['logits']; the model's outputs are ['y', 'k']" in json.loads(body)["error"]
