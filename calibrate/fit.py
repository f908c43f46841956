"""Fitting the measured samples into the numbers of a hardware profile. Pure numpy.

* :func:`fit_link`: a copy path ``t = latency_s + bytes / bytes_per_s`` — bandwidth from a
  least-squares line through the large sizes (where latency is negligible), latency from the
  small sizes with that slope fixed (the least-squares intercept with a fixed slope is the
  mean residual).
* :func:`fit_roofline`: ``t = max(FLOP / P, bytes / W) + K`` — the cost model's GEMM formula
  (:func:`sim.model.costs.gemm_s` with ``gemm_efficiency = hbm_efficiency = 1``) — fitted to
  measured GEMM times by least squares on ``log t`` (times span five decades, so relative
  errors are what matters), with a deterministic coarse-to-fine grid search over
  ``log P, log W, log K``.
* :func:`holdout_errors`: the roofline's error on one model's shapes when fitted without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: bytes of an f32 activation, as :data:`sim.model.costs.ACT_BYTES` (kept equal by a test)
ACT_BYTES = 4


@dataclass(frozen=True)
class LinkFit:
    """A fitted copy path.

    Attributes:
        bytes_per_s: slope of the large-size fit, inverted.
        latency_s: fixed cost per copy (>= 0).
        median_rel_err: median |model - measured| / measured over all sizes.
        max_rel_err: the largest such error.
        n_sizes: sizes used.
    """

    bytes_per_s: float
    latency_s: float
    median_rel_err: float
    max_rel_err: float
    n_sizes: int

    def time_s(self, nbytes):
        return self.latency_s + np.asarray(nbytes, dtype=float) / self.bytes_per_s


def fit_link(nbytes, t_s, *, large_min_bytes: int = 16 * 2**20, small_max_bytes: int = 256 * 2**10) -> LinkFit:
    """Fit ``t = latency + bytes / bandwidth`` to per-size copy times.

    Args:
        nbytes: (n,) copy sizes in bytes (repeats allowed; the median per size is used).
        t_s: (n,) measured seconds.
        large_min_bytes: sizes at or above this fix the bandwidth (at least two needed).
        small_max_bytes: sizes at or below this fix the latency (at least one needed).

    Raises:
        ValueError: too few sizes in either range, or non-positive times.
    """
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(t_s, dtype=float)
    if b.shape != t.shape or b.ndim != 1:
        raise ValueError("fit_link: nbytes and t_s must be 1-D arrays of one length")
    if (t <= 0).any() or not np.isfinite(t).all():
        raise ValueError("fit_link: times must be finite and > 0")
    sizes = np.unique(b)
    med = np.array([np.median(t[b == s]) for s in sizes])
    large = sizes >= large_min_bytes
    small = sizes <= small_max_bytes
    if large.sum() < 2:
        raise ValueError(f"fit_link: need >= 2 sizes >= {large_min_bytes} bytes, got {int(large.sum())}")
    if small.sum() < 1:
        raise ValueError(f"fit_link: need a size <= {small_max_bytes} bytes")
    slope, _icpt = np.polyfit(sizes[large], med[large], 1)
    if slope <= 0:
        raise ValueError("fit_link: copy time does not grow with size; cannot fit a bandwidth")
    latency = float(max(np.mean(med[small] - slope * sizes[small]), 0.0))
    pred = latency + slope * sizes
    rel = np.abs(pred - med) / med
    return LinkFit(float(1.0 / slope), latency, float(np.median(rel)), float(rel.max()), int(sizes.size))


# ---------------------------------------------------------------------------------------
# GEMM roofline
# ---------------------------------------------------------------------------------------


def gemm_flops(m, n, k):
    """FLOP of an (m×k)·(k×n) matmul: ``2·m·n·k`` (arrays broadcast)."""
    return 2.0 * np.asarray(m, dtype=float) * np.asarray(n, dtype=float) * np.asarray(k, dtype=float)


def gemm_bytes(m, n, k, weight_bytes):
    """Bytes the cost model charges a matmul: weights plus f32 activations in and out
    (:func:`sim.model.costs.gemm_s`)."""
    m = np.asarray(m, dtype=float)
    return np.asarray(weight_bytes, dtype=float) + ACT_BYTES * m * (np.asarray(n, dtype=float) + np.asarray(k, dtype=float))


def roofline_time(flops, nbytes, flops_per_s: float, bytes_per_s: float, kernel_s: float):
    """``max(flops / flops_per_s, nbytes / bytes_per_s) + kernel_s`` (arrays broadcast)."""
    return np.maximum(np.asarray(flops, dtype=float) / flops_per_s, np.asarray(nbytes, dtype=float) / bytes_per_s) + kernel_s


@dataclass(frozen=True)
class RooflineFit:
    """A fitted GEMM roofline.

    Attributes:
        flops_per_s: effective matmul rate (the compute-bound ceiling).
        bytes_per_s: effective bytes/s of the memory-bound regime.
        kernel_s: fixed time per kernel.
        rms_log_err: root-mean-square of ``log(pred / measured)`` on the fitted points.
        median_rel_err, max_rel_err: |pred - measured| / measured on the fitted points.
        n_points: points fitted.
    """

    flops_per_s: float
    bytes_per_s: float
    kernel_s: float
    rms_log_err: float
    median_rel_err: float
    max_rel_err: float
    n_points: int

    def time_s(self, flops, nbytes):
        return roofline_time(flops, nbytes, self.flops_per_s, self.bytes_per_s, self.kernel_s)


def _grid_loss(lf, lb, lt, lp, lw, lk):
    """Mean squared log error for every (P, W, K) of the grids lp, lw, lk (log values).

    lf, lb, lt: (N,) log FLOP, log bytes, log time. Returns (len(lp), len(lw), len(lk))."""
    # times of the two regimes, (P, N) and (W, N)
    tc = np.exp(lf[None, :] - lp[:, None])
    tm = np.exp(lb[None, :] - lw[:, None])
    kk = np.exp(lk)
    out = np.empty((lp.size, lw.size, lk.size))
    for i in range(lp.size):
        roof = np.maximum(tc[i][None, :], tm)  # (W, N)
        pred = roof[:, None, :] + kk[None, :, None]  # (W, K, N)
        d = np.log(pred) - lt[None, None, :]
        out[i] = np.mean(d * d, axis=-1)
    return out


def fit_roofline(flops, nbytes, t_s, *, p_range=(1e11, 5e15), w_range=(1e10, 5e13),
                 k_range=(1e-7, 1e-4), n_grid: int = 24, n_refine: int = 5) -> RooflineFit:
    """Least-squares fit of ``log t = log(max(F/P, B/W) + K)``.

    Deterministic: a ``n_grid``³ grid over the log ranges, then ``n_refine`` rounds of a grid
    of the same size spanning ±2 steps of the previous grid around its best point.

    Args:
        flops, nbytes, t_s: (N,) FLOP, bytes (see :func:`gemm_bytes`) and measured seconds.
        p_range, w_range, k_range: search ranges of FLOP/s, bytes/s and seconds.

    Raises:
        ValueError: fewer than 3 points, or non-positive values.
    """
    f = np.asarray(flops, dtype=float)
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(t_s, dtype=float)
    if not (f.shape == b.shape == t.shape) or f.ndim != 1 or f.size < 3:
        raise ValueError("fit_roofline: need three 1-D arrays of one length >= 3")
    if (f <= 0).any() or (b <= 0).any() or (t <= 0).any():
        raise ValueError("fit_roofline: FLOP, bytes and times must be > 0")
    lf, lb, lt = np.log(f), np.log(b), np.log(t)
    lo = np.log([p_range[0], w_range[0], k_range[0]])
    hi = np.log([p_range[1], w_range[1], k_range[1]])
    best = None
    for _ in range(n_refine + 1):
        grids = [np.linspace(lo[j], hi[j], n_grid) for j in range(3)]
        loss = _grid_loss(lf, lb, lt, *grids)
        idx = np.unravel_index(np.argmin(loss), loss.shape)
        best = np.array([grids[j][idx[j]] for j in range(3)])
        step = (hi - lo) / (n_grid - 1)
        lo, hi = best - 2 * step, best + 2 * step
    assert best is not None
    p, w, k = np.exp(best)
    pred = roofline_time(f, b, p, w, k)
    rel = np.abs(pred - t) / t
    rms = float(np.sqrt(np.mean((np.log(pred) - lt) ** 2)))
    return RooflineFit(float(p), float(w), float(k), rms, float(np.median(rel)), float(rel.max()), int(f.size))


@dataclass(frozen=True)
class HoldoutResult:
    """The roofline's error on one group's points when fitted on the others.

    Attributes:
        group: the held-out group (a model name).
        n_points: held-out points.
        median_rel_err, max_rel_err: |pred - measured| / measured on them.
        fit: the fit without them.
    """

    group: str
    n_points: int
    median_rel_err: float
    max_rel_err: float
    fit: RooflineFit


def holdout_errors(groups, flops, nbytes, t_s, **fit_kw) -> list[HoldoutResult]:
    """Leave-one-group-out validation of :func:`fit_roofline`.

    Args:
        groups: (N,) group label of each point (e.g. the model the shape belongs to).
        flops, nbytes, t_s: as :func:`fit_roofline`.

    Returns:
        one :class:`HoldoutResult` per group with points, in sorted group order.
    """
    g = np.asarray(groups, dtype=object)
    f = np.asarray(flops, dtype=float)
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(t_s, dtype=float)
    out = []
    for name in sorted(set(g.tolist())):
        test = g == name
        if test.all() or (~test).sum() < 3:
            continue
        fit = fit_roofline(f[~test], b[~test], t[~test], **fit_kw)
        pred = fit.time_s(f[test], b[test])
        rel = np.abs(pred - t[test]) / t[test]
        out.append(HoldoutResult(str(name), int(test.sum()), float(np.median(rel)), float(rel.max()), fit))
    return out


def spread(values) -> dict[str, float]:
    """Median, min, max and relative spread ``(max - min) / median`` of repeated numbers."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("spread: no values")
    med = float(np.median(v))
    return {"median": med, "min": float(v.min()), "max": float(v.max()), "n": int(v.size),
            "rel_spread": float((v.max() - v.min()) / med) if med else float("nan")}
