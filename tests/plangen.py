"""Random valid plans for hypothesis tests, and small hand-built plans.

``plans()`` draws plans that respect the contract of :mod:`sim.plan`: ops on random queues of
one or two GPUs (host thread, CPU backend, compute and copy streams), kinds that fit the
stream, random backward dependencies, H2D ops on copy/compute streams and pageable H2D on the
host queue (all sharing their GPU's link).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from sim.plan import OpKind, Plan, Stream

_KINDS_BY_STREAM = {
    Stream.HOST: (OpKind.ISSUE, OpKind.HOST_SYNC, OpKind.EVENT_RECORD, OpKind.EVENT_WAIT, OpKind.HOST_WORK,
                  OpKind.H2D),
    Stream.CPU: (OpKind.CPU_MATVEC,),
    Stream.COMPUTE: (OpKind.GEMM, OpKind.MOE, OpKind.ATTN, OpKind.H2D, OpKind.D2H),
    Stream.COPY: (OpKind.H2D, OpKind.H2D, OpKind.D2H),
}


@st.composite
def plans(draw, max_ops: int = 40, max_deps: int = 4) -> Plan:
    """A random valid plan with 1..``max_ops`` ops on 1 or 2 GPUs."""
    n_dev = draw(st.integers(1, 2))
    n = draw(st.integers(1, max_ops))
    plan = Plan(label="random")
    for i in range(n):
        stream = draw(st.sampled_from(list(Stream)))
        kind = draw(st.sampled_from(_KINDS_BY_STREAM[stream]))
        if stream in (Stream.COMPUTE, Stream.COPY):
            device = draw(st.integers(0, n_dev - 1))
        elif kind is OpKind.H2D:  # pageable copy: blocks the host thread, uses the GPU's link
            device = draw(st.integers(0, n_dev - 1))
        else:
            device = -1
        deps = draw(st.lists(st.integers(0, i - 1), max_size=max_deps)) if i else []
        plan.add(kind, stream, device, f"op{i}", deps, nbytes=draw(st.integers(0, 1 << 20)),
                 layer=i // 6, split=i % 6, pinned=stream is not Stream.HOST)
    return plan


def durations_for(n: int, *, zeros: bool = False):
    """Strategy for (n,) durations in seconds: positive floats, a few exact zeros if asked."""
    pos = st.floats(1e-6, 1e-2, allow_nan=False, allow_infinity=False)
    elem = st.one_of(pos, st.just(0.0)) if zeros else pos
    return st.lists(elem, min_size=n, max_size=n).map(lambda x: np.asarray(x, dtype=np.float64))


@st.composite
def plans_with_durations(draw, max_ops: int = 40, zeros: bool = False):
    """(plan, durations) with durations (n,) float64 seconds."""
    plan = draw(plans(max_ops=max_ops))
    return plan, draw(durations_for(len(plan.ops), zeros=zeros))


def pipeline_plan(n_splits: int, slots: int, device: int = 0) -> tuple[Plan, list[int], list[int]]:
    """A copy/compute pipeline with ``slots`` staging buffers, as a plan.

    Split ``i`` copies its weights on the copy stream into slot ``i % slots`` (an H2D that
    waits for the free event: the compute of split ``i - slots``), and computes on the compute
    stream after the ready event (its copy). No host ops: the model of
    :func:`sim.engines.analytic.pipeline_recurrence`.

    Returns:
        (plan, copy op ids, compute op ids).
    """
    plan = Plan(label=f"pipeline slots={slots}")
    copies: list[int] = []
    computes: list[int] = []
    for i in range(n_splits):
        free = computes[i - slots] if i >= slots else None
        c = plan.add(OpKind.H2D, Stream.COPY, device, f"copy{i}", [free], split=i, slot=i % slots,
                     tag="prefetch")
        k = plan.add(OpKind.GEMM, Stream.COMPUTE, device, f"compute{i}", [c], split=i, slot=i % slots)
        copies.append(c)
        computes.append(k)
    return plan, copies, computes


def golden_plan() -> tuple[Plan, np.ndarray]:
    """The tiny hand-written plan of the golden-trace tests (GPU 0), with its durations.

    Host issues attention, issues a prefetch on the copy stream, syncs on the compute stream,
    does a pageable copy (host-blocking, on the link), waits on the prefetch's ready event,
    launches the FFN; the copy stream prefetches the next weights once the attention freed
    the buffer. Durations are binary fractions, so every time is exact in float64.
    """
    p = Plan(label="golden")
    H, C, K = Stream.HOST, Stream.COMPUTE, Stream.COPY
    o0 = p.add(OpKind.ISSUE, H, -1, "launch attn")                              # 1
    o1 = p.add(OpKind.ATTN, C, 0, "attn", [o0], layer=0)                          # 4
    o2 = p.add(OpKind.ISSUE, H, -1, "launch prefetch")                          # 1
    o3 = p.add(OpKind.H2D, K, 0, "prefetch w1", [o2], nbytes=3 << 20, slot=0, tag="prefetch")  # 3
    o4 = p.add(OpKind.HOST_SYNC, H, -1, "sync compute", [o1])                   # 0.5
    o5 = p.add(OpKind.H2D, H, 0, "pageable copy w2", nbytes=2 << 20, pinned=False, tag="selective")  # 2
    o6 = p.add(OpKind.EVENT_WAIT, H, -1, "wait ready")                          # 0.25
    o7 = p.add(OpKind.ISSUE, H, -1, "launch ffn")                               # 1
    p.add(OpKind.GEMM, C, 0, "ffn", [o7, o6, o3, o5], layer=0, slot=0)          # 2
    p.add(OpKind.H2D, K, 0, "prefetch w3", [o1, o2], nbytes=3 << 20, slot=1, tag="prefetch")  # 3
    dur = np.array([1.0, 4.0, 1.0, 3.0, 0.5, 2.0, 0.25, 1.0, 2.0, 3.0])
    return p, dur
