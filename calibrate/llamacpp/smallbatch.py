"""GPU kernel prices at 2-8 tokens per ubatch, from ``ncu`` of llama-bench prompts.

ggml-cuda changes kernels between one token and a few (the pinned tree's ``ggml-cuda``):

* **FlashAttention** (f16 K/V, Hopper): the vector kernel runs one query token only
  (``ggml_cuda_get_best_fattn_kernel``: ``Q->ne[1] == 1``); from two tokens the mma kernel runs,
  with its stream-k fixup. The kernel tables measure 1 and 64 tokens and nothing between.
* **f32 weights** (the MoE router, ``ffn_gate_inp``): ``mul_mat_vec_f`` up to three columns on
  Ampere and later (``ggml_cuda_should_use_mmvf``: ``ne11 <= 3``), then ``mul_mat_f``, a few
  blocks of 32 rows each. The kernel tables hold no f32 case.
* **Quantised matvecs** (``mul_mat_vec_q`` up to 8 columns): each column adds dot products on
  the same weight rows; below the L2 the simulator prices a matvec as its weight read, which
  does not grow with the columns.

:func:`small_batch_numbers` reads a diag lease folder (``scripts/h200_diag2.sh`` part ``qwen3``:
``ncu-qwen3-pp8-ub1-8.csv.gz``, Qwen3-30B-A3B fully resident, pp8 at ubatch 1, 2, 4, 8, CUDA
graphs off, ``bench-qwen3-pp256.jsonl`` beside it) and measures the ``[ggml]`` numbers
``fa_extra_us_2``, ``fa_extra_us_4``, ``fa_extra_us_8``, ``f32_mmf_us`` and
``matvec_column_tmac_per_s`` (:class:`sim.model.ggmlcost.GgmlKernels`). ``ncu`` times each kernel
alone, so its sum per graph exceeds llama-bench's own time per graph (pp256 at the same
ubatch, no profiler) by a per-kernel overhead; each kernel's time is taken less that
overhead, measured per ubatch as ``(ncu sum - llama-bench time) / kernels``.

``python -m calibrate.llamacpp.smallbatch data/llamacpp/h100-20261207-diag3 [--write PROFILE]``
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from pathlib import Path

import pandas as pd

from sim.errors import PrefetchSimError

#: the ubatches of the lease's ncu run, in its order (one llama-bench test each, -p 8)
UBATCHES = (1, 2, 4, 8)
#: the prompt of the ncu run (tokens)
NCU_PROMPT = 8
NCU_FILE = "ncu-qwen3-pp8-ub1-8.csv.gz"
BENCH_FILE = "bench-qwen3-pp256.jsonl"
#: the query width (n_head * head_dim) the FlashAttention numbers are given for; another
#: geometry scales them by its width over this one (as the kernel tables' geometries scale)
FA_WIDTH = 4096
#: kernel classes of :func:`kernel_class`
CLASSES = ("FlashAttention", "dense MUL_MAT", "elementwise", "experts (MUL_MAT_ID)", "output head",
           "q8_1 quantisation", "router (f32 MUL_MAT)")


def kernel_class(name: str, grid: str, n_vocab: int) -> str:
    """The class (:data:`CLASSES`) of one ncu kernel row, by ggml-cuda's kernel name (short,
    without template arguments) and its grid ``"(x, y, z)"``: the matvec over the 8 expert
    slots (grid y = top-k) is the experts', the one over the vocabulary the output head's."""
    if name == "mul_mat_vec_q_moe" or (name == "mul_mat_vec_q" and not grid.endswith(", 1, 1)")):
        return "experts (MUL_MAT_ID)"
    if name in ("mul_mat_f", "mul_mat_vec_f"):
        return "router (f32 MUL_MAT)"
    if name == "mul_mat_vec_q" and grid.startswith(f"({n_vocab},"):
        return "output head"
    if name == "mul_mat_vec_q":
        return "dense MUL_MAT"
    if name.startswith("quantize"):
        return "q8_1 quantisation"
    if name.startswith("flash_attn"):
        return "FlashAttention"
    return "elementwise"


def read_kernels(folder: str | Path, n_vocab: int, ncu_file: str = NCU_FILE) -> pd.DataFrame:
    """The ncu run's kernels in launch order: ``kernel, grid, us, ub, cls`` (``ncu_file`` in
    ``folder``: :data:`NCU_FILE`, or another model's run of the same script).

    Raises:
        PrefetchSimError: the file missing or unreadable, or not four tests in it.
    """
    path = Path(folder) / ncu_file
    try:
        lines = gzip.open(path, "rt").read().splitlines()
        first = next(i for i, ln in enumerate(lines) if ln.startswith('"ID"'))
        df = pd.read_csv(io.StringIO("\n".join(lines[first:])), low_memory=False,
                         usecols=["Kernel Name", "Grid Size", "gpu__time_duration.sum"]).iloc[1:]  # units row
    except (OSError, StopIteration, ValueError, KeyError) as exc:
        raise PrefetchSimError(f"{path}: cannot read the ncu kernel list ({exc})") from None
    out = pd.DataFrame({
        "kernel": df["Kernel Name"].astype(str).str.replace(r"\(.*", "", regex=True)
        .str.replace(r"<.*", "", regex=True).str.replace("void ", "").str.strip(),
        "grid": df["Grid Size"].astype(str),
        "us": df["gpu__time_duration.sum"].astype(str).str.replace(",", "").astype(float) / 1e3})
    head = (out["kernel"] == "mul_mat_vec_q") & out["grid"].str.startswith(f"({n_vocab},")
    if int(head.sum()) != len(UBATCHES):
        raise PrefetchSimError(f"{path}: expected {len(UBATCHES)} tests (one output head each), found {int(head.sum())}")
    # the output head ends each test (its last ubatch computes the prompt's one output)
    out["ub"] = head.cumsum().shift(1, fill_value=0).map(dict(enumerate(UBATCHES)))
    out["cls"] = [kernel_class(k, g, n_vocab) for k, g in zip(out["kernel"], out["grid"])]
    return out.reset_index(drop=True)


def graph_table(folder: str | Path, n_vocab: int, ncu_file: str = NCU_FILE, bench_file: str = BENCH_FILE
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Per graph of each ubatch (``ncu_file`` and llama-bench's ``bench_file`` in ``folder``): ``(ms by class less ncu's overhead, kernels by class, totals)``;
    the first two are (class x ubatch), the totals (ubatch x ``ncu ms per graph``, ``kernels
    per graph``, ``llama-bench ms per graph (pp256)``, ``ncu overhead us per kernel``).

    Raises:
        PrefetchSimError: the llama-bench file missing or without one of the ubatches.
    """
    k = read_kernels(folder, n_vocab, ncu_file)
    graphs = {ub: NCU_PROMPT // ub for ub in UBATCHES}
    path = Path(folder) / bench_file
    bench: dict[int, float] = {}
    try:
        for ln in path.read_text().splitlines():
            if ln.strip():
                r = json.loads(ln)
                n_graphs = -(-int(r["n_prompt"]) // int(r["n_ubatch"]))
                bench[int(r["n_ubatch"])] = 1e3 * int(r["n_prompt"]) / float(r["avg_ts"]) / n_graphs
    except (OSError, ValueError, KeyError) as exc:
        raise PrefetchSimError(f"{path}: cannot read llama-bench's pp rows ({exc})") from None
    missing = [ub for ub in UBATCHES if ub not in bench]
    if missing:
        raise PrefetchSimError(f"{path}: no pp row at ubatch {', '.join(map(str, missing))}")
    ms = k.groupby(["cls", "ub"])["us"].sum().unstack().reindex(index=list(CLASSES), columns=list(UBATCHES),
                                                                fill_value=0.0) / 1e3
    count = k.groupby(["cls", "ub"]).size().unstack().reindex(index=list(CLASSES), columns=list(UBATCHES),
                                                              fill_value=0)
    for ub in UBATCHES:
        ms[ub] /= graphs[ub]
        count[ub] = count[ub] / graphs[ub]
    tot = pd.DataFrame({"ncu ms per graph": ms.sum(), "kernels per graph": count.sum(),
                        "llama-bench ms per graph (pp256)": pd.Series({ub: bench[ub] for ub in UBATCHES})})
    tot["ncu overhead us per kernel"] = (1e3 * (tot["ncu ms per graph"] - tot["llama-bench ms per graph (pp256)"])
                                         / tot["kernels per graph"])
    corrected = ms - count.mul(tot["ncu overhead us per kernel"], axis=1) / 1e3
    return corrected, count, tot


def dense_macs_per_column(model) -> float:
    """Multiply-adds of one token through a graph's dense attention weights (Q, K, V, O of
    every layer): ``n_layer * d_model * (2 * n_head + 2 * n_head_kv) * head_dim``."""
    return float(model.n_layer) * model.d_model * (2 * model.n_head + 2 * model.n_head_kv) * model.head_dim


def small_batch_numbers(folder: str | Path, model_toml: str = "scenarios/models/qwen3-30b-a3b.toml"
                        ) -> dict[str, tuple[float, str]]:
    """The ``[ggml]`` numbers of the module docstring, each ``(value in the TOML's unit, source)``.

    * ``fa_extra_us_N`` (N = 2, 4, 8): FlashAttention's kernels per layer at N tokens less at one,
      scaled to :data:`FA_WIDTH` (microseconds).
    * ``f32_mmf_us``: one ``mul_mat_f`` (the router at 4 and 8 tokens), the mean of its kernels
      at those ubatches (microseconds).
    * ``matvec_column_tmac_per_s``: the dense matvecs' time at 4 and 8 tokens less at 2 (flat
      from one to two) over ``(tokens - 2) * multiply-adds per column``
      (:func:`dense_macs_per_column`), a least-squares line through zero; the rate (1e12 / s).

    Raises:
        PrefetchSimError: unreadable files, or a measured growth not positive.
    """
    from sim.model.specs import load_model

    from .compare import resolve

    model = load_model(resolve(model_toml))
    corr, count, tot = graph_table(folder, model.n_vocab)
    where = Path(folder).as_posix()
    width = model.n_head * model.head_dim
    fa = corr.loc["FlashAttention"] / model.n_layer * 1e3   # us per layer
    out: dict[str, tuple[float, str]] = {}
    meta = Path(folder) / "meta.txt"   # the lease's nvidia-smi line first (scripts/h200_diag2.sh)
    device = meta.read_text().splitlines()[0].split(",")[0].strip() if meta.is_file() else "an unrecorded GPU"
    over = ", ".join(f"{tot.loc[ub, 'ncu overhead us per kernel']:.2f}" for ub in UBATCHES)
    common = (f"{device}, ncu of llama-bench pp{NCU_PROMPT} at ubatch {', '.join(map(str, UBATCHES))} on {model.name}, fully "
              f"resident, CUDA graphs off ({where}), each kernel less ncu's overhead per kernel ({over} us: its sum "
              f"against llama-bench's pp256 per graph)")
    for n in (2, 4, 8):
        extra = float(fa[n] - fa[1]) * FA_WIDTH / width
        if extra <= 0:
            raise PrefetchSimError(f"{where}: FlashAttention at {n} tokens is not above one token's ({fa[n]:.2f} us "
                                   f"per layer against {fa[1]:.2f}): nothing to price")
        out[f"fa_extra_us_{n}"] = (extra, f"measured: FlashAttention per layer at {n} tokens (mma kernel and "
                                          f"stream-k fixup) {fa[n]:.2f} us against {fa[1]:.2f} at one (vector "
                                          f"kernel); {common} (calibrate.llamacpp.smallbatch)")
    r = corr.loc["router (f32 MUL_MAT)"]
    c = count.loc["router (f32 MUL_MAT)"]
    per = [float(r[n] / c[n] * 1e3) for n in (4, 8)]
    out["f32_mmf_us"] = (sum(per) / 2, f"measured: the f32 router's mul_mat_f (128 x {model.d_model}) at 4 and 8 "
                                       f"tokens, {per[0]:.2f} and {per[1]:.2f} us per kernel; {common} "
                                       "(calibrate.llamacpp.smallbatch)")
    d = corr.loc["dense MUL_MAT"]
    macs = dense_macs_per_column(model)
    xs = [(n - 2) * macs for n in (4, 8)]
    ys = [float(d[n] - d[2]) * 1e-3 for n in (4, 8)]
    s_per_mac = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    if s_per_mac <= 0:
        raise PrefetchSimError(f"{where}: the dense matvecs do not grow with the tokens: nothing to price")
    out["matvec_column_tmac_per_s"] = (
        1.0 / s_per_mac / 1e12,
        f"measured: the dense matvecs (Q, K, V, O; {macs / 1e6:.0f} M multiply-adds a column) per graph "
        f"{d[2]:.3f} / {d[4]:.3f} / {d[8]:.3f} ms at 2 / 4 / 8 tokens ({d[1]:.3f} at one), a line through zero in "
        f"the columns beyond two; {common} (calibrate.llamacpp.smallbatch)")
    return out


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.smallbatch",
                                 description="Measure the [ggml] numbers of GPU kernels at 2-8 tokens per ubatch "
                                             "from a diag lease's ncu run; print them, or write them into a profile.")
    ap.add_argument("folder", help="the lease folder (ncu-qwen3-pp8-ub1-8.csv.gz, bench-qwen3-pp256.jsonl)")
    ap.add_argument("--write", metavar="PROFILE", default=None,
                    help="rewrite (or add) these lines of the profile's [ggml] table")
    ap.add_argument("--classes", nargs=3, metavar=("NCU", "BENCH", "N_VOCAB"), default=None,
                    help="print instead the ms per graph by kernel class of another run of the folder: its ncu "
                         "file, its llama-bench pp256 JSONL and the model's vocabulary (e.g. "
                         "ncu-gemma-pp8-ub1-8.csv.gz bench-gemma-pp256.jsonl 262144)")
    args = ap.parse_args(argv)
    try:
        if args.classes:
            ncu, bench, vocab = args.classes
            corr, count, tot = graph_table(args.folder, int(vocab), ncu, bench)
            print("ms per graph by kernel class, each kernel less ncu's overhead per kernel ("
                  + ", ".join(f"{v:.2f}" for v in tot["ncu overhead us per kernel"]) + " us at ubatch "
                  + ", ".join(map(str, UBATCHES)) + "); kernels per graph in brackets\n")
            print("| class | " + " | ".join(f"ub {u}" for u in UBATCHES) + " |")
            print("| --- |" + " ---: |" * len(UBATCHES))
            for cls in CLASSES:
                if count.loc[cls].sum() == 0:
                    continue
                print(f"| {cls} | " + " | ".join(f"{corr.loc[cls, u]:.3f} ({count.loc[cls, u]:.0f})" for u in UBATCHES)
                      + " |")
            return 0
        values = small_batch_numbers(args.folder)
        for key, (v, src) in values.items():
            print(f"{key} = {v:.6g}   ({src})")
        if args.write:
            from .fit import write_values

            write_values(args.write, values)
            print(f"-> {args.write}")
    except PrefetchSimError as exc:
        print(f"smallbatch: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m calibrate.llamacpp.smallbatch``."""
    return _main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
