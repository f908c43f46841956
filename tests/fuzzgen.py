"""Input mutations for the fuzz test (tests/test_fuzz_inputs.py) and the fuzz benchmark
(benchmarks/fuzz_inputs.py): one mutation of a shipped scenario, model, hardware profile, table
or routing trace, or of a command line, each labelled by what a correct simulator must do.

Labels: ``"invalid"`` (the input is nonsense: the command must end with a clean one-line error),
``"valid"`` (it should run), ``"either"`` (no claim: only a traceback or a hang is a failure).
A case is built from an integer seed (:func:`make_case`), deterministically; :func:`run_case`
runs one in this process and :func:`classify` names its outcome.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import shutil
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCN = REPO / "scenarios"

#: the shipped inputs a case starts from (name in the case folder -> shipped file)
BASE_FILES = {
    "tiny-moe.toml": SCN / "tiny" / "tiny-moe.toml",
    "tiny-gpu.toml": SCN / "tiny" / "tiny-gpu.toml",
    "h200.toml": SCN / "hardware" / "h200.toml",
    "h200-llamacpp.toml": SCN / "hardware" / "h200-llamacpp.toml",
    "qwen3-30b-a3b.toml": SCN / "models" / "qwen3-30b-a3b.toml",
    "gemma3-27b.toml": SCN / "models" / "gemma3-27b.toml",
}
#: folders of tables the profiles name (linked into each case folder)
BASE_DIRS = {"h200": SCN / "hardware" / "h200", "h200-llamacpp": SCN / "hardware" / "h200-llamacpp"}
TABLES = {"h200/gemm.csv": ("m", "n", "k", "t_s"), "h200/attn.csv": ("n_tokens", "kv_len", "n_head", "t_s"),
          "h200-llamacpp/kernels-cuda.csv": ("t_us",)}

#: keys whose string value is free text (any string is valid)
FREE_TEXT = {"name", "gpu_name", "source", "backend"}

OUTCOMES = ("clean error", "valid run", "traceback", "over time", "accepted nonsense")


def tiny_scenario(hardware: str = "tiny-gpu.toml", routing: str = 'kind = "uniform"',
                  variants: tuple[str, ...] = ("baseline", "slots2")) -> str:
    """The tiny golden scenario (scenarios/tiny/tiny.toml) over ``hardware``, with ``routing``."""
    vs = "".join(f'\n[[variant]]\nspec = "{v}"\n' for v in variants)
    return (f'[scenario]\nname = "tiny fuzz"\nmodel = "tiny-moe.toml"\nhardware = "{hardware}"\nseed = 1\n\n'
            '[placement]\nngl = 999\nn_cpu_moe = 2\nhost_memory = "pinned"\nctx_size = 256\n\n'
            '[workload]\nn_prompt = [64]\nn_gen = [4]\nn_depth = [0]\nn_ubatch = 64\nn_batch = 64\n'
            f'repetitions = 1\n\n[routing]\n{routing}\n{vs}')


def trace_csv(n_layer: int = 2, n_tokens: int = 64, n_expert: int = 8, top_k: int = 2, seed: int = 0) -> str:
    """A small routing trace for the tiny MoE (columns layer, token, experts)."""
    rng = random.Random(seed)
    lines = ["layer,token,experts"]
    for lay in range(n_layer):
        for t in range(n_tokens):
            lines.append(f"{lay},{t},{' '.join(str(i) for i in rng.sample(range(n_expert), top_k))}")
    return "\n".join(lines) + "\n"


#: the scenario files a case may start from (name -> text)
SCENARIOS = {
    "tiny.toml": tiny_scenario(),
    "tiny-h200.toml": tiny_scenario("h200.toml"),
    "tiny-ggml.toml": tiny_scenario("h200-llamacpp.toml"),
    "tiny-skew.toml": tiny_scenario(routing='kind = "skewed"\nfit_points = [[8, 0.6], [64, 0.95]]'),
    "tiny-trace.toml": tiny_scenario(routing='kind = "trace"\ntrace_file = "trace.csv"'),
}


# --------------------------------------------------------------------------------------
# TOML writing (the mutated data back to text)
# --------------------------------------------------------------------------------------


def _val(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_val(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() and k else json.dumps(k)


def dump_toml(data: dict) -> str:
    """TOML text of ``data``: top-level tables as ``[name]``, lists of tables as ``[[name]]``,
    everything else inline."""
    out = [f"{_key(k)} = {_val(v)}" for k, v in data.items()
           if not isinstance(v, dict) and not (isinstance(v, list) and v and all(isinstance(x, dict) for x in v))]
    for k, v in data.items():
        if isinstance(v, dict):
            out.append(f"\n[{_key(k)}]")
            out += [f"{_key(a)} = {_val(b)}" for a, b in v.items()]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for t in v:
                out.append(f"\n[[{_key(k)}]]")
                out += [f"{_key(a)} = {_val(b)}" for a, b in t.items()]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------


@dataclass
class Case:
    """One fuzz case.

    Attributes:
        seed: what it was built from.
        label: ``"valid"``, ``"invalid"`` or ``"either"``.
        what: a one-line description of the mutation.
        argv: the ``prefetch-sim`` command line (relative paths: the case folder).
        files: file name in the case folder -> bytes (mutated or generated inputs).
        fifo: names of FIFOs to create in the case folder.
    """

    seed: int
    label: str
    what: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    fifo: list[str] = field(default_factory=list)


def _leaves(data, path=()):
    """(path, value) of every leaf of parsed TOML (a sourced ``{value, source}`` is two leaves)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        for i, v in enumerate(data):
            yield from _leaves(v, path + (i,))
    else:
        yield path, data


