"""GGUF input (:mod:`sim.model.gguf`): the header reader, the model spec built from it, and the round
trip through the project's own writer.

* :func:`sim.model.gguf.read_gguf_index` against files gguf-py's ``GGUFWriter`` writes (every metadata
  value type, scalar and array, tensors of several ggml types, a non-default alignment) and
  against ``gguf.GGUFReader``; a 262k-token vocabulary is skipped, not decoded;
* malformed, truncated and non-GGUF files are one-line ``ScenarioError``s naming the file;
* ``load_model`` takes a ``.gguf`` (by suffix or magic), also from a scenario's ``model =``;
* every tensor's ggml type and exact bytes come from the file; a tied head is a duplicate;
* the llama-bench label, size and parameters equal llama-bench's for the same files (the
  committed CPU and H200 rows);
* a GGUF written by ``calibrate.llamacpp.gguf_writer.write_gguf`` round-trips to its TOML's
  model spec: the four shipped models' tiny variants and a full-dimension 2-block Qwen3-MoE.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from calibrate.llamacpp import gguf_writer as gw  # noqa: E402
from sim.plan.builder import build_plan  # noqa: E402
from sim.errors import ScenarioError  # noqa: E402
from sim.model.gguf import (GGML_TYPE_ID, MODELLED_ARCHS, ftype_name, load_gguf_model, model_label,  # noqa: E402
                            read_gguf_index, size_class, tensor_group)
from sim.engines.metrics import run_scenario  # noqa: E402
from sim.plan import OpKind  # noqa: E402
from sim.model.quant import GGML_BLOCK  # noqa: E402
from sim.model.specs import BenchTest, Placement, load_model, load_scenario, parse_variant  # noqa: E402
from sim.model.vram import account  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "scenarios" / "models"
ARCH_MODELS = {"qwen3moe": "qwen3-30b-a3b", "gpt-oss": "gpt-oss-20b", "gemma3": "gemma3-27b",
               "llama": "mixtral-8x7b"}
#: fields of a ModelSpec that say where it came from (may differ between a TOML and its GGUF)
PROVENANCE = ("name", "source", "file", "group_types", "quant_preset", "quant_explicit", "quant_n_layer",
              "tensor_table")
Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType


def _spec_fields(m) -> dict:
    return {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name not in PROVENANCE}


def _add_tensor(w, name: str, ne: tuple[int, ...], t: str) -> None:
    """A zero tensor of ggml type ``t`` and dimensions ``ne`` (innermost first)."""
    if t in ("F32", "F16"):
        w.add_tensor(name, np.zeros(tuple(reversed(ne)), np.float32 if t == "F32" else np.float16))
        return
    blk, size = GGML_BLOCK[t]
    byte_shape = (*reversed(ne[1:]), ne[0] // blk * size)
    w.add_tensor(name, np.zeros(byte_shape, np.uint8), raw_dtype=Q[t])


def _write(path: Path, arch: str, kv, tensors, *, alignment: int | None = None) -> Path:
    """A GGUF written by gguf-py: ``kv`` as (GGUFValueType or 'array:<sub type>', key, value)."""
    w = gguf.GGUFWriter(path, arch)
    if alignment:
        w.add_custom_alignment(alignment)
    for vt, key, val in kv:
        if isinstance(vt, str):
            w.add_key_value(key, val, V.ARRAY, sub_type=V[vt.split(":")[1]])
        else:
            w.add_key_value(key, val, vt)
    for name, ne, t in tensors:
        _add_tensor(w, name, ne, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _llama(path: Path, *, n_layer: int = 2, d: int = 256, n_head: int = 8, n_kv: int = 2, ff: int = 512,
           vocab: int = 512, types=None, tied: bool = False, extra_kv=(), drop=(), file_type: int | None = 7,
           arch: str = "llama"):
    """A small dense llama-shaped model (``arch``: its general.architecture and key prefix);
    ``types(name) -> ggml type`` (default Q8_0 matrices)."""
    hd = d // n_head
    ty = types or (lambda name: "Q8_0")
    kv = [(V.UINT32, "llama.block_count", n_layer), (V.UINT32, "llama.embedding_length", d),
          (V.UINT32, "llama.attention.head_count", n_head), (V.UINT32, "llama.attention.head_count_kv", n_kv),
          (V.UINT32, "llama.feed_forward_length", ff), (V.FLOAT32, "llama.attention.layer_norm_rms_epsilon", 1e-5)]
    if file_type is not None:
        kv.append((V.UINT32, "general.file_type", file_type))
    kv = [x for x in kv if x[1] not in drop] + list(extra_kv)   # drop, then add (a key replaced)
    ts = [("token_embd.weight", (d, vocab), ty("token_embd.weight"))]
    for i in range(n_layer):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", (d,), "F32"), (b + "attn_q.weight", (d, n_head * hd), ty(b + "attn_q")),
               (b + "attn_k.weight", (d, n_kv * hd), ty(b + "attn_k")),
               (b + "attn_v.weight", (d, n_kv * hd), ty(b + "attn_v")),
               (b + "attn_output.weight", (n_head * hd, d), ty(b + "attn_output")),
               (b + "ffn_norm.weight", (d,), "F32"), (b + "ffn_gate.weight", (d, ff), ty(b + "ffn_gate")),
               (b + "ffn_up.weight", (d, ff), ty(b + "ffn_up")), (b + "ffn_down.weight", (ff, d), ty(b + "ffn_down"))]
    ts.append(("output_norm.weight", (d,), "F32"))
    if not tied:
        ts.append(("output.weight", (d, vocab), ty("output.weight")))
    ts = [x for x in ts if x[0] not in drop]
    kv = [(vt, arch + key[len("llama"):] if key.startswith("llama.") else key, val) for vt, key, val in kv]
    return _write(path, arch, kv, ts)


# ------------------------------------------------------------------------------------------
# the header reader
# ------------------------------------------------------------------------------------------

SCALARS = [(V.UINT8, "t.u8", 200), (V.INT8, "t.i8", -100), (V.UINT16, "t.u16", 60000), (V.INT16, "t.i16", -30000),
           (V.UINT32, "t.u32", 4_000_000_000), (V.INT32, "t.i32", -2_000_000_000), (V.FLOAT32, "t.f32", 0.5),
           (V.BOOL, "t.bool", True), (V.STRING, "t.str", "héllo wörld"), (V.UINT64, "t.u64", 2**63 + 5),
           (V.INT64, "t.i64", -(2**62)), (V.FLOAT64, "t.f64", 1e-300)]
ARRAYS = [("array:UINT8", "a.u8", [1, 2, 255]), ("array:INT8", "a.i8", [-1, 0, 1]),
          ("array:UINT16", "a.u16", [1, 65535]), ("array:INT16", "a.i16", [-5, 5]),
          ("array:UINT32", "a.u32", [7] * 5), ("array:INT32", "a.i32", [-7, 7]),
          ("array:FLOAT32", "a.f32", [0.25, -1.5]), ("array:BOOL", "a.bool", [True, False, True]),
          ("array:STRING", "a.str", ["x", "", "ÿ" * 3]), ("array:UINT64", "a.u64", [2**64 - 1]),
          ("array:INT64", "a.i64", [-3]), ("array:FLOAT64", "a.f64", [3.5, 4.5])]
TENSORS = [("t.f32", (64, 3), "F32"), ("t.f16", (32,), "F16"), ("t.q8", (64, 2), "Q8_0"), ("t.q4k", (256, 3), "Q4_K"),
           ("t.q6k", (512, 2, 4), "Q6_K"), ("t.mx", (64, 5), "MXFP4"), ("t.iq4", (32, 1), "IQ4_NL"),
           ("t.bf16", (8, 8), "BF16")]


@pytest.fixture(scope="module")
def every_type(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("gguf") / "types.gguf", "llama", SCALARS + ARRAYS, TENSORS, alignment=64)



@contextlib.contextmanager
def _counting_reads(monkeypatch):
    """Count what :func:`sim.model.gguf.read_gguf_index` reads (bytes from the file) and decodes (GGUF
    strings), instead of timing it (a test must not depend on the host's speed)."""
    import sim.model.gguf as sg

    seen = {"bytes": 0, "strings": 0}

    class Counting:
        def __init__(self, fh):
            self.fh = fh

        def read(self, n=-1):
            b = self.fh.read(n)
            seen["bytes"] += len(b)
            return b

        def __getattr__(self, name):
            return getattr(self.fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()
            return False

    open_, string = sg._open, sg._Cursor.string

    def counted_string(self, *a, **k):
        seen["strings"] += 1
        return string(self, *a, **k)

    monkeypatch.setattr(sg, "_open", lambda path: Counting(open_(path)))
    monkeypatch.setattr(sg._Cursor, "string", counted_string)
    yield seen
    monkeypatch.setattr(sg, "_open", open_)
    monkeypatch.setattr(sg._Cursor, "string", string)

def test_reader_reads_every_value_type_gguf_py_writes(every_type):
    idx = read_gguf_index(every_type)
    assert idx.version == 3 and idx.alignment == 64 and idx.data_offset % 64 == 0
    for _vt, key, val in SCALARS:
        assert idx.kv[key] == (pytest.approx(val) if isinstance(val, float) else val), key
    for vt, key, val in ARRAYS:
        assert idx.kv[key] == len(val) and idx.arrays[key].n == len(val)
        assert idx.arrays[key].value_type == vt.split(":")[1].lower(), key
        got = idx.read_array(key)
        assert got == (pytest.approx(val) if isinstance(val[0], float) else val), key
    assert idx.kv["general.architecture"] == "llama"


def test_reader_agrees_with_gguf_py_on_the_tensor_table(every_type):
    idx = read_gguf_index(every_type)
    r = gguf.GGUFReader(every_type)
    assert list(idx.tensors) == [t.name for t in r.tensors] == [t[0] for t in TENSORS]
    for rt, (name, ne, t) in zip(r.tensors, TENSORS):
        got = idx.tensors[name]
        assert got.ne == ne == tuple(int(x) for x in rt.shape)
        assert got.ggml_type == t == rt.tensor_type.name
        assert (got.offset, got.nbytes) == (rt.data_offset, rt.n_bytes)
    assert idx.tensor_bytes == sum(t.n_bytes for t in r.tensors)
    assert set(GGML_TYPE_ID) == set(GGML_BLOCK)
    assert all(Q[name] == i for name, i in GGML_TYPE_ID.items())


def _gguf_string(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def _vocab_file(p: Path, n: int) -> Path:
    kv = [_gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string("llama"),
          _gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, n)
          + b"".join(_gguf_string(f"tok{i}") for i in range(n)),
          _gguf_string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, n) + bytes(4 * n),
          _gguf_string("x.after") + struct.pack("<II", 4, 7)]
    ti = _gguf_string("token_embd.weight") + struct.pack("<IQQIQ", 2, 32, 4, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kv)) + b"".join(kv) + ti
    p.write_bytes(head + bytes(-len(head) % 32) + bytes(32 * 4 * 4))
    return p


