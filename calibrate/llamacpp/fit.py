"""Fill the ``[ggml]`` numbers of a llama.cpp-calibrated hardware profile.

``python -m calibrate.llamacpp.fit --profile scenarios/hardware/h200-llamacpp.toml
--run data/llamacpp/h200-20261201 --kernels data/llamacpp/h200-20261201-kernels [--write]``

Two kinds of number, kept apart (the held-out split of :mod:`calibrate.llamacpp.split`):

* **measured** from llama.cpp's own kernels, no llama-bench row involved:

  - ``ew_gb_per_s``: the elementwise kernels of an ``ncu`` profile of llama-bench's pp2048
    (ubatch 2048) on Qwen3-30B-A3B (``ncu/qwen3-pp2048-ub2048-fa1.csv``: :data:`EW_KERNELS`),
    their f32 bytes (:func:`sim.model.ggmlcost.layer_elementwise`) over their summed time;
  - ``cpu_op_us``: the intercept of a least-squares line ``t = a + bytes / rate`` through the
    CPU table's single-matrix matvecs up to 16 MiB;
  - ``cpu_ew_gb_per_s``: the median of the CPU's cold matvec rates (streaming through DRAM);
  - ``attn_kv_cold_gb_per_s``: the cold K/V read of attention in a graph, from ``ncu`` of
    llama-bench decode at depth (``--depth``: :func:`kv_cold_rate`);
  - ``split_us``: the host time of a split on the GPU, its compute call in decode graphs timed
    split by split in llama-bench (``--splits``: :func:`calibrate.llamacpp.splittime.gpu_split_host`;
    ``--params split_us`` fits it instead);
  - ``cpu_get_rows_gb_per_s`` and ``cpu_set_rows_gb_per_s``: ggml-cpu's one-thread GET_ROWS (the
    token embedding) and SET_ROWS (a CPU layer's KV store) timed split by split in llama-bench
    itself (a split-timing lease, ``--splits``: :func:`calibrate.llamacpp.splittime.rows_rates`);
  - ``fa_extra_us_2``, ``fa_extra_us_4``, ``fa_extra_us_8``, ``f32_mmf_us`` and
    ``matvec_column_tmac_per_s``: GPU kernels at 2-8 tokens per ubatch, from ``ncu`` of
    llama-bench prompts at ubatch 1-8 (``--small-batch``:
    :func:`calibrate.llamacpp.smallbatch.small_batch_numbers`);
  - ``mask_ns``, ``call_us``, ``call_ns_per_token``, ``apply_ns_per_token``,
    ``build_us_per_layer``, ``capture_us_per_layer``: llama.cpp's host work around each graph
    (the KQ masks, the ``llama_decode`` call, the memory apply, the build of a graph it does
    not reuse, the capture of a reused graph's CUDA graph), timed in
    llama-bench itself (a phase-timing lease, ``--phases``:
    :func:`calibrate.llamacpp.phasetime.host_figures`);

* **fitted** on the fit rows of the ground truth only (:mod:`calibrate.llamacpp.split`):
  ``kernel_floor_us`` (one small kernel in a graph), ``graph_us`` (host time per graph),
  ``cpu_split_us`` (host time per split on the CPU backend) and ``launch_us`` (host time per kernel of a graph llama.cpp
  builds anew, run without a CUDA graph) and
  ``cpu_rate_scale`` (the CPU backend's matvec throughput in a llama-bench graph relative to the
  CPU table's cold cases: the split-timing lease shows decode's CPU splits 1.6-2.1x slower than
  those cases give, and the machines lent differ in CPU speed by up to 25 %, so it is set on
  the ground truth's own machine), by
  Gauss-Newton on the relative error of the predicted test time (finite-difference Jacobian,
  non-negative, a few iterations), each row's prediction from the simulator itself (analytic
  engine, one routing draw).

Without ``--write`` it prints the values; with it, it rewrites those lines of the profile.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from sim.errors import PrefetchSimError, ScenarioError
from sim.wording import plural

from .compare import INVOCATIONS_FILE, host_samples, jsonl_objects, non_negative_pct, steal_over

#: why a row of a timed invocation is left out under --untimed (:func:`fit_rows`)
UNTIMED_REASON = "its invocation ran with a timing patch on (--untimed)"

#: the elementwise kernels of a Qwen3-MoE layer in ggml-cuda (kernel names in ncu)
EW_KERNELS = ("rms_norm_mul_rope_f32", "rms_norm_f32", "k_bin_bcast", "unary_gated_op_kernel",
              "moe_weighted_reduction_f32", "topk_moe_cuda", "k_set_rows")
#: numbers of FITTED that a full fill (no --params) measures instead (split_us: the split timing)
MEASURED_BY_DEFAULT = ("split_us",)
#: [ggml] numbers a profile may lack (set_values adds their line after the named one's)
OPTIONAL_KEYS = {"cpu_split_us": "split_us",  # key -> the line it goes after
                 "fa_extra_us_2": "attn_kv_cold_gb_per_s", "fa_extra_us_4": "fa_extra_us_2",
                 "fa_extra_us_8": "fa_extra_us_4", "f32_mmf_us": "fa_extra_us_8",
                 "matvec_column_tmac_per_s": "f32_mmf_us"}
#: fit rows needed per fitted number (fewer: the fit is refused)
MIN_ROWS_PER_PARAMETER = 3
#: the fitted numbers: ([ggml] key, GgmlKernels field, TOML unit scale, start value, step)
FITTED = (("kernel_floor_us", "floor_s", 1e-6, 2e-6, 0.5e-6), ("graph_us", "graph_s", 1e-6, 100e-6, 50e-6),
          ("split_us", "split_s", 1e-6, 50e-6, 20e-6), ("cpu_split_us", "cpu_split_s", 1e-6, 50e-6, 20e-6),
          ("launch_us", "launch_s", 1e-6, 2e-6, 1e-6), ("cpu_rate_scale", "cpu_rate_scale", 1.0, 0.6, 0.05))


def read_ncu(path: str | Path) -> pd.DataFrame:
    """A compact ncu kernel list (``id, kernel, grid, block, duration_ns, name``)."""
    return pd.read_csv(path)


def ew_rate(kernels_dir: str | Path, model_toml: str = "scenarios/models/qwen3-30b-a3b.toml",
            profile: str = "qwen3-pp2048-ub2048-fa1", n_tokens: int = 2048) -> tuple[float, str]:
    """Measured elementwise rate (bytes/s) and its source text (module docstring)."""
    from sim.model.ggmlcost import layer_elementwise
    from sim.model.specs import load_model

    from .compare import resolve

    model = load_model(resolve(model_toml))  # from any folder: the shipped files too
    path = Path(kernels_dir) / "ncu" / f"{profile}.csv"
    if not path.is_file():
        raise PrefetchSimError(f"--kernels {kernels_dir}: no {path.relative_to(kernels_dir)} (a kernel lease "
                               "folder with its ncu profiles, e.g. data/llamacpp/h200-20261201-kernels)")
    df = read_ncu(path)
    ew = df[df["kernel"].isin(EW_KERNELS)]
    t = ew["duration_ns"].sum() * 1e-9
    elems = sum(layer_elementwise(model, i)[1] for i in range(model.n_layer))
    nbytes = 4.0 * elems * n_tokens
    rate = nbytes / t
    return rate, (f"measured: {len(ew)} elementwise kernels ({', '.join(EW_KERNELS)}) of an ncu profile of "
                  f"llama-bench pp{n_tokens} -ub {n_tokens} on {model.name} ({profile}.csv), "
                  f"{nbytes / 1e9:.2f} GB of f32 in {t * 1e3:.2f} ms (sim.model.ggmlcost.layer_elementwise)")



def read_ncu_raw(path: str | Path) -> pd.DataFrame:
    """An ``ncu --csv --page raw`` log (gzipped or plain) as ``kernel, ns`` rows in launch order:
    the ``==PROF==`` lines and the units row dropped, the kernel's short name from its
    signature, ``gpu__time_duration.sum`` in ns."""
    import io

    from .logs import read_text

    text = "".join(ln for ln in read_text(path).splitlines(keepends=True) if not ln.startswith("=="))
    x = pd.read_csv(io.StringIO(text), low_memory=False)
    ns = pd.to_numeric(x["gpu__time_duration.sum"].astype(str).str.replace(",", ""), errors="coerce")
    out = pd.DataFrame({"kernel": x["Kernel Name"].astype(str).str.extract(r"^(?:void )?([A-Za-z_0-9:]+)")[0], "ns": ns})
    return out[out["ns"].notna()].reset_index(drop=True)


def kv_cold_rate(depth_dir: str | Path, hw, model_toml: str = "scenarios/models/qwen3-30b-a3b.toml",
                 depth: int = 8192, n_gen: int = 4) -> tuple[float, str]:
    """``attn_kv_cold_gb_per_s`` (bytes/s) from ``ncu`` of llama-bench decode at depth
    (``scripts/h200_depth_ncu.sh``): the attention kernels of the last decoded token at depth
    ``depth`` per layer, against the kernel table's (L2-hot) FlashAttention time at the same
    keys; the layer's f16 K/V bytes over the difference. The per-token kernel count comes from
    the depth-0 run (``n_gen`` decoded tokens and nothing else).

    Raises:
        PrefetchSimError: a profile missing, or the in-graph time not above the table's.
    """
    from sim.model.ggmlcost import attended_keys, kv_cache_bytes, pad_cells
    from sim.model.specs import load_model

    from .compare import resolve

    d = Path(depth_dir)
    try:
        x0 = read_ncu_raw(d / "ncu-qwen3-tg-d0.csv.gz")
        x8 = read_ncu_raw(d / f"ncu-qwen3-tg-d{depth}.csv.gz")
    except (OSError, KeyError, ValueError) as exc:
        raise PrefetchSimError(f"--depth {d}: cannot read the ncu decode profiles ({exc})") from None
    per_token = len(x0) // n_gen
    last = x8.iloc[-per_token:]
    m = load_model(resolve(model_toml))  # from any folder: the shipped files too
    fa_s = float(last[last["kernel"].str.startswith("flash_attn")]["ns"].sum()) * 1e-9 / m.n_layer
    keys = attended_keys(1, depth + n_gen - 1, 0)
    g = hw.ggml
    table_s = g._attn_op("gpu", "FA", 1, pad_cells(keys), m.n_head, m.n_head_kv, m.head_dim, raw=True)
    nbytes = kv_cache_bytes(pad_cells(keys), m.n_head_kv, m.head_dim)
    if table_s is None or fa_s <= table_s:
        raise PrefetchSimError(f"--depth {d}: in-graph attention {fa_s * 1e6:.1f} us per layer is not above the "
                               f"table's {table_s}: nothing to price")
    rate = nbytes / (fa_s - table_s)
    return rate, (f"measured: ncu of llama-bench decode at depth {depth} ({d.as_posix()}, {m.name}): "
                  f"attention {fa_s * 1e6:.1f} us per layer in the graph against the table's L2-hot "
                  f"{table_s * 1e6:.1f} us at {pad_cells(keys)} cells; {nbytes / 2**20:.1f} MiB of K/V over the "
                  "difference (calibrate.llamacpp.fit.kv_cold_rate)")

def cpu_numbers(hw, table: str | Path | None = None) -> dict[str, tuple[float, str]]:
    """``cpu_op_us`` and ``cpu_ew_gb_per_s`` from the CPU table (module docstring); ``table``:
    the table's file, named in the sources (None: "the CPU table", the profile's own)."""
    from sim.model.quant import ggml_nbytes

    name = f"the CPU table {Path(table).as_posix()}" if table else "the CPU table"

    tab = hw.ggml.cpu
    t = tab[(tab["op"] == "MUL_MAT") & (tab["bs"].fillna(1) == 1) & (tab["n"] == 1)]
    b = np.array([ggml_nbytes(str(r["type"]), int(r["m"]) * int(r["k"])) for _, r in t.iterrows()], float)
    y = t["t_us"].to_numpy(float) * 1e-6
    keep = b <= 16 * 2**20
    slope, icpt = np.polyfit(b[keep], y[keep], 1)
    cold = [v for (bk, _ty), v in hw.ggml._cold.items() if bk == "cpu"]
    return {"cpu_op_us": (max(icpt, 0.0) * 1e6, f"measured: intercept of a line through {name}'s "
                          f"{int(keep.sum())} single matvecs up to 16 MiB (rate {1 / slope / 1e9:.0f} GB/s)"),
            "cpu_ew_gb_per_s": (float(np.median(cold)) / 1e9, f"measured: median of {name}'s cold "
                                f"matvec rates ({plural(len(cold), 'type')}, cold cases over 2 GiB): a DRAM stream, as "
                                "the elementwise ops of a CPU layer are")}


def with_cpu_table(text: str, table: str | Path, dst: str | Path) -> str:
    """A profile's text whose ``cpu_kernels`` reads ``table`` from a copy written at ``dst``
    (a path relative to ``dst``'s folder).

    Raises:
        PrefetchSimError: ``table`` is not a file, or the profile has no ``cpu_kernels`` line.
    """
    if not Path(table).is_file():
        raise PrefetchSimError(f"--cpu-table {table}: no such file")
    rel = table_path_from(table, dst)
    out, n = re.subn(r"""(?m)^(\s*cpu_kernels\s*=\s*)(?:"[^"\\]*"|'[^']*')""", lambda m: f'{m.group(1)}"{rel}"', text)
    if n != 1:
        raise PrefetchSimError("--cpu-table: the profile has no [ggml] cpu_kernels line to point at it")
    return out


