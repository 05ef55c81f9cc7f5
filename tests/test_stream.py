"""Weights streamed through fixed slots under a budget, and weights swapped in place: the same
bits as the resident run, a schedule the verifier proves, and clear errors."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import omrt
from omrt.memory import system
from omrt.plan.stream import verify_stream
from omrt.plan.verify import PlanError

RNG = np.random.default_rng(21)
WIDTH = 256  # 256 KiB weights: above the streaming threshold


def mlp(layers: int = 4, width: int = WIDTH, batch: int = 4, shared: bool = False) -> onnx.ModelProto:
    """MatMul + Add (+ Relu) layers; with `shared`, the last layer reads the first layer's matrix again."""
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = f"W{0 if shared and i == layers - 1 else i}"
        if not (shared and i == layers - 1):
            inits.append(numpy_helper.from_array((RNG.standard_normal((width, width)) / 16).astype(np.float32), w))
        inits.append(numpy_helper.from_array(RNG.standard_normal(width).astype(np.float32), f"b{i}"))
        nodes += [helper.make_node("MatMul", [x, w], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        x = f"r{i}"
    nodes[-1].output[0] = "y"
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, width]) for n in ("x", "y")]
    return helper.make_model(helper.make_graph(nodes, "mlp", vi[:1], vi[1:], inits),
                             opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def mlp_om(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("stream") / "mlp.om")
    omrt.compile(mlp(), path)
    return path


def _x() -> np.ndarray:
    return RNG.standard_normal((4, WIDTH)).astype(np.float32)


LAYER = WIDTH * WIDTH * 4


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("budget, streamed, slots", [
    (4 * LAYER + 8192, 0, 0),   # everything fits: nothing streams
    (3 * LAYER + 8192, 3, 2),   # a second slot (read-ahead) is worth streaming one weight more
    (2 * LAYER + 8192, 4, 2),
    (LAYER + 8192, 4, 1)])      # the minimum: reads and kernels take turns
def test_streamed_runs_give_the_resident_runs_bits(mlp_om, budget, streamed, slots, threads):
    omrt.set_num_threads(threads)
    resident = omrt.load(mlp_om, trust_kernels=True).session()
    model = omrt.load(mlp_om, trust_kernels=True, weight_budget=budget)
    stream = model.default.stream
    assert stream.resident_bytes + stream.slots * stream.slot_size <= budget
    assert len(stream.fills) == streamed and stream.slots == slots
    sess = model.session()
    for _ in range(4):
        x = _x()
        np.testing.assert_array_equal(sess.run({"x": x})["y"], resident.run({"x": x})["y"])
    if stream.fills:
        assert sess._stream.reads >= 4 * len(stream.fills)
    sess.close()


def test_a_weight_read_by_two_tasks_is_kept_resident_first(tmp_path):
    """The last layer reads the first layer's matrix again: of the weights that fit, that one
    stays mapped (a streamed copy would hold a slot from the first layer to the last)."""
    path = str(tmp_path / "shared.om")
    omrt.compile(mlp(shared=True), path)
    resident = omrt.load(path).session()
    model = omrt.load(path, weight_budget=2 * LAYER + 8192)
    plan = model.default.stream
    assert "W0" in plan.resident and {f.key for f in plan.fills} == {"W1", "W2"}
    x = _x()
    np.testing.assert_array_equal(model.session().run({"x": x})["y"], resident.run({"x": x})["y"])


def test_the_verifier_proves_the_schedule(mlp_om):
    model = omrt.load(mlp_om, weight_budget=LAYER + 8192)
    prep = model.default
    sizes = {k: a.nbytes for k, a in prep.graph.constants.items()}
    plan = prep.stream
    verify_stream(plan, prep.program, sizes)
    first, second = plan.fills[0], plan.fills[1]
    plan.fills[1] = type(second)(second.key, second.nbytes, second.slot, first.last, second.last, second.previous)
    with pytest.raises(PlanError, match=r"'W1' would overwrite 'W0' in slot 0 before its last reader"):
        verify_stream(plan, prep.program, sizes)
    plan.fills[1] = type(second)(second.key, second.nbytes // 2, second.slot, second.first, second.last,
                                 second.previous)  # a fill that claims less than the weight it reads
    with pytest.raises(PlanError, match=rf"weight 'W1' \({LAYER} bytes\) does not fit slot 0 as planned"):
        verify_stream(plan, prep.program, sizes)
    plan.fills[1] = second
    plan.budget = plan.resident_bytes + plan.slots * plan.slot_size - 1
    with pytest.raises(PlanError, match="exceed the budget"):
        verify_stream(plan, prep.program, sizes)


def test_a_budget_below_the_largest_weight_names_the_minimum(mlp_om):
    with pytest.raises(omrt.InputError, match=rf"weight_budget=1000 bytes is below this model's minimum of "
                                              rf"{LAYER + 4 * WIDTH * 4} bytes: its largest weight 'W\d' takes "
                                              rf"{LAYER} bytes"):
        omrt.load(mlp_om, weight_budget=1000)


def _weights_span(model: omrt.Model, keys) -> tuple[int, int]:
    offsets = model.weight_source.offsets
    lo = min(offsets[k] for k in keys)
    hi = max(offsets[k] + model.graph.constants[k].nbytes for k in keys)
    return lo, hi - lo


@pytest.mark.parametrize("keep", [False, True])
def test_weights_leave_the_page_cache_and_the_mapping_under_a_budget(tmp_path, keep):
    """Streamed weights are read into slots, resident ones once into anonymous memory: neither is
    read through the file's mapping, whose page-cache blocks would otherwise stay in RSS and in
    the cache (streamed neighbours included)."""
    path, width = str(tmp_path / "m.om"), 1024  # 4 MiB weights: spans of many page-cache folios
    omrt.compile(mlp(width=width), path)
    layer = width * width * 4
    model = omrt.load(path, weight_budget=2 * layer + 4 * width * 4, keep_page_cache=keep)
    plan = model.default.stream
    assert plan.resident and len(plan.fills) >= 2
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # the file was just written: dirty pages cannot be dropped until written back
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # start from a cold file
        sess = model.session()
        sess.run({"x": np.ones((4, width), np.float32)})
        whole = np.frombuffer(model._file.map, np.uint8)
        mapped = system.smaps_bytes(whole.__array_interface__["data"][0], whole.nbytes, "Rss")
        assert mapped <= whole.nbytes // 8, mapped  # no weight is read through the mapping
        assert not any(np.shares_memory(model.graph.constants[k], whole) for k in plan.resident)
        del whole
        sess.close()  # the filler stops: no read is in flight when the cache is counted
        offset, nbytes = _weights_span(model, [f.key for f in plan.fills])
        cached = system.cached_bytes(fd, offset, nbytes)
        if keep:
            assert cached >= 0.9 * nbytes
        else:  # what is left: the folios at the span's two ends, shared with other partitions' bytes
            assert cached <= 2 * system.HUGE_PAGE < nbytes // 4, (cached, nbytes)
    finally:
        os.close(fd)


def test_a_file_that_changes_under_a_running_model_is_detected_and_the_session_recovers(tmp_path):
    path = tmp_path / "m.om"
    omrt.compile(mlp(), str(path))
    good = path.read_bytes()
    resident = omrt.load(good).session()
    sess = omrt.load(str(path), weight_budget=LAYER + 8192).session()
    x = _x()
    np.testing.assert_array_equal(sess.run({"x": x})["y"], resident.run({"x": x})["y"])
    with open(path, "r+b") as f:
        f.truncate(len(good) // 2)
    with pytest.raises(omrt.FormatError, match=r"weight 'W\d': the model file changed size under the running "
                                               r"model"):
        sess.run({"x": x})
    path.write_bytes(good)
    np.testing.assert_array_equal(sess.run({"x": x})["y"], resident.run({"x": x})["y"])
    sess.close()


def test_a_model_at_an_offset_in_an_fd_streams_its_own_weights(mlp_om):
    data = open(mlp_om, "rb").read()
    fd = os.memfd_create("models")
    try:
        os.write(fd, bytes(8192) + data)
        memory = omrt.Memory.from_fd(fd, len(data), offset=8192, writable=False)
        model = omrt.load(memory, weight_budget=LAYER + 8192)
        assert model.default.stream.fills
        x = _x()
        want = omrt.load(mlp_om).session().run({"x": x})["y"]
        np.testing.assert_array_equal(model.session().run({"x": x})["y"], want)
    finally:
        os.close(fd)


def test_weights_need_a_file_to_stream_from(mlp_om):
    with pytest.raises(omrt.InputError, match="streams weights from the model file; <bytes of the model> is "
                                              "memory: load the model from a path or an fd"):
        omrt.load(open(mlp_om, "rb").read(), weight_budget=LAYER)
    with omrt.Memory.allocate(1 << 20) as w, pytest.raises(omrt.InputError, match="pass one of the two"):
        omrt.load(mlp_om, weights=w, weight_budget=LAYER)


# ----------------------------------------------------------------------------- swapping weights


def test_set_weight_points_the_kernels_at_caller_memory_without_a_copy(mlp_om):
    model = omrt.load(mlp_om, trust_kernels=True)
    sess = model.session()
    x = _x()
    before = sess.run({"x": x})["y"].copy()
    other = (RNG.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32)
    sess.set_weight("W2", other)
    call = next(s for s in sess._executor.instructions if "W2" in s.task.inputs)
    assert call.inputs[call.task.inputs.index("W2")] is other or np.shares_memory(call.inputs[1], other)
    swapped = sess.run({"x": x})["y"]
    graph = model.graph
    h = x
    for i in range(4):
        w = other if i == 2 else graph.constants[f"W{i}"]
        h = np.maximum(h @ w + graph.constants[f"b{i}"], 0)
    np.testing.assert_allclose(swapped, h, rtol=1e-4, atol=1e-4)
    assert not np.array_equal(swapped, before)
    sess.set_weight("W2", None)
    np.testing.assert_array_equal(sess.run({"x": x})["y"], before)
    sess.close()


def test_set_weight_refuses_what_does_not_fit_naming_the_weight(mlp_om):
    sess = omrt.load(mlp_om).session()
    with pytest.raises(omrt.BindError, match=r"weight 'W1' is float32 \(256, 256\); the replacement is float64"):
        sess.set_weight("W1", np.zeros((WIDTH, WIDTH)))
    with pytest.raises(omrt.BindError, match=r"weight 'W1' is float32 \(256, 256\); the replacement is float32 "
                                             r"\(256, 128\)"):
        sess.set_weight("W1", np.zeros((WIDTH, WIDTH // 2), np.float32))
    with pytest.raises(omrt.BindError, match="must be C-contiguous and aligned"):
        sess.set_weight("W1", np.zeros((WIDTH, 2 * WIDTH), np.float32)[:, ::2])
    with pytest.raises(omrt.InputError, match=r"'nope' is not a weight the model's kernels read; they are"):
        sess.set_weight("nope", np.zeros(3))
    with omrt.Memory.allocate(LAYER) as swap:
        swap.view(np.float32, (WIDTH, WIDTH))[:] = 0
        sess.set_weight("W1", swap)
        with pytest.raises(omrt.BindError, match="the replacement is float64"):
            sess.set_weight("W1", np.zeros((WIDTH, WIDTH)))  # refused: the swap stays, and so does its hold
        assert sess._weights["W1"][1] is swap
        with pytest.raises(omrt.BindError, match=r"is in use \(weight 'W1' of a session"):
            swap.close()
        sess.set_weight("W1", None)
    streamed = omrt.load(mlp_om, weight_budget=LAYER + 8192).session()
    key = streamed._prep.stream.fills[0].key
    with pytest.raises(omrt.BindError, match=f"weight '{key}' streams through slots under the weight budget"):
        streamed.set_weight(key, np.zeros((WIDTH, WIDTH), np.float32))
    streamed.close()


def test_a_kernel_that_precomputed_from_a_weight_is_prepared_again_without_it(tmp_path):
    """BatchNormalization folds its statistics into a scale and shift when it is prepared: after a
    swap it must use the new ones."""
    stats = [numpy_helper.from_array(RNG.uniform(0.5, 1.5, 8).astype(np.float32), n)
             for n in ("scale", "bias", "mean", "var")]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y"])
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8, 3, 3]) for n in "xy"]
    path = str(tmp_path / "bn.om")
    omrt.compile(helper.make_model(helper.make_graph([node], "bn", vi[:1], vi[1:], stats),
                                   opset_imports=[helper.make_opsetid("", 15)]), path)
    sess = omrt.load(path).session()
    x = RNG.standard_normal((2, 8, 3, 3)).astype(np.float32)
    new_scale = np.arange(1, 9, dtype=np.float32)
    sess.set_weight("scale", new_scale)
    got = sess.run({"x": x})["y"]
    s, b, m, v = (numpy_helper.to_array(t) for t in stats)
    want = (x - m[:, None, None]) / np.sqrt(v[:, None, None] + 1e-5) * new_scale[:, None, None] + b[:, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_weight_slots_cycle_experts_in_place(mlp_om, tmp_path):
    model = omrt.load(mlp_om, trust_kernels=True)
    sess = model.session()
    experts = [(RNG.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32) for _ in range(4)]
    bank = tmp_path / "experts.bin"
    bank.write_bytes(b"".join(e.tobytes() for e in experts))
    slots = omrt.WeightSlots(LAYER, count=2)
    address = slots.memory.address
    fd = os.open(bank, os.O_RDONLY)
    x = _x()
    try:
        for i in range(8):
            slot = i % 2
            if i % 4 < 2:
                slots.fill(slot, experts[i % 4])
            else:
                slots.fill(slot, (fd, (i % 4) * LAYER, LAYER))  # straight from the file
            sess.set_weight("W1", slots.view(slot, np.float32, (WIDTH, WIDTH)))
            reference = model.session()
            reference.set_weight("W1", experts[i % 4].copy())
            np.testing.assert_array_equal(sess.run({"x": x})["y"], reference.run({"x": x})["y"])
            reference.close()
    finally:
        os.close(fd)
    assert slots.memory.address == address  # never reallocated
    with pytest.raises(omrt.BindError, match="slot 0 holds 262144 bytes; the weight has 262148"):
        slots.fill(0, np.zeros(LAYER // 4 + 1, np.float32))
    sess.close()
    slots.close()


def test_a_slot_filled_from_a_file_too_short_names_where_it_ended():
    fd = os.memfd_create("expert")
    try:
        os.write(fd, bytes(100))
        slots = omrt.WeightSlots(4096, count=1)
        with pytest.raises(omrt.BindError, match=rf"slot 0: fd {fd} ended 100 bytes into the 4096 from offset 0"):
            slots.fill(0, (fd, 0, 4096))
        slots.close()
    finally:
        os.close(fd)


def test_the_command_line_takes_a_weight_budget_and_shows_the_schedule(mlp_om, capsys):
    from omrt import cli

    assert cli.main(["inspect", mlp_om, "--weight-budget", f"{(LAYER + 8192) / 1024:g}K", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "weights under a budget of 0.26 MiB: 0.00 MiB resident (4 tensors), 1.00 MiB streamed (4 tensors) " \
           "through 1 slot of 0.25 MiB" in out
    assert "slot 0: 'W1' (0.25 MiB) read for tasks 1-1, after 'W0' is done" in out
    assert cli.main(["run", mlp_om, "--weight-budget", "1M", "--repeat", "2"]) == 0
    assert "runs 3, bytes copied 0" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["run", mlp_om, "--weight-budget", "lots"])
    assert "'lots': expected a byte count such as 65536, 64K, 64M or 1.5G" in capsys.readouterr().err
    assert cli.main(["run", mlp_om, "--weight-budget", "1K"]) == 2
    assert "is below this model's minimum of" in capsys.readouterr().err
