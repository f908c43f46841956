"""The llama.cpp kernel-table cost model (sim.model.ggmlcost) and its profile."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.errors import PrefetchSimError, ScenarioError
from sim.model.ggmlcost import (GgmlKernels, KV_PAD, graph_kernels, interp_nb_kv, layer_elementwise, mask_bytes, mask_entries,
                          read_table, table_from_perf)
from sim.model.specs import BenchTest, load_hardware, load_model

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "scenarios/hardware/h200-llamacpp.toml"
NCU = REPO / "data/llamacpp/h200-20261201-kernels/ncu"


def _kernels(**kw) -> GgmlKernels:
    rows = [
        # a Q4_K weight (m=1024, k=1024) at 16..256 tokens, and a cold case over 64 copies
        *[dict(backend="gpu", op="MUL_MAT", type="Q4_K", m=1024, n=n, k=1024, bs=1, nr=1, t_us=t)
          for n, t in ((16, 10.0), (64, 20.0), (256, 80.0))],
        dict(backend="gpu", op="MUL_MAT", type="Q4_K", m=1024, n=1, k=1024, bs=64, nr=1, t_us=64.0),
    ]
    tab = pd.DataFrame(rows).reindex(columns=["backend", "op", "type", "m", "n", "k", "bs", "nr", "hd", "nh", "nkv",
                                              "kv", "nb", "t_us"])
    args = dict(gpu=tab, cpu=None, l2_bytes=50 * 2**20, floor_s=2e-6, ew_bytes_per_s=1e12, cpu_op_s=5e-6,
                cpu_ew_bytes_per_s=50e9, graph_s=0.0, split_s=0.0)
    args.update(kw)
    return GgmlKernels(**args)


def test_interp_nb_kv_is_linear_in_kv_and_a_power_law_between_token_counts():
    rows = {1: (np.array([256.0, 1256.0]), np.array([1e-5, 2e-5])), 100: (np.array([256.0, 1256.0]), np.array([1e-3, 3e-3]))}
    assert interp_nb_kv(rows, 1, 756) == pytest.approx(1.5e-5)           # halfway along kv
    assert interp_nb_kv(rows, 1, 2256) == pytest.approx(3e-5)            # the last slope, beyond
    assert interp_nb_kv(rows, 10, 256) == pytest.approx(1e-4)            # geometric mean of 1e-5 and 1e-3
    assert interp_nb_kv(rows, 200, 256) == pytest.approx(2e-3)           # linear in queries above the table
    one = {64: (np.array([256.0]), np.array([4e-6]))}
    assert interp_nb_kv(one, 64, 512) == pytest.approx(8e-6) and interp_nb_kv(one, 64, 128) == pytest.approx(4e-6)


def test_matvec_is_two_floors_plus_the_cold_bytes_and_mmq_the_measured_curve():
    k = _kernels()
    from sim.model.quant import ggml_nbytes

    b = ggml_nbytes("Q4_K", 1024 * 1024)
    cold = b * 64 / 64e-6
    assert k.cold_rate("gpu", "Q4_K") == pytest.approx(cold)
    assert k.cold_rate("gpu", "Q6_K") == pytest.approx(cold)  # an unmeasured type: the median of the others
    # n <= 8 (MMVQ): quantisation + matvec kernels, the matvec no faster than its bytes cold
    assert b / cold < 2e-6  # 1 us: below the floor, so two floors
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 1, b) == pytest.approx(4e-6)
    big = 10 * b  # 10 us cold: the matvec kernel takes its bytes, the quantisation a floor
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 4, big) == pytest.approx(2e-6 + big / cold)
    # n > 8 (MMQ): the table at its points, log-log between, linear beyond
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 64, b) == pytest.approx(20e-6)
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 32, b) == pytest.approx(math.sqrt(10e-6 * 20e-6))
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 512, b) == pytest.approx(160e-6)
    # another shape of the type: scaled by m*k from the nearest measured one
    assert k.matmul_s("gpu", "Q4_K", 2048, 1024, 64, 2 * b) == pytest.approx(40e-6)
    # a quantised type without a case: its family's measured type (test_an_unmeasured_type_...)
    assert k.matmul_s("gpu", "IQ2_XS", 1024, 1024, 64, b) == pytest.approx(20e-6)
    assert k.matmul_s("gpu", "BF16", 1024, 1024, 64, b) is None  # a float type: the caller's roofline


def _proxy_kernels() -> GgmlKernels:
    """Dense curves of Q4_K (t), Q6_K (2t) and Q8_0 (t/2) on one shape, Q4_K's and Q6_K's expert
    curves (3t, 6t), and cold cases of the three (Q8_0 twice Q4_K's rate)."""
    rows = []
    for ty, f in (("Q4_K", 1.0), ("Q6_K", 2.0), ("Q8_0", 0.5)):
        rows += [dict(backend="gpu", op="MUL_MAT", type=ty, m=1024, n=n, k=1024, bs=1, nr=1, t_us=f * t)
                 for n, t in ((16, 10.0), (64, 20.0), (256, 80.0))]
        rows.append(dict(backend="gpu", op="MUL_MAT", type=ty, m=1024, n=1, k=1024, bs=64, nr=1,
                         t_us=64.0 * (0.5 if ty == "Q8_0" else 1.0)))
    for ty, f in (("Q4_K", 3.0), ("Q6_K", 6.0)):
        rows += [dict(backend="gpu", op="MUL_MAT_ID", type=ty, m=1024, n=n, k=1024, bs=1, nr=8, nkv=64, t_us=f * t)
                 for n, t in ((16, 10.0), (64, 20.0), (256, 80.0))]
    tab = pd.DataFrame(rows).reindex(columns=["backend", "op", "type", "m", "n", "k", "bs", "nr", "hd", "nh", "nkv",
                                              "kv", "nb", "t_us"])
    return GgmlKernels(gpu=tab, cpu=None, l2_bytes=50 * 2**20, floor_s=2e-6, ew_bytes_per_s=1e12, cpu_op_s=5e-6,
                       cpu_ew_bytes_per_s=50e9, graph_s=0.0, split_s=0.0)


def test_an_unmeasured_quantised_type_is_priced_from_its_family_not_the_roofline():
    """A weight type the kernel tables have no case of had fallen back to the generic roofline,
    which put a Q5_K_M Qwen3-30B-A3B prefill at 11.3k t/s against Q4_K_M's 5.9k and a Q8_0 one
    at 11.9k (its experts: Q8_0 has dense cases but no MUL_MAT_ID case). Now: a K-quant between
    Q4_K and Q6_K on bits per weight (log time), a legacy block type from Q8_0, other quantised
    types from Q4_K, experts of a family without an expert case from Q4_K's expert curve times
    the dense ratio; float types keep the roofline (None)."""
    from sim.model.quant import bpw_of

    k = _proxy_kernels()
    w6 = (bpw_of("Q5_K") - bpw_of("Q4_K")) / (bpw_of("Q6_K") - bpw_of("Q4_K"))
    mix = k.proxy_mix("MUL_MAT", "Q5_K")
    assert [p for p, _w in mix] == ["Q4_K", "Q6_K"] and [w for _p, w in mix] == pytest.approx([1 - w6, w6])
    assert k.proxy_mix("MUL_MAT", "Q2_K") == (("Q4_K", 1.0),)     # below Q4_K's bits: Q4_K alone
    assert k.proxy_mix("MUL_MAT", "Q4_0") == (("Q8_0", 1.0),)     # a legacy block type
    assert k.proxy_mix("MUL_MAT", "IQ4_XS") == (("Q4_K", 1.0),)
    assert k.proxy_mix("MUL_MAT", "Q4_K") == () and k.proxy_mix("MUL_MAT", "BF16") == ()
    assert k.proxy_mix("MUL_MAT_ID", "Q8_0") == ()                # no expert case in its family
    # MMQ: the geometric interpolation of the family's curves at the same shape and tokens
    assert k.matmul_s("gpu", "Q5_K", 1024, 1024, 64, 0) == pytest.approx(20e-6 * 2.0 ** w6)
    assert k.matmul_s("gpu", "Q4_0", 1024, 1024, 64, 0) == pytest.approx(10e-6)
    # a matvec: the bytes at the proxies' cold rate (Q4_0: Q8_0's, above Q4_K's; Q5_K: between)
    big = 100e6
    assert k.cold_rate("gpu", "Q8_0") > k.cold_rate("gpu", "Q4_K")
    assert k.matmul_s("gpu", "Q4_0", 1024, 1024, 1, big) == pytest.approx(2e-6 + big / k.cold_rate("gpu", "Q8_0"))
    rate5 = k.cold_rate("gpu", "Q4_K") ** (1 - w6) * k.cold_rate("gpu", "Q6_K") ** w6
    assert k.moe_s("gpu", "Q5_K", 1024, 1024, 1, 8, big) == pytest.approx(2e-6 + big / rate5)
    # experts: Q5_K between Q4_K's and Q6_K's expert curves; Q8_0 (dense cases only) as Q4_K's
    # expert curve times the dense Q8_0 / Q4_K ratio (1/2)
    assert k.moe_s("gpu", "Q5_K", 1024, 1024, 64, 8, 0) == pytest.approx(60e-6 * 2.0 ** w6)
    assert k.moe_s("gpu", "Q8_0", 1024, 1024, 64, 8, 0) == pytest.approx(30e-6)
    assert k.moe_s("gpu", "BF16", 1024, 1024, 64, 8, 0) is None
    # each lies between the measured types it comes from
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 256, 0) < k.matmul_s("gpu", "Q5_K", 1024, 1024, 256, 0) \
        < k.matmul_s("gpu", "Q6_K", 1024, 1024, 256, 0)


