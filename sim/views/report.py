"""llama-bench's output, written by the simulator: one row per (variant, test), printed as md, csv,
json, jsonl or sql with llama-bench's field names, types and layout.

Every row carries every field of :data:`sim.views.llamabench.FIELDS` (``test::get_fields()`` of
``tools/llama-bench/llama-bench.cpp``, plus the project's prefetch patch's ``prefetch_weights``,
``prefetch_gate`` and ``prefetch_expert_slots``: the ``-pw``/``-pwg``/``-pes`` values of the row's
combination as given, else those of its variant, :func:`sim.views.llamabench.variant_fields`) with
llama-bench's meaning, then the simulator's own
fields (:data:`PROJECT_FIELDS`: ``variant``, ``engine``, the hardware profile, ``ttft_ms``,
``h2d_bytes`` ...). The printers follow llama-bench's (restated, not copied):

* ``json``: one array, one object per row, fields in order, STRING values quoted (``"``, ``\\``
  and control characters escaped), BOOL ``true``/``false``, INT bare, FLOAT as C's ``%f`` (six
  decimals), then ``samples_ns`` (integers) and ``samples_ts`` (six significant digits, as a
  C++ stream prints a double); our fields follow (``null`` for a missing value);
* ``jsonl``: the same object on one line per row;
* ``csv``: a header of the field names, then every value in double quotes (BOOL ``0``/``1``);
  no samples (as llama-bench);
* ``sql``: ``CREATE TABLE IF NOT EXISTS llama_bench (...)`` with llama-bench's columns and SQL
  types (TEXT, INTEGER, REAL), then one ``INSERT INTO llama_bench (...) VALUES ('...', ...);``
  per row, exactly as llama-bench writes them, so the output loads into a database that also
  holds real llama-bench rows (``prefetch-sim run -o sql | sqlite3 bench.sqlite``): upstream
  llama-bench's columns, and the prefetch patch's three only when asked for
  (``prefetch_columns``: ``prefetch-sim run`` with ``-pw``/``-pwg``/``-pes``, as the patched
  llama-bench; json and csv always carry them, as a row without them reads as no prefetch, but a
  table has the columns it was created with, and an INSERT naming one it lacks fails). Our fields
  go to a second table, ``prefetch_sim``, one row per ``llama_bench`` row, linked by
  ``llama_bench_rowid`` (``SELECT * FROM llama_bench b JOIN prefetch_sim s ON
  s.llama_bench_rowid = b.rowid``); a ``prefetch_sim`` row goes in only when its
  ``llama_bench`` row did (sqlite3's shell carries on after a failed INSERT: no row is left
  linked to another run's row). A ``'`` inside a value is doubled (llama-bench writes it
  as is, which breaks the statement);
* ``md``: llama-bench's table, ``| model | size | params | backend | ngl | ... | test | t/s |``:
  the columns llama-bench shows for the parameters that differ from its defaults or take
  several values, its column widths (widened where a value is longer, so the table stays
  aligned) and alignment, ``size`` in MiB below 1 GiB and GiB above, ``params`` in M below
  10^9 and B above, ``t/s`` as ``avg ± stddev``; then our ``variant`` column before ``test``
  and ``vs base`` (change of mean t/s against the baseline variant) after ``t/s``; and
  llama-bench's ``build:`` line saying what it is: ``build: simulated (prefetch-sim 0.1.0,
  analytic engine, profile 'H200 (measured)' scenarios/hardware/h200.toml)``.

Where llama-bench would print ``nan`` (an ``stddev`` of identical samples computed in floating
point can come out a hair below zero), the row has 0.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.views.llamabench import BOOL, CSV_FIELDS, FIELD_BY_NAME, FIELDS, FLOAT, INT, PATCH_FIELDS, PREFETCH_DEFAULTS, \
    STRING, UPSTREAM_FIELDS, bench_test_name, stdev_ns, stdev_ts

#: output formats understood by :func:`format_rows` (llama-bench's ``-o``, ``none`` aside)
FORMATS = ("md", "csv", "json", "jsonl", "sql")

#: the simulator's own fields, after llama-bench's, with their types (STRING, INT, FLOAT):
#: variant (scheduler policy), engine (analytic, des), hardware (profile name), hardware_file,
#: test (llama-bench's test label), speedup_vs_baseline (mean t/s over the baseline variant's,
#: same setting and test), ttft_ms (time to first token of a prompt, ms), h2d_bytes (bytes
#: copied host→device per run), peak_vram_bytes (largest GPU's peak), staging_bytes (VRAM
#: reserved for prefetch staging), overlap_fraction (share of copy time hidden behind compute),
#: exposed_transfer_s (copy time not hidden, s per run), cache_hit_rate (GPU expert cache)
PROJECT_FIELDS: tuple[tuple[str, str], ...] = (
    ("variant", STRING), ("engine", STRING), ("hardware", STRING), ("hardware_file", STRING), ("test", STRING),
    ("speedup_vs_baseline", FLOAT), ("ttft_ms", FLOAT), ("h2d_bytes", INT), ("peak_vram_bytes", INT),
    ("staging_bytes", INT), ("overlap_fraction", FLOAT), ("exposed_transfer_s", FLOAT), ("cache_hit_rate", FLOAT),
)
PROJECT_FIELD_NAMES: tuple[str, ...] = tuple(n for n, _ in PROJECT_FIELDS)
_PROJECT_TYPE = dict(PROJECT_FIELDS)

#: columns of csv output: llama-bench's (``test::get_fields()``), then ours
COLUMNS: tuple[str, ...] = CSV_FIELDS + PROJECT_FIELD_NAMES
#: keys of a json/jsonl object: llama-bench's (with the samples), then ours
JSON_COLUMNS: tuple[str, ...] = tuple(f.name for f in FIELDS) + PROJECT_FIELD_NAMES

#: llama-bench fields computed from the samples (:func:`bench_row`)
COMPUTED_FIELDS = ("avg_ns", "stddev_ns", "avg_ts", "stddev_ts")

#: llama-bench's ``cmd_params_defaults`` as printed, for the fields ``markdown_printer`` shows
#: only when a run's values differ from them (``n_threads``: the default depends on the machine;
#: it is given to :func:`format_rows`)
MD_DEFAULTS: Mapping[str, Any] = {
    "n_cpu_moe": 0, "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "n_batch": 2048, "n_ubatch": 512,
    "type_k": "f16", "type_v": "f16", "main_gpu": 0, "split_mode": "layer", "no_kv_offload": False,
    "flash_attn": -1, "devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none",
    "load_mode": "auto", "lazy_mode": "auto", "embeddings": False, "no_op_offload": 0, "no_host": False,
    "repack": True, "fit_target": 0, "fit_min_ctx": 0, **PREFETCH_DEFAULTS,
}
#: the optional markdown columns, in llama-bench's order (after ``ngl``)
MD_OPTIONAL = ("n_cpu_moe", "n_threads", "cpu_mask", "cpu_strict", "poll", "n_batch", "n_ubatch", "type_k", "type_v",
               "main_gpu", "split_mode", "no_kv_offload", "flash_attn", "devices", "tensor_split",
               "tensor_buft_overrides", "load_mode", "lazy_mode", "embeddings", "no_op_offload", "no_host", "repack",
               "fit_target", "fit_min_ctx", *PATCH_FIELDS)
#: ``markdown_printer::get_field_display_name``
_MD_NAME = {"n_gpu_layers": "ngl", "split_mode": "sm", "n_threads": "threads", "no_kv_offload": "nkvo",
            "flash_attn": "fa", "load_mode": "lm", "embeddings": "embd", "no_op_offload": "nopo", "no_host": "noh",
            "repack": "rpk", "devices": "dev", "tensor_split": "ts", "tensor_buft_overrides": "ot",
            "fit_target": "fitt", "fit_min_ctx": "fitc", "prefetch_weights": "pw", "prefetch_gate": "pwg",
            "prefetch_expert_slots": "pes", "vs_base": "vs base"}
#: ``markdown_printer::get_field_width`` where it is not the default (negative: left-aligned)
_MD_WIDTH = {"model": -30, "t/s": 20, "size": 10, "params": 10, "n_gpu_layers": 3, "n_threads": 7, "n_batch": 7,
             "n_ubatch": 8, "type_k": 6, "type_v": 6, "split_mode": 6, "load_mode": 10, "flash_attn": 3,
             "devices": -12, "test": 15, "no_op_offload": 4, "no_host": 4, "repack": 3,
             "prefetch_weights": 3, "prefetch_gate": 4, "prefetch_expert_slots": 4,
             "variant": -10, "vs_base": 10}


@dataclass(frozen=True)
class BenchRow:
    """One result row: a test of a variant under one setting of llama-bench's parameters.

    Attributes:
        values: every field of :data:`sim.views.llamabench.CSV_FIELDS`, typed as llama-bench's
            ``get_field_type`` says (str, bool, int, float); see :func:`bench_row`.
        samples_ns: the simulated time of each repetition, integer nanoseconds.
        samples_ts: tokens per second of each repetition (``1e9 * tokens / ns``).
        extra: the simulator's own fields (:data:`PROJECT_FIELDS`; None = no value).
    """

    values: Mapping[str, Any]
    samples_ns: tuple[int, ...] = ()
    samples_ts: tuple[float, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        if key in self.values:
            return self.values[key]
        if key == "samples_ns":
            return list(self.samples_ns)
        if key == "samples_ts":
            return list(self.samples_ts)
        return self.extra.get(key)

    @property
    def test(self) -> str:
        """llama-bench's test label (``pp512``, ``tg128``, ``pp512+tg128 @ d4096``)."""
        v = self.values
        return bench_test_name(v["n_prompt"], v["n_gen"], v["n_depth"])

    @property
    def variant(self) -> str | None:
        return self.extra.get("variant")

    @property
    def avg_ts(self) -> float:
        return self.values["avg_ts"]

    @property
    def stddev_ts(self) -> float:
        return self.values["stddev_ts"]