def _set(data, path, value):
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


def _del(data, path):
    for p in path[:-1]:
        data = data[p]
    del data[path[-1]]


def _mutate_number(rng: random.Random, path, v, in_hardware: bool):
    """(new value, label, description) of a numeric leaf."""
    key = next((p for p in reversed(path) if isinstance(p, str) and p != "value"), "")
    ops = ["nan", "inf", "-inf", "neg", "huge_int", "string", "bool", "scale", "same", "list"]
    if in_hardware:
        ops += ["tiny", "overflow", "tiny", "overflow"]
    if isinstance(v, int) and key != "seed":
        ops += ["big_size", "big_size"]
    op = rng.choice(ops)
    if op == "nan":
        return float("nan"), "invalid", "NaN"
    if op == "inf":
        return float("inf"), "invalid", "inf"
    if op == "-inf":
        return float("-inf"), "invalid", "-inf"
    if op == "neg":
        if key == "ngl":  # llama.cpp: n_gpu_layers < 0 offloads every layer (llama_model::n_gpu_layers)
            return -abs(v) - 1, "valid", "negative (every layer, as llama.cpp reads it)"
        return -abs(v) - 1 if isinstance(v, int) else -abs(v) - 0.5, "invalid", "negative"
    if op == "huge_int":
        return 2**64 + rng.randrange(1000), "invalid", "past int64"
    if op == "big_size":
        return 10**12 + rng.randrange(1000), "invalid", "10**12"
    if op == "string":
        return "abc", "invalid", "a string"
    if op == "bool":
        return True, "invalid", "a bool"
    if op == "list":
        return [v, v], "invalid", "a list"
    if op == "tiny":
        return rng.choice([1e-320, 5e-324, 1e-300, 1e-30]), "invalid", "tiny positive"
    if op == "overflow":
        return rng.choice([1e308, 1e300, 1e200, 1e30]), "invalid", "overflow after scaling"
    if op == "same":
        return v, "valid", "unchanged"
    # a small change: no claim (an efficiency x2 may pass 1, a head count may stop dividing)
    if isinstance(v, int):
        return max(0, v + rng.choice([-1, 1])), "either", "+-1"
    return v * rng.choice([0.5, 0.9, 1.1, 2.0]), "either", "scaled"