def test_a_weight_above_the_l2_is_not_priced_from_a_smaller_l2_hot_case_scaled_up():
    """A matvec on a weight larger than the L2 takes the table's curve when that curve's case was
    read cold itself; a case that fit in the L2 ran launch-bound, and scaled by m*k to a larger
    weight it had priced Llama-8B's Q8_0 FFN (4096x14336, 62 MB) at 1.47 TB/s from gpt-oss's
    12.5 MB 2880x4096 case, half Q8_0's measured cold rate (3.0 TB/s), so a dense F16 decode
    (the roofline) came out faster than Q8_0 (fresh-user round 5). Now its cold rate prices it;
    a weight whose nearest case is itself above the L2 (Gemma's 5376x21504 Q4_K, gpt-oss's
    201088x2880 Q8_0 output) keeps the measured curve."""
    from sim.model.quant import ggml_nbytes

    g = load_hardware(PROFILE).ggml
    for ty, m, k in (("Q8_0", 14336, 4096), ("Q8_0", 4096, 14336)):
        b = ggml_nbytes(ty, m * k)
        assert b > g.l2_bytes
        rate = b / g.matmul_s("gpu", ty, m, k, 1, b)
        assert 0.85 * g.cold_rate("gpu", ty) < rate <= g.cold_rate("gpu", ty)
    # a measured case above the L2 still prices itself (its own cold read, slower than the cold rate)
    b = ggml_nbytes("Q8_0", 201088 * 2880)
    assert g.matmul_s("gpu", "Q8_0", 201088, 2880, 1, b) > 1.2 * b / g.cold_rate("gpu", "Q8_0")


def test_a_large_weight_in_prefill_is_not_priced_from_a_one_token_case():
    """Above the matvec batch (MMQ) a weight takes the nearest curve that was measured there:
    the output heads' cases hold one token only, and taken as the nearest shape in m*k they had
    priced a 512-token matmul of Llama-70B's Q8_0 FFN (28672x8192) or a Q6_K ffn_down as 512
    matvecs, 3 TFLOP/s (fresh-user round 7: Llama-70B Q8_0 pp512 at 28.9 t/s). Every measured
    type at prefill shapes from 20 M to 235 M weights: within the TFLOP/s of its measured MMQ
    curves, and a 512-token ubatch costs far less than 512 one-token ones."""
    from sim.model.quant import ggml_nbytes

    g = load_hardware(PROFILE).ggml
    for ty in ("Q4_K", "Q6_K", "Q8_0"):
        best = max(2.0 * m * k * 512 / g.matmul_s("gpu", ty, m, k, 512, ggml_nbytes(ty, m * k))
                   for (b, op, t, m, k) in g._curves if (b, op, t) == ("gpu", "MUL_MAT", ty) and m * k < 10**8
                   and len(g._curves[(b, op, t, m, k)][0]) > 1)
        for m, k in ((28672, 8192), (8192, 28672), (21504, 5376), (5376, 21504), (14336, 4096), (262144, 5376)):
            b = ggml_nbytes(ty, m * k)
            t1, t512 = g.matmul_s("gpu", ty, m, k, 1, b), g.matmul_s("gpu", ty, m, k, 512, b)
            assert t512 < 512 * t1 / 20, (ty, m, k)
            assert 2.0 * m * k * 512 / t512 > 0.5 * best, (ty, m, k)
    # an output head's own case still prices its one-token matvec, and a few tokens add the
    # column cost to it (the weight is read once), not a whole matvec each
    b = ggml_nbytes("Q6_K", 262144 * 5376)
    t1 = g.matmul_s("gpu", "Q6_K", 262144, 5376, 1, b)
    assert t1 >= math.exp(g._curves[("gpu", "MUL_MAT", "Q6_K", 262144, 5376)][1][0])  # the table's case
    for n in (2, 4, 8):
        tn = g.matmul_s("gpu", "Q6_K", 262144, 5376, n, b)
        assert t1 < tn < t1 + 0.35 * (n - 1) * t1   # linear from its one case: t1 + (n - 1) * t1


def test_an_output_heads_one_token_case_prices_only_its_own_shape():
    """The output heads' cases (one token each) are cold and slow per byte (Q8_0 201088x2880:
    1.72 TB/s, rows of 2880); taken as the nearest shape of a larger FFN they had priced its
    matvec at that rate: Mistral-Small-24B Q8_0 decode 67 t/s on the H200 profile where an H100
    measured 92 (data/llamacpp/h100-20261207-dense3). Another shape's matvec now takes the cold
    rate (or a curve of more than one case); the head itself keeps its case."""
    from sim.model.quant import ggml_nbytes

    g = load_hardware(PROFILE).ggml
    for m, k in ((32768, 5120), (5120, 32768), (28672, 8192), (21504, 5376)):
        b = ggml_nbytes("Q8_0", m * k)
        rate = b / g.matmul_s("gpu", "Q8_0", m, k, 1, b)
        assert rate > 0.85 * g.cold_rate("gpu", "Q8_0"), (m, k)
    b = ggml_nbytes("Q8_0", 201088 * 2880)
    head = math.exp(g._curves[("gpu", "MUL_MAT", "Q8_0", 201088, 2880)][1][0])
    assert g.matmul_s("gpu", "Q8_0", 201088, 2880, 1, b) == pytest.approx(head, rel=1e-12)


def test_a_q5_k_m_or_q8_0_moe_prefill_is_priced_near_q4_k_m_not_twice_it(tmp_path):
    """End to end on the shipped profile: Qwen3-30B-A3B as Q5_K_M and as Q8_0, fully resident
    pp512, against the shipped Q4_K_M file; the roofline had given 1.9x and 2.0x its t/s (every
    measured type's time per weight lies within 0.78-1.25x Q4_K's at one shape)."""
    from sim.engines.metrics import fit_context_to_tests, run_variant_test
    from sim.model.specs import load_scenario, parse_variant

    src = (REPO / "scenarios/models/qwen3-30b-a3b.toml").read_text()
    base = load_scenario(REPO / "scenarios/default.toml")
    t = BenchTest(512, 0)
    tps = {}
    for preset in ("Q4_K_M", "Q5_K_M", "Q8_0"):
        text = src.replace('preset = "Q4_K_M"', f'preset = "{preset}"')
        text = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("attn_v =", "exps_down =")))
        f = tmp_path / f"{preset}.toml"
        f.write_text(text)
        scn = base.with_(model=load_model(f), placement=replace(base.placement, n_cpu_moe=0))
        scn = fit_context_to_tests(scn, [t])
        tps[preset] = float(np.mean(run_variant_test(scn, parse_variant("baseline"), t, 1).tps))
    assert 0.8 < tps["Q5_K_M"] / tps["Q4_K_M"] < 1.0   # more bits, slower kernels: a little slower
    assert 0.8 < tps["Q8_0"] / tps["Q4_K_M"] < 1.25


def test_the_shipped_tables_price_the_measured_cases_exactly():
    hw = load_hardware(PROFILE)
    tab = hw.ggml.gpu
    r = tab[(tab.op == "MUL_MAT") & (tab.type == "Q4_K") & (tab.m == 4096) & (tab.k == 2048) & (tab.n == 512)
            & (tab.bs == 1)].iloc[0]
    assert hw.ggml.matmul_s("gpu", "Q4_K", 4096, 2048, 512, 0) == pytest.approx(r.t_us * 1e-6)
    fa = tab[(tab.op == "FLASH_ATTN_EXT") & (tab.hd == 128) & (tab.nh == 32) & (tab.nkv == 4) & (tab.nb == 512)
             & (tab.kv == 2048)].iloc[0]
    # the table's case (its K/V hot in the L2) plus the graph's cold K/V read
    assert hw.ggml.attn_s("gpu", 512, 2048, 32, 4, 128, True) == pytest.approx(
        fa.t_us * 1e-6 + hw.ggml.kv_cold_s(2048, 4, 128))
    # the unfused attention is its three measured ops plus two elementwise passes: slower here
    assert hw.ggml.attn_s("gpu", 512, 2048, 32, 4, 128, False) > hw.ggml.attn_s("gpu", 512, 2048, 32, 4, 128, True)
    # keys are padded to llama.cpp's 256 cells
    assert hw.ggml.attn_s("gpu", 1, 1, 32, 4, 128, True) == hw.ggml.attn_s("gpu", 1, KV_PAD, 32, 4, 128, True)


