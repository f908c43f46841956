"""Synthetic GGUF files that llama.cpp loads and runs like the real model.

For a model TOML with ``[model] arch`` (``qwen3moe``, ``llama``, ``gemma3``, ``gpt-oss``) this
writes a GGUF with the real architecture keys, tensor names (``blk.3.ffn_up_exps.weight``),
shapes and per-tensor ggml types (llama.cpp's ``llama_tensor_get_type`` rule,
:func:`sim.model.quant.tensor_ggml_type`), random weights and a "llama" SPM vocabulary. The files are
benchmarked with real llama-bench as ground truth for the simulator, so the bytes are those of
a real GGUF of the model and preset; only the values are synthetic.

Values (docs in ``shared/LLAMACPP.md``, "Routing is the trap"):

* every quantised block is **zero-mean and symmetric** (:func:`encode_blocks`): random bytes in
  K-quant blocks would give every matrix a common mean direction, the hidden state collapses
  and all tokens pick the same few experts;
* the token embedding has a normal scale (std 1 after dequantisation), fully independent per
  row; the routers (``ffn_gate_inp``, F32) have independent Gaussian rows scaled to unit norm,
  so router logits of a normalised token are ~N(0, 1) per expert and top-k routing is diverse
  and near-uniform (:func:`predicted_router_ids` checks it);
* every other matrix (attention, experts, output) has a small std (:data:`SMALL_STD`), so the
  residual stream stays close to the embedding up to the last router; norms are 1, biases and
  attention sinks 0.

Big tensors are filled with slices of a per-type pool of valid random blocks (32 MiB) at
random offsets, and everything is streamed to disk tensor by tensor (peak RSS a few hundred
MB); the output goes to ``OUT.tmp`` and is renamed when complete.

CLI::

    python -m calibrate.llamacpp.gguf_writer --model scenarios/models/qwen3-30b-a3b.toml \\
        --out X.gguf [--n-layer N] [--seed S] [--tiny]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from sim.errors import PrefetchSimError, ScenarioError
from sim.model.gguf import GGML_TYPE_ID, GGUFIndex, read_gguf_index
from sim.model.quant import GGML_BLOCK, LLAMA_FTYPE, RULE_PRESETS, bpw_of, ggml_nbytes, tensor_ggml_type
from sim.model.specs import ModelSpec, load_model
from sim.tomlio import load_toml

__all__ = [
    "SUPPORTED_ARCHS", "SMALL_STD", "POOL_BYTES", "ENCODABLE_TYPES", "TensorPlan", "WriteResult",
    "GGUFIndex", "model_quant", "plan_tensors", "plan_group_bits", "tiny_variant", "encode_blocks",
    "dequantize", "write_gguf", "read_gguf_index", "predicted_router_ids", "main",
]

#: architectures the writer knows (``general.architecture`` values of llama.cpp's
#: ``src/llama-arch.cpp``; ``llama`` covers Mixtral, i.e. llama with experts).
SUPPORTED_ARCHS = ("qwen3moe", "llama", "gemma3", "gpt-oss")

#: std of every matrix except the embedding and the routers (after dequantisation). Small
#: enough that 48 layers move the residual by ~10% of the embedding's norm, large enough that
#: every f16 block scale is a normal float16 (>= 2**-14) in every encoder.
SMALL_STD = 2e-3

#: bytes of the pool of random blocks per ggml type (rounded down to whole blocks)
POOL_BYTES = 32 * 2**20

_MIN_SCALE = 2.0**-13   # smallest block scale the encoders aim for (f16 normals start at 2**-14)
_CHUNK_BLOCKS = 1 << 16  # blocks generated per step for the independent tensors
_THREADS = min(8, os.cpu_count() or 1)   # encoder threads for the embedding

# Per-architecture hyper-parameters that ModelSpec does not carry, from the public HF
# config.json of the model each shipped TOML describes (values also in their public GGUFs):
# Qwen/Qwen3-30B-A3B (max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6),
# mistralai/Mixtral-8x7B-v0.1 (32768, 1e6, 1e-5), google/gemma-3-27b-it text_config (131072,
# rope_theta 1e6, rope_local_base_freq 1e4, rms_norm_eps 1e-6, rope_scaling linear x8),
# openai/gpt-oss-20b (131072, rope_theta 150000, rms_norm_eps 1e-5, yarn x32 from 4096).
_ARCH_KV: Mapping[str, Mapping[str, Any]] = {
    "qwen3moe": {"context_length": 40960, "rope_freq_base": 1e6, "rms_eps": 1e-6},
    "llama": {"context_length": 32768, "rope_freq_base": 1e6, "rms_eps": 1e-5},
    "gemma3": {"context_length": 131072, "rope_freq_base": 1e6, "rms_eps": 1e-6,
               "rope_freq_base_swa": 1e4, "rope_scaling": ("linear", 8.0, 0)},
    "gpt-oss": {"context_length": 131072, "rope_freq_base": 150000.0, "rms_eps": 1e-5,
                "rope_scaling": ("yarn", 32.0, 4096)},
}

#: the norm that feeds each arch's router (its weight multiplies the RMS-normed input)
_ROUTER_NORM = {"qwen3moe": "ffn_norm", "llama": "ffn_norm", "gpt-oss": "post_attention_norm"}

_GGML_TYPE_ID = GGML_TYPE_ID   # enum ggml_type (ggml/include/ggml.h), from sim.model.gguf


# --------------------------------------------------------------------------------------
# The tensor plan
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the file.

    Attributes:
        name: GGUF name (``blk.3.ffn_up_exps.weight``).
        ne: ggml dimensions, innermost first (``(n_embd, n_ff_exp, n_expert)``).
        ggml_type: ggml type name (``"Q4_K"``).
        fill: ``"embd"`` (independent, std 1), ``"router"`` (independent unit-norm rows, F32),
            ``"small"`` (pool, :data:`SMALL_STD`), ``"ones"`` (norms), ``"zeros"`` (biases,
            attention sinks).
        layer: block index, -1 outside the blocks.
        group: the :class:`sim.model.specs.ModelSpec` tensor group, or ``""`` for tensors ModelSpec
            omits (norms, biases, sinks).
    """

    name: str
    ne: tuple[int, ...]
    ggml_type: str
    fill: str
    layer: int = -1
    group: str = ""

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor data (``ggml_nbytes``; GGUF pads each tensor to 32 bytes)."""
        return ggml_nbytes(self.ggml_type, self.n_elements)


def model_quant(spec: ModelSpec) -> tuple[str, dict[str, str | float]]:
    """The preset and the explicit ``[quant]`` entries of the model's TOML (``spec.file``).

    Returns:
        ``(preset, explicit)``: e.g. ``("Q4_K_M", {"attn_v": 5.53125, "exps_down": 5.53125})``.
        A spec built in code (``file`` None or not a file) gives ``("F16", {})``: its
        ``group_types`` must then agree with the F16 rule (the plan's bits check says so).

    Raises:
        ScenarioError: the TOML is not valid.
    """
    if spec.file and Path(spec.file).is_file():
        q = load_toml(spec.file).get("quant", {}) or {}
        preset = str(q.get("preset", "F16")).upper()
        return preset, {k: v for k, v in q.items() if k != "preset"}
    return "F16", {}


def _fail(spec: ModelSpec, fld: str, msg: str) -> ScenarioError:
    return ScenarioError(msg, file=spec.file, field=fld)


def _check_arch(spec: ModelSpec) -> str:
    arch = spec.arch
    if not arch:
        raise _fail(spec, "model.arch", "missing: the GGUF writer needs the llama.cpp architecture "
                    f"({', '.join(SUPPORTED_ARCHS)})")
    if arch not in SUPPORTED_ARCHS:
        raise _fail(spec, "model.arch", f"'{arch}' is not supported by the GGUF writer "
                    f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    m = spec.moe
    if arch in ("qwen3moe", "gpt-oss") and m is None:
        raise _fail(spec, "model.arch", f"'{arch}' needs a [moe] table")
    if arch == "gemma3" and m is not None:
        raise _fail(spec, "model.arch", "'gemma3' is a dense model; remove [moe]")
    if m is not None and (m.n_expert_shared or m.n_layer_dense_lead or m.fused_gate_up):
        raise _fail(spec, "moe", f"arch '{arch}' has no shared experts, leading dense layers or fused "
                    "gate_up experts in llama.cpp")
    if arch in ("gemma3", "gpt-oss") and not (spec.sliding_window and spec.swa_interval):
        raise _fail(spec, "model.sliding_window", f"'{arch}' needs sliding_window and swa_interval")
    if spec.attn_kind != "full":
        raise _fail(spec, "model.attn_kind", f"'{arch}' has full (softmax) attention")
    return arch


def plan_tensors(spec: ModelSpec, *, n_layer: int | None = None, preset: str | None = None,
                 explicit: Mapping[str, str | float] | None = None, check: bool = True) -> list[TensorPlan]:
    """Every tensor of the GGUF of ``spec``, in file order, with llama.cpp's shapes and types.

    Tensor lists follow the loaders in llama.cpp ``src/models/<arch>.cpp``
    (``load_arch_tensors``): ``qwen3moe.cpp``, ``llama.cpp``, ``gemma3.cpp``,
    ``openai-moe.cpp`` (gpt-oss). Types follow :func:`sim.model.quant.tensor_ggml_type` with the
    *full* model's layer count, so the first ``n_layer`` blocks of a trimmed file have the
    bytes they have in the full file. gemma3 has tied embeddings: no ``output.weight``
    (llama.cpp duplicates ``token_embd``), token_embd takes the output type.

    Args:
        spec: the model (``spec.arch`` set).
        n_layer: blocks to write (default all).
        preset, explicit: the quant preset and explicit TOML entries (default
            :func:`model_quant`).
        check: raise if a group's mean bits per weight in the plan differs from the spec's
            value (``spec.group_types``), so the GGUF and ModelSpec agree on bytes.

    Raises:
        ScenarioError: unsupported arch, bad ``n_layer``, a preset without a type rule, or
            (``check``) a group whose bits disagree, naming the TOML field.
    """
    arch = _check_arch(spec)
    if preset is None or explicit is None:
        p, e = model_quant(spec)
        preset = p if preset is None else preset
        explicit = e if explicit is None else explicit
    preset = preset.upper()
    if preset not in RULE_PRESETS:
        raise _fail(spec, "quant.preset", f"no llama.cpp type rule for preset '{preset}' "
                    f"(the writer knows {', '.join(RULE_PRESETS)})")
    for g, v in explicit.items():
        if isinstance(v, str):
            try:
                bpw_of(v)
                GGML_BLOCK[v.upper()]
            except KeyError:
                raise _fail(spec, f"quant.{g}", f"'{v}' is not a ggml type the writer can produce") from None
    n_full = spec.n_layer
    n_write = n_full if n_layer is None else n_layer
    if not 1 <= n_write <= n_full:
        raise _fail(spec, "n_layer", f"must be in 1..{n_full}, got {n_write}")
    d, hd, m = spec.d_model, spec.head_dim, spec.moe
    n_expert = m.n_expert if m else 0
    n_gqa = spec.n_head // spec.n_head_kv
    tied = spec.tied_embeddings  # the model file's (default: gemma3 ties, llama does not; Llama-3.2 ties)

    def ty(group: str, layer: int, n_in: int, role: str | None = None) -> str:
        return tensor_ggml_type(preset, group, layer, n_full, n_expert=n_expert, n_gqa=n_gqa,
                                tied_embeddings=tied, n_in=n_in, role=role, explicit=explicit.get(group))

    def w(name: str, ne: Sequence[int], group: str, layer: int, fill: str = "small") -> TensorPlan:
        return TensorPlan(name, tuple(ne), ty(group, layer, ne[0]), fill, layer, group)

    def f32(name: str, ne: Sequence[int], layer: int, fill: str) -> TensorPlan:
        return TensorPlan(name, tuple(ne), "F32", fill, layer, "")

    nq, nkv = spec.n_head * hd, spec.n_head_kv * hd
    out: list[TensorPlan] = [w("token_embd.weight", (d, spec.n_vocab), "embd", -1, "embd")]
    for i in range(n_full):
        b = f"blk.{i}."
        out.append(f32(b + "attn_norm.weight", (d,), i, "ones"))
        if arch == "gpt-oss":
            out.append(f32(b + "post_attention_norm.weight", (d,), i, "ones"))
        out += [w(b + "attn_q.weight", (d, nq), "attn_q", i),
                w(b + "attn_k.weight", (d, nkv), "attn_k", i),
                w(b + "attn_v.weight", (d, nkv), "attn_v", i),
                w(b + "attn_output.weight", (nq, d), "attn_output", i)]
        if arch == "gpt-oss":
            out += [f32(b + "attn_q.bias", (nq,), i, "zeros"), f32(b + "attn_k.bias", (nkv,), i, "zeros"),
                    f32(b + "attn_v.bias", (nkv,), i, "zeros"), f32(b + "attn_output.bias", (d,), i, "zeros"),
                    f32(b + "attn_sinks.weight", (spec.n_head,), i, "zeros")]
        if arch in ("qwen3moe", "gemma3"):
            out += [f32(b + "attn_q_norm.weight", (hd,), i, "ones"), f32(b + "attn_k_norm.weight", (hd,), i, "ones")]
        if arch == "gemma3":
            out.append(f32(b + "post_attention_norm.weight", (d,), i, "ones"))
        if arch != "gpt-oss":
            out.append(f32(b + "ffn_norm.weight", (d,), i, "ones"))
        if m is not None:
            ff, e = m.n_ff_exp, m.n_expert
            out.append(TensorPlan(b + "ffn_gate_inp.weight", (d, e), ty("router", i, d), "router", i, "router"))
            if arch == "gpt-oss":
                out.append(f32(b + "ffn_gate_inp.bias", (e,), i, "zeros"))
            out += [w(b + "ffn_gate_exps.weight", (d, ff, e), "exps_gate", i),
                    w(b + "ffn_up_exps.weight", (d, ff, e), "exps_up", i),
                    w(b + "ffn_down_exps.weight", (ff, d, e), "exps_down", i)]
            if arch == "gpt-oss":
                out += [f32(b + "ffn_gate_exps.bias", (ff, e), i, "zeros"),
                        f32(b + "ffn_up_exps.bias", (ff, e), i, "zeros"),
                        f32(b + "ffn_down_exps.bias", (d, e), i, "zeros")]
        else:
            out += [w(b + "ffn_gate.weight", (d, spec.n_ff), "ffn_gate", i),
                    w(b + "ffn_up.weight", (d, spec.n_ff), "ffn_up", i),
                    w(b + "ffn_down.weight", (spec.n_ff, d), "ffn_down", i)]
        if arch == "gemma3":
            out.append(f32(b + "post_ffw_norm.weight", (d,), i, "ones"))
    out.append(f32("output_norm.weight", (d,), -1, "ones"))
    if not tied:
        out.append(w("output.weight", (d, spec.n_vocab), "output", -1))
    if check:
        for g, bits in plan_group_bits(out).items():
            want = spec.bpw(g)
            if abs(bits - want) > 1e-9 * max(1.0, want):
                src = "quant." + g
                raise _fail(spec, src, f"llama.cpp's {preset} rule gives this group {bits!r} bits per "
                            f"weight in the GGUF, the model file says {want!r}; set {g} = {bits!r}")
    return [t for t in out if t.layer < n_write]


def plan_group_bits(plan: Iterable[TensorPlan]) -> dict[str, float]:
    """Mean bits per weight of each ModelSpec group in a plan (weighted by elements)."""
    bits: dict[str, float] = {}
    n: dict[str, int] = {}
    for t in plan:
        if t.group:
            bits[t.group] = bits.get(t.group, 0.0) + t.nbytes * 8
            n[t.group] = n.get(t.group, 0) + t.n_elements
    return {g: bits[g] / n[g] for g in bits}


def tiny_variant(spec: ModelSpec, *, n_layer: int = 8, d_model: int = 256, n_vocab: int = 1024,
                 n_ff: int = 512, n_ff_exp: int = 256, n_expert: int | None = None) -> ModelSpec:
    """A small model of the same arch, preset and type rule, for CI and local checks.

    Heads of 32 (``d_model / 32`` query heads, the original GQA ratio up to 8), at most
    ``n_layer`` blocks, ``n_vocab`` >= 512 tokens, experts ``max(8, min(E, 32))`` (unless given)
    with top-k at most a quarter of them (the original k if E is kept), sliding windows
    <= 128. Mixed-type groups get the tiny model's own mean bits (``group_types`` and
    ``quant_explicit``), so the rule keeps giving their per-tensor types and ``ModelSpec.nbytes``
    is the file's. The ``file`` stays the original TOML (its preset and explicit types apply).

    Raises:
        ScenarioError: unsupported arch; ValueError: dimensions that are no multiple of 256.
    """
    _check_arch(spec)
    if d_model % 256 or n_ff % 256 or n_ff_exp % 256 or n_vocab < 512:
        raise ValueError("tiny dimensions must be multiples of 256 (K-quant blocks), n_vocab >= 512")
    hd = 32
    n_head = d_model // hd
    gqa = min(spec.n_head // spec.n_head_kv, n_head, 8)
    while n_head % gqa:
        gqa -= 1
    moe = spec.moe
    if moe is not None:
        e = n_expert if n_expert is not None else (moe.n_expert if moe.n_expert < 8 else max(8, min(moe.n_expert, 32)))
        k = moe.n_expert_used if e == moe.n_expert else min(moe.n_expert_used, max(1, e // 4))
        moe = replace(moe, n_expert=e, n_expert_used=k, n_ff_exp=n_ff_exp,
                      n_ff_shexp=n_ff_exp if moe.n_ff_shexp else 0)
    tiny = replace(spec, name=spec.name + " (tiny)", n_layer=min(spec.n_layer, n_layer), d_model=d_model,
                   n_head=n_head, n_head_kv=n_head // gqa, head_dim=hd, n_vocab=n_vocab,
                   n_ff=n_ff if spec.n_ff or moe is None else 0, moe=moe,
                   sliding_window=min(spec.sliding_window, 128))
    bits = plan_group_bits(plan_tensors(tiny, check=False))
    types = {g: (bits[g] if isinstance(v, float) and g in bits else v) for g, v in spec.group_types.items()}
    explicit = {g: (bits[g] if isinstance(v, float) and g in bits else v) for g, v in spec.quant_explicit.items()}
    return replace(tiny, group_types=types, quant_explicit=explicit)


# --------------------------------------------------------------------------------------
# Zero-mean block encoders
# --------------------------------------------------------------------------------------

_F16_BYTES = lambda x: np.frombuffer(np.float16(x).tobytes(), np.uint8)  # noqa: E731


def _f16_scale(x: float, what: str) -> np.float16:
    d = np.float16(x)
    if not np.isfinite(d) or d <= 0:
        raise ValueError(f"{what}: block scale {x!r} is not a positive finite float16 (std out of range)")
    return d


def _enc_float(t: str, n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    x = (rng.standard_normal(n, dtype=np.float32) * np.float32(std))
    if t == "F32":
        return x.view(np.uint8)
    if t == "F16":
        if not 6e-5 <= std <= 1e4:
            raise ValueError(f"F16: std {std} out of the range the encoder supports")
        return x.astype(np.float16).view(np.uint8)
    u = x.view(np.uint32)                         # BF16: round to nearest even
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16).view(np.uint8)


def _sym_range(std: float, std_of: Callable[[int], float], qmax: int) -> int:
    """Largest symmetric integer range ``-Q..Q`` (Q <= qmax) whose scale stays >= 2**-13."""
    q = qmax
    while q > 1 and std / std_of(q) < _MIN_SCALE:
        q -= 1
    return q


def _enc_q8_0(n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    std_of = lambda q: math.sqrt(q * (q + 1) / 3)  # noqa: E731  std of uniform -q..q
    q = _sym_range(std, std_of, 127)
    out = np.empty((n, 34), np.uint8)
    out[:, 0:2] = _F16_BYTES(_f16_scale(std / std_of(q), "Q8_0"))
    out[:, 2:] = rng.integers(-q, q + 1, size=(n, 32), dtype=np.int8).view(np.uint8)
    return out.reshape(-1)


def _enc_q4_0(n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    # value = (nibble - 8) * d with nibbles 1..15: -7..7, std sqrt(7*8/3)
    out = np.empty((n, 18), np.uint8)
    out[:, 0:2] = _F16_BYTES(_f16_scale(std / math.sqrt(56 / 3), "Q4_0"))
    q = rng.integers(1, 16, size=(n, 32), dtype=np.uint8)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.reshape(-1)


# Q4_K / Q5_K packed 6-bit scales and mins (get_scale_min_k4 in ggml-quants.c): every
# sub-block sc = 2 and m = 15 (Q4_K) or m = 31 (Q5_K), so with dmin = d a value is
# d*(2q - 15) resp. d*(2q - 31): symmetric around 0 for uniform q.
_Q4K_SCALES = np.array([2] * 4 + [15] * 4 + [0xF2] * 4, np.uint8)
_Q5K_SCALES = np.array([2] * 4 + [31 | 64] * 4 + [0xF2] * 4, np.uint8)


def _enc_q4_k(n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    out = np.empty((n, 144), np.uint8)
    d = _F16_BYTES(_f16_scale(std / math.sqrt(4 * 255 / 12), "Q4_K"))   # std(2q-15), q~U{0..15}
    out[:, 0:2] = d
    out[:, 2:4] = d
    out[:, 4:16] = _Q4K_SCALES
    out[:, 16:] = rng.integers(0, 256, size=(n, 128), dtype=np.uint8)
    return out.reshape(-1)


def _enc_q5_k(n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    out = np.empty((n, 176), np.uint8)
    d = _F16_BYTES(_f16_scale(std / math.sqrt(4 * 1023 / 12), "Q5_K"))  # std(2q-31), q~U{0..31}
    out[:, 0:2] = d
    out[:, 2:4] = d
    out[:, 4:16] = _Q5K_SCALES
    out[:, 16:] = rng.integers(0, 256, size=(n, 160), dtype=np.uint8)
    return out.reshape(-1)


_Q6_STD = math.sqrt(2 * 31 * 32 * 63 / 6 / 64)   # std of q - 32: -31..31 uniform, 0 twice (of 64)


def _enc_q6_k(n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    # block_q6_K: ql[128], qh[64], int8 scales[16], f16 d; value = d * sc[e/16] * (q - 32)
    mag = int(min(16, max(1, std / (_Q6_STD * _MIN_SCALE))))
    out = np.empty((n, 210), np.uint8)
    q = rng.integers(0, 256, size=(n, 2, 4, 32), dtype=np.uint8)       # [half, quarter, l]
    q &= 63
    np.putmask(q, q == 0, 32)              # q in 1..63: q - 32 symmetric in -31..31 (0 twice)
    ql = out[:, :128].reshape(n, 2, 64)
    ql[:, :, :32] = (q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4)
    ql[:, :, 32:] = (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)
    out[:, 128:192].reshape(n, 2, 32)[:] = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2)
                                            | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
    sign = rng.integers(0, 2, size=(n, 16), dtype=np.int8) * 2 - 1
    out[:, 192:208] = (sign * mag).astype(np.int8).view(np.uint8)
    out[:, 208:210] = _F16_BYTES(_f16_scale(std / (_Q6_STD * mag), "Q6_K"))
    return out.reshape(-1)


_MXFP4_MS = 2 * (1 + 4 + 9 + 16 + 36 + 64 + 144) / 16   # mean square of kvalues_mxfp4 = 34.25


def _enc_mxfp4(n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    # block_mxfp4: E8M0 e, 16 bytes of nibbles; value = kvalues_mxfp4[nib] * 2**(e-128)
    # (GGML_E8M0_TO_FP32_HALF). Random nibbles are sign-symmetric; e mixes two neighbouring
    # exponents so that the mean square matches std**2.
    t = std * std / _MXFP4_MS
    lo = math.floor(math.log2(t) / 2)
    a = 4.0 ** lo
    p = (t - a) / (3 * a)
    e = lo + 128 + (rng.random(n) < p).astype(np.int64)
    if e.min() < 2 or e.max() > 254:
        raise ValueError(f"MXFP4: std {std} out of the E8M0 range")
    out = np.empty((n, 17), np.uint8)
    out[:, 0] = e
    out[:, 1:] = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    return out.reshape(-1)


_ENCODERS: Mapping[str, Callable[[int, float, np.random.Generator], np.ndarray]] = {
    "Q8_0": _enc_q8_0, "Q4_0": _enc_q4_0, "Q4_K": _enc_q4_k, "Q5_K": _enc_q5_k, "Q6_K": _enc_q6_k,
    "MXFP4": _enc_mxfp4,
}

#: ggml types :func:`encode_blocks` can write
ENCODABLE_TYPES = ("F32", "F16", "BF16", *_ENCODERS)


def encode_blocks(ggml_type: str, n_blocks: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """``n_blocks`` random blocks of a ggml type whose dequantised values have mean 0 and std
    ``std``, as raw bytes.

    Layouts: ``ggml/src/ggml-common.h`` (block structs) and the ``dequantize_row_*`` functions
    of ``ggml/src/ggml-quants.c``. Every block scale is a finite positive float16 (normal,
    >= 2**-14, for std >= ~1e-3); values are symmetric around 0:

    * Q8_0: int8 uniform on ``-Q..Q`` (Q = 127, smaller for tiny std to keep the scale normal);
    * Q4_0: nibbles 1..15 (``nibble - 8`` = -7..7);
    * Q4_K: every sub-block ``sc = 2, m = 15`` and ``dmin = d``: ``d*(2q - 15)``, q uniform 0..15;
    * Q5_K: ``sc = 2, m = 31, dmin = d``: ``d*(2q - 31)``, q uniform 0..31;
    * Q6_K: q in 1..63 (``q - 32`` uniform on -31..31, 0 with twice the weight: random 6 bits
      with 0 mapped to 32), int8 scales ``±M`` with random sign;
    * MXFP4: random nibbles (the sign is bit 3), E8M0 exponent mixing two powers of two;
    * F32/F16/BF16: Gaussian (a "block" is one element).

    Args:
        ggml_type: one of :data:`ENCODABLE_TYPES`.
        n_blocks: blocks (elements for F32/F16/BF16).
        std: target standard deviation of the dequantised values.
        rng: numpy Generator.

    Returns:
        uint8 array of ``n_blocks * type_size`` bytes (:data:`sim.model.quant.GGML_BLOCK`).

    Raises:
        KeyError: a type without an encoder; ValueError: a std no block scale can represent.
    """
    t = ggml_type.upper()
    if t in ("F32", "F16", "BF16"):
        return _enc_float(t, n_blocks, std, rng)
    if t not in _ENCODERS:
        raise KeyError(f"no zero-mean encoder for ggml type '{ggml_type}' (have {', '.join(ENCODABLE_TYPES)})")
    return _ENCODERS[t](n_blocks, std, rng)


def dequantize(ggml_type: str, raw: np.ndarray) -> np.ndarray:
    """Dequantise raw blocks with gguf-py's reference code (``gguf.quants.dequantize``).

    Args:
        raw: uint8 array ``(..., bytes per row)``.

    Returns:
        float32 array ``(..., elements per row)``.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as _deq

    t = ggml_type.upper()
    if t == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(_deq(np.ascontiguousarray(raw), GGMLQuantizationType[t]), dtype=np.float32)


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteResult:
    """What :func:`write_gguf` wrote.

    Attributes:
        path: the GGUF.
        file_bytes: its size.
        tensor_bytes: sum of tensor data bytes (llama-bench's ``model_size``).
        n_tensors: tensors.
        n_layer: blocks written.
        seconds: wall time.
        peak_rss_bytes: the process's peak resident set (``ru_maxrss``) at the end.
    """

    path: Path
    file_bytes: int
    tensor_bytes: int
    n_tensors: int
    n_layer: int
    seconds: float
    peak_rss_bytes: int


