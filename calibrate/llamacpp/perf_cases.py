"""ggml kernel timings at the shipped models' own shapes, through ``test-backend-ops perf``.

``test-backend-ops perf`` times a fixed list of cases. The project's ``perf-cases`` patch
(:mod:`calibrate.llamacpp.patches`) makes it time the cases of a file instead; this module
writes that file from the models (every distinct weight matmul with its real ggml type, every
expert tensor as MUL_MAT_ID, FlashAttention at the models' head geometry) over token counts and
KV depths, and parses the program's output into a table.

``python -m calibrate.llamacpp.perf_cases write OUT.txt [--models M.toml ...]`` writes the case
file; ``python -m calibrate.llamacpp.perf_cases parse LOG [--out CSV]`` reads a
``test-backend-ops perf`` log (the patched list or the fixed one);
``python -m calibrate.llamacpp.perf_cases table LOG [LOG ...] --out CSV`` writes the kernel table
a ``[ggml]`` hardware profile reads (:func:`sim.model.ggmlcost.table_from_perf`).

Case lines (one per case; see the patch)::

    MUL_MAT <type> <m> <n> <k>                          # weight (k x m), n tokens
    MUL_MAT_ID <type> <n_expert> <n_used> <m> <n> <k>   # experts (k x m x n_expert), n tokens
    FLASH_ATTN_EXT <head_dim> <n_head> <n_head_kv> <kv> <n_tokens>
    MUL_MAT_B <type_a> <type_b> <m> <n> <k> <bs2> <nr2>  # a (k x m x bs2), b (k x n x bs2*nr2)
    SOFT_MAX <kv> <n_tokens> <n_head>

Two lists are made for a lease (:func:`gpu_cases`, :func:`cpu_cases`): every weight matmul and
expert matmul of the models at the token counts a llama-bench run meets, the attention of each
head geometry (FlashAttention and the unfused KQ / softmax / KQV of ``-fa 0``), and one *cold*
case per weight type: ``MUL_MAT_B`` over enough distinct matrices that their bytes exceed the
GPU's L2 (or the CPU's last-level cache). ``test-backend-ops perf`` repeats one op on one weight,
which then sits in the cache; in a model every layer reads other weights, so a matvec is priced
at no less than its bytes over the cold rate (:mod:`sim.model.ggmlcost`).
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
from sim.wording import plural

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
    from sim.cli.benchflags import model_path
    from sim.model.specs import load_model

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


#: models of the llama.cpp ground truth (the lease's case lists)
LEASE_MODELS = DEFAULT_MODELS[:3]
#: token counts of the GPU weight matmuls: decode, small batches, and every ubatch size used
GPU_TOKENS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: (n_tokens, kv) of the GPU attention cases (kv: keys attended, the new tokens included)
GPU_ATTN = ((1, 256), (1, 4096), (1, 8448), (1, 16384), (1, 32768), (64, 256), (128, 512), (128, 2048),
            (512, 512), (512, 2048), (512, 8704), (2048, 2048), (2048, 4096), (2048, 10240),
            (4096, 4096), (4096, 8192))
#: the subset timed for the unfused attention (``-fa 0``)
GPU_ATTN_UNFUSED = ((1, 256), (1, 8448), (64, 256), (128, 512), (128, 2048), (512, 512), (512, 2048),
                    (512, 8704), (2048, 2048), (2048, 4096), (4096, 4096), (4096, 8192))
#: (n_tokens, kv) of the CPU FlashAttention cases: layers left on the CPU by ``-ngl``
CPU_ATTN = ((1, 256), (1, 1280), (1, 8448), (512, 512), (512, 1536), (512, 2048), (2048, 2048))
#: bytes the distinct matrices of a cold case add up to (H200 L2: 50 MB; the CPU: above its L3)
COLD_BYTES = {"gpu": 512 * 2**20, "cpu": 2 * 2**30}


def _weights(spec) -> tuple[set, set, set]:
    """``(mats, exps, outs)`` of a model: distinct ``(type, m, k)`` of its weight matmuls, expert
    tensors and output head."""
    from .gguf_writer import plan_tensors

    mats, exps, outs = set(), set(), set()
    tensors = plan_tensors(spec)
    for t in tensors:
        if not t.name.endswith(".weight") or len(t.ne) < 2 or t.ggml_type == "F32" or t.name.startswith("token_embd"):
            continue
        key = (t.ggml_type, t.ne[1], t.ne[0])
        (exps if "_exps" in t.name and len(t.ne) == 3 else outs if t.name == "output.weight" else mats).add(key)
    if not any(t.name == "output.weight" for t in tensors):  # tied head
        emb = next(t for t in tensors if t.name == "token_embd.weight")
        outs.add((emb.ggml_type, emb.ne[1], emb.ne[0]))
    return mats, exps, outs


def _cold(kind: str, shapes) -> list[Case]:
    """One cold ``MUL_MAT_B`` case per type: its largest matrix, repeated to :data:`COLD_BYTES`."""
    from sim.model.quant import ggml_nbytes

    best: dict[str, tuple[int, int, int]] = {}
    for ty, m, k in shapes:  # the largest matrix up to 64 MiB (quantising random data takes time)
        b = ggml_nbytes(ty, k * m)
        key = (b <= 2**26, b if b <= 2**26 else -b)
        if ty not in best or key > (best[ty][0] <= 2**26, best[ty][0] if best[ty][0] <= 2**26 else -best[ty][0]):
            best[ty] = (b, m, k)
    out = []
    for ty, (b, m, k) in sorted(best.items()):
        copies = max(2, min(4096, -(-COLD_BYTES[kind] // b)))
        out.append(Case("MUL_MAT_B", (ty, "F32", m, 1, k, copies, 1)))
    return out


def weight_cases(cases: Iterable[Case]) -> list[Case]:
    """The weight matmuls of ``cases`` (``MUL_MAT``, ``MUL_MAT_ID``) and their cold cases
    (``MUL_MAT_B`` over distinct matrices, one broadcast: ``nr2`` 1), without the attention's
    (FlashAttention, softmax, and the unfused KQ/KQV, ``MUL_MAT_B`` with ``nr2`` the GQA ratio)."""
    return [c for c in cases if c.op in ("MUL_MAT", "MUL_MAT_ID") or (c.op == "MUL_MAT_B" and int(c.args[6]) == 1)]


def gpu_cases(models: Iterable[str | Path] = LEASE_MODELS) -> list[Case]:
    """The GPU list: weight matmuls at :data:`GPU_TOKENS` (the output head at 1 token: llama-bench
    computes the logits of the last token), expert matmuls at the same counts, FlashAttention at
    :data:`GPU_ATTN` and the unfused attention at :data:`GPU_ATTN_UNFUSED` for each head
    geometry, and the cold cases."""
    from sim.cli.benchflags import model_path
    from sim.model.specs import load_model

    out: list[Case] = []
    allm: set = set()
    for mt in models:
        spec = load_model(model_path(str(mt)))
        mats, exps, outs = _weights(spec)
        allm |= mats | outs | exps
        for ty, m, k in sorted(mats):
            out += [Case("MUL_MAT", (ty, m, n, k)) for n in GPU_TOKENS]
        out += [Case("MUL_MAT", (ty, m, 1, k)) for ty, m, k in sorted(outs)]
        if spec.moe is not None:
            for ty, m, k in sorted(exps):
                out += [Case("MUL_MAT_ID", (ty, spec.moe.n_expert, spec.moe.n_expert_used, m, n, k)) for n in GPU_TOKENS]
        hd, nh, nkv = spec.head_dim, spec.n_head, spec.n_head_kv
        out += [Case("FLASH_ATTN_EXT", (hd, nh, nkv, kv, nb)) for nb, kv in GPU_ATTN]
        for nb, kv in GPU_ATTN_UNFUSED:
            out += [Case("MUL_MAT_B", ("F16", "F32", kv, nb, hd, nkv, nh // nkv)),
                    Case("SOFT_MAX", (kv, nb, nh)),
                    Case("MUL_MAT_B", ("F16", "F32", hd, nb, kv, nkv, nh // nkv))]
    return out + _cold("gpu", allm)


def cpu_cases(models: Iterable[str | Path] = LEASE_MODELS) -> list[Case]:
    """The CPU list (ops of fewer than 32 tokens stay on the CPU backend, the op-offload rule):
    every weight, expert and output matmul at 1 token, FlashAttention of dense models at
    :data:`CPU_ATTN` (layers ``-ngl`` leaves on the CPU attend there, at prefill too), and the
    cold cases."""
    from sim.cli.benchflags import model_path
    from sim.model.specs import load_model

    out: list[Case] = []
    allm: set = set()
    for mt in models:
        spec = load_model(model_path(str(mt)))
        mats, exps, outs = _weights(spec)
        allm |= mats | outs | exps
        out += [Case("MUL_MAT", (ty, m, 1, k)) for ty, m, k in sorted(mats | outs)]
        if spec.moe is not None:
            out += [Case("MUL_MAT_ID", (ty, spec.moe.n_expert, spec.moe.n_expert_used, m, 1, k)) for ty, m, k in sorted(exps)]
        else:
            out += [Case("FLASH_ATTN_EXT", (spec.head_dim, spec.n_head, spec.n_head_kv, kv, nb)) for nb, kv in CPU_ATTN]
    return out + _cold("cpu", allm)


def write_case_list(path: str | Path, cases: Iterable[Case]) -> list[Case]:
    """Write ``cases`` (duplicates dropped, order kept) to ``path`` atomically; returns them."""
    from sim.atomic import write_atomic

    seen: dict[str, Case] = {}
    for c in cases:
        seen.setdefault(c.line(), c)
    write_atomic(path, "# test-backend-ops perf cases (calibrate/llamacpp/perf_cases.py)\n"
                 + "".join(c.line() + "\n" for c in seen.values()))
    return list(seen.values())


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
    t = sub.add_parser("table", help="the kernel table of a [ggml] hardware profile from perf logs")
    t.add_argument("logs", nargs="+")
    t.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from sim.atomic import check_output_path

    try:
        if args.cmd == "write":
            check_output_path(args.out, "out")
            cases = write_cases(args.out, args.models)
            n = {op: sum(c.op == op for c in cases) for op in ("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT")}
            print(f"{args.out}: {plural(len(cases), 'case')} ({', '.join(f'{v} {k}' for k, v in n.items())})")
        elif args.cmd == "table":
            from sim.atomic import write_atomic
            from sim.model.ggmlcost import table_from_perf

            check_output_path(args.out, "--out")
            frames = []
            for log in args.logs:
                try:
                    text = Path(log).read_text(errors="replace")
                except OSError as exc:
                    raise PrefetchSimError(f"{log}: cannot read ({exc.strerror or exc})") from None
                df = parse_perf(text)
                if df.empty:
                    raise PrefetchSimError(f"{log}: no timed case (not a test-backend-ops perf log?)")
                unread = sum("us/run" in ln for ln in text.splitlines()) - len(df)
                if unread > 0:   # a timing the pattern does not take (a negative or nan time): said, not hidden
                    print(f"perf_cases: warning: {log}: {plural(unread, 'timing line')} not read (not "
                          "'<runs> runs - <t> us/run' with a time >= 0)", file=sys.stderr)
                if df["backend"].isna().any():
                    raise PrefetchSimError(f"{log}: timings before any 'Backend i/n: NAME' line")
                frames.append(table_from_perf(df))
            tab = pd.concat(frames, ignore_index=True)
            kinds = sorted(set(tab["backend"].dropna()))
            if len(kinds) > 1:  # a profile reads one table per backend (gpu_kernels, cpu_kernels)
                raise PrefetchSimError(f"{', '.join(args.logs)}: cases of {' and '.join(kinds)} together; a "
                                       "[ggml] profile reads one table per backend: write one table per backend's logs")
            if tab.empty:
                raise PrefetchSimError(f"{', '.join(args.logs)}: no case of an op a kernel table holds "
                                       "(MUL_MAT, MUL_MAT_ID, FLASH_ATTN_EXT, SOFT_MAX)")
            from sim.model.quant import GGML_TYPE_BPW

            unknown = sorted({t for t in tab["type"].dropna().astype(str) if t.upper() not in GGML_TYPE_BPW})
            if unknown:   # a profile refuses a table with a type it cannot price
                raise PrefetchSimError(f"{', '.join(args.logs)}: ggml type(s) {', '.join(unknown)} unknown to the "
                                       "simulator (sim.model.quant.GGML_TYPE_BPW); the profile would refuse the table")
            key = [c for c in tab.columns if c != "t_us"]
            dup = tab.duplicated(subset=key)
            if dup.any():
                raise PrefetchSimError(f"{plural(int(dup.sum()), 'case')} {'appears' if dup.sum() == 1 else 'appear'} "
                                       "twice (the same log given twice?); "
                                       "give each log once")
            write_atomic(args.out, tab.to_csv(index=False))
            ops = ', '.join(f'{k} {v}' for k, v in tab['op'].value_counts().items())
            print(f"{args.out}: {plural(len(tab), 'kernel')} ({ops})")
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
        print(f"perf_cases: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"perf_cases: error: cannot write '{exc.filename or args.out}': {exc.strerror or exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - output piped into head
        return 0
    return 0


if __name__ == "__main__":
    from sim.cli.interrupt import run_interruptible

    sys.exit(run_interruptible("perf_cases", main))  # Ctrl-C / SIGTERM: one line, 130 / 143