def _check_type(name: str, typ: str, v: Any) -> None:
    ok = {STRING: lambda x: isinstance(x, str), BOOL: lambda x: isinstance(x, bool),
          INT: lambda x: isinstance(x, int) and not isinstance(x, bool),
          FLOAT: lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)}[typ]
    if not ok(v):
        raise TypeError(f"field {name}: expected a llama-bench {typ} value, got {v!r}")


def sample_stats(samples_ns: Sequence[int], n_tokens: int) -> tuple[int, int, float, float, tuple[float, ...]]:
    """llama-bench's ``avg_ns``, ``stddev_ns``, ``avg_ts``, ``stddev_ts`` and ``samples_ts`` of
    integer-nanosecond samples, computed as its ``avg``/``stdev`` templates do: integer mean and
    one-pass integer variance for the nanoseconds (exact: no 64-bit wrap-around,
    :func:`sim.views.llamabench.stdev_ns`), ``1e9 * tokens / ns`` and one-pass double variance
    for the t/s (:func:`sim.views.llamabench.stdev_ts`; a variance below zero gives 0, not
    llama-bench's NaN).
    """
    ns = [int(x) for x in samples_ns]
    n = len(ns)
    ts = tuple(1e9 * n_tokens / x for x in ns)
    if not n:
        return 0, 0, 0.0, 0.0, ts
    avg_ns = sum(ns) // n
    std_ns = stdev_ns(ns, wrap=False)
    avg_ts = sum(ts) / n
    std_ts = stdev_ts(ts)[0]
    return avg_ns, std_ns, avg_ts, (0.0 if math.isnan(std_ts) else std_ts), ts


