"""Predicted VRAM against llama.cpp's own figures in the committed lease logs.

Each llama-bench invocation of a lease ran with ``-v`` and the project's patches, so its log holds,
per test context, llama.cpp's ``sched_reserve: CUDA0 compute buffer size = X MiB`` and then the
patch's ``prefetch-sim vram: model=... test=P/G/D ub=U pw=.. pwg=.. pes=.. used_mib=.. staging_mib=..``
(``cudaMemGetInfo``'s used memory once the context exists). :func:`log_records` reads those pairs;
:func:`check` matches them to the run folder's llama-bench rows (invocation, test, ubatch, prefetch
fields) and prices each row's context with :func:`sim.model.vram.account` on GPU 0: the compute
buffer against llama.cpp's, the total (reserved included) against ``used_mib``. A key whose
context sizes differ between its rows (``-fa on,off`` in one invocation: the log line does not
name ``-fa``) is left out.

``python -m calibrate.llamacpp.vramcheck [RUN_DIR ...] [--hardware TOML] [--out CSV]`` (default:
every folder of ``data/llamacpp`` with a ``logs.tar.gz`` and an ``invocations.jsonl``)
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

import pandas as pd

from sim.errors import PrefetchSimError

_CB = re.compile(r"sched_reserve:\s+CUDA0 compute buffer size =\s+([\d.]+) MiB")
_VRAM = re.compile(r"prefetch-sim vram: model=\S+ test=(\d+)/(\d+)/(\d+) ub=(\d+) pw=(\d+) pwg=(\d+) pes=(\d+) "
                   r"used_mib=([\d.]+) staging_mib=([\d.]+)")


def log_records(run_dir: str | Path) -> pd.DataFrame:
    """``invocation, n_prompt, n_gen, n_depth, n_ubatch, pw, pwg, pes, compute_mib, used_mib``:
    one row per test context of each log in ``run_dir/logs.tar.gz`` (the log named after its
    invocation id) that printed both lines; empty without such logs.

    Raises:
        PrefetchSimError: an unreadable archive.
    """
    path = Path(run_dir) / "logs.tar.gz"
    rows = []
    if not path.is_file():
        return pd.DataFrame(rows)
    try:
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                if not (m.isfile() and m.name.endswith(".log")):
                    continue
                inv = Path(m.name).name[:-4]
                cb = None
                for ln in tf.extractfile(m).read().decode("utf-8", "replace").splitlines():
                    c = _CB.search(ln)
                    if c:
                        cb = float(c.group(1))
                        continue
                    v = _VRAM.search(ln)
                    if v and cb is not None:
                        p, g, d, ub, pw, pwg, pes = (int(x) for x in v.groups()[:7])
                        rows.append(dict(invocation=inv, n_prompt=p, n_gen=g, n_depth=d, n_ubatch=ub, pw=pw, pwg=pwg,
                                         pes=pes, compute_mib=cb, used_mib=float(v.group(8))))
                        cb = None
    except (OSError, tarfile.TarError) as exc:
        raise PrefetchSimError(f"{path}: cannot read the lease logs ({exc})") from None
    return pd.DataFrame(rows)


def check(run_dir: str | Path, hardware) -> pd.DataFrame:
    """Predicted against measured VRAM of ``run_dir``'s rows (module docstring): ``run, invocation,
    model, test, n_ubatch, compute_mib, predicted_compute_mib, used_mib, predicted_total_mib``."""
    from sim.model.vram import account

    from .compare import build_cases

    logs = log_records(run_dir)
    if logs.empty:
        return pd.DataFrame()
    key = ["invocation", "n_prompt", "n_gen", "n_depth", "n_ubatch", "pw", "pes"]
    sizes = logs.groupby(key)["compute_mib"].nunique()
    logs = logs.drop_duplicates(key).set_index(key)
    bench, owners, cases, _extra = build_cases(run_dir, hardware, repetitions=1)
    out = []
    for i, case in enumerate(cases):
        if case is None or case.scenario is None:
            continue
        row = bench.iloc[i]
        inv = owners[i]
        k = (inv.get("id") if isinstance(inv, dict) else inv, int(row["n_prompt"]), int(row["n_gen"]),
             int(row["n_depth"]), int(row["n_ubatch"]), int(row.get("prefetch_weights", 0) or 0),
             int(row.get("prefetch_expert_slots", 0) or 0))
        if k not in logs.index or sizes.get(k, 0) != 1:
            continue
        scn = case.scenario
        try:
            b = account(scn, scn.variants[0])[0]
        except PrefetchSimError:
            continue
        got = logs.loc[k]
        out.append(dict(run=Path(run_dir).name, invocation=k[0], model=scn.model.name,
                        test=f"{k[1]}/{k[2]}/{k[3]}", n_ubatch=k[4], compute_mib=float(got["compute_mib"]),
                        predicted_compute_mib=b.compute_bytes / 2**20, used_mib=float(got["used_mib"]),
                        predicted_total_mib=b.total_bytes / 2**20))
    return pd.DataFrame(out).drop_duplicates(["invocation", "test", "n_ubatch"])


def summary(df: pd.DataFrame) -> str:
    """Median / p90 / max |error| of the compute buffer and of the total, as markdown."""
    lines = ["| figure | rows | median abs(err) | p90 abs(err) | max abs(err) | median err |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, pred, meas in (("compute buffer (llama.cpp's sched_reserve)", "predicted_compute_mib", "compute_mib"),
                             ("total (cudaMemGetInfo used)", "predicted_total_mib", "used_mib")):
        e = df[pred] / df[meas] - 1
        lines.append(f"| {name} | {len(e)} | {e.abs().median():.1%} | {e.abs().quantile(0.9):.1%} | "
                     f"{e.abs().max():.1%} | {e.median():+.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m calibrate.llamacpp.vramcheck``."""
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.vramcheck",
                                 description="Predicted VRAM (compute buffer, total) against llama.cpp's own figures "
                                             "in lease logs.")
    ap.add_argument("runs", nargs="*", help="run folders (default: every lease folder of data/llamacpp with logs)")
    ap.add_argument("--hardware", default="scenarios/hardware/h200-llamacpp.toml", help="hardware profile")
    ap.add_argument("--out", default=None, metavar="CSV", help="write one row per context")
    args = ap.parse_args(argv)
    import warnings

    from sim.model.specs import load_hardware

    from .compare import hardware_path, resolve

    try:
        hw_file = hardware_path(args.hardware)
        hw = load_hardware(hw_file)
        for r in args.runs:
            if not Path(r).is_dir():
                raise PrefetchSimError(f"{r}: no such run folder")
        runs = args.runs or sorted(str(p.parent) for p in resolve("data/llamacpp").glob("*/logs.tar.gz")
                                   if (p.parent / "invocations.jsonl").is_file())
        if args.out:   # before any work: --out must not replace a run's measurements, the profile or its tables
            from .compare import check_outputs_spare_inputs

            check_outputs_spare_inputs({"--out": args.out}, runs, [str(hw_file)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            frames = [check(r, hw) for r in runs]
        df = pd.concat([f for f in frames if not f.empty], ignore_index=True) if any(not f.empty for f in frames) \
            else pd.DataFrame()
        if df.empty:
            raise PrefetchSimError("no row with llama.cpp's compute buffer line in the given run folders' logs")
        if args.out:
            from sim.atomic import write_atomic

            write_atomic(args.out, df.to_csv(index=False))
        print(f"VRAM predicted ({hw.name}) against llama.cpp's own, {len(df)} test contexts of {df['run'].nunique()} "
              "lease(s)\n")
        print(summary(df))
    except PrefetchSimError as exc:
        print(f"vramcheck: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    raise SystemExit(run_interruptible("vramcheck", main))  # Ctrl-C / SIGTERM: one line, 130 / 143; | head: 141
