"""Tables of the ``pform`` lease (``scripts/h200_diag2.sh`` part ``pform``).

1. gpt-oss-20b tg128 at depth 0 and 8192 after a pp test of ``-p N`` tokens at the same depth in
   the same invocation (``pform-gptoss-p<N><run>.jsonl``; ``-p 0``: no pp test, the tg test fills
   the depth itself): t/s, the depth cost per token (``1/t(d8192) - 1/t(d0)`` from llama-bench's
   ``avg_ts``, µs) and the steady depth cost (repetitions 2-4 of each, as ``diag3_summary``).
2. The GPU's clocks, power and clock-event reasons while each run ran (``pform-clocks.csv.gz``,
   ``nvidia-smi`` every 0.2 s; samples above 150 W, i.e. while the GPU computes).
3. ``ncu`` of the FlashAttention kernels alone (``ncu-pform-gptoss-p512.csv.gz``,
   ``...-p1.csv.gz``): each kernel's median time over the tg16 @ d8192 graphs (the last 16 x 48
   FlashAttention kernels of each run: two kernels per layer).

Part ``pform2`` (``pform2-<model>-p<N><run>.jsonl``: Qwen3-30B-A3B and Gemma-3-27B in the ``-p
512``, ``-p 1`` and ``-p 0`` forms): table 1 for each model. Part ``pform3``
(``pform3-gptoss-p<N><setting><run>.jsonl``: gpt-oss's two forms with ``GGML_CUDA_PDL=0`` and with
``GGML_CUDA_DISABLE_FUSION=1``): table 1 and the excess per setting (:func:`switches`).

Usage: PYTHONPATH=. python scripts/pform_summary.py data/llamacpp/h100-20261207-pform
       PYTHONPATH=. python scripts/pform_summary.py data/llamacpp/h100-20261207-pform2
       PYTHONPATH=. python scripts/pform_summary.py data/llamacpp/h100-20261207-pform3
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import statistics as st
from pathlib import Path

import pandas as pd

ORDER = "p512a p1a p256a p2048a p64a p0a p768a p4096a p512b p256b p1b p0b p512c p256c".split()


ORDER2 = "p512a p1a p0a p512b p1b p0b".split()
ORDER3 = "p512 p1 p512pdl0 p1pdl0 p512nofuse p1nofuse p512b p1b p512pdl0b p1pdl0b p512nofuseb p1nofuseb".split()


def switches(folder: Path) -> pd.DataFrame:
    """Part ``pform3``: per setting (plain, ``GGML_CUDA_PDL=0``, ``GGML_CUDA_DISABLE_FUSION=1``) the
    mean depth cost of the two ``-p 512`` runs and of the two ``-p 1`` runs (µs) and the excess."""
    rows = []
    for s in ("", "pdl0", "nofuse"):
        cost = {}
        for form in ("p512", "p1"):
            runs = [f"{form}{s}", f"{form}{s}b"]
            cost[form] = st.mean(forms(folder, "pform3-gptoss", runs)["depth cost µs"])
        rows.append({"setting": s or "plain", "-p 512 µs": round(cost["p512"]), "-p 1 µs": round(cost["p1"]),
                     "excess µs": round(cost["p512"] - cost["p1"])})
    return pd.DataFrame(rows)


def forms(folder: Path, prefix: str = "pform-gptoss", order: list[str] = ORDER) -> pd.DataFrame:
    """One row per run, in the order they ran."""
    rows = []
    for run in order:
        rec = {"run": run, "-p": int(re.match(r"p(\d+)", run).group(1) if prefix.startswith("pform3")
                                     else run[1:-1])}
        for ln in (folder / f"{prefix}-{run}.jsonl").read_text().splitlines():
            r = json.loads(ln)
            if r["n_gen"] > 0:
                d = r["n_depth"]
                rec[f"t/s d{d}"] = round(r["avg_ts"], 1)
                rec[f"_us{d}"] = 1e6 / r["avg_ts"]
                rec[f"_st{d}"] = st.mean(1e6 / x for x in r["samples_ts"][2:])
        rec["depth cost µs"] = round(rec.pop("_us8192") - rec.pop("_us0"))
        rec["steady cost µs"] = round(rec.pop("_st8192") - rec.pop("_st0"))
        rows.append(rec)
    return pd.DataFrame(rows)


def clocks(folder: Path) -> pd.DataFrame:
    """Median SM / memory clock (MHz) and power (W), and the clock-event reasons seen, per run."""
    c = pd.read_csv(folder / "pform-clocks.csv.gz", skipinitialspace=True)
    c.columns = ["ts", "sm", "mem", "power", "temp", "reasons"]
    for k in ("sm", "mem", "power"):
        c[k] = c[k].astype(str).str.extract(r"([\d.]+)")[0].astype(float)
    c["ts"] = pd.to_datetime(c["ts"])
    day = c["ts"].iloc[0].strftime("%Y-%m-%d")
    span: dict[str, dict[str, pd.Timestamp]] = {}
    for ln in (folder / "progress.log").read_text().splitlines():
        m = re.match(r"(\d\d:\d\d:\d\d) \S+ pform (\S+) (start|exit)", ln)
        if m:
            span.setdefault(m.group(2), {})[m.group(3)] = pd.Timestamp(f"{day} {m.group(1)}")
    rows = []
    for run in ORDER:
        w = c[(c.ts >= span[run]["start"]) & (c.ts <= span[run]["exit"])]
        busy = w[w.power > 150]
        rows.append({"run": run, "samples": len(busy), "SM MHz": busy.sm.median(), "mem MHz": busy.mem.median(),
                     "W": round(busy.power.median()), "max °C": w.temp.max(),
                     "reasons": " ".join(sorted(set(busy.reasons)))})
    return pd.DataFrame(rows)


def flash_kernels(folder: Path) -> pd.DataFrame:
    """Median ns per FlashAttention kernel of the tg16 graphs, per form (columns p512, p1)."""
    out = {}
    for form in ("p512", "p1"):
        lines = gzip.open(folder / f"ncu-pform-gptoss-{form}.csv.gz", "rt").read().splitlines()
        head = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
        d = pd.read_csv(io.StringIO("\n".join(lines[head:]))).iloc[1:]  # the units row
        t = pd.to_numeric(d["gpu__time_duration.sum"].astype(str).str.replace(",", ""), errors="raise")
        kern = d["Kernel Name"].str.extract(r"void (\w+<[^>]*>)")[0]
        tail = pd.DataFrame({"kernel": kern, "ns": t}).tail(16 * 48)
        out[form] = tail.groupby("kernel")["ns"].median()
    df = pd.DataFrame(out)
    df["p512 / p1"] = (df["p512"] / df["p1"]).round(4)
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the lease's data folder")
    a = ap.parse_args(argv)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        if (a.folder / "pform3-gptoss-p512.jsonl").is_file():
            print(forms(a.folder, "pform3-gptoss", ORDER3).to_string(index=False), end="\n\n")
            print(switches(a.folder).to_string(index=False))
            return 0
        if (a.folder / "pform2-qwen3-p512a.jsonl").is_file():
            for model in ("qwen3", "gemma"):
                print(model)
                print(forms(a.folder, f"pform2-{model}", ORDER2).to_string(index=False), end="\n\n")
            return 0
        print(forms(a.folder).to_string(index=False), end="\n\n")
        print(clocks(a.folder).to_string(index=False), end="\n\n")
        print(flash_kernels(a.folder).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
