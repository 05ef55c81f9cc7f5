"""The `omrt` command line: compile, run, inspect, repack, sign, keygen, bench, demo, serve."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .errors import OmrtError
from .runtime.profile import PROFILE_BY, round_trip_text

if TYPE_CHECKING:
    from .runtime import OpThreads, Session


def _shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: expected NAME=D1xD2x..., e.g. "
                                         f"input=1x3x224x224") from None


def _signature_arg(text: str) -> dict[str, tuple[int, ...]]:
    """One input signature: NAME=D1xD2[,NAME=D1xD2...], a shape for each symbolic input."""
    try:
        return dict(_shape_arg(part) for part in text.split(","))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--plan-for {text!r}: expected NAME=D1xD2x...[,NAME=...], e.g. "
                                         f"ids=1x128,mask=1x128") from None


def _count_arg(text: str, option: str = "") -> int:
    """A whole number >= 1 (threads, workers, queue length, batch rows)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{option}{text!r}: expected a whole number >= 1")
    return int(text)


def _threads_arg(text: str) -> int:
    return _count_arg(text, "--threads ")


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes_arg(text: str) -> int:
    """A byte count: 65536, 64K, 64M, 1.5G (binary units)."""
    number, unit = text[:-1] if text[-1:].upper() in "KMG" else text, text[-1:].upper()
    unit = unit if unit in "KMG" else ""
    try:
        value = int(float(number) * _UNITS[unit])
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a byte count such as 65536, 64K, 64M or 1.5G")
    return value


def _input_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--input {text!r}: expected NAME=FILE.npy")
    return name, path


def _load_array(name: str, path: str) -> np.ndarray:
    """The array in FILE.npy given as input `name`, or an InputError saying why not."""
    from .errors import InputError

    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"--input {name}={path}: no such file") from None
    except (OSError, ValueError) as e:
        raise InputError(f"--input {name}={path}: not a .npy array file ({e})") from None


def cmd_compile(args: argparse.Namespace) -> int:
    import omrt

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"  {msg}", file=sys.stderr)

    from .custom import ops_from_file

    ops = [op for path in args.custom_op or [] for op in ops_from_file(path)]
    res = omrt.compile(args.model, args.output, shapes=dict(args.shape or []), progress=progress,
                       native=not args.no_native, shapes_for=args.plan_for or [], custom_ops=ops, cc=args.cc,
                       autofuse=not args.no_autofuse)
    from .format.kernelstore import FUSED
    from .report import library_line, mib, plan_figures

    print(f"{args.output}: {mib(res.file_size)} ({mib(res.weights_bytes)} weights), "
          f"{len(res.graph.nodes)} nodes, compiled in {res.seconds:.2f} s")
    if res.program is not None:
        print(f"  {plan_figures(res.program)}")
    else:
        print("  input shapes are symbolic: plans are made per input signature at run time")
    for program in res.stored:
        print(f"  planned for {program.signature}: {plan_figures(program)}")
    for record in res.libraries:
        print(f"  {'fused' if record.kind == FUSED else 'native'} kernels {library_line(record)}")
    if res.fused:
        print(f"  {len(res.fused)} fused chains, {mib(sum(f.intermediate_bytes for f in res.fused))} of intermediate "
              f"tensors out of the arena")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import omrt
    from .zoo import backend_input

    omrt.set_num_threads(args.threads)
    model = omrt.load(args.model, trust_kernels=args.trust_kernels, weight_budget=args.weight_budget,
                      trusted_keys=args.trusted_key, require_signature=args.require_signature)
    sess = model.session()
    given = dict(args.input or [])
    feeds = {}
    for spec in model.inputs:
        if spec.name in given:
            feeds[spec.name] = _load_array(spec.name, given.pop(spec.name))
        elif all(isinstance(d, int) for d in spec.shape) and spec.dtype.kind == "f":
            feeds[spec.name] = backend_input(tuple(spec.shape)).astype(spec.dtype)
            print(f"input {spec.name!r}: not given, using arange(n)/n of shape {list(spec.shape)}")
        else:
            raise omrt.InputError(f"input {spec.name!r} ({spec.dtype}, {list(spec.shape)}) is required: "
                                  f"pass --input {spec.name}=FILE.npy")
    if given:
        raise omrt.InputError(f"--input names {sorted(given)}, which are not inputs; the inputs are "
                              f"{[s.name for s in model.inputs]}")
    for name, arr in feeds.items():
        sess.bind(name, arr)
    outputs = sess.run()
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        sess.run()
        times.append(time.perf_counter() - t)
    for name, arr in outputs.items():
        flat = arr.ravel()
        print(f"output {name!r}: {arr.dtype} {list(arr.shape)}  first values {flat[:5].tolist()}")
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            np.save(os.path.join(args.output_dir, f"{name.replace('/', '_')}.npy"), arr)
    if times:
        print(f"latency over {len(times)} runs: median {statistics.median(times) * 1e3:.3f} ms, "
              f"min {min(times) * 1e3:.3f} ms")
    if args.profile:
        _print_profile(sess, max(args.repeat, 1), args.threads, args.profile_by)
    s = sess.stats
    print(f"runs {s.runs}, bytes copied {s.bytes_copied}, arena {s.arena_bytes}, lower bound {s.lower_bound}")
    return 0


