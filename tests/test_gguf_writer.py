"""The synthetic GGUF writer (:mod:`calibrate.llamacpp.gguf_writer`) and llama.cpp's type rule
(:func:`sim.model.quant.tensor_ggml_type`).

* the type rule reproduces the mixed-group bits the model TOMLs give (5.53125 for qwen3moe
  attn_v, ...), and the GGUF's tensors are ``ModelSpec.tensors`` (names, shapes, types, bytes;
  gemma3's tied output a duplicate counted once);
* the zero-mean block encoders, checked with this file's own dequantisers (written from
  ``ggml-quants.c``'s layouts) and against gguf-py's;
* tiny GGUFs of every arch read back with ``gguf.GGUFReader``: names, shapes, types, sizes,
  metadata; trimming, determinism, atomic writing;
* the routing proof: distinct experts per ubatch match ``E * (1 - (1 - k/E)^T)``;
* CLI errors: one line, exit 2, no file left.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from calibrate.llamacpp import gguf_writer as gw  # noqa: E402
from sim.errors import ScenarioError  # noqa: E402
from sim.model.quant import GGML_BLOCK, LLAMA_FTYPE, ggml_nbytes, tensor_ggml_type, use_more_bits  # noqa: E402
from sim.model.routing import expected_distinct_uniform  # noqa: E402
from sim.model.specs import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "scenarios" / "models"
ARCH_MODELS = {"qwen3moe": "qwen3-30b-a3b", "gpt-oss": "gpt-oss-20b", "gemma3": "gemma3-27b",
               "llama": "mixtral-8x7b"}


def _spec(name: str):
    return load_model(MODELS / f"{name}.toml")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, tuple[object, Path]]:
    """One tiny GGUF per arch (tiny spec, path)."""
    d = tmp_path_factory.mktemp("gguf")
    out = {}
    for arch, name in ARCH_MODELS.items():
        spec = gw.tiny_variant(_spec(name))
        p = d / f"{name}-tiny.gguf"
        gw.write_gguf(spec, p, seed=7, tiny=True)
        out[arch] = (spec, p)
    return out


# ------------------------------------------------------------------------------------------
# the arch field and the type rule
# ------------------------------------------------------------------------------------------


def test_model_tomls_name_their_llama_cpp_arch():
    for arch, name in ARCH_MODELS.items():
        assert _spec(name).arch == arch
    assert _spec("laguna-118b").arch == ""


def test_use_more_bits_counts_match_the_toml_comments():
    assert sum(use_more_bits(i, 48) for i in range(48)) == 24
    assert sum(use_more_bits(i, 62) for i in range(62)) == 30
    assert sum(use_more_bits(i, 32) for i in range(32)) == 16
    # first n/8, last n/8, every third in between (i - n/8) % 3 == 2
    assert [i for i in range(16) if use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]


def test_type_rule_reproduces_the_mixed_group_bits_of_the_tomls():
    for name in ARCH_MODELS.values():
        spec = _spec(name)
        bits = gw.plan_group_bits(gw.plan_tensors(spec, check=False))
        for g, v in spec.group_types.items():
            if isinstance(v, float):
                assert bits[g] == pytest.approx(v, abs=1e-12), (name, g)
    q = gw.plan_group_bits(gw.plan_tensors(_spec("qwen3-30b-a3b")))
    assert q["attn_v"] == 5.53125 and q["exps_down"] == 5.53125
    assert gw.plan_group_bits(gw.plan_tensors(_spec("gemma3-27b")))["ffn_down"] == pytest.approx(5.497983870967742)


def test_type_rule_details():
    # Q4_K_M: attn_v / ffn_down Q6_K on use_more_bits layers, else Q4_K
    assert tensor_ggml_type("Q4_K_M", "attn_v", 0, 48) == "Q6_K"
    assert tensor_ggml_type("Q4_K_M", "attn_v", 6, 48) == "Q4_K"
    assert tensor_ggml_type("Q4_K_M", "exps_down", 8, 48, n_expert=128) == "Q6_K"
    assert tensor_ggml_type("Q4_K_M", "exps_gate", 0, 48, n_expert=128) == "Q4_K"
    assert tensor_ggml_type("Q4_K_M", "output", -1, 48) == "Q6_K"
    assert tensor_ggml_type("Q4_K_M", "embd", -1, 48) == "Q4_K"
    assert tensor_ggml_type("Q4_K_M", "embd", -1, 62, tied_embeddings=True) == "Q6_K"
    # the 8-expert (Mixtral) bumps
    assert tensor_ggml_type("Q4_K_M", "attn_v", 5, 32, n_expert=8) == "Q8_0"
    assert tensor_ggml_type("Q4_K_M", "attn_k", 5, 32, n_expert=8) == "Q8_0"
    assert tensor_ggml_type("Q4_K_M", "attn_output", 5, 32, n_expert=8) == "Q5_K"
    assert tensor_ggml_type("Q4_K_M", "attn_output", 5, 32, n_expert=128) == "Q4_K"
    # MXFP4_MOE: experts MXFP4, other matrices Q8_0; norms and the router F32
    assert tensor_ggml_type("MXFP4", "exps_up", 3, 24, n_expert=32) == "MXFP4"
    assert tensor_ggml_type("MXFP4", "attn_q", 3, 24, n_expert=32) == "Q8_0"
    assert tensor_ggml_type("MXFP4", "embd", -1, 24) == "Q8_0"
    assert tensor_ggml_type("MXFP4", "router", 3, 24) == "F32"
    assert tensor_ggml_type("Q4_K_M", "norm", 3, 24) == "F32"
    # IQ4_NL: attn_v Q5_K with GQA >= 4; ffn_down Q5_K on the first n/8 layers
    assert tensor_ggml_type("IQ4_NL", "attn_v", 9, 48, n_gqa=6) == "Q5_K"
    assert tensor_ggml_type("IQ4_NL", "exps_down", 5, 48, n_expert=256) == "Q5_K"
    assert tensor_ggml_type("IQ4_NL", "exps_down", 6, 48, n_expert=256) == "IQ4_NL"
    # block-size fallback (ne[0] = 2880 is no multiple of 256)
    assert tensor_ggml_type("Q4_K_M", "attn_q", 1, 24, n_in=2880) == "Q5_0"
    assert tensor_ggml_type("Q4_K_M", "attn_v", 0, 24, n_in=2880) == "Q8_0"
    # an explicit type string wins; a float leaves the choice to the rule
    assert tensor_ggml_type("Q4_K_M", "attn_v", 0, 48, explicit="q8_0") == "Q8_0"
    assert tensor_ggml_type("Q4_K_M", "attn_v", 0, 48, explicit=5.53125) == "Q6_K"
    with pytest.raises(KeyError):
        tensor_ggml_type("Q3_K_M", "attn_v", 0, 48)


def test_ftype_values_match_gguf_py():
    F = gguf.LlamaFileType
    assert LLAMA_FTYPE["Q4_K_M"] == F.MOSTLY_Q4_K_M == 15
    assert LLAMA_FTYPE["MXFP4"] == F.MOSTLY_MXFP4_MOE == 38
    for k in ("F16", "BF16", "Q8_0", "Q4_K_S", "Q5_K_M", "IQ4_NL", "IQ4_XS"):
        assert LLAMA_FTYPE[k] == F[f"MOSTLY_{k}"]
    for t, (blk, size) in GGML_BLOCK.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t]] == (blk, size), t
    for t, i in gw._GGML_TYPE_ID.items():
        assert gguf.GGMLQuantizationType[t] == i, t


REFERENCE_GIB = {"qwen3-30b-a3b": "17.28", "gpt-oss-20b": "11.27", "gemma3-27b": "15.40",
                 "mixtral-8x7b": "26.49"}   # llama-bench's size column for the real GGUFs


@pytest.mark.parametrize("name", list(ARCH_MODELS.values()))
def test_gguf_tensors_are_the_modelspec_tensors(name):
    """ModelSpec lists every tensor the writer writes (norms, gpt-oss biases and sinks included),
    in file order, with the same shape, type and bytes; gemma3's tied head is ModelSpec's one
    extra (a duplicate of token_embd.weight, counted once)."""
    spec = _spec(name)
    plan = gw.plan_tensors(spec)
    total = sum(t.nbytes for t in plan)
    assert total == spec.nbytes and sum(t.n_elements for t in plan) == spec.n_params
    assert f"{total / 2**30:.2f}" == REFERENCE_GIB[name]
    aux = sum(t.nbytes for t in plan if not t.group)             # norms, biases, sinks (F32)
    assert 0 < aux < 0.0025 * total                               # 0.8 MiB qwen3 .. 26.6 MiB gpt-oss
    mine = [t for t in spec.tensors if not t.duplicate]
    assert [t.name for t in mine] == [t.name for t in plan]
    for t, p in zip(mine, plan):
        assert (t.ne, t.ggml_type, t.nbytes, t.layer) == (p.ne, p.ggml_type, p.nbytes, p.layer), t.name
        assert p.group == (t.group if t.is_matrix else ""), t.name
    dup = [t for t in spec.tensors if t.duplicate]
    assert [(t.name, t.group) for t in dup] == ([("token_embd.weight", "output")] if name == "gemma3-27b" else [])


def test_a_float_that_disagrees_with_the_rule_is_refused():
    spec = _spec("qwen3-30b-a3b")
    bad = replace(spec, group_types={**spec.group_types, "attn_v": 6.5625})
    with pytest.raises(ScenarioError, match="quant.attn_v"):
        gw.plan_tensors(bad)


# ------------------------------------------------------------------------------------------
# encoders, checked with this file's own dequantisers
# ------------------------------------------------------------------------------------------


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32).reshape(-1)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) packed -> (n, 8) scales and mins (get_scale_min_k4)."""
    s, m = np.empty((len(sc), 8), np.int32), np.empty((len(sc), 8), np.int32)
    q = sc.astype(np.int32)
    for j in range(8):
        if j < 4:
            s[:, j], m[:, j] = q[:, j] & 63, q[:, j + 4] & 63
        else:
            s[:, j] = (q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4)
            m[:, j] = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
    return s, m