def bench_row(values: Mapping[str, Any], samples_ns: Sequence[int], extra: Mapping[str, Any] | None = None) -> BenchRow:
    """A row from llama-bench's fields (all of :data:`sim.views.llamabench.CSV_FIELDS` but
    :data:`COMPUTED_FIELDS`; the prefetch patch's, :data:`sim.views.llamabench.PATCH_FIELDS`, default
    to no prefetch), the samples (integer ns per repetition) and our fields.

    ``avg_ns``, ``stddev_ns``, ``avg_ts`` and ``stddev_ts`` are computed from the samples
    (:func:`sample_stats`, tokens ``n_prompt + n_gen``).

    Raises:
        KeyError: a llama-bench field is missing, or an unknown field is given.
        TypeError: a value of the wrong type for its field.
        ValueError: no sample, or a sample <= 0.
    """
    missing = [f for f in CSV_FIELDS if f not in values and f not in COMPUTED_FIELDS and f not in PREFETCH_DEFAULTS]
    if missing:
        raise KeyError(f"llama-bench fields missing: {', '.join(missing)}")
    unknown = [k for k in values if k not in FIELD_BY_NAME]
    if unknown:
        raise KeyError(f"not llama-bench fields: {', '.join(unknown)}")
    if not samples_ns or any(int(x) <= 0 for x in samples_ns):
        raise ValueError(f"samples must be > 0 ns, got {list(samples_ns)}")
    ex = dict(extra or {})
    bad = [k for k in ex if k not in _PROJECT_TYPE]
    if bad:
        raise KeyError(f"not project fields: {', '.join(bad)} (see sim.views.report.PROJECT_FIELDS)")
    vals = {f: values[f] if f in values else PREFETCH_DEFAULTS[f] for f in CSV_FIELDS if f not in COMPUTED_FIELDS}
    avg_ns, std_ns, avg_ts, std_ts, ts = sample_stats(samples_ns, vals["n_prompt"] + vals["n_gen"])
    vals.update(avg_ns=avg_ns, stddev_ns=std_ns, avg_ts=avg_ts, stddev_ts=std_ts)
    for k in CSV_FIELDS:
        _check_type(k, FIELD_BY_NAME[k].type, vals[k])
    ex.setdefault("test", bench_test_name(vals["n_prompt"], vals["n_gen"], vals["n_depth"]))
    for k, v in ex.items():
        if isinstance(v, float) and not math.isfinite(v):
            ex[k] = None  # JSON has no NaN/inf
        elif v is not None:
            _check_type(k, _PROJECT_TYPE[k], v)
    return BenchRow(vals, tuple(int(x) for x in samples_ns), ts, ex)


