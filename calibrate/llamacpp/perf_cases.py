"""ggml kernel timings at the shipped models' own shapes, through ``test-backend-ops perf``.

``test-backend-ops perf`` times a fixed list of cases. The project's ``perf-cases`` patch
(:mod:`calibrate.llamacpp.patches`) makes it time the cases of a file instead; this module
writes that file from the models (every distinct weight matmul with its real ggml type, every
expert tensor as MUL_MAT_ID, FlashAttention at the models' head geometry) over token counts and
KV depths, and parses the program's output into a table.

``python -m calibrate.llamacpp.perf_cases write OUT.txt [--models M.toml ...]`` writes the case
file; ``python -m calibrate.llamacpp.perf_cases parse LOG [--out CSV]`` reads a
``test-backend-ops perf`` log (the patched list or the fixed one).

Case lines (one per case; see the patch)::

    MUL_MAT <type> <m> <n> <k>                          # weight (k x m), n tokens
    MUL_MAT_ID <type> <n_expert> <n_used> <m> <n> <k>   # experts (k x m x n_expert), n tokens
    FLASH_ATTN_EXT <head_dim> <n_head> <n_head_kv> <kv> <n_tokens>
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.errors import PrefetchSimError

#: token counts of the weight matmuls: decode (1) up to the largest ubatch the grid uses
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: (tokens, KV length) of the attention cases: decode and prefill ubatches at depth
ATTN = ((1, 512), (1, 4096), (1, 8192), (1, 16384), (1, 32768),
        (512, 512), (512, 4096), (512, 8192), (512, 16384), (2048, 2048), (2048, 8192), (2048, 16384))
#: the shipped models the cases come from
DEFAULT_MODELS = ("scenarios/models/qwen3-30b-a3b.toml", "scenarios/models/gpt-oss-20b.toml",
                  "scenarios/models/gemma3-27b.toml", "scenarios/models/mixtral-8x7b.toml")


@dataclass(frozen=True)
class Case:
    """One ``test-backend-ops`` case (see the module docstring for the fields)."""

    op: str
    args: tuple

    def line(self) -> str:
        return " ".join([self.op, *map(str, self.args)])


def model_cases(model_toml: str | Path, tokens: Sequence[int] = TOKENS,
                attn: Sequence[tuple[int, int]] = ATTN) -> list[Case]:
    """The distinct cases of one model: weight matmuls ``(type, m, k)`` (ggml's ``ne[1], ne[0]``)
    for every token count, expert tensors as MUL_MAT_ID with the model's ``n_expert``/top-k, and
    FlashAttention at its head geometry (``(n_tokens, kv)`` pairs of ``attn``)."""
    from sim.benchflags import model_path
    from sim.specs import load_model

    from .gguf_writer import plan_tensors

    spec = load_model(model_path(str(model_toml)))
    mats: set[tuple[str, int, int]] = set()
    exps: set[tuple[str, int, int]] = set()
    for t in plan_tensors(spec):
        if not t.name.endswith(".weight") or len(t.ne) < 2 or t.ggml_type == "F32":
            continue  # norms, biases, routers (F32, tiny) and the embedding lookup
        if t.name.startswith("token_embd"):
            continue  # get_rows, not a matmul (a tied output is listed as output)
        if "_exps" in t.name and len(t.ne) == 3:
            exps.add((t.ggml_type, t.ne[1], t.ne[0]))
        else:
            mats.add((t.ggml_type, t.ne[1], t.ne[0]))
    if spec.arch == "gemma3" and not any(t.name == "output.weight" for t in plan_tensors(spec)):
        emb = next(t for t in plan_tensors(spec) if t.name == "token_embd.weight")
        mats.add((emb.ggml_type, emb.ne[1], emb.ne[0]))  # the tied output projection
    out: list[Case] = []
    for ty, m, k in sorted(mats):
        out += [Case("MUL_MAT", (ty, m, n, k)) for n in tokens]
    if spec.moe is not None:
        for ty, m, k in sorted(exps):
            out += [Case("MUL_MAT_ID", (ty, spec.moe.n_expert, spec.moe.n_expert_used, m, n, k)) for n in tokens]
    out += [Case("FLASH_ATTN_EXT", (spec.head_dim, spec.n_head, spec.n_head_kv, kv, nb)) for nb, kv in attn]
    return out


def write_cases(path: str | Path, models: Iterable[str | Path] = DEFAULT_MODELS, *,
                ops: Sequence[str] = ("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT"), **kw) -> list[Case]:
    """Write the distinct cases of ``models`` (in order, duplicates dropped) whose op is in
    ``ops`` to ``path``; ``kw`` goes to :func:`model_cases` (e.g. ``tokens=(1, 2, 4, 8, 16)``
    for the CPU backend, which runs the ops of fewer than 32 tokens)."""
    seen: dict[str, Case] = {}
    for m in models:
        for c in model_cases(m, **kw):
            if c.op in ops:
                seen.setdefault(c.line(), c)
    from sim.atomic import write_atomic

    write_atomic(path, "# test-backend-ops perf cases (calibrate/llamacpp/perf_cases.py)\n"
                 + "".join(c.line() + "\n" for c in seen.values()))
    return list(seen.values())


_LINE = re.compile(r"^\s*(?P<op>[A-Z_]+)\((?P<vars>[^)]*)\):\s+(?P<runs>\d+) runs -\s+(?P<us>[0-9.]+) us/run")


def _value(v: str):
    v = v.strip()
    if v.startswith("[") and v.endswith("]"):
        return v
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def parse_perf(text: str, backend: str | None = None) -> pd.DataFrame:
    """The timed cases of a ``test-backend-ops perf`` log as a table: ``backend, op, us_per_run,
    runs`` and one column per case variable (``type_a, m, n, k, n_mats, n_used, hsk, nh, nr, kv,
    nb, ...``, as the program prints them). Lines that are not timings are skipped; the backend
    is taken from the ``Backend i/n: NAME`` headers unless given."""
    rows = []
    cur = backend
    for ln in text.splitlines():
        b = re.match(r"^Backend \d+/\d+: (\S+)", ln)
        if b and backend is None:
            cur = b.group(1)
            continue
        m = _LINE.match(re.sub(r"\x1b\[[0-9;]*m", "", ln))
        if not m:
            continue
        rec = {"backend": cur, "op": m.group("op"), "us_per_run": float(m.group("us")), "runs": int(m.group("runs"))}
        # vars: key=value separated by commas, values may be [a,b] lists
        for kv in re.findall(r"(\w+)=(\[[^\]]*\]|[^,]*)", m.group("vars")):
            rec[kv[0]] = _value(kv[1])
        rows.append(rec)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.perf_cases", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write the case file")
    w.add_argument("out")
    w.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    p = sub.add_parser("parse", help="parse a test-backend-ops perf log")
    p.add_argument("log")
    p.add_argument("--out", help="CSV to write")
    args = ap.parse_args(argv)
    from sim.atomic import check_output_path

    try:
        if args.cmd == "write":
            check_output_path(args.out, "out")
            cases = write_cases(args.out, args.models)
            n = {op: sum(c.op == op for c in cases) for op in ("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT")}
            print(f"{args.out}: {len(cases)} cases ({', '.join(f'{v} {k}' for k, v in n.items())})")
        else:
            try:
                text = Path(args.log).read_text(errors="replace")
            except OSError as exc:
                raise PrefetchSimError(f"{args.log}: cannot read ({exc.strerror or exc})") from None
            df = parse_perf(text)
            if df.empty:
                raise PrefetchSimError(f"{args.log}: no timed case (not a test-backend-ops perf log?)")
            if args.out:
                check_output_path(args.out, "--out")
                from sim.atomic import write_atomic

                write_atomic(args.out, df.to_csv(index=False))
            print(df.to_string(index=False) if not df.empty else "no timed cases")
    except PrefetchSimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write '{exc.filename or args.out}': {exc.strerror or exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - output piped into head
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
