"""Matmul and attention shapes of the shipped models, swept by the calibration.

A GEMM shape is ``(n, k)``: ``n`` output features and ``k`` input features of a weight
(``ggml`` ``ne[1]`` and ``ne[0]``); the token count ``m`` is swept separately. Sources: the
models' Hugging Face ``config.json`` files (hidden size, head counts, head dim, FFN sizes),
as quoted in the calibration brief; laguna's attention geometry is not published, so only its
expert FFN shapes are swept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShapes:
    """The layer geometry of one model.

    Attributes:
        name: model label (used to hold out one model when validating the roofline fit).
        d_model: embedding size.
        q_out: output features of the Q projection (``n_head * head_dim``), 0 if unknown.
        kv_out: output features of the K and V projections (``n_head_kv * head_dim``).
        n_ff: hidden size of the FFN (dense) or of one expert (MoE).
        n_head, n_head_kv, head_dim: attention geometry (0 if unknown).
        n_expert, n_expert_used: MoE experts and top-k (0 for dense).
    """

    name: str
    d_model: int
    q_out: int
    kv_out: int
    n_ff: int
    n_head: int = 0
    n_head_kv: int = 0
    head_dim: int = 0
    n_expert: int = 0
    n_expert_used: int = 0

    extra_gemms: tuple[tuple[str, int, int], ...] = ()

    def gemm_shapes(self) -> list[tuple[str, int, int]]:
        """``(role, n, k)`` of every distinct weight matmul of one layer (and of
        ``extra_gemms``: the router, the output head)."""
        d = self.d_model
        out: list[tuple[str, int, int]] = []
        if self.q_out:
            out += [("attn_q", self.q_out, d), ("attn_kv", self.kv_out, d), ("attn_output", d, self.q_out),
                    ("attn_qkv", self.q_out + 2 * self.kv_out, d)]
        role = "ffn_exp" if self.n_expert else "ffn"
        out += [(f"{role}_gate_up", self.n_ff, d), (f"{role}_down", d, self.n_ff)]
        out += list(self.extra_gemms)
        seen: set[tuple[int, int]] = set()
        uniq = []
        for r, n, k in out:
            if (n, k) not in seen:
                seen.add((n, k))
                uniq.append((r, n, k))
        return uniq


def from_spec(spec, name: str | None = None) -> ModelShapes:
    """The shapes of a :class:`sim.model.specs.ModelSpec` (a shipped model TOML): every distinct
    ``(n_out, n_in)`` of its weight matrices except ``token_embd`` (a row lookup, not a
    matmul; norms and biases are no matmul either) — attention projections, dense and expert FFNs, shared experts, the router and
    the output head."""
    moe = spec.moe
    # the plan builder fuses q, k and v into one GEMM when they live together
    qkv = [t for t in spec.tensors if t.layer == 0 and t.group in ("attn_q", "attn_k", "attn_v")]
    extra = [("attn_qkv", sum(t.n_out for t in qkv), spec.d_model)] if len(qkv) == 3 else []
    if moe is not None and moe.n_expert_shared:
        extra.append(("ffn_gate_up_shexp", 2 * moe.n_ff_shexp, spec.d_model))
    seen = {(n, k) for _r, n, k in extra}
    for t in spec.tensors:
        if t.group == "embd" or not t.is_matrix or (t.n_out, t.n_in) in seen:
            continue
        seen.add((t.n_out, t.n_in))
        extra.append((t.group, t.n_out, t.n_in))
    return ModelShapes(
        name=name or spec.name, d_model=spec.d_model, q_out=0, kv_out=0,
        n_ff=moe.n_ff_exp if moe else spec.n_ff, n_head=spec.n_head, n_head_kv=spec.n_head_kv,
        head_dim=spec.head_dim, n_expert=moe.n_expert if moe else 0,
        n_expert_used=moe.n_expert_used if moe else 0, extra_gemms=tuple(extra))


def shipped_models(models_dir: str = "scenarios/models") -> tuple[ModelShapes, ...]:
    """:func:`from_spec` of every ``*.toml`` in ``models_dir`` (none if it does not exist): a
    relative ``models_dir`` missing from the working folder is the shipped copy
    (:func:`sim.resources.cwd_or_shipped`), so a calibration from any folder covers the shipped models.

    Raises:
        ScenarioError: a malformed model file.
    """
    from sim.resources import cwd_or_shipped  # noqa: PLC0415
    from sim.model.specs import load_model  # noqa: PLC0415

    d = cwd_or_shipped(models_dir)
    if not d.is_dir():
        return ()
    return tuple(from_spec(load_model(p), name=p.stem) for p in sorted(d.glob("*.toml")))


#: the models of the calibration brief (see the module docstring for sources); the sweep
#: adds the shipped model files (:func:`shipped_models`)
MODELS: tuple[ModelShapes, ...] = (
    ModelShapes("qwen3-30b-a3b", 2048, 4096, 512, 768, 32, 4, 128, 128, 8),
    ModelShapes("gpt-oss-20b", 2880, 4096, 512, 2880, 64, 8, 64, 32, 4),
    ModelShapes("gemma3-27b", 5376, 4096, 2048, 21504, 32, 16, 128),
    ModelShapes("mixtral-8x7b", 4096, 4096, 1024, 14336, 32, 8, 128, 8, 2),
    ModelShapes("laguna", 4096, 0, 0, 640, 0, 0, 0, 256, 10),
)

#: token counts of the GEMM sweep: powers of two 1..16384 and a few between
GEMM_TOKENS: tuple[int, ...] = tuple(sorted(
    {2**i for i in range(15)} | {3, 24, 48, 96, 384, 768, 1536, 3072, 6144, 12288}))

#: a short sweep for ``--quick`` runs and tests
GEMM_TOKENS_QUICK: tuple[int, ...] = (1, 16, 256, 4096)


def gemm_sweep(models=MODELS) -> list[tuple[str, str, int, int]]:
    """``(model, role, n, k)`` for every distinct ``(n, k)``; a shape shared by two models is
    listed under the first."""
    seen: set[tuple[int, int]] = set()
    out = []
    for m in models:
        for role, n, k in m.gemm_shapes():
            if (n, k) in seen:
                continue
            seen.add((n, k))
            out.append((m.name, role, n, k))
    return out


def attn_shapes(models=MODELS) -> list[tuple[str, int, int, int]]:
    """``(model, n_head, n_head_kv, head_dim)`` of the models with known attention geometry,
    deduplicated."""
    seen = set()
    out = []
    for m in models:
        key = (m.n_head, m.n_head_kv, m.head_dim)
        if m.n_head and key not in seen:
            seen.add(key)
            out.append((m.name, *key))
    return out


def moe_configs(models=MODELS) -> list[tuple[str, int, int, int, int]]:
    """``(model, n_expert, top_k, n, k)`` of each MoE model's expert gate/up matmul,
    deduplicated."""
    seen = set()
    out = []
    for m in models:
        key = (m.n_expert, m.n_expert_used, m.n_ff, m.d_model)
        if m.n_expert and key not in seen:
            seen.add(key)
            out.append((m.name, *key))
    return out


#: the output head (``output``, n = vocabulary) computes logits for the last token of a
#: prompt only (llama.cpp outputs one row per sequence in prompt processing), so it is swept
#: up to this many tokens
OUTPUT_MAX_TOKENS = 512


def gemm_points(shapes, tokens) -> list[tuple[str, str, int, int, int]]:
    """``(model, role, n, k, m)`` of the GEMM sweep: every shape at every token count, the
    output head only up to :data:`OUTPUT_MAX_TOKENS`."""
    return [(model, role, n, k, m) for model, role, n, k in shapes for m in tokens
            if role != "output" or m <= OUTPUT_MAX_TOKENS]
