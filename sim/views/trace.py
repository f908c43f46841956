"""Traces: one row per executed op, the common output of the DES, the analytic engine and the
real GPU executor; Chrome-trace export and overlap metrics.

Schema (:data:`TRACE_COLUMNS`, dtypes in :data:`TRACE_DTYPES`):

========  =====================================================================
op_id     op id in the plan (int)
name      op name, usually the GGUF tensor or split (``blk.3.ffn_up_exps.weight``)
kind      :class:`sim.plan.OpKind` value (``"h2d"``, ``"moe"``, ...)
stream    :class:`sim.plan.Stream` value (``"host"``, ``"compute"``, ``"copy"``, ``"cpu"``)
device    GPU index, -1 for host/CPU (int)
queue     queue name as in ``PlanArrays.queue_names``: ``f"{stream}{device}"`` for GPU
          streams (``"compute0"``, ``"copy1"``); ``"host"`` and ``"cpu"`` for the host
          thread and the CPU backend whatever the op's device (see ``Op.queue``)
layer     block index, -1 outside blocks (int)
split     split index within the graph (int)
graph     graph (ubatch) index within the test (int)
slot      staging slot, -1 for none (int)
tag       free-form role (``"prefetch"``, ``"selective"``, ...)
nbytes    bytes moved or weight bytes read (int)
start_s   start, seconds from the start of the run (float)
end_s     end, seconds (float)
dur_s     ``end_s - start_s`` (float)
engine    ``"analytic"``, ``"des"`` or ``"executor"``
test      llama-bench style test name (``"pp512"``)
variant   prefetch variant label
========  =====================================================================
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from sim.plan import COMPUTE_CODES, COMPUTE_KINDS, KIND_CODE, KINDS, STREAM_CODE, STREAMS, OpKind, Plan, Schedule, Stream

#: the exact columns of a trace, in order
TRACE_COLUMNS: tuple[str, ...] = (
    "op_id", "name", "kind", "stream", "device", "queue", "layer", "split", "graph", "slot",
    "tag", "nbytes", "start_s", "end_s", "dur_s", "engine", "test", "variant",
)

_INT_COLS = ("op_id", "device", "layer", "split", "graph", "slot", "nbytes")
_FLOAT_COLS = ("start_s", "end_s", "dur_s")
_STR_COLS = ("name", "kind", "stream", "queue", "tag", "engine", "test", "variant")

#: dtype of each column: ``"int64"``, ``"float64"`` or ``"object"`` (Python str)
TRACE_DTYPES: dict[str, str] = {
    **{c: "int64" for c in _INT_COLS},
    **{c: "float64" for c in _FLOAT_COLS},
    **{c: "object" for c in _STR_COLS},
}

_RUN_KEYS = ["engine", "test", "variant"]
_H2D = OpKind.H2D.value
_COMPUTE_KIND_VALUES = frozenset(k.value for k in COMPUTE_KINDS)


def to_dataframe(plan: Plan, schedule: Schedule, *, test: str = "", variant: str = "",
                 scenario: int | None = None) -> pd.DataFrame:
    """One row per op of ``plan`` with its times from ``schedule``.

    Args:
        plan: the plan that was scheduled.
        schedule: its schedule; (n,) arrays, or (S, n) with ``scenario`` picking the row.
        test: test name written to every row (``"pp512"``).
        variant: variant label written to every row.
        scenario: row of a batch schedule to use (required when it is 2-D).

    Returns:
        DataFrame with exactly :data:`TRACE_COLUMNS`, dtypes :data:`TRACE_DTYPES`.

    Raises:
        ValueError: schedule shape does not match the plan, or a batch without ``scenario``.
    """
    start = np.asarray(schedule.start_s, dtype=np.float64)
    end = np.asarray(schedule.end_s, dtype=np.float64)
    if start.ndim == 2:
        if scenario is None:
            raise ValueError(f"schedule: batch of {start.shape[0]} scenarios; pass scenario= to pick one")
        start, end = start[scenario], end[scenario]
    n = len(plan)
    if start.shape != (n,) or end.shape != (n,):
        raise ValueError(f"schedule: shape {start.shape} does not match a plan of {n} ops")
    a = plan.arrays
    qnames = a.queue_names
    kind_values = [k.value for k in KINDS]
    stream_values = [st.value for st in STREAMS]

    def ints(col) -> np.ndarray:
        return np.array(col, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)

    cols = {
        "op_id": np.arange(n, dtype=np.int64),
        "name": list(plan.names),
        "kind": [kind_values[k] for k in plan.kinds],
        "stream": [stream_values[st] for st in plan.streams],
        "device": ints(plan.devices),
        "queue": [qnames[q] for q in a.queue.tolist()],
        "layer": ints(plan.layers),
        "split": ints(plan.splits),
        "graph": ints(plan.graphs),
        "slot": ints(plan.slots),
        "tag": list(plan.tags),
        "nbytes": ints(plan.nbytes),
        "start_s": start,
        "end_s": end,
        "dur_s": end - start,
        "engine": [schedule.engine] * n,
        "test": [test] * n,
        "variant": [variant] * n,
    }
    df = pd.DataFrame(cols, columns=list(TRACE_COLUMNS))
    for c in _STR_COLS:
        df[c] = df[c].astype(object)
    return df


def validate_trace(df: pd.DataFrame) -> None:
    """Check that ``df`` has the trace schema.

    Checks: exactly :data:`TRACE_COLUMNS` in that order; integer columns hold integers,
    time columns floats, text columns strings; times are finite and ``end_s >= start_s``.

    Raises:
        ValueError: naming the first problem found.
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"trace: expected a pandas DataFrame, got {type(df).__name__}")
    cols = tuple(df.columns)
    if cols != TRACE_COLUMNS:
        missing = [c for c in TRACE_COLUMNS if c not in cols]
        extra = [c for c in cols if c not in TRACE_COLUMNS]
        raise ValueError(f"trace: wrong columns (missing {missing}, unexpected {extra}); "
                         f"expected exactly {list(TRACE_COLUMNS)} in that order")
    for c in _INT_COLS:
        if not pd.api.types.is_integer_dtype(df[c]):
            raise ValueError(f"trace: column {c!r} must be integer, got {df[c].dtype}")
    for c in _FLOAT_COLS:
        if not pd.api.types.is_float_dtype(df[c]):
            raise ValueError(f"trace: column {c!r} must be float seconds, got {df[c].dtype}")
    for c in _STR_COLS:
        s = df[c]
        if not (pd.api.types.is_string_dtype(s) or s.dtype == object) or not s.map(type).eq(str).all():
            raise ValueError(f"trace: column {c!r} must hold strings")
    start = df["start_s"].to_numpy()
    end = df["end_s"].to_numpy()
    if not (np.isfinite(start).all() and np.isfinite(end).all()):
        raise ValueError("trace: start_s/end_s must be finite")
    bad = np.flatnonzero(end < start)
    if bad.size:
        raise ValueError(f"trace: op_id {int(df['op_id'].iloc[bad[0]])} ends before it starts")


