"""Read the ``split-time`` patch's lines (:data:`calibrate.llamacpp.patches.SPLIT_TIME`) and
measure from them what llama.cpp's CPU backend costs inside a llama-bench graph.

``python -m calibrate.llamacpp.splittime RUN_DIR`` prints, per invocation of a split-timing lease
(``calibrate/llamacpp/grids/h200-splits.toml``; stderr logs ``logs/<id>.log``, or ``st/<id>.err.gz``), the median per
graph of: the CPU splits' compute, the GPU splits' input copies and drains, the host gap
between graphs, and the one-thread ops (the token embedding's ``GET_ROWS``, a CPU layer's KV
``SET_ROWS``), with the rates the profile takes from them (:func:`rows_rates`).

Definitions (one line per graph compute; per split ``id:backend:n_inputs:input_bytes:drain_us:
copy_us:compute_us``, see the patch):

* **token embedding**: split 0 of a llama.cpp graph is the CPU split holding only the
  ``GET_ROWS`` of ``token_embd`` (llama.cpp keeps it on the CPU): its compute time, against the
  ubatch's ``n_tokens · d_model`` f32 values written, is the one-thread GET_ROWS rate;
* **KV store**: with ``-ngl`` below the layer count, at an offloaded batch, each layer left on
  the CPU has a CPU split whose two inputs are the new K and V (f32, from the GPU) and whose
  compute is their two ``SET_ROWS`` into the layer's CPU KV cache: its compute time against its
  input bytes is the one-thread SET_ROWS rate.

Units: microseconds in the log; seconds and bytes/s in what this module returns.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import PrefetchSimError
from sim.wording import plural

TAG = "prefetch-sim split-time:"
#: a graph's KV-store splits are one per layer left on the CPU: fewer than this are not counted
MIN_KV_STORE_SPLITS = 4


@dataclass(frozen=True)
class SplitRecord:
    """One split of one graph compute (``ggml_backend_sched_compute_splits``).

    Attributes:
        id: split index in the graph.
        backend: ggml backend name (``CPU``, ``CUDA0``...).
        n_inputs: inputs the scheduler copied to the split's backend.
        input_bytes: their ``ggml_nbytes`` (a MoE weight counted whole, though only the used
            experts are copied).
        drain_s, copy_s, compute_s: wait for queued work, input copies, compute call (s).
    """

    id: int
    backend: str
    n_inputs: int
    input_bytes: int
    drain_s: float
    copy_s: float
    compute_s: float


@dataclass(frozen=True)
class GraphRecord:
    """One graph compute: ``graph`` index in the process, ``ne1`` (tokens of the ubatch),
    ``gap_s`` (host time since the previous graph compute ended; NaN for the first),
    ``total_s`` (the compute call) and its splits."""

    graph: int
    ne1: int
    gap_s: float
    total_s: float
    splits: tuple[SplitRecord, ...]


def parse_split_time(text: str, name: str = "log") -> list[GraphRecord]:
    """The ``prefetch-sim split-time:`` lines of a stderr log (other lines are ignored).

    Raises:
        ValueError: a malformed split-time line, naming ``name`` and the line number.
    """
    out = []
    for no, ln in enumerate(text.splitlines(), 1):
        if TAG not in ln:
            continue
        try:
            head, sep, body = ln.split(TAG, 1)[1].strip().partition(" splits=")
            if not sep:
                raise ValueError("no splits= field")
            kv = dict(tok.split("=", 1) for tok in head.split())
            splits = []
            for s in body.split(","):
                i, b, ni, nb, dr, cp, co = s.split(":")
                splits.append(SplitRecord(int(i), b, int(ni), int(nb), int(dr) * 1e-6, int(cp) * 1e-6, int(co) * 1e-6))
            gap = int(kv["gap_us"])
            out.append(GraphRecord(int(kv["graph"]), int(kv["ne1"]), float("nan") if gap < 0 else gap * 1e-6,
                                   int(kv["total_us"]) * 1e-6, tuple(splits)))
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{name}:{no}: malformed split-time line ({exc}): {ln[:120]!r}") from None
    return out


def read_log(path: str | Path) -> list[GraphRecord]:
    """:func:`parse_split_time` of a (gzipped or plain) stderr log file
    (:func:`calibrate.llamacpp.logs.read_text`)."""
    from .logs import read_text

    return parse_split_time(read_text(path), str(path))


def invocation_graphs(run_dir: str | Path, inv: dict, *, timed_only: bool = True) -> list[GraphRecord] | None:
    """The split-time records of one invocation of a run folder, or None when it has no log:
    ``st/<id>.err.gz`` (a rerun's stderr, as the first split-timing lease kept it), else its
    stderr log ``logs/<id>.log`` (:func:`calibrate.llamacpp.logs.read_run_log`: the file or its
    member of ``logs.tar.gz``). ``timed_only``: None for an invocation run without
    ``PREFETCH_SIM_SPLIT_TIME`` in its environment (its log has no timing lines).

    Raises:
        ValueError: a malformed split-time line (:func:`parse_split_time`).
    """
    from .logs import LOGS_ARCHIVE

    run = Path(run_dir)
    if timed_only and "PREFETCH_SIM_SPLIT_TIME" not in (inv.get("env") or {}):
        return None
    # the files the log may come from, as they are now: a tool that reads a folder's logs
    # several times (splittime's table, its rates, fit's full fill) parses each once
    cands = (run / "st" / f"{inv['id']}.err.gz", run / "logs" / f"{inv['id']}.log",
             run / "logs" / f"{inv['id']}.log.gz", run / LOGS_ARCHIVE)
    stamp = tuple((st.st_mtime_ns, st.st_size) if (st := _stat(c)) else None for c in cands)
    got = _parsed_graphs(str(run.resolve()), str(inv["id"]), stamp)
    return None if got is None else list(got)


def _stat(path: Path):
    try:
        return path.stat()
    except OSError:
        return None


@functools.lru_cache(maxsize=256)
def _parsed_graphs(run: str, inv_id: str, _stamp: tuple) -> tuple[GraphRecord, ...] | None:
    """:func:`invocation_graphs`' parse, cached on the folder, the id and the candidate files'
    modification times and sizes (``_stamp``: a rewritten log is read again)."""
    from .logs import read_run_log

    st = Path(run) / "st" / f"{inv_id}.err.gz"
    if st.is_file():
        return tuple(read_log(st))
    try:
        text = read_run_log(run, f"logs/{inv_id}.log")
    except FileNotFoundError:
        return None
    return tuple(parse_split_time(text, f"{Path(run).as_posix()}/logs/{inv_id}.log"))


def graph_table(graphs: list[GraphRecord]) -> pd.DataFrame:
    """One row per graph: tokens, splits, gap and total, and per backend class the sums of
    compute / drain / copy (seconds) and of input bytes; ``embd_s`` is split 0's compute when it
    is a CPU split without inputs (the token embedding)."""
    rows = []
    for g in graphs:
        cpu = [s for s in g.splits if s.backend.startswith("CPU") and s.n_inputs > 0]
        gpu = [s for s in g.splits if not s.backend.startswith("CPU")]
        s0 = g.splits[0] if g.splits else None
        rows.append(dict(graph=g.graph, n_tokens=g.ne1, n_splits=len(g.splits), gap_s=g.gap_s, total_s=g.total_s,
                         n_cpu=len(cpu), cpu_compute_s=sum(s.compute_s for s in cpu),
                         cpu_drain_s=sum(s.drain_s for s in cpu), cpu_copy_s=sum(s.copy_s for s in cpu),
                         gpu_drain_s=sum(s.drain_s for s in gpu), gpu_copy_s=sum(s.copy_s for s in gpu),
                         gpu_launch_s=sum(s.compute_s for s in gpu), gpu_input_bytes=sum(s.input_bytes for s in gpu),
                         embd_s=(s0.compute_s if s0 is not None and s0.backend.startswith("CPU") and s0.n_inputs == 0
                                 else float("nan"))))
    return pd.DataFrame(rows)


def kv_store_splits(graphs: list[GraphRecord], min_tokens: int = 32) -> pd.DataFrame:
    """The KV-store CPU splits (module docstring) of graphs of at least ``min_tokens`` tokens:
    ``n_tokens, input_bytes, compute_s`` per split. A CPU split with exactly two inputs holding
    ``n_tokens`` f32 rows each, in a graph with at least :data:`MIN_KV_STORE_SPLITS` of them (one
    per CPU layer; a lone such split is something else, e.g. the last layer's FFN on the output
    token)."""
    rows = []
    for g in graphs:
        if g.ne1 < min_tokens:
            continue
        hits = [s for s in g.splits
                if s.backend.startswith("CPU") and s.n_inputs == 2 and s.input_bytes % (8 * g.ne1) == 0]
        if len(hits) < MIN_KV_STORE_SPLITS:
            continue
        for s in hits:
            rows.append(dict(graph=g.graph, n_tokens=g.ne1, input_bytes=s.input_bytes, compute_s=s.compute_s))
    return pd.DataFrame(rows, columns=["graph", "n_tokens", "input_bytes", "compute_s"])


def _d_model(model_toml: str | Path) -> int:
    from sim.model.specs import load_model

    return load_model(model_toml).d_model


def rows_rates(run_dir: str | Path, min_tokens: int = 512) -> dict[str, tuple[float, str]]:
    """The one-thread GET_ROWS and SET_ROWS rates (bytes/s of f32) of a split-timing lease.

    GET_ROWS: the median over invocations with prompt graphs of ``n_tokens · d_model · 4 /
    embd_s`` (each invocation's median over its graphs of at least ``min_tokens`` tokens);
    SET_ROWS: the median over KV-store splits (:func:`kv_store_splits`) of ``input_bytes /
    compute_s``. Returns ``{key: (bytes/s, source)}`` for ``cpu_get_rows_gb_per_s`` and
    ``cpu_set_rows_gb_per_s`` (values in bytes/s).

    Raises:
        PrefetchSimError: the folder has no invocation record or no split-time line of either kind.
    """
    from .compare import read_invocations, resolve

    run = Path(run_dir)
    invs = read_invocations(run / "invocations.jsonl")
    get_r, set_r = [], []
    for inv in invs:
        graphs = invocation_graphs(run, inv)
        if not graphs:
            continue
        tab = graph_table(graphs)
        big = tab[(tab["n_tokens"] >= min_tokens) & tab["embd_s"].notna() & (tab["embd_s"] > 0)]
        if not big.empty:
            d = _d_model(resolve(inv["model_toml"], run, Path.cwd()))
            get_r.append(float(np.median(big["n_tokens"] * d * 4 / big["embd_s"])))
        kv = kv_store_splits(graphs, min_tokens)
        kv = kv[kv["compute_s"] > 0]
        set_r.extend((kv["input_bytes"] / kv["compute_s"]).tolist())
    if not get_r or not set_r:
        raise PrefetchSimError(f"{run}: split-time GET_ROWS in {plural(len(get_r), 'invocation')} and SET_ROWS in "
                               f"{plural(len(set_r), 'KV-store split')}, both needed (logs/<id>.log or st/<id>.err.gz of "
                               "invocations with PREFETCH_SIM_SPLIT_TIME)")
    src = f"measured: llama-bench with the split-time patch ({run.as_posix()}, calibrate.llamacpp.splittime)"
    return {"cpu_get_rows_gb_per_s": (float(np.median(get_r)),
                                      f"{src}: the token embedding's one-thread GET_ROWS (CPU split 0) of graphs "
                                      f">= {min_tokens} tokens, median of {plural(len(get_r), 'invocation')}"),
            "cpu_set_rows_gb_per_s": (float(np.median(set_r)),
                                      f"{src}: the one-thread SET_ROWS of the new K/V of -ngl CPU layers, median "
                                      f"of {len(set_r)} KV-store splits")}


def gpu_split_host(run_dir: str | Path, min_splits: int = 10) -> tuple[float, str]:
    """The host time of one split on a GPU backend (s) from a split-timing lease, and its source.

    The median, over every GPU split of every decode graph (one token) with at least
    ``min_splits`` splits, of the split's compute call (``compute_s``: ggml-cuda's graph compute
    of the split, i.e. launching its kernels or replaying its CUDA graph). At one token the GPU
    is idle when the host launches, so the call is host time only; in prompt graphs it may block
    on a full launch queue behind large kernels. The split's input copies are not in it (the
    simulator prices them as copies). On data/llamacpp/h200-20261201-splits: 13 us over 13,264
    splits (per invocation 12-15 us).

    Raises:
        PrefetchSimError: no invocation record, or no such split in the folder's logs.
    """
    from .compare import read_invocations

    run = Path(run_dir)
    vals: list[float] = []
    n_inv = 0
    for inv in read_invocations(run / "invocations.jsonl"):
        graphs = invocation_graphs(run, inv)
        if not graphs:
            continue
        got = [sp.compute_s for g in graphs if g.ne1 == 1 and len(g.splits) >= min_splits
               for sp in g.splits if not sp.backend.startswith("CPU")]
        n_inv += bool(got)
        vals.extend(got)
    if not vals:
        raise PrefetchSimError(f"{run}: no GPU split of a decode graph with >= {min_splits} splits in the split-time "
                               "logs (logs/<id>.log or st/<id>.err.gz of invocations with PREFETCH_SIM_SPLIT_TIME)")
    return float(np.median(vals)), (
        f"measured: llama-bench with the split-time patch ({run.as_posix()}, calibrate.llamacpp.splittime): the "
        f"compute call of a GPU split in decode graphs of >= {min_splits} splits (host time: the GPU idle), median "
        f"of {plural(len(vals), 'split')} in {plural(n_inv, 'invocation')}")


def summary(run_dir: str | Path) -> pd.DataFrame:
    """Per split-timed invocation and ubatch size, the median per graph of :func:`graph_table`'s
    columns (ms), skipping each invocation's first two graphs (llama-bench's warm-up)."""
    from .compare import read_invocations

    run = Path(run_dir)
    out = []
    for inv in read_invocations(run / "invocations.jsonl"):
        graphs = invocation_graphs(run, inv, timed_only=False)
        if not graphs:
            continue
        tab = graph_table(graphs)
        tab = tab[tab["graph"] >= 2]
        for n, g in tab.groupby("n_tokens"):
            med = g.drop(columns=["graph", "n_tokens"]).median()
            rec = {"invocation": inv["id"], "n_tokens": int(n), "graphs": len(g)}
            for k, v in med.items():
                rec[k[:-2] + "_ms" if k.endswith("_s") else k] = v * 1e3 if k.endswith("_s") else v
            out.append(rec)
    return pd.DataFrame(out)


def _cpu_parts(case, hardware) -> tuple[float, float, int]:
    """``(fixed, scaled, n_cpu_splits)`` of one decode case's CPU ops per graph (s): the time the
    profile gives the CPU-stream ops is ``fixed + scaled / cpu_rate_scale`` plus ``n_cpu_splits ·
    cpu_split_s``; read by pricing its plan at ``cpu_rate_scale`` 1 and 1/2 with no CPU split cost
    (the bandwidth term of :meth:`sim.model.ggmlcost.GgmlKernels.matmul_s` dominates at one token)."""
    from dataclasses import replace

    from sim.plan.builder import build_plan, make_context
    from sim.model.costs import plan_durations
    from sim.engines.metrics import fit_context_to_tests, rep_rng

    scn = fit_context_to_tests(case.scenario, list(case.tests))
    v, t = scn.variants[0], case.tests[0]
    plan = build_plan(scn, v, t, rep_rng(scn.seed, t, 0), make_context(scn, v, rep_rng(scn.seed, -1, -1)))
    graphs = len({o.graph for o in plan.ops})
    cpu = np.array([o.stream.name == "CPU" for o in plan.ops])
    n_split = sum(o.tag == "cpu_split_overhead" for o in plan.ops)
    tot = []
    for scale in (1.0, 0.5):
        hw = replace(hardware, ggml=replace(hardware.ggml, cpu_rate_scale=scale, cpu_split_s=0.0))
        tot.append(float(plan_durations(plan, hw)[cpu].sum()))
    scaled = tot[1] - tot[0]
    return (tot[0] - scaled) / graphs, scaled / graphs, round(n_split / graphs)


def cpu_decomposition(run_dir: str | Path, hardware=None) -> tuple[pd.DataFrame, float, float]:
    """The CPU splits' compute per decoded token of a split-timing lease split into a cost per
    CPU split and a throughput: least squares of ``measured = n_cpu_splits · a + fixed + scaled /
    s`` over the folder's split-timed decode invocations (``a`` bounded at 0: where the free fit
    gives a negative cost, ``a = 0`` and ``s`` the least squares of the rest), ``fixed`` and ``scaled`` from the
    profile's CPU tables (:func:`_cpu_parts`), ``measured`` the median compute of the CPU splits
    per one-token graph (:func:`summary`'s ``cpu_compute_ms``). ``a`` and ``s`` are this machine's
    ``cpu_split_us`` and ``cpu_rate_scale`` as the profile defines them; the table gives each
    invocation's measured, fitted and profile times (ms) and the fit's residual.

    Returns:
        ``(table, a in s, s)``.

    Raises:
        PrefetchSimError: an invocation whose CPU splits took no time in the log, times that no
            positive throughput fits, fewer than two split-timed decode invocations, or invocations whose
            ratio of CPU splits to CPU bytes is the same (``-ncmoe`` of one model: ``a`` and ``s``
            cannot be told apart), or no hardware profile with llama.cpp kernel tables.
    """
    from sim.model.specs import load_hardware

    from .compare import DEFAULT_HARDWARE, build_cases

    hw = load_hardware(DEFAULT_HARDWARE) if hardware is None else hardware
    if hw.ggml is None:
        raise PrefetchSimError(f"profile '{hw.name}' has no llama.cpp kernel tables (ggml): nothing to split")
    tab = summary(run_dir)
    if tab.empty:
        raise PrefetchSimError(f"{run_dir}: no split-time lines in any invocation's log")
    meas = tab[tab["n_tokens"] == 1].set_index("invocation")["cpu_compute_ms"]
    bench, owners, cases, _ = build_cases(run_dir, hw, repetitions=1)
    rows, done = [], set()
    for (_line, row), inv, case in zip(bench.iterrows(), owners, cases):
        iid = (inv or {}).get("id")
        if (case is None or case.scenario is None or iid is None or iid in done or iid not in meas.index
                or int(row["n_prompt"]) != 0 or int(row["n_gen"]) == 0):
            continue
        done.add(iid)
        fixed, scaled, n_split = _cpu_parts(case, hw)
        if n_split == 0:
            continue
        rows.append({"invocation": iid, "model": str(row["model_type"]).split()[0], "cpu_splits": n_split,
                     "fixed_ms": fixed * 1e3, "scaled_ms": scaled * 1e3, "measured_ms": float(meas[iid])})
    df = pd.DataFrame(rows)
    if len(df) < 2:
        raise PrefetchSimError(f"{run_dir}: {len(df)} split-timed decode invocation(s) with CPU splits; need two "
                               "of different models")
    ratio = df["cpu_splits"] / df["scaled_ms"]
    if float(ratio.max() / ratio.min()) < 1.05:
        raise PrefetchSimError(f"{run_dir}: every invocation has the same CPU splits per CPU byte (one model at "
                               "several -ncmoe?): the cost per split and the throughput cannot be told apart")
    bad = df[~(df["measured_ms"] > 0)]
    if len(bad):
        raise PrefetchSimError(f"{run_dir}: invocation {bad['invocation'].iloc[0]}: its decode graphs' CPU splits "
                               f"took {bad['measured_ms'].iloc[0]:g} ms per token in the log, where the model has "
                               f"{int(bad['cpu_splits'].iloc[0])} CPU splits (a log of another run, or edited?)")
    A = np.c_[df["cpu_splits"], df["scaled_ms"]]
    y = (df["measured_ms"] - df["fixed_ms"]).to_numpy()
    (a_ms, inv_s), *_ = np.linalg.lstsq(A, y, rcond=None)
    if a_ms < 0:  # least squares with the cost per split bounded at 0 (the 2-parameter NNLS's other branch)
        a_ms, inv_s = 0.0, float(A[:, 1] @ y / (A[:, 1] @ A[:, 1]))
    if not inv_s > 0:
        raise PrefetchSimError(f"{run_dir}: no throughput fits the invocations' CPU times (the least squares give "
                               f"1/s = {inv_s:.4g}): they do not follow n_cpu_splits * a + fixed + scaled / s, so no "
                               "figure is given")
    g = hw.ggml
    df["fitted_ms"] = A @ [a_ms, inv_s] + df["fixed_ms"]
    df["profile_ms"] = df["cpu_splits"] * g.cpu_split_host_s * 1e3 + df["fixed_ms"] + df["scaled_ms"] / g.cpu_rate_scale
    df["residual"] = df["fitted_ms"] / df["measured_ms"] - 1
    return df, a_ms * 1e-3, 1.0 / inv_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.splittime", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="split-timing lease folder (invocations.jsonl, logs/<id>.log or st/<id>.err.gz)")
    ap.add_argument("--cpu", action="store_true",
                    help="split the decode CPU splits' compute into a cost per CPU split and a throughput "
                         "(cpu_split_us, cpu_rate_scale) against the shipped profile's CPU tables")
    args = ap.parse_args(argv)
    try:
        from .compare import check_run_dir

        check_run_dir(args.run_dir, field="run_dir")
        if args.cpu:
            from sim.model.specs import load_hardware

            from .compare import DEFAULT_HARDWARE

            hw = load_hardware(DEFAULT_HARDWARE)
            df, a, scale = cpu_decomposition(args.run_dir, hw)
            with pd.option_context("display.width", 200, "display.max_columns", 30):
                print(df.round(3).to_string(index=False))
            g = hw.ggml
            print(f"this machine: cpu_split_us = {a * 1e6:.4g}, cpu_rate_scale = {scale:.4g}   (the profile: "
                  f"{g.cpu_split_host_s * 1e6:.4g}, {g.cpu_rate_scale:.4g}; least squares over "
                  f"{plural(len(df), 'invocation')}, "
                  f"residuals {df['residual'].min():+.1%}..{df['residual'].max():+.1%})")
            return 0
        tab = summary(args.run_dir)
        if tab.empty:
            raise PrefetchSimError(f"{args.run_dir}: no split-time lines in any invocation's log (logs/<id>.log, "
                                   "st/<id>.err.gz)")
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print(tab.round(2).to_string(index=False))
        try:
            rates = rows_rates(args.run_dir)
        except PrefetchSimError as exc:  # a decode-only lease: the table is the result
            print(f"splittime: note: the one-thread GET_ROWS / SET_ROWS rates need prompt graphs and -ngl CPU "
                  f"layers, not in this folder ({exc})", file=sys.stderr)
            rates = {}
        for k, (v, src) in rates.items():
            print(f"{k} = {v / 1e9:.4g}   ({src})")
        try:
            split_s, src = gpu_split_host(args.run_dir)
            print(f"split_us = {split_s * 1e6:.4g}   ({src})")
        except PrefetchSimError:
            pass
    except BrokenPipeError:
        raise   # a closed stdout: run_interruptible's quiet 141
    except (PrefetchSimError, OSError, ValueError) as exc:
        print(f"splittime: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("splittime", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
