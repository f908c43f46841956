"""Predicted vs measured over several run folders: each configuration's error pooled over every
model load on every machine that measured it.

``python -m calibrate.llamacpp.pool RUN_DIR [RUN_DIR ...] [--hardware H] [--out CSV] [--summary MD]``

One llama-bench row is one model load's mean over ``-r`` repetitions. On the lent H200s a
host-side decode moves by 10–33 % between model loads minutes apart and by up to 20 % between
machines of one kind (``data/llamacpp/README.md``: ``h200-20261203-tg4``, ``-tg5a``/``-tg5b``),
while one load's repetitions stay within 1–5 %; a prediction's error on one row then measures the
load as much as the model. This tool compares every folder as :mod:`calibrate.llamacpp.compare`
does (the same profile, the same held-out split of :mod:`calibrate.llamacpp.split`), then merges
the rows of one configuration from all folders:

* the configuration (:data:`POOL_KEY`): compare's :data:`~calibrate.llamacpp.compare.CONFIG_KEY`
  without the test name; for a decode test (``tg``) also without its length and the batch
  sizes, which set the prompt's graphs, not the decoded token's (tg32, tg128 and ``-ub`` 512 /
  2048 of one placement pool together);
* each row's log ratio ``log(measured / predicted)`` against its own prediction (so rows of
  different tg lengths or ubatch sizes compare alike); the pooled error is
  ``exp(-mean) - 1`` (predicted / measured - 1 of the geometric means), its standard error
  ``sd / sqrt(rows)`` and the rows' spread ``sd`` (ddof 1, one row: NaN) in log units
  (≈ fractions).

The summary is :func:`calibrate.llamacpp.compare.summarize` over configurations (one row per
configuration: ``rows`` counts configurations), beside the median spread between loads and the
median standard error of the pooled value in each group. A configuration's fit/held-out label is
its rows' (:func:`calibrate.llamacpp.split.is_fit_row` reads the configuration, not the machine).

Inputs: every folder is checked before any work; one given twice, whose ``llama-bench.jsonl``
is another's byte for byte (a copy: its rows are not other loads), or that shares a measured row
with another (the same test and ``samples_ns``: an edited copy,
:func:`calibrate.llamacpp.compare.check_distinct_runs`), is refused; two folders of
one name are told apart (``name#2``). The rows a folder cannot simulate are named on stderr as
``compare`` names them and left out of the pool.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import numpy as np
import pandas as pd

from sim.errors import ScenarioError

from .compare import (BENCH_FILE, CONFIG_KEY, _config_keys, _groups, add_common_args, check_common_args,
                      check_outputs_spare_inputs,
                      check_distinct_runs, check_run_dir, compare, hardware_path, run_cli, say_unsimulated, summarize,
                      warnings, write_outputs)

#: the columns of a pooled configuration: :data:`CONFIG_KEY` without ``test``, with ``kind``
POOL_KEY = tuple(k for k in CONFIG_KEY if k != "test") + ("kind",)
#: of :data:`POOL_KEY`, the columns a decode (``tg``) row does not keep: its length and the batch sizes
TG_FREE = ("n_gen", "n_ubatch", "n_batch")
#: columns of :func:`pool`'s result
POOL_COLUMNS = ("config", "model", "kind", "regime", "split", "n_rows", "n_runs", "runs", "measured_ts_mean",
                "predicted_ts_mean", "rel_error", "log_ratio_sd", "log_ratio_sem", "min_rel_error", "max_rel_error")


def config_label(row: pd.Series, default_threads: int | None = None) -> str:
    """A configuration as llama-bench flags: ``qwen3moe -ncmoe 24 -d 8192 -t 8 tg`` (only the flags
    that differ from llama-bench's defaults, the batch sizes of a prompt test). ``-t N``: the row's
    ``n_threads`` when it is not ``default_threads`` (llama-bench's default, the machine's math
    cores; :func:`sim.cli.benchflags.default_threads` of the profile); with ``default_threads``
    None, never."""
    parts = [str(row["model"]).split()[0]]
    ngl = row.get("ngl")
    if pd.notna(ngl) and int(ngl) < 99:
        parts.append(f"-ngl {int(ngl)}")
    if pd.notna(row.get("n_cpu_moe")) and int(row["n_cpu_moe"]) > 0:
        parts.append(f"-ncmoe {int(row['n_cpu_moe'])}")
    ot = row.get("ot")
    if isinstance(ot, str) and ot not in ("", "none"):
        parts.append(f"-ot {ot}")
    if pd.notna(row.get("n_depth")) and int(row["n_depth"]) > 0:
        parts.append(f"-d {int(row['n_depth'])}")
    lm = row.get("load_mode")
    if isinstance(lm, str) and lm not in ("", "none"):
        parts.append(f"-lm {lm}")
    for col, flag, default in (("flash_attn", "-fa", None), ("type_k", "-ctk", "f16"), ("type_v", "-ctv", "f16")):
        v = row.get(col)
        if isinstance(v, str) and v not in ("", default) and not (col == "flash_attn" and v in ("1", "on", "True")):
            parts.append(f"{flag} {v}")
    var = row.get("variant")
    if isinstance(var, str) and var not in ("", "baseline"):
        parts.append(f"[{var}]")
    nt = row.get("n_threads")
    if default_threads is not None and pd.notna(nt) and int(nt) > 0 and int(nt) != int(default_threads):
        parts.append(f"-t {int(nt)}")
    hf = row.get("host_flags")
    if isinstance(hf, str) and hf:
        parts.append(hf)
    if row["kind"] == "tg":
        parts.append("tg")
    else:
        parts.append(f"pp{int(row['n_prompt'])}" + (f"+tg{int(row['n_gen'])}" if row["kind"] == "pp+tg" else "")
                     + f" -ub {int(row['n_ubatch'])}" + (f" -b {int(row['n_batch'])}"
                                                         if int(row["n_batch"]) != 2048 else ""))
    return " ".join(parts)


def pool(frames: Sequence[tuple[str, pd.DataFrame]], default_threads: int | None = None) -> pd.DataFrame:
    """Pool :func:`calibrate.llamacpp.compare.compare` results of several run folders.

    Args:
        frames: ``(run label, compare's frame)`` per folder; rows without a positive measured
            and predicted t/s are left out.
        default_threads: ``-t``'s default (the profile's host CPUs): a configuration of another
            ``n_threads`` says ``-t N`` in its label. None: the most common ``n_threads`` of the
            pooled rows, so that configurations apart only by their thread count are labelled
            apart.

    Returns:
        One row per configuration (:data:`POOL_COLUMNS`, in first-seen order): its label
        (:func:`config_label`), test kind, regime and split (its first row's), rows pooled, run
        folders and their labels (``+``-joined), the plain means of the rows' measured and
        predicted t/s (for reading; rows of different tg lengths make them approximate),
        ``rel_error`` the pooled error ``exp(-mean log(measured/predicted)) - 1``, the log
        ratios' standard deviation between rows (NaN for one row) and standard error of their
        mean, and the smallest and largest row error (predicted / measured - 1).
    """
    parts = []
    for label, df in frames:
        ok = df[(df.measured_ts > 0) & (df.predicted_ts > 0)].copy()
        ok["run"] = label
        parts.append(ok)
    if not parts or all(p.empty for p in parts):
        return pd.DataFrame(columns=list(POOL_COLUMNS))
    rows = pd.concat([p for p in parts if not p.empty], ignore_index=True)
    keyed = rows.copy()
    tg = keyed.kind == "tg"
    for col in TG_FREE:  # a decode row's length and batch sizes do not make another configuration
        keyed[col] = keyed[col].astype(object)
        keyed.loc[tg, col] = ""
    keys = _config_keys(keyed, POOL_KEY)
    if default_threads is None and "n_threads" in rows:
        counts = pd.to_numeric(rows.n_threads, errors="coerce").dropna().astype(int).value_counts()
        default_threads = int(counts.index[0]) if len(counts) else None
    out = []
    for _k, idx in rows.groupby(keys, sort=False).groups.items():
        g = rows.loc[idx]
        lr = np.log(g.measured_ts / g.predicted_ts)
        first = g.iloc[0]
        n = len(g)
        sd = float(lr.std(ddof=1)) if n > 1 else math.nan
        err = g.predicted_ts / g.measured_ts - 1
        out.append(dict(config=config_label(first, default_threads), model=first["model"], kind=first["kind"], regime=first["regime"],
                        split=first.get("split"), n_rows=n, n_runs=int(g.run.nunique()),
                        runs="+".join(dict.fromkeys(g.run.astype(str))),
                        measured_ts_mean=float(g.measured_ts.mean()), predicted_ts_mean=float(g.predicted_ts.mean()),
                        rel_error=float(math.exp(-lr.mean()) - 1), log_ratio_sd=sd,
                        log_ratio_sem=sd / math.sqrt(n) if n > 1 else math.nan,
                        min_rel_error=float(err.min()), max_rel_error=float(err.max())))
    return pd.DataFrame(out, columns=list(POOL_COLUMNS))


def pooled_markdown(pooled: pd.DataFrame, title: str, min_rows: int = 1) -> str:
    """The summary over configurations with at least ``min_rows`` rows (:func:`summarize`'s groups)
    with each group's median spread between loads and median standard error, then one line per
    configuration; percent."""
    use = pooled[pooled.n_rows >= min_rows]
    summ = summarize(use)

    def pct(x: float, signed: bool = False) -> str:
        return "" if not math.isfinite(x) else f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"

    spread = {name: (float(g.log_ratio_sd.median()) if g.log_ratio_sd.notna().any() else math.nan,
                     float(g.log_ratio_sem.median()) if g.log_ratio_sem.notna().any() else math.nan,
                     int(g.n_rows.sum()))
              for name, g in _groups(use)}
    lines = [title, "", "| group | configurations | rows | median abs(err) | p90 abs(err) | median err | "
             "median spread between loads | median std. error |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in summ.itertuples(index=False):
        sd, se, n = spread.get(r.group, (math.nan, math.nan, 0))
        lines.append(f"| {r.group} | {r.n_predicted} | {n} | {pct(r.median_abs_rel_error)} | {pct(r.p90_abs_rel_error)} | "
                     f"{pct(r.median_rel_error, True)} | {pct(sd)} | {pct(se)} |")
    from sim.views.report import md_escape

    lines += ["", "| configuration | split | rows | runs | pooled err | spread | std. error | rows' err min…max |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in use.itertuples(index=False):
        lines.append(f"| {md_escape(r.config)} | {r.split} | {r.n_rows} | {r.n_runs} | {pct(r.rel_error, True)} | "
                     f"{pct(r.log_ratio_sd)} | {pct(r.log_ratio_sem)} | {pct(r.min_rel_error, True)}…"
                     f"{pct(r.max_rel_error, True)} |")
    return "\n".join(lines) + "\n"


def plot_pooled(pooled: pd.DataFrame, path) -> None:
    """Pooled error per configuration with its standard error (±2), held-out and fit apart.

    Raises:
        ValueError: nothing to draw.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = pooled.dropna(subset=["rel_error"]).reset_index(drop=True)
    if p.empty:
        raise ValueError("no pooled configuration has a prediction")
    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.28 * len(p) + 1)))
    y = np.arange(len(p))
    se = p.log_ratio_sem.fillna(0.0).to_numpy() * 100
    for split, colour in (("heldout", "tab:blue"), ("fit", "tab:grey")):
        m = (p.split == split).to_numpy()
        if m.any():
            ax.errorbar(p.rel_error[m] * 100, y[m], xerr=2 * se[m], fmt="o", color=colour, label=split, capsize=2)
    ax.axvline(0, color="k", lw=0.8)
    for x in (-3, 3):
        ax.axvline(x, color="tab:green", lw=0.6, ls="--")
    ax.set_yticks(y, p.config, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("pooled error: predicted / measured − 1 (%), ±2 s.e.")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.pool",
                                 description="Predicted vs measured t/s pooled over run folders: each "
                                             "configuration's error over every model load on every machine; "
                                             "prints the summary and one line per configuration as markdown.")
    add_common_args(ap, out_help="write one row per configuration", figure_help="write the pooled errors",
                    summary_help="write the tables (markdown)", many=True)
    ap.add_argument("--kind", choices=("all", "pp", "tg"), default="all", help="only these tests (default all)")
    ap.add_argument("--min-rows", dest="min_rows", type=int, default=1, metavar="N",
                    help="summarise only configurations measured in at least N rows (model loads); default 1")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message on a bad input)."""
    args = build_parser().parse_args(argv)
    prog = "pool"

    def body() -> int:
        import os

        progress = check_common_args(args)
        if args.min_rows < 1:
            raise ScenarioError(f"must be >= 1, got {args.min_rows}", field="--min-rows")
        import hashlib

        seen: dict[str, str] = {}
        same: dict[str, str] = {}
        for d in args.run_dirs:  # every input before any work
            check_run_dir(d)
            real = os.path.realpath(d)
            if real in seen:
                raise ScenarioError(f"'{d}' is given twice (also as '{seen[real]}'); each run folder once",
                                    field="RUN_DIR")
            seen[real] = d
            bench = os.path.join(d, BENCH_FILE)
            if os.path.isfile(bench):  # a copy of another folder's rows would count its loads twice
                with open(bench, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
                if digest in same:
                    raise ScenarioError(f"'{d}' holds the same {BENCH_FILE} as '{same[digest]}': its rows would "
                                        "count as other model loads; give each run once", field="RUN_DIR")
                same[digest] = d
        check_distinct_runs(args.run_dirs)  # nor an edited copy: no measured row in two folders
        check_outputs_spare_inputs({"--out": args.out, "--figure": args.figure, "--summary": args.summary},
                                   args.run_dirs, [hardware_path(args.hardware)])
        frames = []
        name = None
        labels: dict[str, int] = {}
        for d in args.run_dirs:
            df = compare(d, args.hardware, args.engine, repetitions=args.repetitions, jobs=args.jobs,
                         progress=progress, max_work=args.max_work)
            name = df.attrs.get("hardware", name)
            say_unsimulated(prog, df, run=d)  # left out of the pool: said, as compare says it
            for w in warnings(df):  # another GPU than the profile's, another model file: as compare
                print(f"{prog}: warning: {d}: {w}", file=sys.stderr)
            if args.kind != "all":
                df = df[df.kind == args.kind]
            label = os.path.basename(os.path.normpath(d))
            labels[label] = labels.get(label, 0) + 1
            if labels[label] > 1:  # two folders of one name stay two runs
                label = f"{label}#{labels[label]}"
            frames.append((label, df))
        from sim.model.specs import load_hardware

        # -t's default: the machine the profile's CPU figures come from ([measured] host_cpus,
        # sim.cli.benchflags.default_threads), else the pooled rows' most common thread count
        host_cpus = (load_hardware(hardware_path(args.hardware)).measured or {}).get("host_cpus")
        pooled = pool(frames, int(host_cpus) if str(host_cpus).isdigit() and int(host_cpus) > 0 else None)
        if pooled.empty:
            raise ScenarioError("no row with a measured and a predicted t/s in these run folders"
                                + (f" (--kind {args.kind})" if args.kind != "all" else ""), field="RUN_DIR")
        most = int(pooled.n_rows.max())
        if most < args.min_rows:
            raise ScenarioError(f"no configuration has {args.min_rows} or more rows (the most: {most} "
                                f"row{'s' if most != 1 else ''})", field="--min-rows")
        title = (f"Pooled over {len(frames)} run folder{'s' if len(frames) != 1 else ''} ({', '.join(f for f, _ in frames)}) on profile '{name}' "
                 f"({args.hardware}) ({args.engine} engine, {args.repetitions} routing draws per MoE row): each "
                 f"configuration's error over all its rows (model loads), predicted / measured - 1 of the geometric "
                 f"means" + (f"; configurations of >= {args.min_rows} rows" if args.min_rows > 1 else ""))
        md = pooled_markdown(pooled, title, args.min_rows)
        write_outputs(args, prog, pooled, md, plot_pooled)
        return 0

    return run_cli(prog, body, args)


if __name__ == "__main__":
    sys.exit(main())
