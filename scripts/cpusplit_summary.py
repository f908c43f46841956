"""Tables of the ``h200-cpusplit`` lease (``calibrate/llamacpp/grids/h200-cpusplit.toml``).

1. Per split-timed invocation (``st-<model>-<placement>``): the median compute of a CPU split of
   host experts in decode graphs (one-token graphs, every CPU split but split 0, the token
   embedding), the used-expert bytes it reads per token (``n_expert_used`` experts of each expert
   tensor the placement puts on the CPU, at the model's ggml types) and its nodes (one
   ``MUL_MAT_ID`` per expert tensor; gpt-oss adds each tensor's bias ``ADD_ID``; with all three
   tensors the GLU between them).
2. Per model: ``a = 2·t(gate) − t(gate and up)``, the cost per CPU split that does not grow with
   its expert matrices (hypothesis 11 of ``data/llamacpp/h200-cpusplit-predicted/README.md``),
   and the least squares of ``t = a + bytes / rate`` over the model's placements.
3. The plain rows: t/s of each placement over the same model's all-on-CPU row, beside the
   simulator's ratio of record (hypothesis 12).
4. Decode at depth (``<model>-depth32k``): t/s and depth cost ``1/t(d) − 1/t(0)`` (µs per token) at
   each depth, and the ratio of the 16k→32k increment to the 8k→16k one (hypothesis 10 of
   ``data/llamacpp/h200-pform-predicted/README.md``).

Usage: PYTHONPATH=. python scripts/cpusplit_summary.py data/llamacpp/h100-20261207-cpusplit
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from calibrate.llamacpp.splittime import invocation_graphs
from sim.model.quant import ggml_nbytes
from sim.model.specs import load_model

MODELS = {"qwen3": "scenarios/models/qwen3-30b-a3b.toml", "gptoss": "scenarios/models/gpt-oss-20b.toml"}
#: expert tensors each placement puts on the CPU
PLACEMENTS = {"gate": ("ffn_gate_exps",), "down": ("ffn_down_exps",), "upgate": ("ffn_up_exps", "ffn_gate_exps"),
              "all": ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps")}
#: the simulator's ratios of record (t/s of the placement over t/s of all three on the CPU)
PREDICTED_RATIO = {("qwen3", "gate"): 1.778, ("qwen3", "down"): 1.678, ("qwen3", "upgate"): 1.308,
                   ("gptoss", "gate"): 2.108, ("gptoss", "down"): 2.108, ("gptoss", "upgate"): 1.357}
DEPTHS = (0, 8192, 16384, 24576, 32768)


def split_bytes(model_key: str, placement: str) -> tuple[float, int]:
    """(used-expert bytes per token and layer, nodes) of one placement's CPU split."""
    m = load_model(MODELS[model_key])
    names = PLACEMENTS[placement]
    b = 0.0
    for t in m.tensors:
        if t.layer == 0 and any(t.name == f"blk.0.{n}.weight" for n in names):
            b += ggml_nbytes(t.ggml_type, t.n_in * t.n_out) * m.moe.n_expert_used
    # one MUL_MAT_ID per tensor (gpt-oss: and its bias ADD_ID); the GLU joins the CPU split only
    # when the down projection is there too (else the scheduler gives it the GPU of the down)
    nodes = len(names) * (2 if m.arch == "gpt-oss" else 1) + (1 if len(names) == 3 else 0)
    return b, nodes


