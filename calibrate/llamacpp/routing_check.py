"""The routing check of a measured grid: does the copy-bound regime move the bytes the routing
model predicts?

Two measurements, both reported (``python -m calibrate.llamacpp.routing_check RUN_DIR``):

1. **Counted** — the ``prefetch-sim copy-log`` lines the patched scheduler printed during the
   grid's ``kind = "routing"`` runs (:mod:`calibrate.llamacpp.patches`): per graph, the share of
   (layer, expert tensor, expert) triples the selective copy moved and its bytes, against the
   uniform-routing expectation ``f(B) = 1 - (1 - k/E)^B`` for a ubatch of ``B`` tokens
   (:func:`sim.model.routing.expected_distinct_uniform`).
2. **Timed** — the bytes llama-bench's time implies: per ubatch of a pp test with every expert on
   the host, ``(t_host - t_resident) * h2d_pinned`` where ``t`` is the ubatch time
   (``n_ubatch / t/s``) at the same ``n_ubatch`` and prompt, and ``h2d_pinned`` the pinned H2D
   bandwidth (measured in the same lease when ``h2d.json`` is there, else the hardware
   profile's). Baseline ggml never overlaps an expert copy with compute, so the difference is
   copy time plus the per-layer id readback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from sim.errors import PrefetchSimError
from sim.model.routing import expected_distinct_uniform

from .grid import read_log
from .patches import parse_copy_log


def _invocations(run_dir: Path) -> list[dict]:
    """The objects of the run folder's ``invocations.jsonl``.

    Raises:
        PrefetchSimError: the file is missing (not a grid run folder); ScenarioError (naming the
            file and line) a malformed line.
    """
    from .compare import jsonl_objects

    p = run_dir / "invocations.jsonl"
    if not p.is_file():
        raise PrefetchSimError(f"{p}: not found (not a grid run folder)")
    return [rec for _, rec in jsonl_objects(p, "one JSON object per llama-bench invocation")]


def _model_path(toml: str, repo: str | Path | None) -> Path:
    """A run's model TOML (repository-relative in invocations.jsonl): under ``repo``, or found as
    :func:`calibrate.llamacpp.compare.resolve` finds it (the current folder, the repository
    root, the shipped files), so the check runs from any folder."""
    from .compare import resolve

    return Path(repo) / toml if repo is not None else resolve(toml)


def counted(run_dir: str | Path, repo: str | Path | None = None) -> pd.DataFrame:
    """Per (routing run, ubatch size): graphs, measured used share and bytes per graph, and the
    uniform-routing prediction. Columns: ``run, model, n_expert, top_k, n_tokens, graphs,
    used_share, used_share_sd, uniform_share, expert_gib_copied, expert_gib_total,
    predicted_gib`` (``predicted_gib = uniform_share * expert_gib_total``: the share of whole
    expert tensors; ggml's 512-byte padding tails are not counted there)."""
    from sim.model.specs import load_model

    run_dir = Path(run_dir)
    rows = []
    for rec in _invocations(run_dir):
        if rec.get("kind") != "routing" or rec.get("rc") != 0:
            continue
        model = load_model(_model_path(rec["model_toml"], repo))
        moe = model.moe
        if moe is None:
            continue
        try:
            logs = parse_copy_log(read_log(run_dir, rec["log"]))
        except FileNotFoundError as exc:
            raise PrefetchSimError(f"routing run {rec['id']}: log not found: {exc}") from None
        except ValueError as exc:
            raise PrefetchSimError(f"routing run {rec['id']}: {rec['log']}: {exc}") from None
        df = pd.DataFrame([r for r in logs if r.get("moe_splits", 0) > 0])
        if df.empty:  # a routing run whose log has no copy-log line: said, not silently dropped
            print(f"routing_check: note: routing run {rec['id']}: no copy-log line with MoE splits in {rec['log']}; "
                  "left out", file=sys.stderr)
            continue
        for n_tok, g in df.groupby("n_tokens"):
            share = g["used_experts"] / g["expert_slots"]
            rows.append({
                "run": rec["id"], "model": rec["model"], "n_expert": moe.n_expert, "top_k": moe.n_expert_used,
                "n_tokens": int(n_tok), "graphs": len(g), "used_share": float(share.mean()),
                "used_share_sd": float(share.std(ddof=1)) if len(g) > 1 else 0.0,
                "uniform_share": expected_distinct_uniform(moe.n_expert, moe.n_expert_used, int(n_tok)) / moe.n_expert,
                "expert_gib_copied": float(g["expert_bytes_copied"].mean() / 2**30),
                "expert_gib_total": float(g["expert_bytes_total"].mean() / 2**30),
            })
    out = pd.DataFrame(rows)
    if not out.empty:
        out["predicted_gib"] = out["uniform_share"] * out["expert_gib_total"]
        out["share_error"] = out["used_share"] / out["uniform_share"] - 1
    return out


def timed(run_dir: str | Path, h2d_bytes_per_s: float, repo: str | Path | None = None) -> pd.DataFrame:
    """Per pp row with every expert on the host (``n_cpu_moe`` = layers, pinned): the bytes its
    time implies per ubatch against the uniform prediction (see the module docstring).
    Columns: ``model, test, n_ubatch, t_host_ms, t_resident_ms, implied_gib, predicted_gib,
    bytes_error``."""
    from sim.views.llamabench import read_llama_bench
    from sim.model.specs import load_model

    run_dir = Path(run_dir)
    df = read_llama_bench(run_dir / "llama-bench.jsonl")
    inv = {Path(r["gguf"]).name: r for r in _invocations(run_dir) if r.get("rc") == 0}
    out = []
    df = df[(df["n_gen"] == 0) & (df["n_depth"] == 0)]
    for fname, g in df.groupby(df["model_filename"].map(lambda s: Path(s).name)):
        rec = inv.get(fname)
        if rec is None:
            continue
        model = load_model(_model_path(rec["model_toml"], repo))
        if model.moe is None:
            continue
        n_layer = rec.get("n_layer") or model.n_layer
        exp_bytes = sum(t.nbytes for t in model.tensors if t.is_expert and t.layer < n_layer)
        host = g[(g["n_cpu_moe"] >= n_layer) & (g["load_mode"].astype(str) == "none")]
        res = g[(g["n_cpu_moe"] == 0) & (g["load_mode"].astype(str) == "none")]
        for _, h in host.iterrows():
            m = res[(res["n_ubatch"] == h["n_ubatch"]) & (res["n_prompt"] == h["n_prompt"])
                    & (res["flash_attn"].astype(str) == str(h["flash_attn"]))]
            if m.empty:
                continue
            ub = min(int(h["n_ubatch"]), int(h["n_prompt"]))
            t_h = ub / float(h["avg_ts"])
            t_r = ub / float(m["avg_ts"].iloc[0])
            share = expected_distinct_uniform(model.moe.n_expert, model.moe.n_expert_used, ub) / model.moe.n_expert
            implied = (t_h - t_r) * h2d_bytes_per_s
            out.append({"model": rec["model"], "test": h["test"], "n_ubatch": int(h["n_ubatch"]),
                        "t_host_ms": t_h * 1e3, "t_resident_ms": t_r * 1e3, "implied_gib": implied / 2**30,
                        "predicted_gib": share * exp_bytes / 2**30,
                        "bytes_error": implied / (share * exp_bytes) - 1})
    return pd.DataFrame(out)


def h2d_bandwidth(run_dir: str | Path, hardware: str | Path) -> tuple[float, str]:
    """Pinned H2D bytes/s: the lease's own probe (``h2d.json``) when present, else the
    hardware profile's ``h2d_pinned_gb_per_s`` (the source says which, and why when an
    ``h2d.json`` has no ``pinned_bytes_per_s``); returns ``(bytes_per_s, where from)``.

    Raises:
        PrefetchSimError: an ``h2d.json`` that is not JSON, or whose ``pinned_bytes_per_s`` is not
            a positive finite number.
    """
    import math

    p = Path(run_dir) / "h2d.json"
    why = ""
    if p.is_file():
        try:
            d = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PrefetchSimError(f"{p}: not JSON ({exc})") from None
        v = d.get("pinned_bytes_per_s") if isinstance(d, dict) else None
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PrefetchSimError(f"{p}: pinned_bytes_per_s {v!r}: not a positive rate in bytes/s")
            return float(v), f"{p} (measured in the lease)"
        why = f"; {p} has no pinned_bytes_per_s"
    from sim.model.specs import load_hardware

    hw = load_hardware(hardware)
    return hw.h2d_pinned.bytes_per_s, f"{hardware} h2d_pinned_gb_per_s{why}"


def check(run_dir: str | Path, hardware: str | Path = "scenarios/hardware/h200.toml"
          ) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """Both measurements of a run folder, nothing written: ``(the report's text, counted, timed)``;
    ``hardware`` a profile file or built-in name (for the pinned H2D rate when the folder has no
    ``h2d.json``).

    Raises:
        PrefetchSimError: a missing or malformed run file, model or profile (one line).
    """
    from .compare import check_run_dir, hardware_path

    check_run_dir(run_dir)
    c = counted(run_dir)
    bw, where = h2d_bandwidth(run_dir, str(hardware_path(hardware)))
    t = timed(run_dir, bw)
    with pd.option_context("display.width", 200):
        text = "\n".join([
            "Counted by the scheduler (copy-log), per graph:",
            c.to_string(index=False, float_format=lambda v: f"{v:.4g}") if not c.empty else "  (no routing runs)",
            f"\nImplied by llama-bench's time (pinned H2D {bw / 1e9:.2f} GB/s from {where}):",
            t.to_string(index=False, float_format=lambda v: f"{v:.4g}") if not t.empty else "  (no matching rows)",
        ]) + "\n"
    return text, c, t


def write_tables(out: str | Path, c: pd.DataFrame, t: pd.DataFrame) -> None:
    """Write both tables of :func:`check` as ``<out>_counted.csv`` and ``<out>_timed.csv``."""
    from sim.atomic import write_atomic_many

    write_atomic_many({f"{out}_counted.csv": c.to_csv(index=False), f"{out}_timed.csv": t.to_csv(index=False)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.routing_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--hardware", default="scenarios/hardware/h200.toml",
                    help="profile for the pinned H2D rate when the run has no h2d.json: a TOML or a built-in name")
    ap.add_argument("--out", help="write both tables as CSV (<out>_counted.csv, <out>_timed.csv)")
    args = ap.parse_args(argv)
    try:
        if args.out:  # both files, before any work (a folder that refuses them, a name that is a folder)
            from sim.atomic import check_output_path

            for suffix in ("_counted.csv", "_timed.csv"):
                check_output_path(f"{args.out}{suffix}", "--out")
        text, c, t = check(args.run_dir, args.hardware)
        sys.stdout.write(text)
        if args.out:
            write_tables(args.out, c, t)
    except PrefetchSimError as exc:
        print(f"routing_check: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"routing_check: error: cannot write '{exc.filename}': {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("routing_check", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