def my_dequant(t: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, f16 block scales) of raw blocks; layouts of ggml-common.h / ggml-quants.c."""
    if t == "F32":
        return raw.view(np.float32), np.ones(1, np.float32)
    if t == "F16":
        return raw.view(np.float16).astype(np.float32), np.ones(1, np.float32)
    if t == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32), np.ones(1, np.float32)
    blk, size = GGML_BLOCK[t]
    b = raw.reshape(-1, size)
    n = len(b)
    if t == "Q8_0":
        d = _f16(b[:, :2])
        return (d[:, None] * b[:, 2:].view(np.int8)).reshape(-1), d
    if t == "Q4_0":
        d = _f16(b[:, :2])
        q = np.concatenate([b[:, 2:] & 15, b[:, 2:] >> 4], axis=1).astype(np.int32) - 8
        return (d[:, None] * q).reshape(-1), d
    if t in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, 16:144] if t == "Q4_K" else b[:, 48:176]
        y = np.empty((n, 256), np.float32)
        for j in range(4):                      # 64-element chunks
            ql = qs[:, 32 * j:32 * j + 32].astype(np.int32)
            lo, hi = ql & 15, ql >> 4
            if t == "Q5_K":
                qh = b[:, 16:48].astype(np.int32)
                lo = lo + ((qh >> (2 * j)) & 1) * 16
                hi = hi + ((qh >> (2 * j + 1)) & 1) * 16
            y[:, 64 * j:64 * j + 32] = d[:, None] * sc[:, 2 * j, None] * lo - dmin[:, None] * mn[:, 2 * j, None]
            y[:, 64 * j + 32:64 * j + 64] = d[:, None] * sc[:, 2 * j + 1, None] * hi - dmin[:, None] * mn[:, 2 * j + 1, None]
        return y.reshape(-1), np.concatenate([d, dmin])
    if t == "Q6_K":
        ql, qh = b[:, :128].astype(np.int32), b[:, 128:192].astype(np.int32)
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[:, 208:210])
        y = np.empty((n, 256), np.float32)
        for h in range(2):
            L, H = ql[:, 64 * h:64 * h + 64], qh[:, 32 * h:32 * h + 32]
            q1 = (L[:, :32] & 15) | (((H >> 0) & 3) << 4)
            q2 = (L[:, 32:] & 15) | (((H >> 2) & 3) << 4)
            q3 = (L[:, :32] >> 4) | (((H >> 4) & 3) << 4)
            q4 = (L[:, 32:] >> 4) | (((H >> 6) & 3) << 4)
            for k, q in enumerate((q1, q2, q3, q4)):
                for l0 in (0, 16):
                    is_ = 8 * h + l0 // 16 + 2 * k
                    y[:, 128 * h + 32 * k + l0:128 * h + 32 * k + l0 + 16] = (
                        d[:, None] * sc[:, is_, None] * (q[:, l0:l0 + 16] - 32))
        return y.reshape(-1), d
    if t == "MXFP4":
        kv = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
        e = b[:, 0].astype(np.int64)
        s = np.where(e < 2, 2.0 ** -128 * 2 ** e, 2.0 ** (e - 128)).astype(np.float32)
        q = np.concatenate([b[:, 1:] & 15, b[:, 1:] >> 4], axis=1)
        return (s[:, None] * kv[q]).reshape(-1), s
    raise KeyError(t)


@pytest.mark.parametrize("t", gw.ENCODABLE_TYPES)
@pytest.mark.parametrize("std", [1.0, gw.SMALL_STD])
def test_encoders_are_zero_mean_with_the_target_std(t, std):
    blk, size = GGML_BLOCK[t]
    n_blocks = (1 << 16) // blk
    raw = gw.encode_blocks(t, n_blocks, std, np.random.default_rng(1))
    assert raw.dtype == np.uint8 and raw.size == n_blocks * size == ggml_nbytes(t, n_blocks * blk)
    y, scales = my_dequant(t, raw)
    assert y.size == n_blocks * blk and np.isfinite(y).all()
    assert np.isfinite(scales).all() and (scales > 0).all()
    if t not in ("F32", "F16", "BF16", "MXFP4"):
        assert (scales >= 2.0 ** -14).all()             # normal float16 block scales
    assert abs(y.mean()) < 5 * std / math.sqrt(y.size)
    assert y.std() == pytest.approx(std, rel=0.03)
    if t not in ("F32", "F16"):                         # same values as gguf-py's reference
        np.testing.assert_allclose(gw.dequantize(t, raw.reshape(n_blocks, size)).reshape(-1), y,
                                   rtol=1e-6, atol=1e-12)


def test_encoders_are_symmetric_and_per_block_balanced():
    rng = np.random.default_rng(3)
    q4k, _ = my_dequant("Q4_K", gw.encode_blocks("Q4_K", 4096, 1.0, rng))
    vals = np.unique(np.round(q4k / q4k[q4k > 0].min(), 6))
    assert np.array_equal(vals, -vals[::-1])             # d*(2q-15): odd multiples, symmetric
    q6k, _ = my_dequant("Q6_K", gw.encode_blocks("Q6_K", 4096, 1.0, rng))
    assert np.abs(q6k).max() <= 31 * np.abs(q6k[q6k != 0]).min() + 1e-9  # q-32 in -31..31
    with pytest.raises(KeyError):
        gw.encode_blocks("IQ2_XXS", 1, 1.0, rng)


# ------------------------------------------------------------------------------------------
# tiny GGUFs read back
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(ARCH_MODELS))
def test_tiny_gguf_reads_back(arch, tiny_files):
    spec, path = tiny_files[arch]
    plan = gw.plan_tensors(spec)
    r = gguf.GGUFReader(path)
    assert [t.name for t in r.tensors] == [t.name for t in plan]
    for rt, t in zip(r.tensors, plan):
        assert tuple(int(x) for x in rt.shape) == t.ne, t.name
        assert rt.tensor_type.name == t.ggml_type, t.name
        assert rt.n_bytes == t.nbytes, t.name
    kv = {k: f.contents() for k, f in r.fields.items()}
    assert kv["general.architecture"] == arch
    assert kv["general.file_type"] == LLAMA_FTYPE[gw.model_quant(spec)[0]]
    assert kv[f"{arch}.block_count"] == spec.n_layer
    assert kv[f"{arch}.embedding_length"] == spec.d_model
    assert kv[f"{arch}.attention.head_count_kv"] == spec.n_head_kv
    assert kv[f"{arch}.attention.key_length"] == spec.head_dim
    assert kv["prefetch_sim.seed"] == 7 and kv["prefetch_sim.tiny"] is True
    assert kv["prefetch_sim.model_toml"].endswith(f"{ARCH_MODELS[arch]}.toml")
    toks = kv["tokenizer.ggml.tokens"]
    assert kv["tokenizer.ggml.model"] == "llama" and len(toks) == spec.n_vocab == len(set(toks))
    assert toks[3] == "<0x00>" and toks[258] == "<0xFF>"
    if spec.moe:
        assert kv[f"{arch}.expert_count"] == spec.moe.n_expert
        assert kv[f"{arch}.expert_used_count"] == spec.moe.n_expert_used
    if arch in ("gemma3", "gpt-oss"):
        assert kv[f"{arch}.attention.sliding_window"] == spec.sliding_window
        assert kv[f"{arch}.attention.sliding_window_pattern"] == spec.swa_interval
    # the tiny spec keeps ModelSpec exact too
    assert sum(t.nbytes for t in plan) == spec.nbytes
    # the project's own header reader agrees with gguf-py
    idx = gw.read_gguf_index(path)
    for rt in r.tensors:
        ne, t, off, nb = idx.tensors[rt.name]
        assert (off, nb, t) == (rt.data_offset, rt.n_bytes, rt.tensor_type.name)
    assert idx.kv["tokenizer.ggml.tokens"] == spec.n_vocab
    assert idx.kv[f"{arch}.block_count"] == spec.n_layer
    # values: norms 1, embedding std ~1, small matrices SMALL_STD
    data = {t.name: t for t in r.tensors}
    assert np.all(data["output_norm.weight"].data == 1.0)
    emb = gw.dequantize(data["token_embd.weight"].tensor_type.name, np.asarray(data["token_embd.weight"].data))
    assert emb.std() == pytest.approx(1.0, rel=0.05) and abs(emb.mean()) < 0.01
    q = data["blk.1.attn_q.weight"]
    assert gw.dequantize(q.tensor_type.name, np.asarray(q.data)).std() == pytest.approx(gw.SMALL_STD, rel=0.1)


def test_architecture_specific_tensors(tiny_files):
    names = {a: {t.name for t in gguf.GGUFReader(p).tensors} for a, (_s, p) in tiny_files.items()}
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.0.ffn_gate_inp.weight",
            "output.weight"} <= names["qwen3moe"]
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight", "blk.0.attn_q_norm.weight",
            "blk.0.ffn_gate.weight"} <= names["gemma3"]
    assert "output.weight" not in names["gemma3"]                  # tied: llama.cpp duplicates token_embd
    assert {"blk.0.attn_sinks.weight", "blk.0.attn_q.bias", "blk.0.attn_output.bias", "blk.0.ffn_gate_inp.bias",
            "blk.0.ffn_down_exps.bias", "blk.0.post_attention_norm.weight"} <= names["gpt-oss"]
    assert "blk.0.ffn_norm.weight" not in names["gpt-oss"]
    assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_norm.weight"} <= names["llama"]
    assert not any("norm" in n and "q_norm" in n for n in names["llama"])


def test_trimmed_file_keeps_the_full_models_types(tmp_path):
    spec = gw.tiny_variant(_spec("qwen3-30b-a3b"))
    res = gw.write_gguf(spec, tmp_path / "t.gguf", n_layer=3, seed=1)
    r = gguf.GGUFReader(res.path)
    kv = {k: f.contents() for k, f in r.fields.items()}
    assert kv["qwen3moe.block_count"] == 3 and kv["prefetch_sim.n_layer_full"] == 8
    assert "[3 of 8 layers]" in kv["general.name"]
    full = {t.name: t.ggml_type for t in gw.plan_tensors(spec)}
    assert all(full[t.name] == t.tensor_type.name for t in r.tensors)
    assert not any(t.name.startswith("blk.3.") for t in r.tensors)
    with pytest.raises(ScenarioError, match="n_layer"):
        gw.write_gguf(spec, tmp_path / "u.gguf", n_layer=9)
    assert not (tmp_path / "u.gguf").exists()


def test_same_seed_same_bytes_and_no_partial_file(tmp_path, monkeypatch, tiny_files):
    spec, path = tiny_files["llama"]
    again = gw.write_gguf(spec, tmp_path / "again.gguf", seed=7, tiny=True).path
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(gw, "_write_tensor", boom)
    with pytest.raises(OSError):
        gw.write_gguf(spec, tmp_path / "x.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.gguf"]


# ------------------------------------------------------------------------------------------
# the routing proof
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_routing_is_diverse_and_near_uniform(arch, tmp_path):
    spec = gw.tiny_variant(_spec(ARCH_MODELS[arch]), n_vocab=4096, n_layer=4)
    path = gw.write_gguf(spec, tmp_path / "r.gguf", seed=11).path
    E, k = spec.moe.n_expert, spec.moe.n_expert_used
    assert (E, k) == ((32, 8) if arch == "qwen3moe" else (32, 4))
    ids = gw.predicted_router_ids(path, np.arange(spec.n_vocab))      # every token, first and last layer
    assert sorted(ids) == [0, spec.n_layer - 1]
    rng = np.random.default_rng(0)
    for layer, a in ids.items():
        assert a.shape == (spec.n_vocab, k)
        assert all(len(set(r)) == k for r in a[:50])
        for T in (8, 32, 128, 512):
            distinct = [len(np.unique(a[rng.integers(0, spec.n_vocab, T)])) for _ in range(200)]
            assert np.mean(distinct) == pytest.approx(expected_distinct_uniform(E, k, T), rel=0.03), (layer, T)
        counts = np.bincount(a.reshape(-1), minlength=E)
        mean = spec.n_vocab * k / E
        # multinomial spread: std ~ sqrt(mean); allow 4.5 sigma, and a chi-square well below 3x dof
        assert np.abs(counts - mean).max() < 4.5 * math.sqrt(mean)
        assert ((counts - mean) ** 2 / mean).sum() < 3 * (E - 1)
    # the two routers are independent: top-1 agreement near 1/E
    assert np.mean(ids[0][:, 0] == ids[spec.n_layer - 1][:, 0]) < 3 / E


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------


def _run(capsys, *argv):
    rc = gw.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_writes_a_tiny_file(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    rc, so, err = _run(capsys, "--model", str(MODELS / "gemma3-27b.toml"), "--out", str(out), "--tiny",
                       "--seed", "3", "--quiet")
    assert rc == 0 and out.is_file() and not (tmp_path / "m.gguf.tmp").exists()
    assert "wrote" in so and err == ""


@pytest.mark.parametrize("case", ["no_arch", "unknown_arch", "bad_out", "bad_model", "bad_n_layer"])
def test_cli_errors_are_one_line_exit_2_and_leave_no_file(case, tmp_path, capsys):
    model = MODELS / "qwen3-30b-a3b.toml"
    out = tmp_path / "m.gguf"
    extra: list[str] = ["--tiny"]
    if case == "no_arch":
        model = MODELS / "laguna-118b.toml"
    elif case == "unknown_arch":
        model = tmp_path / "m.toml"
        model.write_text((MODELS / "qwen3-30b-a3b.toml").read_text().replace('arch = "qwen3moe"', 'arch = "qwen9"'))
    elif case == "bad_out":   # its folder is a file (a missing folder is made: test_cli_makes_a_missing_folder)
        (tmp_path / "afile").write_text("x")
        out = tmp_path / "afile" / "m.gguf"
    elif case == "bad_model":
        model = tmp_path / "nope.toml"
    elif case == "bad_n_layer":
        extra += ["--n-layer", "0"]
    rc, so, err = _run(capsys, "--model", str(model), "--out", str(out), "--quiet", *extra)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gguf_writer: error:"), err
    assert {"no_arch": "model.arch", "unknown_arch": "'qwen9' is not supported", "bad_out": "afile",
            "bad_model": "nope.toml", "bad_n_layer": "n_layer"}[case] in lines[0]
    assert not out.exists() and not out.with_name(out.name + ".tmp").exists()
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".toml" and p.name != "afile"] == []


def test_cli_makes_a_missing_folder(tmp_path, capsys):
    """--out in folders that do not exist yet: made, as prefetch-sim run --out makes them."""
    out = tmp_path / "a" / "b" / "m.gguf"
    rc, _so, err = _run(capsys, "--model", str(MODELS / "qwen3-30b-a3b.toml"), "--out", str(out), "--quiet", "--tiny")
    assert rc == 0, err
    assert out.is_file() and not out.with_name(out.name + ".tmp").exists()


def test_a_llama_with_tied_embeddings_is_written_without_an_output_tensor():
    """The writer follows the model file's tied_embeddings (Llama-3.2 ties; it had written an
    output.weight for every llama, 0.21 GiB more than the model: h100-20261207-dense3), and the
    token embedding then takes the output's type, as llama.cpp's quantiser gives it."""
    from sim.model.specs import load_model

    root = Path(__file__).resolve().parents[1]
    tied = load_model(root / "calibrate/llamacpp/grids/models/llama3.2-3b-q4_k_m.toml")
    names = {t.name: t for t in gw.plan_tensors(tied)}
    assert "output.weight" not in names and names["token_embd.weight"].ggml_type == "Q6_K"
    untied = load_model(root / "scenarios/models/llama3-8b.toml")
    names = {t.name: t for t in gw.plan_tensors(untied)}
    assert names["output.weight"].ggml_type == "Q6_K" and names["token_embd.weight"].ggml_type == "Q4_K"
