"""Hand-built plans for smoke-testing the executor, in the patterns of :mod:`sim.plan.builder`.

* :func:`sequential_plan` — the baseline with one graph copy: per layer, the host syncs,
  copies the layer's host-resident weight on the compute stream, waits for it, then launches
  the GEMM: copy and compute never overlap, layer time ``T + C``.
* :func:`prefetch_plan` — ``n_slots`` staging slots on a copy stream, one layer ahead of
  the consumer whatever the slot count (the copy for layer i+1 is issued when the host reaches
  layer i; the slots bound reuse, not depth, as :mod:`sim.plan.builder` stages expert slots); the
  consumer waits on its copy's ready event, a slot is reused only after its last consumer
  finished (free event). With 2 slots this is the double buffer of ``--prefetch-weights``:
  layer time ``max(C, T)``.

``python -m calibrate.smoke --out DIR`` runs both on the GPU and prints a table comparing
measured makespans with the analytic engine on a hardware profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.plan import OpKind, Plan, Stream


def _launch(plan: Plan, kind: OpKind, stream: Stream, name: str, deps=(), **kw) -> int:
    iss = plan.add(OpKind.ISSUE, Stream.HOST, -1, f"issue {name}", layer=kw.get("layer", -1))
    return plan.add(kind, stream, 0, name, (iss, *deps), **kw)


def sequential_plan(n_layers: int, weight_bytes: int, shape: tuple[int, int, int], *, pinned: bool = True,
                    resident_gemms: int = 0) -> Plan:
    """Baseline plan: ``n_layers`` × (sync, H2D of ``weight_bytes``, wait, GEMM ``shape``).

    Args:
        shape: (m, n, k) of the GEMM that consumes the copied weight.
        resident_gemms: GEMMs with GPU-resident weights before each copied one.
    """
    p = Plan(label=f"sequential x{n_layers}")
    last = -1
    for i in range(n_layers):
        for r in range(resident_gemms):
            last = _launch(p, OpKind.GEMM, Stream.COMPUTE, f"blk.{i}.attn_{r}", nbytes=2 * shape[1] * shape[2],
                           shape=shape, layer=i, split=2 * i)
        p.add(OpKind.HOST_SYNC, Stream.HOST, -1, f"sync before blk.{i}.ffn", (last,), layer=i, split=2 * i + 1)
        if pinned:
            cp = _launch(p, OpKind.H2D, Stream.COMPUTE, f"blk.{i}.ffn", nbytes=weight_bytes, layer=i,
                         split=2 * i + 1, tag="whole", pinned=True)
            p.add(OpKind.HOST_SYNC, Stream.HOST, -1, f"wait copy blk.{i}.ffn", (cp,), layer=i, split=2 * i + 1)
        else:
            p.add(OpKind.H2D, Stream.HOST, 0, f"blk.{i}.ffn", (last,) if last >= 0 else (), nbytes=weight_bytes,
                  layer=i, split=2 * i + 1, tag="whole", pinned=False)
        last = _launch(p, OpKind.GEMM, Stream.COMPUTE, f"blk.{i}.ffn", nbytes=weight_bytes, shape=shape, layer=i,
                       split=2 * i + 1)
    p.add(OpKind.HOST_SYNC, Stream.HOST, -1, "graph 0 end sync0", (last,))
    p.graph_last_op.append(len(p.ops) - 1)
    p.graph_tokens.append(shape[0])
    return p


def prefetch_plan(n_layers: int, weight_bytes: int, shape: tuple[int, int, int], *, n_slots: int = 2,
                  resident_gemms: int = 0, drop_free_wait: bool = False) -> Plan:
    """Prefetch plan: copies of each layer's weight into ``n_slots`` rotating staging slots
    on the copy stream, one layer ahead of the consumer (the copy of layer i + 1 is issued
    before layer i's consumer is launched; it waits for the consumer ``n_slots`` layers
    earlier).

    Args:
        drop_free_wait: omit the free-event dependency (a deliberate use-after-free hazard,
            for testing the executor's staging probes).
    """
    if n_slots < 2:
        raise ValueError("prefetch needs at least 2 slots")
    p = Plan(label=f"prefetch {n_slots} slots x{n_layers}")
    copy_of: dict[int, int] = {}
    consumer_of: dict[int, int] = {}
    issued = -1

    def issue(c: int) -> None:
        slot = c % n_slots
        free = consumer_of.get(c - n_slots)
        deps = [free] if free is not None and not drop_free_wait else []
        if free is not None:
            p.add(OpKind.EVENT_WAIT, Stream.HOST, -1, f"wait free slot{slot}", layer=c)
        copy_of[c] = _launch(p, OpKind.H2D, Stream.COPY, f"blk.{c}.ffn (prefetch)", deps, nbytes=weight_bytes,
                             layer=c, split=2 * c + 1, slot=slot, slot_bytes=weight_bytes, tag="prefetch", pinned=True)
        p.add(OpKind.EVENT_RECORD, Stream.HOST, -1, f"record ready blk.{c}.ffn", layer=c)

    for i in range(n_layers):
        # copies one ahead of this consumer (the slot of copy i + 1 was freed by consumer
        # i + 1 - n_slots <= i - 1, launched already)
        while issued < min(n_layers - 1, i + 1):
            issued += 1
            issue(issued)
        for r in range(resident_gemms):
            _launch(p, OpKind.GEMM, Stream.COMPUTE, f"blk.{i}.attn_{r}", nbytes=2 * shape[1] * shape[2], shape=shape,
                    layer=i, split=2 * i)
        p.add(OpKind.EVENT_WAIT, Stream.HOST, -1, f"wait ready blk.{i}.ffn", layer=i)
        consumer_of[i] = _launch(p, OpKind.GEMM, Stream.COMPUTE, f"blk.{i}.ffn", (copy_of[i],), nbytes=weight_bytes,
                                 shape=shape, layer=i, split=2 * i + 1, slot=i % n_slots, slot_bytes=weight_bytes,
                                 tag="staged")
        p.add(OpKind.EVENT_RECORD, Stream.HOST, -1, f"record free blk.{i}.ffn", layer=i)
    p.add(OpKind.HOST_SYNC, Stream.HOST, -1, "graph 0 end sync0", (consumer_of[n_layers - 1],))
    p.graph_last_op.append(len(p.ops) - 1)
    p.graph_tokens.append(shape[0])
    return p


def analytic_module():
    """:mod:`sim.engines.analytic`, also where SimPy is not installed (the GPU image):
    ``sim.engines/__init__`` imports the DES engine, which needs SimPy; the analytic engine
    does not, so it is then loaded without the package's ``__init__``."""
    try:
        from sim.engines import analytic  # noqa: PLC0415

        return analytic
    except ModuleNotFoundError as exc:
        if exc.name != "simpy":
            raise
    import importlib  # noqa: PLC0415
    import types  # noqa: PLC0415

    import sim  # noqa: PLC0415

    pkg = types.ModuleType("sim.engines")
    pkg.__path__ = [str(Path(sim.__file__).parent / "engines")]
    sys.modules["sim.engines"] = pkg
    return importlib.import_module("sim.engines.analytic")


def predict_makespan_s(plan: Plan, hw) -> float:
    """Makespan of ``plan`` on profile ``hw`` from the analytic engine."""
    from sim.model.costs import plan_durations  # noqa: PLC0415

    sched = analytic_module().run(plan, plan_durations(plan, hw))
    return float(sched.end_s.max())


def kind_breakdown(plan: Plan, trace, hw):
    """Per (kind, queue): op count, summed measured duration and summed cost-model duration
    (ms) — where the executor and the model differ. Returns a DataFrame."""
    import pandas as pd  # noqa: PLC0415

    from sim.model.costs import plan_durations  # noqa: PLC0415

    df = trace[["op_id", "kind", "stream", "dur_s"]].copy()
    df["pred_s"] = plan_durations(plan, hw)[df.op_id.to_numpy()]
    g = df.groupby(["kind", "stream"]).agg(n=("op_id", "size"), measured_ms=("dur_s", "sum"),
                                           model_ms=("pred_s", "sum"))
    g[["measured_ms", "model_ms"]] *= 1e3
    return pd.DataFrame(g).reset_index()


def run_scenario(path: str, hw, tests: list[str], *, repeats: int = 2, byte_scale: float = 1.0):
    """Build a shipped scenario's plans (on profile ``hw``) for ``tests`` (``"pp512"``,
    ``"tg16"``) and every variant, run them, and compare with the analytic engine.

    Returns (summary rows, traces)."""
    import numpy as np  # noqa: PLC0415

    from sim.plan.builder import build_plan  # noqa: PLC0415
    from sim.model.specs import BenchTest, load_scenario  # noqa: PLC0415

    from .executor import check_lossless, execute  # noqa: PLC0415

    scn = load_scenario(path).with_(hardware=hw)
    rows, traces = [], []
    for tname in tests:
        n = int(tname[2:])
        test = BenchTest(n, 0) if tname.startswith("pp") else BenchTest(0, n)
        results = {}
        runs = [(v, True) for v in scn.variants] + [(scn.variants[0], False)]
        for v, probes in runs:
            plan = build_plan(scn, v, test, np.random.default_rng(scn.seed))
            label = v.name if probes else f"{v.name} (no probes)"
            r = execute(plan, test=tname, variant=label, repeats=repeats, warmup=1, byte_scale=byte_scale,
                        probes=probes)
            pred = predict_makespan_s(plan, hw)
            if probes:
                results[v.name] = r
                traces.append(r.trace)
            if v is scn.variants[0] and probes:
                kb = kind_breakdown(plan, r.trace, hw)
                print(f"{Path(path).stem} {tname} {v.name}: measured vs model per op kind\n"
                      + kb.to_string(index=False, float_format=lambda x: f"{x:.3f}"), flush=True)
            rows.append({"case": f"{Path(path).stem} {tname}", "variant": label, "ops": len(plan.ops),
                         "measured_ms": r.makespan_s * 1e3,
                         "spread_ms": (max(r.makespans_s) - min(r.makespans_s)) * 1e3,
                         "analytic_ms": pred * 1e3, "measured/analytic": r.makespan_s / pred,
                         "h2d_GBps": r.h2d_bytes_per_s / 1e9, "h2d_op_GBps": r.h2d_op_bytes_per_s / 1e9,
                         "probes": r.probes_checked, "digest": r.digest[:12]})
        try:
            d = check_lossless(results)
            print(f"{Path(path).stem} {tname}: lossless (digest {d[:12]})", flush=True)
        except Exception as exc:  # report, keep going
            print(f"{Path(path).stem} {tname}: {type(exc).__name__}: {exc}", flush=True)
    return rows, traces


def main(argv: list[str] | None = None) -> int:
    """Run the smoke plans on the GPU; write traces under ``--out``; print a table."""
    ap = argparse.ArgumentParser(prog="python -m calibrate.smoke")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hardware", default="scenarios/hardware/h200.toml")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scenario", action="append", default=[],
                    help="also run a shipped scenario's plans (every variant) on the measured profile")
    ap.add_argument("--tests", default="pp512,tg16", help="tests of --scenario (default pp512,tg16)")
    args = ap.parse_args(argv)
    import pandas as pd  # noqa: PLC0415

    from sim.model.specs import load_hardware  # noqa: PLC0415

    from .executor import ExecutorHazardError, check_lossless, execute  # noqa: PLC0415

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hw = load_hardware(args.hardware)
    mib = 2**20
    cases = []
    # C ≈ T: 64 MiB copy (~1.2 ms at 55 GB/s) against an 8192x14336x4096 GEMM (~1.3 ms)
    for label, wb, shape in (("C~T", 64 * mib, (8192, 14336, 4096)),
                             ("C<<T", 64 * mib, (512, 14336, 4096)),
                             ("C>>T", 8 * mib, (8192, 14336, 4096))):
        group = {
            "sequential": sequential_plan(args.layers, wb, shape),
            "sequential_pageable": sequential_plan(args.layers, wb, shape, pinned=False),
            "prefetch2": prefetch_plan(args.layers, wb, shape, n_slots=2),
            "prefetch3": prefetch_plan(args.layers, wb, shape, n_slots=3),
        }
        cases.append((label, wb, shape, group))
    rows = []
    traces = []
    for label, wb, shape, group in cases:
        results = {}
        for vname, plan in group.items():
            r = execute(plan, test=label, variant=vname, repeats=args.repeats, warmup=1)
            pred = predict_makespan_s(plan, hw)
            results[vname] = r
            traces.append(r.trace)
            rows.append({"case": label, "variant": vname, "ops": len(plan.ops), "measured_ms": r.makespan_s * 1e3,
                         "spread_ms": (max(r.makespans_s) - min(r.makespans_s)) * 1e3,
                         "analytic_ms": pred * 1e3, "measured/analytic": r.makespan_s / pred,
                         "h2d_GBps": r.h2d_bytes_per_s / 1e9, "h2d_op_GBps": r.h2d_op_bytes_per_s / 1e9,
                         "probes": r.probes_checked, "digest": r.digest[:12]})
        digest = check_lossless({k: v for k, v in results.items()})
        print(f"{label}: all variants lossless (digest {digest[:12]})", flush=True)
    # a deliberate hazard must be caught
    hz = prefetch_plan(6, 64 * mib, (8192, 14336, 4096), n_slots=2, drop_free_wait=True)
    try:
        execute(hz, test="hazard", variant="prefetch2-no-free-wait", repeats=1, warmup=0)
        hazard = "NOT detected"
    except ExecutorHazardError as exc:
        hazard = f"detected: {str(exc)[:160]}"
    print(f"deliberate slot-reuse hazard: {hazard}", flush=True)
    for path in args.scenario:
        try:
            r2, t2 = run_scenario(path, hw, args.tests.split(","), repeats=2)
            rows += r2
            traces += t2
        except Exception as exc:  # report, keep the hand-built results
            print(f"scenario {path} FAILED: {type(exc).__name__}: {exc}", flush=True)
    df = pd.DataFrame(rows)
    from sim.atomic import write_atomic_many

    write_atomic_many({out / "smoke_traces.csv": pd.concat(traces, ignore_index=True).to_csv(index=False),
                       out / "smoke_summary.csv": df.to_csv(index=False)})
    print(f"calibrated H2D pinned: {hw.h2d_pinned.bytes_per_s / 1e9:.1f} GB/s")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("calibrate.smoke", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