# --------------------------------------------------------------------------------------
# values as llama-bench prints them
# --------------------------------------------------------------------------------------


def _text(typ: str, v: Any) -> str:
    """A value as ``test::get_values()`` prints it: BOOL as ``std::to_string(bool)`` (``0``/``1``),
    FLOAT as ``std::to_string(double)`` (``%f``), the others as they are."""
    if typ == BOOL:
        return "1" if v else "0"
    if typ == FLOAT:
        return f"{v:f}"
    return str(v)


def _values_text(row: BenchRow) -> list[str]:
    return [_text(FIELD_BY_NAME[f].type, row.values[f]) for f in CSV_FIELDS]


def _escape_json(s: str) -> str:
    out = []
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _json_value(typ: str, text: str) -> str:
    """``format_json_value``: STRING quoted, BOOL true/false, numbers bare."""
    if typ == STRING:
        return '"' + _escape_json(text) + '"'
    if typ == BOOL:
        return "false" if text == "0" else "true"
    return text


def _g6(x: float) -> str:
    """A double as a C++ ``std::ostream`` prints it by default (six significant digits)."""
    s = f"{x:.6g}"
    return s


def _project_json(row: BenchRow) -> list[tuple[str, str]]:
    out = []
    for name, _typ in PROJECT_FIELDS:
        out.append((name, json.dumps(row.extra.get(name), ensure_ascii=False)))
    return out


def _json_pairs(row: BenchRow) -> list[tuple[str, str]]:
    pairs = [(f, _json_value(FIELD_BY_NAME[f].type, t)) for f, t in zip(CSV_FIELDS, _values_text(row))]
    pairs.append(("samples_ns", "[ " + ", ".join(str(x) for x in row.samples_ns) + " ]"))
    pairs.append(("samples_ts", "[ " + ", ".join(_g6(x) for x in row.samples_ts) + " ]"))
    return pairs + _project_json(row)


def _format_json(rows: Sequence[BenchRow]) -> str:
    objs = []
    for r in rows:
        body = ",\n".join(f'    "{k}": {v}' for k, v in _json_pairs(r))
        objs.append("  {\n" + body + "\n  }")
    return "[\n" + ",\n".join(objs) + ("\n" if objs else "") + "]\n"


def _format_jsonl(rows: Sequence[BenchRow]) -> str:
    out = []
    for r in rows:
        pairs = _json_pairs(r)
        n = len(CSV_FIELDS)
        head = "".join(f'"{k}": {v}, ' for k, v in pairs[:n])  # jsonl_printer: every field then ", "
        samples = f'"{pairs[n][0]}": {pairs[n][1]},"{pairs[n + 1][0]}": {pairs[n + 1][1]}'
        ours = "".join(f', "{k}": {v}' for k, v in pairs[n + 2:])
        out.append("{" + head + samples + ours + "}\n")
    return "".join(out)


def _project_text(row: BenchRow) -> list[str]:
    out = []
    for name, typ in PROJECT_FIELDS:
        v = row.extra.get(name)
        out.append("" if v is None else repr(float(v)) if typ == FLOAT else str(v))
    return out


