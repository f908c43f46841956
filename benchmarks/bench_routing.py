"""Benchmark and report of the routing model: call speed and the fit to the reported points.

Run: ``.venv/bin/python benchmarks/bench_routing.py [--repeat 5]``

Prints three tables:

* speed of :meth:`sim.model.routing.Router.used_mask` for a 48-layer 256-expert top-10 model over a
  pp8192 prefill (8192 tokens = 16 ubatches of 512, or 4 of 2048: 48 x 16 resp. 48 x 4
  calls), for uniform, skewed and trace routing, and of ``token_experts`` (target of the
  plan builder: < 50 ms per prefill's worth of ``used_mask`` calls);
* the skewed model fitted to the reported 256-expert points (34 tokens: 0.44, ubatch 2048:
  0.84) and its prediction of the 512-expert / 67-token report (0.39);
* the expected share of experts used versus tokens per ubatch, fitted model vs uniform.

Timings are the best of ``--repeat`` runs (``time.perf_counter``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import best_of, int_at_least  # noqa: E402
from sim.model.routing import (  # noqa: E402
    Router,
    RoutingSpec,
    expected_distinct_uniform,
    expected_fraction_skewed,
    fit_skew_detailed,
)

E, K, L = 256, 10, 48
TRACE = ROOT / "scenarios" / "traces" / "example_skewed_256x10.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="routing speed and fit")
    ap.add_argument("--repeat", type=int_at_least(1), default=5)
    a = ap.parse_args(argv)

    routers = {
        "uniform": Router(RoutingSpec(), E, K, L),
        "skewed": Router(RoutingSpec(kind="skewed"), E, K, L, np.random.default_rng(0)),
    }
    if TRACE.is_file():
        routers["trace"] = Router(RoutingSpec(kind="trace", trace_file=TRACE), E, K, L)
    rows = []
    for name, r in routers.items():
        for ub in (512, 2048):
            n_ub = 8192 // ub
            rng = np.random.default_rng(1)

            def prefill(r=r, ub=ub, n_ub=n_ub, rng=rng):
                for u in range(n_ub):
                    for layer in range(L):
                        r.used_mask(layer, ub, rng, u * ub)

            t = best_of(prefill, a.repeat)
            rows.append(dict(routing=name, call="used_mask", n_ubatch=ub, calls=L * n_ub,
                             total_ms=t * 1e3, per_call_us=t / (L * n_ub) * 1e6))
        for n in (1, 34, 512):
            rng = np.random.default_rng(2)
            t = best_of(lambda r=r, n=n, rng=rng: r.token_experts(0, n, rng), a.repeat)
            rows.append(dict(routing=name, call="token_experts", n_ubatch=n, calls=1, total_ms=t * 1e3,
                             per_call_us=t * 1e6))
    print("## Speed (48 layers, 256 experts, top-10; pp8192)\n")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.2f}"))

    fit = fit_skew_detailed([(34, 0.44), (2048, 0.84)], E, K)
    s, d = fit.spec.zipf_s, fit.spec.cold_share
    f512 = expected_fraction_skewed(512, 10, s, d, 67)
    print("\n## Fit to the reported 256-expert / top-10 points\n")
    print(f"zipf_s = {s:.4f}, cold_share = {d:.4f} ({d * E:.1f} of {E} experts cold), rss = {fit.rss:.2e}\n")
    fit_rows = [dict(model="256 experts top-10", tokens=b, reported=y, fitted=f, uniform=expected_distinct_uniform(E, K, b) / E)
                for (b, y), f in zip(fit.points, fit.fitted_fractions)]
    fit_rows.append(dict(model="512 experts top-10 (prediction)", tokens=67, reported=0.39, fitted=f512,
                         uniform=expected_distinct_uniform(512, 10, 67) / 512))
    print(pd.DataFrame(fit_rows).to_string(index=False, float_format=lambda v: f"{v:.4f}"))

    print("\n## Expected share of experts used vs tokens per ubatch (256 experts, top-10)\n")
    bs = [1, 8, 16, 32, 34, 64, 128, 250, 256, 512, 1024, 1040, 2048, 4096]
    curve = pd.DataFrame(dict(tokens=bs, skewed_fit=expected_fraction_skewed(E, K, s, d, np.array(bs)),
                              uniform=[expected_distinct_uniform(E, K, b) / E for b in bs]))
    if "trace" in routers:
        curve["example_trace"] = [routers["trace"].expected_fraction(b) for b in bs]
    print(curve.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
