"""The README's Python example and CLI commands run as written."""

from __future__ import annotations

import linecache
import os
import re
import subprocess
import sys

import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()


def _needs_ray(code: str) -> bool:
    """Whether a block uses omrt.ray: those run only where Ray is installed (`omrt[ray]`)."""
    return "omrt.ray" in code


def _run_python_blocks(text: str, name: str, ray: bool = False) -> None:
    """Run every ```python block of a document that uses omrt.ray (`ray`) or does not, in order, in
    one namespace. Each block's source is known to `linecache` under a name of its own, as a
    script's is: functions a block defines can be packed as custom operators (their source is read
    with `inspect.getsource`)."""
    namespace: dict = {}
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", text, re.S)):
        if _needs_ray(code) != ray:
            continue
        filename = f"<{name}, block {i + 1}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        exec(compile(code, filename, "exec"), namespace)


def test_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run_python_blocks(README, "README.md")
    assert (tmp_path / "squeezenet.om").exists()


def test_ray_examples_run(tmp_path, monkeypatch):
    """The README's Ray example and docs/ray.md, each on a local Ray of its own (RAY_ADDRESS=local:
    never a cluster another process started), which each shuts down."""
    pytest.importorskip("ray", reason="the Ray examples need Ray (pip install omrt[ray]); CI installs it")
    import ray

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "local")
    guide = open(os.path.join(ROOT, "docs", "ray.md")).read()
    assert all(_needs_ray(code) for code in re.findall(r"```python\n(.*?)```", guide, re.S))
    try:
        _run_python_blocks(README, "README.md", ray=True)
        _run_python_blocks(guide, "docs/ray.md", ray=True)
    finally:
        if ray.is_initialized():
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    assert not ray.is_initialized()


def test_memory_guide_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run_python_blocks(open(os.path.join(ROOT, "docs", "memory.md")).read(), "docs/memory.md")


def test_serving_guide_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run_python_blocks(open(os.path.join(ROOT, "docs", "serving.md")).read(), "docs/serving.md")
    assert not (tmp_path / "double.sock").exists()


def test_custom_ops_guide_examples_run(tmp_path, monkeypatch):
    from omrt.native.build import compiler

    if compiler() is None:
        pytest.skip("the guide builds C kernels; no C compiler on this host")
    monkeypatch.chdir(tmp_path)
    _run_python_blocks(open(os.path.join(ROOT, "docs", "custom_ops.md")).read(), "docs/custom_ops.md")
    assert {"mish.om", "swiglu.om", "gelu_mish.om", "prebuilt.om", "half.om"} <= set(os.listdir(tmp_path))
    assert "wrong.om" not in os.listdir(tmp_path)


def _omrt(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omrt.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_compile_run_inspect(tmp_path):
    from omrt.zoo import shipped

    src = shipped("squeezenet")[0]
    res = _omrt("compile", src, "sq.om", "--shape", "data_0=1x3x224x224", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "arena" in res.stdout and "x1.000" in res.stdout
    res = _omrt("run", "sq.om", "--repeat", "2", "--output-dir", "out", "--profile", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "output 'softmaxout_1': float32 [1, 1000, 1, 1]" in res.stdout
    profile = res.stdout.split("time per op type", 1)[1]
    assert {"PackedConv", "WinogradConv", "MaxPool"} <= set(re.findall(r"\n  (\w+) +[0-9.]+ ms", profile))
    assert (tmp_path / "out" / "softmaxout_1.npy").exists()
    res = _omrt("inspect", "sq.om", "--plan", "--plot", "plan.svg", "--verify", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for part in ("MODEL_DEF", "WEIGHTS", "KERNELS", "PLANS", "ENV", "lower bound", "weights digest: ok"):
        assert part in res.stdout
    assert (tmp_path / "plan.svg").read_text().startswith("<svg")


def test_cli_plans_signatures_at_compile_time(tmp_path):
    import onnx
    import omrt
    from conftest import mlp_model

    onnx_path = tmp_path / "dyn.onnx"
    onnx.save(mlp_model(batch="N"), onnx_path)
    res = _omrt("compile", str(onnx_path), "dyn.om", "--plan-for", "x=1x64", "--plan-for", "x=8x64", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "planned for {'x': (1, 64)}" in res.stdout and "planned for {'x': (8, 64)}" in res.stdout
    assert [p.signature for p in omrt.load(str(tmp_path / "dyn.om")).stored_plans] == [{"x": (1, 64)}, {"x": (8, 64)}]
    res = _omrt("inspect", "dyn.om", cwd=tmp_path)
    assert "plans: 2 stored for input signatures" in res.stdout
    res = _omrt("compile", str(onnx_path), "bad.om", "--plan-for", "x=1x64,", cwd=tmp_path)
    assert res.returncode == 2 and "--plan-for 'x=1x64,': expected NAME=D1xD2x...[,NAME=...]" in res.stderr


def test_cli_errors_are_one_clear_line(tmp_path):
    res = _omrt("run", "missing.om", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == "omrt: error: model file 'missing.om' does not exist"
    res = _omrt("compile", "x.onnx", "y.om", "--shape", "oops", cwd=tmp_path)
    assert res.returncode == 2 and "expected NAME=D1xD2x..." in res.stderr


def test_cli_input_errors_are_one_clear_line(tmp_path):
    import numpy as np
    import omrt
    from conftest import mlp_model

    omrt.compile(mlp_model(), str(tmp_path / "mlp.om"))
    res = _omrt("run", "mlp.om", "--input", "x=missing.npy", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == "omrt: error: --input x=missing.npy: no such file"
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    res = _omrt("run", "mlp.om", "--input", "x=junk.npy", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("omrt: error: --input x=junk.npy: not a .npy array file")
    assert len(res.stderr.strip().splitlines()) == 1
    np.save(tmp_path / "x.npy", np.ones((4, 64), np.float32))
    res = _omrt("run", "mlp.om", "--input", "x=x.npy", cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_cli_inspect_shows_whether_trusted_kernels_load(tmp_path):
    from omrt.zoo import shipped

    assert _omrt("compile", shipped("squeezenet")[0], "sq.om", cwd=tmp_path).returncode == 0
    plain = _omrt("inspect", "sq.om", cwd=tmp_path)
    trusted = _omrt("inspect", "sq.om", "--trust-kernels", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    if "no C compiler" in plain.stderr:
        return
    assert "not loaded: not trusted" in plain.stdout
    assert "\n    loaded\n" in trusted.stdout


def test_demo_reports_a_match():
    res = subprocess.run([sys.executable, "-m", "omrt.cli", "demo", "--repeat", "2"], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "matches the reference (ONNX Runtime): yes" in res.stdout
    assert "bytes copied per run: 0" in res.stdout
    assert "native kernels (conv, elementwise, pool, winograd): loaded" in res.stdout or "no C compiler" in res.stderr
