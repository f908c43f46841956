"""The prefetch patch (calibrate/llamacpp/prefetch_patch.py) and its output identity check
(calibrate/llamacpp/identity.py): where the code lands, that it compiles against the pinned
llama.cpp tree when that tree is here, the identity runner and its grid entries."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from calibrate.llamacpp import build as B
from calibrate.llamacpp import grid as G
from calibrate.llamacpp import identity as I
from calibrate.llamacpp import patches as P
from calibrate.llamacpp import prefetch_patch as PF
from sim.errors import ScenarioError

REPO = Path(__file__).resolve().parent.parent
ARCHIVE = REPO / ".llamacpp" / "llama.cpp-src.tgz"


def _stand_in(insertions) -> dict[str, str]:
    """Files holding every anchor of ``insertions`` once (our own text), in patch order."""
    files: dict[str, list[str]] = {}
    for ins in insertions:
        if isinstance(ins, P.NewFile):
            continue
        lines = files.setdefault(ins.file, [])
        if ins.following and ins.following not in lines:
            lines.append(ins.following)
        if ins.anchor not in lines or ins.following:
            lines += [ins.anchor, "    // body"]
    return {f: "\n".join(v) + "\n" for f, v in files.items()}


def test_prefetch_patch_lands_beside_each_anchor_and_applies_once(tmp_path):
    for rel, text in _stand_in(PF.PREFETCH).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert P.apply(tmp_path, PF.PREFETCH, "prefetch")
    sched = (tmp_path / "ggml/src/ggml-backend.cpp").read_text()
    # staging state before the scheduler struct, the skip right after the input's copy tensor is
    # looked up, the slot redirect before the compute call, restore/free/fire before the event record
    assert sched.index("struct psim_pf_dev {") < sched.index("struct ggml_backend_sched {")
    skip = sched.index("a staged input was copied into its slot")
    assert sched.rindex("struct ggml_tensor * input_cpy = tensor_copy(", 0, skip) > 0
    assert sched.index("ggml_backend_event_wait(split_backend, d->ready[slot]);") < sched.index("if (!sched->callback_eval) {")
    assert sched.index("ggml_backend_event_record(d->freed[") < sched.index("// record the event of this split")
    assert sched.index("psim_pf_size_on_reserve(sched);") > sched.index("ggml_backend_sched_split_graph(sched, measure_graph);")
    assert sched.index("static psim_pf_dev * psim_pf_get(") < sched.index(
        "static enum ggml_status ggml_backend_sched_compute_splits(")
    assert (tmp_path / "tools/llama-bench/psim-decode.cpp").read_text() == PF._DECODE_SRC.read_text()
    assert "add_executable(psim-decode" in (tmp_path / "tools/llama-bench/CMakeLists.txt").read_text()
    bench = (tmp_path / "tools/llama-bench/llama-bench.cpp").read_text()
    # the three fields sit in get_fields() before n_prompt and in get_values() before its value
    assert bench.index('"prefetch_weights", "prefetch_gate", "prefetch_expert_slots"') < bench.index('"n_prompt",')
    assert bench.index("std::to_string(prefetch_weights)") < bench.index("std::to_string(n_prompt),")
    assert bench.index('setenv("GGML_SCHED_PREFETCH_WEIGHTS"') < bench.index("llama_context * ctx = llama_init_from_model(")
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    assert not P.apply(tmp_path, PF.PREFETCH, "prefetch")  # idempotent
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert "prefetch" in P.PATCHES and "psim-decode" in B.TARGETS


def test_following_anchor_picks_the_first_hit_after_its_line(tmp_path):
    f = tmp_path / "a.cpp"
    f.write_text("loop();\nvoid g() {\nloop();\n}\nloop();\n")
    ins = P.Insertion("a.cpp", "loop();", "// mine: x\n", after=False, following="void g() {")
    assert P.apply(tmp_path, (ins,), "t")
    assert f.read_text() == "loop();\nvoid g() {\n// mine: x\nloop();\n}\nloop();\n"
    bad = P.Insertion("a.cpp", "nothing();", "// other: y\n", following="void g() {")
    with pytest.raises(B.BuildError, match="not found after"):
        P.apply(tmp_path, (bad,), "t2")


def test_a_new_file_of_other_content_is_refused(tmp_path):
    (tmp_path / "x.cpp").write_text("theirs\n")
    with pytest.raises(B.BuildError, match="not the patch's own file"):
        P.apply(tmp_path, (P.NewFile("x.cpp", "ours\n"),), "t")


@pytest.mark.skipif(not ARCHIVE.is_file() or shutil.which("g++") is None,
                    reason="needs the pinned llama.cpp archive (python -m calibrate.llamacpp prepare) and g++")
def test_patched_pinned_tree_compiles(tmp_path):
    with tarfile.open(ARCHIVE) as tf:
        tf.extractall(tmp_path, filter="data")
    P.apply_all(tmp_path)
    inc = ["-I", "ggml/include", "-I", "ggml/src", "-I", "include", "-I", "common", "-I", "vendor",
           "-I", "tools/llama-bench"]
    for src in ("ggml/src/ggml-backend.cpp", "tools/llama-bench/llama-bench.cpp", "tools/llama-bench/psim-decode.cpp"):
        r = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-DGGML_BUILD", "-DGGML_SHARED",
                            *inc, src], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "warning" not in r.stderr or "psim" not in r.stderr, r.stderr[-3000:]


# ---- identity --------------------------------------------------------------------------------

def test_variant_env_is_llama_benchs_flags_over_the_off_values():
    assert I.variant_env("-pw 1 -pwg 0") == {"GGML_SCHED_PREFETCH_WEIGHTS": "1", "GGML_SCHED_PREFETCH_GATE": "0",
                                             "GGML_SCHED_PREFETCH_EXPERT_SLOTS": "0"}
    assert I.variant_env("--prefetch-experts-slots 3")["GGML_SCHED_PREFETCH_EXPERT_SLOTS"] == "3"
    for bad, msg in (("", "at least one"), ("-pw 2", "0 or 1"), ("-pw", "non-negative"), ("-x 1", "unknown"),
                     ("-pes -1", "non-negative")):
        with pytest.raises(ValueError, match=msg):
            I.variant_env(bad)


def test_compare_outputs_names_the_first_differing_step():
    a = {"hash_prompt": "p", "steps": ["a", "b", "c"]}
    assert I.compare_outputs(a, dict(a)) == (True, None)
    assert I.compare_outputs(a, {**a, "hash_prompt": "q"}) == (False, -1)
    assert I.compare_outputs(a, {**a, "steps": ["a", "x", "c"]}) == (False, 1)
    assert I.compare_outputs(a, {**a, "steps": ["a", "b"]}) == (False, 2)


def _fake_decode(tmp_path: Path) -> Path:
    p = tmp_path / "psim-decode"
    p.write_text(f"""#!{sys.executable}