def test_elementwise_and_kernel_counts_match_the_ncu_profiles_of_llama_bench():
    """The per-layer kernel list is checked against what ggml-cuda launched in the committed ncu
    profiles of Qwen3-30B-A3B pp512 (ubatch 512, fully resident)."""
    from calibrate.llamacpp.fit import EW_KERNELS
    from sim.plan.builder import graph_items, make_context
    from sim.model.routing import RoutingSpec
    from sim.model.specs import Placement, Scenario, Workload, parse_variant

    model = load_model(REPO / "scenarios/models/qwen3-30b-a3b.toml")
    prof = pd.read_csv(NCU / "qwen3-pp512-ub512-fa1.csv")
    assert prof.kernel.isin(EW_KERNELS).sum() == layer_elementwise(model, 0)[0] * model.n_layer
    hw = load_hardware(PROFILE)
    for fa, name in ((True, "qwen3-pp512-ub512-fa1"), (False, "qwen3-pp512-ub512-fa0")):
        scn = Scenario(name="t", model=model, hardware=hw, placement=Placement(ngl=99, flash_attn=fa),
                       workload=Workload(n_prompt=(512,), n_gen=(0,), n_depth=(0,), n_ubatch=512, n_batch=512,
                                         repetitions=1),
                       routing=RoutingSpec(), variants=(parse_variant("baseline"),))
        ctx = make_context(scn, scn.variants[0], np.random.default_rng(0))
        n = graph_kernels(graph_items(ctx, 512, 0, 0))
        measured = len(pd.read_csv(NCU / f"{name}.csv"))
        assert abs(n / measured - 1) < 0.01, (fa, n, measured)


def _visited_reference(n_tokens: int, kv_len: int, window: int) -> int:
    """Entries visited by a line-by-line transcription of llama.cpp's ``set_input_kq_mask_impl``
    (llama-kv-cache.cpp; one sequence, causal, no ALiBi): the cells hold positions
    ``[kv_len - held, kv_len + n_tokens)`` (the SWA cache only the window's), padded with empty
    cells to the graph's ``n_kv``."""
    held = min(kv_len, window) if window else kv_len
    cells = list(range(kv_len - held, kv_len + n_tokens))
    n_kv = -(-max(len(cells), 1) // KV_PAD) * KV_PAD
    cells += [None] * (n_kv - len(cells))
    pos_min, margin = kv_len, window + 32
    visited, idxs, first = 0, [], True
    for _ in range(n_tokens):
        for jj in range(n_kv):
            if not first:
                if jj >= len(idxs):
                    break
                j = idxs[jj]
            else:
                j = jj
            visited += 1
            p0 = cells[j]
            if p0 is not None and first and p0 + margin >= pos_min:
                idxs.append(j)
        first = False
    return visited


@pytest.mark.parametrize("n_tokens,kv_len", [(1, 0), (1, 8192), (7, 300), (64, 0), (512, 0), (512, 1536),
                                             (300, 5000), (2048, 0)])
def test_mask_entries_match_llamacpps_mask_loop(n_tokens, kv_len):
    gemma = load_model(REPO / "scenarios/models/gemma3-27b.toml")
    qwen = load_model(REPO / "scenarios/models/qwen3-30b-a3b.toml")
    w = gemma.sliding_window
    assert mask_entries(qwen, n_tokens, kv_len) == _visited_reference(n_tokens, kv_len, 0)
    assert mask_entries(gemma, n_tokens, kv_len) == (_visited_reference(n_tokens, kv_len, 0)
                                                     + _visited_reference(n_tokens, kv_len, w))


def test_mask_bytes_are_both_masks_at_the_flash_attention_type():
    gemma = load_model(REPO / "scenarios/models/gemma3-27b.toml")
    qwen = load_model(REPO / "scenarios/models/qwen3-30b-a3b.toml")
    assert mask_bytes(qwen, 100, 300, True) == 512 * 100 * 2  # 400 cells padded to 512, f16
    assert mask_bytes(qwen, 100, 300, False) == 512 * 100 * 4  # f32 without FlashAttention
    w = gemma.sliding_window
    assert mask_bytes(gemma, 512, 8192, True) == 512 * 2 * ((8192 + 512) + -(-(w + 512) // KV_PAD) * KV_PAD)

def test_table_from_perf_normalises_test_backend_ops_output():
    from calibrate.llamacpp.perf_cases import parse_perf

    text = """Backend 1/2: CUDA0
  MUL_MAT(type_a=q4_K,type_b=f32,m=512,n=1,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1):  1000 runs -     8.06 us/run -   2.10 MFLOP/run
  MUL_MAT(type_a=q4_K,type_b=f32,m=5376,n=1,k=21504,bs=[9,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1):  90 runs -   224.26 us/run -   2.10 MFLOP/run
  MUL_MAT(type_a=f16,type_b=f32,m=512,n=128,k=128,bs=[4,1],nr=[8,1],per=[0,1,2,3],k_v=0,o=1):  15 runs -  68.3 us/run - 536.87 MFLOP/run
  MUL_MAT_ID(type_a=q4_K,type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=1,k=2048,amax=1.000000,m_v=0):  27818 runs -  9.03 us/run -  25.17 MFLOP/run
  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=16,nr23=[2,1],kv=512,nb=1,mask=1,sinks=0):  954 runs -   452.03 us/run -   8.39 MFLOP/run
  SOFT_MAX(type=f32,ne=[512,128,1,1],mask=1,sinks=0,m_prec=f32,nr23=[32,1],scale=0.100000):  505 runs -  3248.87 us/run -  16640 kB/run
"""
    t = table_from_perf(parse_perf(text))
    assert list(t.op) == ["MUL_MAT", "MUL_MAT", "MUL_MAT_B", "MUL_MAT_ID", "FLASH_ATTN_EXT", "SOFT_MAX"]
    assert (t.backend == "gpu").all() and t.iloc[1].bs == 9  # a cold case keeps its op and copies
    fa = t.iloc[4]
    assert (fa.hd, fa.nkv, fa.nh, fa.kv, fa.nb) == (128, 16, 32, 512, 1)  # nh: query heads
    sm = t.iloc[5]
    assert (sm.kv, sm.nb, sm.nh) == (512, 128, 32)
    assert t.iloc[3].nr == 8  # n_used


def test_flash_attention_flag_is_priced_only_by_a_kernel_table_profile():
    from sim.engines.metrics import run_scenario
    from sim.model.specs import BenchTest, Workload, load_scenario

    base = load_scenario(REPO / "scenarios/default.toml")
    wl = Workload(n_prompt=(512,), n_gen=(0,), n_depth=(8192,), n_ubatch=512, n_batch=512, repetitions=1)
    for hw_file, differs in ((PROFILE, True), (REPO / "scenarios/hardware/h200.toml", False)):
        tps = []
        for fa in (True, False):
            s = base.with_(hardware=load_hardware(hw_file), workload=wl,
                           placement=replace(base.placement, n_cpu_moe=0, flash_attn=fa),
                           variants=base.variants[:1])
            tps.append(run_scenario(s, engine="analytic", repetitions=1, jobs=1)[0].tps_mean)
        assert (tps[0] != tps[1]) is differs, (hw_file, tps)
        if differs:
            assert tps[0] > tps[1]  # at depth 8192 the unfused attention is slower (measured)


def test_a_cpu_layer_attends_on_the_gpu_at_prefill_and_on_the_cpu_at_decode():
    from sim.plan.builder import graph_items, make_context
    from sim.model.routing import RoutingSpec
    from sim.model.specs import Placement, Scenario, Workload, parse_variant

    model = load_model(REPO / "scenarios/models/gemma3-27b.toml")
    scn = Scenario(name="t", model=model, hardware=load_hardware(PROFILE), placement=Placement(ngl=31),
                   workload=Workload(n_prompt=(512,), n_gen=(0,), n_depth=(0,), n_ubatch=512, n_batch=512,
                                     repetitions=1),
                   routing=RoutingSpec(), variants=(parse_variant("baseline"),))
    ctx = make_context(scn, scn.variants[0], np.random.default_rng(0))
    pre = [it for it in graph_items(ctx, 512, 0, 0) if it.name.endswith(".attn")]
    dec = [it for it in graph_items(ctx, 1, 512, 512) if it.name.endswith(".attn")]
    cpu_layers = model.n_layer + 1 - 31  # llama.cpp's i_gpu_start: -ngl counts the output layer
    assert sum(not it.cpu and it.shape[11] > 0 for it in pre) == cpu_layers  # moved, with its KV copied in
    assert all(it.shape[11] == 0 for it in pre[cpu_layers:])                # GPU layers copy nothing
    assert sum(it.cpu for it in dec) == cpu_layers and sum(it.cpu for it in pre) == 0


def test_fit_writes_only_the_ggml_table(tmp_path):
    from calibrate.llamacpp.fit import write_values

    p = tmp_path / "p.toml"
    shutil.copy(PROFILE, p)
    before = p.read_text()
    write_values(p, {"cpu_op_us": (7.0, "test")})
    after = p.read_text()
    hw_part = lambda t: t[:t.index("\n[ggml]\n")]  # noqa: E731
    assert hw_part(after) == hw_part(before)  # [hardware] has a cpu_op_us of its own
    assert 'cpu_op_us = { value = 7, source = "test" }' in after


def test_a_broken_kernel_table_is_a_one_line_error_naming_the_field(tmp_path):
    shutil.copytree(PROFILE.parent / "h200-llamacpp", tmp_path / "h200-llamacpp")
    p = tmp_path / "p.toml"
    p.write_text(PROFILE.read_text().replace('gpu_kernels = "h200-llamacpp/kernels-cuda.csv"',
                                             'gpu_kernels = "h200-llamacpp/missing.csv"'))
    with pytest.raises(ScenarioError, match=r"ggml\.gpu_kernels.*not found"):
        load_hardware(p)
    bad = tmp_path / "h200-llamacpp/kernels-cuda.csv"
    df = read_table(bad)
    df.loc[0, "t_us"] = -1
    df.to_csv(bad, index=False)
    p.write_text(PROFILE.read_text())
    with pytest.raises(ScenarioError, match=r"ggml\.gpu_kernels.*t_us"):
        load_hardware(p)


def test_compare_labels_every_row_with_the_held_out_split():
    from calibrate.llamacpp.split import is_fit_row
    from sim.views.llamabench import read_llama_bench

    rows = read_llama_bench(REPO / "data/llamacpp/h200-20261201/llama-bench.jsonl")
    cmp = pd.read_csv(REPO / "data/llamacpp/h200-20261201/compare_llamacpp.csv")
    want = ["fit" if is_fit_row(r) else "heldout" for _, r in rows.iterrows()]
    assert list(cmp.split) == want and want.count("fit") == 40


def _load_with_edited_gpu_table(tmp_path, edit, match):
    """Load a copy of the profile whose GPU kernel table ``edit`` has changed; the ScenarioError
    it must raise (matching ``match``) and the table's path."""
    shutil.copytree(PROFILE.parent / "h200-llamacpp", tmp_path / "h200-llamacpp")
    (tmp_path / "p.toml").write_text(PROFILE.read_text())
    f = tmp_path / "h200-llamacpp/kernels-cuda.csv"
    edit(pd.read_csv(f)).to_csv(f, index=False)
    with pytest.raises(ScenarioError, match=match) as err:
        load_hardware(tmp_path / "p.toml")
    return str(err.value), f


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.assign(backend="cpu"), "backend 'cpu' in the gpu table"),
    (lambda d: d.assign(type=d.type.where(d.op != "MUL_MAT_ID", "Q9_Z")), "unknown ggml type 'Q9_Z'"),
    (lambda d: d.assign(m=d.m.where(d.op != "MUL_MAT", 0)), "MUL_MAT rows need m >= 1"),
    (lambda d: d[d.op != "MUL_MAT_ID"], "no MUL_MAT_ID rows"),
    (lambda d: d[~((d.op == "MUL_MAT") & (d.bs > 1))], "no cold case"),
])
def test_a_kernel_table_that_cannot_price_a_model_is_refused(tmp_path, edit, match):
    msg, _ = _load_with_edited_gpu_table(tmp_path, edit, match)
    assert "ggml.gpu_kernels" in msg and "\n" not in msg


