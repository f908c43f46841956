"""The held-out split of the llama.cpp ground truth, fixed before any fit.

A calibration to llama.cpp may only fit on the **fit** rows; accuracy is reported on the
**held-out** rows, which differ from every fit row in model, placement or ubatch, not only in
repetition:

* fit: Qwen3-30B-A3B (MoE) fully resident (``n_cpu_moe = 0``) and with every expert on the host
  (``n_cpu_moe = n_layer``), and Gemma-3-27B (dense) fully resident and with its FFNs on the host
  (``-ot ffn_(gate|up|down)=CPU``): the regimes' end points, at ubatches 128, 512 and 4096;
* held out: everything else — the other MoE (gpt-oss-20b) whole; the partial placements of the
  fit models (Qwen3 ``-ncmoe`` 12/24/36, among them the shipped default scenario's
  configuration; Gemma ``-ngl`` 48/31); ubatch 2048 everywhere; pageable (``-lm mmap``) rows;
  rows of the project's prefetch patch with prefetch on (``prefetch_weights`` 1 or
  ``prefetch_expert_slots`` > 0: the fit is of the baseline scheduler).

The rule is a function of a row's fields only, so it applies to future runs of the same grid.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.wording import plural

#: models (GGUF file stem) whose end-point placements may be fitted on
FIT_MODELS = {"qwen3-30b-a3b": 48, "gemma3-27b": 62}
#: ubatches that may be fitted on
FIT_UBATCHES = (128, 512, 4096)
#: the only tensor override a fit row may carry
FIT_OVERRIDE = "ffn_(gate|up|down)=CPU"


def is_fit_row(row) -> bool:
    """True when a llama-bench row (a mapping or a pandas row with llama-bench's field names)
    belongs to the fit set (module docstring); False for held-out rows. A field an older
    llama-bench did not print takes what it ran as: ``load_mode`` from ``use_mmap`` (``none`` when
    false, else ``mmap``; neither: ``auto``), ``n_cpu_moe`` 0, ``n_gpu_layers`` every layer."""
    from sim.views.llamabench import load_mode_of, row_value

    stem = Path(str(row_value(row, "model_filename", ""))).stem
    if (stem not in FIT_MODELS or load_mode_of(row) != "none"
            or int(row_value(row, "n_ubatch", 512)) not in FIT_UBATCHES):
        return False
    if any(_on(row_value(row, k)) for k in ("prefetch_weights", "prefetch_expert_slots")):
        return False
    n_layer = FIT_MODELS[stem]
    ot = str(row_value(row, "tensor_buft_overrides", "none") or "none")
    ngl = int(row_value(row, "n_gpu_layers", -1))
    if not (ngl < 0 or ngl > n_layer):
        return False
    ncmoe = int(row_value(row, "n_cpu_moe", 0))
    if stem == "gemma3-27b":
        return ot in ("none", FIT_OVERRIDE) and ncmoe == 0
    return ot == "none" and ncmoe in (0, n_layer)


def _on(v) -> bool:
    """A prefetch field that is set (a number > 0; absent or NaN: upstream's row, off)."""
    try:
        return float(v) > 0
    except (TypeError, ValueError):
        return False


def label(df: pd.DataFrame) -> pd.Series:
    """``"fit"`` or ``"heldout"`` for every row of a :func:`sim.views.llamabench.read_llama_bench` frame."""
    return df.apply(lambda r: "fit" if is_fit_row(r) else "heldout", axis=1)


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate.llamacpp.split RUN_DIR...``: each run folder's rows by split (fit,
    held-out), one line per folder, and with ``--rows`` every row's line, test and split. Exit
    status 2 with a one-line message on a bad folder."""
    import argparse
    import sys

    from sim.errors import PrefetchSimError
    from sim.views.llamabench import read_llama_bench

    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.split",
                                 description="The held-out split of llama-bench rows (fixed before any fit): "
                                             "how many rows of each run folder the fit may use.")
    ap.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run folder(s) with llama-bench.jsonl")
    ap.add_argument("--rows", action="store_true", help="print every row's line, test and split")
    args = ap.parse_args(argv)
    for run in args.run_dirs:
        path = Path(run) / "llama-bench.jsonl"
        try:
            if not path.is_file():
                raise PrefetchSimError(f"{run}: no llama-bench.jsonl (not a run folder)")
            bench = read_llama_bench(path)
        except PrefetchSimError as exc:
            print(f"split: error: {exc}", file=sys.stderr)
            return 2
        lab = label(bench) if len(bench) else pd.Series(dtype=str)
        print(f"{run}: {plural(int((lab == 'fit').sum()), 'fit row')}, "
              f"{plural(int((lab == 'heldout').sum()), 'held-out row')}")
        if args.rows:
            for (line, r), split in zip(bench.iterrows(), lab):
                test = f"pp{int(r['n_prompt'])}" if int(r["n_gen"]) == 0 else f"tg{int(r['n_gen'])}"
                print(f"  line {line}: {Path(str(r.get('model_filename', ''))).stem} {test} {split}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