def _vocab(n_vocab: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A "llama" (SentencePiece) vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then
    unique pieces. Token types (llama.h ``llama_token_type``): 1 normal, 2 unknown, 3 control,
    6 byte."""
    if n_vocab < 259 + 1:
        raise ValueError("n_vocab must be > 259 (3 specials and 256 byte tokens)")
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    toks += [f"\u2581t{i}" for i in range(n_vocab - len(toks))]
    types = np.ones(n_vocab, np.int32)
    types[0], types[1], types[2] = 2, 3, 3
    types[3:259] = 6
    scores = np.zeros(n_vocab, np.float32)
    scores[259:] = -np.arange(n_vocab - 259, dtype=np.float32)
    return toks, scores, types


def _add_metadata(wr: Any, spec: ModelSpec, arch: str, preset: str, n_layer: int, seed: int,
                  tiny: bool, name: str) -> None:
    kv = _ARCH_KV[arch]
    a = arch
    m = spec.moe
    wr.add_name(name)
    wr.add_uint32("general.file_type", LLAMA_FTYPE[preset])
    wr.add_uint32("general.quantization_version", 2)             # GGML_QNT_VERSION
    wr.add_uint32(f"{a}.block_count", n_layer)
    wr.add_uint32(f"{a}.context_length", kv["context_length"])
    wr.add_uint32(f"{a}.embedding_length", spec.d_model)
    ff = m.n_ff_exp if (arch in ("llama", "gpt-oss") and m is not None) else spec.n_ff
    if ff:
        wr.add_uint32(f"{a}.feed_forward_length", ff)
    wr.add_uint32(f"{a}.attention.head_count", spec.n_head)
    wr.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    wr.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    wr.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    wr.add_float32(f"{a}.attention.layer_norm_rms_epsilon", kv["rms_eps"])
    wr.add_float32(f"{a}.rope.freq_base", kv["rope_freq_base"])
    if arch in ("llama", "qwen3moe"):
        wr.add_uint32(f"{a}.rope.dimension_count", spec.head_dim)
    if arch == "llama":
        wr.add_uint32(f"{a}.vocab_size", spec.n_vocab)
    if "rope_freq_base_swa" in kv:
        wr.add_float32(f"{a}.rope.freq_base_swa", kv["rope_freq_base_swa"])
    if "rope_scaling" in kv:
        typ, factor, orig = kv["rope_scaling"]
        wr.add_string(f"{a}.rope.scaling.type", typ)
        wr.add_float32(f"{a}.rope.scaling.factor", factor)
        if orig:
            wr.add_uint32(f"{a}.rope.scaling.original_context_length", orig)
    if m is not None:
        wr.add_uint32(f"{a}.expert_count", m.n_expert)
        wr.add_uint32(f"{a}.expert_used_count", m.n_expert_used)
        if arch in ("qwen3moe", "gpt-oss"):
            wr.add_uint32(f"{a}.expert_feed_forward_length", m.n_ff_exp)
    if spec.sliding_window and spec.swa_interval:
        wr.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
        wr.add_uint32(f"{a}.attention.sliding_window_pattern", spec.swa_interval)
    toks, scores, types = _vocab(spec.n_vocab)
    wr.add_string("tokenizer.ggml.model", "llama")
    wr.add_array("tokenizer.ggml.tokens", toks)
    wr.add_array("tokenizer.ggml.scores", scores.tolist())
    wr.add_array("tokenizer.ggml.token_type", types.tolist())
    wr.add_uint32("tokenizer.ggml.bos_token_id", 1)
    wr.add_uint32("tokenizer.ggml.eos_token_id", 2)
    wr.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    wr.add_bool("tokenizer.ggml.add_bos_token", True)
    wr.add_bool("tokenizer.ggml.add_eos_token", False)
    wr.add_string("prefetch_sim.model_toml", str(spec.file or ""))
    wr.add_uint64("prefetch_sim.seed", seed)
    wr.add_uint32("prefetch_sim.n_layer_full", spec.n_layer)
    wr.add_bool("prefetch_sim.tiny", tiny)
    wr.add_float32("prefetch_sim.small_std", SMALL_STD)


class _Pools:
    """One pool of valid random blocks per ggml type, std :data:`SMALL_STD`."""

    def __init__(self, seed: int, pool_bytes: int, need: Mapping[str, int]):
        self.seed, self.pool_bytes, self.need = seed, pool_bytes, need
        self.pools: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng([seed, 4])

    def get(self, t: str) -> np.ndarray:
        if t not in self.pools:
            blk, size = GGML_BLOCK[t]
            n = max(1, min(self.pool_bytes, self.need.get(t, self.pool_bytes)) // size)
            rng = np.random.default_rng([self.seed, 1, _GGML_TYPE_ID[t]])
            self.pools[t] = encode_blocks(t, n, SMALL_STD, rng)
        return self.pools[t]


def _write_tensor(fh: Any, t: TensorPlan, idx: int, seed: int, pools: _Pools) -> None:
    blk, size = GGML_BLOCK[t.ggml_type]
    n_blocks = t.n_elements // blk
    if t.fill in ("ones", "zeros"):
        fh.write(np.full(t.n_elements, 1.0 if t.fill == "ones" else 0.0, np.float32).tobytes())
    elif t.fill == "router":
        rng = np.random.default_rng([seed, 3, idx])
        n_in, rows = t.ne[0], t.n_elements // t.ne[0]
        x = rng.standard_normal((rows, n_in), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        if t.ggml_type != "F32":
            raise ValueError(f"{t.name}: routers are written as F32")
        fh.write(x.tobytes())
    elif t.fill == "embd":
        # independent chunks (own seed each, so the bytes do not depend on the thread count),
        # encoded by a few threads (numpy releases the GIL), written in order
        starts = range(0, n_blocks, _CHUNK_BLOCKS)

        def enc(c: int) -> np.ndarray:
            return encode_blocks(t.ggml_type, min(_CHUNK_BLOCKS, n_blocks - starts[c]), 1.0,
                                 np.random.default_rng([seed, 2, idx, c]))
        n_thr = max(1, min(_THREADS, len(starts)))
        if n_thr == 1:
            for c in range(len(starts)):
                fh.write(enc(c).data)
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(n_thr) as ex:
                window = [ex.submit(enc, c) for c in range(min(2 * n_thr, len(starts)))]
                for c in range(len(starts)):
                    fh.write(window[c].result().data)
                    window[c] = None
                    if c + 2 * n_thr < len(starts):
                        window.append(ex.submit(enc, c + 2 * n_thr))
    elif t.fill == "small":
        pool = pools.get(t.ggml_type)
        n_pool = pool.size // size
        step = max(1, n_pool // 2)
        done = 0
        while done < n_blocks:
            c = min(step, n_blocks - done)
            o = int(pools.rng.integers(0, n_pool - c + 1))
            fh.write(pool[o * size:(o + c) * size].data)
            done += c
    else:
        raise ValueError(f"{t.name}: unknown fill '{t.fill}'")


def write_gguf(spec: ModelSpec, out: str | Path, *, n_layer: int | None = None, seed: int = 0,
               tiny: bool = False, pool_bytes: int = POOL_BYTES,
               progress: Callable[[str], None] | None = None) -> WriteResult:
    """Write the synthetic GGUF of ``spec`` to ``out`` (atomically: ``out.tmp``, then renamed).

    Args:
        spec: the model (``arch`` set); :func:`tiny_variant` for a small one.
        out: output path.
        n_layer: write only the first N blocks (``block_count = N``;
            ``prefetch_sim.n_layer_full`` keeps the full count, ``general.name`` says "N of M").
        seed: random seed (``prefetch_sim.seed``); the same seed gives the same bytes.
        tiny: recorded as ``prefetch_sim.tiny``.
        pool_bytes: size of the random-block pool per type.
        progress: called with a short line per stage.

    Returns:
        :class:`WriteResult`.

    Raises:
        ScenarioError: the model cannot be written (arch, preset, n_layer, bits mismatch).
        OSError: the output cannot be written (no partial file is left).
    """
    import gguf

    t0 = time.monotonic()
    arch = _check_arch(spec)
    preset, explicit = model_quant(spec)
    plan = plan_tensors(spec, n_layer=n_layer, preset=preset, explicit=explicit)
    n_write = spec.n_layer if n_layer is None else n_layer
    name = spec.name if n_write == spec.n_layer else f"{spec.name} [{n_write} of {spec.n_layer} layers]"
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)   # as prefetch-sim run --out: missing folders are made
    say = progress or (lambda s: None)
    wr = gguf.GGUFWriter(tmp, arch)
    try:
        _add_metadata(wr, spec, arch, preset, n_write, seed, tiny, name)
        for t in plan:
            wr.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), t.nbytes,
                               raw_dtype=gguf.GGMLQuantizationType[t.ggml_type])
        wr.write_header_to_file()
        wr.write_kv_data_to_file()
        wr.write_ti_data_to_file()
        fh = wr.fout[0]
        align = wr.data_alignment
        need: dict[str, int] = {}
        for t in plan:
            if t.fill == "small":
                need[t.ggml_type] = max(need.get(t.ggml_type, 0), t.nbytes)
        pools = _Pools(seed, pool_bytes, need)
        say(f"{len(plan)} tensors, {sum(t.nbytes for t in plan) / 2**30:.2f} GiB of tensor data")
        for idx, t in enumerate(plan):
            wr.tensors[0].pop(t.name)
            fh.write(b"\0" * (-fh.tell() % align))
            start = fh.tell()
            _write_tensor(fh, t, idx, seed, pools)
            if fh.tell() - start != t.nbytes:
                raise RuntimeError(f"{t.name}: wrote {fh.tell() - start} bytes, expected {t.nbytes}")
            fh.write(b"\0" * (-t.nbytes % align))
            if t.layer >= 0 and t.name.endswith("attn_norm.weight"):
                say(f"block {t.layer}")
        wr.close()
        os.replace(tmp, out)
    except BaseException:
        wr.close()
        tmp.unlink(missing_ok=True)
        raise
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return WriteResult(out, out.stat().st_size, sum(t.nbytes for t in plan), len(plan), n_write,
                       time.monotonic() - t0, rss)


# --------------------------------------------------------------------------------------
# Reading back (the header reader is sim.model.gguf.read_gguf_index) and the routing proof
# --------------------------------------------------------------------------------------


def predicted_router_ids(gguf_path: str | Path, tokens: Sequence[int] | np.ndarray,
                         layers: Sequence[int] | None = None) -> dict[int, np.ndarray]:
    """Top-k expert ids each token gets in the given MoE layers, assuming the residual stream
    is still the token embedding (what the small non-embedding weights are for).

    Checked against llama.cpp itself (CPU build, ``ffn_moe_topk`` read through the eval
    callback): the top-k sets agree for >= 99.8% of (token, expert) pairs on the tiny models
    and 97-99.5% on the full 48-layer qwen3moe file. Note that llama.cpp's qwen3moe, llama
    and gemma3 graphs run the *last* block's FFN only on the output rows (``inp_out_ids``:
    one token per ubatch in llama-bench); gpt-oss runs it on all tokens.

    Per token: dequantise its ``token_embd`` row, RMS-norm it (``layer_norm_rms_epsilon``,
    times the router's input norm weight: ``ffn_norm``, gpt-oss ``post_attention_norm``),
    logits = ``ffn_gate_inp`` x (+ bias for gpt-oss), top-k by logit (softmax is monotonic).

    Args:
        gguf_path: a GGUF written by :func:`write_gguf`.
        tokens: token ids, shape (T,).
        layers: block indices (default: the first and the last block).

    Returns:
        layer -> int array (T, k) of expert ids, best first.

    Raises:
        ValueError: the file has no experts.
    """
    idx = read_gguf_index(gguf_path)
    arch = idx.kv["general.architecture"]
    k = int(idx.kv.get(f"{arch}.expert_used_count", 0))
    if not k or arch not in _ROUTER_NORM:
        raise ValueError(f"{gguf_path}: not a MoE model (arch {arch})")
    n_layer = int(idx.kv[f"{arch}.block_count"])
    eps = float(idx.kv[f"{arch}.attention.layer_norm_rms_epsilon"])
    tokens = np.asarray(tokens, dtype=np.int64)
    emb_t = idx.tensors["token_embd.weight"][1]
    rows = np.asarray(idx.array("token_embd.weight")[tokens])
    x = rows.astype(np.float32) if emb_t == "F32" else dequantize(emb_t, rows)
    x = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + eps)
    out: dict[int, np.ndarray] = {}
    for layer in (layers if layers is not None else sorted({0, n_layer - 1})):
        b = f"blk.{layer}."
        w_norm = np.asarray(idx.array(b + _ROUTER_NORM[arch] + ".weight")).reshape(-1)
        r = np.asarray(idx.array(b + "ffn_gate_inp.weight"), dtype=np.float64)
        logits = (x * w_norm) @ r.T
        if b + "ffn_gate_inp.bias" in idx.tensors:
            logits = logits + np.asarray(idx.array(b + "ffn_gate_inp.bias")).reshape(-1)
        out[layer] = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return out


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m calibrate.llamacpp.gguf_writer``; returns the exit status (2 on errors,
    reported as one line on stderr; 130 / 143 on Ctrl-C / SIGTERM, the partial ``OUT.tmp``
    removed)."""
    from sim.cli.interrupt import run_interruptible

    return run_interruptible("gguf_writer", _main, argv)


def _main(argv: Sequence[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.llamacpp.gguf_writer",
                                 description="Write a synthetic GGUF (real names, shapes, types; random "
                                             "zero-mean weights, diverse routing) for a model TOML.")
    ap.add_argument("--model", required=True, help="model TOML with [model] arch: a path, or a built-in name "
                    "(qwen3-30b-a3b, gpt-oss-20b, gemma3-27b, mixtral-8x7b)")
    ap.add_argument("--out", required=True, help="output .gguf (written to OUT.tmp, then renamed; missing folders are made)")
    ap.add_argument("--n-layer", type=int, default=None, help="write only the first N blocks")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--tiny", action="store_true", help="a small variant of the same arch (CI, local checks)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    prog = "gguf_writer"
    try:
        if args.seed < 0:
            raise ScenarioError(f"--seed must be >= 0, got {args.seed}")
        from sim.atomic import check_output_path
        from sim.cli.benchflags import model_path

        check_output_path(args.out, "--out")  # before tens of GB are generated
        spec = load_model(model_path(args.model))
        if args.tiny:
            spec = tiny_variant(spec)
        say = None if args.quiet else (lambda s: print(f"{prog}: {s}", flush=True))
        res = write_gguf(spec, args.out, n_layer=args.n_layer, seed=args.seed, tiny=args.tiny, progress=say)
    except PrefetchSimError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: error: cannot write '{exc.filename or args.out}': {exc.strerror or exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(f"{prog}: wrote {res.path} ({res.file_bytes} bytes, tensors {res.tensor_bytes / 2**30:.2f} GiB, "
          f"{res.n_tensors} tensors, {res.n_layer} blocks) in {res.seconds:.1f} s, "
          f"peak RSS {res.peak_rss_bytes / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