@pytest.mark.parametrize("edit, match", [
    (lambda d: pd.concat([d, d.iloc[[3]]], ignore_index=True),
     r"the case gpu MUL_MAT Q4_K m=512 n=32 k=2048 bs=1 nr=1 is timed twice \(data rows 4 and 350\)"),
    (lambda d: d.assign(t_us=d.t_us.where(d.index != 6, -3.0)), r"t_us -3 \(data row 7\)"),
    (lambda d: d.assign(t_us=d.t_us.where(d.index != 6, 1e12)), r"t_us \(1e\+12, data row 7\) outside"),
    (lambda d: d.assign(n=d.n.astype(object).where(d.index != 4, "abc")), r"column n .* 'abc' \(data row 5"),
    (lambda d: d.assign(kv=d.kv.where(d.index != 8, -1.0)), r"column kv .* -1 \(data row 9"),
    (lambda d: d.assign(op=d.op.where(d.index != 2, "ROPE")), r"op 'ROPE' \(data row 3\)"),
    (lambda d: d.assign(backend=d.backend.where(d.index != 5, "cpu")), r"backend 'cpu' in the gpu table "
                                                                          r"\(the first: data row 6"),
])
def test_a_bad_kernel_table_row_is_named(tmp_path, edit, match):
    msg, f = _load_with_edited_gpu_table(tmp_path, edit, match)
    assert "ggml.gpu_kernels" in msg and str(f) in msg and "\n" not in msg


def test_fit_refuses_fewer_rows_than_it_needs(capsys):
    from calibrate.llamacpp.fit import main

    # the kernel lease's drift check has 4 rows that are fit rows: too few for the fitted numbers
    from calibrate.llamacpp.fit import select_fitted

    assert main(["--run", str(REPO / "data/llamacpp/h200-20261201-kernels"),
                 "--kernels", str(REPO / "data/llamacpp/h200-20261201-kernels"), "--profile", str(PROFILE)]) == 2
    assert f"fit rows for {len(select_fitted(None))} parameters" in capsys.readouterr().err
    assert main(["--kernels", "/nonexistent", "--profile", str(PROFILE)]) == 2
    assert "--kernels /nonexistent: no ncu/" in capsys.readouterr().err


def test_cpu_rate_scale_slows_only_the_cpu_bandwidth_term():
    cpu = pd.DataFrame([dict(backend="cpu", op="MUL_MAT", type="Q4_K", m=4096, n=1, k=4096, bs=64, nr=1, t_us=1000.0)]
                       ).reindex(columns=_kernels().gpu.columns)
    k1, k2 = _kernels(cpu=cpu), _kernels(cpu=cpu, cpu_rate_scale=0.5)
    nb = 64 * 2**20
    t1, t2 = k1.matmul_s("cpu", "Q4_K", 4096, 4096, 1, nb), k2.matmul_s("cpu", "Q4_K", 4096, 4096, 1, nb)
    assert t2 - k2.cpu_op_s == pytest.approx(2 * (t1 - k1.cpu_op_s))
    assert k2.moe_s("cpu", "Q4_K", 4096, 4096, 1, 4, nb) - k2.cpu_op_s == pytest.approx(2 * (t1 - k1.cpu_op_s))
    # the GPU side is untouched
    assert k2.matmul_s("gpu", "Q4_K", 1024, 1024, 64, 2**20) == k1.matmul_s("gpu", "Q4_K", 1024, 1024, 64, 2**20)


def _scenario(model_name: str, ngl: int, n_prompt: int, hw=None):
    from sim.model.routing import RoutingSpec
    from sim.model.specs import Placement, Scenario, Workload, parse_variant

    model = load_model(REPO / f"scenarios/models/{model_name}.toml")
    return Scenario(name="t", model=model, hardware=hw or load_hardware(PROFILE), placement=Placement(ngl=ngl),
                    workload=Workload(n_prompt=(n_prompt,), n_gen=(0,), n_depth=(0,), n_ubatch=n_prompt,
                                      n_batch=n_prompt, repetitions=1),
                    routing=RoutingSpec(), variants=(parse_variant("baseline"),))