def _print_profile(sess: Session, repeat: int, threads: int, by: str = "op") -> None:
    """Time per op type and fused chain (or per node); with several threads, each one's busy time
    during it and how much of the other threads' time idled, then the same over whole runs."""
    prof = sess.profile_threads(repeat=repeat, by=by)
    total = sum(op.seconds for op in prof.ops.values())
    what = "node" if by == "node" else "op type and fused chain"
    print(f"time per {what} (mean of {repeat} runs, {total * 1e3:.3f} ms in kernels):")
    width = max([24] + [len(op) + 2 for op in prof.ops])
    if threads > 1:
        busy = "".join(f"{f'busy t{t}':>10}" for t in range(threads))
        print(f"  {'':<{width}}{'ms/run':>10}  {'share':>6}{busy}  {'idle t1+':>8}")
    for op, fig in prof.ops.items():
        line = f"  {op:<{width}}{fig.seconds * 1e3:10.3f} ms  {100 * fig.seconds / total:5.1f}%"
        print(line + _thread_columns(fig) if threads > 1 else line)
    if threads > 1:
        run = prof.run
        print(f"whole run: {run.seconds * 1e3:.3f} ms; the other threads were busy "
              f"{', '.join(f'{b * 1e3:.3f}' for b in run.busy[1:])} ms of it: idle {100 * run.idle:.1f}%")
        print("busy: time on omrt's split work (its native pool and its own threads); work that runs "
              "elsewhere (numpy, OpenBLAS, a kernel that does not split) leaves threads t1+ idle")
        if prof.round_trip_ns is not None:
            print(f"cores: a cache line from t0 to t1 and back took {round_trip_text(prof.round_trip_ns)} before and "
                  "after the runs (tens of ns: the cores share a cache; hundreds: they are on different dies or "
                  "sockets, each layer's output crosses between them, and t1 gains less)")


def _thread_columns(fig: OpThreads) -> str:
    """Each thread's busy ms and the other threads' idle share, as table columns."""
    return "".join(f"{b * 1e3:10.3f}" for b in fig.busy) + f"  {100 * fig.idle:7.1f}%"


def cmd_inspect(args: argparse.Namespace) -> int:
    import omrt
    from .report import describe, plot

    model = omrt.load(args.model, verify=args.verify, trust_kernels=args.trust_kernels,
                      weight_budget=args.weight_budget, trusted_keys=args.trusted_key,
                      require_signature=args.require_signature)
    print(describe(model, plan=args.plan))
    if args.verify:
        print("weights digest: ok")
    if args.plot:
        if model.default is None:
            raise omrt.OmrtError("the model stores no plan (symbolic input shapes): nothing to plot")
        plot(model, args.plot)
        print(f"plan picture written to {args.plot}")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    from .signing import short, sign

    fingerprint, parts = sign(args.model, args.key)
    print(f"{args.model}: signed by key {short(fingerprint)} (sha256 {fingerprint}); covers the header and "
          f"{', '.join(parts)}")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from .signing import keygen, keys_file, short

    fingerprint = keygen(args.key, args.comment)
    print(f"private key {args.key} (keep it secret), public key {args.key}.pub: key {short(fingerprint)}")
    print(f"to trust it: add {args.key}.pub to {keys_file() or 'the trusted keys file'}, or pass --trusted-key "
          f"{args.key}.pub")
    return 0


def _trust_args(p: argparse.ArgumentParser) -> None:
    """The options that decide whether the file's packed code runs (run, inspect and serve)."""
    p.add_argument("--trust-kernels", action="store_true",
                   help="run the native kernels packed in the file (machine code: only for files you trust)")
    p.add_argument("--trusted-key", action="append", type=Path, metavar="FILE",
                   help="trust files signed by the public key in FILE (repeatable; besides the trusted keys file)")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse the file unless it is signed by a trusted key")


def _replace_arg(text: str) -> tuple[str, str]:
    selector, sep, path = text.partition("=")
    if not sep or not selector or not path:
        raise argparse.ArgumentTypeError(f"--replace {text!r}: expected NAME[@TARGET]=FILE, e.g. "
                                         f"omrt-native@aarch64-linux-gnu=arm.om")
    return selector, path