def load_profile_text(text: str, dst: str | Path, table: str | Path | None):
    """The hardware profile ``text`` as it will read once written at ``dst`` (loaded from a
    temporary file in ``dst``'s folder, removed again, as are the folders made for it), with
    the CPU table ``table`` (None: the one the text names).

    Raises:
        PrefetchSimError: the profile, with the table ``table``, does not load (the message of
            :func:`sim.model.specs.load_hardware`, after the name of ``table``).
    """
    import tempfile

    from sim.errors import ScenarioError
    from sim.model.ggmlcost import read_table
    from sim.model.specs import load_hardware

    folder = Path(dst).resolve().parent
    try:  # the table first, so that a bad one is named as the user gave it
        if table is not None:
            read_table(table)
    except FileNotFoundError:
        raise PrefetchSimError(f"--cpu-table {table}: file not found") from None
    except ScenarioError as exc:
        raise PrefetchSimError(f"--cpu-table {table}: {exc.reason}") from None
    except (ValueError, OSError) as exc:
        why = " ".join(str(exc).split())[:160]
        raise PrefetchSimError(f"--cpu-table {table}: not a kernel table CSV ({exc.__class__.__name__}: {why}); "
                               "write one with python -m calibrate.llamacpp.perf_cases table") from None
    # --out's folder may not exist yet (write_atomic creates it with the copy): the folders made
    # here for the trial load are removed again, so a fit that fails leaves nothing behind
    made = []
    p = folder
    while not p.exists():
        made.append(p)
        p = p.parent
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".toml", prefix=".fit-", dir=folder)
        except OSError as exc:
            raise PrefetchSimError(f"--out {dst}: cannot write in folder {folder} ({exc.strerror or exc})") from None
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            return load_hardware(tmp)
        except PrefetchSimError as exc:
            raise PrefetchSimError(f"--cpu-table {table}: {exc}" if table is not None else str(exc)) from None
        finally:
            os.unlink(tmp)
    finally:
        for d in made:  # the deepest first
            try:
                d.rmdir()
            except OSError:
                pass