import json, os, sys
a = sys.argv[1:]
n = int(a[a.index("-n") + 1]) if "-n" in a else 500
slots = os.environ.get("GGML_SCHED_PREFETCH_EXPERT_SLOTS", "")
if slots == "9":
    sys.exit(3)
steps = ["s%d" % i for i in range(n)]
if slots == "1":
    steps[4] = "bad"
print("loading", file=sys.stderr)
print(json.dumps({{"hash_prompt": "p", "steps": steps, "pw": os.environ.get("GGML_SCHED_PREFETCH_WEIGHTS")}}))
""")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return p


def test_identity_runs_record_identical_differing_and_failing_variants(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('[grid]\nname = "t"\n[[model]]\nkey = "m"\ntoml = "scenarios/models/qwen3-30b-a3b.toml"\n'
                 '[[run]]\nid = "idn"\nmodel = "m"\nkind = "identity"\nargs = "-ngl 99 -ncmoe 48 -p 64 -n 8"\n'
                 'variants = ["-pw 1 -pwg 0", "-pes 1", "-pes 9"]\n')
    spec = G.load_grid(g)
    assert spec.runs[0].variants == ("-pw 1 -pwg 0", "-pes 1", "-pes 9") and G.count_rows(spec) == 0
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"GGUF")
    bench = tmp_path / "bin" / "llama-bench"
    bench.parent.mkdir()
    _fake_decode(bench.parent)
    said: list[str] = []
    recs = G.run_grid(spec, bench, models, tmp_path / "run", say=said.append)
    assert recs[0]["kind"] == "identity" and recs[0]["rc"] == 0 and recs[0]["rows"] == 0
    out = [json.loads(ln) for ln in (tmp_path / "run/identity.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["identical"], r["first_diff_step"]) for r in out] == [
        ("-pw 1 -pwg 0", True, None), ("-pes 1", False, 4), ("-pes 9", None, None)]
    assert out[0]["tokens"] == 8 and "exited 3" in out[2]["error"]
    assert any("DIFFERS from step 4" in s for s in said)
    assert "GGML_SCHED_PREFETCH_WEIGHTS=0" in (tmp_path / "run/logs/idn-off.log").read_text()
    assert G.done_ids(tmp_path / "run") == {"idn"}


@pytest.mark.parametrize("extra, field", [
    ('args = "-ngl 99"\n', "run[0].variants"),
    ('args = "-ngl 99"\nvariants = ["-pw 3"]\n', "run[0].variants"),
    ('args = "-ngl 99 -r 5"\nvariants = ["-pw 1"]\n', "run[0].args"),
    ('args = "-lm disk"\nvariants = ["-pw 1"]\n', "run[0].args"),
    ('args = "-n 0"\nvariants = ["-pw 1"]\n', "run[0].args"),
])
def test_bad_identity_runs_name_the_field(tmp_path, extra, field):
    g = tmp_path / "g.toml"
    g.write_text('[grid]\nname = "t"\n[[model]]\nkey = "m"\ntoml = "scenarios/models/qwen3-30b-a3b.toml"\n'
                 '[[run]]\nid = "a"\nmodel = "m"\nkind = "identity"\n' + extra)
    with pytest.raises(ScenarioError) as ei:
        G.load_grid(g)
    assert ei.value.field == field and str(g) in str(ei.value)


@pytest.mark.parametrize("variants, msg", [('["-pw 0"]', "turns no prefetch on"), ('["-pwg 0"]', "turns no prefetch on"),
                                           ('["-pw 1", "-pw 1 -pwg 512"]', "repeats")])
def test_identity_variants_must_turn_prefetch_on_once_each(tmp_path, variants, msg):
    g = tmp_path / "g.toml"
    g.write_text('[grid]\nname = "t"\n[[model]]\nkey = "m"\ntoml = "scenarios/models/qwen3-30b-a3b.toml"\n'
                 f'[[run]]\nid = "a"\nmodel = "m"\nkind = "identity"\nargs = "-ngl 99"\nvariants = {variants}\n')
    with pytest.raises(ScenarioError, match=msg):
        G.load_grid(g)