def cmd_repack(args: argparse.Namespace) -> int:
    """Add, replace or remove packed libraries (see omrt.repack)."""
    import omrt
    from .report import library_line

    res = omrt.repack(args.input, args.output, add=args.add or [], remove=args.remove or [],
                      replace=dict(args.replace or []))
    for record in res.removed:
        print(f"removed {library_line(record)}")
    for record in res.added:
        print(f"added {library_line(record)}")
    print(f"{res.path}: {len(res.kernels)} packed librar{'y' if len(res.kernels) == 1 else 'ies'}")
    for record in res.kernels:
        print(f"  {library_line(record)}")
    for note in res.notes:
        print(f"note: {note}")
    return 0


def _thread_counts_arg(text: str) -> list[int]:
    """--threads of `bench`: comma-separated counts, each checked like a single --threads."""
    return [_threads_arg(t) for t in text.split(",")]


def cmd_bench(args: argparse.Namespace) -> int:
    """Compile the model to a temporary .om and time it beside ONNX Runtime (see omrt.bench)."""
    from .bench import run

    def progress(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr)

    return run(args.model, args.threads, args.runs, args.warmup, dict(args.shape or []), args.seed, args.json,
               progress)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main as demo

    return demo(args.model, args.repeat, args.threads)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the model on a Unix socket until SIGTERM or SIGINT (see omrt.serving)."""
    import contextlib
    import resource

    import omrt
    from .serving import Options, Server

    omrt.set_num_threads(args.threads)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # each memory a client registers holds two fds here
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    options = Options(workers=args.workers, queue=args.queue, batch_window=args.batch_window / 1e3,
                      max_batch=args.max_batch)
    model = omrt.load(args.model, trust_kernels=args.trust_kernels, trusted_keys=args.trusted_key,
                      require_signature=args.require_signature)
    server = Server(model, args.socket, options)
    batching = (f"batching rows of {server.batch_dim!r} within {args.batch_window:g} ms, up to {args.max_batch}"
                if server.batch_dim else "no batching")
    print(f"omrt serve: {server.model!r} on {args.socket} (mode 0600); {args.workers} workers, queue "
          f"{args.queue}, {batching}", flush=True)
    server.serve_forever()
    s = server.snapshot()
    print(f"omrt serve: stopped after {s['requests']} requests in {s['runs']} runs; bytes copied "
          f"{s['bytes_copied']}", flush=True)
    return 0


def _milliseconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"--batch-window {text!r}: expected milliseconds >= 0, e.g. 2 or 0.5")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="omrt", description="Ahead-of-time compiler and zero-copy runtime "
                                 "for ONNX models.")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile an ONNX model into a .om file")
    c.add_argument("model", help="the .onnx file")
    c.add_argument("output", help="the .om file to write")
    c.add_argument("--shape", action="append", type=_shape_arg, metavar="NAME=D1xD2...",
                   help="fix an input's shape (repeatable)")
    c.add_argument("--plan-for", action="append", type=_signature_arg, metavar="NAME=D1xD2[,NAME=...]",
                   help="plan memory now for this input signature of a model with symbolic shapes "
                        "(repeatable); loading it then plans nothing for that signature")
    c.add_argument("--custom-op", action="append", metavar="FILE.py",
                   help="a Python file whose list OPS defines custom operators (omrt.CustomOp); those the model "
                        "uses are packed into the file (repeatable)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    c.add_argument("--no-native", action="store_true",
                   help="do not build and pack native kernels (the model then runs on numpy kernels only)")
    c.add_argument("--cc", action="append", metavar="CC",
                   help="build the native kernels with this C compiler, for its target (repeatable: one "
                        "library per compiler, e.g. --cc gcc --cc aarch64-linux-gnu-gcc)")
    c.add_argument("--no-autofuse", action="store_true",
                   help="do not fuse elementwise chains into generated C kernels (on by default with a C compiler)")
    c.set_defaults(fn=cmd_compile)
    r = sub.add_parser("run", help="run a .om model and print its outputs and latency")
    r.add_argument("model")
    r.add_argument("--input", action="append", type=_input_arg, metavar="NAME=FILE.npy")
    r.add_argument("--repeat", type=int, default=0, help="timed runs after the first")
    r.add_argument("--output-dir", help="save outputs as .npy files here")
    r.add_argument("--profile", action="store_true", help="print time per op type and per fused chain")
    r.add_argument("--profile-by", choices=PROFILE_BY, default="op",
                   help="with --profile: per op type and fused chain (op, the default) or per node")
    _trust_args(r)
    r.add_argument("--threads", type=_threads_arg, default=1, metavar="N",
                   help="run omrt's kernels on N threads of its own (default 1; see omrt.set_num_threads)")
    r.add_argument("--weight-budget", type=_bytes_arg, metavar="BYTES",
                   help="keep at most this many bytes of weights in memory (64M, 1G); stream the others")
    r.set_defaults(fn=cmd_run)
    i = sub.add_parser("inspect", help="show a .om file's partitions, I/O, kernels and memory plan")
    i.add_argument("model")
    i.add_argument("--plan", action="store_true", help="list tasks and draw the arena over time")
    i.add_argument("--plot", metavar="FILE.png|svg", help="write a picture of the memory plan")
    i.add_argument("--verify", action="store_true", help="also check the weights' digest")
    _trust_args(i)
    i.add_argument("--weight-budget", type=_bytes_arg, metavar="BYTES",
                   help="show which weights stay resident and the streaming schedule under this budget")
    i.set_defaults(fn=cmd_inspect)
    s = sub.add_parser("sign", help="sign a .om file with an Ed25519 key, so that hosts trusting the key run "
                                    "its packed code")
    s.add_argument("model", help="the .om file (rewritten in place, atomically)")
    s.add_argument("--key", required=True, help="the private key file (omrt keygen KEY)")
    s.set_defaults(fn=cmd_sign)
    k = sub.add_parser("keygen", help="make an Ed25519 key pair for omrt sign: KEY (mode 0600) and KEY.pub")
    k.add_argument("key", help="the private key file to create (KEY.pub beside it)")
    k.add_argument("--comment", help="the comment after the public key (default: the file's name)")
    k.set_defaults(fn=cmd_keygen)
    p = sub.add_parser("repack", help="add, replace or remove the libraries packed in a .om file, without "
                                      "recompiling it")
    p.add_argument("input", help="the .om file to read")
    p.add_argument("output", help="the .om file to write (may be the input)")
    p.add_argument("--add", action="append", metavar="FILE",
                   help="add the libraries packed in this .om file (say, the same model compiled with --cc for "
                        "another target) or kernel store file (repeatable)")
    p.add_argument("--replace", action="append", type=_replace_arg, metavar="NAME[@TARGET]=FILE",
                   help="replace the named libraries with those of FILE (repeatable)")
    p.add_argument("--remove", action="append", metavar="NAME[@TARGET]",
                   help="remove the named libraries, e.g. omrt-native@aarch64-linux-gnu (repeatable)")
    p.set_defaults(fn=cmd_repack)
    b = sub.add_parser("bench", help="time an ONNX model with omrt and ONNX Runtime side by side")
    b.add_argument("model", help="the .onnx file (compiled to a temporary .om)")
    b.add_argument("--threads", type=_thread_counts_arg, default=[1, 2], metavar="N,N...",
                   help="thread counts to measure at (default 1,2)")
    b.add_argument("--runs", type=int, default=50, help="timed runs per variant and thread count (default 50)")
    b.add_argument("--warmup", type=int, default=5, help="warm-up runs per variant (default 5)")
    b.add_argument("--shape", action="append", type=_shape_arg, metavar="NAME=D1xD2...",
                   help="fix an input's symbolic dims (repeatable)")
    b.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    b.add_argument("--json", metavar="FILE", help="write every figure here")
    b.set_defaults(fn=cmd_bench)
    v = sub.add_parser("serve", help="serve a .om model to processes on this host over a Unix socket "
                                     "(zero-copy with shared memory; see docs/serving.md)")
    v.add_argument("model", help="the .om file (the only model this server ever loads)")
    v.add_argument("--socket", required=True, metavar="PATH", help="the Unix socket to create (mode 0600)")
    v.add_argument("--workers", type=_count_arg, default=1, metavar="N",
                   help="worker threads, each with a session of its own (default 1)")
    v.add_argument("--queue", type=_count_arg, default=64, metavar="N",
                   help="requests that may wait; beyond them clients are answered busy at once (default 64)")
    v.add_argument("--batch-window", type=_milliseconds_arg, default=0.0, metavar="MS",
                   help="run requests that arrive within MS milliseconds as one batch along the model's free "
                        "first dim (default 0: off)")
    v.add_argument("--max-batch", type=_count_arg, default=8, metavar="N",
                   help="the most rows of one batch (default 8)")
    _trust_args(v)
    v.add_argument("--threads", type=_threads_arg, default=1, metavar="N",
                   help="run omrt's kernels on N threads of its own (default 1; see omrt.set_num_threads)")
    v.set_defaults(fn=cmd_serve)
    d = sub.add_parser("demo", help="compile, run and check a real network shipped with onnx")
    d.add_argument("--model", default="squeezenet",
                   choices=["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                            "shufflenet", "squeezenet", "vgg19", "zfnet512"])
    d.add_argument("--repeat", type=int, default=50)
    d.add_argument("--threads", type=_threads_arg, default=1, metavar="N",
                   help="run omrt's kernels on N threads of its own (default 1)")
    d.set_defaults(fn=cmd_demo)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except (OmrtError, OSError) as e:
        print(f"omrt: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