def other_gpu_warnings(run_dir: str | Path, hw, rows: pd.DataFrame | None = None) -> list[str]:
    """One line if ``run_dir``'s llama-bench rows (``rows``, e.g. the fit rows :func:`fit_rows`
    returns; else read from the folder) were measured on another GPU than the profile ``hw``'s
    (:func:`calibrate.llamacpp.compare.other_gpus`, as a comparison's warnings check it): the
    fitted numbers would then describe that machine under this profile's name and GPU figures.
    Empty when they match or either is unknown."""
    from .compare import BENCH_FILE, other_gpus

    if rows is None:
        from sim.views.llamabench import read_llama_bench

        path = Path(run_dir) / BENCH_FILE
        if not path.is_file():
            return []
        rows = read_llama_bench(path)
    other = other_gpus(rows["gpu_info"].dropna() if "gpu_info" in rows.columns else [], hw.gpu_name)
    if not other:
        return []
    return [f"--run {run_dir} was measured on {', '.join(other)}, the profile '{hw.name}' is {hw.gpu_name}: the "
            "fitted numbers describe that machine under this profile's name and GPU figures (rename the copy, or "
            "start from a profile of that GPU)"]


def fit_rows(run_dir: str | Path, hw, repetitions: int = 1, skip_invocations=()):
    """The fit rows' cases and measured test times (s): ``(cases, t_measured, rows)``. A fit row
    that cannot be simulated, and a row its invocation's command line did not ask for, are left
    out with one line each on stderr; so are the rows of the invocations named in
    ``skip_invocations`` (ids, e.g. :func:`timed_invocations`, said as timed; or a mapping of id to
    the reason to say)."""
    from .compare import build_cases
    from .split import label

    bench, owners, cases, notes = build_cases(run_dir, hw, repetitions=repetitions)
    lab = label(bench)
    skip = (dict(skip_invocations) if isinstance(skip_invocations, Mapping)
            else dict.fromkeys(skip_invocations, UNTIMED_REASON))
    skipped = {i: skip[(owners[i] or {}).get("id")] for i in range(len(bench))
               if lab.iloc[i] == "fit" and (owners[i] or {}).get("id") in skip}
    keep = [i for i in range(len(bench)) if lab.iloc[i] == "fit" and cases[i] is not None
            and cases[i].scenario is not None and i not in skipped]
    disagree = bench.attrs.get("disagreements", {})
    for i in range(len(bench)):  # a row left out (a fit row, or one its invocation did not ask for) is said
        line = bench.index[i]  # llama-bench.jsonl's line, as compare's ``line`` column
        if line in disagree or (lab.iloc[i] == "fit" and i not in keep):
            why = (skipped[i] if i in skipped else
                   disagree.get(line) or notes[i] or ("; ".join(cases[i].notes) if cases[i] is not None else "")
                   or "no model for the row")
            print(f"fit: {run_dir}: row at line {line} not used: {why}", file=sys.stderr)
    t_meas = []
    for i in keep:
        r = bench.iloc[i]
        n = int(r["n_prompt"]) + int(r["n_gen"])
        t_meas.append(n / float(r["avg_ts"]))
    return [cases[i] for i in keep], np.array(t_meas), bench.iloc[keep]