def to_chrome_trace(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a trace as Chrome trace-event JSON (chrome://tracing, https://ui.perfetto.dev).

    One complete event (``"ph": "X"``) per op with ``ts``/``dur`` in microseconds. Processes:
    ``"host"`` for host-thread and CPU-backend ops, ``"gpu<d>"`` for GPU streams; threads are
    the queue names. Integer pids/tids are used, named by ``"M"`` metadata events
    (``process_name``, ``thread_name``). When ``df`` holds several runs (engine, test,
    variant), each gets its own processes, named ``"gpu0 [engine variant test]"``.
    ``args`` carry op_id, kind, bytes, layer, split, graph, slot and tag.

    The file is written to a temporary file in the same directory and moved into place with
    :func:`os.replace`, so ``path`` is either the old file or the complete new one.

    Args:
        df: a trace (see :func:`validate_trace`).
        path: output file.

    Returns:
        the path written.

    Raises:
        ValueError: ``df`` is not a valid trace.
        OSError: the file cannot be written (no partial file is left behind).
    """
    validate_trace(df)
    path = Path(path)
    multi = len(df[_RUN_KEYS].drop_duplicates()) > 1
    host_like = {Stream.HOST.value, Stream.CPU.value}
    proc_names = ["host" if st in host_like else f"gpu{dev}"
                  for st, dev in zip(df["stream"].tolist(), df["device"].tolist())]
    if multi:
        proc_names = [f"{p} [{e} {v} {t}]" for p, e, v, t in
                      zip(proc_names, df["engine"].tolist(), df["variant"].tolist(), df["test"].tolist())]
    pid_of = {p: k for k, p in enumerate(sorted(set(proc_names)))}
    threads = sorted(set(zip(proc_names, df["queue"].tolist())))
    tid_of = {pq: k for k, pq in enumerate(threads)}
    events: list[dict] = []
    for pname, pid in pid_of.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}})
    for (pname, qname), tid in tid_of.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid_of[pname], "tid": tid, "args": {"name": qname}})
    pids = [pid_of[p] for p in proc_names]
    tids = [tid_of[pq] for pq in zip(proc_names, df["queue"].tolist())]
    ts_us = (df["start_s"].to_numpy() * 1e6).tolist()
    dur_us = (df["dur_s"].to_numpy() * 1e6).tolist()
    recs = df[["op_id", "name", "kind", "nbytes", "layer", "split", "graph", "slot", "tag"]].itertuples(
        index=False, name=None)
    for k, (op_id, name, kind, nbytes, layer, split, graph, slot, tag) in enumerate(recs):
        events.append({
            "ph": "X", "name": name, "cat": kind, "ts": ts_us[k], "dur": dur_us[k],
            "pid": pids[k], "tid": tids[k],
            "args": {"op_id": int(op_id), "kind": kind, "bytes": int(nbytes), "layer": int(layer),
                     "split": int(split), "graph": int(graph), "slot": int(slot), "tag": tag},
        })
    doc = {"traceEvents": events, "displayTimeUnit": "ms"}
    from sim.atomic import write_atomic

    return write_atomic(path, json.dumps(doc))


# --------------------------------------------------------------------------------------
# Overlap metrics (interval arithmetic)
# --------------------------------------------------------------------------------------


def _covered_s(a_start, a_end, b_start, b_end) -> tuple[float, float]:
    """Measure of ∪A and of (∪A) ∩ (∪B) for two sets of closed intervals (seconds).

    Sweep line, vectorised: +1/-1 at each interval's start/end per set, cumulative counts
    give coverage on each elementary segment between consecutive boundaries.
    """
    a_start = np.asarray(a_start, dtype=np.float64)
    b_start = np.asarray(b_start, dtype=np.float64)
    pts = np.concatenate([a_start, np.asarray(a_end, dtype=np.float64), b_start, np.asarray(b_end, dtype=np.float64)])
    if pts.size == 0:
        return 0.0, 0.0
    na, nb = a_start.size, b_start.size
    da = np.concatenate([np.ones(na), -np.ones(na), np.zeros(2 * nb)])
    db = np.concatenate([np.zeros(2 * na), np.ones(nb), -np.ones(nb)])
    order = np.argsort(pts, kind="stable")
    pts = pts[order]
    ca = np.cumsum(da[order])[:-1]
    cb = np.cumsum(db[order])[:-1]
    seg = np.diff(pts)
    in_a = ca > 0
    return float(seg[in_a].sum()), float(seg[in_a & (cb > 0)].sum())


def _single_run(df: pd.DataFrame, what: str) -> None:
    validate_trace(df)
    if len(df) and len(df[_RUN_KEYS].drop_duplicates()) > 1:
        raise ValueError(f"{what}: trace holds several runs (engine, test, variant); "
                         f"use df.groupby({_RUN_KEYS}).apply({what})")


def transfer_groups(kind, stream, device) -> list[tuple[np.ndarray, np.ndarray]]:
    """The op sets the overlap metrics compare, per GPU with H2D ops (ascending device).

    Args:
        kind: (n,) :class:`sim.plan.OpKind` values (strings) of the ops.
        stream: (n,) :class:`sim.plan.Stream` values.
        device: (n,) device indices.

    Returns:
        ``[(h2d_ids, compute_ids), ...]``: int arrays of op positions; ``h2d_ids`` are the
        device's H2D ops (any stream), ``compute_ids`` the compute ops that hide them (on
        its compute stream or on the CPU backend). See :func:`exposed_transfer_s`.
    """
    kind = np.asarray(kind, dtype=object)
    stream = np.asarray(stream, dtype=object)
    device = np.asarray(device)
    is_h2d = kind == _H2D
    is_comp = np.isin(kind, list(_COMPUTE_KIND_VALUES))
    cpu_comp = is_comp & (stream == Stream.CPU.value)
    out = []
    for dev in np.unique(device[is_h2d]):
        a = is_h2d & (device == dev)
        b = cpu_comp | (is_comp & (stream == Stream.COMPUTE.value) & (device == dev))
        out.append((np.flatnonzero(a), np.flatnonzero(b)))
    return out


def plan_transfer_groups(plan: Plan) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`transfer_groups` of a plan's ops, from its kind, stream and device columns (no
    DataFrame, no per-op Python loop); computed once per plan (:meth:`sim.plan.Plan.derived`)."""
    return plan.derived(_GROUPS_KEY, _build_transfer_groups)


def _build_transfer_groups(plan: Plan) -> list[tuple[np.ndarray, np.ndarray]]:
    a = plan.arrays
    kind, stream, device = a.kind, a.stream, a.device
    is_h2d = kind == KIND_CODE[OpKind.H2D]
    is_comp = np.zeros(kind.shape, dtype=bool)
    for c in COMPUTE_CODES:   # np.isin(kind, COMPUTE_CODES), one comparison per code
        is_comp |= kind == c
    cpu_comp = is_comp & (stream == STREAM_CODE[Stream.CPU])
    gpu_comp = is_comp & (stream == STREAM_CODE[Stream.COMPUTE])
    out = []
    for dev in np.unique(device[is_h2d]):
        out.append((np.flatnonzero(is_h2d & (device == dev)), np.flatnonzero(cpu_comp | (gpu_comp & (device == dev)))))
    return out


_GROUPS_KEY = "_trace_transfer_groups"


def h2d_busy_hidden_s(groups, start_s, end_s) -> tuple[float, float]:
    """``(H2D busy seconds, of which hidden behind compute)``, summed over the GPUs of
    ``groups`` (:func:`transfer_groups`), for one run's (n,) start and end times (seconds)."""
    total = hidden = 0.0
    for a, b in groups:
        t, h = _covered_s(start_s[a], end_s[a], start_s[b], end_s[b])
        total += t
        hidden += h
    return total, hidden


def _boundary_sort(first: np.ndarray, na: int, nb: int) -> tuple:
    """``(order, in_a, both, desc)`` of one run's boundaries ``first`` (A's starts and ends, then
    B's): their stable sort, which segments between consecutive sorted boundaries lie in ∪A and
    in (∪A) ∩ (∪B), and where consecutive positions of the order go down (a tie there would
    break the stable order)."""
    order = np.argsort(first, kind="stable")
    da = np.concatenate([np.ones(na), -np.ones(na), np.zeros(2 * nb)])
    db = np.concatenate([np.zeros(2 * na), np.ones(nb), -np.ones(nb)])
    in_a = np.cumsum(da[order])[:-1] > 0
    both = in_a & (np.cumsum(db[order])[:-1] > 0)
    return order, in_a, both, order[1:] < order[:-1]


def _sorted_segments(pts: np.ndarray, got: tuple) -> tuple[np.ndarray, np.ndarray]:
    """``(segment lengths (S, k-1), which runs the permutation sorts stably (S,))`` of ``pts``
    (S, k) under :func:`_boundary_sort`'s ``got``. Finite times: ``seg < 0`` iff the later
    boundary is smaller, ``seg == 0`` iff equal (IEEE subtraction is exact at 0)."""
    order, _in_a, _both, desc = got
    seg = np.diff(pts[:, order], axis=1)
    return seg, ~((seg < 0) | ((seg == 0) & desc)).any(axis=1)


def _covered_rows(a_start, a_end, b_start, b_end, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_covered_s` of S runs at once (each argument (S, k) seconds): ``(measure of ∪A,
    of (∪A) ∩ (∪B))``, (S,) each, every row to the bit of :func:`_covered_s` on it.

    A permutation of a run's boundaries that sorts them with equal values in their original
    order is that run's stable sort, hence gives the same coverage counts and segments. The
    permutation tried on every run is the one kept in ``memo`` (from an earlier call on the
    same ops) or else the stable sort of the first run's boundaries; the segment lengths of
    the runs it sorts are then summed together (one row-wise pairwise sum of the same elements
    in the same order, as ``ndarray.sum`` of each row). A kept permutation that fails a run is
    dropped and the first run's sort tried; any run that fails that too is measured on its own.

    Args:
        memo: a dict for this (A, B) pair of op sets, kept by the caller across calls (the
            permutation, its coverage masks), or None.
    """
    pts = np.ascontiguousarray(np.concatenate((a_start, a_end, b_start, b_end), axis=1))
    s_count, size = pts.shape
    tot = np.zeros(s_count)
    hid = np.zeros(s_count)
    if size == 0 or s_count == 0:
        return tot, hid
    na, nb = a_start.shape[1], b_start.shape[1]
    kept = memo.get("order") if memo is not None else None
    got = kept if kept is not None and kept[0].size == size else _boundary_sort(pts[0], na, nb)
    seg, good = _sorted_segments(pts, got)
    if not good[0] and got is kept:  # the kept permutation fails the first run: its own sort
        got = _boundary_sort(pts[0], na, nb)
        seg, good = _sorted_segments(pts, got)
    if memo is not None:
        memo["order"] = got
    _order, in_a, both, _desc = got
    if good.all():
        # C order: each row is reduced on its own, pairwise, as a 1-D array's sum
        return (np.ascontiguousarray(seg[:, in_a]).sum(axis=1),
                np.ascontiguousarray(seg[:, both]).sum(axis=1))
    for k in range(s_count):
        if good[k]:
            tot[k], hid[k] = seg[k][in_a].sum(), seg[k][both].sum()
        else:
            tot[k], hid[k] = _covered_s(a_start[k], a_end[k], b_start[k], b_end[k])
    return tot, hid


def h2d_busy_hidden_rows(groups, start_s, end_s, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`h2d_busy_hidden_s` of S runs of one plan at once.

    Args:
        groups: :func:`transfer_groups` of the plan (n ops).
        start_s, end_s: (S, n) start and end times, seconds (any memory layout).
        memo: a dict kept by the caller across calls on the same plan (what
            :func:`_covered_rows` keeps per GPU), or None.

    Returns:
        ``(H2D busy seconds, of which hidden)``, (S,) float64 each; row ``k`` equals
        ``h2d_busy_hidden_s(groups, start_s[k], end_s[k])`` to the bit.
    """
    start_s = np.asarray(start_s, dtype=np.float64)
    end_s = np.asarray(end_s, dtype=np.float64)
    total = np.zeros(start_s.shape[0])
    hidden = np.zeros(start_s.shape[0])
    for g, (a, b) in enumerate(groups):
        t, h = _covered_rows(start_s[:, a], end_s[:, a], start_s[:, b], end_s[:, b],
                             None if memo is None else memo.setdefault(g, {}))
        total += t
        hidden += h
    return total, hidden


def _h2d_and_hidden_s(df: pd.DataFrame) -> tuple[float, float]:
    groups = transfer_groups(df["kind"].to_numpy(), df["stream"].to_numpy(), df["device"].to_numpy())
    return h2d_busy_hidden_s(groups, df["start_s"].to_numpy(), df["end_s"].to_numpy())


def exposed_from_busy(total_s: float, hidden_s: float) -> float:
    """:func:`exposed_transfer_s` from the H2D busy and hidden seconds."""
    return max(total_s - hidden_s, 0.0)


def overlap_from_busy(total_s: float, hidden_s: float) -> float:
    """:func:`overlap_fraction` from the H2D busy and hidden seconds (NaN without H2D time)."""
    if total_s <= 0.0:
        return float("nan")
    return min(hidden_s / total_s, 1.0)


def exposed_transfer_s(df: pd.DataFrame) -> float:
    """Copy time not hidden behind compute, seconds.

    Per GPU ``d``: the measure of the set of instants at which at least one H2D op of device
    ``d`` runs (any stream: copy stream, compute stream or a pageable copy on the host) and
    no compute op (kind in :data:`sim.plan.COMPUTE_KINDS`) runs on ``d``'s compute stream or
    on the CPU backend. Summed over GPUs. Equal to the H2D busy time (union of H2D
    intervals) when nothing overlaps, 0 when every copy is hidden. Host ops, syncs and
    D2H are not compute: time spent in them while a copy runs is exposed.

    Args:
        df: a trace of one run (one engine, test and variant).

    Raises:
        ValueError: not a valid trace, or several runs mixed.
    """
    _single_run(df, "exposed_transfer_s")
    return exposed_from_busy(*_h2d_and_hidden_s(df))


def overlap_fraction(df: pd.DataFrame) -> float:
    """Share of H2D time overlapped by compute, in [0, 1].

    ``1 - exposed_transfer_s(df) / H2D busy time``, where the H2D busy time of a GPU is the
    measure of the union of its H2D intervals, summed over GPUs (see
    :func:`exposed_transfer_s`). NaN when the trace has no H2D time (the share is undefined).

    Raises:
        ValueError: not a valid trace, or several runs mixed.
    """
    _single_run(df, "overlap_fraction")
    return overlap_from_busy(*_h2d_and_hidden_s(df))
