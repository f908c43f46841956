"""Tables of the ``h200-realloc`` lease (``calibrate/llamacpp/grids/h200-realloc.toml``).

Per realloc-logged invocation (``rl-<model>``) and llama-bench test (the phase-time lines give
each ubatch's graph compute; the ``prefetch-sim realloc-log`` lines printed before one belong to
that ubatch): for the first ubatch of each call and for the later ones, how many re-planned their
buffers (a ``reserve`` line: ggml's scheduler synchronised every backend first), the reason the
allocator gave (``nodes``: another node or leaf count than the last plan; ``src``/``node``: a
tensor larger than its place in it; ``backend``: the backends' assignment changed), and the
median allocation time (``alloc_us`` of the phase-time line: the wait for the GPU included).
A repetition's ubatches are the phase lines of one ``llama_decode`` call of ``n_prompt`` tokens
(``n_prompt / n_ubatch`` graphs of ``n_ubatch`` tokens).

Usage: PYTHONPATH=. python scripts/realloc_summary.py data/llamacpp/h100-20261207-realloc
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
from pathlib import Path

import numpy as np

PHASE = re.compile(r"prefetch-sim phase-time: n_tokens=(\d+) reused=(\d) .*alloc_us=(\d+)")
REALLOC = re.compile(r"prefetch-sim realloc-log: (gallocr nodes|gallocr src|gallocr node|reserve backend_ids_changed=(\d))")


def read_logs(run: Path) -> dict[str, str]:
    """``{invocation id: stderr text}`` from ``logs/`` or ``logs.tar.gz``."""
    out = {}
    if (run / "logs").is_dir():
        for f in sorted((run / "logs").glob("rl-*.log")):
            out[f.stem] = f.read_text(errors="replace")
        return out
    with tarfile.open(run / "logs.tar.gz") as tf:
        for m in tf.getmembers():
            name = Path(m.name).name
            if name.startswith("rl-") and name.endswith(".log"):
                out[name[:-4]] = tf.extractfile(m).read().decode(errors="replace")
    return out


def ubatches(text: str) -> list[tuple[int, int, int, str | None, bool]]:
    """Per graph compute in order: ``(n_tokens, reused, alloc_us, reason, replanned)``."""
    rows, reason, replanned = [], None, False
    for line in text.splitlines():
        m = REALLOC.search(line)
        if m:
            if m.group(1).startswith("reserve"):
                replanned = True
                if m.group(2) == "1":
                    reason = "backend"
            elif reason is None:
                reason = {"gallocr nodes": "nodes", "gallocr src": "src", "gallocr node": "node"}[m.group(1)]
            continue
        m = PHASE.search(line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), reason, replanned))
            reason, replanned = None, False
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    run = ap.parse_args().run
    lines = [json.loads(l) for l in (run / "llama-bench.jsonl").read_text().splitlines() if l.strip()]
    rows_of, at = {}, 0
    for l in (run / "invocations.jsonl").read_text().splitlines():
        inv = json.loads(l)
        n = int(inv.get("rows") or 0)
        rows_of[inv["id"]] = lines[at:at + n]
        at += n
    print("| invocation | fa | ub | test | first ubatch: re-planned / graphs | reason | alloc ms | "
          "later ubatches: re-planned / graphs | reason | alloc ms |")
    print("| --- | --- | ---: | --- | ---: | --- | ---: | ---: | --- | ---: |")
    for inv, text in read_logs(run).items():
        graphs = ubatches(text)
        inv_rows = rows_of.get(inv, [])
        k = 0
        for r in inv_rows:
            n_ub = int(r["n_ubatch"])
            per_call = max(1, -(-int(r["n_prompt"]) // n_ub)) if int(r["n_prompt"]) else 0
            if not per_call:
                continue
            calls = 1 + len(r.get("samples_ns") or [])   # llama-bench's warm-up call, then -r
            block = graphs[k:k + per_call * calls]
            k += per_call * calls
            first = [block[c * per_call] for c in range(calls) if c * per_call < len(block)]
            later = [block[c * per_call + u] for c in range(calls) for u in range(1, per_call)
                     if c * per_call + u < len(block)]
            def cell(g):
                if not g:
                    return "-", "-", "-"
                reasons = sorted({x[3] for x in g if x[3]})
                return (f"{sum(x[4] for x in g)} / {len(g)}", ", ".join(reasons) or "-",
                        f"{np.median([x[2] for x in g]) / 1e3:.1f}")
            f, lt = cell(first), cell(later)
            print(f"| {inv} | {r['flash_attn']} | {n_ub} | pp{r['n_prompt']} | {f[0]} | {f[1]} | {f[2]} | "
                  f"{lt[0]} | {lt[1]} | {lt[2]} |")
        if k != len(graphs):
            print(f"(note: {inv}: {len(graphs)} graph computes, {k} matched to the tests)")


if __name__ == "__main__":
    main()