def _one(args):
    from .compare import predict

    scn, tests, hw = args
    ts, _sd = predict(scn.with_(hardware=hw), tests, repetitions=1)
    return sum(t.n_tokens for t in tests) / ts


def predict_times(cases, hw, values: dict[str, float], jobs: int = 2) -> np.ndarray:
    """Predicted test times (s) of ``cases`` on ``hw`` with its ``[ggml]`` fields set to ``values``."""
    from sim.cli.interrupt import WorkerPool

    hw2 = hw.with_(ggml=replace(hw.ggml, **values))
    work = [(c.scenario, tuple(c.tests), hw2) for c in cases]
    if jobs <= 1:
        return np.array([_one(w) for w in work])
    with WorkerPool(jobs) as ex:  # an interruption stops the workers at once
        return np.array(list(ex.map(_one, work)))


#: the environment switches of the timing patches (calibrate.llamacpp.splittime, phasetime)
TIMING_ENV = ("PREFETCH_SIM_SPLIT_TIME", "PREFETCH_SIM_PHASE_TIME")


def timed_invocations(run_dir: str | Path) -> list[str]:
    """The ids of a run folder's llama-bench invocations that ran with a timing patch switched on
    (:data:`TIMING_ENV` in their ``env``); [] when there is none or no readable invocation file."""
    from .compare import INVOCATIONS_FILE, read_invocations

    try:
        invs = read_invocations(Path(run_dir) / INVOCATIONS_FILE)
    except (PrefetchSimError, OSError):
        return []
    return [str(i.get("id")) for i in invs
            if i.get("kind", "bench") == "bench" and any(k in (i.get("env") or {}) for k in TIMING_ENV)]


def select_fitted(names: str | None) -> tuple:
    """The rows of :data:`FITTED` named in the comma list ``names`` (``[ggml]`` keys), in
    :data:`FITTED`'s order; for None, all but :data:`MEASURED_BY_DEFAULT` (measured in a full
    fill, fitted only when named).

    Raises:
        PrefetchSimError: an unknown or repeated name, or an empty list.
    """
    if names is None:
        return tuple(row for row in FITTED if row[0] not in MEASURED_BY_DEFAULT)
    want = [n.strip() for n in names.split(",")]
    known = [k for k, *_ in FITTED]
    bad = [n for n in want if n not in known]
    if bad or not want or len(set(want)) != len(want):
        raise PrefetchSimError(f"--params {names!r}: a comma list of distinct names among {', '.join(known)}"
                               + (f" ({', '.join(repr(b) for b in bad)} unknown)" if bad else ""))
    return tuple(row for row in FITTED if row[0] in want)


def clamp_fitted(value: float, step: float) -> float:
    """A fitted value as written: 0 when within ``1e-6 * step`` of zero or below (the active
    set's round-off: a profile refuses e.g. 8e-14 us as unphysical), else ``value``."""
    return float(value) if value > 1e-6 * step else 0.0


#: a fitted number whose step (:data:`FITTED`'s last column) moves no fit row's predicted time by
#: this share is not determined by the rows (:func:`gauss_newton` refuses it)
INSENSITIVE = 1e-7


#: halvings of a Gauss-Newton step that raises the fit rows' squared relative error
#: (:func:`gauss_newton`)
BACKTRACK = 8