def test_the_token_embedding_runs_on_one_cpu_thread_each_graph():
    from sim.plan.builder import build_plan
    from sim.model.costs import plan_durations
    from sim.plan import OpKind
    from sim.model.specs import BenchTest

    hw = load_hardware(PROFILE)
    g = hw.ggml
    assert g.cpu_get_rows_bytes_per_s > 0
    # -ngl 0 at 16 tokens (below the op-offload batch): everything runs on the CPU
    for ngl, n in ((999, 512), (0, 16)):
        scn = _scenario("gemma3-27b", ngl, n)
        plan = build_plan(scn, scn.variants[0], BenchTest(n_prompt=n, n_gen=0), np.random.default_rng(0))
        dur = plan_durations(plan, hw)
        rows = [op for op in plan.ops if op.name == "token_embd get_rows"]
        assert len(rows) == 1 and rows[0].kind is OpKind.CPU_MATVEC
        assert dur[rows[0].id] == pytest.approx(4 * n * scn.model.d_model / g.cpu_get_rows_bytes_per_s)
        # its rows cross to the GPU only when the first block runs there
        to_dev = [op for op in plan.ops if op.name == "token_embd rows to device"]
        assert [op.nbytes for op in to_dev] == ([4 * n * scn.model.d_model] if ngl else [])
    # a profile without the measured rate prices no embedding (the CuPy profile and older ones)
    hw0 = hw.with_(ggml=replace(g, cpu_get_rows_bytes_per_s=0.0))
    scn = _scenario("gemma3-27b", 999, 512, hw0)
    plan = build_plan(scn, scn.variants[0], BenchTest(n_prompt=512, n_gen=0), np.random.default_rng(0))
    assert not any(op.name in ("token_embd get_rows", "token_embd rows to device") for op in plan.ops)


def test_a_cpu_layers_kv_comes_in_pageable_and_goes_out_through_one_thread_set_rows():
    from sim.plan.builder import graph_items, make_context
    from sim.model.costs import kv_copies_s

    hw = load_hardware(PROFILE)
    scn = _scenario("gemma3-27b", 31, 512)
    ctx = make_context(scn, scn.variants[0], np.random.default_rng(0))
    moved = [it for it in graph_items(ctx, 512, 1024, 0) if it.name.endswith(".attn") and it.shape[11]]
    assert len(moved) == scn.model.n_layer + 1 - 31
    sh = moved[0].shape
    kvd = scn.model.n_head_kv * scn.model.head_dim
    assert sh[12] == 2 * 512 * kvd * 4  # the new K and V, f32
    want = (hw.h2d_pageable.time_s(sh[11]) + hw.d2h.time_s(sh[12]) + sh[12] / hw.ggml.cpu_set_rows_bytes_per_s)
    assert kv_copies_s(sh, hw) == pytest.approx(want)
    # the KV cache of a CPU layer is a plain CPU buffer: slower than a pinned copy would be
    assert kv_copies_s(sh, hw) > hw.h2d_pinned.time_s(sh[11]) + hw.d2h.time_s(sh[12])


def test_the_profile_rows_rates_are_those_of_the_committed_split_timing():
    from calibrate.llamacpp.splittime import rows_rates

    g = load_hardware(PROFILE).ggml
    got = rows_rates(REPO / "data/llamacpp/h200-20261201-splits")
    assert g.cpu_get_rows_bytes_per_s == pytest.approx(got["cpu_get_rows_gb_per_s"][0], rel=1e-5)
    assert g.cpu_set_rows_bytes_per_s == pytest.approx(got["cpu_set_rows_gb_per_s"][0], rel=1e-5)


def test_attention_pays_the_cold_kv_read_the_l2_hot_table_case_does_not():
    k0 = _kernels()
    k = _kernels(attn_kv_cold_bytes_per_s=2e12)
    nb = 4.0 * 8448 * 4 * 128  # f16 K and V of 8448 cells, 4 KV heads of 128
    assert k0.kv_cold_s(8448, 4, 128) == 0.0
    assert k.kv_cold_s(8448, 4, 128) == pytest.approx(nb / 2e12)
    # K/V larger than the L2 were read cold by the table's own case: nothing added
    assert k.kv_cold_s(8448 * 16, 4, 128) == 0.0


def test_decode_attention_never_gets_cheaper_when_the_kv_outgrows_the_l2():
    """The cold read goes onto each L2-hot measured case before interpolating, so the price is
    continuous where one layer's K/V pass the L2 (it fell by a third there: the cold read was
    added to an interpolation of hot and cold cases, then dropped): for each shipped geometry,
    decode attention never falls with more keys and moves at 256-cell steps by no more than the
    priced cases' slopes allow; every measured case is priced as measured plus its cold read (0
    beyond the L2), but a hot case that its cold read makes dearer than a later case measured
    cold, which is priced between its kept neighbours, below that case (Qwen3 and gpt-oss at 16384
    cells: kept, they had made decode from 16k to 32k keys nearly free); past the last case each
    cell costs at least its K/V at the cold rate."""
    g = load_hardware(PROFILE).ggml
    n_dropped = 0
    for key, rows in g._attn_raw.items():
        if key[:2] != ("gpu", "FA"):
            continue
        hd, nh, nkv = key[2:]
        kvs, ts = rows[1]
        add = np.array([g.kv_cold_s(int(kv), nkv, hd) for kv in kvs])
        corrected = ts + add
        dropped = [add[i] > 0 and any(a == 0 and c < corrected[i] for c, a in zip(corrected[i + 1:], add[i + 1:]))
                   for i in range(len(kvs))]
        kept_max = np.maximum.accumulate(corrected[~np.array(dropped)])
        k = 0
        for i, (kv, t) in enumerate(zip(kvs, corrected)):
            got = g.attn_s("gpu", 1, int(kv), nh, nkv, hd, True)
            if dropped[i]:
                n_dropped += 1
                later_cold = min(c for c, a in zip(corrected[i + 1:], add[i + 1:]) if a == 0)
                assert got < t and got <= later_cold * (1 + 1e-12)
            else:  # a measured case: as measured, plus its cold read (non-decreasing)
                assert got == pytest.approx(float(kept_max[k]))
                k += 1
        priced = np.array([g.attn_s("gpu", 1, int(kv), nh, nkv, hd, True) for kv in kvs])
        # no step and no fall: each 256 cells add at most the steepest slope between neighbouring
        # priced cases (the old price fell by a third in one step where the K/V passed the L2)
        cells = np.arange(256, 4 * int(kvs[-1]) + 1, 256)
        got = np.array([g.attn_s("gpu", 1, int(c), nh, nkv, hd, True) for c in cells])
        steepest = float(np.max(np.diff(priced) / np.diff(kvs))) * 256
        assert np.all(np.diff(got) >= 0) and float(np.max(np.diff(got))) <= max(steepest, 256 * 4.0 * nkv * hd
                                                                              / g.attn_kv_cold_bytes_per_s) * (1 + 1e-9)
        # beyond the last case every further cell's K/V costs at least the cold read (it was flat)
        far = 4 * int(kvs[-1])
        assert got[-1] - g.attn_s("gpu", 1, int(kvs[-1]), nh, nkv, hd, True) >= (
            4.0 * nkv * hd * (far - kvs[-1]) / g.attn_kv_cold_bytes_per_s) * (1 - 1e-9)
    assert n_dropped == 2   # Qwen3's and gpt-oss's 16384-cell cases


def test_decode_attention_keeps_growing_from_16k_to_32k_keys():
    """Decode attention of Qwen3's geometry grows from 16k to 32k keys at least as steeply per
    cell as from 8k to 16k (it had grown 0.12 times as steeply: the corrected 16384-cell case
    lifted the cold 32768-cell case to its price)."""
    g = load_hardware(PROFILE).ggml
    at = [g.attn_s("gpu", 1, kv, 32, 4, 128, True) for kv in (8448, 16384, 32768)]
    assert (at[2] - at[1]) / (32768 - 16384) >= (at[1] - at[0]) / (16384 - 8448)


def test_the_profile_cold_kv_rate_is_that_of_the_committed_depth_profiles():
    from calibrate.llamacpp.fit import kv_cold_rate

    hw = load_hardware(PROFILE)
    rate, src = kv_cold_rate(REPO / "data/llamacpp/h200-20261202-depth", hw)
    assert hw.ggml.attn_kv_cold_bytes_per_s == pytest.approx(rate, rel=1e-5)
    assert "19.1 us per layer" in src


