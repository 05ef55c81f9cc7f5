"""`omrt bench`: the CLI end to end on a tiny model, its errors, and its figures without onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

import omrt
from conftest import mlp_model
from omrt import IOSpec, bench, cli


def saved_mlp(path, batch: int | str = 4) -> str:
    """The shared test MLP (MatMul+Add+Relu, MatMul, Reshape) written to `path`."""
    onnx.save(mlp_model(batch), str(path))
    return str(path)


def test_cli_bench_against_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    src = saved_mlp(tmp_path / "mm.onnx")
    out = tmp_path / "out.json"
    res = subprocess.run([sys.executable, "-m", "omrt.cli", "bench", src, "--runs", "3", "--warmup", "1",
                          "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "planning memory" in res.stderr
    assert "ok (" in res.stdout and f"wrote {out}" in res.stdout
    doc = json.loads(out.read_text())
    assert doc["inputs"] == {"x": ["float32", [4, 64]]} and doc["outputs"] == {"y": ["float32", [4, 10]]}
    assert doc["compile_s"] > 0 and doc["om_bytes"] > 0 and doc["seed"] == 0
    start = doc["startup"]
    assert start["reps"] == bench.STARTUP_REPS
    assert start["omrt_load_session_ms"] > 0 and start["ort_session_create_ms"] > 0
    assert start["ratio"] == pytest.approx(start["omrt_load_session_ms"] / start["ort_session_create_ms"])
    (n,) = doc["threads"]
    rec = doc["threads"][n]
    assert n == "1" and rec["blas_threads"] in (1, None)
    for variant in ("omrt", "ort_run", "ort_iobinding"):
        assert rec[variant]["runs"] == 3 and rec[variant]["median_ms"] > 0
        assert rec[variant]["p90_ms"] >= rec[variant]["median_ms"] >= rec[variant]["min_ms"]
    assert rec["ratio_vs_run"] == pytest.approx(rec["omrt"]["median_ms"] / rec["ort_run"]["median_ms"])
    assert rec["bytes_copied_per_run"] == 0
    assert rec["check"]["y"]["close"] and rec["check"]["y"]["scaled_error"] < 1e-4


def test_symbolic_dims_need_shape(tmp_path, capsys):
    src = saved_mlp(tmp_path / "dyn.onnx", batch="N")
    assert cli.main(["bench", src, "--runs", "1", "--threads", "1"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == ("omrt: error: input 'x' has symbolic dims ['N', 64]; give it a fixed shape, "
                   "e.g. --shape x=1x64")
    out = tmp_path / "out.json"
    assert cli.main(["bench", src, "--runs", "2", "--warmup", "0", "--threads", "1", "--shape", "x=2x64",
                     "--json", str(out)]) == 0
    assert json.loads(out.read_text())["inputs"] == {"x": ["float32", [2, 64]]}


def test_without_onnxruntime_omrt_is_still_measured(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    src = saved_mlp(tmp_path / "mm.onnx")
    out = tmp_path / "out.json"
    assert bench.run(src, threads=[1], runs=2, warmup=0, json_path=str(out)) == 0
    text = capsys.readouterr().out
    assert "ONNX Runtime was not measured: onnxruntime is not installed (pip install onnxruntime)" in text
    assert "ORT not measured" in text
    doc = json.loads(out.read_text())
    assert doc["onnxruntime"] is None and set(doc["startup"]) == {"reps", "omrt_load_session_ms"}
    rec = doc["threads"]["1"]
    assert rec["omrt"]["runs"] == 2 and rec["omrt"]["median_ms"] > 0
    assert not {"ort_run", "ort_iobinding", "check", "ratio_vs_run"} & set(rec)


def test_random_inputs_are_seeded_and_in_range():
    specs = [IOSpec("f", np.dtype(np.float32), (1000,)), IOSpec("u", np.dtype(np.uint8), (1000,)),
             IOSpec("i", np.dtype(np.int64), (1000,)), IOSpec("b", np.dtype(np.bool_), (1000,))]
    a, b, c = bench.random_inputs(specs, 0), bench.random_inputs(specs, 0), bench.random_inputs(specs, 1)
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.array_equal(a["f"], c["f"])
    assert {k: v.dtype for k, v in a.items()} == {s.name: s.dtype for s in specs}
    assert 0 <= a["f"].min() and a["f"].max() < 1 and a["f"].std() > 0.25
    assert a["u"].min() < 10 and a["u"].max() > 245
    assert set(np.unique(a["i"])) == set(range(10)) and 0.4 < a["b"].mean() < 0.6
    with pytest.raises(omrt.InputError, match="input 's' has dtype <U1; omrt bench draws numbers and booleans"):
        bench.random_inputs([IOSpec("s", np.dtype("U1"), (2,))])
