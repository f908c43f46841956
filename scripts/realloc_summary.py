"""Tables of the ``h200-realloc`` lease (``calibrate/llamacpp/grids/h200-realloc.toml``).

Per realloc-logged invocation (``rl-<model>``) and llama-bench test, for the first ubatch of each
``llama_decode`` call (llama-bench's warm-up and ``-r`` repetitions) and for the later ones: how many
re-planned their buffers (a ``reserve`` line: ggml's scheduler synchronised every backend first),
the reason the allocator gave (``nodes``: another node or leaf count than the last plan;
``src``/``node``: a tensor larger than its place in it; ``backend``: the backends' assignment
changed), and the median allocation time (``alloc_us`` of the phase-time line: the wait for the GPU
included). The ubatches and their calls come from :func:`calibrate.llamacpp.phasetime.call_table`
(which checks each log against llama-bench's order); the ``prefetch-sim realloc-log`` lines printed
before a phase-time line belong to that ubatch.

Usage: PYTHONPATH=. python scripts/realloc_summary.py data/llamacpp/h100-20261207-realloc
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

from calibrate.llamacpp.grid import read_log
from calibrate.llamacpp.phasetime import call_table

REALLOC = re.compile(r"prefetch-sim realloc-log: (gallocr nodes|gallocr src|gallocr node|reserve backend_ids_changed=(\d))")
REASON = {"gallocr nodes": "nodes", "gallocr src": "src", "gallocr node": "node"}


def realloc_per_ubatch(text: str) -> list[tuple[str | None, bool]]:
    """Per phase-time line of a log, in order: ``(reason, re-planned)`` from the realloc-log
    lines printed before it (since the previous phase-time line)."""
    out, reason, replanned = [], None, False
    for line in text.splitlines():
        m = REALLOC.search(line)
        if m:
            if m.group(1).startswith("reserve"):
                replanned = True
                reason = "backend" if m.group(2) == "1" else reason
            elif reason is None:
                reason = REASON[m.group(1)]
        elif "prefetch-sim phase-time:" in line:
            out.append((reason, replanned))
            reason, replanned = None, False
    return out


def _cell(g) -> tuple[str, str, str]:
    if g.empty:
        return "-", "-", "-"
    reasons = sorted({x for x in g["reason"] if isinstance(x, str)})
    return (f"{int(g['replanned'].sum())} / {len(g)}", ", ".join(reasons) or "-",
            f"{np.median(g['alloc_s']) * 1e3:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    run = ap.parse_args().run
    tab = call_table(run)
    tab = tab[tab["invocation"].str.startswith("rl-")].copy()
    tab["reason"], tab["replanned"] = None, False
    for inv in tab["invocation"].unique():
        sel = tab["invocation"] == inv
        marks = realloc_per_ubatch(read_log(run, f"logs/{inv}.log"))
        if len(marks) != int(sel.sum()):
            raise SystemExit(f"{run}/logs/{inv}.log: {len(marks)} phase lines, the call table has {int(sel.sum())}")
        tab.loc[sel, "reason"] = [r for r, _ in marks]
        tab.loc[sel, "replanned"] = [p for _, p in marks]
    print("| invocation | fa | ub | test | first ubatch: re-planned / graphs | reason | alloc ms | "
          "later ubatches: re-planned / graphs | reason | alloc ms |")
    print("| --- | --- | ---: | --- | ---: | --- | ---: | ---: | --- | ---: |")
    for (inv, _row), g in tab.groupby(["invocation", "row"], sort=True):
        f, lt = _cell(g[g["ubatch"] == 0]), _cell(g[g["ubatch"] > 0])
        r = g.iloc[0]
        print(f"| {inv} | {r['flash_attn']} | {r['n_ubatch']} | pp{r['n_prompt']} | {f[0]} | {f[1]} | {f[2]} | "
              f"{lt[0]} | {lt[1]} | {lt[2]} |")


if __name__ == "__main__":
    main()
