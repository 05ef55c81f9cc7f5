"""What running a model's independent branches at once could gain on two threads, measured.

    python benchmarks/branches.py                                # inception_v1, inception_v2, squeezenet, resnet50
    python benchmarks/branches.py --models inception_v2 --rounds 20 --json out.json

An Inception block's branches, a Fire module's two expands and a ResNet block's projection beside
its first two Convs each read one value and meet at one node. omrt runs them one after the
other, every layer split over the threads. Run at once, one branch per thread, each branch would
take its one-thread time instead. This script finds every such group in a compiled model (for a
node that reads several nodes' outputs, the chains of nodes leading to each, every output read
only by the next, that start after one value they may all read and together fill the nodes
between their first and the join), profiles every node at 1 and at 2 threads (`Session.profile`
by node, the two counts alternating), and compares per group the time its nodes take now at 2
threads with the makespan of its branches at 1 thread each (longest first, onto the less loaded
thread). That makespan is a lower bound: two branches at once also share the caches and the
memory bus. The totals say what a runtime that ran every group at once, or only the groups that
gain, could save of a run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter, defaultdict

from compare import build
from figures import host, write_results

import omrt
from omrt import bench
from omrt.ir import Graph

MODELS = ("inception_v1", "inception_v2", "squeezenet", "resnet50")


def _produced_inputs(graph: Graph, producer: dict[str, int], i: int) -> list[str]:
    """The inputs of node i that a node of the graph writes (not weights, not graph inputs)."""
    return [v for v in dict.fromkeys(graph.nodes[i].inputs) if v in producer]


def _chain(graph: Graph, producer: dict[str, int], readers: Counter, last: int) -> list[int]:
    """The nodes that lead to node `last`, in order: back from it while a node's outputs are
    each read by one node only, through nodes that read one written value."""
    chain, p = [], last
    while all(readers[o] == 1 and o not in graph.outputs for o in graph.nodes[p].outputs if o):
        chain.insert(0, p)
        inputs = _produced_inputs(graph, producer, p)
        if len(inputs) != 1:
            break
        p = producer[inputs[0]]
    return chain


def fork_join_groups(graph: Graph) -> list[tuple[int, list[list[int]]]]:
    """(join node, its branches as lists of node indices) for every group of independent branches
    in `graph`, whose nodes are in execution order (see the module docstring)."""
    producer = {o: i for i, node in enumerate(graph.nodes) for o in node.outputs if o}
    readers = Counter(v for node in graph.nodes for v in set(node.inputs) if v)
    groups = []
    for join in range(len(graph.nodes)):
        chains = [c for v in _produced_inputs(graph, producer, join)
                  if (c := _chain(graph, producer, readers, producer[v]))]
        if len(chains) < 2:
            continue
        first = min(c[0] for c in chains)
        heads_read_before = all(producer[v] < first for c in chains for v in _produced_inputs(graph, producer, c[0]))
        if heads_read_before and sorted(i for c in chains for i in c) == list(range(first, join)):
            groups.append((join, chains))
    return groups


def node_times(session: omrt.Session, feeds: dict, rounds: int) -> dict[int, dict[str, float]]:
    """Median seconds per run of every node at 1 and at 2 threads, the two counts alternating."""
    seen: dict[int, defaultdict] = {1: defaultdict(list), 2: defaultdict(list)}
    for r in range(rounds):
        for threads in (1, 2) if r % 2 == 0 else (2, 1):
            with bench.omrt_threads(threads):
                session.run(feeds)
                for label, seconds in session.profile(feeds, repeat=5, by="node").items():
                    seen[threads][label].append(seconds)
    return {t: {label: statistics.median(v) for label, v in per.items()} for t, per in seen.items()}


def makespan(costs: list[float], threads: int) -> float:
    """The branches' costs placed longest first, each onto the least loaded thread: the end of the last."""
    loads = [0.0] * threads
    for cost in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += cost
    return max(loads)


def measure(src: str, om: str, rounds: int) -> dict:
    """Every group's figures in microseconds, and the model's totals."""
    omrt.compile(src, om, progress=None)
    model = bench.load_compiled(om)
    session = model.session()
    feeds = bench.random_inputs(model.inputs)
    times = node_times(session, feeds, rounds)
    graph = model.graph

    def cost(i: int, threads: int) -> float:
        return times[threads].get(graph.nodes[i].label, 0.0) * 1e6

    groups = []
    for join, chains in fork_join_groups(graph):
        now = sum(cost(i, 2) for c in chains for i in c)
        alone = [sum(cost(i, 1) for i in c) for c in chains]
        at_once = makespan(alone, 2)
        groups.append({"join": graph.nodes[join].label, "branch_nodes": [len(c) for c in chains],
                       "now_2t_us": now, "branches_1t_us": alone, "at_once_us": at_once, "gain_us": now - at_once})
    run = sum(times[2].values()) * 1e6
    every = sum(g["gain_us"] for g in groups)
    gaining = sum(max(g["gain_us"], 0.0) for g in groups)
    return {"groups": groups, "kernels_2t_us": run, "gain_every_group_us": every, "gain_gaining_groups_us": gaining,
            "share_every_group": every / run, "share_gaining_groups": gaining / run}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    ap.add_argument("--rounds", type=int, default=10, help="profiles per thread count, 5 runs each (default 10)")
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    args = ap.parse_args(argv)
    cpu = host()
    print(f"host: {cpu['cpu']}, {cpu['isa']}; node times in us, medians of {args.rounds} profiles of 5 runs")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rec = results[name] = measure(build(name, tmp), f"{tmp}/{name.rsplit('/', 1)[-1]}.om", args.rounds)
            print(f"\n{name}: {len(rec['groups'])} groups of independent branches; "
                  f"{rec['kernels_2t_us'] / 1e3:.2f} ms in kernels at 2 threads")
            print(f"  {'join':28s} {'nodes':>12s} {'now 2t':>8s} {'branches at 1t':>24s} {'at once':>8s} {'gain':>7s}")
            for g in rec["groups"]:
                alone = " ".join(f"{c:.0f}" for c in g["branches_1t_us"])
                print(f"  {g['join'][:28]:28s} {str(g['branch_nodes']):>12s} {g['now_2t_us']:8.0f} {alone:>24s} "
                      f"{g['at_once_us']:8.0f} {g['gain_us']:7.0f}")
            print(f"  every group at once: {rec['gain_every_group_us']:.0f} us ({100 * rec['share_every_group']:+.1f}% "
                  f"of the kernels' time); only the groups that gain: {rec['gain_gaining_groups_us']:.0f} us "
                  f"({100 * rec['share_gaining_groups']:+.1f}%)", flush=True)
    write_results(args.json, cpu, args.rounds, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
