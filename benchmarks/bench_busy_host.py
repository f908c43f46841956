"""The executor's launch cost with and without CPU matvecs between launches, and its matvec in a
decode-shaped loop: the diagnostic behind the busy-host costs of ``calibrate.executor_costs``.

Part 1, per launch kind: 40 × (launch, op, host sync) — as ``calibrate.executor_costs`` — alone
and with an 8 MiB CPU matvec (cold window) before every launch; ``launch_us`` is the makespan
minus the CPU ops' measured host time minus the simulated ops at zero launch cost, per launch.
Part 2: 32 decode-shaped layers (GEMM, attention, GEMM, D2H launched back to back, host sync,
three CPU matvecs of S bytes, H2D) for S = 1…70 MiB: median host time of the first and the other
matvecs of a layer, median GPU-op durations, and makespan vs the prediction from the profile.

    PYTHONPATH=. python benchmarks/bench_busy_host.py TAG     # on a GPU; TAG names $OUT/diag_TAG.json
    PYTHONPATH=. python benchmarks/bench_busy_host.py fake    # the numpy stand-in (numbers mean nothing)

Its outputs on the lent H200 (default threads and ``OPENBLAS_NUM_THREADS=8``) are in
``data/validation/history/diag/``.
"""
import os, sys, json
import numpy as np
sys.path.insert(0, ".")
from dataclasses import replace
from sim.plan import OpKind, Plan, Stream
from sim.model.specs import load_hardware
from sim.model.costs import plan_durations
from sim.engines import analytic
from calibrate.executor import execute
from calibrate import executor_costs as EC

tag = sys.argv[1]
CP = None
if tag == "fake":
    import calibrate._fakecupy as CP
hw = load_hardware("scenarios/hardware/h200.toml")
base = replace(hw, executor_mode=True, executor_op_issue_s=1e-12, executor_issue_s_by_kind={},
               attn_table=None if hw.attn_table is None else hw.attn_table.drop(columns=["t_host_s"], errors="ignore"))
K = 2048
def cpu_shape(nb):
    return (1, nb // 4 // K, K, 1)

def lock(kind, n=40, cpu_bytes=0):
    op_kind, shape, nbytes = EC.PROBES[kind]
    plan = Plan(label=f"probe {kind}")
    prev = None
    for i in range(n):
        if cpu_bytes:
            prev = plan.add(OpKind.CPU_MATVEC, Stream.CPU, -1, "cpu.w", (prev,) if prev is not None else (),
                            nbytes=cpu_bytes, shape=cpu_shape(cpu_bytes))
        iss = plan.add(OpKind.ISSUE, Stream.HOST, -1, f"issue {kind}{i}", (prev,) if prev is not None else (), tag=op_kind.value,
                       shape=shape if op_kind is OpKind.ATTN else (), split=i)
        op = plan.add(op_kind, Stream.COMPUTE, 0, f"probe.{kind}.{i % 4}", (iss,), nbytes=nbytes, shape=shape, split=i, pinned=True)
        prev = plan.add(OpKind.HOST_SYNC, Stream.HOST, -1, f"sync {i}", (op,), split=i)
    return plan

rows = []
for kind in EC.PROBES:
    for cb in (0, 8 << 20):
        plan = lock(kind, cpu_bytes=cb)
        r = execute(plan, test="probe", variant=kind, warmup=1, repeats=3, probes=False, cp=CP)
        ops = plan.ops
        cpu_ids = [o.id for o in ops if o.kind is OpKind.CPU_MATVEC]
        cpu_s = float(np.nansum(r.host_op_s[cpu_ids])) if cpu_ids else 0.0
        p0 = float(analytic.run(lock(kind), plan_durations(lock(kind), base)).makespan_s)
        iss_ids = [o.id for o in ops if o.kind is OpKind.ISSUE]
        tr = r.trace.set_index("op_id")
        gpu_ids = [o.id for o in ops if o.stream is Stream.COMPUTE]
        rows.append(dict(kind=kind, cpu_mb=cb >> 20, launch_us=((r.makespan_s - cpu_s) - p0) / 40 * 1e6,
                         issue_host_med_us=float(np.nanmedian(r.host_op_s[iss_ids])) * 1e6,
                         gpu_dur_med_us=float(tr.loc[gpu_ids, "dur_s"].median()) * 1e6,
                         cpu_med_us=float(np.nanmedian(r.host_op_s[cpu_ids])) * 1e6 if cpu_ids else float("nan")))
        print(rows[-1], flush=True)

# decode-like loop: gemm, attn, gemm, d2h, sync, c x CPU matvec(S), h2d
def layer_plan(S, n=32, c=3):
    plan = Plan(label="decode loop")
    prev = None
    for i in range(n):
        for kind in ("gemm", "attn", "gemm", "d2h"):
            op_kind, shape, nbytes = EC.PROBES[kind]
            iss = plan.add(OpKind.ISSUE, Stream.HOST, -1, f"issue {kind}", (prev,) if prev is not None else (), tag=op_kind.value,
                           shape=shape if op_kind is OpKind.ATTN else (), split=i)
            prev = plan.add(op_kind, Stream.COMPUTE, 0, f"l.{kind}", (iss,), nbytes=nbytes if kind != "d2h" else 8192, shape=shape, split=i, pinned=True)
        prev = plan.add(OpKind.HOST_SYNC, Stream.HOST, -1, "sync", (prev,), split=i)
        for j in range(c):
            prev = plan.add(OpKind.CPU_MATVEC, Stream.CPU, -1, f"cpu{j}", (prev,), nbytes=S, shape=cpu_shape(S))
        iss = plan.add(OpKind.ISSUE, Stream.HOST, -1, "issue h2d", (prev,), tag="h2d", split=i)
        prev = plan.add(OpKind.H2D, Stream.COMPUTE, 0, "act", (iss,), nbytes=8192, split=i, pinned=True)
    return plan

for S in (1 << 20, 4 << 20, 8 << 20, 32 << 20, 70 << 20):
    plan = layer_plan(S)
    r = execute(plan, test="probe", variant="loop", warmup=1, repeats=3, probes=False, cp=CP)
    ops = plan.ops
    first = [o.id for o in ops if o.kind is OpKind.CPU_MATVEC and o.name == "cpu0"]
    rest = [o.id for o in ops if o.kind is OpKind.CPU_MATVEC and o.name != "cpu0"]
    tr = r.trace.set_index("op_id")
    gpu = {k: float(tr[(tr.kind == k)].dur_s.median()) * 1e6 for k in ("gemm", "attn", "d2h", "h2d")}
    iss = float(np.nanmedian(r.host_op_s[[o.id for o in ops if o.kind is OpKind.ISSUE]])) * 1e6
    pred = float(analytic.run(plan, plan_durations(plan, replace(hw, executor_mode=True))).makespan_s)
    rows.append(dict(kind="loop", cpu_mb=S / 2**20, first_us=float(np.nanmedian(r.host_op_s[first])) * 1e6,
                     rest_us=float(np.nanmedian(r.host_op_s[rest])) * 1e6, issue_med_us=iss, **{f"{k}_us": v for k, v in gpu.items()},
                     makespan_ms=r.makespan_s * 1e3, pred_ms=pred * 1e3))
    print(rows[-1], flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), f"diag_{tag}.json"), "w"))
import pandas as pd  # noqa: E402

print(pd.DataFrame(rows).round(2).to_string(index=False))