def gauss_newton(cases, t_meas: np.ndarray, hw, iterations: int = 3, jobs: int = 2, say=print, fitted=None):
    """Non-negative Gauss-Newton on ``pred / meas - 1`` over ``fitted`` (rows of :data:`FITTED`,
    default all; the other ``[ggml]`` numbers stay those of ``hw``), each step halved up to
    :data:`BACKTRACK` times until it does not raise the sum of squared relative errors (none
    does: the fit stops); returns ``(values, relative errors)``.

    Raises:
        PrefetchSimError: a fitted number that no case's predicted time depends on
            (:data:`INSENSITIVE`): the rows cannot determine it, and the fit would write its start
            value as "fitted"; no step from the start values lowers the error (the same)."""
    rows = FITTED if fitted is None else tuple(fitted)
    p = {f: start for _k, f, _s, start, _d in rows}
    t0 = predict_times(cases, hw, p, jobs)
    for it in range(iterations):
        err = t0 / t_meas - 1
        start = " (the fit's start values, not the profile's)" if it == 0 else ""
        say(f"  iteration {it}{start}: median |err| {np.median(np.abs(err)) * 100:.2f}%, "
            + ", ".join(f"{k}={p[f] / s:.4g}" for k, f, s, _st, _d in rows))
        J = []
        for _k, f, _s, _st, d in rows:
            q = dict(p)
            q[f] = p[f] + d
            J.append((predict_times(cases, hw, q, jobs) - t0) / d / t_meas)
        J = np.array(J).T
        if it == 0:  # a number the fit rows do not depend on would be written as its start value
            flat = [k for j, (k, _f, _s, _st, d) in enumerate(rows) if np.max(np.abs(J[:, j])) * d < INSENSITIVE]
            if flat:
                raise PrefetchSimError(
                    f"--params: no fit row's predicted time depends on {', '.join(flat)} (a step of each moves "
                    f"none by {INSENSITIVE:g} of its time): the rows cannot fit "
                    f"{'it' if len(flat) == 1 else 'them'}; leave {'it' if len(flat) == 1 else 'them'} out of "
                    "--params (the profile's value stays) or fit on rows that use "
                    f"{'it' if len(flat) == 1 else 'them'}")
        free = list(range(len(rows)))
        x0 = np.array([p[f] for _k, f, _s, _st, _d in rows])
        while True:  # active set: drop parameters that would go negative
            A = J[:, free]
            step, *_ = np.linalg.lstsq(A, -err, rcond=None)
            x = x0.copy()
            x[free] = x0[free] + step
            neg = [j for j in free if x[j] < 0]
            if not neg:
                break
            for j in neg:
                x0[j] = 0.0
                free.remove(j)
            err = predict_times(cases, hw, {f: x0[i] for i, (_k, f, _s, _st, _d) in enumerate(rows)}, jobs) / t_meas - 1
        # a step that raises the squared error is halved (backtracking), up to BACKTRACK times; a
        # full Gauss-Newton step on rows the model cannot follow had run cpu_rate_scale to 1.4e4
        # (fresh-user round 7); when no step helps, the fit stops where it is
        sse0 = float(np.sum((t0 / t_meas - 1) ** 2))
        base = np.array([p[f] for _k, f, _s, _st, _d in rows])
        for half in range(BACKTRACK + 1):
            trial = base + (x - base) / 2**half
            q = {f: clamp_fitted(max(trial[i], 0.0), d) for i, (_k, f, _s, _st, d) in enumerate(rows)}
            t1 = predict_times(cases, hw, q, jobs)
            if float(np.sum((t1 / t_meas - 1) ** 2)) <= sse0:
                break
        else:
            if it == 0:  # not one step: the start values would be written as fitted
                raise PrefetchSimError(
                    f"no step from the fit's start values lowers the fit rows' squared error (median |err| "
                    f"{np.median(np.abs(t0 / t_meas - 1)) * 100:.2f}%): the model cannot follow these rows with "
                    f"{', '.join(k for k, *_ in rows)}; nothing is fitted")
            say(f"  iteration {it + 1}: no step along the Gauss-Newton direction lowers the squared error; stopped")
            break
        p, t0 = q, t1
    return p, t0 / t_meas - 1