def test_a_moved_attentions_kv_work_blocks_the_host_so_prefetch_fires_after_it():
    """A layer -ngl left on the CPU, at prefill: the K/V store and the KV-view copy are host work
    between the V projection and the attention (ggml's scheduler does them synchronously), priced
    as the single attention op priced them before (kv_copies_s + the extra splits); with ungated
    prefetch the copy feeding the split after the attention's (the output projection's successor)
    is issued only once the host is past that work, so it cannot overlap it."""
    from sim.plan.builder import build_plan
    from sim.model.costs import kv_copies_s, plan_durations
    from sim.plan import OpKind
    from sim.model.specs import BenchTest, parse_variant

    hw = load_hardware(PROFILE)
    scn = _scenario("gemma3-27b", 31, 512)
    test = BenchTest(n_prompt=512, n_gen=0)
    for vname in ("baseline", "prefetch_ungated"):
        plan = build_plan(scn, parse_variant(vname), test, np.random.default_rng(0))
        dur = plan_durations(plan, hw)
        ops = plan.ops
        kv = [op for op in ops if op.kind is OpKind.HOST_WORK and op.tag == "kv_moved"]
        cpu_layers = scn.model.n_layer + 1 - 31
        assert len(kv) == cpu_layers and all(op.stream.value == "host" for op in kv)
        for op in kv:
            sh = op.shape
            assert dur[op.id] == pytest.approx(kv_copies_s(sh, hw) + (sh[13] - 1) * hw.ggml.split_s + hw.ggml.cpu_split_host_s)
            attn = next(o for o in ops if o.kind is OpKind.ATTN and o.layer == op.layer)
            assert attn.id > op.id  # launched after the host work
            assert dur[attn.id] < dur[op.id]  # the GPU op is the attention alone
        if vname == "baseline":
            continue
        from sim.engines import analytic

        sched = analytic.run(plan, dur)
        start, end = np.asarray(sched.start_s), np.asarray(sched.end_s)
        # the copy feeding layer L's FFN gate (two staged splits after its attention: the output
        # projection, then the gate) starts only after layer L's kv work on the host ended
        for op in kv:
            gate = [o for o in ops if o.name == f"blk.{op.layer}.ffn_gate.weight (prefetch)"]
            assert len(gate) == 1
            assert start[gate[0].id] >= end[op.id] - 1e-12


def test_a_datasheet_profile_prices_the_moved_attentions_host_work_as_its_copies():
    """Without [ggml] figures (a datasheet profile) the same host op carries the KV copies only."""
    from sim.plan.builder import build_plan
    from sim.model.costs import kv_copies_s, plan_durations
    from sim.plan import OpKind
    from sim.model.specs import BenchTest

    hw = load_hardware(REPO / "scenarios/hardware/rtx5090.toml")
    assert hw.ggml is None
    scn = _scenario("gemma3-27b", 31, 512, hw)
    plan = build_plan(scn, scn.variants[0], BenchTest(n_prompt=512, n_gen=0), np.random.default_rng(0))
    dur = plan_durations(plan, hw)
    kv = [op for op in plan.ops if op.kind is OpKind.HOST_WORK and op.tag == "kv_moved"]
    assert len(kv) == scn.model.n_layer + 1 - 31
    for op in kv:
        assert dur[op.id] == pytest.approx(kv_copies_s(op.shape, hw)) and dur[op.id] > 0


def test_a_split_on_the_cpu_backend_pays_cpu_split_us_and_one_on_the_gpu_split_us():
    """Each split's host overhead by its backend: a CPU split (ggml-cpu's graph plan, thread
    pool) ``cpu_split_us``, a GPU split ``split_us``; a moved attention's extra splits are one CPU
    split (the KV store) and the rest GPU splits. Without ``cpu_split_us`` a CPU split costs
    ``split_us`` (older profiles price as before)."""
    from sim.plan.builder import build_plan
    from sim.model.costs import plan_durations

    hw = load_hardware(PROFILE)
    g = hw.ggml
    assert g.cpu_split_s is not None and g.cpu_split_s != g.split_s
    for ngl, n in ((31, 1), (31, 512)):  # decode: CPU layers run on the CPU; prefill: moved to the GPU
        scn = _scenario("gemma3-27b", ngl, n)
        plan = build_plan(scn, scn.variants[0], BenchTest(n_prompt=n, n_gen=0), np.random.default_rng(0))
        d = plan_durations(plan, hw)
        cpu_ov = [op for op in plan.ops if op.tag == "cpu_split_overhead"]
        gpu_ov = [op for op in plan.ops if op.tag == "split_overhead"]
        assert gpu_ov and all(d[op.id] == pytest.approx(g.split_s) for op in gpu_ov)
        assert all(d[op.id] == pytest.approx(g.cpu_split_s) for op in cpu_ov)
        assert bool(cpu_ov) == (n == 1)  # at 512 tokens the op-offload rule moves every CPU layer's ops
        moved = [op for op in plan.ops if op.tag == "kv_moved"]
        assert bool(moved) == (n == 512)
        for op in moved:
            extra = op.shape[13]
            assert d[op.id] == pytest.approx(kv_copies_for(op, hw) + (extra - 1) * g.split_s + g.cpu_split_s)
        old = hw.with_(ggml=replace(g, cpu_split_s=None))
        d0 = plan_durations(plan, old)
        assert all(d0[op.id] == pytest.approx(g.split_s) for op in cpu_ov)
        assert all(d0[op.id] == pytest.approx(kv_copies_for(op, old) + op.shape[13] * g.split_s) for op in moved)


def kv_copies_for(op, hw):
    from sim.model.costs import kv_copies_s

    return kv_copies_s(op.shape, hw)


def test_the_profile_split_us_is_the_committed_split_timings_gpu_split_host_time():
    from calibrate.llamacpp.splittime import gpu_split_host

    got, src = gpu_split_host(REPO / "data/llamacpp/h200-20261201-splits")
    assert load_hardware(PROFILE).ggml.split_s == pytest.approx(got, rel=1e-5)
    assert "median of" in src and "splits" in src


def test_gpu_split_host_takes_gpu_splits_of_decode_graphs_only(tmp_path):
    """The median compute call of GPU splits in one-token graphs with enough splits: CPU splits,
    prompt graphs and graphs of few splits (a resident model's one CUDA graph) are left out; a
    folder without such splits is refused in one message naming it."""
    import gzip
    import json

    from calibrate.llamacpp.splittime import gpu_split_host

    def line(ne1, splits):
        body = ",".join(f"{i}:{b}:1:64:0:0:{us}" for i, (b, us) in enumerate(splits))
        return f"prefetch-sim split-time: graph=0 ne1={ne1} n_splits={len(splits)} gap_us=1 total_us=9 splits={body}\n"

    dec = [("CUDA0", 10), ("CPU", 900)] * 5 + [("CUDA0", 14)] * 2  # 7 GPU splits: 10 x5, 14 x2
    log = line(1, dec) + line(512, [("CUDA0", 5000)] * 12) + line(1, [("CUDA0", 99), ("CUDA0", 99)])
    (tmp_path / "st").mkdir()
    with gzip.open(tmp_path / "st" / "a.err.gz", "wt") as f:
        f.write(log)
    inv = {"id": "a", "gguf": "m.gguf", "model_toml": "m.toml", "env": {"PREFETCH_SIM_SPLIT_TIME": "1"}, "args": [], "model_toml": "m.toml"}
    (tmp_path / "invocations.jsonl").write_text(json.dumps(inv) + "\n")
    got, src = gpu_split_host(tmp_path)
    assert got == pytest.approx(10e-6) and "7 splits in 1 invocation" in src
    with gzip.open(tmp_path / "st" / "a.err.gz", "wt") as f:
        f.write(line(512, [("CUDA0", 5000)] * 12))
    with pytest.raises(PrefetchSimError, match=str(tmp_path)):
        gpu_split_host(tmp_path)


