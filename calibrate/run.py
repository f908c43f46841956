"""The calibration run: measure (:mod:`calibrate.measure`), fit (:mod:`calibrate.fit`) and
write a hardware profile (:mod:`calibrate.profile`).

``run_calibration`` does the GPU work and returns a :class:`Calibration` (tables and numbers
in memory); ``build_profile`` turns it into the TOML document that
:func:`sim.model.specs.load_hardware` reads; ``write_calibration`` writes the TOML, its CSV tables
and the raw logs, all or nothing.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.wording import plural

from . import fit as F
from . import shapes as S
from .profile import dumps_toml, sourced, write_files_atomically

#: H200 SXM dense BF16/FP16 tensor-core peak without sparsity, NVIDIA H200 datasheet (2024)
DATASHEET_TFLOPS = {"H200": 989.0, "H100": 989.0}
#: H200 SXM HBM3e bandwidth, NVIDIA H200 datasheet (2024)
DATASHEET_HBM_GB_PER_S = {"H200": 4800.0, "H100": 3350.0}


@dataclass(frozen=True)
class Sweep:
    """What one calibration run measures (sizes chosen to finish in well under 5 minutes
    on an H200; :meth:`quick` is a tiny version for tests and the CPU stand-in).

    Attributes:
        copy_sizes: H2D/D2H sizes in bytes.
        copy_buffer_bytes: host (pinned and pageable) and device buffer size.
        gemm_tokens: token counts m of the GEMM sweep.
        gemm_shapes: ``(model, role, n, k)``.
        dtypes: GEMM dtypes (``"f16"``, ``"bf16"``).
        ref_gemm: (m, n, k) of the GEMM repeated once per round.
        moe: ``(model, n_expert, top_k, n, k)``; moe_tokens: token counts.
        attn: ``(model, n_head, n_head_kv, head_dim)``; attn_tokens, attn_kv: the grid.
        hbm_bytes: buffer of the device-memory bandwidth test.
        cpu_bytes: matrix bytes of the host matvec; cpu_gemm_n: host GEMM size.
        concurrency_bytes, concurrency_copies, concurrency_gemm_n: the overlap test.
        overhead_calls: calls per host-overhead loop.
        w_pool_bytes: weight pool of the GEMM sweep (several times the L2 cache).
        host_series_s: seconds of repeated sampling of the host-dependent paths (pageable
            copies, cold CPU matvecs; :func:`calibrate.measure.measure_host_series`), 0 = none;
            its matvecs price the CPU backend, its copies the pageable path only when fewer than
            :data:`PAGEABLE_MIN_SAMPLES` copies were sampled through the run.
        host_series_kw: keyword arguments of that function (sizes).
        pageable_spread_bytes: bytes per copy of the pageable samples taken between the
            measurements of the run (:class:`calibrate.measure.PageableSampler`), 0 = none; they
            set ``h2d_pageable_gb_per_s``. Full sweep: 64 MiB, the size of the host series' and
            the validation probes' pageable copies.
        pageable_spread_interval_s: least time between those samples, seconds (full sweep: 1 s,
            about 40 samples of 2 copies over a ≈ 40-s measurement, ≈ 2% of its time).
    """

    copy_sizes: tuple[int, ...]
    copy_buffer_bytes: int
    gemm_tokens: tuple[int, ...]
    gemm_shapes: tuple[tuple[str, str, int, int], ...]
    dtypes: tuple[str, ...]
    ref_gemm: tuple[int, int, int]
    moe: tuple[tuple[str, int, int, int, int], ...]
    moe_tokens: tuple[int, ...]
    attn: tuple[tuple[str, int, int, int], ...]
    attn_tokens: tuple[int, ...]
    attn_kv: tuple[int, ...]
    hbm_bytes: int
    cpu_bytes: int
    cpu_gemm_n: int
    concurrency_bytes: int
    concurrency_copies: int
    concurrency_gemm_n: int
    overhead_calls: int
    w_pool_bytes: int
    host_series_s: float = 0.0
    host_series_kw: tuple = ()
    pageable_spread_bytes: int = 0
    pageable_spread_interval_s: float = 1.0

    @classmethod
    def full(cls, models_dir: str = "scenarios/models") -> Sweep:
        """The brief's models plus every model file in ``models_dir`` (if it exists)."""
        models = S.MODELS + S.shipped_models(models_dir)
        return cls(
            copy_sizes=tuple(2**p for p in range(12, 31)),
            copy_buffer_bytes=2**30,
            gemm_tokens=S.GEMM_TOKENS,
            gemm_shapes=tuple(S.gemm_sweep(models)),
            dtypes=("f16", "bf16"),
            ref_gemm=(8192, 8192, 8192),
            moe=tuple(S.moe_configs(models)),
            moe_tokens=(32, 512, 4096),
            attn=tuple(S.attn_shapes(models)),
            attn_tokens=(1, 64, 512, 2048, 8192),
            attn_kv=(0, 1024, 4096, 16384, 65536),
            hbm_bytes=2 * 2**30,
            cpu_bytes=2**30,
            cpu_gemm_n=4096,
            concurrency_bytes=256 * 2**20,
            concurrency_copies=8,
            concurrency_gemm_n=8192,
            overhead_calls=2000,
            w_pool_bytes=512 * 2**20,
            host_series_s=15.0,
            pageable_spread_bytes=64 * 2**20,
            pageable_spread_interval_s=1.0,
        )

    @classmethod
    def quick(cls) -> Sweep:
        models = (S.ModelShapes("tiny-a", 64, 64, 32, 96, 4, 2, 16, 8, 2),
                  S.ModelShapes("tiny-b", 96, 64, 32, 128, 4, 1, 16),
                  S.ModelShapes("tiny-c", 128, 128, 64, 64, 8, 4, 16, 4, 2))
        return cls(
            copy_sizes=tuple(2**p for p in (12, 14, 16, 18, 20, 22, 24)),
            copy_buffer_bytes=16 * 2**20,
            gemm_tokens=(1, 4, 16, 64),
            gemm_shapes=tuple(S.gemm_sweep(models)),
            dtypes=("f16", "bf16"),
            ref_gemm=(64, 64, 64),
            moe=tuple(S.moe_configs(models)),
            moe_tokens=(8, 32),
            attn=tuple(S.attn_shapes(models)),
            attn_tokens=(1, 8),
            attn_kv=(0, 64),
            hbm_bytes=4 * 2**20,
            cpu_bytes=8 * 2**20,
            cpu_gemm_n=64,
            concurrency_bytes=2**20,
            concurrency_copies=2,
            concurrency_gemm_n=64,
            overhead_calls=50,
            w_pool_bytes=2**20,
            host_series_s=0.05,
            host_series_kw=(("copy_bytes", 2**20), ("small_bytes", 2**18), ("big_bytes", 2**20), ("k", 256),
                            ("pool_bytes", 8 * 2**20), ("interval_s", 0.0)),
            pageable_spread_bytes=2**20,
            pageable_spread_interval_s=0.0,
        )