def _mutate_string(rng: random.Random, path, v, in_hardware: bool):
    key = next((p for p in reversed(path) if isinstance(p, str)), "")
    if key == "arch" and not in_hardware:  # a model's arch: one of sim.model.specs.TOML_ARCHS, or "" (generic)
        return rng.choice([("qwen9", "invalid", "unknown arch"), ("a|b", "invalid", "odd arch text"),
                           ("", "valid", "no arch (a generic model)")])
    if key in FREE_TEXT:
        if key == "source" and rng.random() < 0.3:
            return "  ", "invalid" if in_hardware else "either", "blank source"
        return rng.choice(["a|b", "x\ny", "pipe | and\nnewline", "naïve ünïcode", "a" * 300]), \
            "valid" if key != "source" else "either", "odd free text"
    op = rng.choice(["bogus", "empty", "number", "devzero"])
    if path and path[0] == "quant" and op == "number":
        return 3, "either", "a number (bits per weight: valid for a tensor group)"
    if op == "bogus":
        return "bogus-value", "invalid", "unknown choice or missing file"
    if op == "empty":
        return "", "invalid", "empty string"
    if op == "devzero":
        return "/dev/zero", "invalid", "/dev/zero"
    return 3, "invalid", "a number"


def _toml_case(rng: random.Random, seed: int, name: str, text: str, scenario: str) -> Case:
    data = tomllib.loads(text)
    in_hw = name.startswith(("tiny-gpu", "h200"))
    op = rng.choices(["leaf", "delete", "unknown", "deep", "bom", "garbage", "truncate", "devzero", "fifo"],
                     weights=[14, 2, 1, 1, 1, 1, 1, 1, 1])[0]
    argv = ["run", scenario, "-q"]
    if op == "leaf":
        leaves = [(p, v) for p, v in _leaves(data) if "measured" not in p]
        path, v = rng.choice(leaves)
        if isinstance(v, bool):
            new, label, what = rng.choice([(1, "invalid", "int for bool"), (not v, "either", "flipped")])
        elif isinstance(v, (int, float)):
            new, label, what = _mutate_number(rng, path, v, in_hw)
        elif isinstance(v, str):
            new, label, what = _mutate_string(rng, path, v, in_hw)
        elif isinstance(v, list):
            new, label, what = rng.choice([([], "invalid", "empty list"), (["x"], "invalid", "list of a string"),
                                           ([[1]] * 3, "invalid", "list of lists")])
            if path[-1] in ("override_tensor", "tensor_split") and new == []:
                label = "valid"
        else:
            new, label, what = "x", "either", "replaced"
        _set(data, path, new)
        what = f"{name}: {'.'.join(map(str, path))} = {_val(new)[:40]} ({what})"
        body = dump_toml(data).encode()
    elif op == "delete":
        path, _ = rng.choice([(p, v) for p, v in _leaves(data)])
        _del(data, path)
        label, what = "either", f"{name}: {'.'.join(map(str, path))} deleted"
        body = dump_toml(data).encode()
    elif op == "unknown":
        tables = [k for k, v in data.items() if isinstance(v, dict) and k != "measured"]
        t = rng.choice(tables)
        data[t]["bogus_key"] = 1
        label, what = "invalid", f"{name}: unknown key {t}.bogus_key"
        body = dump_toml(data).encode()
    elif op == "deep":
        depth = rng.choice([40, 500, 5000])
        body = (text + "\nxdeep = " + "[" * depth + "1" + "]" * depth + "\n").encode()
        label, what = "invalid", f"{name}: {depth}-deep nested array"
    elif op == "bom":
        body = b"\xef\xbb\xbf" + text.encode()
        label, what = "valid", f"{name}: UTF-8 byte-order mark"
    elif op == "garbage":
        body = bytes(rng.randrange(256) for _ in range(200))
        label, what = "invalid", f"{name}: random bytes"
    elif op == "truncate":
        b = text.encode()
        body = b[: rng.randrange(1, len(b))]
        label, what = "either", f"{name}: truncated"
    elif op == "devzero":
        target = rng.choice(["/dev/zero", "/dev/urandom"])
        c = Case(seed, "invalid", f"{name}: is {target}", argv)
        c.files[name] = ("@link:" + target).encode()
        return c
    else:
        c = Case(seed, "invalid", f"{name}: is a FIFO", argv, fifo=[name])
        return c
    return Case(seed, label, what, argv, {name: body})


