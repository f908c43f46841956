"""llama-bench-style reports: one typed row per (variant, test), printed as md, csv, json or jsonl.

The markdown layout follows ``llama-bench`` (``tools/llama-bench/llama-bench.cpp``,
``markdown_printer``): ``| model | size | params | backend | ngl | ... | test | t/s |`` with
``avg ± stdev`` in the ``t/s`` column, left-aligned text columns, right-aligned numbers (a
``:`` at the right end of the separator). Two columns are ours: ``variant`` (the scheduler
policy) and ``vs base`` (the change of mean t/s against the baseline variant, ``+14.7%``).

csv, json and jsonl carry every field of :class:`BenchRow` as a number in SI units with the unit
in the column name (``tps_mean``, ``ttft_s``, ``h2d_bytes``, ``size_bytes``), so they can be read
back without parsing labels. Missing optional values are empty in csv and ``null`` in json.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace

#: output formats understood by :func:`format_rows` (use as argparse ``choices``).
FORMATS = ("md", "csv", "json", "jsonl")


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench result row: a test (``pp512``, ``tg128``, ``pp512 @ d8192``) of a variant.

    Attributes:
        model: llama-bench's model label (``qwen3moe 30B.A3B Q4_K - Medium``).
        size_bytes: weight bytes of the model (shown as ``17.28 GiB``).
        n_params: parameter count (shown as ``30.53 B``).
        backend: ``CUDA`` (or ``SIM`` ...), as llama-bench's ``backend`` column.
        ngl: ``-ngl``.
        n_ubatch: ``-ub``.
        n_batch: ``-b``.
        n_cpu_moe: ``--n-cpu-moe``.
        variant: scheduler policy label (``baseline``, ``prefetch_ungated``, ``slots3`` ...).
        test: llama-bench test name.
        tps_mean: mean tokens per second over repetitions.
        tps_std: sample standard deviation of tokens per second over repetitions.
        speedup_vs_baseline: ``tps_mean / tps_mean(baseline)`` for the same test and setup;
            ``None`` for the baseline itself or when there is no baseline.
        ttft_s: time to first token (prompt tests), seconds.
        h2d_bytes: host→device bytes per test run.
        staging_bytes: VRAM reserved for prefetch staging, bytes.
        exposed_transfer_s: copy time not hidden behind compute, seconds per test run.
        overlap_fraction: share of copy time overlapped with compute, in [0, 1].
        cache_hit_rate: GPU expert-cache hit rate, in [0, 1].
        peak_vram_bytes: peak VRAM use per GPU, bytes.
        engine: which engine produced the row (``analytic``, ``des``, ``executor``).
    """

    model: str
    size_bytes: int
    n_params: int
    backend: str
    ngl: int
    n_ubatch: int
    n_batch: int
    n_cpu_moe: int
    variant: str
    test: str
    tps_mean: float
    tps_std: float
    speedup_vs_baseline: float | None = None
    ttft_s: float | None = None
    h2d_bytes: int | None = None
    staging_bytes: int | None = None
    exposed_transfer_s: float | None = None
    overlap_fraction: float | None = None
    cache_hit_rate: float | None = None
    peak_vram_bytes: int | None = None
    engine: str | None = None


#: column names of csv/json/jsonl output, in order (the :class:`BenchRow` field names).
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(BenchRow))


def size_label(size_bytes: float) -> str:
    """llama-bench's ``size`` column: bytes as ``17.28 GiB`` (GiB = 2**30)."""
    return f"{size_bytes / 2**30:.2f} GiB"


def params_label(n_params: float) -> str:
    """llama-bench's ``params`` column: a count as ``30.53 B`` (10**9)."""
    return f"{n_params / 1e9:.2f} B"


def tps_label(mean: float, std: float) -> str:
    """llama-bench's ``t/s`` cell: ``1234.56 ± 7.89``."""
    return f"{mean:.2f} ± {std:.2f}"


def speedup_label(speedup: float | None) -> str:
    """The ``vs base`` cell: a ratio of means as a signed percent change, one decimal.

    ``1.147 -> "+14.7%"``, ``0.952 -> "-4.8%"``, ``None -> ""`` (the baseline itself). A change
    that rounds to zero prints ``+0.0%`` (never ``-0.0%``); a non-finite ratio prints ``n/a``.
    """
    if speedup is None:
        return ""
    if not math.isfinite(speedup):
        return "n/a"
    pct = round((speedup - 1.0) * 100.0, 1)
    if pct == 0:
        pct = 0.0  # also turns -0.0 into +0.0
    return f"{pct:+.1f}%"