def link_numbers(run_dir: str | Path) -> dict[str, tuple[float, str]]:
    """``h2d_pinned_gb_per_s`` and ``h2d_pageable_gb_per_s`` from the ground-truth lease's own H2D
    probe (``h2d.json``, 1 GiB copies, :mod:`calibrate.llamacpp.h2d_probe`): the lent machines
    differ (pageable 6.6 GB/s on the ground truth's machine against 8.4 on the one the CuPy
    profile was measured on), and the probe ran in the same lease as the rows.

    Raises:
        PrefetchSimError: the file is missing or lacks the two rates.
    """
    import json

    p = Path(run_dir) / "h2d.json"
    try:
        d = json.loads(p.read_text())
        pinned, pageable = float(d["pinned_bytes_per_s"]), float(d["pageable_bytes_per_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrefetchSimError(f"{p}: cannot read the H2D probe's pinned/pageable rates ({exc})") from None
    src = (f"measured: {p.as_posix()} (the ground truth's own lease, {d.get('measured_at', '?')}): median of "
           "1 GiB cudaMemcpyAsync copies from a {} host buffer, CUDA events (calibrate.llamacpp.h2d_probe)")
    return {"h2d_pinned_gb_per_s": (pinned / 1e9, src.format("pinned")),
            "h2d_pageable_gb_per_s": (pageable / 1e9, src.format("pageable"))}


def set_values(text: str, values: dict[str, tuple[float, str]], table: str = "ggml", where: str = "profile") -> str:
    """``text`` (a profile) with the ``key = { value = ..., source = "..." }`` lines of ``[table]``
    rewritten to ``values`` (``{key: (value, source)}``).

    Raises:
        PrefetchSimError: naming ``where``: no ``[table]``, or a key not on exactly one line of it.
    """
    at = text.find(f"\n[{table}]\n")
    if at < 0:
        raise PrefetchSimError(f"{where}: no [{table}] table")
    end = text.find("\n[", at + 1)
    end = len(text) if end < 0 else end
    head, sect, tail = text[:at], text[at:end], text[end:]
    for key, (v, src) in values.items():
        line = f'{key} = {{ value = {v:.6g}, source = "{src}" }}'
        new, n = re.subn(rf"(?m)^{re.escape(key)} = .*$", line.replace("\\", "\\\\"), sect)
        if n == 0 and key in OPTIONAL_KEYS:  # a number older profiles lack: added after its neighbour
            new, n = re.subn(rf"(?m)^({re.escape(OPTIONAL_KEYS[key])} = .*)$",
                             lambda m: m.group(1) + "\n" + line, sect, count=1)
        if n != 1:
            raise PrefetchSimError(f"{where}: expected one line '{key} = ...' in [{table}], found {n}")
        sect = new
    return head + sect + tail


def write_values(profile: str | Path, values: dict[str, tuple[float, str]], table: str = "ggml") -> None:
    """Rewrite the ``key = { value = ..., source = "..." }`` lines of ``[table]`` in ``profile``
    (:func:`set_values`), atomically."""
    from sim.atomic import write_atomic

    write_atomic(profile, set_values(Path(profile).read_text(), values, table, str(profile)))


def table_path_from(table: str | Path, dst: str | Path) -> str:
    """``table`` as a profile written at ``dst`` names it: relative to ``dst``'s folder, or
    absolute where no relative path reaches it (another drive)."""
    target = Path(table).resolve()
    try:
        return Path(os.path.relpath(target, Path(dst).resolve().parent)).as_posix()
    except ValueError:
        return target.as_posix()


#: a ``gpu_kernels`` / ``cpu_kernels`` line of a profile, its value in either TOML string quoting
_TABLE_LINE = re.compile(r"""(?m)^(\s*(?:gpu|cpu)_kernels(?:_extra)?\s*=\s*)(?:"([^"\\]*)"|'([^']*)')""")


def rebase_profile(text: str, src: str | Path, dst: str | Path) -> str:
    """A profile's text with its kernel-table paths (``gpu_kernels``, ``gpu_kernels_extra``, ``cpu_kernels``: relative to
    the profile's folder) rewritten so the copy at ``dst`` reads the tables ``src`` reads
    (:func:`table_path_from`)."""
    src_dir = Path(src).resolve().parent

    def fix(m: re.Match) -> str:
        p = Path(m.group(2) if m.group(2) is not None else m.group(3))
        if p.is_absolute():
            return m.group(0)
        return f'{m.group(1)}"{table_path_from(src_dir / p, dst)}"'

    return _TABLE_LINE.sub(fix, text)


def check_copyable(text: str, profile: str | Path, out: str | Path | None) -> None:
    """Refuse, before any work, a profile whose filled copy could not be written or loaded: one
    without its own ``[ggml]`` table (its numbers are written there), or, for ``--out`` in another
    folder, one based on another profile (``[hardware] base``, a file name the copy's folder lacks).

    Raises:
        PrefetchSimError: naming ``--profile`` (or ``--out``) and the file.
    """
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PrefetchSimError(f"--profile {profile}: not valid TOML ({exc})") from None
    hw = data.get("hardware")
    base = hw.get("base") if isinstance(hw, dict) else None
    if out is not None and base and Path(out).resolve().parent != Path(profile).resolve().parent:
        raise PrefetchSimError(f"--out {out}: --profile {profile} is based on {base} ([hardware] base, "
                               "a profile next to it), which a copy in another folder would not find; write the "
                               "copy beside the profile or fit the base profile")
    if not isinstance(data.get("ggml"), dict) or "\n[ggml]\n" not in "\n" + text:
        where = f" (it takes its [ggml] numbers from {base}; fit that profile)" if base else ""
        raise PrefetchSimError(f"--profile {profile}: no [ggml] table of its own to write the numbers in{where}")


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.fit",
                                 description="Fill the [ggml] numbers of a llama.cpp-calibrated hardware profile: "
                                             "measured ones from the kernel lease, fitted ones on the fit rows only.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--profile", default="scenarios/hardware/h200-llamacpp.toml",
                    help="the profile to fill: a TOML or a built-in name such as h200-llamacpp")
    ap.add_argument("--run", nargs="+", default=["data/llamacpp/h200-20261201"], metavar="RUN",
                    help="ground-truth run folder(s) (fit rows only); several: their fit rows pooled, every row "
                         "(model load) alike, the H2D rates of a full fill from the first")
    ap.add_argument("--kernels", default="data/llamacpp/h200-20261201-kernels", help="kernel lease folder (ncu/)")
    ap.add_argument("--splits", default="data/llamacpp/h200-20261201-splits",
                    help="split-timing lease folder (one-thread GET_ROWS / SET_ROWS rates)")
    ap.add_argument("--depth", default="data/llamacpp/h200-20261202-depth",
                    help="ncu of llama-bench decode at depth (the cold K/V rate of attention)")
    ap.add_argument("--phases", default="data/llamacpp/h200-20261202-phase",
                    help="phase-timing lease folder (llama.cpp's host work around each graph)")
    ap.add_argument("--small-batch", dest="small_batch", default="data/llamacpp/h100-20261207-diag3",
                    help="ncu of llama-bench prompts at ubatch 1-8 (GPU kernels at 2-8 tokens per ubatch)")
    ap.add_argument("--iterations", type=int, default=3, help="Gauss-Newton iterations")
    ap.add_argument("--jobs", type=int, default=2, help="processes")
    ap.add_argument("--params", metavar="NAMES", default=None, action="append",
                    help="fit only these (comma list, repeatable: the lists add up; of " + ", ".join(k for k, *_ in FITTED) + "); every other "
                         "number, the measured ones and the H2D rates too, keeps the profile's value (default: "
                         "all but " + ", ".join(MEASURED_BY_DEFAULT) + " fitted, the measured ones (split_us "
                         "from --splits) and --run's H2D rates refreshed)")
    ap.add_argument("--untimed", action="store_true",
                    help="leave out the rows of invocations that ran with a timing patch on (split-time, "
                         "phase-time: their syncs and prints cost some configurations 5-20 %% of their t/s)")
    ap.add_argument("--max-steal", dest="max_steal", type=non_negative_pct, default=None, metavar="PCT",
                    help="leave out the rows of model loads during which the hypervisor took more than PCT %% of the "
                         "CPU time (/proc/stat steal, from each run's host_state.jsonl), or whose steal is unknown")
    ap.add_argument("--write", action="store_true", help="rewrite the profile's [ggml] numbers")
    ap.add_argument("--out", metavar="TOML", default=None,
                    help="write the filled profile here instead (a copy whose kernel-table paths still reach the "
                         "profile's tables)")
    ap.add_argument("--cpu-table", dest="cpu_table", metavar="CSV", default=None,
                    help="price the CPU backend from this kernel table (python -m calibrate.llamacpp.perf_cases "
                         "table, e.g. from the same lease as --run) instead of the profile's; cpu_op_us and "
                         "cpu_ew_gb_per_s are measured from it; needs --out")
    args = ap.parse_args(argv)
    from sim.model.specs import load_hardware

    try:
        from .compare import check_run_dir, hardware_path

        if args.params is not None:  # repeated --params add up, as run's repeatable flags do
            args.params = ",".join(args.params)
        fitted_rows = select_fitted(args.params)
        from .compare import resolve

        # the lease folders as given, else under the repository (a checkout's data/, from any folder)
        for flag in ("kernels", "splits", "depth", "phases", "small_batch"):
            setattr(args, flag, str(resolve(getattr(args, flag))))
        default_run = args.run == ap.get_default("run")
        shown_run = list(args.run)  # as given: the sources written into the profile name these
        args.run = [str(resolve(r)) if default_run else r for r in args.run]
        # the profile as the other tools name one (a file or a built-in name: h200-llamacpp), and
        # --run a run folder, before any work
        args.profile = str(hardware_path(args.profile, "--profile"))
        if not Path(args.profile).is_file():
            what = "is a folder, expected a hardware profile TOML" if Path(args.profile).is_dir() else "file not found"
            raise ScenarioError(what, file=args.profile, field="--profile")
        seen_runs: set[str] = set()
        timed_of: dict[str, list[str]] = {}
        for run in args.run:
            check_run_dir(run, field="--run")
            if os.path.realpath(run) in seen_runs:
                raise PrefetchSimError(f"--run {run}: given twice; each run folder once")
            seen_runs.add(os.path.realpath(run))
            timed = timed_of[run] = timed_invocations(run)
            if timed and not args.untimed:  # their t/s carries the timing's own cost: a fit on them is a fit on that
                print(f"fit: note: --run {run}: {len(timed)} invocation(s) ran with a timing patch on "
                      f"({', '.join(timed[:3])}{', ...' if len(timed) > 3 else ''}); their rows are fitted as "
                      "measured, timing included (--untimed leaves them out)", file=sys.stderr)
        stolen_of: dict[str, dict[str, str]] = {}
        if args.max_steal is not None:  # the loads the hypervisor took CPU time from, per run
            for run in args.run:
                samples = host_samples(run)
                if samples is None:
                    raise ScenarioError(f"{run} has no host_state.jsonl (the lease's host sampler record): no load's "
                                        "steal time is known", field="--max-steal")
                invs = [inv for _ln, inv in jsonl_objects(Path(run) / INVOCATIONS_FILE, "invocation")]  # read once
                steal = steal_over(samples, invs)
                ids = [str(inv.get("id")) for inv in invs]
                stolen_of[run] = {
                    i: (f"steal {steal[i]:.2f} % during its load (--max-steal {args.max_steal:g})" if i in steal
                        else f"steal unknown during its load (--max-steal {args.max_steal:g})")
                    for i in ids if not steal.get(i, math.inf) <= args.max_steal}
        runs_text = (shown_run[0] if len(shown_run) == 1
                     else f"{len(shown_run)} run folders ({', '.join(shown_run)})")
        if args.write and args.out:
            raise PrefetchSimError("--write and --out: give one (--write rewrites --profile, --out writes a copy)")
        if args.iterations < 1:
            raise PrefetchSimError(f"--iterations must be >= 1, got {args.iterations}")
        if args.jobs < 1:
            raise PrefetchSimError(f"--jobs must be >= 1, got {args.jobs}")
        if args.out:
            from sim.atomic import check_output_path

            check_output_path(args.out, "--out")
            if os.path.realpath(args.out) == os.path.realpath(args.profile):
                raise PrefetchSimError(f"--out {args.out} is --profile itself; --write rewrites the profile, "
                                       "--out writes a copy elsewhere")
            from .compare import check_outputs_spare_inputs

            check_outputs_spare_inputs({"--out": args.out}, args.run, [args.cpu_table, args.profile], toml_ok=True,
                                       formats={"--out": ".toml"})   # the refit profile is TOML
            if Path(args.out).is_file():  # a profile over another TOML (a model, a grid) is never wanted
                import tomllib

                try:
                    is_profile = isinstance(tomllib.loads(Path(args.out).read_text()).get("hardware"), dict)
                except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                    is_profile = False
                if not is_profile:
                    raise PrefetchSimError(f"--out {args.out}: an existing file that is no hardware profile (a "
                                           "model or grid TOML?); the fitted profile would replace it: give another path")
        if args.cpu_table and not args.out:
            raise PrefetchSimError("--cpu-table writes a copy of the profile: give --out TOML")
        text = Path(args.profile).read_text()
        if args.write or args.out:
            check_copyable(text, args.profile, args.out)
        if args.out:
            text = rebase_profile(text, args.profile, args.out)
        if args.cpu_table:
            text = with_cpu_table(text, args.cpu_table, args.out)
            hw = load_profile_text(text, args.out, args.cpu_table)
        else:
            hw = load_hardware(args.profile)
        if hw.ggml is None:
            raise PrefetchSimError(f"{args.profile}: no [ggml] table (not a llama.cpp-calibrated profile)")
        links: dict = {}
        measured: dict = cpu_numbers(hw, args.cpu_table) if args.cpu_table else {}
        if measured:
            hw = hw.with_(ggml=replace(hw.ggml, cpu_op_s=measured["cpu_op_us"][0] * 1e-6,
                                       cpu_ew_bytes_per_s=measured["cpu_ew_gb_per_s"][0] * 1e9))
        if args.params is None:  # a subset keeps every number not named, the measured ones and H2D too
            rate, rate_src = ew_rate(args.kernels)
            from .splittime import gpu_split_host, rows_rates

            rows = {k: (v / 1e9, src) for k, (v, src) in rows_rates(args.splits).items()}
            split_s, split_src = gpu_split_host(args.splits)
            kv_rate, kv_src = kv_cold_rate(args.depth, hw)
            rows["attn_kv_cold_gb_per_s"] = (kv_rate / 1e9, kv_src)
            from .phasetime import call_table, host_figures

            phases = host_figures(call_table(args.phases), args.phases)
            from .smallbatch import small_batch_numbers

            small = small_batch_numbers(args.small_batch)
            measured = {"ew_gb_per_s": (rate / 1e9, rate_src), **(measured or cpu_numbers(hw)), **rows, **phases,
                        "split_us": (split_s * 1e6, split_src), **small}
            hw = hw.with_(ggml=replace(hw.ggml, ew_bytes_per_s=rate, cpu_op_s=measured["cpu_op_us"][0] * 1e-6,
                                       mask_s=phases["mask_ns"][0] * 1e-9, call_s=phases["call_us"][0] * 1e-6,
                                       call_per_token_s=phases["call_ns_per_token"][0] * 1e-9,
                                       apply_per_token_s=phases["apply_ns_per_token"][0] * 1e-9,
                                       build_per_layer_s=phases["build_us_per_layer"][0] * 1e-6,
                                       capture_per_layer_s=phases["capture_us_per_layer"][0] * 1e-6,
                                       cpu_ew_bytes_per_s=measured["cpu_ew_gb_per_s"][0] * 1e9,
                                       cpu_get_rows_bytes_per_s=rows["cpu_get_rows_gb_per_s"][0] * 1e9,
                                       cpu_set_rows_bytes_per_s=rows["cpu_set_rows_gb_per_s"][0] * 1e9,
                                       attn_kv_cold_bytes_per_s=kv_rate, split_s=split_s,
                                       fa_extra_s=tuple(small[f"fa_extra_us_{n}"][0] * 1e-6 for n in (2, 4, 8)),
                                       f32_mmf_s=small["f32_mmf_us"][0] * 1e-6,
                                       matvec_column_macs_per_s=small["matvec_column_tmac_per_s"][0] * 1e12))
            links = link_numbers(args.run[0])
            hw = hw.with_(h2d_pinned=replace(hw.h2d_pinned, bytes_per_s=links["h2d_pinned_gb_per_s"][0] * 1e9),
                          h2d_pageable=replace(hw.h2d_pageable,
                                               bytes_per_s=links["h2d_pageable_gb_per_s"][0] * 1e9))
        for k, (v, s) in {**links, **measured}.items():
            print(f"{k} = {v:.6g}   ({s})")
        cases, t_meas = [], []
        for run in args.run:
            skip = dict.fromkeys(timed_of[run] if args.untimed else (), UNTIMED_REASON)
            skip.update(stolen_of.get(run, {}))
            c, t, rows = fit_rows(run, hw, skip_invocations=skip)
            for line in other_gpu_warnings(run, hw, rows):  # before the fit's iterations
                print(f"fit: warning: {line}", file=sys.stderr)
            cases += c
            t_meas.append(t)
        t_meas = np.concatenate(t_meas)
        if len(cases) < MIN_ROWS_PER_PARAMETER * len(fitted_rows):
            raise PrefetchSimError(f"--run {' '.join(args.run)}: {plural(len(cases), 'fit row')} for "
                                   f"{plural(len(fitted_rows), 'parameter')} (at "
                                   f"least {MIN_ROWS_PER_PARAMETER * len(fitted_rows)}: calibrate/llamacpp/split.py "
                                   "names the fit rows of a ground-truth grid)")
        print(f"fitting {', '.join(k for k, *_ in fitted_rows)} on {len(cases)} fit rows of {runs_text}")
        p, err = gauss_newton(cases, t_meas, hw, args.iterations, args.jobs, fitted=fitted_rows)
        med, p90 = np.median(np.abs(err)) * 100, np.percentile(np.abs(err), 90) * 100
        only = "" if default_run else f" --run {' '.join(args.run)}"
        only += "" if args.params is None else f" --params {','.join(k for k, *_ in fitted_rows)}"
        only += " --untimed" if args.untimed else ""
        only += f" --max-steal {args.max_steal:g}" if args.max_steal is not None else ""
        if args.cpu_table:
            only += f" --cpu-table {Path(args.cpu_table).as_posix()}"
        fitted = {k: (p[f] / s, f"fitted: Gauss-Newton on the relative test time of the {len(cases)} fit rows of "
                      f"{runs_text} (calibrate/llamacpp/split.py), median |err| {med:.2f}%, p90 {p90:.2f}% "
                      f"(python -m calibrate.llamacpp.fit{only})") for k, f, s, _st, _d in fitted_rows}
        for k, (v, _s) in fitted.items():
            print(f"{k} = {v:.6g}")
        print(f"fit rows: median |err| {med:.2f}%, p90 {p90:.2f}% (time per test)")
        if args.write or args.out:
            from sim.atomic import write_atomic

            target = args.out or args.profile
            if links:
                text = set_values(text, links, "hardware", args.profile)
            text = set_values(text, {**measured, **fitted}, "ggml", args.profile)
            try:  # what would be written must load (its numbers within the profile's bounds)
                load_profile_text(text, target, args.cpu_table)
            except PrefetchSimError as exc:
                raise PrefetchSimError(f"the fitted profile would not load, so {target} is not written: {exc} "
                                       f"(fit rows: median |err| {med:.2f}%: rows the model cannot follow?)") from None
            write_atomic(target, text)
            print(f"wrote {target}")
    except PrefetchSimError as exc:
        print(f"fit: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m calibrate.llamacpp.fit``; returns the exit status (2 with a one-line message on
    a bad input; 130 / 143 on Ctrl-C / SIGTERM, the worker processes stopped and the profile
    left as it was)."""
    from sim.cli.interrupt import run_interruptible

    return run_interruptible("fit", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