def test_a_262k_token_vocabulary_is_skipped_not_decoded(tmp_path, monkeypatch):
    """A gemma3-sized vocabulary. The header is written by hand (gguf-py takes seconds to pack,
    and to read, 262k strings); gguf-py reads the same layout with a small vocabulary."""
    small = _vocab_file(tmp_path / "small.gguf", 300)
    r = gguf.GGUFReader(small)
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 300 and r.tensors[0].name == "token_embd.weight"
    assert read_gguf_index(small).tensors["token_embd.weight"].offset == r.tensors[0].data_offset
    n = 262144
    p = _vocab_file(tmp_path / "vocab.gguf", n)
    with _counting_reads(monkeypatch) as seen:
        idx = read_gguf_index(p)
    assert idx.kv["tokenizer.ggml.tokens"] == n and idx.kv["x.after"] == 7
    assert idx.tensors["token_embd.weight"].ne == (32, 4)
    # the lengths are read, the strings skipped: only keys and tensor names are decoded
    assert seen["strings"] < 50, seen
    assert idx.read_array("tokenizer.ggml.tokens", max_len=300000)[-1] == "tok262143"


# ------------------------------------------------------------------------------------------
# malformed files: one line naming the file
# ------------------------------------------------------------------------------------------


def _one_line_error(path, match: str, fn=read_gguf_index) -> ScenarioError:
    with pytest.raises(ScenarioError, match=match) as exc:
        fn(path)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg, msg
    return exc.value