def test_split_time_records_are_read_from_the_invocations_own_log_or_its_packed_copy(tmp_path):
    """A lease keeps each invocation's stderr as logs/<id>.log (packed into logs.tar.gz by
    report): the split-time reader finds its lines there as in st/<id>.err.gz; an invocation
    run without the timing has none."""
    import json
    import tarfile

    from calibrate.llamacpp.splittime import gpu_split_host, invocation_graphs

    body = ",".join(f"{i}:{b}:1:64:0:0:{us}" for i, (b, us) in enumerate([("CUDA0", 12), ("CPU", 500)] * 6))
    log = f"noise\nprefetch-sim split-time: graph=0 ne1=1 n_splits=12 gap_us=1 total_us=9 splits={body}\n"
    invs = [{"id": "t", "gguf": "m.gguf", "model_toml": "m.toml", "env": {"PREFETCH_SIM_SPLIT_TIME": "1"}},
            {"id": "p", "gguf": "m.gguf", "model_toml": "m.toml", "env": {}}]
    (tmp_path / "invocations.jsonl").write_text("".join(json.dumps(i) + "\n" for i in invs))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "t.log").write_text(log)
    (tmp_path / "logs" / "p.log").write_text(log)
    g = invocation_graphs(tmp_path, invs[0])
    assert len(g) == 1 and len(g[0].splits) == 12
    assert invocation_graphs(tmp_path, invs[1]) is None and invocation_graphs(tmp_path, invs[1], timed_only=False)
    assert gpu_split_host(tmp_path)[0] == pytest.approx(12e-6)
    with tarfile.open(tmp_path / "logs.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "logs", arcname="logs")
    shutil.rmtree(tmp_path / "logs")
    assert len(invocation_graphs(tmp_path, invs[0])) == 1
    assert invocation_graphs(tmp_path, {"id": "gone", "env": {"PREFETCH_SIM_SPLIT_TIME": "1"}}) is None


def test_splittime_of_a_decode_only_lease_prints_its_table_and_exits_0(capsys):
    """A lease without prompt graphs or -ngl CPU layers has no GET_ROWS/SET_ROWS rates: a note,
    the table and the GPU split's host time, exit 0 (data/llamacpp/README.md gives the command)."""
    from calibrate.llamacpp.splittime import main

    assert main([str(REPO / "data/llamacpp/h200-20261204-tg6")]) == 0
    cap = capsys.readouterr()
    assert "a-st-qwen3-ncmoe48" in cap.out and "split_us = 15" in cap.out
    assert "splittime: note:" in cap.err and "error" not in cap.err


def test_a_cpu_moe_split_copies_each_input_and_its_output_synchronously_under_llamacpp():
    """llama.cpp's scheduler copies a CPU split's inputs one by one with a synchronous
    ``ggml_backend_tensor_copy`` (the activations, then the router ids) and the split's output,
    ``MUL_MAT_ID``'s ``[d_model, n_expert_used, n_tokens]`` f32, back to the GPU the same way
    before the next GPU split is launched; the CuPy executor's plan (no [ggml]) keeps one D2H
    and an asynchronous copy back."""
    from sim.model.specs import BenchTest, Placement
    from sim.plan import OpKind
    from sim.plan.builder import ACT_BYTES, ID_BYTES, build_plan

    n = 2  # decode-sized: below the op-offload batch, the host experts run on the CPU
    for hw, llama in ((load_hardware(PROFILE), True), (load_hardware(REPO / "scenarios/hardware/h200.toml"), False)):
        scn = _scenario("qwen3-30b-a3b", 99, n, hw)
        scn = replace(scn, placement=Placement(ngl=99, n_cpu_moe=2))
        m = scn.model
        plan = build_plan(scn, scn.variants[0], BenchTest(n_prompt=n, n_gen=0), np.random.default_rng(0))
        ops = plan.ops
        for blk in (0, 1):
            d2h = [o for o in ops if o.kind is OpKind.D2H and o.name.endswith(f"to host blk.{blk}")]
            h2d = [o for o in ops if o.kind is OpKind.H2D and o.name == f"act to device blk.{blk}"]
            act, ids = n * m.d_model * ACT_BYTES, n * m.moe.n_expert_used * ID_BYTES
            assert len(h2d) == 1
            waits = {o.deps[0]: o for o in ops if o.kind is OpKind.HOST_SYNC and len(o.deps) >= 1}
            if llama:
                assert [o.nbytes for o in d2h] == [act, ids]
                assert all(o.id in waits for o in d2h)  # the host waits for each copy
                assert h2d[0].nbytes == act * m.moe.n_expert_used and h2d[0].id in waits
                # nothing of the next split is issued before the host has the output on the GPU
                wait = waits[h2d[0].id]
                assert not [o for o in ops if h2d[0].id < o.id < wait.id and o.kind is OpKind.ISSUE]
                assert [o for o in ops if o.id > wait.id and o.kind is OpKind.ISSUE]  # the GPU split follows
            else:
                assert [o.nbytes for o in d2h] == [act + ids]
                assert h2d[0].nbytes == act and h2d[0].id not in waits


def test_a_kernel_table_of_two_backends_is_refused(tmp_path, capsys):
    """perf_cases table writes one backend's table (a profile reads gpu_kernels and cpu_kernels
    apart): a CUDA and a CPU log together are one error, nothing written."""
    from calibrate.llamacpp import perf_cases

    perf = Path(__file__).resolve().parents[1] / "data" / "llamacpp" / "h200-20261201-kernels" / "perf"
    out = tmp_path / "k.csv"
    rc = perf_cases.main(["table", str(perf / "cuda.txt"), str(perf / "cpu.txt"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "cases of cpu and gpu together" in err and not out.exists()


def test_a_kernel_table_with_a_type_the_simulator_cannot_price_is_refused(tmp_path, capsys):
    """A case of an unknown ggml type would make a table the profile loader refuses: refused when
    the table is written; timing lines the pattern does not take (a negative time) are counted in
    a warning, not dropped unsaid."""
    from calibrate.llamacpp import perf_cases

    perf = Path(__file__).resolve().parents[1] / "data" / "llamacpp" / "h200-20261201-kernels" / "perf"
    text = (perf / "cuda.txt").read_text()
    line = next(ln for ln in text.splitlines() if "MUL_MAT(type_a=q4_K" in ln and "us/run" in ln)
    bad = tmp_path / "bad.txt"
    bad.write_text(text + "\n" + line.replace("type_a=q4_K", "type_a=q9_9") + "\n")
    out = tmp_path / "k.csv"
    assert perf_cases.main(["table", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Q9_9 unknown" in err and not out.exists()
    neg = tmp_path / "neg.txt"
    neg.write_text(text + "\n" + line.replace(" us/run", "").rsplit("-", 1)[0] + "- -3.00 us/run\n")
    assert perf_cases.main(["table", str(neg), "--out", str(out)]) == 0
    assert "1 timing line not read" in capsys.readouterr().err


def test_fit_refuses_a_number_no_fit_row_depends_on(monkeypatch):
    """A fitted number the fit rows do not move (``cpu_rate_scale`` on fully resident rows) is
    refused by name instead of being written back as its start value labelled "fitted"; a number
    they do move is fitted."""
    from calibrate.llamacpp import fit as F

    rows = tuple(r for r in F.FITTED if r[0] in ("graph_us", "cpu_rate_scale"))
    t_meas = np.array([1.0e-3, 2.0e-3, 3.0e-3])

    def times(cases, hw, p, jobs):   # resident rows: the graph's host time only
        return np.array([0.9e-3, 1.9e-3, 2.9e-3]) + p["graph_s"]

    monkeypatch.setattr(F, "predict_times", times)
    with pytest.raises(F.PrefetchSimError, match=r"depends on cpu_rate_scale .*leave it out of --params"):
        F.gauss_newton([None] * 3, t_meas, None, iterations=2, say=lambda *_: None, fitted=rows)
    only = tuple(r for r in rows if r[0] == "graph_us")
    p, err = F.gauss_newton([None] * 3, t_meas, None, iterations=2, say=lambda *_: None, fitted=only)
    assert p["graph_s"] == pytest.approx(0.1e-3, rel=1e-6) and np.abs(err).max() < 1e-9


def test_a_few_tokens_price_the_kernels_ggml_cuda_switches_to():
    """2-8 tokens (calibrate.llamacpp.smallbatch): FlashAttention at least its one-token price at
    the same keys plus the measured extra (linear between 2, 4 and 8, scaled by the query width,
    none at one token or beyond 8); an f32 matmul mul_mat_vec_f's generic price up to 3 columns,
    mul_mat_f's measured time from 4 to 8; a quantised matvec below the L2 grows by its
    multiply-adds per column beyond the second, one above the L2 keeps the table's time."""
    from sim.model.quant import ggml_nbytes

    fa_rows = [dict(backend="gpu", op="FLASH_ATTN_EXT", type="F16", hd=128, nh=32, nkv=4, kv=kv, nb=nb, t_us=t)
               for nb, kv, t in ((1, 256, 6.0), (1, 4096, 10.0), (64, 256, 12.0), (64, 4096, 30.0))]
    base = _kernels()
    tab = pd.concat([base.gpu, pd.DataFrame(fa_rows)], ignore_index=True)
    k0 = _kernels(gpu=tab)
    k = _kernels(gpu=tab, fa_extra_s=(4e-6, 10e-6, 14e-6), f32_mmf_s=12e-6, matvec_column_macs_per_s=1e13)
    assert [k.fa_extra_at(n, 4096) for n in (1, 2, 3, 4, 6, 8, 9)] == pytest.approx(
        [0, 4e-6, 7e-6, 10e-6, 12e-6, 14e-6, 0])
    assert k.fa_extra_at(4, 2048) == pytest.approx(5e-6)          # half the width, half the extra
    for keys in (200, 3000):
        one = k.attn_s("gpu", 1, keys, 32, 4, 128, True)
        assert one == pytest.approx(k0.attn_s("gpu", 1, keys, 32, 4, 128, True))   # one token: unchanged
        for n in (2, 4, 8):
            got = k.attn_s("gpu", n, keys, 32, 4, 128, True)
            assert got == pytest.approx(max(k0.attn_s("gpu", n, keys, 32, 4, 128, True), one + k.fa_extra_at(n, 4096)))
            assert got > k0.attn_s("gpu", n, keys, 32, 4, 128, True)
            many = k.flash_attn_gpu_many(n, np.array([keys]), 32, 4, 128)   # the vectorised path agrees
            assert float(many[0]) == pytest.approx(got, rel=1e-12)
        assert k.attn_s("gpu", 16, keys, 32, 4, 128, True) == k0.attn_s("gpu", 16, keys, 32, 4, 128, True)
    # the f32 router: no table type; mul_mat_f from 4 columns to 8, the caller's price otherwise
    assert [k.matmul_s("gpu", "F32", 128, 2048, n, 4 * 128 * 2048) for n in (1, 3, 4, 8, 9)] == [
        None, None, 12e-6, 12e-6, None]
    assert k0.matmul_s("gpu", "F32", 128, 2048, 4, 4 * 128 * 2048) is None
    # a quantised matvec below the L2: flat to two columns, then m*k multiply-adds per column
    b = ggml_nbytes("Q4_K", 1024 * 1024)
    for n in (1, 2):
        assert k.matmul_s("gpu", "Q4_K", 1024, 1024, n, b) == k0.matmul_s("gpu", "Q4_K", 1024, 1024, n, b)
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 5, b) == pytest.approx(
        k0.matmul_s("gpu", "Q4_K", 1024, 1024, 5, b) + 3 * 1024 * 1024 / 1e13)
    big = 60 * 2**20  # above the L2: a curve with a matvec case holds the growth (its time at n)
    with_mv = pd.concat([tab, pd.DataFrame([dict(backend="gpu", op="MUL_MAT", type="Q4_K", m=1024, n=n, k=1024, bs=1,
                                                 nr=1, t_us=t) for n, t in ((1, 30.0), (4, 40.0))])], ignore_index=True)
    kv0 = _kernels(gpu=with_mv)
    kv = _kernels(gpu=with_mv, fa_extra_s=(4e-6, 10e-6, 14e-6), f32_mmf_s=12e-6, matvec_column_macs_per_s=1e13)
    assert kv.matmul_s("gpu", "Q4_K", 1024, 1024, 5, big) == kv0.matmul_s("gpu", "Q4_K", 1024, 1024, 5, big)
    # a curve of MMQ cases alone (as gpu_kernels_extra's) prices no matvec: the cold rate and the column cost do
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 5, big) == pytest.approx(
        k0.matmul_s("gpu", "Q4_K", 1024, 1024, 5, big) + 3 * 1024 * 1024 / 1e13)
    assert k.matmul_s("gpu", "Q4_K", 1024, 1024, 16, b) == k0.matmul_s("gpu", "Q4_K", 1024, 1024, 16, b)


def test_the_profile_small_batch_numbers_are_those_of_the_committed_ncu_run():
    """The shipped profile's fa_extra_us_N, f32_mmf_us and matvec_column_tmac_per_s are what
    calibrate.llamacpp.smallbatch measures in data/llamacpp/h100-20261207-diag3 (its ncu overhead
    per kernel, found per ubatch, within 1.6-1.7 us: a kernel list read wrongly would not be)."""
    from calibrate.llamacpp.smallbatch import graph_table, small_batch_numbers

    folder = REPO / "data/llamacpp/h100-20261207-diag3"
    got = small_batch_numbers(folder)
    g = load_hardware(PROFILE).ggml
    assert [got[f"fa_extra_us_{n}"][0] * 1e-6 for n in (2, 4, 8)] == pytest.approx(list(g.fa_extra_s), rel=1e-5)
    assert got["f32_mmf_us"][0] * 1e-6 == pytest.approx(g.f32_mmf_s, rel=1e-5)
    assert got["matvec_column_tmac_per_s"][0] * 1e12 == pytest.approx(g.matvec_column_macs_per_s, rel=1e-5)
    assert all(s.startswith("measured: ") and "NVIDIA H100" in s for _v, s in got.values())
    _corr, count, tot = graph_table(folder, 151936)
    assert tot["ncu overhead us per kernel"].between(1.55, 1.7).all()
    assert count.loc["FlashAttention"].tolist() == [96, 96, 96, 96]   # two kernels a layer, 48 layers


def test_smallbatch_names_a_folder_without_the_ncu_run(tmp_path, capsys):
    from calibrate.llamacpp.smallbatch import main

    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ncu-qwen3-pp8-ub1-8.csv.gz" in err[0] and "Traceback" not in err[0]


def test_a_matvec_above_the_l2_extends_the_tables_matvec_cases_not_the_mmq_ones():
    """At 5-8 tokens a weight larger than the L2 takes the table's 1- and 4-token cases (both
    mul_mat_vec_q) extended linearly in the tokens, not an interpolation towards the 16-token case
    (MMQ, another kernel): Gemma's FFNs at 8 tokens were priced a quarter too cheap so."""
    rows = [dict(backend="gpu", op="MUL_MAT", type="Q4_K", m=8192, n=n, k=8192, bs=1, nr=1, t_us=t)
            for n, t in ((1, 40.0), (4, 60.0), (16, 64.0))]
    # a fast cold case (the weight read is then far below the table's times, which decide)
    rows.append(dict(backend="gpu", op="MUL_MAT", type="Q4_K", m=1024, n=1, k=1024, bs=64, nr=1, t_us=1.0))
    tab = pd.DataFrame(rows).reindex(columns=_kernels().gpu.columns)
    k = _kernels(gpu=tab)
    big = 60 * 2**20
    assert 2e-6 + big / k.cold_rate("gpu", "Q4_K") < 10e-6
    assert k.matmul_s("gpu", "Q4_K", 8192, 8192, 1, big) == pytest.approx(40e-6)
    assert k.matmul_s("gpu", "Q4_K", 8192, 8192, 4, big) == pytest.approx(60e-6)
    assert k.matmul_s("gpu", "Q4_K", 8192, 8192, 2, big) == pytest.approx(40e-6 * (60 / 40) ** 0.5)  # log-log
    slope = (60e-6 - 40e-6) / 3
    for n in (5, 8):
        assert k.matmul_s("gpu", "Q4_K", 8192, 8192, n, big) == pytest.approx(60e-6 + (n - 4) * slope)
    assert k.matmul_s("gpu", "Q4_K", 8192, 8192, 8, big) > 64e-6     # above the MMQ case it used to reach
    assert k.matmul_s("gpu", "Q4_K", 8192, 8192, 16, big) == pytest.approx(64e-6)   # MMQ: the table


def test_gpu_kernels_extra_adds_mmq_cases_of_new_shapes_only(tmp_path):
    """[ggml] gpu_kernels_extra appends another GPU's MMQ cases (16 or more tokens) of shapes the
    main table lacks; a matvec case or a shape the main table has is refused naming the field.
    With the shipped one, Llama-8B's Q8_0 FFN prices its prefill from its own case and its matvec
    as before (the cold rate)."""
    from sim.model.quant import ggml_nbytes

    g = load_hardware(PROFILE).ggml
    assert ("gpu", "MUL_MAT", "Q8_0", 14336, 4096) in g._curves
    assert g._curve_shape("gpu", "MUL_MAT", "Q8_0", 14336, 4096, 512) == (14336, 4096)
    assert g._curve_shape("gpu", "MUL_MAT", "Q8_0", 14336, 4096, 1) != (14336, 4096)   # no matvec case there
    b = ggml_nbytes("Q8_0", 14336 * 4096)
    assert b / g.matmul_s("gpu", "Q8_0", 14336, 4096, 1, b) > 0.85 * g.cold_rate("gpu", "Q8_0")
    prof = tmp_path / "h.toml"
    src = PROFILE.read_text().replace('"h200-llamacpp/', f'"{(PROFILE.parent / "h200-llamacpp").as_posix()}/')
    extra = pd.read_csv(PROFILE.parent / "h200-llamacpp" / "kernels-cuda-extra-h100.csv")
    for bad, words in ((extra.assign(n=extra.n.where(extra.index > 0, 8)), "only MUL_MAT cases at 16"),
                       (pd.concat([extra, _mmq_row(PROFILE.parent / "h200-llamacpp" / "kernels-cuda.csv")]),
                        "is in gpu_kernels too")):
        bad.to_csv(tmp_path / "x.csv", index=False)
        prof.write_text(src.replace(f'{(PROFILE.parent / "h200-llamacpp").as_posix()}/kernels-cuda-extra-h100.csv',
                                    (tmp_path / "x.csv").as_posix()))
        with pytest.raises(ScenarioError, match=words) as ei:
            load_hardware(prof)
        assert "gpu_kernels_extra" in str(ei.value)


def _mmq_row(path):
    t = pd.read_csv(path)
    return t[(t.op == "MUL_MAT") & (t.n >= 16)].head(1)
