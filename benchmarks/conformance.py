"""Run the official ONNX backend test suite against omrt and print passed/failed/errored per op.

    python benchmarks/conformance.py [--markdown docs/conformance.md] [--json FILE] [-k PATTERN]
    python benchmarks/conformance.py --markdown docs/conformance.md --ops-only

Every test goes through omrt's real path (compile to .om, load, session, run). A test that runs
longer than --timeout seconds counts as errored (and is reported), so a hang cannot stall the run.
The markdown ends with where each operator lives: every kernel registration and the module that
implements it (many kernels are made by factories in loops, so grep cannot find them). With
--ops-only that section alone is rewritten in the existing markdown, and no test runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import signal
import sys
import time
import unittest
import warnings

import onnx
import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

import omrt.backend
from omrt.kernels import lookup, registered_ops

KINDS = {"OnnxBackendNodeModelTest": "node", "OnnxBackendSimpleModelTest": "simple",
         "OnnxBackendRealModelTest": "real", "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
         "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator"}


def node_ops() -> dict[str, str]:
    """Test name -> the operator a node test exercises (the last node of its model)."""
    ops = {}
    for case in load_model_tests(kind="node"):
        model = case.model if case.model is not None else None
        if model is None and case.model_dir:
            model = onnx.load(f"{case.model_dir}/model.onnx", load_external_data=False)
        if model is not None and model.graph.node:
            ops[case.name] = model.graph.node[-1].op_type
    return ops


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run(pattern: str | None, timeout: int, backend: type = omrt.backend.OmrtBackend) -> list[dict]:
    """Run every CPU test; one record per test with its kind, op, outcome, first error line and
    the native functions it called (C symbol -> calls)."""
    bt = onnx.backend.test.BackendTest(backend, __name__)
    ops = node_ops()
    records = []
    signal.signal(signal.SIGALRM, _alarm)
    for case_name, case in bt.test_cases.items():
        kind = KINDS.get(case_name, case_name)
        for test in unittest.defaultTestLoader.loadTestsFromTestCase(case):
            name = test._testMethodName
            if name.endswith("_cuda") or (pattern and not re.search(pattern, name)):
                continue
            base = name[:-4] if name.endswith("_cpu") else name
            op = ops.get(base, "(model)" if kind != "node" else "?")
            result = unittest.TestResult()
            reached = len(omrt.backend.NATIVE_RUNS)
            signal.alarm(timeout)
            t0 = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    test.run(result)
            except _Timeout:
                result.errors.append((test, f"timeout after {timeout} s"))
            finally:
                signal.alarm(0)
            outcome, detail = "passed", ""
            if result.skipped:
                outcome, detail = "skipped", result.skipped[0][1]
            elif result.failures:
                outcome, detail = "failed", result.failures[0][1]
            elif result.errors:
                outcome, detail = "errored", result.errors[0][1]
            lines = [ln for ln in detail.strip().splitlines() if ln.strip()]
            native: collections.Counter = collections.Counter()
            for calls in omrt.backend.NATIVE_RUNS[reached:]:
                native.update(calls)
            records.append({"test": base, "kind": kind, "op": op, "outcome": outcome,
                            "detail": lines[-1][:300] if lines else "",
                            "seconds": round(time.perf_counter() - t0, 3), "native": dict(native)})
    return records


def table(records: list[dict]) -> tuple[dict, dict]:
    per_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    total: collections.Counter = collections.Counter()
    for r in records:
        per_op[r["op"]][r["outcome"]] += 1
        total[r["outcome"]] += 1
    return per_op, total


def native_summary(native: list[dict]) -> list[str]:
    """Markdown lines on the native run: its totals, the tests that reached C, per C function."""
    _, total = table(native)
    reached = [r for r in native if r["native"]]
    per_function: collections.Counter = collections.Counter()
    for r in reached:
        per_function.update({symbol: 1 for symbol in r["native"]})
    lines = [f"**Native run: {total['passed']} passed, {total['failed']} failed, {total['errored']} errored, "
             f"{total['skipped']} skipped; {len(reached)} tests reached native code** "
             f"({sum(r['outcome'] == 'passed' for r in reached)} of them passed). Tests per C function: "
             + ", ".join(f"`{symbol}` {n}" for symbol, n in per_function.most_common()) + "."]
    return lines


def markdown(numpy_run: list[dict], native: list[dict]) -> str:
    per_op, total = table(numpy_run)
    native_outcome = {r["test"]: r["outcome"] for r in native}
    out = ["# ONNX backend conformance", "",
           f"The official ONNX backend test suite (onnx {onnx.__version__}, CPU tests) run against "
           f"omrt through `omrt.backend` (compile to `.om`, load, run), on the numpy kernels and again "
           f"with every model's native library trusted (two threads, and the thresholds that keep small "
           f"layers off the C code lowered). Generated by "
           f"`python benchmarks/conformance.py --markdown docs/conformance.md`.", "",
           f"**Numpy run: {sum(total.values())} tests: {total['passed']} passed, {total['failed']} failed, "
           f"{total['errored']} errored, {total['skipped']} skipped.**", ""]
    out += native_summary(native)
    differ = sorted(t for t, o in native_outcome.items()
                    if o != next(r["outcome"] for r in numpy_run if r["test"] == t))
    out += ["", f"Tests whose outcome differs between the two runs: {', '.join(differ) or 'none'}.", "",
            "Tests omrt does not pass yet, and why (`omrt.backend.UNSUPPORTED`, the one list):", ""]
    out += [f"- `{pattern}`: {reason}" for pattern, reason in omrt.backend.UNSUPPORTED.items()]
    out += ["", "| operator | passed | failed | errored | skipped | first problem |", "|---|---|---|---|---|---|"]
    for op in sorted(per_op):
        c = per_op[op]
        bad = next((r["detail"] for r in numpy_run if r["op"] == op and r["outcome"] in ("failed", "errored")),
                   "")
        bad = bad.replace("|", "\\|")[:120]
        out.append(f"| {op} | {c['passed']} | {c['failed']} | {c['errored']} | {c['skipped']} | {bad} |")
    return "\n".join(out) + "\n\n" + ops_section()


OPS_HEADING = "## Where each operator lives"


def ops_section() -> str:
    """Every kernel registration (domain, operator, first opset) and the module of its class."""
    out = [OPS_HEADING, "",
           "Every operator omrt's kernel library registers, from the opset each kernel serves, and the "
           "module that implements it (`omrt.kernels.registered_ops()`; kernels that factories make in "
           "loops are listed too). Rewrite this section alone with "
           "`python benchmarks/conformance.py --markdown docs/conformance.md --ops-only`.", "",
           "| domain | operator | since opset | module |", "|---|---|---|---|"]
    for domain, op, since in registered_ops():
        module = lookup(op, since, domain).__module__
        out.append(f"| {domain or 'ai.onnx'} | {op} | {since} | `{module}` |")
    return "\n".join(out) + "\n"


def replace_ops_section(text: str) -> str:
    """`text` (a markdown written by this script) with its operator section made anew, at its end."""
    start = text.find(OPS_HEADING)
    head = text if start < 0 else text[:start]
    return head.rstrip("\n") + "\n\n" + ops_section()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="pattern", help="only tests whose name matches this regex")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test before it counts as errored")
    ap.add_argument("--markdown", help="write the per-op table here")
    ap.add_argument("--json", help="write every test's record here")
    ap.add_argument("--ops-only", action="store_true",
                    help="only rewrite the section on where each operator lives in the --markdown file")
    args = ap.parse_args()
    if args.ops_only:
        if not args.markdown:
            ap.error("--ops-only rewrites a section of the --markdown file; give --markdown")
        with open(args.markdown) as f:
            text = f.read()
        with open(args.markdown, "w") as f:
            f.write(replace_ops_section(text))
        return 0
    numpy_run = run(args.pattern, args.timeout)
    native = run(args.pattern, args.timeout, omrt.backend.OmrtNativeBackend)
    per_op, total = table(numpy_run)
    print(f"{'operator':<36}{'passed':>8}{'failed':>8}{'errored':>8}{'skipped':>8}")
    for op in sorted(per_op):
        c = per_op[op]
        print(f"{op:<36}{c['passed']:>8}{c['failed']:>8}{c['errored']:>8}{c['skipped']:>8}")
    print(f"{'TOTAL':<36}{total['passed']:>8}{total['failed']:>8}{total['errored']:>8}{total['skipped']:>8}"
          f"   ({sum(total.values())} tests)")
    print("\n".join(native_summary(native)).replace("**", ""))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(numpy_run, native))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"numpy": numpy_run, "native": native}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
