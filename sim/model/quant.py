"""Bits per weight of ggml tensor types and llama.cpp file-type presets.

Bits per weight are exact block sizes from ggml's type traits (``ggml/src/ggml.c``,
``type_traits``: bytes per block / elements per block * 8), e.g. Q4_K is 144 bytes per
256 weights = 4.5 bpw; MXFP4 is 17 bytes per 32 weights = 4.25 bpw.
"""

from __future__ import annotations

from collections.abc import Mapping

from sim.wording import plural

#: bits per weight of each ggml tensor type (bytes per block * 8 / block size).
GGML_TYPE_BPW: dict[str, float] = {
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
#: ``norm`` holds the norm vectors (``*_norm.weight``), ``bias`` the biases (``*.bias``) and
#: attention sinks; both stay F32 in llama.cpp and read no op of the plan.
TENSOR_GROUPS = (
    "embd", "output", "norm", "attn_q", "attn_k", "attn_v", "attn_output",
    "ffn_gate", "ffn_up", "ffn_down", "router",
    "exps_gate", "exps_up", "exps_down", "shexp", "bias",
)

#: groups of tensors that are no matrix of a plan op (they count in the model's bytes,
#: parameters and VRAM only). ``other``: a GGUF tensor :mod:`sim.model.gguf` gives no role.
AUX_GROUPS = ("norm", "bias", "other")

#: llama.cpp file-type presets, simplified to one ggml type per tensor group (a model TOML's
#: ``group_types``). The mixes follow ``llama_tensor_get_type`` in ``src/llama-quant.cpp``: *_M
#: presets keep attn_v and ffn_down one step up (llama.cpp does that on a subset of layers).
#: The bytes of a model's tensors do not come from here but from the per-tensor rule,
#: :func:`tensor_ggml_type` (see :attr:`sim.model.specs.ModelSpec.tensors`).
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
    types["bias"] = "F32"
    types.update(PRESETS[key])
    return types


# --------------------------------------------------------------------------------------
# Per-tensor ggml types as llama.cpp's quantizer chooses them
# --------------------------------------------------------------------------------------

#: ggml block geometry per type: (elements per block, bytes per block), from ggml's
#: ``type_traits`` (``ggml/src/ggml.c``) and the block structs of ``ggml/src/ggml-common.h``;
#: every type gguf-py 0.19 knows (``gguf.GGML_QUANT_SIZES``, checked in the tests).
GGML_BLOCK: Mapping[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "F64": (1, 8),
    "I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8),
    "Q8_0": (32, 34), "Q8_1": (32, 40), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22),
    "Q5_1": (32, 24), "Q1_0": (128, 18),
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "Q8_K": (256, 292), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74),
    "IQ2_S": (256, 82), "IQ3_XXS": (256, 98), "IQ3_S": (256, 110), "IQ1_S": (256, 50),
    "IQ1_M": (256, 56), "IQ4_NL": (32, 18), "IQ4_XS": (256, 136), "TQ1_0": (256, 54),
    "TQ2_0": (256, 66), "MXFP4": (32, 17), "NVFP4": (64, 36),
}

for _t, (_blk, _size) in GGML_BLOCK.items():   # every type has its bits per weight
    GGML_TYPE_BPW.setdefault(_t, _size * 8 / _blk)  # type: ignore[attr-defined]
del _t, _blk, _size

#: ``llama_ftype`` enum values (``include/llama.h``) of the presets, written as
#: ``general.file_type``. ``"MXFP4"`` is ``LLAMA_FTYPE_MOSTLY_MXFP4_MOE`` (gpt-oss GGUFs).
LLAMA_FTYPE: Mapping[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
    "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
    "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32, "MXFP4": 38,
}

#: the presets :func:`tensor_ggml_type` implements, with their default ggml type
#: (``llama_ftype_get_default_type`` in ``src/llama-quant.cpp``; MXFP4_MOE has none there:
#: its rule gives every tensor a type itself).
RULE_PRESETS: Mapping[str, str] = {
    "F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K",
    "Q5_K_M": "Q5_K", "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "MXFP4": "Q8_0",
}

# tensor_type_fallback() in src/llama-quant.cpp: a type whose block does not divide ne[0]
_FALLBACK = {
    "IQ2_XXS": "IQ4_NL", "IQ2_XS": "IQ4_NL", "IQ3_XXS": "IQ4_NL", "IQ4_XS": "IQ4_NL",
    "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0",
}