@dataclass
class Calibration:
    """Everything one calibration run measured, before fitting into a profile.

    Attributes:
        name: profile name (``h200``).
        info: device, driver, versions (from :func:`calibrate.measure.open_gpu`).
        copies: rows of :func:`calibrate.measure.measure_copies` over all rounds.
        gemm: GEMM sweep rows (all dtypes) with ``model`` and ``role`` columns.
        ref_gemm: the reference GEMM, one row per round and dtype.
        moe, attn: grouped expert GEMM and attention tables.
        scalars: section -> dict of numbers (overheads, concurrency, hbm, cpu, ...).
        date: UTC time of the start, ISO 8601.
        command: the command line that ran it.
        elapsed_s: wall time of the run.
        notes: things worth knowing (fallbacks taken, sections that failed).
        sweep: what was measured.
    """

    name: str
    info: dict
    copies: pd.DataFrame
    gemm: pd.DataFrame
    ref_gemm: pd.DataFrame
    moe: pd.DataFrame
    attn: pd.DataFrame
    scalars: dict
    date: str
    command: str
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    sweep: Sweep | None = None


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm  # noqa: PLC0415
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, disable=not enabled, file=sys.stderr, mininterval=5.0, unit="step",
                dynamic_ncols=False, ncols=100)


def run_calibration(name: str, *, sweep: Sweep | None = None, rounds: int = 3, cp: Any = None, seed: int = 0,
                    progress: bool = True, command: str = "", log=None) -> Calibration:
    """Measure the GPU and host. See :class:`Sweep` for what, docs/calibration.md for how.

    Args:
        name: profile name.
        sweep: sizes and shapes (default :meth:`Sweep.full`).
        rounds: times the key numbers (copy sweeps, a reference GEMM) are repeated, spread
            over the run, to report their spread.
        cp: the CuPy module (default: :func:`calibrate._gpu.require_cupy`).
        seed: seed of all input data and routing draws.
        progress: show a tqdm progress bar on stderr.
        command: recorded in the profile.
        log: callable taking one line of text (default: print to stderr).

    Raises:
        GPUUnavailableError: no CuPy or no GPU (raised before anything is measured).
    """
    from . import measure as M  # noqa: PLC0415

    if cp is None:
        from ._gpu import require_cupy  # noqa: PLC0415

        cp = require_cupy()
    sweep = sweep or Sweep.full()
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    t_start = time.perf_counter()
    date = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    g = M.open_gpu(cp, seed=seed)
    say(f"calibrate: {g.info['device']} (cc {g.info['compute_capability']}), CuPy {g.info['cupy_version']}, "
        f"CUDA runtime {g.info['cuda_runtime_version']}, bf16: {'yes' if g.bf16 is not None else g.bf16_note}, "
        f"batched GEMM: {g.batched_gemm}")
    rng = np.random.default_rng(seed)
    notes: list[str] = []
    scalars: dict[str, dict] = {}
    points = S.gemm_points(sweep.gemm_shapes, sweep.gemm_tokens)
    n_gemm = len(points) * len(sweep.dtypes)
    n_moe = len(sweep.moe) * len(sweep.moe_tokens)
    n_attn = len(sweep.attn) * len(sweep.attn_tokens) * len(sweep.attn_kv)
    bar = _progress(rounds + n_gemm + n_moe + n_attn + 9, progress)  # 9 ticks of rest_section

    bufs = M.alloc_copy_buffers(g, sweep.copy_buffer_bytes)
    sampler = (M.PageableSampler(g, bufs, copy_bytes=sweep.pageable_spread_bytes,
                                 interval_s=sweep.pageable_spread_interval_s)
               if sweep.pageable_spread_bytes > 0 else None)

    def sample_pageable(final: bool = False) -> None:
        """One pageable sample between measurements (never inside one) when it is due, or at
        the end when none was taken for an interval; a failed copy stops the sampling with a
        note and never loses the run (the profile then prices pageable copies without it)."""
        nonlocal sampler
        if sampler is None:
            return
        try:
            if not final:
                sampler.maybe_sample()
            elif not sampler.t_s or time.perf_counter() - sampler.last_at >= sampler.interval_s:
                sampler.sample()
        except Exception as exc:  # an optional measurement must not lose the run
            notes.append(f"pageable samples stopped after {plural(len(sampler.t_s), 'copy', 'copies')}: "
                         f"{type(exc).__name__}: {exc}")
            say(f"calibrate: pageable sampling FAILED: {type(exc).__name__}: {exc}")
            scalars["pageable_spread"] = sampler.result()
            sampler = None

    def tick(k=1):
        if bar is not None:
            bar.update(k)
        sample_pageable()

    scalars["spin"] = {"asked_s": 1e-3, "measured_s": M.measure_spin_accuracy(g, 1e-3)}
    tick()
    max_mk = max(max(m * k for *_, n, k, m in points), sweep.ref_gemm[0] * sweep.ref_gemm[2])
    max_mn = max(max(m * n for *_, n, k, m in points), sweep.ref_gemm[0] * sweep.ref_gemm[1])
    dtypes = tuple(d for d in sweep.dtypes if d == "f16" or g.bf16 is not None)
    if len(dtypes) < len(sweep.dtypes):
        notes.append(f"bf16 skipped: {g.bf16_note}")
    max_kn = max(max(n * k for *_, n, k in sweep.gemm_shapes), sweep.ref_gemm[1] * sweep.ref_gemm[2])
    pools = M.alloc_gemm_pools(g, max_mk, max_mn, max(sweep.w_pool_bytes, 2 * 2 * max_kn), dtypes)

    copy_rows: list[dict] = []
    ref_rows: list[dict] = []
    gemm_rows: list[dict] = []
    moe_rows: list[dict] = []
    attn_rows: list[dict] = []

    def key_round(r: int) -> None:
        copy_rows.extend(M.measure_copies(g, bufs, sweep.copy_sizes, r))
        for dt in dtypes:
            if dt != "f16" and any(n.startswith(f"{dt} GEMM failed") for n in notes):
                continue
            row = M.measure_gemm(g, pools, *sweep.ref_gemm, dt)
            row["round"] = r
            row["tflops"] = 2.0 * np.prod(sweep.ref_gemm, dtype=float) / row["t_s"] / 1e12
            ref_rows.append(row)
        tick()

    def gemm_section() -> None:
        skip: set[str] = set()
        for model, role, n, k, m in points:
            for dt in dtypes:
                tick()
                if dt in skip:
                    continue
                try:
                    row = M.measure_gemm(g, pools, m, n, k, dt)
                except Exception as exc:
                    if dt == "f16":
                        raise
                    skip.add(dt)
                    notes.append(f"{dt} GEMM failed, skipped: {type(exc).__name__}: {exc}")
                    continue
                row.update(model=model, role=role)
                gemm_rows.append(row)

    def guarded(what: str, fn, *a):
        try:
            return fn(*a)
        except Exception as exc:  # a failed optional measurement must not lose the run
            notes.append(f"{what} failed: {type(exc).__name__}: {exc}")
            say(f"calibrate: {what} FAILED: {type(exc).__name__}: {exc}")
            return None

    def moe_attn_section() -> None:
        for model, ne, topk, n, k in sweep.moe:
            for t in sweep.moe_tokens:
                rows = guarded(f"moe {model} tokens={t}", M.measure_moe, g, model, ne, topk, n, k, t, rng)
                moe_rows.extend(rows or [])
                tick()
        for model, nh, nkv, hd in sweep.attn:
            for nt in sweep.attn_tokens:
                for kv in sweep.attn_kv:
                    if nt >= 2048 and kv > 16384:  # > 2 s per point; the fit extrapolates
                        tick()
                        continue
                    row = guarded(f"attention {model} n={nt} kv={kv}", M.measure_attention, g, nt, kv, nh, nkv, hd)
                    if row is not None:
                        row["model"] = model
                        attn_rows.append(row)
                    tick()

    def rest_section() -> None:
        for key, fn in (
            ("overheads", lambda: M.measure_overheads(g, sweep.overhead_calls)),
            ("host_blocking", lambda: M.measure_host_blocking(g, bufs, min(64 * 2**20, bufs.nbytes))),
            ("ids_readback", lambda: M.measure_ids_readback(g)),
            ("concurrency", lambda: M.measure_concurrency(g, bufs, copy_bytes=sweep.concurrency_bytes,
                                                          n_copies=sweep.concurrency_copies,
                                                          gemm_n=sweep.concurrency_gemm_n)),
            ("event_semantics", lambda: M.measure_event_semantics(g, bufs)),
            ("hbm", lambda: M.measure_hbm(g, sweep.hbm_bytes)),
            ("cpu", lambda: M.measure_cpu(sweep.cpu_bytes, gemm_n=sweep.cpu_gemm_n)),
            ("host_series", lambda: M.measure_host_series(g, bufs, seconds=sweep.host_series_s,
                                                          **dict(sweep.host_series_kw))
             if sweep.host_series_s > 0 else None),
        ):
            try:
                got = fn()
                if got is not None:
                    scalars[key] = got
            except Exception as exc:  # one failed section must not lose the others
                notes.append(f"section {key} failed: {type(exc).__name__}: {exc}")
                say(f"calibrate: section {key} FAILED: {type(exc).__name__}: {exc}")
            tick()

    sections = [gemm_section, moe_attn_section, rest_section]

    def timed(label, fn, *a):
        t0 = time.perf_counter()
        fn(*a)
        say(f"calibrate: {label} in {time.perf_counter() - t0:.1f} s (at {time.perf_counter() - t_start:.1f} s)")

    for r in range(max(rounds, 1)):
        timed(f"round {r} (copies, reference GEMM)", key_round, r)
        if r < len(sections):
            timed(sections[r].__name__, sections[r])
    for sec in sections[max(rounds, 1):]:
        timed(sec.__name__, sec)
    if bar is not None:
        bar.close()
    sample_pageable(final=True)
    if sampler is not None:
        scalars["pageable_spread"] = sampler.result()
    notes.extend(g.log)
    elapsed = time.perf_counter() - t_start
    say(f"calibrate: measured in {elapsed:.1f} s")
    return Calibration(
        name=name, info=g.info, copies=pd.DataFrame(copy_rows), gemm=pd.DataFrame(gemm_rows),
        ref_gemm=pd.DataFrame(ref_rows), moe=pd.DataFrame(moe_rows), attn=pd.DataFrame(attn_rows),
        scalars=scalars, date=date, command=command, elapsed_s=elapsed, notes=notes, sweep=sweep)