# (header, min width, right-aligned) of the markdown columns, after llama-bench's
# get_field_width: model 30 left, size/params 10, ngl 3, test 15, t/s 20, others >= 10.
_MD_COLUMNS: tuple[tuple[str, int, bool], ...] = (
    ("model", 30, False),
    ("size", 10, True),
    ("params", 10, True),
    ("backend", 10, False),
    ("ngl", 3, True),
    ("n_ubatch", 10, True),
    ("n_cpu_moe", 10, True),
    ("variant", 10, False),
    ("test", 15, True),
    ("t/s", 20, True),
    ("vs base", 10, True),
)


def _md_cells(row: BenchRow) -> tuple[str, ...]:
    return (
        row.model,
        size_label(row.size_bytes),
        params_label(row.n_params),
        row.backend,
        str(row.ngl),
        str(row.n_ubatch),
        str(row.n_cpu_moe),
        row.variant,
        row.test,
        tps_label(row.tps_mean, row.tps_std),
        speedup_label(row.speedup_vs_baseline),
    )


def _format_md(rows: Sequence[BenchRow]) -> str:
    cells = [_md_cells(r) for r in rows]
    widths = [max([w, len(h)] + [len(c[i]) for c in cells]) for i, (h, w, _) in enumerate(_MD_COLUMNS)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if right else v.ljust(w)
                 for v, w, (_, _, right) in zip(values, widths, _MD_COLUMNS)]
        return "| " + " | ".join(parts) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if right else "-" * w
                            for w, (_, _, right) in zip(widths, _MD_COLUMNS)) + " |"
    out = [line([h for h, _, _ in _MD_COLUMNS]), sep] + [line(c) for c in cells]
    return "\n".join(out) + "\n"


def _record(row: BenchRow) -> dict:
    rec = asdict(row)
    for k, v in rec.items():
        if isinstance(v, float) and not math.isfinite(v):
            rec[k] = None  # JSON has no NaN/inf
    return rec


def _format_csv(rows: Sequence[BenchRow]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in asdict(r).items()})
    return buf.getvalue()


def format_rows(rows: Iterable[BenchRow], fmt: str = "md") -> str:
    """Render rows as llama-bench does.

    Args:
        rows: the rows, printed in the given order.
        fmt: ``"md"`` (markdown table, the llama-bench default), ``"csv"`` (header + one line per
            row, all :data:`COLUMNS`), ``"json"`` (a list of objects) or ``"jsonl"`` (one object
            per line).

    Returns:
        The text, ending with a newline.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS`.
    """
    rows = list(rows)
    if fmt == "md":
        return _format_md(rows)
    if fmt == "csv":
        return _format_csv(rows)
    if fmt == "json":
        return json.dumps([_record(r) for r in rows], indent=2, ensure_ascii=False) + "\n"
    if fmt == "jsonl":
        return "".join(json.dumps(_record(r), ensure_ascii=False) + "\n" for r in rows)
    raise ValueError(f"unknown output format '{fmt}' (use one of: {', '.join(FORMATS)})")


def _setup_key(r: BenchRow) -> tuple:
    return (r.model, r.backend, r.ngl, r.n_ubatch, r.n_batch, r.n_cpu_moe, r.test, r.engine)


def with_speedups(rows: Iterable[BenchRow], baseline: str = "baseline") -> list[BenchRow]:
    """Fill ``speedup_vs_baseline`` as the ratio of mean t/s to the ``baseline`` variant's row
    of the same setup (model, backend, ngl, n_ubatch, n_batch, n_cpu_moe, test, engine).

    The baseline rows themselves, and rows whose setup has no baseline row (or a baseline with
    zero t/s), get ``None``. Order is kept.
    """
    rows = list(rows)
    base = {_setup_key(r): r.tps_mean for r in rows if r.variant == baseline}
    out = []
    for r in rows:
        b = base.get(_setup_key(r))
        s = None if (r.variant == baseline or not b) else r.tps_mean / b
        out.append(replace(r, speedup_vs_baseline=s))
    return out