def _csv_case(rng: random.Random, seed: int) -> Case:
    if rng.random() < 0.4:
        text = trace_csv(seed=seed)
        lines = text.splitlines()
        i = rng.randrange(1, len(lines))
        lay, tok, ids = lines[i].split(",")
        op = rng.choice(["id_big", "id_range", "id_dup", "layer", "token", "ids_count", "same", "neg"])
        if op == "id_big":
            ids = f"{ids.split()[0]} 99999999999999999999999"
        elif op == "id_range":
            ids = f"{ids.split()[0]} {8 + rng.randrange(5)}" if ids.split()[0] != "8" else "0 9"
        elif op == "id_dup":
            ids = f"{ids.split()[0]} {ids.split()[0]}"
        elif op == "layer":
            lay = rng.choice(["7", "-1", "99999999999999999999"])
        elif op == "token":
            tok = rng.choice(["-1", "99999999999999999999", "1e3", "abc"])
        elif op == "ids_count":
            ids = ids.split()[0]
        elif op == "neg":
            ids = f"-3 {ids.split()[1]}"
        lines[i] = f"{lay},{tok},{ids}"
        label = "valid" if op == "same" else "invalid"
        return Case(seed, label, f"trace.csv row {i}: {op}", ["run", "tiny-trace.toml", "-q"],
                    {"trace.csv": ("\n".join(lines) + "\n").encode()})
    table = rng.choice(list(TABLES))
    lines = (REPO / "scenarios" / "hardware" / table).read_text().splitlines()
    head = lines[0].split(",")
    i = rng.randrange(1, len(lines))
    cells = lines[i].split(",")
    col = rng.choice(TABLES[table])
    j = head.index(col)
    value, label = rng.choice([("1e300", "invalid"), ("-1", "invalid"), ("nan", "invalid"), ("inf", "invalid"),
                               ("0", "invalid"), ("abc", "invalid"), ("1e-320", "invalid"),
                               ("99999999999999999999999", "invalid"), (cells[j], "valid")])
    if col == "kv_len" and value == "0":
        label = "valid"
    cells[j] = value
    lines[i] = ",".join(cells)
    scen = "tiny-ggml.toml" if "llamacpp" in table else "tiny-h200.toml"
    return Case(seed, label, f"{table} row {i}: {col} = {value}", ["run", scen, "-q"],
                {table: ("\n".join(lines) + "\n").encode()})


#: (flags, label) fragments of a command line
RUN_FLAGS = [
    (["-p", "32"], "valid"), (["-n", "2"], "valid"), (["-ub", "32"], "valid"), (["-b", "64"], "valid"),
    (["-r", "2"], "valid"), (["-d", "16"], "valid"), (["--variant", "prefetch_ungated"], "valid"),
    (["-fa", "off"], "valid"), (["-ngl", "1"], "valid"), (["-ncmoe", "1"], "valid"), (["-o", "csv"], "valid"),
    (["-o", "json"], "valid"), (["-o", "jsonl"], "valid"), (["-o", "sql"], "valid"), (["-ctk", "q8_0"], "valid"),
    (["--vram"], "valid"), (["-nopo", "1"], "valid"), (["-mg", "0"], "valid"), (["--out", "out/t.md"], "valid"),
    (["-p", "16,32"], "valid"), (["--engine", "des"], "valid"),
    (["-p", "1-1000000"], "invalid"), (["-r", "1000000"], "invalid"), (["-r", "1001"], "invalid"),
    (["-r", "0"], "invalid"), (["-p", "99999999999"], "invalid"), (["-n", "99999999999"], "invalid"),
    (["-d", "99999999"], "invalid"), (["-ub", "0"], "invalid"), (["-b", "0"], "invalid"),
    (["--variant", "bogus"], "invalid"), (["--variant", "slots2", "--variant", "slots2"], "invalid"),
    (["--out", ""], "invalid"), (["--out", "/proc/x.md"], "invalid"), (["--out", "."], "invalid"),
    (["-mg", "5"], "invalid"), (["-ot", "bogus(=CPU"], "invalid"), (["-ts", "-1"], "invalid"),
    (["-p", "abc"], "invalid"), (["-fitt", "99999999999999"], "invalid"), (["-t", "0"], "invalid"),
    (["--max-work", "0"], "invalid"), (["-n", "1-100000000"], "invalid"), (["-ub", "99999999999"], "invalid"),
    (["-ngl", "99999999999"], "invalid"), (["-p", "64", "-n", "0", "-p", "0"], "either"),
    (["-p", "1-40000000*2"], "invalid"),
    # a tiny run's memoised variants count 1/100 (sim.bounds.variant_work): 10 graph-layers may be
    # enough or not, by the scenario's tests and variants
    (["--max-work", "10"], "either"),
]
CHECK_TESTS = [("pp64", "valid"), ("tg4", "valid"), ("pp32 @ d16", "valid"), ("pp512 @ d99999999", "invalid"),
               ("tg99999999999", "invalid"), ("pp0", "invalid"), ("xx12", "invalid"),
               ("pp99999999999999999999999", "invalid")]
