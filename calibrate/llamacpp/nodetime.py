"""Read the ``node-time`` patch's lines (:data:`calibrate.llamacpp.patches.NODE_TIME`): what each
node of a CPU split costs inside a llama-bench graph.

``python -m calibrate.llamacpp.nodetime RUN_DIR`` prints, per invocation of a node-timing lease
(its logs ``logs/<id>.log``, or their members of ``logs.tar.gz``), one row per node kind of the
CPU graphs (op and tensor name without the layer suffix): nodes per graph, and the median, 10th
and 90th percentile of its time, with the graphs' node sum; ``--out CSV`` writes every node.

A line (one per CPU graph, i.e. per CPU split of a llama.cpp graph)::

    prefetch-sim node-time: threads 16 nodes 7 | MUL_MAT_ID ffn_moe_gate-0 212.4 | ADD_ID ffn_moe_gate_biased-0 9.8 | ...

Each node's time runs from the end of the previous node's barrier (for the first node: thread
0's start in the graph) to the end of its own, i.e. its work on the slowest thread plus the
barrier that closes it. Units: microseconds in the log and in the table.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

import pandas as pd

from sim.errors import PrefetchSimError

TAG = "prefetch-sim node-time:"
#: the patch lists at most this many nodes of a graph
MAX_LISTED = 4096
_HEAD = re.compile(r"threads (\d+) nodes (\d+)$")


@dataclass(frozen=True)
class Node:
    """One node of one CPU graph.

    Attributes:
        graph: index of its graph's line in the log (0-based, among node-time lines).
        pos: its position among the graph's computed nodes.
        op: ggml's op description (``MUL_MAT_ID``, ``ADD_ID``, ``GLU``...).
        name: the tensor's name (``ffn_moe_gate-0``).
        us: microseconds (see the module docstring).
        threads: the graph's thread count.
    """

    graph: int
    pos: int
    op: str
    name: str
    us: float
    threads: int


def parse(text: str) -> list[Node]:
    """The nodes of every ``prefetch-sim node-time:`` line of a stderr log (other lines ignored).

    Raises:
        ValueError: a malformed line (naming its line number): a header that is not ``threads N
            nodes M``, a node not ``OP NAME US``, a negative time, or fewer nodes listed than
            ``min(M, 4096)``.
    """
    out: list[Node] = []
    g = 0
    for n, ln in enumerate(text.splitlines(), 1):
        if TAG not in ln:
            continue
        parts = [p.strip() for p in ln.split(TAG, 1)[1].split("|")]
        m = _HEAD.match(parts[0])
        if m is None:
            raise ValueError(f"node-time line {n}: header {parts[0]!r} is not 'threads N nodes M'")
        threads, count = int(m.group(1)), int(m.group(2))
        nodes = parts[1:]
        if len(nodes) != min(count, MAX_LISTED):
            raise ValueError(f"node-time line {n}: {len(nodes)} nodes listed for nodes {count}")
        for pos, p in enumerate(nodes):
            f = p.split()
            if len(f) != 3:
                raise ValueError(f"node-time line {n}: node {pos} {p!r} is not 'OP NAME US'")
            try:
                us = float(f[2])
            except ValueError:
                raise ValueError(f"node-time line {n}: node {pos} time {f[2]!r} is not a number") from None
            if not us >= 0:
                raise ValueError(f"node-time line {n}: node {pos} time {us} is negative")
            out.append(Node(g, pos, f[0], f[1], us, threads))
        g += 1
    return out


def kind_of(name: str) -> str:
    """A node's name without its layer suffix (``ffn_moe_gate-17`` -> ``ffn_moe_gate``)."""
    return re.sub(r"-\d+$", "", name)


def frame(nodes: list[Node]) -> pd.DataFrame:
    """One row per node: graph, pos, op, name, kind (:func:`kind_of`), us, threads."""
    df = pd.DataFrame([n.__dict__ for n in nodes], columns=["graph", "pos", "op", "name", "us", "threads"])
    df["kind"] = df["name"].map(kind_of)
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per ``(op, kind)``: nodes per graph (mean), median / p10 / p90 microseconds, sorted by
    first position; plus a row ``(graph, sum)`` with the graphs' node sums."""
    n_graphs = df["graph"].nunique()
    rows = []
    for (op, kind), d in df.groupby(["op", "kind"], sort=False):
        rows.append({"op": op, "kind": kind, "per_graph": len(d) / n_graphs, "first_pos": d["pos"].min(),
                     "median_us": d["us"].median(), "p10_us": d["us"].quantile(0.1),
                     "p90_us": d["us"].quantile(0.9)})
    out = pd.DataFrame(rows).sort_values("first_pos").drop(columns="first_pos")
    tot = df.groupby("graph")["us"].sum()
    out.loc[len(out)] = {"op": "graph", "kind": "sum", "per_graph": 1.0, "median_us": tot.median(),
                         "p10_us": tot.quantile(0.1), "p90_us": tot.quantile(0.9)}
    return out.reset_index(drop=True)


def summary_markdown(table: pd.DataFrame) -> str:
    """:func:`summary`'s table as markdown (times to 0.1 µs)."""
    head = "| op | node | per graph | median µs | p10 µs | p90 µs |\n| --- | --- | ---: | ---: | ---: | ---: |"
    body = [f"| {r.op} | {r.kind} | {r.per_graph:.2f} | {r.median_us:.1f} | {r.p10_us:.1f} | {r.p90_us:.1f} |"
            for r in table.itertuples()]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    from .grid import read_log

    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.nodetime", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="node-timing lease folder (invocations.jsonl, logs/ or logs.tar.gz)")
    ap.add_argument("--out", metavar="CSV", help="write every node (invocation, graph, pos, op, name, kind, us, threads)")
    ap.add_argument("--graphs", type=int, default=0, metavar="N",
                    help="skip each invocation's first N CPU graphs (warm-up and the depth fill)")
    a = ap.parse_args(argv)
    from .compare import check_outputs_spare_inputs, check_run_dir, read_invocations

    run = check_run_dir(a.run_dir, field="run_dir")
    check_outputs_spare_inputs({"--out": a.out}, [run])   # before any work: never over the lease's files
    frames = []
    for inv in (rec.get("id") for rec in read_invocations(run / "invocations.jsonl")):
        if inv is None:
            continue
        try:
            text = read_log(run, f"logs/{inv}.log")
        except FileNotFoundError:
            continue
        try:
            nodes = parse(text)
        except ValueError as e:
            raise PrefetchSimError(f"{run}/logs/{inv}.log: {e}") from None
        if not nodes:
            continue
        df = frame(nodes)
        df = df[df["graph"] >= a.graphs]
        if df.empty:
            continue
        df.insert(0, "invocation", inv)
        frames.append(df)
        print(f"\n{inv}: {df['graph'].nunique()} CPU graphs, {int(df['threads'].median())} threads\n")
        print(summary_markdown(summary(df)))
    if not frames:
        raise PrefetchSimError(f"{run}: no node-time lines in any invocation's log")
    if a.out:
        from sim.atomic import write_atomic

        write_atomic(a.out, pd.concat(frames).to_csv(index=False))
    return 0


def _main_guarded(argv: list[str] | None = None) -> int:
    try:
        return main(argv)
    except PrefetchSimError as e:
        print(f"nodetime: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("nodetime", _main_guarded))  # Ctrl-C / SIGTERM: one line, 130 / 143; | head: 141
