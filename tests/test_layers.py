"""The layering of src/omrt (docs/architecture.md): no import cycles, no reach upwards, and a
runtime that imports nothing but numpy and the standard library."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import omrt

ROOT = Path(omrt.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute names a statement imports (a submodule where `from pkg import sub` names one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]


def _imports(module: str, *, lazy: bool) -> set[str]:
    """What `module` imports: at module level, or anywhere (`lazy`); never under TYPE_CHECKING."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and not lazy:
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.update(_targets(module, child))
            visit(child)

    visit(ast.parse(MODULES[module].read_text()))
    return found


def _internal(names: set[str], module: str) -> set[str]:
    return {n for n in names if n in MODULES and n != module}


def test_no_import_cycles():
    graph = {m: _internal(_imports(m, lazy=True), m) for m in MODULES}
    for start in graph:
        seen, stack = set(), [(start, (start,))]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                assert nxt != start, f"import cycle: {' -> '.join(path + (nxt,))}"
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + (nxt,)))


FORBIDDEN = {
    "omrt.kernels": ("omrt.plan", "omrt.runtime", "omrt.compiler", "omrt.format", "omrt.serving"),
    "omrt.native": ("omrt.kernels", "omrt.plan", "omrt.runtime", "omrt.compiler", "omrt.serving"),
    "omrt.plan": ("omrt.runtime", "omrt.compiler", "omrt.format", "omrt.native", "omrt.serving"),
    "omrt.format": ("omrt.runtime", "omrt.compiler", "omrt.native", "omrt.serving"),
    "omrt.runtime": ("omrt.compiler", "omrt.serving"),
    "omrt.memory": ("omrt.runtime", "omrt.serving"),
    "omrt.serving": ("omrt.compiler",),
}
"""Layers, and the layers above them they may not import (docs/architecture.md)."""


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_reaches_upwards(layer):
    for module in (m for m in MODULES if m == layer or m.startswith(layer + ".")):
        for target in _internal(_imports(module, lazy=True), module):
            assert not target.startswith(FORBIDDEN[layer]), f"{module} imports {target}"


def test_what_load_reaches_imports_only_numpy_and_the_standard_library():
    reached, todo = set(), ["omrt.runtime", "omrt"]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        for target in _imports(module, lazy=False):
            if target in MODULES:
                todo.append(target)
                continue
            top = target.split(".")[0]
            assert top == "numpy" or top in sys.stdlib_module_names, \
                f"{module} imports {target} at module level; omrt.load must need only numpy"
    assert {"omrt.runtime.session", "omrt.serving.server", "omrt.serving.client"} <= reached
    assert "omrt.compiler" not in reached


LOAD_AND_RUN = ("import os, sys\n"
                "before = set(sys.modules)\n"
                "import numpy as np, omrt\n"
                "model = omrt.load(sys.argv[1])\n"
                "model.session().run({'x': np.ones((4, 64), np.float32)})\n"
                "new = {n.split('.')[0] for n in set(sys.modules) - before}\n"
                "print(' '.join(sorted(new - set(sys.stdlib_module_names))))\n")


def test_loading_and_running_an_unsigned_model_imports_only_numpy(mlp_om, tmp_path):
    """In a real process, with no trusted keys configured: nothing but numpy and the standard
    library is imported (no cryptography: signatures are not checked for an unsigned file)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMRT_TRUSTED_KEYS", "XDG_CONFIG_HOME")}
    env["HOME"] = str(tmp_path)
    env["PYTHONPATH"] = str(ROOT.parent) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, mlp_om], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["numpy", "omrt"]


OPTIONAL = {"omrt.ray": ("ray", "omrt[ray]")}
"""Modules of optional features: the package each needs, and what installs it."""


def test_no_module_imports_an_optional_feature():
    for module in MODULES:
        reached = _internal(_imports(module, lazy=True), module) & set(OPTIONAL)
        assert not reached, f"{module} imports {reached}: optional features are imported only by their users"


@pytest.mark.parametrize("module", sorted(OPTIONAL))
def test_an_optional_feature_without_its_dependency_says_what_to_install(module):
    dependency, extra = OPTIONAL[module]
    block = ("import sys\n"
             "class Block:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             f"        if name.split('.')[0] == {dependency!r}:\n"
             "            raise ImportError('blocked: ' + name)\n"
             "sys.meta_path.insert(0, Block())\n"
             f"import {module}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, env=env)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and last.startswith("ImportError: ") and last.endswith(f"pip install {extra}"), last
