"""Routing models: which experts each token of a ubatch uses, per MoE layer.

Three kinds (TOML ``[routing] kind = ...``):

``uniform``
    Every token picks ``k`` (top-k, ``n_expert_used``) distinct experts out of ``E``
    (``n_expert``) uniformly at random, independently of other tokens.

``skewed`` — *Zipf over the active experts + a cold share* (two parameters)
    Per layer, a random permutation of the experts (drawn once from the scenario seed, so
    each layer has its own hot experts) ranks them ``r = 1..E``. A share ``d``
    (``cold_share``) of the experts is *cold*: the workload's text never routes to them.
    The ``n_act = (1 - d) E`` active experts (a real number; the boundary expert gets the
    fractional part) have Zipf popularity with exponent ``s`` (``zipf_s``)::

        w_r = r^(-s) * clip(n_act - (r - 1), 0, 1)

    A token's top-k set is a fixed-size sample of ``k`` distinct experts whose *per-token
    inclusion probabilities* are proportional to the popularity, capped at 1
    ("water-filling")::

        pi_r = min(1, c * w_r),   c such that sum_r pi_r = k.

    Tokens are independent, so for a ubatch of ``B`` tokens the probability that expert
    ``e`` is used by at least one token, and the expected share of experts used, are exact::

        P(e used) = 1 - (1 - pi_e)^B,       f(B) = (1/E) * sum_e [1 - (1 - pi_e)^B].

    Why two parameters (docs/DESIGN.md): one Zipf exponent that gives 44 % of the experts at
    34 tokens gives ~100 % at 2048 tokens on a 256-expert top-10 model, while 84 % was
    reported. The cold share bounds f(B) by ``1 - d`` at large ubatches; the exponent sets
    how fast f approaches it. With ``d = 0`` and ``s = 0`` the model is ``uniform``.

    Fit to the two reported 256-expert / top-10 points (34 tokens: 0.44, ubatch 2048: 0.84),
    by :func:`fit_skew`: ``zipf_s = 0.9928``, ``cold_share = 0.1610`` (41.2 of 256 experts
    cold), which gives f(34) = 0.4400 and f(2048) = 0.8398 (:data:`LAGUNA_ZIPF_S`,
    :data:`LAGUNA_COLD_SHARE`, the defaults of ``kind = "skewed"``). The same parameters
    predict 0.407 for a 67-token prompt on a 512-expert top-10 model (reported: 0.39;
    uniform: 0.73). Model predictions in between (256 experts, top-10): f(128) = 0.73,
    f(256) = 0.815, f(512) = 0.838, f(B) -> 1 - d = 0.839 beyond.

    Caveats: at large ubatches f saturates at ``ceil(n_act)/E``, so ``cold_share`` is only
    determined to about 1/E by a large-ubatch point (the fractional boundary expert trades
    against ``s``); with ``s ~ 1`` and k = 10 the hottest expert of each layer has
    ``pi = 1`` (every token uses it). Other two-point-consistent families give different
    curves in between (e.g. Gamma/Dirichlet popularity: f(512) ~ 0.77), so crossovers that
    depend on f(250..1000) carry that model uncertainty.

``trace``
    Replays recorded router ids from a CSV file (see :func:`load_trace`): a ubatch of ``n``
    tokens at token offset ``o`` uses trace tokens ``o, o+1, ..., o+n-1`` *modulo* the trace
    length ``T`` (the trace wraps around; a ubatch of ``n >= T`` tokens uses every trace
    token, each once or more).

Per-token sampling (:meth:`Router.token_experts`) uses *randomised systematic sampling with
probability proportional to size* (Goodman & Kish 1950; Hartley & Rao 1962, "Sampling with
unequal probabilities and without replacement", Ann. Math. Statist. 33): the experts are put
in a fresh random order, their ``pi`` laid end to end on ``[0, k)``, and the ``k`` points
``u, u+1, ..., u+k-1`` (``u ~ U(0, 1]``) select the experts whose intervals contain them.
This yields exactly ``k`` distinct experts with exactly the inclusion probabilities ``pi``.

Randomness: only through an explicit :class:`numpy.random.Generator`; the one given to
:func:`make_router` draws the per-layer permutations, the one given to each call draws the
tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.errors import ScenarioError
from sim.tomlio import Fields
from sim.wording import plural

ROUTING_KINDS = ("uniform", "skewed", "trace")

#: Zipf exponent over the active experts fitted by :func:`fit_skew` to the reported
#: 256-expert / top-10 / 48-layer points (34 tokens: 0.44, ubatch 2048: 0.84; source:
#: ``shared/data/reported_measurements.csv``, case ``laguna_2x3090``). Default of ``skewed``.
LAGUNA_ZIPF_S = 0.9928
#: Cold share fitted together with :data:`LAGUNA_ZIPF_S`.
LAGUNA_COLD_SHARE = 0.1610

#: ubatches of at most this many tokens get an exact union of per-token draws in
#: :meth:`Router.used_mask` (so decode uses exactly top-k experts); larger ones draw each
#: expert's membership from its exact marginal (see :meth:`Router.used_mask`).
EXACT_MASK_MAX_TOKENS = 64

#: largest Zipf exponent :func:`fit_skew` searches.
FIT_ZIPF_S_MAX = 6.0


@dataclass(frozen=True)
class RoutingSpec:
    """How router ids are drawn.

    Attributes:
        kind: ``"uniform"``, ``"skewed"`` or ``"trace"`` (see the module docstring).
        zipf_s: Zipf exponent ``s >= 0`` over the active experts (``skewed`` only).
        cold_share: share ``d`` of experts never routed to, ``0 <= d <= 1 - k/E``
            (``skewed`` only).
        trace_file: CSV routing trace (``trace`` only).
    """

    kind: str = "uniform"
    zipf_s: float = LAGUNA_ZIPF_S
    cold_share: float = LAGUNA_COLD_SHARE
    trace_file: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in ROUTING_KINDS:
            raise ValueError(f"routing kind must be one of {ROUTING_KINDS}, got {self.kind!r}")
        if self.kind == "trace" and self.trace_file is None:
            raise ValueError("routing kind 'trace' needs a trace_file")
        if not (self.zipf_s >= 0 and math.isfinite(self.zipf_s)):
            raise ValueError(f"zipf_s must be a finite number >= 0, got {self.zipf_s}")
        if not 0 <= self.cold_share < 1:
            raise ValueError(f"cold_share must be in [0, 1), got {self.cold_share}")


# --------------------------------------------------------------------------------------
# Closed forms
# --------------------------------------------------------------------------------------


def expected_distinct_uniform(n_expert: int, top_k: int, n_tokens: int) -> float:
    """Expected number of distinct experts used by ``n_tokens`` tokens under uniform routing.

    ``E * (1 - (1 - k/E)^B)``: each token includes a given expert with probability ``k/E``,
    independently of the other tokens.
    """
    return n_expert * (1.0 - (1.0 - top_k / n_expert) ** n_tokens)


def _waterfill(weights: np.ndarray, top_k: int) -> np.ndarray:
    """Inclusion probabilities ``min(1, c*w)`` summing to ``top_k``, row-wise.

    Args:
        weights: (..., E) non-negative, each row non-increasing along the last axis, with at
            least ``top_k`` positive entries.
        top_k: k.

    Returns:
        array of the shape of ``weights``: per-token inclusion probabilities in [0, 1].

    With ``j`` experts capped at 1 the rest share ``k - j`` in proportion to their weight,
    ``c_j = (k - j) / sum_{i >= j} w_i``; the number capped is the smallest ``j`` for which
    the largest uncapped expert stays at or below 1 (``c_j * w_j <= 1``).
    """
    w = np.asarray(weights, dtype=float)
    tail = np.flip(np.cumsum(np.flip(w, -1), -1), -1)[..., :top_k]  # sum_{i>=j} w_i, j < k
    j = np.arange(top_k)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = (top_k - j) / tail
        ok = c * w[..., :top_k] <= 1.0 + 1e-12
    n_cap = np.argmax(ok, axis=-1)  # first valid j (j = k-1 is always valid: see docstring)
    c_sel = np.take_along_axis(c, n_cap[..., None], -1)
    pi = np.minimum(1.0, c_sel * w)
    pi = np.where(np.arange(w.shape[-1]) < n_cap[..., None], 1.0, pi)
    return pi


def _zipf_weights(n_expert: int, zipf_s: np.ndarray | float, cold_share: np.ndarray | float) -> np.ndarray:
    """Zipf popularity by rank with a cold share: ``r^-s * clip(n_act - (r-1), 0, 1)``.

    Broadcasts ``zipf_s`` and ``cold_share``; returns (..., E).
    """
    s = np.asarray(zipf_s, dtype=float)[..., None]
    n_act = (1.0 - np.asarray(cold_share, dtype=float)[..., None]) * n_expert
    r = np.arange(1, n_expert + 1, dtype=float)
    return r ** (-s) * np.clip(n_act - (r - 1.0), 0.0, 1.0)


def inclusion_probabilities(n_expert: int, top_k: int, zipf_s: float = 0.0, cold_share: float = 0.0) -> np.ndarray:
    """Per-token inclusion probability of the expert of popularity rank 1..E (skewed model).

    Args:
        n_expert: E.
        top_k: k, ``1 <= k <= E``.
        zipf_s: Zipf exponent ``s >= 0`` (0 with ``cold_share = 0`` is uniform routing).
        cold_share: share of experts never used, at most ``1 - k/E``.

    Returns:
        float array (E,), non-increasing, values in [0, 1], summing to k.

    Raises:
        ValueError: a parameter out of range.
    """
    _check_skew(n_expert, top_k, zipf_s, cold_share)
    return _waterfill(_zipf_weights(n_expert, zipf_s, cold_share), top_k)


def expected_fraction_skewed(n_expert: int, top_k: int, zipf_s: float, cold_share: float,
                             n_tokens: int | np.ndarray) -> float | np.ndarray:
    """Expected share of experts used by ``n_tokens`` independent tokens (skewed model).

    ``f(B) = (1/E) sum_e [1 - (1 - pi_e)^B]`` with ``pi`` from :func:`inclusion_probabilities`.
    Broadcasts over ``n_tokens``.
    """
    pi = inclusion_probabilities(n_expert, top_k, zipf_s, cold_share)
    b = np.asarray(n_tokens, dtype=float)
    out = _fraction_from_pi(pi, b)
    return float(out) if out.ndim == 0 else out


def _fraction_from_pi(pi: np.ndarray, n_tokens: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        log1m = np.log1p(-np.minimum(pi, 1.0))  # -inf where pi == 1
    b = np.asarray(n_tokens, dtype=float)
    prod = np.where(b[..., None] > 0, np.exp(b[..., None] * log1m), 1.0)
    return np.mean(1.0 - prod, axis=-1)


def _check_skew(n_expert: int, top_k: int, zipf_s: float, cold_share: float) -> None:
    if not 1 <= top_k <= n_expert:
        raise ValueError(f"need 1 <= top_k <= n_expert, got top_k={top_k}, n_expert={n_expert}")
    if not (zipf_s >= 0 and math.isfinite(zipf_s)):
        raise ValueError(f"zipf_s must be a finite number >= 0, got {zipf_s}")
    if not 0 <= cold_share <= 1 - top_k / n_expert + 1e-12:
        raise ValueError(f"cold_share must be in [0, 1 - top_k/n_expert = {1 - top_k / n_expert:.4g}], "
                         f"got {cold_share}")


# --------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SkewFit:
    """Result of :func:`fit_skew_detailed`.

    Attributes:
        spec: the fitted ``skewed`` routing.
        points: the (tokens, observed fraction) points fitted.
        fitted_fractions: the model's expected fraction at each point's token count.
        rss: residual sum of squares.
    """

    spec: RoutingSpec
    points: tuple[tuple[int, float], ...]
    fitted_fractions: tuple[float, ...]
    rss: float


def fit_skew(points: Sequence[tuple[int, float]], n_expert: int, top_k: int, *,
             kind: str = "zipf_cold") -> RoutingSpec:
    """Fit the skewed model's ``zipf_s`` and ``cold_share`` to observed expert fractions.

    Args:
        points: ``(tokens per ubatch, fraction of expert bytes copied)`` pairs; tokens >= 1,
            fraction in (0, 1]. Two points determine both parameters; more are fitted by
            least squares.
        n_expert: E of the model the points were measured on.
        top_k: k of that model.
        kind: the two-parameter model; only ``"zipf_cold"`` (Zipf over the active experts +
            cold share, see the module docstring).

    Returns:
        ``RoutingSpec(kind="skewed", zipf_s=..., cold_share=...)`` minimising
        ``sum_i (f(B_i) - y_i)^2`` over ``0 <= s <= FIT_ZIPF_S_MAX``,
        ``0 <= d <= 1 - k/E``.

    Method: an evaluation of ``f`` on a 41 x 41 grid over the box, then 14 rounds of a
    41 x 41 grid on a box shrunk by 4x around the best point (clipped to the bounds); ``f``
    is vectorised over the grid (see :func:`_waterfill`). Deterministic.

    Fit of the reported 256-expert / top-10 points [(34, 0.44), (2048, 0.84)]:
    ``zipf_s = 0.9928, cold_share = 0.1610`` reproducing 0.4400 and 0.8398 (0.84 itself is
    out of reach: at 2048 tokens f is within 2e-5 of ``ceil(n_act)/256`` = 215/256).

    Raises:
        ValueError: an unknown ``kind``, no points, or a point out of range.
    """
    return fit_skew_detailed(points, n_expert, top_k, kind=kind).spec


def fit_skew_detailed(points: Sequence[tuple[int, float]], n_expert: int, top_k: int, *,
                      kind: str = "zipf_cold") -> SkewFit:
    """:func:`fit_skew` with the achieved fractions and residual (a :class:`SkewFit`)."""
    if kind != "zipf_cold":
        raise ValueError(f"unknown skew model {kind!r}; only 'zipf_cold' (Zipf + cold share)")
    pts = tuple((int(b), float(y)) for b, y in points)
    if not pts:
        raise ValueError("fit_skew needs at least one (tokens, fraction) point")
    for b, y in pts:
        if b < 1 or not 0 < y <= 1:
            raise ValueError(f"point ({b}, {y}): need tokens >= 1 and 0 < fraction <= 1")
    if not 1 <= top_k <= n_expert:
        raise ValueError(f"need 1 <= top_k <= n_expert, got top_k={top_k}, n_expert={n_expert}")
    b = np.array([p[0] for p in pts], dtype=float)
    y = np.array([p[1] for p in pts], dtype=float)
    d_max = 1.0 - top_k / n_expert
    lo = np.array([0.0, 0.0])
    hi = np.array([FIT_ZIPF_S_MAX, d_max])
    box_lo, box_hi = lo.copy(), hi.copy()
    n_grid = 41
    best = None
    for _ in range(15):
        gs = np.linspace(box_lo[0], box_hi[0], n_grid)
        gd = np.linspace(box_lo[1], box_hi[1], n_grid)
        S, D = np.meshgrid(gs, gd, indexing="ij")
        pi = _waterfill(_zipf_weights(n_expert, S.ravel(), D.ravel()), top_k)  # (G, E)
        f = _fraction_from_pi(pi[:, None, :], b[None, :])                         # (G, P)
        rss = np.sum((f - y) ** 2, axis=1)
        i = int(np.argmin(rss))
        best = (S.ravel()[i], D.ravel()[i], float(rss[i]))
        half = (box_hi - box_lo) / 8.0
        centre = np.array(best[:2])
        box_lo = np.maximum(lo, centre - half)
        box_hi = np.minimum(hi, centre + half)
    s, d, rss = best
    spec = RoutingSpec(kind="skewed", zipf_s=float(s), cold_share=float(d))
    fitted = expected_fraction_skewed(n_expert, top_k, s, d, b)
    return SkewFit(spec=spec, points=pts, fitted_fractions=tuple(float(v) for v in np.atleast_1d(fitted)),
                   rss=rss)


# --------------------------------------------------------------------------------------
# Trace files
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RoutingTrace:
    """A validated routing trace.

    Attributes:
        file: the CSV it was read from.
        ids: int32 array (n_layer, n_tokens, top_k) of expert ids; rows of layers absent from
            the trace (only allowed for dense layers) are -1.
        layers: the layers present in the trace, sorted.
    """

    file: str
    ids: np.ndarray
    layers: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[1])


def load_trace(path: str | Path, *, n_expert: int, top_k: int, n_layer: int,
               first_moe_layer: int = 0) -> RoutingTrace:
    """Read and validate a CSV routing trace.

    Format (``#`` starts a comment line): columns ``layer``, ``token`` and the top-k ids,
    either as one column ``experts`` holding ``k`` ids separated by spaces or semicolons
    (``"3 17 42"``), or as ``k`` integer columns ``expert_0 .. expert_{k-1}``. Every layer
    ``first_moe_layer .. n_layer-1`` must appear, each with the same tokens ``0 .. T-1``,
    each (layer, token) once; other columns are ignored.

    Args:
        path: the CSV file.
        n_expert: E; ids must lie in ``[0, E)``.
        top_k: k; every row must have exactly k distinct ids.
        n_layer: the model's layers; trace layers must lie in ``[0, n_layer)``.
        first_moe_layer: the first MoE layer (``n_layer_dense_lead``).

    Returns:
        a :class:`RoutingTrace`.

    Raises:
        ScenarioError: with ``file`` the CSV and ``field`` the column (and data row, 1-based,
            not counting the header and comment lines) of the first problem.
    """
    p = Path(path)
    st = p.stat() if p.is_file() else None
    key = (str(p.resolve()), st.st_mtime_ns if st else None, st.st_size if st else None)
    return _load_trace_cached(key, str(p), n_expert, top_k, n_layer, first_moe_layer)


@lru_cache(maxsize=16)
def _load_trace_cached(key, path: str, n_expert: int, top_k: int, n_layer: int,
                       first_moe_layer: int) -> RoutingTrace:
    import pandas as pd

    p = Path(path)

    def err(field: str, msg: str) -> ScenarioError:
        return ScenarioError(msg, file=p, field=field)

    from sim.bounds import check_text_input

    if not p.exists():
        raise ScenarioError("routing trace file not found", file=p)
    check_text_input(p)
    try:
        df = pd.read_csv(p, comment="#", dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise ScenarioError("routing trace is empty (expected columns layer, token, experts)", file=p) from None
    except Exception as exc:  # pandas raises several parser error types
        raise ScenarioError(f"cannot read routing trace: {exc}", file=p) from None
    df.columns = [str(c).strip() for c in df.columns]
    for col in ("layer", "token"):
        if col not in df.columns:
            raise err(col, f"missing column '{col}' (found: {', '.join(df.columns) or 'none'})")
    if len(df) == 0:
        raise err("layer", "routing trace has no rows")

    def int_column(col: str) -> np.ndarray:
        s = df[col].str.strip()
        bad = ~s.str.fullmatch(r"[+-]?\d+")
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            raise err(f"{col}, row {i + 1}", f"expected an integer, got {df[col].iloc[i]!r}")
        big = s.str.lstrip("+-").str.lstrip("0").str.len() > 9  # > 999,999,999: past any layer/token/id
        if big.any():
            i = int(np.argmax(big.to_numpy()))
            raise err(f"{col}, row {i + 1}", f"{df[col].iloc[i]} is out of range (at most 9 digits)")
        return s.astype(np.int64).to_numpy()

    layer = int_column("layer")
    token = int_column("token")
    exp_cols = [c for c in df.columns if c.startswith("expert_")]
    if "experts" in df.columns:
        if exp_cols:
            raise err("experts", f"give the ids either in 'experts' or in expert_0..expert_{top_k - 1}, not both")
        parts = df["experts"].str.strip().str.split(r"[\s;]+", regex=True)
        counts = parts.str.len().to_numpy()
        empty = (df["experts"].str.strip() == "").to_numpy()
        counts = np.where(empty, 0, counts)
        wrong = counts != top_k
        if wrong.any():
            i = int(np.argmax(wrong))
            raise err(f"experts, row {i + 1}", f"expected {plural(top_k, 'id')} (the model's top-k), got {counts[i]}: "
                                                f"{df['experts'].iloc[i]!r}")
        flat = pd.Series([v for row in parts for v in row], dtype=str)
        bad = ~flat.str.fullmatch(r"[+-]?\d{1,9}")
        if bad.any():
            i = int(np.argmax(bad.to_numpy())) // top_k
            raise err(f"experts, row {i + 1}", f"expected integer expert ids (at most 9 digits), got "
                                                f"{df['experts'].iloc[i]!r}")
        ids = flat.astype(np.int64).to_numpy().reshape(-1, top_k)
        id_field = lambda i, j: f"experts, row {i + 1}"  # noqa: E731
    else:
        want = [f"expert_{j}" for j in range(top_k)]
        if not exp_cols:
            raise err("experts", "missing column 'experts' (or columns expert_0..expert_{k-1})")
        missing = [c for c in want if c not in df.columns]
        if missing:
            raise err(missing[0], f"missing column '{missing[0]}': the model's top-k is {top_k}")
        extra = sorted(set(exp_cols) - set(want))
        if extra:
            raise err(extra[0], f"unexpected column '{extra[0]}': the model's top-k is {top_k}, "
                                f"so the ids are expert_0..expert_{top_k - 1}")
        ids = np.stack([int_column(c) for c in want], axis=1)
        id_field = lambda i, j: f"expert_{j}, row {i + 1}"  # noqa: E731

    bad = (ids < 0) | (ids >= n_expert)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise err(id_field(i, j), f"expert id {ids[i, j]} out of range [0, {n_expert})")
    srt = np.sort(ids, axis=1)
    dup = (srt[:, 1:] == srt[:, :-1]).any(axis=1) if top_k > 1 else np.zeros(len(ids), bool)
    if dup.any():
        i = int(np.argmax(dup))
        raise err(id_field(i, 0), f"the {top_k} ids of a token must be distinct, got {ids[i].tolist()}")
    bad = (layer < 0) | (layer >= n_layer)
    if bad.any():
        i = int(np.argmax(bad))
        raise err(f"layer, row {i + 1}", f"layer {layer[i]} out of range: the model has {n_layer} layers")
    if (token < 0).any():
        i = int(np.argmax(token < 0))
        raise err(f"token, row {i + 1}", f"token index must be >= 0, got {token[i]}")
    order = np.lexsort((token, layer))
    lo, to = layer[order], token[order]
    same = (lo[1:] == lo[:-1]) & (to[1:] == to[:-1])
    if same.any():
        i = int(order[1:][same][0])
        raise err(f"token, row {i + 1}", f"layer {layer[i]} token {token[i]} appears twice")
    layers, counts = np.unique(layer, return_counts=True)
    n_tok = int(counts.max())
    for lay, cnt in zip(layers, counts):
        toks = np.sort(token[layer == lay])
        if cnt != n_tok or toks[-1] != n_tok - 1:
            raise err("token", f"every layer must have the same tokens 0..T-1; layer {lay} has {cnt} tokens "
                               f"{toks[0]}..{toks[-1]}, another layer has {n_tok}")
    missing = sorted(set(range(first_moe_layer, n_layer)) - set(layers.tolist()))
    if missing:
        raise err("layer", f"no rows for MoE layer{'s' if len(missing) > 1 else ''} "
                           f"{_ranges(missing)} (the model's MoE layers are {first_moe_layer}..{n_layer - 1})")
    arr = np.full((n_layer, n_tok, top_k), -1, dtype=np.int32)
    arr[layer, token] = ids
    arr.setflags(write=False)
    return RoutingTrace(file=str(p), ids=arr, layers=tuple(int(v) for v in layers))


def _ranges(vals: list[int]) -> str:
    out, start = [], vals[0]
    for a, b in zip(vals, vals[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}..{a}")
            start = b
    return ", ".join(out)


# --------------------------------------------------------------------------------------
# TOML
# --------------------------------------------------------------------------------------


def routing_from_fields(f: Fields, model) -> RoutingSpec:
    """Read a ``[routing]`` table.

    Fields: ``kind`` (``"uniform"`` default, ``"skewed"``, ``"trace"``); for ``skewed``
    either ``zipf_s`` and/or ``cold_share`` (defaults: the fit to the reported 256-expert
    points, :data:`LAGUNA_ZIPF_S`, :data:`LAGUNA_COLD_SHARE`) or ``fit_points =
    [[tokens, fraction], ...]`` to fit both to measured fractions on this model (see
    :func:`fit_skew`); for ``trace``, ``trace_file`` (relative to the scenario file).
    An empty or absent table is ``uniform``. A model without experts accepts any valid table
    (it is not used).

    Raises:
        ScenarioError: an unknown key, a value out of range, a parameter given for the wrong
            kind, or an invalid trace file (then naming the CSV and its column/row).
    """
    kind = f.str("kind", "uniform", choices=ROUTING_KINDS)
    moe = getattr(model, "moe", None)
    n_expert = moe.n_expert if moe is not None else None
    top_k = moe.n_expert_used if moe is not None else None
    skew_keys = [k for k in ("zipf_s", "cold_share", "fit_points") if f.has(k)]
    if kind != "skewed" and skew_keys:
        raise f.error(skew_keys[0], f"only for kind = \"skewed\" (kind is \"{kind}\")")
    if kind != "trace" and f.has("trace_file"):
        raise f.error("trace_file", f"only for kind = \"trace\" (kind is \"{kind}\")")
    spec = RoutingSpec(kind="uniform")
    if kind == "skewed":
        if f.has("fit_points"):
            for other in ("zipf_s", "cold_share"):
                if f.has(other):
                    raise f.error(other, "give either fit_points or zipf_s/cold_share, not both")
            pts = _read_points(f, "fit_points")
            if moe is None:
                spec = RoutingSpec(kind="skewed")
            else:
                _check_points(f, "fit_points", pts, n_expert, top_k)
                try:
                    fit = fit_skew_detailed(pts, n_expert, top_k)
                except ValueError as exc:
                    raise f.error("fit_points", str(exc)) from None
                miss = [(b, y, fy) for (b, y), fy in zip(pts, fit.fitted_fractions) if abs(fy - y) > FIT_POINT_TOL]
                if miss:
                    b, y, fy = miss[0]
                    raise f.error("fit_points", f"no skewed routing reproduces these points: the best fit gives "
                                                f"{fy:.3f} at {b} tokens where {y:g} is asked (more than "
                                                f"{FIT_POINT_TOL:g} off)")
                spec = fit.spec
        else:
            s = f.float("zipf_s", LAGUNA_ZIPF_S, min=0.0, max=FIT_ZIPF_S_MAX * 10)
            d = f.float("cold_share", LAGUNA_COLD_SHARE, min=0.0)
            if d >= 1:
                raise f.error("cold_share", f"must be < 1, got {d}")
            if moe is not None and d > 1 - top_k / n_expert + 1e-12:
                raise f.error("cold_share", f"must be <= 1 - top_k/n_expert = {1 - top_k / n_expert:.4g} "
                                            f"(at least top-k = {plural(top_k, 'expert')} must be active), got {d}")
            spec = RoutingSpec(kind="skewed", zipf_s=s, cold_share=d)
    elif kind == "trace":
        p = f.path("trace_file")
        if not p.exists() or p.is_dir():
            what = "is a folder, not a file" if p.is_dir() else "not found"
            raise f.error("trace_file", f"routing trace {what}: {p}")
        from sim.bounds import check_text_input

        check_text_input(p, file=f.file, field=f.name("trace_file"))
        spec = RoutingSpec(kind="trace", trace_file=p)
        if moe is not None:
            load_trace(p, n_expert=n_expert, top_k=top_k, n_layer=model.n_layer,
                       first_moe_layer=moe.n_layer_dense_lead)
    f.check_unknown()
    return spec


#: largest miss of a fitted fraction from a ``fit_points`` point: the reported fractions carry two
#: digits and the simulator reproduces published figures "within a few points" (docs/DESIGN.md)
FIT_POINT_TOL = 0.02


def _check_points(f: Fields, key: str, pts: list[tuple[int, float]], n_expert: int, top_k: int) -> None:
    """Points any routing could produce: distinct token counts; the fraction copied never
    decreases with tokens (a ubatch's experts include a smaller one's); at ``B`` tokens it
    lies in ``[k/E, min(1, B*k/E)]`` (one token uses k distinct experts).

    Raises:
        ScenarioError: naming the field and the first impossible point.
    """
    order = sorted(range(len(pts)), key=lambda i: pts[i][0])
    for a, b in zip(order, order[1:]):
        (ba, ya), (bb, yb) = pts[a], pts[b]
        if ba == bb:
            raise ScenarioError(f"{plural(ba, 'token')} given twice", file=f.file, field=f"{f.name(key)}[{b}]")
        if yb < ya:
            raise ScenarioError(f"the fraction copied cannot fall as tokens grow: {ya:g} at {plural(ba, 'token')} but {yb:g} "
                                f"at {bb}", file=f.file, field=f"{f.name(key)}[{b}]")
    for i, (b, y) in enumerate(pts):
        lo, hi = top_k / n_expert, min(1.0, b * top_k / n_expert)
        if not lo - 1e-9 <= y <= hi + 1e-9:
            raise ScenarioError(f"at {plural(b, 'token')} a top-{top_k} of {n_expert} experts copies between {lo:.4g} and "
                                f"{hi:.4g} of the experts, got {y:g}", file=f.file, field=f"{f.name(key)}[{i}]")


def _read_points(f: Fields, key: str) -> list[tuple[int, float]]:
    from sim.bounds import LIST_VALUES_MAX, TOKENS_MAX

    raw = f.raw(key)
    if not isinstance(raw, list) or not raw:
        raise f.error(key, "expected a list of [tokens, fraction] pairs, e.g. [[34, 0.44], [2048, 0.84]]")
    if len(raw) > LIST_VALUES_MAX:
        raise f.error(key, f"{len(raw)} points, more than the limit of {LIST_VALUES_MAX}")
    out = []
    for i, pt in enumerate(raw):
        fld = f"{f.name(key)}[{i}]"
        ok = (isinstance(pt, list) and len(pt) == 2 and isinstance(pt[0], int) and not isinstance(pt[0], bool)
              and isinstance(pt[1], (int, float)) and not isinstance(pt[1], bool))
        if not ok or not 1 <= pt[0] <= TOKENS_MAX or not 0 < pt[1] <= 1:
            raise ScenarioError(f"expected [tokens >= 1, 0 < fraction <= 1], got {pt!r}", file=f.file, field=fld)
        out.append((int(pt[0]), float(pt[1])))
    return out


# --------------------------------------------------------------------------------------
# Router
# --------------------------------------------------------------------------------------


class Router:
    """Draws router ids (top-k expert ids per token) for the MoE layers of one model.

    Build it with :func:`make_router`. For ``uniform`` and ``skewed`` routing the tokens are
    independent and ``token_offset`` is ignored; for ``trace`` it selects the trace tokens.

    Args:
        spec: the routing.
        n_expert: E.
        top_k: k.
        n_layer: layers of the model (layer ids are ``0 .. n_layer-1``).
        rng: draws the per-layer expert permutations of ``skewed`` routing (one
            ``rng.permutation(E)`` per layer, in layer order); unused by the other kinds.
        first_moe_layer: first MoE layer (only used to validate a trace).

    Raises:
        ValueError: inconsistent sizes, or ``skewed`` without ``rng``.
        ScenarioError: an invalid trace file.
    """

    def __init__(self, spec: RoutingSpec, n_expert: int, top_k: int, n_layer: int,
                 rng: np.random.Generator | None = None, *, first_moe_layer: int = 0):
        if not 1 <= top_k <= n_expert:
            raise ValueError(f"need 1 <= top_k <= n_expert, got top_k={top_k}, n_expert={n_expert}")
        if n_layer < 1:
            raise ValueError(f"n_layer must be >= 1, got {n_layer}")
        self.spec, self.n_expert, self.top_k, self.n_layer = spec, n_expert, top_k, n_layer
        self.trace: RoutingTrace | None = None
        self._pi: np.ndarray | None = None  # (n_layer, E) per-token inclusion probabilities
        if spec.kind == "trace":
            self.trace = load_trace(spec.trace_file, n_expert=n_expert, top_k=top_k, n_layer=n_layer,
                                    first_moe_layer=first_moe_layer)
        elif spec.kind == "uniform":
            self._pi_rank = np.full(n_expert, top_k / n_expert)
            self._pi = np.broadcast_to(self._pi_rank, (n_layer, n_expert))
        else:
            if rng is None:
                raise ValueError("skewed routing needs a numpy Generator for the per-layer permutations")
            _check_skew(n_expert, top_k, spec.zipf_s, spec.cold_share)
            self._pi_rank = inclusion_probabilities(n_expert, top_k, spec.zipf_s, spec.cold_share)
            #: perm[layer, r] = expert id of popularity rank r+1 in that layer
            self.perm = np.stack([rng.permutation(n_expert) for _ in range(n_layer)])
            pi = np.empty((n_layer, n_expert))
            np.put_along_axis(pi, self.perm, np.broadcast_to(self._pi_rank, pi.shape), axis=1)
            self._pi = pi
        if self._pi is not None:
            with np.errstate(divide="ignore"):
                self._log1m = np.log1p(-np.minimum(self._pi, 1.0))
        #: (layer, n_tokens) -> used_probability, read-only arrays (every ubatch of a prompt
        #: asks for the same few)
        self._used_p: dict[tuple[int, int], np.ndarray] = {}
        #: (layers, n_tokens) -> (L, E) stack of used_probability rows (read-only)
        self._used_p_stacks: dict[tuple, np.ndarray] = {}

    # -- queries ------------------------------------------------------------------------
    def inclusion(self, layer: int) -> np.ndarray:
        """(E,) per-token probability that each expert is among a token's top-k (iid kinds).

        Raises:
            ValueError: for trace routing (it has no model probabilities).
        """
        self._check_layer(layer)
        if self._pi is None:
            raise ValueError("trace routing has no inclusion probabilities")
        return np.array(self._pi[layer])

    def used_probability(self, layer: int, n_tokens: int) -> np.ndarray:
        """(E,) exact probability that each expert is used by a ubatch of ``n_tokens`` (iid kinds):
        ``1 - (1 - pi_e)^n``."""
        self._check_layer(layer)
        if self._pi is None:
            raise ValueError("trace routing has no inclusion probabilities")
        if n_tokens <= 0:
            return np.zeros(self.n_expert)
        return self._used_p_cached(layer, n_tokens).copy()

    def _used_p_cached(self, layer: int, n_tokens: int) -> np.ndarray:
        """:meth:`used_probability` (``n_tokens > 0``), computed once per (layer, n_tokens)
        and shared (read-only)."""
        key = (layer, n_tokens)
        p = self._used_p.get(key)
        if p is None:
            if len(self._used_p) > 4096:
                self._used_p.clear()
            p = self._used_p[key] = -np.expm1(n_tokens * self._log1m[layer])
            p.flags.writeable = False
        return p

    def token_experts(self, layer: int, n_tokens: int, rng: np.random.Generator,
                      token_offset: int = 0) -> np.ndarray:
        """Router ids of a ubatch: int64 array (n_tokens, top_k), distinct ids per row in [0, E).

        ``uniform``/``skewed``: randomised systematic PPS sampling (module docstring), cost
        O(n_tokens * E log E). ``trace``: rows ``token_offset .. token_offset+n_tokens-1`` of
        the layer's trace, modulo its length. The order of ids within a row carries no meaning.
        """
        self._check_layer(layer)
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if self.trace is not None:
            return self.trace.ids[layer, self._trace_rows(n_tokens, token_offset)].astype(np.int64)
        return _systematic_sample(self._pi[layer], self.top_k, n_tokens, rng)

    def used_mask(self, layer: int, n_tokens: int, rng: np.random.Generator,
                  token_offset: int = 0) -> np.ndarray:
        """Experts used by at least one token of a ubatch: bool array (E,).

        * ``trace``: exact union of the replayed rows.
        * ``uniform``/``skewed`` with ``n_tokens <= EXACT_MASK_MAX_TOKENS`` (decode, short
          prompts): exact union of :meth:`token_experts` draws (one token uses exactly k).
        * larger ubatches: each expert independently ``Bernoulli(1 - (1 - pi_e)^n)``. Its
          marginal ``P(e used)`` is the model's exact one (tokens are iid), so expected
          bytes copied, per expert and in total, are exact; only the correlation between
          experts is dropped (the count of used experts has a slightly larger variance than
          under the model, where each token takes exactly k). Cost O(E).
        """
        self._check_layer(layer)
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        mask = np.zeros(self.n_expert, dtype=bool)
        if n_tokens == 0:
            return mask
        if self.trace is not None:
            mask[self.trace.ids[layer, self._trace_rows(n_tokens, token_offset)].ravel()] = True
            return mask
        if n_tokens <= EXACT_MASK_MAX_TOKENS:
            mask[_systematic_sample(self._pi[layer], self.top_k, n_tokens, rng).ravel()] = True
            return mask
        if self._pi is None:
            raise ValueError("trace routing has no inclusion probabilities")
        return rng.random(self.n_expert) < self._used_p_cached(layer, n_tokens)

    def used_masks(self, layers: Sequence[int], n_tokens: int, rng: np.random.Generator,
                   token_offset: int = 0) -> list[np.ndarray]:
        """``[self.used_mask(i, n_tokens, rng, token_offset) for i in layers]``, the same draws
        from ``rng`` (the same values, consumed in the same order) made in one call: the
        uniform numbers of every layer are drawn at once (a generator's ``random(a)`` then
        ``random(b)`` equal ``random(a + b)``) and the sampling runs on all layers together.
        ``trace`` routing replays each layer (:meth:`used_mask`)."""
        layers = list(layers)
        for i in layers:
            self._check_layer(i)
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        E, L = self.n_expert, len(layers)
        if self.trace is not None or n_tokens == 0 or L == 0:
            return [self.used_mask(i, n_tokens, rng, token_offset) for i in layers]
        if n_tokens > EXACT_MASK_MAX_TOKENS:
            p = np.stack([self._used_p_cached(i, n_tokens) for i in layers])
            return list(rng.random(L * E).reshape(L, E) < p)
        return list(_systematic_used(self._pi[layers], self.top_k, n_tokens, rng, uniform=self.spec.kind == "uniform"))

    def used_masks_graphs(self, layers: Sequence[int], graphs: Sequence[tuple[int, int]],
                          rng: np.random.Generator) -> list[np.ndarray]:
        """:meth:`used_masks` of several graphs in order, ``graphs`` = ``[(n_tokens,
        token_offset), ...]``: the same draws from ``rng`` (the same values, consumed in the same
        order), each graph's masks as one (L, E) bool array (row ``k``: layer ``layers[k]``).
        Consecutive graphs of more than :data:`EXACT_MASK_MAX_TOKENS` tokens under an iid kind
        draw their uniforms in one call (``random(a)`` then ``random(b)`` equal
        ``random(a + b)``); the others are drawn graph by graph (:meth:`used_masks`).

        Raises:
            ValueError: a layer out of range or ``n_tokens < 0`` (as :meth:`used_masks`).
        """
        layers = list(layers)
        for i in layers:
            self._check_layer(i)
        E, L = self.n_expert, len(layers)
        out: list[np.ndarray] = []
        g = 0
        while g < len(graphs):
            n, off = graphs[g]
            if n < 0:
                raise ValueError(f"n_tokens must be >= 0, got {n}")
            if self.trace is not None or n <= EXACT_MASK_MAX_TOKENS or L == 0:
                ms = self.used_masks(layers, n, rng, off)
                out.append(np.stack(ms) if ms else np.zeros((0, E), dtype=bool))
                g += 1
                continue
            h = g
            while h < len(graphs) and graphs[h][0] > EXACT_MASK_MAX_TOKENS:
                h += 1
            u = rng.random((h - g) * L * E).reshape(h - g, L, E)
            stacks = self._used_p_stacks
            lk = tuple(layers)
            k = g
            while k < h:
                nk = graphs[k][0]
                p = stacks.get((lk, nk))
                if p is None:
                    if len(stacks) > 256:
                        stacks.clear()
                    # the rows of _used_p_cached(i, nk), computed together (element by element the
                    # same operations)
                    p = stacks[(lk, nk)] = -np.expm1(nk * self._log1m[list(layers)])
                    p.flags.writeable = False
                r = k + 1
                while r < h and graphs[r][0] == nk:
                    r += 1
                out.extend(u[k - g:r - g] < p)   # graphs k .. r-1 of nk tokens, compared at once
                k = r
            g = h
        return out

    def output_mask(self, layer: int, mask: np.ndarray, n_tokens: int, n_outputs: int,
                    token_offset: int = 0) -> np.ndarray:
        """The experts the output rows of a ubatch use, given ``mask`` (E,) bool, the experts its
        ``n_tokens`` tokens use: what the layer llama.cpp runs on the output rows only
        (:attr:`sim.model.specs.ModelSpec.output_rows_layer`) reads. ``mask`` itself when every
        token is an output, none without outputs. ``trace``: the exact union of the last
        ``n_outputs`` tokens' rows (a llama-bench call's output is its last token). ``uniform`` /
        ``skewed``: ``top_k * n_outputs`` of the used experts (all of them when fewer), those of
        the largest inclusion probability first, then by id: no draw, so the rng's stream and
        every other layer's masks are those of the ubatch; the count, which prices the op, is
        exact, the ids a representative choice (a one-token op runs where its weights are and
        copies nothing, so only an expert cache would read them).

        Returns:
            (E,) bool, a new array unless it is ``mask`` (every row an output).
        """
        if n_outputs >= n_tokens:
            return mask
        out = np.zeros(self.n_expert, dtype=bool)
        if n_outputs <= 0:
            return out
        if self.trace is not None:
            out[self.trace.ids[layer, self._trace_rows(n_outputs, token_offset + n_tokens - n_outputs)].ravel()] = True
            return out
        used = np.flatnonzero(mask)
        keep = self.top_k * n_outputs
        if used.size > keep:
            used = used[np.argsort(-self._pi[layer][used], kind="stable")[:keep]]
        out[used] = True
        return out

    def fixed_count(self, n_tokens: int) -> int | None:
        """Experts a ubatch of ``n_tokens`` uses when that count does not depend on the draws
        (``uniform``/``skewed`` with one token: exactly ``top_k``; no tokens: 0), else None."""
        if n_tokens == 0:
            return 0
        if self.trace is None and n_tokens == 1:
            return self.top_k
        return None

    def expected_fraction(self, n_tokens: int) -> float:
        """Expected share of the E experts used by a ubatch of ``n_tokens``, averaged over layers.

        ``uniform``/``skewed``: ``(1/E) sum_e [1 - (1 - pi_e)^n]`` (exact; the same for every
        layer since layers differ only by a permutation). ``trace``: exact average over the
        trace's MoE layers and over all ``T`` cyclic start offsets of the window (see
        :meth:`_trace_fraction`).
        """
        if n_tokens <= 0:
            return 0.0
        if self.trace is None:
            return float(_fraction_from_pi(self._pi_rank, np.asarray(float(n_tokens))))
        return self._trace_fraction(n_tokens)

    def sample(self, layer: int, n_tokens: int, rng: np.random.Generator, token_offset: int = 0) -> np.ndarray:
        """Alias of :meth:`token_experts` (the interface stub's name)."""
        return self.token_experts(layer, n_tokens, rng, token_offset)

    # -- internals ----------------------------------------------------------------------
    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.n_layer:
            raise ValueError(f"layer {layer} out of range [0, {self.n_layer})")
        if self.trace is not None and self.trace.ids[layer, 0, 0] < 0:
            raise ValueError(f"layer {layer} is not in the routing trace {self.trace.file}")

    def _trace_rows(self, n_tokens: int, token_offset: int) -> np.ndarray:
        return (token_offset + np.arange(n_tokens)) % self.trace.n_tokens

    def _trace_fraction(self, n_tokens: int) -> float:
        """Share of experts used by a window of ``n`` consecutive (cyclic) trace tokens,
        averaged over the T start offsets and the trace's layers.

        For an expert occurring at sorted positions ``p_1 < ... < p_m`` on the cycle of length
        T, the windows that miss it lie inside a gap of ``g`` tokens between consecutive
        occurrences; there are ``max(0, g - n + 1)`` of them per gap (T if m = 0).
        """
        T, E, n = self.trace.n_tokens, self.n_expert, n_tokens
        total = 0.0
        for lay in self.trace.layers:
            ids = self.trace.ids[lay]                                  # (T, k)
            if n >= T:
                total += np.unique(ids).size / E
                continue
            tok = np.repeat(np.arange(T), self.top_k)
            exp = ids.ravel()
            order = np.lexsort((tok, exp))
            exp_s, tok_s = exp[order], tok[order]
            first = np.r_[True, exp_s[1:] != exp_s[:-1]]
            nxt_same = np.r_[exp_s[1:] == exp_s[:-1], False]
            # gap after each occurrence to the next occurrence of the same expert (cyclic)
            first_pos = np.maximum.accumulate(np.where(first, np.arange(exp_s.size), 0))
            nxt_tok = np.where(nxt_same, np.r_[tok_s[1:], 0], tok_s[first_pos] + T)
            gap = nxt_tok - tok_s - 1
            missing = np.maximum(0, gap - n + 1).sum()
            n_absent = E - int(first.sum())
            windows_missing = missing + n_absent * T
            total += 1.0 - windows_missing / (T * E)
        return total / len(self.trace.layers)


def _systematic_sample(pi: np.ndarray, top_k: int, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """(n_tokens, top_k) distinct ids with inclusion probabilities ``pi`` (sum k, each <= 1).

    Randomised systematic PPS: per token, a random order of the experts, cumulative ``pi``
    ``C_j`` in that order, ``u ~ U(0, 1]``; expert at position ``j`` is taken iff an integer
    ``m`` satisfies ``C_{j-1} < u + m <= C_j``, i.e. ``floor(C_j - u) > floor(C_{j-1} - u)``.
    Exactly k are taken (``C_E = k``) and each with probability ``pi_j`` (the length of its
    interval), none twice (``pi_j <= 1``).
    """
    E = pi.shape[0]
    if n_tokens == 0:
        return np.empty((0, top_k), dtype=np.int64)
    order = np.argsort(rng.random((n_tokens, E)), axis=1)
    c = np.cumsum(pi[order], axis=1)
    c[:, -1] = top_k  # remove rounding drift of the cumulative sum
    u = 1.0 - rng.random(n_tokens)  # (0, 1]
    fl = np.floor(c - u[:, None])
    prev = np.concatenate([np.full((n_tokens, 1), -1.0), fl[:, :-1]], axis=1)
    take = fl > prev
    rows, cols = np.nonzero(take)
    if rows.size != n_tokens * top_k:  # cannot happen with sum(pi) == k and pi <= 1
        raise AssertionError("systematic sampling did not take exactly top_k experts per token")
    return order[rows, cols].reshape(n_tokens, top_k).astype(np.int64)


def _systematic_used(pi: np.ndarray, top_k: int, n_tokens: int, rng: np.random.Generator, *,
                     uniform: bool = False) -> np.ndarray:
    """(L, E) bool: the experts used by ``n_tokens`` tokens in each of L layers (rows of ``pi``),
    exactly as ``L`` calls of :func:`_systematic_sample` in layer order (each draws
    ``random((n_tokens, E))`` then ``random(n_tokens)``), from one draw of the same numbers.
    ``uniform``: every entry of ``pi`` is the same number, so the cumulative sums in any expert
    order are those of one row (the same values added in the same sequence)."""
    L, E = pi.shape
    n = n_tokens
    x = rng.random(L * (n * E + n)).reshape(L, n * E + n)
    order = np.argsort(x[:, :n * E].reshape(L, n, E), axis=2)
    if uniform:
        row = np.cumsum(pi[0])
        row[-1] = top_k
        c = np.broadcast_to(row, (L, n, E))
    else:
        c = np.cumsum(np.take_along_axis(np.broadcast_to(pi[:, None, :], (L, n, E)), order, axis=2), axis=2)
        c[:, :, -1] = top_k  # remove rounding drift of the cumulative sum
    u = 1.0 - x[:, n * E:]  # (0, 1]
    fl = np.floor(c - u[:, :, None])
    prev = np.concatenate([np.full((L, n, 1), -1.0), fl[:, :, :-1]], axis=2)
    take = fl > prev
    lay, tok, col = np.nonzero(take)
    if lay.size != L * n * top_k:  # cannot happen with sum(pi) == k and pi <= 1
        raise AssertionError("systematic sampling did not take exactly top_k experts per token")
    used = np.zeros((L, E), dtype=bool)
    used[lay, order[lay, tok, col]] = True
    return used


def make_router(spec: RoutingSpec, model, rng: np.random.Generator | None) -> Router:
    """Build the :class:`Router` of ``model`` (a :class:`sim.model.specs.ModelSpec` with experts).

    Args:
        spec: the routing (from :func:`routing_from_fields`).
        model: the model; ``model.moe`` gives E and k.
        rng: used only at construction (per-layer permutations of ``skewed`` routing); pass a
            generator seeded from the scenario seed (None is accepted for the other kinds,
            which never read it).

    Raises:
        ValueError: the model has no experts.
        ScenarioError: an invalid trace file.
    """
    if model.moe is None:
        raise ValueError(f"model '{model.name}' has no experts: no router")
    return Router(spec, model.moe.n_expert, model.moe.n_expert_used, model.n_layer, rng,
                  first_moe_layer=model.moe.n_layer_dense_lead)