def test_not_gguf_files(tmp_path):
    _one_line_error(tmp_path / "none.gguf", "file not found")
    _one_line_error(tmp_path, "folder")
    (tmp_path / "empty.gguf").write_bytes(b"")
    _one_line_error(tmp_path / "empty.gguf", "not a GGUF file")
    (tmp_path / "toml.gguf").write_text("[model]\nname = 'x'\n")
    _one_line_error(tmp_path / "toml.gguf", "not a GGUF file")
    for ver in (1, 4):
        (tmp_path / f"v{ver}.gguf").write_bytes(b"GGUF" + ver.to_bytes(4, "little") + bytes(16))
        _one_line_error(tmp_path / f"v{ver}.gguf", f"version {ver} is not supported")
    (tmp_path / "be.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(16))
    _one_line_error(tmp_path / "be.gguf", "big-endian")
    # through load_model too, by suffix
    _one_line_error(tmp_path / "toml.gguf", "not a GGUF file", load_model)


def test_every_truncation_of_a_valid_file_is_a_clean_error(every_type, tmp_path):
    raw = every_type.read_bytes()
    idx = read_gguf_index(every_type)
    cuts = sorted({*range(0, idx.data_offset, 7), idx.data_offset, len(raw) - 1})
    for n in cuts:
        p = tmp_path / "cut.gguf"
        p.write_bytes(raw[:n])
        _one_line_error(p, "truncated|not a GGUF|corrupt")


def test_corrupt_headers(every_type, tmp_path):
    raw = bytearray(every_type.read_bytes())
    p = tmp_path / "bad.gguf"

    def bad(data: bytes, match: str) -> None:
        p.write_bytes(data)
        _one_line_error(p, match)
    bad(raw[:8] + (2**60).to_bytes(8, "little") + raw[16:], "corrupt header")           # absurd tensor count
    # the first key's value type (after magic, version, counts and the key string)
    klen = int.from_bytes(raw[24:32], "little")
    at = 32 + klen
    bad(raw[:at] + (99).to_bytes(4, "little") + raw[at + 4:], "unknown value type 99")
    # a string length past the end of the file
    bad(raw[:24] + (2**40).to_bytes(8, "little") + raw[32:], "corrupt header: metadata key 0 is 1099511627776 bytes")
    # a string value's length past the end of the file: the first key's value, if a string
    if int.from_bytes(raw[at:at + 4], "little") == 8:
        bad(raw[:at + 4] + (2**40).to_bytes(8, "little") + raw[at + 12:], "corrupt or truncated")
    # a key length inside the file but absurd: the error is short, it does not quote the file
    big = len(raw) // 2
    p.write_bytes(raw[:24] + big.to_bytes(8, "little") + raw[32:])
    e = _one_line_error(p, f"metadata key 0 is {big} bytes long")
    assert len(str(e)) < 300
    # an unknown ggml type id in the tensor table: the last tensor's type (before its offset)
    idx = read_gguf_index(every_type)
    name = list(idx.tensors)[-1]
    pos = raw.rindex(name.encode()) + len(name) + 4 + 8 * len(idx.tensors[name].ne)
    bad(raw[:pos] + (77).to_bytes(4, "little") + raw[pos + 4:], "unknown ggml type id 77")
    # a misaligned data offset
    bad(raw[:pos + 4] + (idx.tensors[name].offset - idx.data_offset + 3).to_bytes(8, "little") + raw[pos + 12:],
        "not a multiple of the alignment")
    # an aligned offset that overlaps the previous tensor's data (llama.cpp takes the data in table
    # order: "has offset ..., expected ...")
    bad(raw[:pos + 4] + (0).to_bytes(8, "little") + raw[pos + 12:], f"tensor '{name}' has data offset 0, expected")


def test_a_tensor_name_of_64_bytes_is_refused_as_llama_cpp_refuses_it(tmp_path):
    """GGML_MAX_NAME is 64: gguf_init_from_file_impl refuses a name of 64 bytes or more."""
    ok = _write(tmp_path / "ok.gguf", "llama", [], [("t" * 63, (32,), "F32")])
    assert list(read_gguf_index(ok).tensors) == ["t" * 63]
    long = _write(tmp_path / "long.gguf", "llama", [], [("t" * 64, (32,), "F32")])
    _one_line_error(long, "tensor name 0 is too long: 64 bytes >= 64")


def test_missing_or_inconsistent_architecture_keys_name_the_key(tmp_path):
    p = _write(tmp_path / "noarch.gguf", "llama", [], [("token_embd.weight", (32, 4), "F32")])
    # gguf-py always writes general.architecture; a file without it needs a hand-made header
    raw = p.read_bytes().replace(b"general.architecture", b"general.architectur_")
    (tmp_path / "noarch2.gguf").write_bytes(raw)
    _one_line_error(tmp_path / "noarch2.gguf", "general.architecture", load_gguf_model)
    # an arch the simulator does not model: refused, not simulated as llama (a llama-shaped file)
    e = _one_line_error(_llama(tmp_path / "mamba.gguf", arch="mamba"), "general.architecture 'mamba' is not modelled",
                        load_gguf_model)
    assert e.field == "general.architecture" and "supported: gemma3, gpt-oss, laguna, llama, qwen3moe" in str(e)
    for arch in MODELLED_ARCHS:  # the same llama-shaped file under each modelled arch loads
        assert load_gguf_model(_llama(tmp_path / f"{arch}.gguf", arch=arch)).arch == arch
    _one_line_error(_llama(tmp_path / "nb.gguf", drop=("llama.block_count",)), "llama.block_count", load_gguf_model)
    e = _one_line_error(_llama(tmp_path / "hd.gguf", extra_kv=[(V.UINT32, "llama.attention.key_length", 16)]),
                        "attn_q.weight has shape", load_gguf_model)
    assert "key_length 16" in str(e)
    _one_line_error(_llama(tmp_path / "noq.gguf", drop=("blk.1.attn_q.weight",)), "no tensor 'blk.1.attn_q.weight'",
                    load_gguf_model)
    # a block_count above the blocks the file holds: the header and the tensors disagree (it was
    # "no tensor 'blk.2...': this tensor layout is not supported")
    big = _llama(tmp_path / "bc.gguf", extra_kv=[(V.UINT32, "llama.block_count", 3)], drop=("llama.block_count",))
    e = _one_line_error(big, "llama.block_count is 3, but the file holds tensors of blocks 0..1 only", load_gguf_model)
    assert "not supported" not in str(e)
    # llama.cpp's own limits (LLAMA_MAX_LAYERS 512, LLAMA_MAX_EXPERTS 1024: GGML_ASSERT on load):
    # a file past them had been simulated (a 600-block file at 2071 t/s) where llama-bench aborts
    deep = _llama(tmp_path / "deep.gguf", extra_kv=[(V.UINT32, "llama.block_count", 600)], drop=("llama.block_count",))
    e = _one_line_error(deep, "is 600; llama.cpp loads at most 512 blocks", load_gguf_model)
    assert e.field == "llama.block_count"
    wide = _llama(tmp_path / "wide.gguf", arch="qwen3moe", extra_kv=[(V.UINT32, "llama.expert_count", 1025),
                                                                    (V.UINT32, "llama.expert_used_count", 8)])
    e = _one_line_error(wide, "is 1025; llama.cpp loads at most 1024 experts", load_gguf_model)
    assert e.field == "qwen3moe.expert_count"


# ------------------------------------------------------------------------------------------
# the model spec: per-tensor types and exact bytes from the file
# ------------------------------------------------------------------------------------------


def test_tensor_groups_of_gguf_names():
    assert tensor_group("token_embd.weight") == (-1, "embd")
    assert tensor_group("output.weight") == (-1, "output")
    assert tensor_group("output_norm.weight") == (-1, "norm")
    assert tensor_group("blk.12.ffn_up_exps.weight") == (12, "exps_up")
    assert tensor_group("blk.3.ffn_gate_up_exps.weight") == (3, "exps_gate")
    assert tensor_group("blk.3.ffn_down_shexp.weight") == (3, "shexp")
    assert tensor_group("blk.3.ffn_gate_inp.weight") == (3, "router")
    assert tensor_group("blk.3.attn_q_norm.weight") == (3, "norm")
    assert tensor_group("blk.3.ffn_up_exps.bias") == (3, "bias")
    assert tensor_group("blk.3.attn_sinks.weight") == (3, "bias")
    assert tensor_group("blk.3.attn_qkv.weight") == (3, "other")


def test_per_tensor_types_come_from_the_file_and_set_every_byte(tmp_path):
    """Types that no preset rule gives (layer 1's FFN Q4_0, output F16) are the spec's, and the
    plan copies and VRAM use their exact bytes (ggml row size)."""
    def ty(name):
        return {"blk.1.ffn_gate": "Q4_0", "blk.1.ffn_up": "Q4_0", "blk.1.ffn_down": "Q4_K", "output.weight": "F16"}.get(
            name, "Q8_0")
    p = _llama(tmp_path / "mixed.gguf", types=ty)
    m = load_model(p)
    by = {t.name: t for t in m.tensors}
    assert by["blk.1.ffn_up.weight"].ggml_type == "Q4_0" and by["blk.0.ffn_up.weight"].ggml_type == "Q8_0"
    assert by["blk.1.ffn_up.weight"].nbytes == 512 * 256 // 32 * 18
    assert by["blk.1.ffn_down.weight"].nbytes == 256 * 512 // 256 * 144
    assert by["output.weight"].nbytes == 256 * 512 * 2
    assert m.nbytes == read_gguf_index(p).tensor_bytes and m.n_params == read_gguf_index(p).n_elements
    assert m.group_types["ffn_up"] == pytest.approx((18 + 34) / 2 * 8 / 32)   # mixed: mean bits
    assert m.group_types["attn_q"] == "Q8_0" and m.group_types["norm"] == "F32"
    assert (m.n_layer, m.d_model, m.n_head, m.n_head_kv, m.head_dim, m.n_ff, m.n_vocab) == (2, 256, 8, 2, 32, 512, 512)
    assert m.moe is None and m.name == "llama ?B Q8_0" and not m.tied_embeddings
    # the FFN of both blocks on the host (llama.cpp's -ot form): whole copies of exactly these bytes
    from sim.model.routing import RoutingSpec
    from sim.model.specs import Scenario, Workload, load_hardware
    hw = load_hardware(ROOT / "scenarios" / "tiny" / "tiny-gpu.toml")
    pl = Placement(override_tensor=((r"ffn_(gate|up|down)\.weight", "CPU"),), ctx_size=256)
    scn = Scenario(name="mixed", model=m, hardware=hw, placement=pl, workload=Workload(n_prompt=(64,), n_gen=(0,)),
                   routing=RoutingSpec(), variants=(parse_variant("baseline"),))
    plan = build_plan(scn, parse_variant("baseline"), BenchTest(64, 0, 0), np.random.default_rng(0))
    copies = {o.name: o.nbytes for o in plan.ops if o.kind is OpKind.H2D and o.tag == "whole"}
    assert copies == {n: by[n].nbytes for n in by if "ffn_" in n and "norm" not in n}
    v = account(scn, parse_variant("baseline"))[0]
    host = {n for n in by if "ffn_" in n and "norm" not in n} | {"token_embd.weight"}
    assert v.weights_bytes == sum(t.nbytes for t in m.tensors if t.name not in host)


def test_a_tied_head_is_token_embd_duplicated_and_counted_once(tmp_path):
    m = load_model(_llama(tmp_path / "tied.gguf", tied=True))
    out = m.output_tensor
    assert m.tied_embeddings and out.duplicate and out.name == "token_embd.weight" and out.group == "output"
    idx = read_gguf_index(tmp_path / "tied.gguf")
    assert m.nbytes == idx.tensor_bytes and m.n_params == idx.n_elements
    # offloaded with the output layer: token_embd on the host, its duplicate in VRAM
    pl = Placement()
    assert pl.host_resident(m, m.tensors[0]) and not pl.host_resident(m, out)


def test_sliding_window_pattern_as_number_array_or_arch_default(tmp_path):
    swa = [(V.UINT32, "llama.attention.sliding_window", 128)]
    m = load_model(_llama(tmp_path / "n.gguf", n_layer=4, extra_kv=swa + [
        (V.UINT32, "llama.attention.sliding_window_pattern", 2)]))
    assert (m.sliding_window, m.swa_interval) == (128, 2) and [m.attn_window(i) for i in range(4)] == [128, 0, 128, 0]
    m = load_model(_llama(tmp_path / "a.gguf", n_layer=6, extra_kv=swa + [
        ("array:BOOL", "llama.attention.sliding_window_pattern", [True, True, False] * 2)]))
    assert (m.sliding_window, m.swa_interval) == (128, 3)
    with pytest.raises(ScenarioError, match="sliding_window_pattern"):
        load_model(_llama(tmp_path / "x.gguf", n_layer=4, extra_kv=swa + [
            ("array:BOOL", "llama.attention.sliding_window_pattern", [False, True, True, True])]))
    # llama has no default pattern: a window alone is not simulated; gemma3/gpt-oss default 6/2
    assert load_model(_llama(tmp_path / "w.gguf", extra_kv=swa)).sliding_window == 0


def test_file_type_label_and_size_class():
    assert size_class("qwen3moe", 48) == "30B.A3B" and size_class("gemma3", 62) == "27B"
    assert size_class("gpt-oss", 24) == "20B" and size_class("llama", 32, n_expert=8) == "8x7B"
    assert size_class("llama", 32, n_vocab=32000) == "7B" and size_class("llama", 32, n_vocab=128256) == "8B"
    assert size_class("llama", 80, n_head=64, n_head_kv=8) == "70B" and size_class("laguna", 48) == "118B.A8B"
    assert size_class("qwen3moe", 8) == "?B" and size_class("unknown-arch", 48) == "?B"
    assert ftype_name(15) == "Q4_K - Medium" and ftype_name(38) == "MXFP4 MoE" and ftype_name(25) == "IQ4_NL - 4.5 bpw"
    assert ftype_name(15 | 1024) == "(guessed) Q4_K - Medium" and ftype_name(999) == "unknown, may not work"
    # no general.file_type: llama.cpp guesses from the most common type (first to the top count)
    assert ftype_name(None, [("a", "F32"), ("blk.0.x", "Q4_K"), ("blk.0.y", "Q4_K"), ("b", "F32")]) == \
        "(guessed) all F32"
    assert ftype_name(None, [("blk.0.x", "Q4_K"), ("blk.0.y", "Q4_K"), ("c", "F32")]) == "(guessed) Q4_K - Medium"
    assert model_label("gpt-oss", "20B", "MXFP4 MoE") == "gpt-oss 20B MXFP4 MoE"


def test_label_without_file_type_is_guessed(tmp_path):
    m = load_model(_llama(tmp_path / "g.gguf", file_type=None))
    assert m.name == "llama ?B (guessed) Q8_0"


# ------------------------------------------------------------------------------------------
# load_model and scenarios take a GGUF
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    """One tiny GGUF per arch, written by the project's writer: (tiny spec, path)."""
    d = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch, name in ARCH_MODELS.items():
        spec = gw.tiny_variant(load_model(MODELS / f"{name}.toml"))
        p = d / f"{name}-tiny.gguf"
        gw.write_gguf(spec, p, seed=3, tiny=True)
        out[arch] = (spec, p)
    return out


@pytest.mark.parametrize("arch", list(ARCH_MODELS))
def test_tiny_variants_round_trip(arch, tiny_files):
    spec, path = tiny_files[arch]
    g = load_model(path)
    assert g.tensors == spec.tensors          # names, groups, shapes, types, bytes, order
    assert _spec_fields(g) == _spec_fields(spec)   # geometry, MoE, SWA, arch, tied head
    assert g.file == str(path) and g.name == f"{arch} ?B {ftype_name(gw.LLAMA_FTYPE[gw.model_quant(spec)[0]])}"
    idx = read_gguf_index(path)
    assert g.nbytes == spec.nbytes == idx.tensor_bytes and g.n_params == spec.n_params == idx.n_elements
    assert load_gguf_model(path) == g


def test_router_and_head_shapes_are_checked_as_llama_cpp_checks_them(tiny_files, tmp_path):
    """llama.cpp's create_tensor wants ffn_gate_inp [n_embd, n_expert] and output [n_embd, n_vocab];
    a file with the two dimensions swapped (same bytes) is refused naming the tensor."""
    spec, path = tiny_files["qwen3moe"]
    raw = bytearray(path.read_bytes())
    idx = read_gguf_index(path)
    for name in (f"blk.{spec.n_layer - 1}.ffn_gate_inp.weight", "output.weight"):
        if name not in idx.tensors:
            continue
        ne = idx.tensors[name].ne
        assert len(ne) == 2 and ne[0] != ne[1]
        key = len(name).to_bytes(8, "little") + name.encode()  # the table entry, not a longer name's tail
        pos = raw.index(key) + len(key) + 4  # past the name and n_dims
        bad = raw[:pos] + ne[1].to_bytes(8, "little") + ne[0].to_bytes(8, "little") + raw[pos + 16:]
        (tmp_path / "bad.gguf").write_bytes(bad)
        _one_line_error(tmp_path / "bad.gguf", re.escape(f"{name} has shape {[ne[1], ne[0]]}, expected {list(ne)}"),
                        fn=load_gguf_model)


def test_load_model_dispatches_on_suffix_or_magic(tiny_files, tmp_path):
    _spec, path = tiny_files["qwen3moe"]
    other = tmp_path / "model.bin"
    other.write_bytes(path.read_bytes())
    assert load_model(other).tensors == load_model(path).tensors
    (tmp_path / "x.toml").write_bytes(path.read_bytes())      # the magic wins over a .toml name
    assert load_model(tmp_path / "x.toml").tensors == load_model(path).tensors
    (tmp_path / "y.gguf").write_text('[model]\nname = "x"\n')  # a .gguf name is read as a GGUF
    with pytest.raises(ScenarioError, match="GGUF"):
        load_model(tmp_path / "y.gguf")


def test_a_scenario_model_may_be_a_gguf_relative_to_the_scenario(tiny_files, tmp_path):
    """The same scenario on the tiny TOML spec and on its GGUF simulates the same times."""
    spec, path = tiny_files["qwen3moe"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "q.gguf").write_bytes(path.read_bytes())
    text = (f'[scenario]\nname = "gguf"\nmodel = "m/q.gguf"\nhardware = "{ROOT / "scenarios/tiny/tiny-gpu.toml"}"\n'
            '[placement]\nn_cpu_moe = 4\n[workload]\nn_prompt = [64]\nn_gen = [0]\nrepetitions = 1\n'
            '[[variant]]\nspec = "baseline"\n[[variant]]\nspec = "slots2"\n')
    (tmp_path / "s.toml").write_text(text)
    scn = load_scenario(tmp_path / "s.toml")
    assert scn.model.tensors == spec.tensors and scn.model.file == str(tmp_path / "m" / "q.gguf")
    a = run_scenario(scn, jobs=1)
    b = run_scenario(scn.with_(model=spec), jobs=1)
    assert [r.tps_mean for r in a] == [r.tps_mean for r in b]
    # a host expert tensor in slots2 reserves exactly 2 x the largest expert tensor of the file
    largest = max(t.nbytes for t in scn.model.tensors if t.is_expert and t.layer < 4)
    assert account(scn, parse_variant("slots2"))[0].staging_bytes == 2 * largest


# ------------------------------------------------------------------------------------------
# llama-bench's label, size and parameters
# ------------------------------------------------------------------------------------------


def test_committed_h200_llama_bench_rows_match_the_model_specs():
    """``model_type``, ``model_size`` and ``model_n_params`` of the three full-size GGUFs in the
    committed H200 run equal the model TOMLs' specs (the GGUFs were written by the project's
    writer; the spec of such a GGUF equals its TOML's, :func:`test_tiny_variants_round_trip`)."""
    rows = {}
    for line in (ROOT / "data/llamacpp/h200-20261201/llama-bench.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows[Path(r["model_filename"]).stem] = (r["model_type"], r["model_size"], r["model_n_params"])
    assert set(rows) == {"qwen3-30b-a3b", "gemma3-27b", "gpt-oss-20b"}
    for stem, want in rows.items():
        m = load_model(MODELS / f"{stem}.toml")
        assert (m.name, m.nbytes, m.n_params) == want, stem


def test_committed_cpu_llama_bench_row_of_a_tiny_gguf():
    """``tests/data/llamacpp/llama-bench-cpu.jsonl``: llama-bench on the writer's tiny Qwen3-MoE."""
    r = json.loads((ROOT / "tests/data/llamacpp/llama-bench-cpu.jsonl").read_text().splitlines()[0])
    m = gw.tiny_variant(load_model(MODELS / "qwen3-30b-a3b.toml"))
    assert (r["model_size"], r["model_n_params"]) == (m.nbytes, m.n_params)
    assert r["model_type"] == model_label("qwen3moe", size_class("qwen3moe", m.n_layer), ftype_name(15))
    assert f"{m.nbytes / 2**20:.2f} MiB" == m.size_label() and m.params_label() == "52.11 M"


# ------------------------------------------------------------------------------------------
# a full-dimension file
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3_2_blocks(tmp_path_factory):
    """The full-dimension Qwen3-30B-A3B cut to 2 blocks, as the writer writes it (1.2 GB, ~4 s;
    removed afterwards)."""
    p = tmp_path_factory.mktemp("full") / "qwen3-2l.gguf"
    spec = load_model(MODELS / "qwen3-30b-a3b.toml")
    gw.write_gguf(spec, p, n_layer=2, seed=1)
    yield spec, p
    p.unlink(missing_ok=True)


def test_full_dimension_two_block_file_round_trips(qwen3_2_blocks, monkeypatch):
    spec, path = qwen3_2_blocks
    with _counting_reads(monkeypatch) as seen:
        g = load_model(path)
    # the header of a 1.2 GB file with a 152k-token vocabulary: its tensor data is never read,
    # and the vocabulary's strings are stepped over, not decoded
    assert path.stat().st_size > 1e9 and seen["bytes"] < 64 * 2**20 and seen["strings"] < 2000, seen
    # the TOML cut to the file's 2 blocks, its type rule still seeing 48 (as the writer)
    cut = replace(spec, n_layer=2, quant_n_layer=spec.n_layer)
    assert g.tensors == cut.tensors and _spec_fields(g) == _spec_fields(cut)
    # blocks 0 and 1 are use_more_bits layers: attn_v and ffn_down_exps Q6_K in both
    assert {t.ggml_type for t in g.tensors if t.group in ("attn_v", "exps_down")} == {"Q6_K"}
    assert g.nbytes == read_gguf_index(path).tensor_bytes == 1237483520     # CPU llama-bench's model_size
    assert g.n_params == 1868573184 and g.name == "qwen3moe ?B Q4_K - Medium"
    assert (g.moe.n_expert, g.moe.n_expert_used, g.moe.n_ff_exp, g.n_ff) == (128, 8, 768, 6144)


def test_a_fifo_given_as_a_gguf_is_refused_not_read(tmp_path):
    """A FIFO named like a GGUF would block the reader forever: refused, naming the file."""
    import os

    from sim.errors import ScenarioError

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ScenarioError, match="not a regular file") as ei:
        read_gguf_index(fifo)
    assert str(fifo) in str(ei.value)


def _shards(full: Path, folder: Path, n: int, *, name: str = "m", tensors_count: int | None = None) -> list[Path]:
    """``full`` written again as ``n`` shards as llama-gguf-split writes them: every metadata key
    in the first (split.no 0), the tensors dealt out in order, split.count / split.no /
    split.tensors.count in each, named PREFIX-0000k-of-0000n.gguf."""
    idx = read_gguf_index(full)
    vt = {int: V.UINT32, float: V.FLOAT32, str: V.STRING}
    meta = [(vt[type(v)], k, v) for k, v in idx.kv.items()
            if k not in ("general.architecture", "general.alignment") and type(v) in vt]
    names = list(idx.tensors)
    per = -(-len(names) // n)
    out = []
    for k in range(n):
        split = [(V.UINT16, "split.no", k), (V.UINT16, "split.count", n),
                 (V.INT32, "split.tensors.count", len(names) if tensors_count is None else tensors_count)]
        ts = [(nm, idx.tensors[nm].ne, idx.tensors[nm].ggml_type) for nm in names[k * per:(k + 1) * per]]
        out.append(_write(folder / f"{name}-{k + 1:05d}-of-{n:05d}.gguf", idx.kv["general.architecture"],
                          (meta if k == 0 else []) + split, ts))
    return out


def test_a_split_gguf_reads_as_its_whole_file(tmp_path):
    """llama.cpp loads every shard of a split GGUF (llama-gguf-split's PREFIX-00001-of-0000N.gguf)
    given the first; so does the reader: the same model as the whole file (it had refused a shard,
    asking for a merge). Another shard (its metadata may be only the split keys), a missing shard, a
    first shard of another name, or a tensor count other than split.tensors.count is one line
    naming the file and field."""
    full = _llama(tmp_path / "full.gguf", n_layer=3, extra_kv=[(V.UINT32, "llama.context_length", 8192)])
    want = load_gguf_model(full)
    shards = _shards(full, tmp_path, 3)
    got = load_gguf_model(shards[0])
    assert (got.name, got.n_layer, got.n_ctx_train, got.nbytes, got.n_params) == (
        want.name, want.n_layer, want.n_ctx_train, want.nbytes, want.n_params)
    assert [(t.name, t.ggml_type, t.n_in, t.n_out) for t in got.tensors] == \
        [(t.name, t.ggml_type, t.n_in, t.n_out) for t in want.tensors]
    # another shard: refused as llama.cpp refuses it, naming the first
    err = _one_line_error(shards[2], "give m-00001-of-00003.gguf", fn=load_gguf_model)
    assert err.field == "split.no"
    shards[1].unlink()
    err = _one_line_error(shards[0], "shard m-00002-of-00003.gguf of this split GGUF", fn=load_gguf_model)
    assert err.field == "split.count"
    other = tmp_path / "o"
    other.mkdir()
    renamed = _shards(full, other, 2)[0].rename(other / "renamed.gguf")
    assert _one_line_error(renamed, "named 'renamed.gguf'", fn=load_gguf_model).field == "split.count"
    bad = tmp_path / "b"
    bad.mkdir()
    err = _one_line_error(_shards(full, bad, 2, tensors_count=5)[0], "split.tensors.count is 5", fn=load_gguf_model)
    assert err.field == "split.tensors.count"
    whole = _llama(tmp_path / "w.gguf", extra_kv=[(V.UINT16, "split.count", 1)])
    assert load_gguf_model(whole).n_layer == 2


def test_the_trained_context_is_read_from_context_length(tmp_path):
    """<arch>.context_length is the model's n_ctx_train (0 when absent); a non-integer is a
    one-line error naming the key."""
    m = load_gguf_model(_llama(tmp_path / "a.gguf", extra_kv=[(V.UINT32, "llama.context_length", 32768)]))
    assert m.n_ctx_train == 32768
    assert load_gguf_model(_llama(tmp_path / "b.gguf")).n_ctx_train == 0
    with pytest.raises(ScenarioError, match="context_length"):
        load_gguf_model(_llama(tmp_path / "c.gguf", extra_kv=[(V.STRING, "llama.context_length", "long")]))