AXES = [("ubatch=16,32", "valid"), ("depth=0,16", "valid"), ("pcie=8,16", "valid"), ("prompt=16,32", "valid"),
        ("slots=1,2", "valid"), ("pcie=1e308", "invalid"), ("pcie=0", "invalid"), ("pcie=nan", "invalid"),
        ("ubatch=1-100000000", "invalid"), ("ubatch=0", "invalid"), ("depth=99999999", "invalid"),
        ("bogus=1", "invalid"), ("cache=1,2", "invalid"), ("gate=1-9999999999", "invalid"),
        ("pcie=1e-320", "invalid"), ("pcie=inf", "invalid")]


def _cli_case(rng: random.Random, seed: int) -> Case:
    scen = rng.choice(["tiny.toml", "tiny-h200.toml", "tiny-skew.toml", "tiny-trace.toml"])
    cmd = rng.choices(["run", "check", "trace", "crossover"], weights=[5, 2, 1, 2])[0]
    labels = []
    if cmd == "crossover":
        ax, lab = rng.choice(AXES)
        argv = ["crossover", scen, "--axis", ax, "--out", "xo", "-q", "-j", "1"]
        labels.append(lab)
        extra = rng.choice([([], "valid"), (["--axis", "pcie=8"], "invalid"), (["--axis2", "depth=0,8"], "valid"),
                            (["--test", "pp512 @ d99999999"], "invalid"), (["--test", "tg2"], "either"),
                            (["-r", "1001"], "invalid"), (["--variant", "slots2", "--variant", "slots2"], "invalid"),
                            (["--out", ""], "invalid"), (["--axis2", "ubatch=1-100000"], "invalid")])
        argv += extra[0]
        labels.append(extra[1])
        if ax.startswith("prompt") and "--test" in extra[0] and "tg2" in extra[0]:
            labels.append("invalid")
    elif cmd == "check":
        t, lab = rng.choice(CHECK_TESTS)
        argv = ["check", scen, "--test", t]
        labels.append(lab)
    elif cmd == "trace":
        argv = ["trace", scen, "--out", rng.choice(["t.json", "t.csv"])]
        fl, lab = rng.choice(RUN_FLAGS[:12] + [(["--out", ""], "invalid"), (["--out", "t.txt"], "invalid"),
                                               (["-p", "99999999999"], "invalid")])
        if "-o" in fl or "--vram" in fl or "--engine" in fl or "-r" in fl:
            fl, lab = [], "valid"
        if "-p" in fl and lab == "valid":
            fl = fl[:2]
        argv += fl
        labels.append(lab)
        # trace and check simulate one setting: a list of two values is an error
        if any("," in x for x in fl):
            labels.append("invalid")
    else:
        argv = ["run", scen, "-q"]
        for _ in range(rng.randrange(1, 4)):
            fl, lab = rng.choice(RUN_FLAGS)
            argv += fl
            labels.append(lab)
    if cmd == "run" and argv.count("-o") > 1 and "--out" in argv:
        labels.append("either")  # -o and the --out suffix may disagree
    label = "invalid" if "invalid" in labels else "either" if "either" in labels else "valid"
    return Case(seed, label, " ".join(repr(a) if (" " in a or not a) else a for a in argv), argv)


