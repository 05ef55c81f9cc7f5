"""docs/conformance.md's table of where each operator lives matches the kernel registry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "conformance.md")


def test_operator_table_matches_the_registry(tmp_path):
    """Rewriting the section from the registry, as `--ops-only` does, leaves the doc as it is."""
    copy = tmp_path / "conformance.md"
    shutil.copy(DOC, copy)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "conformance.py"),
                           "--markdown", str(copy), "--ops-only"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(DOC) as f:
        assert copy.read_text() == f.read(), (
            "docs/conformance.md does not list the registered kernels and their modules as they are; "
            "run: python benchmarks/conformance.py --markdown docs/conformance.md --ops-only")