# ---------------------------------------------------------------------------------------
# fitting
# ---------------------------------------------------------------------------------------


@dataclass
class Fits:
    """The fitted numbers of a calibration.

    Attributes:
        links: ``"h2d_pinned"``, ``"h2d_pageable"``, ``"d2h_pinned"`` -> per-round
            :class:`~calibrate.fit.LinkFit` list.
        roofline: dtype -> fit on all shapes; holdout: dtype -> leave-one-model-out results.
        moe: the MoE table with the roofline's prediction and the ratio measured/predicted.
    """

    links: dict[str, list[F.LinkFit]]
    roofline: dict[str, F.RooflineFit]
    holdout: dict[str, list[F.HoldoutResult]]
    moe: pd.DataFrame


def fit_calibration(cal: Calibration) -> Fits:
    """Fit copy links per round and the GEMM roofline per dtype (with held-out errors).

    Raises:
        ValueError: too few measurements to fit (e.g. a sweep without large copies).
    """
    links: dict[str, list[F.LinkFit]] = {}
    c = cal.copies
    for direction, memory in (("h2d", "pinned"), ("h2d", "pageable"), ("d2h", "pinned")):
        key = f"{direction}_{memory}"
        sel = c[(c.direction == direction) & (c.memory == memory)]
        links[key] = []
        for _r, grp in sel.groupby("round"):
            large_min = min(16 * 2**20, int(grp.nbytes.max()) // 4)
            links[key].append(F.fit_link(grp.nbytes.to_numpy(), grp.t_s.to_numpy(), large_min_bytes=large_min))
    roof: dict[str, F.RooflineFit] = {}
    hold: dict[str, list[F.HoldoutResult]] = {}
    for dt, grp in cal.gemm.groupby("dtype"):
        m, n, k = (grp[x].to_numpy(float) for x in ("m", "n", "k"))
        flops = F.gemm_flops(m, n, k)
        nbytes = F.gemm_bytes(m, n, k, 2.0 * n * k)
        roof[str(dt)] = F.fit_roofline(flops, nbytes, grp.t_s.to_numpy())
        hold[str(dt)] = F.holdout_errors(grp.model.to_numpy(), flops, nbytes, grp.t_s.to_numpy())
    moe = cal.moe.copy()
    if len(moe) and "f16" in roof:
        rows = moe.rows.to_numpy(float)
        n, k = moe.n.to_numpy(float), moe.k.to_numpy(float)
        wbytes = moe.n_used.to_numpy(float) * n * k * 2.0
        moe["t_roofline_s"] = roof["f16"].time_s(F.gemm_flops(rows, n, k), F.gemm_bytes(rows, n, k, wbytes))
        moe["measured_over_roofline"] = moe.t_s / moe.t_roofline_s
    return Fits(links, roof, hold, moe)


def _median(xs) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


#: fewest pageable copies sampled through the run that price ``h2d_pageable_gb_per_s``; with
#: fewer (a sampling that failed early, a very short run) the host series or the sweep fit do.
#: Two samples of two copies span two seconds at most, too few to see more than one of the
#: host's levels (PageableSampler).
PAGEABLE_MIN_SAMPLES = 5


#: smallest copy latency a profile records (``*_latency_us`` floor: 0.01 us)
LATENCY_FLOOR_S = 0.01e-6


def _latency_floor(lat_s: float) -> float:
    """A fitted copy latency as the profile records it (at least :data:`LATENCY_FLOOR_S`), so that
    a bandwidth priced with it agrees with the recorded latency."""
    return max(lat_s, LATENCY_FLOOR_S)


def _pageable_bw(page_bytes: int, t_s, lat_s: float) -> float:
    """Bandwidth (bytes/s) of pageable copies of ``page_bytes`` from their median time ``t_s``
    (seconds) less the fitted per-copy latency ``lat_s``, which is capped at half that time so a
    latency never eats the copy."""
    t_page = _median(t_s)
    lat = min(max(lat_s, 0.0), 0.5 * t_page)
    return page_bytes / max(t_page - lat, 1e-9)


def _bw_quantiles(page_bytes: int, t_s, qs=(0.1, 0.5, 0.9)) -> list[float]:
    """Quantiles ``qs`` of the per-copy bandwidth ``page_bytes / t`` (GB/s) of copy times ``t_s``
    (seconds)."""
    bw = page_bytes / np.asarray(t_s, float) / 1e9
    return [float(np.quantile(bw, q)) for q in qs]


def _fmt_list(xs, scale=1.0, nd=4) -> list[float]:
    return [float(f"{x * scale:.{nd}g}") for x in xs]


def build_profile(cal: Calibration, fits: Fits, table_dir: str, raw_dir: str | None = None) -> tuple[dict, str]:
    """The TOML document (``{"hardware": ..., "measured": ...}``) and its header comment.

    Args:
        table_dir: folder of the CSV tables relative to the TOML (``"h200"``).
        raw_dir: where the raw logs are (recorded in ``[measured]``).
    """
    info = cal.info
    sc = cal.scalars
    dev = info.get("device", "?")
    date = cal.date
    tag = f"{dev}, {date[:10]}"
    lk = fits.links
    pin_bw = [f.bytes_per_s for f in lk["h2d_pinned"]]
    pin_lat = [f.latency_s for f in lk["h2d_pinned"]]
    pag_bw = [f.bytes_per_s for f in lk["h2d_pageable"]]
    pag_lat = [f.latency_s for f in lk["h2d_pageable"]]
    d2h_bw = [f.bytes_per_s for f in lk["d2h_pinned"]]
    d2h_lat = [f.latency_s for f in lk["d2h_pinned"]]
    nrounds = len(pin_bw)
    rf = fits.roofline["f16"]
    n_f16 = int((cal.gemm.dtype == "f16").sum())
    ov = sc.get("overheads", {})
    cpu = sc.get("cpu", {})
    sizes = cal.copies.nbytes
    copy_src = (f"measured: cudaMemcpyAsync {sizes.min() // 1024} KiB..{sizes.max() // 2**20} MiB, CUDA events, "
                f"median over {plural(nrounds, 'round')} of a least-squares fit ({tag})")
    hw: dict[str, Any] = {
        "name": cal.name,
        "gpu_name": dev,
        "n_gpu": 1,
        "vram_gb": sourced(info["vram_total_bytes"] / 1e9, f"measured: cudaMemGetInfo total ({tag})"),
        "vram_reserved_gb": sourced(max(info["vram_total_bytes"] - info["vram_free_at_start_bytes"], 1) / 1e9,
                                    f"measured: total - free after creating the CUDA context ({tag})"),
        "gpu_tflops": sourced(rf.flops_per_s / 1e12,
                              f"measured: effective FLOP/s of a roofline fit to {n_f16} f16 cupy.dot GEMMs, "
                              f"median error {rf.median_rel_err:.1%} ({tag})"),
        "gemm_efficiency": sourced(1.0, "by definition: gpu_tflops is already the achieved (fitted) rate"),
        "hbm_gb_per_s": sourced(rf.bytes_per_s / 1e9,
                                f"measured: effective bytes/s of the same roofline fit (memory-bound GEMMs) ({tag})"),
        "hbm_efficiency": sourced(1.0, "by definition: hbm_gb_per_s is already the achieved (fitted) rate"),
        "kernel_us": sourced(rf.kernel_s * 1e6, f"measured: fixed time per kernel of the roofline fit ({tag})"),
        "h2d_pinned_gb_per_s": sourced(_median(pin_bw) / 1e9, copy_src + ", pinned source (cupyx.empty_pinned)"),
        "h2d_pinned_latency_us": sourced(_latency_floor(_median(pin_lat)) * 1e6, copy_src + ", pinned, small sizes"),
        "h2d_pageable_gb_per_s": sourced(_median(pag_bw) / 1e9, copy_src + ", pageable numpy source"),
        "h2d_pageable_latency_us": sourced(_latency_floor(_median(pag_lat)) * 1e6, copy_src + ", pageable, small sizes"),
        "d2h_gb_per_s": sourced(_median(d2h_bw) / 1e9, copy_src + ", D2H into pinned memory"),
        "d2h_latency_us": sourced(_latency_floor(_median(d2h_lat)) * 1e6, copy_src + ", D2H pinned, small sizes"),
    }
    if ov:
        sync_s = max(ov["sync_wake_s"], ov["stream_sync_idle_s"])
        hw["host_sync_us"] = sourced(sync_s * 1e6, f"measured: host wake-up after a synchronised kernel ends, "
                                                   f"CuPy stream.synchronize, median of 20 ({tag})")
        if "launch_noop_s" in ov:
            hw["op_issue_us"] = sourced(
                ov["launch_noop_s"] * 1e6,
                f"measured: host cost of one kernel launch (an empty RawKernel, median of many); the native "
                f"launch path a C++ scheduler such as ggml's has ({tag})")
        if "launch_cublas_s" in ov:
            hw["executor_op_issue_us"] = sourced(
                (ov["launch_cublas_s"] + 2 * ov["event_record_s"]) * 1e6,
                f"measured: host cost of one prepared cuBLAS GEMM call from Python plus the two timing events "
                f"the executor records around it (its launch path; a C++ cudaLaunchKernel costs less, see "
                f"[measured] launch_noop_us) ({tag})")
        else:
            hw["executor_op_issue_us"] = sourced(ov["launch_dot_s"] * 1e6,
                                        f"measured: host cost of issuing one cupy.dot from Python (a C++ "
                                        f"cudaLaunchKernel costs less, see [measured] launch_noop_us) ({tag})")
        hw["event_us"] = sourced(ov["event_record_s"] * 1e6, f"measured: host cost of cupy Event.record ({tag})")
    hs = sc.get("host_series")
    hs_notes: list[str] = []
    if hs:
        # medians of samples spread over time (the host is noisy from second to second)
        n_s, secs = hs["n"], hs["seconds"]
        t_small, t_big = _median(hs["mv_small_t_s"]), _median(hs["mv_big_t_s"])
        slope = (t_big - t_small) / max(hs["mv_big_bytes"] - hs["mv_small_bytes"], 1)
        direct = hs["mv_big_bytes"] / t_big  # the large matvec's own rate, bytes/s
        if slope > 0 and not 0.5 <= direct * slope <= 2.0:
            hs_notes.append(f"host series: the matvec line's bandwidth {1 / slope / 1e9:.3g} GB/s is off the large "
                            f"matvec's own rate {direct / 1e9:.3g} GB/s by more than 2x; using the latter, with "
                            f"cpu_op_us from the small matvec")
            slope = 1.0 / direct
        if slope > 0:
            bw = 1.0 / slope
            hw["cpu_gb_per_s"] = sourced(bw / 1e9,
                                         f"measured: numpy float32 matvecs on cold {hs['mv_small_bytes'] / 2**20:.3g} "
                                         f"and {hs['mv_big_bytes'] / 2**20:.3g} MiB windows of a "
                                         f"{hs.get('pool_bytes', 2**30) / 2**20:.0f} MiB pool, slope of "
                                         f"the medians of {n_s} samples over {secs:.3g} s, "
                                         f"{info.get('host_cpus', '?')} CPUs ({info.get('host_cpu', '?')}) ({tag})")
            icpt_us = (t_small - hs["mv_small_bytes"] / bw) * 1e6
            if icpt_us < 0.01:
                hs_notes.append(f"host series: the matvec line's intercept was {icpt_us:.3g} us (the small windows "
                                f"ran faster per byte than the large ones); cpu_op_us clamped to 0.01")
            hw["cpu_op_us"] = sourced(max(icpt_us, 0.01),
                                      f"measured: intercept of the same line (per-op dispatch) ({tag})")
        else:
            hs_notes.append("host series: the 64 MiB matvec median was not slower than the 8 MiB one (no "
                            "bandwidth from the line); cpu_gb_per_s from the single large matvec")
        hw["h2d_pageable_gb_per_s"] = sourced(_pageable_bw(hs["page_bytes"], hs["page_t_s"], _latency_floor(_median(pag_lat))) / 1e9,
                                              f"measured: pageable cudaMemcpyAsync of {hs['page_bytes'] / 2**20:.3g} "
                                              f"MiB (numpy source, not in the CPU caches), CUDA events, median of "
                                              f"{n_s} samples over {secs:.3g} s ({tag})")
    ps = sc.get("pageable_spread")
    if ps and len(ps["t_s"]) >= PAGEABLE_MIN_SAMPLES:
        # samples through the run: the host's pageable speed moves between levels for seconds at
        # a time (PageableSampler), so one window of a few seconds is not enough
        span = max(ps["t_at_s"]) - min(ps["t_at_s"])
        hw["h2d_pageable_gb_per_s"] = sourced(
            _pageable_bw(ps["page_bytes"], ps["t_s"], _latency_floor(_median(pag_lat))) / 1e9,
            f"measured: pageable cudaMemcpyAsync of {ps['page_bytes'] / 2**20:.3g} MiB (numpy source, not in the "
            f"CPU caches), CUDA events, median of {len(ps['t_s'])} copies, {ps['reps']} back to back at least "
            f"{ps['interval_s']:.3g} s apart between the measurements of the calibration ({span:.3g} s; not "
            f"during the executor-cost rounds) ({tag})")
    if cpu and not (hs and "cpu_gb_per_s" in hw):
        hw["cpu_gb_per_s"] = sourced(cpu["matvec_gb_per_s"],
                                     f"measured: numpy float32 matvec over {cpu['matvec_bytes'] / 2**30:.2f} GiB, "
                                     f"median of 5, {info.get('host_cpus', '?')} CPUs ({info.get('host_cpu', '?')}) ({tag})")
        if "matvec_call_s" in cpu:
            hw["cpu_op_us"] = sourced(max(cpu["matvec_call_s"] * 1e6, 0.01),
                                      "measured: intercept of numpy float32 matvec time vs bytes, 256 KiB..16 MiB, "
                                      f"median of 9 ({tag})")
    if cpu:
        hw["cpu_tflops"] = sourced(cpu["sgemm_tflops"], f"measured: numpy float32 {cpu['sgemm_n']}^3 GEMM ({tag})")
    elif "cpu_gb_per_s" not in hw:
        hw["cpu_gb_per_s"] = sourced(50.0, "assumption: host measurement failed, a typical DDR5 server share")
    es = sc.get("event_semantics")
    hw["event_semantics"] = es["pinned_semantics"] if es else "record_point"
    # the GEMM/grouped-GEMM timings above are of f16 kernels reading f16 weights
    hw["kernel_weight_bits"] = 16
    hw["gemm_table"] = f"{table_dir}/gemm.csv"
    hw["attn_table"] = f"{table_dir}/attn.csv"

    meas: dict[str, Any] = {
        "device": dev,
        "compute_capability": info.get("compute_capability", "?"),
        "driver": info.get("driver", str(info.get("driver_api_version", "?"))),
        "driver_api_version": info.get("driver_api_version", 0),
        "cuda_runtime_version": info.get("cuda_runtime_version", 0),
        "cupy_version": info.get("cupy_version", "?"),
        "numpy_version": info.get("numpy_version", "?"),
        "python": info.get("python", "?"),
        "host_cpu": info.get("host_cpu", "?"),
        "host_cpus": info.get("host_cpus", 0),
        "os_kernel": info.get("hostname_kernel", "?"),
        "date": date,
        "command": cal.command,
        "code_version": cal.info.get("code_version", "?"),
        "elapsed_s": round(cal.elapsed_s, 1),
        "rounds": nrounds,
        "raw_logs": raw_dir or "",
        "h2d_pinned_gb_per_s_rounds": _fmt_list(pin_bw, 1e-9),
        "h2d_pinned_latency_us_rounds": _fmt_list(pin_lat, 1e6),
        "h2d_pageable_gb_per_s_rounds": _fmt_list(pag_bw, 1e-9),
        "h2d_pageable_latency_us_rounds": _fmt_list(pag_lat, 1e6),
        "d2h_gb_per_s_rounds": _fmt_list(d2h_bw, 1e-9),
        "h2d_pinned_fit_median_rel_err": lk["h2d_pinned"][0].median_rel_err,
        "h2d_pageable_fit_median_rel_err": lk["h2d_pageable"][0].median_rel_err,
        "gemm_fit_f16": f"{rf.flops_per_s / 1e12:.1f} TFLOP/s, {rf.bytes_per_s / 1e9:.0f} GB/s, "
                        f"{rf.kernel_s * 1e6:.2f} us; median error {rf.median_rel_err:.1%}, max {rf.max_rel_err:.1%}",
        "gemm_heldout_f16": "; ".join(f"{h.group}: median {h.median_rel_err:.1%}, max {h.max_rel_err:.1%}"
                                      for h in fits.holdout.get("f16", [])),
    }
    if "bf16" in fits.roofline:
        rb = fits.roofline["bf16"]
        meas["gemm_fit_bf16"] = (f"{rb.flops_per_s / 1e12:.1f} TFLOP/s, {rb.bytes_per_s / 1e9:.0f} GB/s, "
                                 f"{rb.kernel_s * 1e6:.2f} us; median error {rb.median_rel_err:.1%}")
        meas["gemm_heldout_bf16"] = "; ".join(f"{h.group}: median {h.median_rel_err:.1%}, max {h.max_rel_err:.1%}"
                                              for h in fits.holdout.get("bf16", []))
    for dt, grp in cal.ref_gemm.groupby("dtype"):
        m, n, k = cal.sweep.ref_gemm if cal.sweep else (0, 0, 0)
        meas[f"ref_gemm_{dt}_{m}x{n}x{k}_tflops_rounds"] = _fmt_list(grp.tflops)
    for family, peak in DATASHEET_TFLOPS.items():
        if family in dev:
            meas["datasheet_dense_tflops"] = peak
            meas["gpu_tflops_share_of_datasheet"] = round(rf.flops_per_s / 1e12 / peak, 3)
            meas["datasheet_hbm_gb_per_s"] = DATASHEET_HBM_GB_PER_S[family]
    if "hbm" in sc:
        meas["hbm_memcpy_d2d_gb_per_s"] = round(sc["hbm"]["memcpy_d2d_gb_per_s"], 1)
        meas["hbm_kernel_copy_gb_per_s"] = round(sc["hbm"]["kernel_copy_gb_per_s"], 1)
    if "host_blocking" in sc:
        hb = sc["host_blocking"]
        meas["pageable_host_block_ratio"] = round(hb["pageable_host_block_ratio"], 3)
        meas["pinned_host_block_ratio"] = round(hb["pinned_host_block_ratio"], 4)
        meas["pageable_blocks_host"] = bool(hb["pageable_host_block_ratio"] > 0.5)
    if "concurrency" in sc:
        cc = sc["concurrency"]
        for kind in ("gemm", "elementwise"):
            if f"{kind}_copy_slowdown" in cc:
                meas[f"concurrent_copy_slowdown_vs_{kind}"] = round(cc[f"{kind}_copy_slowdown"], 3)
                meas[f"concurrent_{kind}_slowdown_vs_copy"] = round(cc[f"{kind}_compute_slowdown"], 3)
    if "ids_readback" in sc:
        ir = sc["ids_readback"]
        meas["ids_readback_us"] = round(ir["pinned_host_s"] * 1e6, 2)
        meas["ids_readback_shape"] = f"{ir['n_tokens']}x{ir['top_k']} int32, D2H into pinned + stream sync, host clock"
        meas["ids_readback_get_us"] = round(ir["pageable_get_host_s"] * 1e6, 2)
    if es:
        meas["event_semantics_pageable"] = es["pageable_semantics"]
    for key in ("event_record_s", "stream_wait_event_s", "stream_sync_idle_s", "launch_noop_s", "launch_dot_s",
                "launch_cublas_s", "issue_memcpy_pinned_s", "python_call_s", "sync_wake_s"):
        if key in ov:
            meas[key[:-2] + "_us"] = round(ov[key] * 1e6, 3)
    if cpu:
        meas["cpu_matvec_gb_per_s_min_max"] = [round(cpu["matvec_gb_per_s_min"], 2), round(cpu["matvec_gb_per_s_max"], 2)]
        meas["cpu_matvec_1gib_gb_per_s"] = round(cpu["matvec_gb_per_s"], 2)
    if hs:
        def p10_90(ts, nb):
            return [round(q, 2) for q in _bw_quantiles(nb, ts, (0.1, 0.9))]

        meas["host_series_samples"] = int(hs["n"])
        meas["host_series_pageable_gb_per_s_p10_p90"] = p10_90(hs["page_t_s"], hs["page_bytes"])
        meas["host_series_matvec_big_gb_per_s_p10_p90"] = p10_90(hs["mv_big_t_s"], hs["mv_big_bytes"])
        meas["host_series_pageable_gb_per_s"] = round(hs["page_bytes"] / _median(hs["page_t_s"]) / 1e9, 3)
        if hs_notes:
            meas["host_series_notes"] = hs_notes
    meas["h2d_pageable_fit_gb_per_s"] = round(_median(pag_bw) / 1e9, 3)
    if ps:
        meas["pageable_spread_samples"] = len(ps["t_s"])
        meas["pageable_spread_span_s"] = round(max(ps["t_at_s"]) - min(ps["t_at_s"]), 1) if ps["t_at_s"] else 0.0
        if ps["t_s"]:
            meas["pageable_spread_gb_per_s_p10_p50_p90"] = [round(q, 3) for q in _bw_quantiles(ps["page_bytes"], ps["t_s"])]
    if len(fits.moe) and "measured_over_roofline" in fits.moe:
        for meth, grp in fits.moe.groupby("method"):
            meas[f"moe_{meth}_over_roofline_median"] = round(float(grp.measured_over_roofline.median()), 3)
    meas["spin_check_ms"] = round(sc.get("spin", {}).get("measured_s", float("nan")) * 1e3, 4)
    if cal.notes:
        meas["notes"] = list(cal.notes)
    header = (f"Hardware profile '{cal.name}' measured by prefetch-sim calibrate on {dev}, {date}.\n"
              f"Command: {cal.command}\n"
              "Every number carries its source; [measured] holds versions and the spread over repeated rounds.\n"
              "See docs/calibration.md for what each figure is and how it was measured.")
    return {"hardware": hw, "measured": meas}, header


def measurements_json(cal: Calibration, fits: Fits) -> str:
    """All scalar measurements, fits and notes as JSON (the raw log)."""
    def conv(o):
        if isinstance(o, (np.integer,)):
            return int(o)
        if isinstance(o, (np.floating,)):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
        if hasattr(o, "__dataclass_fields__"):
            return {k: conv(getattr(o, k)) for k in o.__dataclass_fields__}
        if isinstance(o, dict):
            return {str(k): conv(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [conv(v) for v in o]
        return o
    doc = {"name": cal.name, "date": cal.date, "command": cal.command, "elapsed_s": cal.elapsed_s,
           "info": cal.info, "scalars": cal.scalars, "notes": cal.notes,
           "sweep": conv(cal.sweep) if cal.sweep else None,
           "fits": {"links": conv(fits.links), "roofline": conv(fits.roofline), "holdout": conv(fits.holdout)}}
    return json.dumps(conv(doc), indent=1, default=str, allow_nan=True)


def write_calibration(cal: Calibration, out_toml: str | Path, raw_dir: str | Path | None = None) -> list[Path]:
    """Fit and write the profile TOML, its tables (``<stem>/gemm.csv``, ``gemm_bf16.csv``,
    ``attn.csv``, ``moe.csv``) and the raw logs (``copies.csv``, ``gemm_all.csv``,
    ``ref_gemm.csv``, ``measurements.json``) — all or nothing, TOML last.

    Returns:
        the paths written.
    """
    out_toml = Path(out_toml)
    fits = fit_calibration(cal)
    tdir = out_toml.parent / out_toml.stem
    raw = Path(raw_dir) if raw_dir is not None else None
    doc, header = build_profile(cal, fits, out_toml.stem, str(raw) if raw is not None else None)
    cols = ["m", "n", "k", "dtype", "t_s", "t_min_s", "t_max_s", "n_rep", "model", "role"]
    g = cal.gemm[cols]
    files: dict[Path, Any] = {
        tdir / "gemm.csv": g[g.dtype == "f16"].reset_index(drop=True),
        tdir / "attn.csv": cal.attn,
        tdir / "moe.csv": fits.moe,
    }
    if (g.dtype == "bf16").any():
        files[tdir / "gemm_bf16.csv"] = g[g.dtype == "bf16"].reset_index(drop=True)
    if raw is not None:
        files[raw / "copies.csv"] = cal.copies
        files[raw / "ref_gemm.csv"] = cal.ref_gemm
        files[raw / "measurements.json"] = measurements_json(cal, fits)
    files[out_toml] = dumps_toml(doc, header)
    return write_files_atomically(files)


def dump_raw(cal: Calibration, raw_dir: str | Path) -> list[Path]:
    """Save the measured tables as they are (no fitting), e.g. when fitting or writing the
    profile failed, so that the measurements are not lost."""
    raw = Path(raw_dir)
    files: dict[Path, Any] = {raw / f"{k}.csv": getattr(cal, k) for k in ("copies", "gemm", "ref_gemm", "moe", "attn")}
    files[raw / "scalars.json"] = json.dumps({"info": cal.info, "scalars": cal.scalars, "notes": cal.notes,
                                              "date": cal.date, "command": cal.command}, indent=1, default=str)
    return write_files_atomically(files)


def summary_table(cal: Calibration, fits: Fits | None = None) -> str:
    """A short plain-text table of the key numbers (printed last by the CLI)."""
    fits = fits or fit_calibration(cal)
    lk = fits.links

    def row(label, vals, unit, scale=1.0):
        v = np.asarray(vals, dtype=float) * scale
        return f"| {label:<34} | {np.median(v):>10.4g} | {v.min():>10.4g} | {v.max():>10.4g} | {unit:<8} |"

    lines = [f"calibration of {cal.info.get('device', '?')} in {cal.elapsed_s:.1f} s, {len(lk['h2d_pinned'])} rounds",
             f"| {'figure':<34} | {'median':>10} | {'min':>10} | {'max':>10} | {'unit':<8} |",
             "|" + "-" * 36 + "|" + "-" * 12 + "|" + "-" * 12 + "|" + "-" * 12 + "|" + "-" * 10 + "|"]
    lines.append(row("H2D pinned bandwidth", [f.bytes_per_s for f in lk["h2d_pinned"]], "GB/s", 1e-9))
    lines.append(row("H2D pinned latency", [f.latency_s for f in lk["h2d_pinned"]], "us", 1e6))
    lines.append(row("H2D pageable bandwidth", [f.bytes_per_s for f in lk["h2d_pageable"]], "GB/s", 1e-9))
    lines.append(row("H2D pageable latency", [f.latency_s for f in lk["h2d_pageable"]], "us", 1e6))
    lines.append(row("D2H pinned bandwidth", [f.bytes_per_s for f in lk["d2h_pinned"]], "GB/s", 1e-9))
    for dt, grp in cal.ref_gemm.groupby("dtype"):
        lines.append(row(f"ref GEMM {'x'.join(map(str, cal.sweep.ref_gemm)) if cal.sweep else ''} {dt}",
                         grp.tflops, "TFLOP/s"))
    for dt, rf in fits.roofline.items():
        lines.append(f"roofline {dt}: {rf.flops_per_s / 1e12:.1f} TFLOP/s, {rf.bytes_per_s / 1e9:.0f} GB/s, "
                     f"{rf.kernel_s * 1e6:.2f} us/kernel, median err {rf.median_rel_err:.1%}")
        for h in fits.holdout.get(dt, []):
            lines.append(f"  held out {h.group:<16} n={h.n_points:<4} median err {h.median_rel_err:.1%}, "
                         f"max {h.max_rel_err:.1%}")
    sc = cal.scalars
    if "overheads" in sc:
        o = sc["overheads"]
        lines.append(f"host: event record {o['event_record_s'] * 1e6:.2f} us, wait event {o['stream_wait_event_s'] * 1e6:.2f} us, "
                     f"sync wake {o['sync_wake_s'] * 1e6:.2f} us, launch noop {o['launch_noop_s'] * 1e6:.2f} us, "
                     f"launch dot {o['launch_dot_s'] * 1e6:.2f} us, memcpy issue {o['issue_memcpy_pinned_s'] * 1e6:.2f} us")
    if "host_blocking" in sc:
        hb = sc["host_blocking"]
        lines.append(f"host blocked by copy call: pinned {hb['pinned_host_block_ratio']:.3f}, "
                     f"pageable {hb['pageable_host_block_ratio']:.3f} (host-return / copy time)")
    if "concurrency" in sc:
        c = sc["concurrency"]
        lines.append("copy || compute slowdowns: " + ", ".join(
            f"{k}: copy x{c[f'{k}_copy_slowdown']:.3f} compute x{c[f'{k}_compute_slowdown']:.3f}"
            for k in ("gemm", "elementwise") if f"{k}_copy_slowdown" in c))
    if "ids_readback" in sc:
        lines.append(f"router ids readback 2048x10 int32 + sync: {sc['ids_readback']['pinned_host_s'] * 1e6:.1f} us")
    if "hbm" in sc:
        lines.append(f"HBM: memcpy D2D {sc['hbm']['memcpy_d2d_gb_per_s']:.0f} GB/s, copy kernel "
                     f"{sc['hbm']['kernel_copy_gb_per_s']:.0f} GB/s (read+write)")
    ps = sc.get("pageable_spread")
    if ps and ps["t_s"]:
        q10, q50, q90 = _bw_quantiles(ps["page_bytes"], ps["t_s"])
        span = max(ps["t_at_s"]) - min(ps["t_at_s"])
        lines.append(f"H2D pageable through the run: {len(ps['t_s'])} copies of {ps['page_bytes'] / 2**20:.3g} MiB "
                     f"over {span:.0f} s, p10 {q10:.2f} / p50 {q50:.2f} / p90 {q90:.2f} GB/s")
    if "cpu" in sc:
        lines.append(f"host: matvec {sc['cpu']['matvec_gb_per_s']:.1f} GB/s, sgemm {sc['cpu']['sgemm_tflops']:.2f} TFLOP/s")
    if "event_semantics" in sc:
        lines.append(f"event semantics: pinned {sc['event_semantics']['pinned_semantics']}, "
                     f"pageable {sc['event_semantics']['pageable_semantics']}")
    if len(fits.moe) and "measured_over_roofline" in fits.moe:
        for meth, grp in fits.moe.groupby("method"):
            lines.append(f"MoE {meth}: measured/roofline median {grp.measured_over_roofline.median():.2f}")
    for n in cal.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


__all__ = ["Sweep", "Calibration", "Fits", "run_calibration", "fit_calibration", "build_profile",
           "write_calibration", "summary_table", "measurements_json"]
