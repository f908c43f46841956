"""Bits per weight of ggml tensor types and llama.cpp file-type presets.

Bits per weight are exact block sizes from ggml's type traits (``ggml/src/ggml.c``,
``type_traits``: bytes per block / elements per block * 8), e.g. Q4_K is 144 bytes per
256 weights = 4.5 bpw; MXFP4 is 17 bytes per 32 weights = 4.25 bpw.
"""

from __future__ import annotations

from collections.abc import Mapping

#: bits per weight of each ggml tensor type (bytes per block * 8 / block size).
GGML_TYPE_BPW: Mapping[str, float] = {
    "F32": 32.0,
    "F16": 16.0,
    "BF16": 16.0,
    "Q8_0": 34 * 8 / 32,
    "Q4_0": 18 * 8 / 32,
    "Q4_1": 20 * 8 / 32,
    "Q5_0": 22 * 8 / 32,
    "Q5_1": 24 * 8 / 32,
    "Q2_K": 84 * 8 / 256,
    "Q3_K": 110 * 8 / 256,
    "Q4_K": 144 * 8 / 256,
    "Q5_K": 176 * 8 / 256,
    "Q6_K": 210 * 8 / 256,
    "Q8_K": 292 * 8 / 256,
    "IQ2_XXS": 66 * 8 / 256,
    "IQ2_XS": 74 * 8 / 256,
    "IQ3_XXS": 98 * 8 / 256,
    "IQ4_NL": 18 * 8 / 32,
    "IQ4_XS": 136 * 8 / 256,
    "MXFP4": 17 * 8 / 32,
}

#: tensor groups a model's weights are divided into (used for quant types and placement).
TENSOR_GROUPS = (
    "embd", "output", "norm", "attn_q", "attn_k", "attn_v", "attn_output",
    "ffn_gate", "ffn_up", "ffn_down", "router",
    "exps_gate", "exps_up", "exps_down", "shexp",
)

#: llama.cpp file-type presets, simplified to one ggml type per tensor group. The mixes
#: follow ``llama_tensor_get_type`` in ``src/llama-quant.cpp``: *_M presets keep attn_v and
#: ffn_down one step up (llama.cpp does that on a subset of layers; the simplification
#: over-counts those bytes by at most ~3% of the model).
PRESETS: Mapping[str, Mapping[str, str]] = {
    "F16": {},
    "BF16": {},
    "Q8_0": {},
    "Q4_K_M": {"attn_v": "Q6_K", "ffn_down": "Q6_K", "exps_down": "Q6_K", "output": "Q6_K"},
    "Q5_K_M": {"attn_v": "Q6_K", "ffn_down": "Q6_K", "exps_down": "Q6_K", "output": "Q6_K"},
    "Q4_K_S": {"output": "Q6_K"},
    "IQ4_NL": {"output": "Q6_K"},
    "IQ4_XS": {"output": "Q6_K"},
    "MXFP4": {"exps_gate": "MXFP4", "exps_up": "MXFP4", "exps_down": "MXFP4"},
}

_PRESET_BASE = {
    "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K",
    "Q4_K_S": "Q4_K", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS",
    # gpt-oss GGUFs: experts MXFP4, everything else kept in BF16 (ggml-org/gpt-oss-20b-GGUF)
    "MXFP4": "BF16",
}


def bpw_of(type_or_bits: str | float | int) -> float:
    """Bits per weight of a ggml type name (``"Q4_K"``) or a plain number (``4.5``).

    Raises:
        KeyError: unknown type name.
        ValueError: a number that is not in (0, 64].
    """
    if isinstance(type_or_bits, (int, float)) and not isinstance(type_or_bits, bool):
        bits = float(type_or_bits)
        if not 0 < bits <= 64:
            raise ValueError(f"bits per weight must be in (0, 64], got {bits}")
        return bits
    name = str(type_or_bits).upper()
    if name not in GGML_TYPE_BPW:
        raise KeyError(f"unknown ggml type '{type_or_bits}' (known: {', '.join(GGML_TYPE_BPW)})")
    return GGML_TYPE_BPW[name]


def preset_group_types(preset: str) -> dict[str, str]:
    """ggml type per tensor group for a llama.cpp file-type preset (``"Q4_K_M"``...).

    Norms and the router stay F32 as llama.cpp keeps them.

    Raises:
        KeyError: unknown preset.
    """
    key = preset.upper()
    if key not in PRESETS:
        raise KeyError(f"unknown quantisation preset '{preset}' (known: {', '.join(PRESETS)})")
    base = _PRESET_BASE[key]
    types = {g: base for g in TENSOR_GROUPS}
    types["norm"] = "F32"
    types["router"] = "F32"
    types.update(PRESETS[key])
    return types