def make_case(seed: int) -> Case:
    """The fuzz case of ``seed``: a file mutation (TOML or CSV) or a command-line mutation."""
    rng = random.Random(seed)
    kind = rng.choices(["toml", "csv", "cli", "scenario"], weights=[5, 2, 4, 2])[0]
    if kind == "csv":
        return _csv_case(rng, seed)
    if kind == "cli":
        return _cli_case(rng, seed)
    if kind == "scenario":
        name = rng.choice(list(SCENARIOS))
        special = rng.random()
        text = SCENARIOS[name]
        if special < 0.15:
            no_vars = text.split("\n[[variant]]")[0]
            return Case(seed, "invalid", f"{name}: variant = []", ["run", name, "-q"],
                        {name: ("variant = []\n" + no_vars).encode()})
        if special < 0.3:
            return Case(seed, "invalid", f"{name}: duplicate variant", ["run", name, "-q"],
                        {name: (text + '\n[[variant]]\nspec = "slots2"\nname = "again"\n').encode()})
        if special < 0.45:
            pts, lab = rng.choice([("[[34, 0.9], [2048, 0.1]]", "invalid"), ("[[34, 0.5], [34, 0.6]]", "invalid"),
                                   ("[[1, 0.9]]", "invalid"), ("[[2, 0.3], [3, 0.31], [4, 0.99]]", "invalid"),
                                   ("[[0, 0.5]]", "invalid"), ("[[8, 0.5], [99999999999, 0.9]]", "invalid"),
                                   ("[[8, 0.6], [64, 0.95]]", "either")])
            t = tiny_scenario(routing=f'kind = "skewed"\nfit_points = {pts}')
            return Case(seed, lab, f"tiny-skew.toml: fit_points = {pts}", ["run", "tiny-skew.toml", "-q"],
                        {"tiny-skew.toml": t.encode()})
        return _toml_case(rng, seed, name, text, name)
    name = rng.choice(list(BASE_FILES))
    scen = {"tiny-moe.toml": "tiny.toml", "tiny-gpu.toml": "tiny.toml", "h200.toml": "tiny-h200.toml",
            "h200-llamacpp.toml": "tiny-ggml.toml"}.get(name)
    if scen is None:  # a shipped model file: the tiny scenario with -m
        c = _toml_case(rng, seed, name, BASE_FILES[name].read_text(), "tiny.toml")
        c.argv += ["-m", name, "-p", "32", "-n", "2", "-ngl", "0"]
        return c
    return _toml_case(rng, seed, name, BASE_FILES[name].read_text(), scen)


def setup_case(case: Case, folder: Path) -> None:
    """Lay out ``case`` in ``folder``: the shipped files linked, the case's files written."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {**{k: v.read_bytes() for k, v in BASE_FILES.items()},
             **{k: v.encode() for k, v in SCENARIOS.items()}, "trace.csv": trace_csv().encode()}
    for name, data in files.items():
        if name not in case.files and name not in case.fifo:
            (folder / name).write_bytes(data)
    for d, src in BASE_DIRS.items():
        if any(k.startswith(d + "/") for k in case.files):
            shutil.copytree(src, folder / d)
        else:
            (folder / d).symlink_to(src)
    for name, data in case.files.items():
        p = folder / name
        if data.startswith(b"@link:"):
            p.symlink_to(data[6:].decode())
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    for name in case.fifo:
        os.mkfifo(folder / name)


def run_case(case: Case, folder: Path) -> tuple[int | None, str, str]:
    """Run ``case`` with ``sim.cli.main`` in this process (cwd ``folder``, laid out by the caller):
    ``(exit status or None for an exception that escaped, stdout, stderr or the traceback)``."""
    from sim.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(case.argv))
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
            except BaseException:  # noqa: BLE001 - what the fuzz looks for
                return None, out.getvalue(), err.getvalue() + traceback.format_exc()
    finally:
        os.chdir(old)
    return rc, out.getvalue(), err.getvalue()


def md_table_ok(text: str) -> bool:
    """Every line of each markdown table in ``text`` has the same number of unescaped ``|``."""
    import re

    blocks, cur = [], []
    for ln in text.splitlines():
        if ln.startswith("|"):
            cur.append(len(re.findall(r"(?<!\\)\|", ln)))
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return all(len(set(b)) == 1 for b in blocks)


def classify(case: Case, rc: int | None, out: str, err: str) -> str:
    """The outcome (one of :data:`OUTCOMES`) of a finished case."""
    if rc is None or "Traceback (most recent call last)" in err:
        return "traceback"
    if rc in (0, 1):
        if case.label == "invalid":
            return "accepted nonsense"
        if case.argv[0] == "run" and "-o" not in case.argv and "--out" not in case.argv and not md_table_ok(out):
            return "accepted nonsense"
        return "valid run"
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    return "clean error" if len(errors) == 1 else "traceback"