def _format_csv(rows: Sequence[BenchRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    buf.write(",".join(COLUMNS) + "\n")  # llama-bench's header is not quoted
    for r in rows:
        w.writerow(_values_text(r) + _project_text(r))
    return buf.getvalue()


_SQL_TYPE = {STRING: "TEXT", BOOL: "INTEGER", INT: "INTEGER", FLOAT: "REAL"}
#: the table of our fields in sql output, one row per llama_bench row
SQL_PROJECT_TABLE = "prefetch_sim"


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _format_sql(rows: Sequence[BenchRow], prefetch_columns: bool = True) -> str:
    fields = CSV_FIELDS if prefetch_columns else tuple(f for f in CSV_FIELDS if f in UPSTREAM_FIELDS)
    lines = ["CREATE TABLE IF NOT EXISTS llama_bench ("]
    for i, f in enumerate(fields):
        lines.append(f"  {f} {_SQL_TYPE[FIELD_BY_NAME[f].type]}{',' if i < len(fields) - 1 else ''}")
    lines += [");", "", f"CREATE TABLE IF NOT EXISTS {SQL_PROJECT_TABLE} (", "  llama_bench_rowid INTEGER,"]
    for i, (name, typ) in enumerate(PROJECT_FIELDS):
        lines.append(f"  {name} {_SQL_TYPE[typ]}{',' if i < len(PROJECT_FIELDS) - 1 else ''}")
    lines += [");", ""]
    cols = ", ".join(fields)
    pcols = ", ".join(("llama_bench_rowid",) + PROJECT_FIELD_NAMES)
    for r in rows:
        vals = ", ".join(_sql_str(t) for f, t in zip(CSV_FIELDS, _values_text(r)) if f in fields)
        lines.append(f"INSERT INTO llama_bench ({cols}) VALUES ({vals});")
        pvals = ", ".join(["NULL" if r.extra.get(n) is None else _sql_str(t)
                           for n, t in zip(PROJECT_FIELD_NAMES, _project_text(r))])
        # linked to the llama_bench row just inserted, and only if that insert went in: when it
        # failed (a table without the patch's columns) the newest llama_bench row is one already
        # linked, and nothing is inserted (sqlite3's shell goes on after a failed statement)
        lines.append(f"INSERT INTO {SQL_PROJECT_TABLE} ({pcols}) SELECT max(rowid), {pvals} FROM llama_bench "
                     f"HAVING max(rowid) > (SELECT coalesce(max(llama_bench_rowid), 0) FROM {SQL_PROJECT_TABLE});")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# markdown
# --------------------------------------------------------------------------------------


def size_label(size_bytes: float) -> str:
    """llama-bench's ``size`` column: ``30.32 MiB`` below 1 GiB, ``17.28 GiB`` above."""
    if size_bytes < 2**30:
        return f"{size_bytes / 2**20:.2f} MiB"
    return f"{size_bytes / 2**30:.2f} GiB"


def params_label(n_params: float) -> str:
    """llama-bench's ``params`` column: ``52.11 M`` below 10^9, ``30.53 B`` above."""
    if n_params < 1e9:
        return f"{n_params / 1e6:.2f} M"
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


def md_columns(rows: Sequence[BenchRow], n_threads_default: int | None = None) -> list[str]:
    """The fields of the markdown table (``markdown_printer::print_header``): model, size,
    params, backend, ``n_gpu_layers`` (GPU backends), each optional field whose values differ
    from llama-bench's default (:data:`MD_DEFAULTS`) or take several values, then our
    ``variant``, ``test``, ``t/s`` and our ``vs_base``. ``n_threads`` is shown when its values
    are not all ``n_threads_default`` (or on a CPU backend)."""
    if n_threads_default is None:
        from sim.cli.benchflags import default_threads

        n_threads_default = default_threads()
    cols = ["model", "size", "params", "backend"]
    backends = {str(r.values["backends"]) for r in rows}
    cpu = any(("CPU" in b or "BLAS" in b) for b in backends)
    if not cpu:
        cols.append("n_gpu_layers")
    for f in MD_OPTIONAL:
        vals = {r.values[f] for r in rows}
        if f == "n_threads":
            show = cpu or len(vals) > 1 or (bool(vals) and vals != {n_threads_default})
        else:
            show = len(vals) > 1 or (bool(vals) and vals != {MD_DEFAULTS[f]})
        if show:
            cols.append(f)
    return cols + ["variant", "test", "t/s", "vs_base"]


def _md_cell(row: BenchRow, col: str) -> str:
    v = row.values
    if col == "model":
        return str(v["model_type"])
    if col == "size":
        return size_label(v["model_size"])
    if col == "params":
        return params_label(v["model_n_params"])
    if col == "backend":
        return str(v["backends"])
    if col == "test":
        return row.test
    if col == "t/s":
        return tps_label(v["avg_ts"], v["stddev_ts"])
    if col == "variant":
        return str(row.extra.get("variant") or "")
    if col == "vs_base":
        return speedup_label(row.extra.get("speedup_vs_baseline"))
    return _text(FIELD_BY_NAME[col].type, v[col])


def md_escape(text: str) -> str:
    """A table cell that cannot break the markdown table: ``|`` escaped as ``\\|``, line breaks
    and other control characters as spaces."""
    text = "".join(" " if (ord(ch) < 32 or ch in "\x7f\u2028\u2029\x85") else ch for ch in text)
    return text.replace("|", "\\|")


def _md_width(col: str) -> int:
    if col in _MD_WIDTH:
        return _MD_WIDTH[col]
    w = max(len(col), 10)
    typ = FIELD_BY_NAME[col].type if col in FIELD_BY_NAME else STRING  # get_field_type: STRING unless listed
    return -w if typ == STRING else w


def build_line(rows: Sequence[BenchRow]) -> str:
    """llama-bench's ``build:`` footer, saying the rows are simulated and by what:
    ``build: simulated (prefetch-sim 0.1.0, analytic engine, profile 'H200 (measured)'
    scenarios/hardware/h200.toml)``."""
    from sim import __version__

    def distinct(key: str) -> list[str]:
        out: list[str] = []
        for r in rows:
            x = r.extra.get(key)
            if x and x not in out:
                out.append(str(x))
        return out

    parts = [f"prefetch-sim {__version__}"]
    engines = distinct("engine")
    if engines:
        parts.append(f"{'/'.join(engines)} engine")
    profiles = []
    for r in rows:
        name, path = r.extra.get("hardware"), r.extra.get("hardware_file")
        if name:
            p = f"profile '{name}'" + (f" {path}" if path else "")
            if p not in profiles:
                profiles.append(p)
    parts += profiles
    return md_escape(f"build: simulated ({', '.join(parts)})")


def _format_md(rows: Sequence[BenchRow], n_threads_default: int | None) -> str:
    cols = md_columns(rows, n_threads_default)
    heads = [_MD_NAME.get(c, c) for c in cols]
    cells = [[md_escape(_md_cell(r, c)) for c in cols] for r in rows]
    widths = [max([abs(_md_width(c)), len(h)] + [len(row[i]) for row in cells]) for i, (c, h) in
              enumerate(zip(cols, heads))]
    right = [_md_width(c) > 0 for c in cols]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if r else "-" * w for w, r in zip(widths, right)) + " |"
    out = [line(heads), sep] + [line(c) for c in cells]
    return "\n".join(out) + "\n\n" + build_line(rows) + "\n"


def format_rows(rows: Iterable[BenchRow], fmt: str = "md", *, n_threads_default: int | None = None,
                prefetch_columns: bool = True) -> str:
    """Render rows as llama-bench does (see the module docstring).

    Args:
        rows: the rows, printed in the given order.
        fmt: one of :data:`FORMATS`.
        n_threads_default: the ``-t`` default of the run (llama-bench shows ``threads`` in md
            only when the values differ from it; None: :func:`sim.cli.benchflags.default_threads`).
        prefetch_columns: sql only: the ``llama_bench`` table has the prefetch patch's columns
            (:data:`sim.views.llamabench.PATCH_FIELDS`), as the patched llama-bench writes it;
            False: upstream llama-bench's columns (:data:`sim.views.llamabench.UPSTREAM_FIELDS`),
            so the rows go into a database an upstream llama-bench created (the variant stays
            in ``prefetch_sim``).

    Returns:
        The text, ending with a newline.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS`.
    """
    rows = list(rows)
    if fmt == "md":
        return _format_md(rows, n_threads_default)
    if fmt == "csv":
        return _format_csv(rows)
    if fmt == "json":
        return _format_json(rows)
    if fmt == "jsonl":
        return _format_jsonl(rows)
    if fmt == "sql":
        return _format_sql(rows, prefetch_columns)
    raise ValueError(f"unknown output format '{fmt}' (use one of: {', '.join(FORMATS)})")
