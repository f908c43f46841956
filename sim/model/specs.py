"""Frozen specifications of a what-if scenario: model, hardware, placement, workload, variant.

All loaded from TOML under ``scenarios/`` through :mod:`sim.tomlio`, which names the file and
the field on any bad value. Units are SI and carried in names (``vram_bytes``,
``h2d_bytes_per_s``, ``host_sync_s``).
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Mapping

from sim.errors import ScenarioError
from sim.model.quant import (AUX_GROUPS, GGML_BLOCK, GGML_TYPE_BPW, RULE_PRESETS, TENSOR_GROUPS, bpw_of,
                    preset_group_types, tensor_ggml_type)
from sim.tomlio import Fields, load_toml
from sim.units import GB
from sim.wording import plural

#: the ``arch`` values a model TOML takes: the llama.cpp architectures whose tensors
#: :func:`_layout` lays out as llama.cpp's loader does (norms, biases, sinks); a TOML without
#: ``arch`` is a generic llama-shaped model (matrices only). A GGUF's archs are
#: :data:`sim.model.gguf.MODELLED_ARCHS` (its tensors come from the file).
TOML_ARCHS: tuple[str, ...] = ("gemma3", "gpt-oss", "llama", "qwen3moe")
#: of :data:`TOML_ARCHS`, those whose every model has experts (``llama`` may have them or not)
MOE_ARCHS: tuple[str, ...] = ("gpt-oss", "qwen3moe")

# --------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One tensor of the model, named as in GGUF (``blk.7.ffn_up_exps.weight``).

    Attributes:
        name: GGUF tensor name. A tied output head (no ``output.weight`` in the file) is
            ``token_embd.weight`` again, with ``group="output"`` and ``duplicate=True``.
        layer: block index, or -1 for ``token_embd``/``output``/``output_norm``.
        group: tensor group (see :data:`sim.model.quant.TENSOR_GROUPS`; ``"other"`` for a GGUF
            tensor whose role the simulator does not model). Groups in
            :data:`sim.model.quant.AUX_GROUPS` (norms, biases) are read by no op of the plan.
        n_in: input features (ggml ``ne[0]``).
        n_out: output features (ggml ``ne[1]``; 1 for a vector).
        n_mat: number of matrices (``ne[2]`` (x ``ne[3]``): experts for ``*_exps``, else 1).
        bpw: bits per weight (of ``ggml_type`` when it is set).
        ggml_type: ggml type name (``"Q4_K"``); ``""`` for a tensor known only by its mean bits
            per weight (a model TOML's number that no llama.cpp rule reproduces), whose bytes
            are then rounded from ``bpw``.
        duplicate: the tensor is a second use of another one's data (llama.cpp's
            ``TENSOR_DUPLICATED``: a tied output head). It takes VRAM where it is placed but
            does not count in the model's size and parameters.
    """

    name: str
    layer: int
    group: str
    n_in: int
    n_out: int
    n_mat: int
    bpw: float
    ggml_type: str = ""
    duplicate: bool = False

    @property
    def n_params(self) -> int:
        return self.n_in * self.n_out * self.n_mat

    @property
    def ne(self) -> tuple[int, ...]:
        """ggml dimensions, innermost first: ``(n_in, n_out, n_mat)`` without trailing ones
        (expert tensors keep three)."""
        ne = (self.n_in, self.n_out, self.n_mat)
        keep = 3 if self.is_expert else 1 + (self.n_out != 1 or self.n_mat != 1) + (self.n_mat != 1)
        return ne[:keep]

    @cached_property
    def bytes_per_mat(self) -> int:
        """Bytes of one matrix (one expert for ``*_exps``): ggml's row size
        (``ne[0] / block`` blocks of the type's block bytes, :data:`sim.model.quant.GGML_BLOCK`) times
        ``n_out`` rows; rounded from ``bpw`` without a type (or a type whose block does not
        divide ``n_in``)."""
        if self.ggml_type:
            blk, size = GGML_BLOCK.get(self.ggml_type, (0, 0))
            if blk and self.n_in % blk == 0:
                return self.n_in // blk * size * self.n_out
        return int(round(self.n_in * self.n_out * self.bpw / 8))

    @cached_property
    def nbytes(self) -> int:
        """Bytes of the whole tensor (all experts): exact ``ggml_nbytes`` with a type."""
        if self.ggml_type:
            blk, _size = GGML_BLOCK.get(self.ggml_type, (0, 0))
            if blk and self.n_in % blk == 0:
                return self.bytes_per_mat * self.n_mat
        return int(round(self.n_params * self.bpw / 8))

    @property
    def is_expert(self) -> bool:
        return self.group.startswith("exps_")

    @property
    def is_matrix(self) -> bool:
        """A weight some op of the plan reads (not a norm, bias or unmodelled tensor)."""
        return self.group not in AUX_GROUPS


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts part of a model.

    Attributes:
        n_expert: routed experts per layer (``n_expert``).
        n_expert_used: experts per token (top-k, ``n_expert_used``).
        n_ff_exp: hidden size of one expert (``expert_feed_forward_length``).
        n_expert_shared: shared experts (always active, held with the dense weights).
        n_ff_shexp: hidden size of the shared expert(s) together.
        n_layer_dense_lead: leading layers with a dense FFN instead of experts.
        fused_gate_up: one ``ffn_gate_up_exps`` tensor instead of gate and up.
    """

    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_expert_shared: int = 0
    n_ff_shexp: int = 0
    n_layer_dense_lead: int = 0
    fused_gate_up: bool = False


#: llama.cpp architectures whose last block runs its FFN on every token of the ubatch, the
#: output rows selected only before the output head (``src/models/openai-moe.cpp``, pinned
#: tree: ``ggml_get_rows(cur, inp_out_ids)`` after the layer loop unless
#: ``embeddings_nextn_masked``); every other shipped architecture selects them before the last
#: block's FFN (:attr:`ModelSpec.output_rows_layer`)
FULL_LAST_BLOCK_ARCHS = frozenset({"gpt-oss"})


@dataclass(frozen=True)
class ModelSpec:
    """A transformer as llama.cpp sees it.

    Attributes:
        name: display name (llama-bench's ``model`` column).
        n_layer: blocks.
        d_model: embedding size (``n_embd``).
        n_head, n_head_kv, head_dim: attention geometry.
        n_vocab: vocabulary size.
        n_ff: dense FFN hidden size (dense layers and leading dense layers of MoE models).
        attn_kind: ``"full"`` (softmax attention, cost grows with KV depth) or ``"hybrid"``
            (linear attention, cost independent of depth, with one full-attention layer every
            ``full_attn_interval`` layers; ``"linear"`` is hybrid with no full layer).
        full_attn_interval: see ``attn_kind``.
        sliding_window: tokens of the sliding window on SWA layers (0 = none).
        swa_interval: every ``swa_interval``-th layer is full, the others sliding (0 = none).
        linear_state_dim: per-head recurrent state size of linear-attention layers.
        n_ctx_train: tokens of the context the model was trained for (GGUF
            ``<arch>.context_length``, the TOML's ``n_ctx_train``; 0 = not known). llama.cpp runs
            a longer context with a warning; ``prefetch-sim run`` notes it.
        moe: the MoE part, or None for a dense model.
        group_types: ggml type (or mean bits per weight) per tensor group: the TOML's preset
            and ``[quant]`` entries (a GGUF: each group's type, or its mean bits when its
            tensors differ). Per-tensor types are in :attr:`tensors`.
        kv_bytes_per_elem: bytes per K/V element in the KV cache (2 = F16, the default).
        source: where the architecture numbers come from.
        file: the TOML or GGUF file it was read from.
        arch: llama.cpp architecture name (``general.architecture``: ``"qwen3moe"``,
            ``"llama"``, ``"gemma3"``, ``"gpt-oss"``); ``""`` = not given. It decides which
            norms, biases and sinks a TOML model's :attr:`tensors` hold (those llama.cpp's
            loader for the arch creates; ``""``: none) and the synthetic GGUF writer
            (:mod:`calibrate.llamacpp.gguf_writer`) reads it.
        quant_preset: the TOML's ``[quant] preset`` (``"Q4_K_M"``); with one of
            :data:`sim.model.quant.RULE_PRESETS` every tensor gets the type llama.cpp's quantizer
            gives it (:func:`sim.model.quant.tensor_ggml_type`); ``""``: each tensor takes its group's
            ``group_types`` entry.
        quant_explicit: the TOML's other ``[quant]`` entries: a type name fixes its group's
            type; a number (a mixed group's mean bits) leaves the choice to the rule when the
            rule gives that mean over the model, else the group keeps the number (tensors
            without a ggml type, bytes rounded).
        quant_n_layer: block count the type rule sees (``use_more_bits``); 0 = ``n_layer``. A
            model cut to its first blocks keeps the full model's (their bytes stay those of the
            full file's first blocks).
        tied_embeddings: no separate output matrix (``output.weight``): the output head is
            ``token_embd.weight`` duplicated on the output layer's device (gemma3).
        tensor_table: the tensors as a GGUF lists them (:mod:`sim.model.gguf`); empty for a TOML
            model, whose tensors are derived from the geometry, ``arch`` and the quant fields.
    """

    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ff: int
    attn_kind: str = "full"
    full_attn_interval: int = 1
    sliding_window: int = 0
    swa_interval: int = 0
    linear_state_dim: int = 128
    moe: MoESpec | None = None
    group_types: Mapping[str, str | float] = field(default_factory=dict)
    kv_bytes_per_elem: float = 2.0
    source: str = ""
    file: str | None = None
    arch: str = ""
    quant_preset: str = ""
    quant_explicit: Mapping[str, str | float] = field(default_factory=dict)
    quant_n_layer: int = 0
    tied_embeddings: bool = False
    tensor_table: tuple[Tensor, ...] = ()
    n_ctx_train: int = 0

    def past_trained_context(self, tokens: int, what: str = "") -> str | None:
        """The note ``run`` and ``crossover`` print when a context of ``tokens`` (``what``: how it
        is made, e.g. ``" (-p + -n + -d)"``) is past :attr:`n_ctx_train`, else None (also when
        the trained context is not known)."""
        if not self.n_ctx_train or tokens <= self.n_ctx_train:
            return None
        return (f"{self.name}: a context of {tokens:,} tokens{what} is past its trained context of "
                f"{self.n_ctx_train:,} (n_ctx_train): llama.cpp runs it with a warning; the speed is simulated "
                "alike (the output's quality is not)")

    # -- structure --------------------------------------------------------------------
    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.n_layer_dense_lead

    def is_full_attn_layer(self, layer: int) -> bool:
        if self.attn_kind == "full":
            return True
        if self.attn_kind == "linear":
            return False
        return (layer + 1) % self.full_attn_interval == 0

    def attn_window(self, layer: int) -> int:
        """KV tokens a full-attention layer attends to at most (0 = unlimited)."""
        if self.sliding_window and self.swa_interval and (layer + 1) % self.swa_interval != 0:
            return self.sliding_window
        return 0

    def bpw(self, group: str) -> float:
        return bpw_of(self.group_types.get(group, "F16"))

    @cached_property
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor in GGUF order, with its ggml type and exact bytes.

        A GGUF model's are the file's (:attr:`tensor_table`, blocks ``< n_layer``). A TOML
        model's follow llama.cpp's loader for ``arch`` (``load_arch_tensors`` in
        ``src/models/<arch>.cpp``: ``qwen3moe``, ``llama``, ``gemma3``, ``gpt-oss``), the same
        list and order the synthetic GGUF writer writes; with ``arch = ""`` only the matrices
        (no norms)."""
        if self.tensor_table:
            return tuple(t for t in self.tensor_table if t.layer < self.n_layer)
        return _derive_tensors(self)

    @property
    def output_rows_layer(self) -> int:
        """The block whose FFN llama.cpp runs on the graph's output rows only, or -1.

        llama.cpp's model graphs select the output rows (``ggml_get_rows`` with ``inp_out_ids``,
        ``llm_graph_context::build_inp_out_ids``) after the last block's attention, so its FFN
        (router and experts, or the dense FFN) and the output head see only the ubatch's output
        tokens: one in the ubatch that ends a llama-bench ``llama_decode`` call, none in the others
        (``llama_context::decode``: ``n_outputs`` per ubatch). ``src/models/qwen3moe.cpp``,
        ``llama.cpp``, ``gemma3.cpp``, ``laguna.cpp`` and most other architectures do so;
        ``openai-moe.cpp`` (gpt-oss) selects them only after its last block (the head alone),
        :data:`FULL_LAST_BLOCK_ARCHS`. An architecture the simulator does not know (``arch = ""``)
        is taken to do as most do."""
        return -1 if self.arch in FULL_LAST_BLOCK_ARCHS else self.n_layer - 1

    @cached_property
    def output_tensor(self) -> Tensor:
        """The output head (``output.weight``, or the duplicated ``token_embd.weight``)."""
        return next(t for t in self.tensors if t.group == "output")

    @cached_property
    def n_params(self) -> int:
        """Elements of every tensor, each counted once (llama-bench's ``model_n_params``)."""
        return sum(t.n_params for t in self.tensors if not t.duplicate)

    @cached_property
    def nbytes(self) -> int:
        """Bytes of every tensor, each counted once (llama-bench's ``model_size``)."""
        return sum(t.nbytes for t in self.tensors if not t.duplicate)

    def kv_bytes_per_token(self, layer: int) -> float:
        """K and V bytes one token adds to one layer's cache (0 for linear-attention layers)."""
        if not self.is_full_attn_layer(layer):
            return 0.0
        return 2 * self.n_head_kv * self.head_dim * self.kv_bytes_per_elem

    def size_label(self) -> str:
        """llama-bench's ``size`` column: ``12.34 GiB`` (``MiB`` below 1 GiB, as llama-bench)."""
        if self.nbytes < 2**30:
            return f"{self.nbytes / 2**20:.2f} MiB"
        return f"{self.nbytes / 2**30:.2f} GiB"

    def params_label(self) -> str:
        """llama-bench's ``params`` column: ``20.91 B`` (``M`` below 10^9, as llama-bench)."""
        if self.n_params < 1e9:
            return f"{self.n_params / 1e6:.2f} M"
        return f"{self.n_params / 1e9:.2f} B"


def _layout(spec: ModelSpec, n_layer: int, ty) -> list[Tensor]:
    """The tensors of ``spec``'s first ``n_layer`` blocks in GGUF order (llama.cpp's
    ``load_arch_tensors`` of ``spec.arch``); ``ty(group, layer, n_in, role)`` gives
    ``(ggml type, bits)``."""
    arch = spec.arch
    known = arch in TOML_ARCHS
    d, hd, m = spec.d_model, spec.head_dim, spec.moe
    nq, nkv = spec.n_head * hd, spec.n_head_kv * hd
    out: list[Tensor] = []

    def w(name: str, layer: int, group: str, n_in: int, n_out: int = 1, n_mat: int = 1,
          role: str | None = None) -> None:
        t, bits = ty(group, layer, n_in, role)
        out.append(Tensor(name, layer, group, n_in, n_out, n_mat, bits, ggml_type=t))

    def f32(name: str, layer: int, group: str, n_in: int, n_out: int = 1) -> None:
        out.append(Tensor(name, layer, group, n_in, n_out, 1, 32.0, ggml_type="F32"))

    w("token_embd.weight", -1, "embd", d, spec.n_vocab)
    for i in range(n_layer):
        b = f"blk.{i}."
        if known:
            f32(b + "attn_norm.weight", i, "norm", d)
        if arch == "gpt-oss":
            f32(b + "post_attention_norm.weight", i, "norm", d)
        w(b + "attn_q.weight", i, "attn_q", d, nq)
        w(b + "attn_k.weight", i, "attn_k", d, nkv)
        w(b + "attn_v.weight", i, "attn_v", d, nkv)
        w(b + "attn_output.weight", i, "attn_output", nq, d)
        if arch == "gpt-oss":
            for name, n in (("attn_q.bias", nq), ("attn_k.bias", nkv), ("attn_v.bias", nkv),
                            ("attn_output.bias", d), ("attn_sinks.weight", spec.n_head)):
                f32(b + name, i, "bias", n)
        if arch in ("qwen3moe", "gemma3"):
            f32(b + "attn_q_norm.weight", i, "norm", hd)
            f32(b + "attn_k_norm.weight", i, "norm", hd)
        if arch == "gemma3":
            f32(b + "post_attention_norm.weight", i, "norm", d)
        if known and arch != "gpt-oss":
            f32(b + "ffn_norm.weight", i, "norm", d)
        if spec.is_moe_layer(i):
            assert m is not None
            ff, e = m.n_ff_exp, m.n_expert
            w(b + "ffn_gate_inp.weight", i, "router", d, e)
            if arch == "gpt-oss":
                f32(b + "ffn_gate_inp.bias", i, "bias", e)
            if m.fused_gate_up:
                w(b + "ffn_gate_up_exps.weight", i, "exps_gate", d, 2 * ff, e)
            else:
                w(b + "ffn_gate_exps.weight", i, "exps_gate", d, ff, e)
                w(b + "ffn_up_exps.weight", i, "exps_up", d, ff, e)
            w(b + "ffn_down_exps.weight", i, "exps_down", ff, d, e)
            if arch == "gpt-oss":
                f32(b + "ffn_gate_exps.bias", i, "bias", ff, e)
                f32(b + "ffn_up_exps.bias", i, "bias", ff, e)
                f32(b + "ffn_down_exps.bias", i, "bias", d, e)
            if m.n_expert_shared:
                w(b + "ffn_gate_shexp.weight", i, "shexp", d, m.n_ff_shexp, role="gate")
                w(b + "ffn_up_shexp.weight", i, "shexp", d, m.n_ff_shexp, role="up")
                w(b + "ffn_down_shexp.weight", i, "shexp", m.n_ff_shexp, d, role="down")
        else:
            w(b + "ffn_gate.weight", i, "ffn_gate", d, spec.n_ff)
            w(b + "ffn_up.weight", i, "ffn_up", d, spec.n_ff)
            w(b + "ffn_down.weight", i, "ffn_down", spec.n_ff, d)
        if arch == "gemma3":
            f32(b + "post_ffw_norm.weight", i, "norm", d)
    if known:
        f32("output_norm.weight", -1, "norm", d)
    if spec.tied_embeddings:
        e0 = out[0]
        out.append(replace(e0, group="output", duplicate=True))
    else:
        w("output.weight", -1, "output", d, spec.n_vocab)
    return out


def _derive_tensors(spec: ModelSpec) -> tuple[Tensor, ...]:
    """The tensors of a TOML model: :func:`_layout` with per-tensor types from
    :func:`sim.model.quant.tensor_ggml_type` (preset rule, explicit entries) or from ``group_types``."""
    preset = spec.quant_preset.upper()
    rule = preset in RULE_PRESETS
    n_rule = max(spec.quant_n_layer, spec.n_layer)
    n_expert = spec.moe.n_expert if spec.moe else 0
    n_gqa = spec.n_head // spec.n_head_kv
    floats = {g: float(v) for g, v in spec.quant_explicit.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}

    def typer(keep_float: set[str]):
        def ty(group: str, layer: int, n_in: int, role: str | None) -> tuple[str, float]:
            if rule:
                if group in keep_float:
                    return "", floats[group]
                t = tensor_ggml_type(preset, group, layer, n_rule, n_expert=n_expert, n_gqa=n_gqa,
                                     tied_embeddings=spec.tied_embeddings, n_in=n_in, role=role,
                                     explicit=spec.quant_explicit.get(group))
                return t, GGML_TYPE_BPW[t]
            v = spec.group_types.get(group, "F32" if group in AUX_GROUPS else "F16")
            if isinstance(v, str):
                t = v.upper()
                return t, bpw_of(t)
            return "", float(v)
        return ty

    keep: set[str] = set()
    if rule and floats:
        # a number the rule reproduces over the whole model (its n_rule blocks) gives way to it
        bits: dict[str, float] = {}
        elems: dict[str, int] = {}
        for t in _layout(spec, n_rule, typer(set())):
            if t.group in floats and not t.duplicate:
                bits[t.group] = bits.get(t.group, 0.0) + t.nbytes * 8
                elems[t.group] = elems.get(t.group, 0) + t.n_params
        for g, want in floats.items():
            if g in elems and abs(bits[g] / elems[g] - want) > 1e-9 * max(1.0, want):
                keep.add(g)
    elif not rule:
        keep = set(floats)
    return tuple(_layout(spec, spec.n_layer, typer(keep)))


def load_model(path: str | Path) -> ModelSpec:
    """Read a model: a TOML (``scenarios/models/*.toml``) or a GGUF (by the ``.gguf`` suffix
    or the GGUF magic, whatever the name: a GGUF named ``.toml`` is read as a GGUF;
    :func:`sim.model.gguf.load_gguf_model` reads its header only).

    ``path`` may also be a built-in model's name (``"qwen3-30b-a3b"``: :func:`sim.resources.resolve_named`).

    Raises:
        ScenarioError: naming the file and field of any missing or invalid value; an unknown
            bare name, listing the built-in ones.
    """
    from sim.resources import resolve_named

    p = path = resolve_named("model", path)
    if p.suffix.lower() == ".gguf" or (p.is_file() and _is_gguf(p)):
        from sim.model.gguf import load_gguf_model

        return load_gguf_model(p)
    return _load_model_toml(path)


def _is_gguf(p: Path) -> bool:
    from sim.model.gguf import is_gguf

    return is_gguf(p)


def _load_model_toml(path: str | Path) -> ModelSpec:
    data = load_toml(path)
    f = Fields(data, path)
    if "model" not in data and "scenario" in data:
        raise ScenarioError("is a scenario TOML ([scenario]), not a model: give it as the scenario, or -m the "
                            "model file it names", file=path, field="model")
    if "model" not in data and "hardware" in data:
        raise ScenarioError("is a hardware profile TOML ([hardware]), not a model: name it as a scenario's hardware, "
                            "and give -m a model TOML or GGUF", file=path, field="model")
    m = f.sub("model", required=True)
    name = m.str("name")
    if not name.strip():   # llama-bench's model column (model_type) is never blank
        raise m.error("name", "must not be empty (the rows' model column)")
    from sim.bounds import COUNT_MAX, DIM_MAX, LAYERS_MAX

    n_layer = m.int("n_layer", min=1, max=LAYERS_MAX)
    d_model = m.int("d_model", min=1, max=DIM_MAX)
    n_head = m.int("n_head", min=1, max=COUNT_MAX)
    n_head_kv = m.int("n_head_kv", n_head, min=1, max=COUNT_MAX)
    if n_head % n_head_kv:
        raise m.error("n_head_kv", f"must divide n_head ({n_head}), got {n_head_kv}")
    head_dim = m.int("head_dim", max(1, d_model // n_head), min=1, max=DIM_MAX)
    n_vocab = m.int("n_vocab", min=1, max=DIM_MAX)
    n_ff = m.int("n_ff", 0, min=0, max=DIM_MAX)
    attn_kind = m.str("attn_kind", "full", choices=("full", "hybrid", "linear"))
    full_attn_interval = m.int("full_attn_interval", 1 if attn_kind == "full" else 4, min=1, max=LAYERS_MAX)
    sliding_window = m.int("sliding_window", 0, min=0, max=DIM_MAX)
    swa_interval = m.int("swa_interval", 0, min=0, max=LAYERS_MAX)
    if bool(sliding_window) != bool(swa_interval):   # one without the other would be full attention, silently
        raise m.error("swa_interval" if sliding_window else "sliding_window",
                      "sliding_window and swa_interval go together (a window, and every swa_interval-th layer "
                      "full): give both or neither")
    linear_state_dim = m.int("linear_state_dim", 128, min=1, max=DIM_MAX)
    n_ctx_train = m.int("n_ctx_train", 0, min=0, max=2**32 - 1)
    # bytes per KV element: a quantised cache has ~0.5 (q4_0), f32 4; 8 leaves room
    kv_bytes = m.float("kv_bytes_per_elem", 2.0, min=1 / 16, max=8.0)
    source = m.str("source", "")
    arch = m.str("arch", "")
    if arch not in ("", *TOML_ARCHS):
        raise m.error("arch", f"'{arch}' is not supported (accepted: {', '.join(TOML_ARCHS)}; leave it out for a "
                              "generic llama-shaped model)")
    # gemma3 ties its output head to token_embd (the GGUF has no output.weight)
    tied = m.bool("tied_embeddings", arch == "gemma3")
    m.check_unknown()

    moe = None
    if f.has("moe"):
        e = f.sub("moe")
        n_expert = e.int("n_expert", min=1, max=COUNT_MAX)
        n_used = e.int("n_expert_used", min=1, max=COUNT_MAX)
        if n_used > n_expert:
            raise e.error("n_expert_used", f"top-k {n_used} exceeds n_expert {n_expert}")
        moe = MoESpec(
            n_expert=n_expert,
            n_expert_used=n_used,
            n_ff_exp=e.int("n_ff_exp", min=1, max=DIM_MAX),
            n_expert_shared=e.int("n_expert_shared", 0, min=0, max=COUNT_MAX),
            n_ff_shexp=e.int("n_ff_shexp", 0, min=0, max=DIM_MAX),
            n_layer_dense_lead=e.int("n_layer_dense_lead", 0, min=0, max=n_layer - 1),   # >= 1 MoE block
            fused_gate_up=e.bool("fused_gate_up", False),
        )
        if moe.n_expert_shared and not moe.n_ff_shexp:
            raise e.error("n_ff_shexp", "required when n_expert_shared > 0")
        e.check_unknown()
    if moe is None and arch in MOE_ARCHS:   # llama.cpp's loader for the arch reads expert tensors
        raise m.error("arch", f"'{arch}' is a mixture-of-experts architecture: the model needs its [moe] table")
    if (moe is None or moe.n_layer_dense_lead > 0) and n_ff <= 0:
        raise m.error("n_ff", "a dense model (or leading dense layers) needs n_ff > 0")

    q = f.sub("quant")
    preset = q.str("preset", "F16")
    try:
        types: dict[str, str | float] = dict(preset_group_types(preset))
    except KeyError as exc:
        raise q.error("preset", str(exc.args[0])) from None
    explicit: dict[str, str | float] = {}
    for g in TENSOR_GROUPS:
        if q.has(g):
            v = q.raw(g)
            try:
                bpw_of(v)
            except (KeyError, ValueError) as exc:
                raise q.error(g, str(exc.args[0])) from None
            types[g] = v.upper() if isinstance(v, str) else v
            explicit[g] = types[g]
    q.check_unknown()
    f.check_unknown()
    spec = ModelSpec(
        name=name, n_layer=n_layer, d_model=d_model, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_vocab=n_vocab, n_ff=n_ff, attn_kind=attn_kind,
        full_attn_interval=full_attn_interval, sliding_window=sliding_window,
        swa_interval=swa_interval, linear_state_dim=linear_state_dim, moe=moe,
        group_types=types, kv_bytes_per_elem=kv_bytes, source=source, file=str(path),
        arch=arch, quant_preset=preset.upper(), quant_explicit=explicit, tied_embeddings=tied,
        n_ctx_train=n_ctx_train,
    )
    from sim.bounds import check_kind

    check_kind(float(sum(t.nbytes for t in spec.tensors)), "bytes", file=path, field="model")
    for t in spec.tensors:
        blk = GGML_BLOCK.get(t.ggml_type, (1, 0))[0]
        if t.ggml_type and t.n_in % blk:
            fld = "preset" if t.group not in explicit else t.group
            raise q.error(fld, f"type {t.ggml_type} (blocks of {blk}) cannot hold {t.name}, whose rows have "
                               f"{t.n_in} elements")
    return spec


# --------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkSpec:
    """A copy path: ``t = latency_s + bytes / bytes_per_s``.

    Attributes:
        bytes_per_s: sustained bandwidth.
        latency_s: fixed cost per copy call.
        host_blocking: the host thread is blocked for the copy (pageable memory: CUDA stages
            it through a pinned bounce buffer, ``cudaMemcpyAsync`` API sync behaviour).
    """

    bytes_per_s: float
    latency_s: float
    host_blocking: bool = False

    def time_s(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


#: launched op kinds whose executor launch costs a profile can carry
#: (``executor_issue_<kind>_us``, ``executor_busy_issue_<kind>_us``; ``calibrate.executor_costs``)
EXECUTOR_LAUNCH_KINDS = ("gemm", "moe", "attn", "h2d", "d2h")


@dataclass(frozen=True)
class HardwareProfile:
    """A GPU + host system, from datasheets or measured by ``prefetch-sim calibrate``.

    Attributes:
        name: display name (of the profile).
        gpu_name: the device name (llama-bench's ``gpu_info``, one per GPU).
        backend: llama-bench's ``backends`` / ``backend`` column for this GPU (``CUDA``, ``ROCm``,
            ``Vulkan``...); TOML key ``backend``, default :func:`default_backend` of the GPU's
            name.
        n_gpu: GPUs (layers are split across them, llama.cpp ``-sm layer``).
        vram_bytes: memory per GPU.
        vram_reserved_bytes: memory per GPU taken by the CUDA context and driver.
        host_memory_bytes: the host's RAM (``host_memory_gb``, optional; 0: not known, not
            checked): host-resident weights and CPU layers' KV cache beyond it do not fit
            (:func:`sim.model.vram.check_host_memory`).
        gpu_flops_per_s: dense f16/bf16 tensor-core peak.
        gemm_efficiency: achieved share of ``gpu_flops_per_s`` on large GEMMs.
        hbm_bytes_per_s: device memory bandwidth.
        hbm_efficiency: achieved share of ``hbm_bytes_per_s`` on weight-streaming kernels.
        kernel_s: minimum GPU time of one kernel (launch and tail).
        h2d_pinned, h2d_pageable, d2h: copy paths.
        host_sync_s: host cost of ``cudaStreamSynchronize`` returning after the GPU is idle.
        op_issue_s: host cost to issue one asynchronous op (kernel launch, async copy call).
        event_s: host cost of an event record or stream-wait-event call.
        cpu_bytes_per_s: host DRAM bandwidth a CPU matvec achieves (ops run on the CPU).
        cpu_flops_per_s: CPU matmul throughput (CPU ops with many tokens).
        cpu_op_s: fixed cost of one CPU-backend op (thread-pool dispatch), seconds.
        executor_op_issue_s: host cost of one launch on the *executor's* path (Python, with its
            timing events), seconds; 0 = ``op_issue_s``.
        executor_issue_s_by_kind: the executor's launch cost per launched op kind (``gemm``,
            ``moe``, ``attn``, ``h2d``, ``d2h``), measured by ``calibrate.executor_costs``;
            kinds not in it cost ``executor_op_issue_s``.
        executor_host_work_s, executor_host_work_per_id_s: the executor's host time per
            host-work op (building used-expert runs with numpy) and per router id, seconds,
            measured by ``calibrate.executor_costs``; 0 = the native estimate
            (:data:`sim.model.costs.HOST_WORK_PER_ITEM_S`). Used in ``executor_mode`` only.
        executor_busy_issue_s_by_kind: extra cost of one executor launch per launched op kind
            once the plan has run a CPU-backend op (the host's BLAS worker threads active: on
            the lent H200 VM a launch issued between CPU matvecs took 1.5–4.5× its cost in a
            GPU-only loop), seconds, measured by ``calibrate.executor_costs`` in a decode-shaped
            loop. Used in ``executor_mode`` only.
        executor_cpu_op_s, executor_cpu_bytes_per_s: the executor's CPU matvec cost in a
            decode-shaped loop (GPU launches, host sync, runs of CPU matvecs over weights
            read cold from DRAM): fixed seconds per op and bytes/s, a line through the measured
            sizes (``calibrate.executor_costs``). With ``executor_cpu_bytes_per_s`` 0 (absent)
            both fall back to ``cpu_op_s`` / ``cpu_bytes_per_s``; with it set, the intercept is
            used as given (0 included). Used in ``executor_mode`` only.
        executor_busy_scale: factor on the executor's busy-host costs in a plan (its CPU
            matvecs, and its launches after the first of them, extras included), fitted by
            ``calibrate.executor_costs`` on batch-1 decode plans of held-out models
            (:data:`sim.views.validation.DECODE_PROBE_MODELS`): the synthetic decode loop those costs
            are measured with ran ≈ 11% faster, against its prediction, than the validation
            grid's decode plans in the same process and minutes
            (``benchmarks/bench_decode_chain.py``). 1 = no correction. Used in ``executor_mode``
            only.
        executor_mode: price host launches as the thin CuPy executor issues them
            (``executor_op_issue_s``; an attention: the table's ``t_host_s``, its three prepared
            launches) instead of the native launch path; set by ``prefetch-sim validate``.
        event_semantics: ``"record_point"`` (CUDA: a wait releases when the work before the
            record finished) or ``"stream_tail"`` (seen on ROCm with pageable memory: released
            only when the copy stream drains; pinned copies keep record-point semantics).
            ``h2d_pageable.host_blocking`` (TOML ``h2d_pageable_host_blocking``, default true
            except for a ROCm backend) says whether a pageable copy blocks the host (CUDA) or
            queues on its stream (ROCm pins pageable pages on the fly).
        gemm_table: optional measured GEMM times (columns m, n, k, t_s), used for shapes it
            covers.
        attn_table: optional measured attention times (columns n_tokens, kv_len, n_head,
            n_head_kv, head_dim, t_s).
        kernel_weight_bits: bits per weight the compute kernels read (16 for a profile measured
            with f16 GEMMs, as ``prefetch-sim calibrate`` does); 0 = the model's quantisation
            (llama.cpp's quantised kernels read the quantised bytes). Copies always move the
            model's bytes.
        sources: field -> where the number came from.
        measured: metadata of a calibrated profile (device, driver, versions, date, command).
        file: the TOML file.
        ggml: llama.cpp's own kernel tables and scheduler overheads (a
            :class:`sim.model.ggmlcost.GgmlKernels`, TOML table ``[ggml]``), or None. With them the
            compute ops are priced as llama.cpp runs them (:mod:`sim.model.ggmlcost`).
    """

    name: str
    gpu_name: str
    n_gpu: int
    vram_bytes: float
    vram_reserved_bytes: float
    gpu_flops_per_s: float
    gemm_efficiency: float
    hbm_bytes_per_s: float
    hbm_efficiency: float
    kernel_s: float
    h2d_pinned: LinkSpec
    h2d_pageable: LinkSpec
    d2h: LinkSpec
    host_sync_s: float
    op_issue_s: float
    event_s: float
    cpu_bytes_per_s: float
    cpu_flops_per_s: float
    event_semantics: str = "record_point"
    cpu_op_s: float = 0.0
    executor_op_issue_s: float = 0.0
    executor_issue_s_by_kind: Mapping[str, float] = field(default_factory=dict)
    executor_host_work_s: float = 0.0
    executor_host_work_per_id_s: float = 0.0
    executor_busy_issue_s_by_kind: Mapping[str, float] = field(default_factory=dict)
    executor_cpu_op_s: float = 0.0
    executor_cpu_bytes_per_s: float = 0.0
    executor_busy_scale: float = 1.0
    executor_mode: bool = False
    gemm_table: Any = None
    attn_table: Any = None
    kernel_weight_bits: float = 0.0
    sources: Mapping[str, str] = field(default_factory=dict)
    measured: Mapping[str, str] = field(default_factory=dict)
    file: str | None = None
    backend: str = ""
    ggml: Any = None
    host_memory_bytes: float = 0.0

    def h2d(self, pinned: bool) -> LinkSpec:
        return self.h2d_pinned if pinned else self.h2d_pageable

    def with_(self, **changes: Any) -> HardwareProfile:
        """A copy with some fields changed (for sweeps), e.g. ``hw.with_(h2d_pinned=...)``."""
        return replace(self, **changes)


_HW_NUMBERS = {
    # field: (toml key, default-or-required)
    "vram_bytes": "vram_gb",
    "gpu_flops_per_s": "gpu_tflops",
    "hbm_bytes_per_s": "hbm_gb_per_s",
}


#: llama.cpp's GPU backend names (``ggml_backend_reg_name``, as llama-bench's ``backends`` column
#: prints them), by their lower case: a profile's ``backend`` is one of them, in any case. The
#: simulator's mechanics follow CUDA's and ROCm's copy semantics (``event_semantics``,
#: ``h2d_pageable_host_blocking``); the others are names printed.
GGML_BACKENDS = {b.lower(): b for b in ("CUDA", "ROCm", "Vulkan", "Metal", "SYCL", "MUSA", "CANN", "OpenCL")}


def default_backend(gpu_name: str, name: str = "") -> str:
    """llama-bench's backend name for a GPU: ``CUDA`` for an NVIDIA one, ``ROCm`` for an AMD one
    (by the words in ``gpu_name`` or the profile ``name``), else ``name`` (or ``gpu_name``)."""
    text = f"{gpu_name} {name}".lower()
    if any(w in text for w in ("nvidia", "geforce", "tesla", "quadro")):
        return "CUDA"
    if any(w in text for w in ("amd", "radeon", "instinct")):
        return "ROCm"
    return name or gpu_name


#: how many ``base`` profiles a hardware profile may chain (a, based on b, based on c...)
MAX_BASE_DEPTH = 4


def _with_base(data: dict, path: Path, depth: int = 0) -> dict:
    """A hardware TOML with its ``[hardware] base`` profile merged under it: every table of the
    base (``[hardware]``, ``[ggml]``, ``[measured]``...) with the child's keys replacing the
    base's. The base must be a profile in the same folder (its relative table paths, e.g.
    ``[ggml] gpu_kernels``, then mean the same); chains up to :data:`MAX_BASE_DEPTH` deep.

    Raises:
        ScenarioError: ``base`` not a file name in the same folder, missing, a cycle, too deep.
    """
    hw = data.get("hardware")
    if not isinstance(hw, dict) or "base" not in hw:
        return data
    base = hw["base"]
    if not isinstance(base, str) or not base or Path(base).name != base:
        raise ScenarioError(f"expected the file name of a profile in the same folder, got {base!r}",
                            file=path, field="hardware.base")
    bpath = path.parent / base
    if bpath.resolve() == path.resolve() or depth >= MAX_BASE_DEPTH:
        raise ScenarioError(f"profiles chained by 'base' more than {MAX_BASE_DEPTH} deep or in a cycle",
                            file=path, field="hardware.base")
    if not bpath.is_file():
        raise ScenarioError(f"base profile {base} not found next to this file", file=path, field="hardware.base")
    merged = _with_base(load_toml(bpath), bpath, depth + 1)
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in merged.items()}
    for k, v in data.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    del out["hardware"]["base"]
    return out


def load_hardware(path: str | Path) -> HardwareProfile:
    """Read a hardware profile TOML (``scenarios/hardware/*.toml``).

    Every number is ``{ value = ..., source = "..." }``. Units in keys: ``_gb`` (10**9 bytes),
    ``_gb_per_s``, ``_tflops`` (10**12 FLOP/s), ``_us`` (microseconds). ``path`` may also be a
    built-in profile's name (``"h200"``: :func:`sim.resources.resolve_named`).

    Raises:
        ScenarioError: naming the file and field of any missing or invalid value; an unknown
            bare name, listing the built-in ones.
    """
    from sim.resources import resolve_named

    path = resolve_named("hardware", path)
    data = _with_base(load_toml(path), Path(path))
    f = Fields(data, path)
    g = f.sub("hardware", required=True)
    sources: dict[str, str] = {}

    def num(key: str, scale: float, default: Any = None, positive: bool = True, kind: str | None = None) -> float:
        """A sourced number times ``scale``: finite, > 0 (``positive``) or >= 0 (a cost), and
        within the physical bounds of ``kind`` (:data:`sim.bounds.KINDS`) after scaling."""
        if default is not None and not g.has(key):
            return default
        v, s = g.sourced(key, positive=positive, scale=scale, kind=kind)  # finite, bounded (checked there)
        if v < 0:
            raise g.error(key, f"a cost must be >= 0, got {v}")
        sources[key] = s
        return v * scale

    name = g.str("name")
    gpu_name = g.str("gpu_name", name)
    for key, val in (("name", name), ("gpu_name", gpu_name)):
        if not val.strip():   # the rows' backend / gpu_info and the build line name the profile by them
            raise g.error(key, "must not be empty (the rows and the build line name the profile by it)")
    if g.has("backend"):
        raw_backend = g.str("backend")
        backend = GGML_BACKENDS.get(raw_backend.strip().lower())
        if backend is None:   # fresh-user round 13: "rocm" ran as CUDA, "Vulkn" was printed
            raise g.error("backend", f"unknown backend {raw_backend!r}; one of {', '.join(GGML_BACKENDS.values())} "
                                     "(llama-bench's backend names; any case)")
    else:
        backend = default_backend(gpu_name, name)
    n_gpu = g.int("n_gpu", 1, min=1, max=16)
    vram = num("vram_gb", GB, kind="bytes")
    reserved = num("vram_reserved_gb", GB, default=0.5 * GB, kind="bytes")
    if reserved >= vram:
        raise g.error("vram_reserved_gb", f"{reserved / GB:g} GB reserved leaves nothing of vram_gb {vram / GB:g} GB")
    host_mem = num("host_memory_gb", GB, default=0.0, kind="bytes") if g.has("host_memory_gb") else 0.0
    flops = num("gpu_tflops", 1e12, kind="flops_per_s")
    eff = num("gemm_efficiency", 1.0, default=0.7, kind="efficiency")
    hbm = num("hbm_gb_per_s", GB, kind="bytes_per_s")
    hbm_eff = num("hbm_efficiency", 1.0, default=0.8, kind="efficiency")
    kernel_s = num("kernel_us", 1e-6, default=5e-6, kind="duration_s")
    pin_bw = num("h2d_pinned_gb_per_s", GB, kind="bytes_per_s")
    pin_lat = num("h2d_pinned_latency_us", 1e-6, default=10e-6, kind="duration_s")
    pag_bw = num("h2d_pageable_gb_per_s", GB, kind="bytes_per_s")
    pag_lat = num("h2d_pageable_latency_us", 1e-6, default=20e-6, kind="duration_s")
    d2h_bw = num("d2h_gb_per_s", GB, default=pin_bw, kind="bytes_per_s")
    d2h_lat = num("d2h_latency_us", 1e-6, default=15e-6, kind="duration_s")
    host_sync = num("host_sync_us", 1e-6, default=10e-6, kind="duration_s")
    issue = num("op_issue_us", 1e-6, default=4e-6, positive=False, kind="duration_s")
    event = num("event_us", 1e-6, default=2e-6, kind="duration_s")
    cpu_bw = num("cpu_gb_per_s", GB, kind="bytes_per_s")
    cpu_flops = num("cpu_tflops", 1e12, default=1e12, kind="flops_per_s")
    cpu_op = num("cpu_op_us", 1e-6, default=0.0, kind="duration_s")
    ex_issue = num("executor_op_issue_us", 1e-6, default=0.0, kind="duration_s")
    ex_by_kind = {k: num(f"executor_issue_{k}_us", 1e-6, positive=False, kind="duration_s") for k in EXECUTOR_LAUNCH_KINDS
                  if g.has(f"executor_issue_{k}_us")}
    ex_hw = num("executor_host_work_us", 1e-6, default=0.0, positive=False, kind="duration_s")
    ex_hw_id = num("executor_host_work_ns_per_id", 1e-9, default=0.0, positive=False, kind="duration_s")
    ex_busy = {k: num(f"executor_busy_issue_{k}_us", 1e-6, positive=False, kind="duration_s") for k in EXECUTOR_LAUNCH_KINDS
               if g.has(f"executor_busy_issue_{k}_us")}
    ex_cpu_op = num("executor_cpu_op_us", 1e-6, default=0.0, positive=False, kind="duration_s")
    ex_cpu_bw = num("executor_cpu_gb_per_s", GB, default=0.0, kind="bytes_per_s")
    ex_scale = num("executor_busy_scale", 1.0, default=1.0, kind="scale")
    sem = g.str("event_semantics", "record_point", choices=("record_point", "stream_tail"))
    # a pageable H2D blocks the host on CUDA (cudaMemcpyAsync stages it through a pinned bounce
    # buffer before returning); ROCm's runtime pins the pages on the fly and returns, so the copy
    # queues on its stream like a pinned one (at the profile's pageable rate)
    pag_blocking = g.bool("h2d_pageable_host_blocking", backend != "ROCm")
    kw_bits = g.float("kernel_weight_bits", 0.0, min=0.0, max=64.0)
    for key, val in (("gemm_efficiency", eff), ("hbm_efficiency", hbm_eff)):
        if val > 1:
            raise g.error(key, f"an efficiency is a share of peak, must be <= 1, got {val}")
    gemm_table = attn_table = None
    if g.has("gemm_table"):
        gemm_table = _read_table(g, "gemm_table", ("m", "n", "k", "t_s"))
    if g.has("attn_table"):
        attn_table = _read_table(g, "attn_table", ("n_tokens", "kv_len", "n_head", "n_head_kv", "head_dim", "t_s"),
                                 zero_ok=("kv_len",))
    g.check_unknown()
    ggml = _load_ggml(f.sub("ggml")) if f.has("ggml") else None
    measured: dict[str, str] = {}
    if f.has("measured"):
        ms = f.sub("measured")
        measured = {k: str(ms.raw(k)) for k in list(ms.table)}
        if ms.has("host_cpus"):   # -t's default and the thread count the CPU figures were measured with
            from sim.bounds import COUNT_MAX

            ms.int("host_cpus", min=1, max=COUNT_MAX)
    f.check_unknown()
    return HardwareProfile(
        name=name, gpu_name=gpu_name, n_gpu=n_gpu, vram_bytes=vram, vram_reserved_bytes=reserved,
        gpu_flops_per_s=flops, gemm_efficiency=eff, hbm_bytes_per_s=hbm, hbm_efficiency=hbm_eff,
        kernel_s=kernel_s,
        h2d_pinned=LinkSpec(pin_bw, pin_lat, False),
        h2d_pageable=LinkSpec(pag_bw, pag_lat, pag_blocking),
        d2h=LinkSpec(d2h_bw, d2h_lat, False),
        host_sync_s=host_sync, op_issue_s=issue, event_s=event,
        cpu_bytes_per_s=cpu_bw, cpu_flops_per_s=cpu_flops, event_semantics=sem, cpu_op_s=cpu_op,
        executor_op_issue_s=ex_issue, executor_issue_s_by_kind=ex_by_kind,
        executor_host_work_s=ex_hw, executor_host_work_per_id_s=ex_hw_id,
        executor_busy_issue_s_by_kind=ex_busy, executor_cpu_op_s=ex_cpu_op, executor_cpu_bytes_per_s=ex_cpu_bw,
        executor_busy_scale=ex_scale, gemm_table=gemm_table, attn_table=attn_table, kernel_weight_bits=kw_bits,
        sources=sources, measured=measured,
        file=str(path), backend=backend, ggml=ggml, host_memory_bytes=host_mem,
    )


#: the fewest tokens of a ``gpu_kernels_extra`` case: the MMQ kernels (above ggml-cuda's
#: ``MMVQ_MAX_BATCH_SIZE`` of 8; 16 in the case lists), compute-bound, where GPUs of one
#: architecture and clock agree (the parity gate of data/llamacpp/h200-dense3-predicted)
EXTRA_MIN_TOKENS = 16


def _with_extra_cases(gpu, extra, g: Fields):
    """``gpu`` (the GPU kernel table) with the weight-matmul cases of ``extra`` (``[ggml]
    gpu_kernels_extra``: cases timed on another GPU of the same SMs and clocks) appended. Only
    ``MUL_MAT`` cases at :data:`EXTRA_MIN_TOKENS` or more tokens may be in it (compute-bound; a
    matvec reads HBM, which differs between such GPUs), of a (type, m, k) the main table lacks.

    Raises:
        ScenarioError: (``gpu_kernels_extra``) another op, fewer tokens, or a shape the main
            table has.
    """
    import pandas as pd

    bad = extra[(extra["op"] != "MUL_MAT") | (extra["n"] < EXTRA_MIN_TOKENS)]
    if len(bad):
        r = bad.iloc[0]
        raise g.error("gpu_kernels_extra", f"{g.path('gpu_kernels_extra')}: {r['op']} {r['type']} {r['m']:g}x{r['k']:g} "
                                           f"at {r['n']:g} tokens: only MUL_MAT cases at {EXTRA_MIN_TOKENS} or more "
                                           "tokens may come from another GPU")
    have = set(zip(gpu["type"].str.upper(), gpu["m"].astype(float), gpu["k"].astype(float))) & set(
        zip(extra["type"].str.upper(), extra["m"].astype(float), extra["k"].astype(float)))
    if have:
        ty, m, k = sorted(have)[0]
        raise g.error("gpu_kernels_extra", f"{g.path('gpu_kernels_extra')}: {ty} {m:g}x{k:g} is in gpu_kernels too: "
                                           "a shape comes from one table")
    return pd.concat([gpu, extra.reindex(columns=gpu.columns)], ignore_index=True)


def _load_ggml(g: Fields):
    """The ``[ggml]`` table of a hardware profile: kernel tables (CSV paths relative to the
    profile) and sourced numbers (:class:`sim.model.ggmlcost.GgmlKernels`).

    Raises:
        ScenarioError: naming the field and file of a missing, unreadable or invalid value.
    """
    from sim.model.ggmlcost import FA_EXTRA_TOKENS, GgmlKernels, read_table

    def table(key: str, required: bool):
        if not g.has(key):
            if required:
                raise g.error(key, "missing (a kernel table CSV written by python -m calibrate.llamacpp.perf_cases table)")
            return None
        p = g.path(key)
        try:
            return read_table(p)
        except FileNotFoundError:
            raise g.error(key, f"table file not found: {p}") from None
        except ScenarioError as exc:  # a folder, a FIFO, a file too large (sim.bounds.check_text_input)
            raise g.error(key, f"kernel table {p}: {exc.reason}") from None
        except (ValueError, OSError) as exc:
            raise g.error(key, f"cannot read kernel table {p}: {exc}") from None

    sources: dict[str, str] = {}

    def num(key: str, scale: float, positive: bool = True, kind: str = "duration_s") -> float:
        """A sourced number times ``scale``, within the physical bounds of ``kind``."""
        v, src = g.sourced(key, positive=positive, scale=scale, kind=kind)
        if v < 0:
            raise g.error(key, f"a cost must be >= 0, got {v}")
        sources[key] = src
        return v * scale

    from sim.model.ggmlcost import check_coverage

    gpu = table("gpu_kernels", True)
    extra = table("gpu_kernels_extra", False)
    if extra is not None:
        gpu = _with_extra_cases(gpu, extra, g)
    cpu = table("cpu_kernels", True)
    for key, tab, backend in (("gpu_kernels", gpu, "gpu"), ("cpu_kernels", cpu, "cpu")):
        try:
            check_coverage(tab, backend)
        except ValueError as exc:
            raise g.error(key, f"{g.path(key)}: {exc}") from None
    out = GgmlKernels(
        gpu=gpu, cpu=cpu, l2_bytes=num("l2_mb", 2**20, kind="bytes"), floor_s=num("kernel_floor_us", 1e-6, positive=False),
        ew_bytes_per_s=num("ew_gb_per_s", GB, kind="bytes_per_s"), cpu_op_s=num("cpu_op_us", 1e-6, positive=False),
        cpu_ew_bytes_per_s=num("cpu_ew_gb_per_s", GB, kind="bytes_per_s"), graph_s=num("graph_us", 1e-6, positive=False),
        split_s=num("split_us", 1e-6, positive=False),
        cpu_split_s=num("cpu_split_us", 1e-6, positive=False) if g.has("cpu_split_us") else None,
        mask_s=num("mask_ns", 1e-9, positive=False) if g.has("mask_ns") else 0.0,
        launch_s=num("launch_us", 1e-6, positive=False) if g.has("launch_us") else 0.0,
        call_s=num("call_us", 1e-6, positive=False) if g.has("call_us") else 0.0,
        call_per_token_s=num("call_ns_per_token", 1e-9, positive=False) if g.has("call_ns_per_token") else 0.0,
        apply_per_token_s=num("apply_ns_per_token", 1e-9, positive=False) if g.has("apply_ns_per_token") else 0.0,
        build_per_layer_s=num("build_us_per_layer", 1e-6, positive=False) if g.has("build_us_per_layer") else 0.0,
        capture_per_layer_s=(num("capture_us_per_layer", 1e-6, positive=False)
                             if g.has("capture_us_per_layer") else 0.0),
        cpu_rate_scale=num("cpu_rate_scale", 1.0, kind="scale") if g.has("cpu_rate_scale") else 1.0,
        cpu_get_rows_bytes_per_s=(num("cpu_get_rows_gb_per_s", GB, kind="bytes_per_s")
                                  if g.has("cpu_get_rows_gb_per_s") else 0.0),
        cpu_set_rows_bytes_per_s=(num("cpu_set_rows_gb_per_s", GB, kind="bytes_per_s")
                                  if g.has("cpu_set_rows_gb_per_s") else 0.0),
        attn_kv_cold_bytes_per_s=(num("attn_kv_cold_gb_per_s", GB, kind="bytes_per_s")
                                  if g.has("attn_kv_cold_gb_per_s") else 0.0),
        fa_extra_s=tuple(num(f"fa_extra_us_{n}", 1e-6, positive=False) if g.has(f"fa_extra_us_{n}") else 0.0
                         for n in FA_EXTRA_TOKENS),
        f32_mmf_s=num("f32_mmf_us", 1e-6, positive=False) if g.has("f32_mmf_us") else 0.0,
        matvec_column_macs_per_s=(num("matvec_column_tmac_per_s", 1e12, kind="flops_per_s")
                                  if g.has("matvec_column_tmac_per_s") else 0.0),
        cpu_node_s=num("cpu_node_us", 1e-6, positive=False) if g.has("cpu_node_us") else None,
        cpu_glu_oai_elem_s=num("cpu_glu_oai_ns", 1e-9, positive=False) if g.has("cpu_glu_oai_ns") else 0.0,
        sources=sources)
    g.check_unknown()
    try:
        out.cold_rate("gpu", "Q4_K")
    except ValueError as exc:
        raise g.error("gpu_kernels", str(exc)) from None
    if cpu is not None:
        try:
            out.cold_rate("cpu", "Q4_K")
        except ValueError as exc:
            raise g.error("cpu_kernels", str(exc)) from None
    return out


def _read_table(g: Fields, key: str, columns: tuple[str, ...], zero_ok: tuple[str, ...] = ()):
    """A measured table (CSV) named by the profile's field ``key``, with numeric ``columns``:
    ``t_s`` finite and > 0, the shape columns (all but ``t_s``) finite and >= 1 (those in
    ``zero_ok`` >= 0), one row per shape.

    Raises:
        ScenarioError: (via ``g.error``, naming the field and file) a missing or unreadable
            file, a missing column, no rows, a value breaking those rules (naming its data row:
            1 = the first row after the header, comment and blank lines not counted), or a
            shape timed twice (naming both rows), as :func:`sim.model.ggmlcost.read_table` does.
    """
    import numpy as np
    import pandas as pd

    from sim.bounds import DURATION_MAX_S, DURATION_MIN_S, INT32_MAX, check_text_input
    from sim.model.ggmlcost import _cell, _first_row, duplicate_rows, shape_text

    p = g.path(key)
    check_text_input(p, file=g.file, field=g.name(key))
    try:
        df = pd.read_csv(p, comment="#")
    except FileNotFoundError:
        raise g.error(key, f"table file not found: {p}") from None
    except Exception as exc:  # pandas raises several parser errors
        raise g.error(key, f"cannot read table {p}: {exc}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise g.error(key, f"table {p} lacks columns {', '.join(missing)}")
    if df.empty:
        raise g.error(key, f"table {p} has no rows")
    for c in columns:
        num = pd.to_numeric(df[c], errors="coerce")
        bad = num.isna() & df[c].notna()
        if bad.any():
            row = _first_row(bad)
            raise g.error(key, f"table {p}: column {c} has a non-numeric value {df[c].iloc[row - 1]!r} "
                               f"(data row {row})")
        df[c] = num
    t = df["t_s"].to_numpy(dtype=float)
    bad_t = ~(np.isfinite(t) & (t > 0))
    if bad_t.any():
        row = _first_row(bad_t)
        raise g.error(key, f"table {p} has a non-positive, infinite or missing t_s {_cell(t[row - 1])} "
                           f"(data row {row})")
    out_t = (t < DURATION_MIN_S) | (t > DURATION_MAX_S)
    if out_t.any():
        row = _first_row(out_t)
        raise g.error(key, f"table {p}: t_s {t[row - 1]:g} s (data row {row}) is not physical for one kernel "
                           f"(must lie in [{DURATION_MIN_S:g}, {DURATION_MAX_S:g}] s)")
    dims = [c for c in columns if c != "t_s"]
    d = df[dims].to_numpy(float)

    def first_cell(mask):
        row, col = (int(v) for v in np.argwhere(mask)[0])
        return row + 1, dims[col], d[row, col]

    bad_d = ~np.isfinite(d) | (d < 0)
    if bad_d.any():
        row, col, v = first_cell(bad_d)
        raise g.error(key, f"table {p} has negative, infinite or missing values in {', '.join(dims)}: "
                           f"{col} is {_cell(v)} in data row {row}")
    bad_d = (d > INT32_MAX) | (d != np.floor(d))
    if bad_d.any():
        row, col, v = first_cell(bad_d)
        raise g.error(key, f"table {p}: {col} = {v:g} (data row {row}) must be a whole "
                           f"number <= {INT32_MAX} (a shape)")
    zero = (d == 0) & np.array([c not in zero_ok for c in dims])
    if zero.any():
        row, col, _ = first_cell(zero)
        raise g.error(key, f"table {p}: column {col} must be >= 1 (data row {row}; a shape of zero has no time)")
    dup = duplicate_rows(df, dims)
    if dup is not None:
        raise g.error(key, f"table {p}: the shape {shape_text(df.iloc[dup[0] - 1], dims)} is timed twice "
                           f"(data rows {dup[0]} and {dup[1]}); keep one row per shape")
    return df


# --------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------


#: the tensors ``--n-cpu-moe`` keeps on the host in a block (``LLM_FFN_EXPS_REGEX`` of
#: llama.cpp's ``common/common.h``, after ``blk\.N\.``)
_CPU_MOE_RE = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")


#: llama.cpp's default fit target, MiB per device: ``common_params::fit_params_target``
#: (``common/common.h``, ``1024 * 1024*1024`` bytes; ``-fitt``/``--fit-target`` in
#: ``common/arg.cpp``). llama-bench's own ``-fitt`` is off unless given.
FIT_TARGET_MIB_DEFAULT = 1024


@lru_cache(maxsize=256)
def _compiled_rules(rules: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern, str], ...]:
    """``-ot`` rules with their regexes compiled (``re.search`` with the text is the same)."""
    return tuple((re.compile(rx), buf) for rx, buf in rules)


#: the KV context of a scenario that sets no ``placement.ctx_size`` (tokens)
PLACEMENT_CTX_DEFAULT = 4096


@dataclass(frozen=True)
class Placement:
    """Where weights live, as llama.cpp's flags set it.

    Attributes:
        ngl: ``-ngl``: the last ``ngl`` blocks are offloaded (``n_layer + 1`` also puts
            ``output`` on the GPU; 999 means all, and a scenario's negative ``ngl``, llama-bench's
            default -1, is read as 999: :func:`sim_ngl`).
        n_cpu_moe: ``--n-cpu-moe N``: experts of the first N blocks stay on the host.
        override_tensor: ``-ot`` rules as ``(regex, buffer)`` pairs, buffer ``"CPU"`` or
            ``"CUDA0"``...; the first rule whose regex ``re.search``-es a tensor name wins.
        pinned: host weights in pinned memory (``--no-mmap`` with pinned host buffers) versus
            pageable (mmap'd, the llama.cpp default).
        expert_cache_experts: cap on the GPU expert cache of a cache variant, in experts per
            layer-tensor set; 0 (the default) or ``-1`` (``"auto"`` in the TOML): no cap, whatever
            VRAM is left (see :mod:`sim.model.vram`). Whether there is a cache at all is the
            variant's (``expert_cache``), not this number's.
        op_offload_min_batch: batch at and above which an op with a host weight runs on the
            GPU (ggml-cuda's ``GGML_OP_OFFLOAD_MIN_BATCH``, default 32).
        ctx_size: ``-c``: KV cache reserved for this many tokens.
        fit_experts: if true, ``n_cpu_moe`` is chosen as the smallest value, at least the
            placement's own ``n_cpu_moe`` (a floor: 0 to let the fit choose freely, as ``-fitt``
            does), whose placement fits in VRAM (as llama.cpp's ``--fit``), after the variant's
            staging reservation.
        tensor_split: ``-ts``: share of the offloaded layers per GPU (normalised); empty =
            equal shares (llama.cpp's default for identical GPUs).
        flash_attn: ``-fa``: FlashAttention (llama.cpp's ``auto`` picks it on CUDA) or the
            unfused KQ / softmax / KQV; priced differently only by a profile with llama.cpp
            kernel tables (:mod:`sim.model.ggmlcost`).
        fit_target_mib: llama.cpp's fit target (``-fitt MiB0,MiB1,...``): MiB left free per GPU
            when a variant's expert cache is sized by the fit (``expert_cache = "fit"``, see
            :func:`sim.model.vram.account`) and, where given, by the ``n_cpu_moe`` fit
            (``fit_experts``, :func:`sim.model.vram.fit_n_cpu_moe`); one value is broadcast to
            every GPU, a list sets the first GPUs and the others keep the default,
            :data:`FIT_TARGET_MIB_DEFAULT` (empty: the default for a fitted cache, no margin
            for the ``n_cpu_moe`` fit).
    """

    ngl: int = 999
    n_cpu_moe: int = 0
    override_tensor: tuple[tuple[str, str], ...] = ()
    pinned: bool = True
    expert_cache_experts: int = 0
    op_offload_min_batch: int = 32
    ctx_size: int = PLACEMENT_CTX_DEFAULT
    fit_experts: bool = False
    tensor_split: tuple[float, ...] = ()
    flash_attn: bool = True
    fit_target_mib: tuple[int, ...] = ()

    def __post_init__(self):
        # as a scenario and the CLI read them (fresh-user round 9: the Python API took ngl -1 as
        # no layer offloaded, and a negative n_cpu_moe as none; round 12: NaN, 24.7, True and "24")
        for name in ("ngl", "n_cpu_moe", "ctx_size", "expert_cache_experts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ValueError(f"Placement.{name}: expected an integer, got {v!r}")
        if self.ngl < 0:
            object.__setattr__(self, "ngl", sim_ngl(self.ngl))
        if self.n_cpu_moe < 0:
            raise ValueError(f"Placement.n_cpu_moe: {self.n_cpu_moe} is negative (blocks whose experts stay on the host)")
        if self.ctx_size < 0:   # 0: each test its own context (--ctx-size 0); the TOML asks >= 1
            raise ValueError(f"Placement.ctx_size: {self.ctx_size} is negative (KV context in tokens)")
        if self.expert_cache_experts < -1:
            raise ValueError(f"Placement.expert_cache_experts: {self.expert_cache_experts} is below -1 (-1, 0: no cap)")

    def fit_margin_bytes(self, gpu: int) -> float:
        """Bytes the fit leaves free on GPU ``gpu`` (:attr:`fit_target_mib`, as llama.cpp's
        ``-fitt`` parses it: one value for every GPU, else per GPU with the default for the
        GPUs the list does not reach)."""
        ts = self.fit_target_mib
        if len(ts) == 1:
            mib = ts[0]
        else:
            mib = ts[gpu] if gpu < len(ts) else FIT_TARGET_MIB_DEFAULT
        return float(mib) * 2**20

    def host_resident(self, model: ModelSpec, t: Tensor) -> bool:
        """True if tensor ``t`` is kept in host memory under this placement.

        As llama.cpp: the ``-ot`` rules first (``re.search`` on the GGUF name, e.g.
        ``blk.3.ffn_up_exps.weight``; first match wins); ``token_embd`` on the host; ``-ngl N``
        counts the output layer (``output``, ``output_norm``, a tied head) as the last of the
        ``n_layer + 1`` layers (``llama_model::load_tensors``: ``i_gpu_start = n_layer + 1 - N``):
        the output is offloaded with any ``N >= 1``, and the blocks before the last ``N - 1``
        (:meth:`gpu_blocks`) stay on the host; ``--n-cpu-moe N``: in blocks ``< N``
        every tensor llama.cpp's rule ``blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` matches
        (the expert matrices and, e.g. in gpt-oss, their biases)."""
        for rx, buf in _compiled_rules(self.override_tensor):
            if rx.search(t.name):
                return buf.upper() == "CPU"
        if t.layer < 0:
            if t.group == "embd":
                return True  # llama.cpp keeps token_embd on the host (get_rows on CPU)
            return self.ngl < 1  # the output layer is the first one -ngl offloads
        if t.layer < model.n_layer - self.gpu_blocks(model):
            return True
        if t.layer < self.n_cpu_moe and (t.is_expert or _CPU_MOE_RE.search(t.name)):
            return True
        return False

    def gpu_blocks(self, model: ModelSpec) -> int:
        """Blocks ``-ngl`` offloads: the last ``ngl - 1`` (the output layer takes one of the
        ``ngl``; ``llama_model::load_tensors``), all ``n_layer`` from ``ngl = n_layer + 1``."""
        return max(0, min(self.ngl - 1, model.n_layer))

    def output_on_gpu(self) -> bool:
        """``-ngl`` offloads the output layer first: with any ``ngl >= 1``."""
        return self.ngl >= 1

    def layer_on_gpu(self, model: ModelSpec, layer: int) -> bool:
        return layer >= model.n_layer - self.gpu_blocks(model)


def nested_repeat(pattern: str) -> str | None:
    """``pattern`` (a regular expression in Python ``re`` syntax) when it repeats, without bound,
    a group that itself repeats without bound (``(.*.*)*``, ``(a+)+``); else None. Matching such a
    pattern can take time exponential in the name's length where it fails (Python's ``re`` and
    llama.cpp's ``std::regex`` both backtrack): ``-ot "(.*.*)*X=CPU"`` ran for minutes (fresh-user
    round 10). A pattern ``re`` cannot parse gives None (its compile error says why)."""
    try:
        import re._constants as C
        import re._parser as P
    except ImportError:  # pragma: no cover - Python before 3.11
        import sre_constants as C  # type: ignore[no-redef]
        import sre_parse as P  # type: ignore[no-redef]
    try:
        tree = P.parse(pattern)
    except (re.error, RecursionError):
        return None
    repeats = {C.MAX_REPEAT, C.MIN_REPEAT} | ({C.POSSESSIVE_REPEAT} if hasattr(C, "POSSESSIVE_REPEAT") else set())

    def walk(items, inside: bool) -> bool:
        for op, av in items:
            if op in repeats:
                unbounded = av[1] == C.MAXREPEAT
                if unbounded and inside:
                    return True
                if walk(av[2], inside or unbounded):
                    return True
            elif op is C.SUBPATTERN:
                if walk(av[-1], inside):
                    return True
            elif op is C.BRANCH:
                if any(walk(b, inside) for b in av[1]):
                    return True
            elif op in (C.ASSERT, C.ASSERT_NOT):
                if walk(av[1], inside):
                    return True
        return False

    return pattern if walk(tree, False) else None


#: what ``(?`` may open in ECMAScript (``std::regex``'s default grammar, which llama.cpp's ``-ot``
#: uses): a non-capturing group and the two lookaheads
_ECMA_GROUPS = (":", "=", "!")
#: escapes of Python ``re`` that ECMAScript lacks (``std::regex`` refuses them: ``error_escape``)
_PY_ESCAPES = {"A": "\\A (start of string)", "Z": "\\Z (end of string)", "z": "\\z", "G": "\\G",
               "N": "\\N{...} (a named character)", "U": "\\U (an 8-digit code point)"}


def python_only_syntax(pattern: str) -> str | None:
    """The first construct of ``pattern`` that Python's ``re`` accepts and ECMAScript (the
    grammar ``std::regex`` compiles by default, as llama.cpp's ``-ot`` does in
    ``llama_model_loader``) does not, described in a few words; None when there is none.

    Found by a scan of the pattern (escapes and bracket expressions skipped): inline flags
    (``(?i)``, ``(?x)``), named groups (``(?P<x>...)``, ``(?<x>...)``: ``std::regex`` has none),
    lookbehind (``(?<=``, ``(?<!``), comments (``(?#...)``), atomic groups (``(?>``),
    conditionals (``(?(1)...)``), possessive quantifiers (``a*+``) and the escapes ``\\A``, ``\\Z``,
    ``\\z``, ``\\G``, ``\\N{}``, ``\\U``. A real ``llama-bench`` throws ``std::regex_error`` on
    such a pattern when it loads the model (fresh-user round 11: ``-ot '(?i)EXPS=CPU'`` ran here)."""
    i, n = 0, len(pattern)
    in_class = False
    prev_quant = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1] if i + 1 < n else ""
            if not in_class and nxt in _PY_ESCAPES:
                return _PY_ESCAPES[nxt]
            i += 2
            prev_quant = False
            continue
        if in_class:
            if c == "[" and i + 1 < n and pattern[i + 1] in ":.=":   # [:alpha:] and kin inside a class
                end = pattern.find(pattern[i + 1] + "]", i + 2)
                i = end + 2 if end >= 0 else n
                continue
            if c == "]":
                in_class = False
            i += 1
            continue
        if c == "[":
            in_class = True
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":   # a leading ] is a member
                i += 1
            prev_quant = False
            continue
        if c == "(" and pattern.startswith("(?", i):
            rest = pattern[i + 2:i + 4]
            if rest.startswith(_ECMA_GROUPS):   # (?: (?= (?!: ECMAScript's own
                i += 3
                prev_quant = False
                continue
            if rest.startswith(("<=", "<!")):
                return f"lookbehind '(?{rest}'"
            if rest.startswith(("P<", "P=", "<")):
                return "a named group '(?P<...>' / '(?<...>'"
            if rest.startswith("#"):
                return "a comment '(?#...)'"
            if rest.startswith(">"):
                return "an atomic group '(?>...)'"
            if rest.startswith("("):
                return "a conditional '(?(...)...)'"
            return f"inline flags '(?{rest[:1]}...'"
        if prev_quant and c == "+":
            return "a possessive quantifier ('*+', '++', '?+', '}+')"
        if prev_quant and c == "?":
            prev_quant = False   # a lazy quantifier (a*?): ECMAScript has it too
        else:
            prev_quant = c in "*+?" or (c == "}" and re.search(r"\{\d+(,\d*)?$", pattern[:i]) is not None)
        i += 1
    return None


def ot_regex_problem(pattern: str) -> str | None:
    """Why an ``-ot`` pattern (Python ``re`` syntax, already compiled) cannot be taken, worded to
    follow the pattern in a message, or None: syntax ``std::regex`` refuses
    (:func:`python_only_syntax`: llama-bench would fail to load the model), then a group repeated
    without bound inside such a repetition (:func:`nested_repeat`: exponential matching time).
    The one rule of a scenario's ``override_tensor`` and the command line's ``-ot``."""
    bad = python_only_syntax(pattern)
    if bad:
        return (f"uses {bad}, which Python accepts but llama.cpp's std::regex (ECMAScript) refuses: llama-bench "
                "would fail to load the model")
    if nested_repeat(pattern):
        return "repeats a repeated group without bound: matching it can take exponential time; write it without the nesting"
    return None


def profile_kernel_tables(hw_file) -> list[str]:
    """The kernel-table CSVs a hardware profile TOML names (``[ggml]`` ``gpu_kernels``,
    ``gpu_kernels_extra``, ``cpu_kernels``, relative to the profile), as paths; [] when it names
    none or cannot be read (its loader says why)."""
    import tomllib

    try:
        with open(hw_file, "rb") as f:
            g = tomllib.load(f).get("ggml", {})
    except (OSError, ValueError):
        return []
    if not isinstance(g, dict):
        return []
    base = Path(hw_file).parent
    return [str(base / g[k]) for k in ("gpu_kernels", "gpu_kernels_extra", "cpu_kernels")
            if isinstance(g.get(k), str) and g[k]]


def scenario_input_files(scn) -> dict[str, str]:
    """The files a scenario was read from, by real path: the scenario, its model and hardware
    files, the hardware profile's kernel tables (:func:`profile_kernel_tables`) and a routing
    trace, each with what it is (``"the routing trace"``). What an output must never replace."""
    ins: dict[str, str] = {}
    hw_file = getattr(scn.hardware, "file", None)
    for what, path in (("the scenario", getattr(scn, "file", None)), ("the model file", getattr(scn.model, "file", None)),
                       ("the hardware profile", hw_file),
                       ("the routing trace", getattr(scn.routing, "trace_file", None))):
        if path:
            ins.setdefault(os.path.realpath(path), what)
    if hw_file:
        for t in profile_kernel_tables(hw_file):
            ins.setdefault(os.path.realpath(t), f"a kernel table of the hardware profile ({t})")
    return ins


def replaced_input(path, inputs: Mapping[str, str]) -> str | None:
    """What writing ``path`` would replace, or None: one of ``inputs`` (real path -> what it is,
    :func:`scenario_input_files`), a shipped input or document (:func:`sim.resources.shipped_input`),
    else any existing TOML or GGUF file (an output of this tool is neither: a model, hardware
    profile or scenario). The one test of every command's outputs
    (``run``, ``breakdown``, ``trace``, ``--list-devices``, ``crossover``)."""
    from sim.model.gguf import is_gguf
    from sim.resources import shipped_input

    what = inputs.get(os.path.realpath(path)) or shipped_input(path)
    p = Path(path)
    if what is None and p.is_file():
        if p.suffix.lower() in (".toml", ".gguf"):
            what = f"an existing {p.suffix.lower()[1:].upper()} file"
        elif is_gguf(p):
            what = "an existing GGUF file"
    return what


def sim_ngl(n_gpu_layers: int) -> int:
    """``-ngl`` (a scenario's ``placement.ngl``, a llama-bench row's ``n_gpu_layers``) as
    :attr:`Placement.ngl`: a negative value (llama-bench's default ``-1``) means every layer and
    the output (``llama_model::n_gpu_layers``: n_layer + 1), i.e. 999."""
    return 999 if n_gpu_layers < 0 else int(n_gpu_layers)


def placement_from_fields(p: Fields) -> Placement:
    """A ``[placement]`` table (llama.cpp's placement flags; sizes bounded by :mod:`sim.bounds`)."""
    from sim.bounds import INT32_MAX, TOKENS_MAX

    rules = []
    raw = p.raw("override_tensor", [])
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise p.error("override_tensor", "expected a list of 'regex=BUFFER' strings")
    for i, rule in enumerate(raw):
        fld = f"{p.name('override_tensor')}[{i}]"
        if not isinstance(rule, str) or "=" not in rule:
            raise ScenarioError(f"expected 'regex=BUFFER' (as llama.cpp -ot), got {rule!r}", file=p.file, field=fld)
        regex, buf = rule.rsplit("=", 1)
        try:
            re.compile(regex)
        except re.error as exc:
            raise ScenarioError(f"bad regex '{regex}': {exc}", file=p.file, field=fld) from None
        problem = ot_regex_problem(regex)
        if problem:
            raise ScenarioError(f"regex '{regex}' {problem}", file=p.file, field=fld)
        if not re.fullmatch(r"CPU|CUDA\d+|GPU\d*", buf.upper()):
            raise ScenarioError(f"buffer must be CPU or CUDA<n>, got '{buf}'", file=p.file, field=fld)
        rules.append((regex, buf.upper()))
    host_memory = p.str("host_memory", "pinned", choices=("pinned", "pageable"))
    cache = p.raw("expert_cache_experts", 0)
    if cache == "auto":
        cache = -1
    elif isinstance(cache, bool) or not isinstance(cache, int) or cache < 0 or cache > INT32_MAX:
        raise p.error("expert_cache_experts", f"expected a count >= 0 or \"auto\", got {cache!r}")
    return Placement(
        ngl=sim_ngl(p.int("ngl", 999, min=-INT32_MAX - 1, max=INT32_MAX)),
        n_cpu_moe=p.int("n_cpu_moe", 0, min=0, max=INT32_MAX),
        override_tensor=tuple(rules),
        pinned=host_memory == "pinned",
        expert_cache_experts=cache,
        op_offload_min_batch=p.int("op_offload_min_batch", 32, min=1, max=TOKENS_MAX),
        ctx_size=p.int("ctx_size", PLACEMENT_CTX_DEFAULT, min=1, max=TOKENS_MAX),
        fit_experts=p.bool("fit_experts", False),
        tensor_split=_tensor_split(p),
        flash_attn=p.bool("flash_attn", True),
        fit_target_mib=p.int_list("fit_target_mib", (FIT_TARGET_MIB_DEFAULT,), min=0, max=TOKENS_MAX * 64)
        if p.has("fit_target_mib") else (),
    )


def _tensor_split(p: Fields) -> tuple[float, ...]:
    raw = p.raw("tensor_split", [])
    if not isinstance(raw, list) or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
                                        or x < 0 for x in raw):
        raise p.error("tensor_split", "expected a list of finite non-negative numbers, one share per GPU "
                                      f"([3, 2] is llama-bench's -ts 3/2), got {raw!r}")
    if raw and sum(raw) <= 0:
        raise p.error("tensor_split", "at least one share must be > 0")
    return tuple(float(x) for x in raw)


# --------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test: ``pp512``, ``tg128``, ``pp512 @ d10000``.

    Attributes:
        n_prompt: prompt tokens processed (pp), 0 for tg.
        n_gen: tokens generated one at a time (tg), 0 for pp.
        n_depth: tokens already in the KV cache before the test (``-d``).
    """

    n_prompt: int
    n_gen: int
    n_depth: int = 0

    @property
    def name(self) -> str:
        base = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{base} @ d{self.n_depth}" if self.n_depth else base

    @property
    def n_tokens(self) -> int:
        return self.n_prompt or self.n_gen


@dataclass(frozen=True)
class Workload:
    """llama-bench's test matrix (``-p``, ``-n``, ``-d``, ``-ub``, ``-b``, ``-r``).

    Attributes:
        n_prompt: prompt lengths (``-p``); 0 entries are skipped (a negative one raises
            ``ValueError``, as in ``n_gen`` and ``n_depth``).
        n_gen: generation lengths (``-n``); 0 entries are skipped.
        n_depth: KV depths (``-d``).
        n_ubatch: physical batch (``-ub``).
        n_batch: logical batch (``-b``); a prompt is cut in ``n_batch`` graphs' worth of
            ubatches.
        repetitions: ``-r``; repetitions differ by routing draws.
        bench_repetitions: llama-bench's own ``-r`` when the simulated repetitions are fewer
            (a comparison against a llama-bench file draws 3 routings of a row measured at
            ``-r 5``); 0: ``repetitions``. It spreads the cost that only llama-bench's first
            repetition pays (capturing the CUDA graph, :mod:`sim.model.ggmlcost`). Not a TOML field.
        warmup: llama-bench's untimed warm-up run before a test's repetitions
            (:func:`sim.engines.metrics.warmup_test`; False: ``--no-warmup``). Only an expert cache keeps
            anything of it. Not a TOML field.
        n_ubatch_given: the TOML's ``n_ubatch`` as written when it is above ``n_batch`` (llama.cpp
            clamps the ubatch to the batch, so ``n_ubatch`` is ``n_batch``); what a llama-bench row
            prints, as for ``-ub 4096 -b 2048`` (:func:`sim.cli.benchflags.params_from_args`). 0:
            ``n_ubatch`` (as when ``n_ubatch`` is no longer ``min(n_ubatch_given, n_batch)``: a
            workload changed since). Not a TOML field.
    """

    n_prompt: tuple[int, ...] = (512,)
    n_gen: tuple[int, ...] = (128,)
    n_depth: tuple[int, ...] = (0,)
    n_ubatch: int = 512
    n_batch: int = 2048
    repetitions: int = 5
    bench_repetitions: int = 0
    warmup: bool = True
    n_ubatch_given: int = 0

    def __post_init__(self):
        # a negative token count is no test llama-bench can run; tests() skips only zeros (the
        # Python API had dropped a negative prompt silently: fresh-user round 8)
        for name in ("n_prompt", "n_gen", "n_depth"):
            odd = next((v for v in getattr(self, name) if isinstance(v, bool) or not isinstance(v, numbers.Integral)), None)
            if odd is not None:
                raise ValueError(f"Workload.{name}: {odd!r} is not a whole number of tokens")
            bad = next((v for v in getattr(self, name) if v < 0), None)
            if bad is not None:
                raise ValueError(f"Workload.{name}: {bad} is negative (token counts are >= 0)")
        # no ubatch of 0 tokens, no run of 0 repetitions (a NaN t/s: fresh-user round 9)
        for name, low in (("n_ubatch", 1), ("n_batch", 1), ("repetitions", 1), ("bench_repetitions", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"Workload.{name}: {getattr(self, name)} is below {low}")

    def tests(self) -> list[BenchTest]:
        out = [BenchTest(p, 0, d) for p in self.n_prompt if p > 0 for d in self.n_depth]
        out += [BenchTest(0, n, d) for n in self.n_gen if n > 0 for d in self.n_depth]
        return out


def workload_from_fields(w: Fields) -> Workload:
    """A ``[workload]`` table (llama-bench's test matrix; sizes bounded by :mod:`sim.bounds`)."""
    from sim.bounds import REPETITIONS_MAX, TOKENS_MAX

    n_ubatch = w.int("n_ubatch", 512, min=1, max=TOKENS_MAX)
    n_batch = w.int("n_batch", 2048, min=1, max=TOKENS_MAX)
    wl = Workload(
        n_prompt=w.int_list("n_prompt", (512,), min=0, max=TOKENS_MAX),
        n_gen=w.int_list("n_gen", (128,), min=0, max=TOKENS_MAX),
        n_depth=w.int_list("n_depth", (0,), min=0, max=TOKENS_MAX),
        n_ubatch=min(n_ubatch, n_batch),  # llama.cpp clamps ubatch to batch
        n_batch=n_batch,
        repetitions=w.int("repetitions", 5, min=1, max=REPETITIONS_MAX),
        n_ubatch_given=n_ubatch if n_ubatch > n_batch else 0,
    )
    if not wl.tests():
        raise w.error("n_prompt", "no test to run: every -p and -n value is 0")
    return wl


# --------------------------------------------------------------------------------------
# Variant
# --------------------------------------------------------------------------------------

#: values of ``Variant.expert_cache``: no cache, an LRU or LFU cache in whatever VRAM is left
#: (``placement.expert_cache_experts`` may cap it), or ``"fit"``: an LRU cache whose pool is
#: what llama.cpp's fit leaves, the free VRAM minus the fit target (:func:`sim.model.vram.account`)
CACHE_POLICIES = ("none", "lru", "lfu", "fit")


@dataclass(frozen=True)
class Variant:
    """A scheduler policy to evaluate.

    Attributes:
        name: label shown in reports.
        prefetch_weights: ungated weight prefetch (``--prefetch-weights``): the next split's
            whole host weights are copied on a second stream during the current split.
        gate_min_batch: MoE-batch gate: in a graph with MoE ops, prefetch is off when the
            ubatch has fewer tokens than this (None, or 0 as the patch's ``-pwg 0``: ungated).
        expert_slots: staging slots of ``--prefetch-experts-slots N`` (0 = off). Fires when
            tokens * top-k >= 2 * n_expert (prefill only).
        expert_cache: GPU expert cache, ``"none"``, ``"lru"``, ``"lfu"``, or ``"fit"``: an LRU
            cache whose pool is the VRAM left after resident weights, KV cache, compute buffer
            and staging minus the fit target (``placement.fit_target_mib``, llama.cpp's
            ``-fitt``); see :func:`sim.model.vram.account`.
        selective_copy: copy only the experts the ubatch uses (upstream ggml behaviour);
            false copies whole expert tensors (the control in docs/DESIGN.md).
    """

    name: str = "baseline"
    prefetch_weights: bool = False
    gate_min_batch: int | None = None
    expert_slots: int = 0
    expert_cache: str = "none"
    selective_copy: bool = True

    @property
    def any_prefetch(self) -> bool:
        return self.prefetch_weights or self.expert_slots > 0

    @property
    def is_baseline(self) -> bool:
        return not self.any_prefetch and self.expert_cache == "none" and self.selective_copy

    @property
    def cache_policy(self) -> str:
        """The eviction policy of the expert cache (:mod:`sim.plan.cache`): ``"lru"`` for the
        fitted pool, else :attr:`expert_cache`."""
        return "lru" if self.expert_cache == "fit" else self.expert_cache


_VARIANT_TOKEN = re.compile(
    r"(?P<baseline>baseline)$|(?P<ungated>prefetch_ungated|prefetch_weights|prefetch)$"
    r"|(?:prefetch_gated_?|gated_?)(?P<gate>\d+)$|(?:prefetch_experts_slots_?|slots_?)(?P<slots>\d+)$"
    r"|cache_(?P<cache>lru|lfu|fit)$|(?P<nosel>no_selective_copy|baseline_without_selective_copy|whole_copy)$",
    re.ASCII,   # ASCII digits only (``\d`` takes any Unicode digit: ``slots２`` ran as slots2)
)


def parse_variant(text: str, *, file: str | Path | None = None, field_name: str = "variant") -> Variant:
    """Parse a variant label such as ``baseline``, ``prefetch_ungated``,
    ``prefetch_gated_512``, ``slots3``, ``cache_lru``, ``cache_fit`` (an LRU cache sized by the
    fit), ``baseline_without_selective_copy`` or a ``+``-joined combination (``slots3+cache_lru``).

    Raises:
        ScenarioError: an unknown token, naming ``field_name`` in ``file``.
    """
    from sim.bounds import TOKENS_MAX

    kw: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for tok in text.strip().lower().split("+"):
        mt = _VARIANT_TOKEN.match(tok.strip())
        if not mt:
            raise ScenarioError(
                f"unknown variant '{tok}' (use baseline, prefetch_ungated, prefetch_gated_<N>, "
                "slots<N>, cache_lru, cache_lfu, cache_fit, baseline_without_selective_copy, joined with +)",
                file=file, field=field_name)
        group = next(g for g in ("baseline", "ungated", "gate", "slots", "cache", "nosel") if mt[g])
        group = "prefetch" if group in ("ungated", "gate") else group
        if group == "baseline" and len(text.split("+")) > 1:
            raise ScenarioError(f"'baseline' is the upstream scheduler and cannot be combined ('{text}')",
                                file=file, field=field_name)
        if group in seen:
            raise ScenarioError(f"'{seen[group]}' and '{tok}' contradict each other in '{text}'",
                                file=file, field=field_name)
        seen[group] = tok
        if mt["ungated"]:
            kw["prefetch_weights"] = True
        elif mt["gate"]:
            kw["prefetch_weights"] = True
            kw["gate_min_batch"] = int(mt["gate"])
            if kw["gate_min_batch"] > TOKENS_MAX:   # as a [[variant]] table's gate_min_batch
                raise ScenarioError(f"'{tok}': the gate's batch must be at most {TOKENS_MAX} tokens",
                                    file=file, field=field_name)
        elif mt["slots"]:
            n = int(mt["slots"])
            if n < 1:
                raise ScenarioError("slots must be >= 1", file=file, field=field_name)
            kw["expert_slots"] = n
        elif mt["cache"]:
            kw["expert_cache"] = mt["cache"]
        elif mt["nosel"]:
            kw["selective_copy"] = False
    if kw.get("gate_min_batch") == 0:   # a gate at 0 tokens gates nothing: ungated prefetch
        del kw["gate_min_batch"]
    return Variant(name=variant_label(**kw), **kw)


def variant_label(prefetch_weights: bool = False, gate_min_batch: int | None = None, expert_slots: int = 0,
                  expert_cache: str = "none", selective_copy: bool = True) -> str:
    """The canonical label of a policy (what the rows' variant column and build id name): one
    name per policy whatever the spelling :func:`parse_variant` read (``gated512``,
    ``prefetch_gated_512`` and ``PREFETCH_GATED_0512`` are ``prefetch_gated_512``; ``slots03``
    is ``slots3``; ``prefetch_gated_0`` gates nothing and is ``prefetch_ungated``), its parts in
    one order: prefetch, slots, cache, whole copy (``cache_lru+slots3`` is ``slots3+cache_lru``);
    ``baseline`` for the upstream scheduler."""
    parts = []
    if prefetch_weights:
        parts.append("prefetch_ungated" if gate_min_batch is None else f"prefetch_gated_{gate_min_batch}")
    if expert_slots:
        parts.append(f"slots{expert_slots}")
    if expert_cache != "none":
        parts.append(f"cache_{expert_cache}")
    if not selective_copy:
        parts.append("baseline_without_selective_copy")
    return "+".join(parts) or "baseline"


def variant_from_fields(v: Fields) -> Variant:
    """A ``[[variant]]`` table: ``spec = "slots3"`` (and a ``name``) or a name with its fields."""
    from sim.bounds import COUNT_MAX, TOKENS_MAX

    if v.has("name") and not v.str("name").strip():   # the rows' variant column and build id
        raise v.error("name", "must not be empty (the rows' variant column)")
    if v.has("name"):
        name = v.str("name")
        if name != name.strip() or any(not c.isprintable() for c in name):
            raise v.error("name", f"{name!r}: no spaces around it and no control characters (it is the rows' "
                                  "variant column and build id)")
    if v.has("spec"):
        var = parse_variant(v.str("spec"), file=v.file, field_name=v.name("spec"))
        var = replace(var, name=v.str("name", var.name))
        v.check_unknown()
        return _checked_name(var, v)
    if not v.has("name"):
        raise v.error("spec", "a [[variant]] needs spec (e.g. spec = 'slots3') or a name with its fields")
    policy = ("prefetch_weights", "gate_min_batch", "expert_slots", "expert_cache", "selective_copy")
    if not any(v.has(f) for f in policy):
        # a name alone would be the upstream scheduler under another name (its rows at +0.0 %)
        raise v.error("spec", f"variant '{v.str('name')}' has neither spec nor a policy field "
                              f"({', '.join(policy)}); give spec = 'baseline' for the upstream scheduler by name")
    # 0: never gated (ungated prefetch, as prefetch_gated_0 and the patch's -pwg 0)
    gate = v.int("gate_min_batch", None, min=0, max=TOKENS_MAX) if v.has("gate_min_batch") else None
    var = Variant(
        name=v.str("name"),
        prefetch_weights=v.bool("prefetch_weights", gate is not None),
        gate_min_batch=gate or None,   # a gate at 0 gates nothing (parse_variant's prefetch_gated_0)
        expert_slots=v.int("expert_slots", 0, min=0, max=COUNT_MAX),
        expert_cache=v.str("expert_cache", "none", choices=CACHE_POLICIES),
        selective_copy=v.bool("selective_copy", True),
    )
    v.check_unknown()
    return _checked_name(var, v)


def _checked_name(var: Variant, v: Fields) -> Variant:
    """``var`` with its name checked against the standard labels: a name that :func:`parse_variant`
    reads as another policy (``name = "slots3"`` on a prefetch) is refused, naming the field; one
    that reads as this very policy in another spelling (``gated512``) becomes its canonical label
    (:func:`variant_label`), so one policy has one build id."""
    try:
        std = parse_variant(var.name)
    except ScenarioError:
        return var          # a name of the user's own
    if std.name == "baseline":
        return var          # reserved for the upstream scheduler: check_distinct_variants says so
    if replace(std, name=var.name) != var:
        raise v.error("name", f"'{var.name}' is the standard label of another policy ({std.name}): its rows and "
                              "build id would claim that policy; choose a name of your own")
    return replace(var, name=std.name)


def check_distinct_variants(variants, *, file=None, field: str = "variant") -> None:
    """Two variants with the same policy under different names would run the same plan twice.

    Raises:
        ScenarioError: naming both.
    """
    seen: dict[tuple, str] = {}
    for v in variants:
        key = (v.prefetch_weights, v.gate_min_batch, v.expert_slots, v.expert_cache, v.selective_copy)
        if key in seen:
            raise ScenarioError(f"variants '{seen[key]}' and '{v.name}' are the same policy (it would run twice)",
                                file=file, field=field)
        seen[key] = v.name


DEFAULT_VARIANTS = ("baseline", "prefetch_ungated", "prefetch_gated_512", "slots3")


# --------------------------------------------------------------------------------------
# Scenario
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """A complete what-if: model, hardware, placement, workload, routing, variants, seed.

    Attributes:
        routing: a :class:`sim.model.routing.RoutingSpec`.
        compute_buffer_bytes: per-GPU compute buffer; None = estimated (see :mod:`sim.model.vram`).
    """

    name: str
    model: ModelSpec
    hardware: HardwareProfile
    placement: Placement
    workload: Workload
    routing: Any
    variants: tuple[Variant, ...]
    seed: int = 0
    compute_buffer_bytes: float | None = None
    file: str | None = None

    def __post_init__(self) -> None:
        # the routing draws' seed (numpy's SeedSequence takes integers >= 0); the TOML's
        # scenario.seed is checked where it is read, this guards the Python API (replace(scn, seed=-1))
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise ScenarioError(f"expected an integer >= 0, got {self.seed!r}", file=self.file, field="scenario.seed")

    def with_(self, **changes: Any) -> Scenario:
        return replace(self, **changes)


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario TOML that names a model and a hardware file (relative to itself).
    ``path`` as the command line takes it: a file, or a built-in name (``"default"``,
    ``"laguna-2x3090"``; :func:`sim.resources.resolve_scenario`).

    Raises:
        ScenarioError: naming the file and field of any missing or invalid value, in the
            scenario or in the files it names; an unknown built-in name (listing them).
    """
    from sim.resources import resolve_field, resolve_scenario
    from sim.model.routing import routing_from_fields

    from sim.bounds import BYTES_MAX

    if isinstance(path, str) and not path.strip():
        raise ScenarioError("empty path: give a scenario file or a built-in name (e.g. 'default')", field="scenario")
    if isinstance(path, str):
        path = resolve_scenario(path)   # the built-in names too, as the CLI (fresh-user round 10)

    if Path(path).is_file() and _is_gguf(Path(path)):
        raise ScenarioError("is a GGUF model, not a scenario: give it with -m/--model (prefetch-sim run -m FILE; the "
                            "scenario names the hardware and placement)", file=path)
    data = load_toml(path)
    f = Fields(data, path)
    if "scenario" not in data and "model" in data:
        raise ScenarioError("is a model TOML ([model]), not a scenario: give it with -m/--model (the scenario "
                            "names its hardware and placement)", file=path, field="scenario")
    if "scenario" not in data and "hardware" in data:
        raise ScenarioError("is a hardware profile TOML ([hardware]), not a scenario: name it as a scenario's "
                            "hardware", file=path, field="scenario")
    s = f.sub("scenario", required=True)
    name = s.str("name")
    if not name.strip():
        raise s.error("name", "must not be empty (reports and figures name the scenario by it)")
    # a bare name (no .toml/.gguf) with no such file beside the scenario: a shipped file (sim.resources)
    model_path = resolve_field("model", s.str("model"), s.path("model"), file=path, field=s.name("model"))
    hw_path = resolve_field("hardware", s.str("hardware"), s.path("hardware"), file=path, field=s.name("hardware"))
    for key, p in (("model", model_path), ("hardware", hw_path)):
        if p.is_dir():
            raise s.error(key, f"is a folder, expected a {'TOML or GGUF' if key == 'model' else 'TOML'} file: {p}")
        if p.exists() and not p.is_file():
            raise s.error(key, f"not a regular file (a device, FIFO or socket cannot be an input): {p}")
        if not p.is_file():
            raise s.error(key, f"file not found: {p}")
    seed = s.int("seed", 0, min=0)
    cbuf = s.float("compute_buffer_mib", None, min=0, max=BYTES_MAX / 2**20) if s.has("compute_buffer_mib") else None
    s.check_unknown()
    model = load_model(model_path)
    hardware = load_hardware(hw_path)
    pl_fields = f.sub("placement")
    placement = placement_from_fields(pl_fields)
    pl_fields.check_unknown()
    if placement.n_cpu_moe > model.n_layer:
        raise pl_fields.error("n_cpu_moe", f"exceeds the model's {model.n_layer} layers")
    if placement.n_cpu_moe and model.moe is None:
        raise pl_fields.error("n_cpu_moe", f"model '{model.name}' has no experts")
    if model.moe is not None and placement.expert_cache_experts > model.moe.n_expert * model.n_layer:
        raise pl_fields.error("expert_cache_experts",
                              f"{placement.expert_cache_experts} entries exceed the model's {model.moe.n_expert} "
                              f"experts × {model.n_layer} layers = {model.moe.n_expert * model.n_layer} "
                              "(the cache counts one expert of one layer per entry)")
    if len(placement.fit_target_mib) > hardware.n_gpu:
        raise pl_fields.error("fit_target_mib", f"{plural(len(placement.fit_target_mib), 'value')} for the {hardware.n_gpu} "
                                                f"GPU(s) of hardware '{hardware.name}' (one value applies to every GPU)")
    if len(placement.tensor_split) > hardware.n_gpu:
        raise pl_fields.error("tensor_split", f"{plural(len(placement.tensor_split), 'share')} for the {hardware.n_gpu} GPU(s) "
                                              f"of hardware '{hardware.name}'")
    for i, (_rx, buf) in enumerate(placement.override_tensor):
        dev = re.fullmatch(r"(?:CUDA|GPU)(\d*)", buf)
        if dev and int(dev.group(1) or 0) >= hardware.n_gpu:
            raise ScenarioError(f"buffer {buf}: hardware '{hardware.name}' has {hardware.n_gpu} GPU(s) "
                                f"(CUDA0..CUDA{hardware.n_gpu - 1})", file=path,
                                field=f"{pl_fields.name('override_tensor')}[{i}]")
    wl_fields = f.sub("workload")
    workload = workload_from_fields(wl_fields)
    wl_fields.check_unknown()
    routing = routing_from_fields(f.sub("routing"), model)
    variants: list[Variant] = []
    raw_vars = f.raw("variant", None)
    if raw_vars is None:
        variants = [parse_variant(v) for v in DEFAULT_VARIANTS]
    else:
        if not isinstance(raw_vars, list):
            raise f.error("variant", "expected [[variant]] tables")
        if not raw_vars:
            raise f.error("variant", "an empty list runs nothing: leave variant out for the standard four, or "
                                     "give [[variant]] tables")
        for i, tbl in enumerate(raw_vars):
            vf = Fields(tbl, path, f"variant[{i}]")
            variants.append(variant_from_fields(vf))
    names = [v.name for v in variants]
    for i, v in enumerate(variants):
        if v.name == "baseline" and not v.is_baseline:
            raise ScenarioError("the name 'baseline' is reserved for the upstream scheduler (speedups are "
                                "measured against it); name this variant otherwise", file=path,
                                field=f"variant[{i}].name")
    if len(set(names)) != len(names):
        raise f.error("variant", f"duplicate variant names: {names}")
    check_distinct_variants(variants, file=path)
    f.check_unknown()
    return Scenario(
        name=name, model=model, hardware=hardware, placement=placement, workload=workload,
        routing=routing, variants=tuple(variants), seed=seed,
        compute_buffer_bytes=None if cbuf is None else cbuf * 2**20, file=str(path),
    )