def cpu_split_us(run: Path, inv: dict) -> float | None:
    graphs = invocation_graphs(run, inv)
    if not graphs:
        return None
    c = [s.compute_s for g in graphs if g.ne1 == 1 for s in g.splits[1:] if s.backend.startswith("CPU")]
    return float(np.median(c)) * 1e6 if c else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="the lease's run folder (invocations.jsonl, llama-bench.jsonl, logs/)")
    run = Path(ap.parse_args(argv).run_dir)
    invs = [json.loads(x) for x in (run / "invocations.jsonl").read_text().splitlines() if x.strip()]
    rows = [json.loads(x) for x in (run / "llama-bench.jsonl").read_text().splitlines() if x.strip()]
    by_inv: dict[str, list[dict]] = {}  # llama-bench.jsonl holds each invocation's rows in turn
    i = 0
    for inv in invs:
        n = int(inv.get("rows") or 0)
        by_inv[inv["id"]] = rows[i:i + n]
        i += n
    print("## 1. CPU split of host experts in decode (split-timed)\n")
    print("| invocation | bytes per split (MB) | nodes | median compute (us) | GB/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    t: dict[tuple[str, str], tuple[float, float]] = {}
    for inv in invs:
        m = re.fullmatch(r"st-(qwen3|gptoss)-(gate|down|upgate|all)", inv["id"])
        if not m:
            continue
        us = cpu_split_us(run, inv)
        b, nodes = split_bytes(*m.groups())
        if us is None:
            print(f"| {inv['id']} | {b / 1e6:.2f} | {nodes} | (no split-time lines) | |")
            continue
        t[m.groups()] = (b, us)
        print(f"| {inv['id']} | {b / 1e6:.2f} | {nodes} | {us:.1f} | {b / us / 1e3:.1f} |")
    print("\n## 2. Cost per CPU split\n")
    for mk in MODELS:
        if (mk, "gate") in t and (mk, "upgate") in t:
            a = 2 * t[mk, "gate"][1] - t[mk, "upgate"][1]
            pts = [v for (k, _p), v in t.items() if k == mk]
            A = np.c_[np.ones(len(pts)), [p[0] for p in pts]]
            (a_ls, inv_rate), *_ = np.linalg.lstsq(A, np.array([p[1] for p in pts]), rcond=None)
            print(f"- {mk}: a = 2 t(gate) - t(gate and up) = {a:.1f} us; least squares over {len(pts)} placements: "
                  f"a = {a_ls:.1f} us, rate {1e-3 / inv_rate if inv_rate > 0 else float('nan'):.1f} GB/s")
            # a cost per node b beside a (t = a + nodes·b + work): with all three tensors, Qwen3's split
            # is gate and up, down, and the GLU; gpt-oss's is 1.5 times gate and up and the GLU
            if mk == "qwen3" and (mk, "all") in t and (mk, "down") in t:
                b = t[mk, "all"][1] - t[mk, "upgate"][1] - t[mk, "down"][1] + a
                print(f"  per node: b = t(all) - t(gate and up) - t(down) + a = {b:.1f} us")
            if mk == "gptoss" and (mk, "all") in t:
                b = t[mk, "all"][1] - 1.5 * t[mk, "upgate"][1] + 0.5 * a
                print(f"  per node: b = t(all) - 1.5 t(gate and up) + a / 2 = {b:.1f} us")
    print("\n## 3. Plain rows: t/s over the model's all-on-CPU row\n")
    print("| model | placement | t/s | ratio | predicted ratio | error |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    ts = {}
    for inv in invs:
        m = re.fullmatch(r"(qwen3|gptoss)-(gate|down|upgate|all)", inv["id"])
        rr = [r for r in by_inv.get(inv["id"], []) if r.get("n_gen", 0) > 0]
        if m and rr:
            ts[m.groups()] = rr[0]["avg_ts"]
    for (mk, p), v in sorted(ts.items()):
        if p == "all" or (mk, "all") not in ts:
            continue
        ratio = v / ts[mk, "all"]
        pr = PREDICTED_RATIO[mk, p]
        print(f"| {mk} | {p} | {v:.2f} | {ratio:.3f} | {pr:.3f} | {pr / ratio - 1:+.1%} |")
    for mk in MODELS:
        if (mk, "all") in ts:
            print(f"| {mk} | all | {ts[mk, 'all']:.2f} | 1 | 1 | |")
    print("\n## 4. Decode at depth (tg64, fully resident)\n")
    print("| model | depth | t/s | depth cost (us/token) |")
    print("| --- | ---: | ---: | ---: |")
    for mk in MODELS:
        rr = {r["n_depth"]: r["avg_ts"] for r in by_inv.get(f"{mk}-depth32k", []) if r.get("n_gen", 0) > 0}
        if 0 not in rr:
            continue
        cost = {d: (1 / rr[d] - 1 / rr[0]) * 1e6 for d in DEPTHS if d in rr}
        for d in DEPTHS:
            if d in rr:
                print(f"| {mk} | {d} | {rr[d]:.2f} | {cost[d]:.0f} |")
        if all(d in cost for d in (8192, 16384, 32768)):
            print(f"| {mk} | ratio 16k->32k / 8k->16k | | "
                  f"{(cost[32768] - cost[16384]) / (cost[16384] - cost[8192]):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
