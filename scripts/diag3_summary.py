"""Tables of the diag3 lease (``scripts/h200_diag2.sh`` parts ``restore`` and ``qwen3``).

1. gpt-oss decode at depth in three invocation forms (``restore-gptoss-*.jsonl``): tg128 t/s at
   depth 0 and 8192, the steady period per token (mean of repetitions 2-4, microseconds) and the
   depth cost (steady d8192 less steady d0).
2. Qwen3-30B-A3B prompts of 8 tokens at ubatch 1, 2, 4 and 8 under ``ncu`` (CUDA graphs off,
   ``ncu-qwen3-pp8-ub1-8.csv.gz``): GPU time per graph (ms) by kernel class, each class's kernel
   count per graph, and the whole graph, beside llama-bench's own time per graph of pp256 at the
   same ubatch (``bench-qwen3-pp256.jsonl``, no profiler). ``ncu`` times each kernel alone, so its
   sum exceeds the graph's time by a per-kernel overhead, printed as ``(ncu - llama-bench) /
   kernels``; the ``corrected`` table takes that (the ubatch's own) from each kernel.
3. The simulator's prices of the same graph on the shipped profile, by the same classes (``dense
   MUL_MAT`` includes its q8_1 quantisation, ``attention`` the layer's elementwise kernels): the
   third graph of ``prefetch-sim trace`` of pp32 at each ubatch (a replayed CUDA graph).

Usage: PYTHONPATH=. python scripts/diag3_summary.py data/llamacpp/h100-20261207-diag3
"""

from __future__ import annotations

import json
import statistics as st
import sys
from pathlib import Path

import pandas as pd

from calibrate.llamacpp.smallbatch import UBATCHES  # the ncu run's ubatches

FORMS = ("gt1", "tg1", "gtng", "tgng", "p1", "gt2", "tg2", "p1b")


def decode_forms(folder: Path) -> pd.DataFrame:
    """One row per run: t/s and steady µs per token of tg128 at depth 0 and 8192."""
    rows = []
    for f in FORMS:
        rec = {"run": f}
        for ln in (folder / f"restore-gptoss-{f}.jsonl").read_text().splitlines():
            r = json.loads(ln)
            if r["n_gen"] > 0:
                d = r["n_depth"]
                rec[f"t/s d{d}"] = round(r["avg_ts"], 1)
                rec[f"us d{d}"] = round(st.mean(1e6 / x for x in r["samples_ts"][2:]), 1)
        rec["depth cost us"] = round(rec["us d8192"] - rec["us d0"], 1)
        rows.append(rec)
    return pd.DataFrame(rows)


def ncu_graphs(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(ms per graph by class less ncu's overhead, kernels per graph by class, totals):
    :func:`calibrate.llamacpp.smallbatch.graph_table` on Qwen3's vocabulary."""
    from calibrate.llamacpp.smallbatch import graph_table

    corrected, count, tot = graph_table(folder, 151936)
    return corrected.round(3), count.round(1), tot.round(3)


def sim_graphs() -> pd.DataFrame:
    """ms per graph by class of the simulator's third graph of a pp32 at ubatch 1, 2, 4 and 8
    (``prefetch-sim trace``, the shipped profile, Qwen3-30B-A3B fully resident, ``-fa on``)."""
    import subprocess
    import tempfile

    def cls(name: str) -> str:
        if name.endswith("_exps.weight"):
            return "experts (MUL_MAT_ID)"
        if "ffn_gate_inp" in name:
            return "router (f32 MUL_MAT)"
        if name.endswith(".attn"):
            return "attention and elementwise"
        if "attn_qkv" in name or "attn_output" in name:
            return "dense MUL_MAT and q8_1"
        return "other"

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ub in UBATCHES:
            csv = Path(tmp) / f"tr{ub}.csv"
            subprocess.run([sys.executable, "-m", "sim", "trace", "-m", "scenarios/models/qwen3-30b-a3b.toml",
                            "-ngl", "99", "-ncmoe", "0", "-lm", "none", "-fa", "on", "-b", "2048", "-ub", str(ub),
                            "-p", "32", "-n", "0", "--variant", "baseline", "--out", str(csv), "-q"],
                           check=True, capture_output=True)
            d = pd.read_csv(csv)
            g = d[(d["graph"] == 2) & (d["stream"] == "compute")]
            out[ub] = g.groupby(g["name"].map(cls))["dur_s"].sum() * 1e3
    return pd.DataFrame(out).round(3)


def md(df: pd.DataFrame, index: bool = True) -> str:
    """A markdown table of ``df`` (no tabulate dependency)."""
    if index:
        df = df.reset_index()
    cols = [str(c) for c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    out += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    folder = Path(argv[0])
    print("gpt-oss-20b tg128, three invocation forms (ng: GGML_CUDA_DISABLE_GRAPHS=1)\n")
    print(md(decode_forms(folder), index=False))
    corrected, count, tot = ncu_graphs(folder)
    print("\nQwen3-30B-A3B, ncu, per graph: totals beside llama-bench\n")
    print(md(tot))
    print("\nms per graph by class, each kernel less the ubatch's ncu overhead\n")
    print(md(corrected))
    print("\nkernels per graph by class\n")
    print(md(count))
    print("\nthe simulator (shipped profile), ms per graph by class, a replayed graph of pp32\n")
    print(md(sim_graphs()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