_UNQUANTISED_GROUPS = ("norm", "router", "bias")


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's ``use_more_bits`` (``src/llama-quant.cpp``): the first and last ``n/8``
    layers and every third layer in between (``(i - n/8) % 3 == 2``), integer division.

    E.g. 24 of 48 layers, 30 of 62, 16 of 32.
    """
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def ggml_nbytes(ggml_type: str, n_elements: int) -> int:
    """Bytes of ``n_elements`` values of a ggml type (``ggml_row_size``).

    Raises:
        KeyError: unknown type.
        ValueError: ``n_elements`` is not a whole number of blocks.
    """
    blk, size = GGML_BLOCK[ggml_type.upper()]
    if n_elements % blk:
        raise ValueError(f"{plural(n_elements, 'element')} {'is' if n_elements == 1 else 'are'} not a whole number "
                         f"of {ggml_type} blocks of {blk}")
    return n_elements // blk * size


def tensor_ggml_type(preset: str, group: str, layer: int = -1, n_layer: int = 1, *,
                     n_expert: int = 0, n_gqa: int = 1, tied_embeddings: bool = False,
                     n_in: int | None = None, role: str | None = None,
                     explicit: str | float | None = None) -> str:
    """The ggml type llama.cpp's quantizer gives one weight tensor.

    A re-implementation of ``llama_tensor_get_type`` / ``llama_tensor_get_type_impl`` and
    ``tensor_type_fallback`` in ``src/llama-quant.cpp`` (llama.cpp, vendored in the
    llama-cpp-python 0.3.36 sdist) for the presets in :data:`RULE_PRESETS`, without an
    importance matrix and without ``--pure`` / ``--tensor-type`` overrides:

    * norms (``group="norm"``), biases and attention sinks (``"bias"``) and the router
      (``"router"``, ``ffn_gate_inp``) stay F32;
    * ``output`` (and ``embd`` with tied embeddings): Q6_K for the K/IQ4 presets, Q8_0 for
      Q8_0 and MXFP4_MOE, unchanged for F16/BF16;
    * ``embd``: the preset's default type (Q8_0 for MXFP4_MOE);
    * ``attn_v``: Q4_K_M/Q5_K_M -> Q6_K on :func:`use_more_bits` layers; IQ4_NL/IQ4_XS ->
      Q5_K when ``n_gqa >= 4``; Q4_K_S -> Q5_K on layers < 4; an 8-expert model -> Q8_0;
    * ``attn_k``: an 8-expert model -> Q8_0;
    * ``attn_output``: an 8-expert model -> Q5_K for Q4_K_S/Q4_K_M/IQ4_NL/IQ4_XS;
    * ``ffn_down`` / ``exps_down`` (and the down part of ``shexp``): Q4_K_M/Q5_K_M -> Q6_K on
      :func:`use_more_bits` layers; Q4_K_S/IQ4_NL/IQ4_XS -> Q5_K on layers < n/8;
    * MXFP4_MOE: expert tensors (3-D) MXFP4, every other matrix Q8_0;
    * a type whose block size does not divide ``n_in`` (ggml ``ne[0]``) falls back
      (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, ...; F16 if that does not fit either).

    The layer counters of llama.cpp (``i_attention_wv``, ``i_ffn_down``) equal the block index
    for models with one such tensor per block, which is what ``layer`` is. Not modelled: the
    Falcon-specific branches and the ``LLM_TYPE_70B`` attn_v bump (Q4_K -> Q5_K on 70B llamas).

    Args:
        preset: a key of :data:`RULE_PRESETS` (``"Q4_K_M"``).
        group: a tensor group of :data:`TENSOR_GROUPS`.
        layer: block index (-1 for ``token_embd``/``output``).
        n_layer: blocks of the *full* model (the rule depends on it).
        n_expert: routed experts (``hparams.n_expert``; 8 triggers the Mixtral bumps).
        n_gqa: ``n_head / n_head_kv``.
        tied_embeddings: the file has no ``output.weight`` (token_embd is also the output).
        n_in: ``ne[0]`` of the tensor, for the block-size fallback (None = no check).
        role: for ``group="shexp"``, ``"gate"``, ``"up"`` or ``"down"``.
        explicit: the model TOML's value for the group: a type name wins outright; a number
            (the mean bits of a mixed group) or None leaves the choice to the rule.

    Returns:
        the ggml type name (``"Q6_K"``).

    Raises:
        KeyError: unknown preset, group or explicit type name.
    """
    if isinstance(explicit, str):
        name = explicit.upper()
        if name not in GGML_TYPE_BPW:
            raise KeyError(f"unknown ggml type '{explicit}'")
        return name
    key = preset.upper()
    if key not in RULE_PRESETS:
        raise KeyError(f"no llama.cpp type rule for preset '{preset}' (known: {', '.join(RULE_PRESETS)})")
    if group not in TENSOR_GROUPS:
        raise KeyError(f"unknown tensor group '{group}'")
    if group in _UNQUANTISED_GROUPS:
        return "F32"
    default = RULE_PRESETS[key]
    if default in ("F16", "BF16", "F32"):
        return default                       # ggml_is_quantized(default_type) is false
    cat = group
    if group == "shexp":
        cat = {"gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}.get(role or "", "ffn_up")
    elif group.startswith("exps_"):
        cat = "ffn_" + group[5:]
    t = default
    k_m = key in ("Q4_K_M", "Q5_K_M")
    if cat == "output" or (tied_embeddings and cat == "embd"):
        t = "Q8_0" if key in ("MXFP4", "Q8_0") else "Q6_K"
        if n_in is not None and key != "MXFP4" and n_in % GGML_BLOCK[default][0]:
            t = "Q8_0"
    elif key == "MXFP4":
        t = "MXFP4" if group.startswith("exps_") else "Q8_0"
    elif cat == "embd":
        t = default
    elif cat == "attn_v":
        if key in ("IQ4_NL", "IQ4_XS") and n_gqa >= 4:
            t = "Q5_K"
        elif k_m and use_more_bits(layer, n_layer):
            t = "Q6_K"
        elif key == "Q4_K_S" and layer < 4:
            t = "Q5_K"
        if n_expert == 8:
            t = "Q8_0"
    elif cat == "attn_k":
        if n_expert == 8:
            t = "Q8_0"
    elif cat == "ffn_down":
        if k_m and use_more_bits(layer, n_layer):
            t = "Q6_K"
        elif key in ("IQ4_NL", "IQ4_XS", "Q4_K_S") and layer < n_layer // 8:
            t = "Q5_K"
    elif cat == "attn_output":
        if n_expert == 8 and key in ("Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS"):
            t = "Q5_K"
    if n_in is not None and n_in % GGML_BLOCK[t][0]:
        fb = _FALLBACK.get(t, t)
        t = fb if n_in % GGML_BLOCK[fb][0] == 0 else "F16"
    return t
