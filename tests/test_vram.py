"""VRAM accounting in llama.cpp's order, and the expert-cache pool sized by its fit (issue #18,
item 1): resident weights, KV cache, the compute buffer ggml's scheduler reserves for the
worst-case graph, staging, then the cache pool from what is left minus the fit target."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.plan.builder import build_plan, make_context
from sim.errors import PlacementError, VramOverflowError
from sim.model.specs import FIT_TARGET_MIB_DEFAULT, BenchTest, load_scenario, parse_variant
from sim.model.vram import ACT_ELEMS_FACTOR, account, fit_n_cpu_moe

from scenario_factory import ROOT, make_scenario

MiB = 2**20


def toy(capacity_bytes: float = 200e6, reserved_bytes: float = 50e6, fit_target_mib=(4,), **kw):
    """The toy MoE of :func:`make_scenario` (2 layers, 8 experts of 64 x 32, F16, experts on the
    host) on a GPU of ``capacity_bytes``."""
    scn = make_scenario(**kw)
    hw = replace(scn.hardware, vram_bytes=capacity_bytes, vram_reserved_bytes=reserved_bytes)
    return scn.with_(hardware=hw, placement=replace(scn.placement, fit_target_mib=tuple(fit_target_mib)))


def by_hand(scn, staging_bytes: float) -> dict:
    """The components of the toy scenario worked out from its geometry, not from sim.model.vram."""
    m = scn.model
    d, hd, nh, nkv, E, ff = m.d_model, m.head_dim, m.n_head, m.n_head_kv, m.moe.n_expert, m.moe.n_ff_exp
    f16, f32 = 2, 4
    # resident: q, k, v, o and the router (F32) of each block, and the output head; token_embd
    # and the experts are on the host
    per_layer = (d * nh * hd + 2 * d * nkv * hd + nh * hd * d) * f16 + d * E * f32
    weights = m.n_layer * per_layer + d * m.n_vocab * f16
    # K and V of every layer for ctx_size tokens, f16
    kv = m.n_layer * scn.placement.ctx_size * 2 * nkv * hd * f16
    # the worst-case graph at n_ubatch: f32 activations (ACT_ELEMS_FACTOR residual-stream rows
    # and two of the widest layer, here the dense n_ff) and one split's input copy: an expert
    # tensor, the largest host weight (E x ff x d, F16)
    n_ub = scn.workload.n_ubatch
    widest = max(d, ff * m.moe.n_expert_used, m.n_ff, nh * hd)
    compute = f32 * n_ub * (ACT_ELEMS_FACTOR * d + 2 * widest) + E * ff * d * f16
    # or, where larger, the worst-case graph's logits of every token and the head's input (f32)
    compute = max(compute, f32 * n_ub * (m.n_vocab + d))
    margin = scn.placement.fit_target_mib[0] * MiB
    pool = scn.hardware.vram_bytes - scn.hardware.vram_reserved_bytes - weights - kv - compute - staging_bytes - margin
    entry = 3 * ff * d * f16  # one expert of one layer: gate + up + down
    return dict(weights=weights, kv=kv, compute=compute, margin=margin, pool=pool, entry=entry)


@pytest.mark.parametrize("variant, staging", [
    ("cache_fit", lambda e: 0), ("slots3+cache_fit", lambda e: 3 * e),
    ("prefetch_ungated+cache_fit", lambda e: 2 * e)])
def test_fit_pool_is_capacity_minus_weights_kv_compute_staging_and_the_fit_target(variant, staging):
    """A hand-computed example: pool = VRAM − reserved − weights − KV − compute − staging − fit
    target; the cache holds ⌊pool / entry⌋ whole entries, at most the host's experts, and leaves
    the target (and, when the pool is the limit, less than an entry) free. Staging: 3 slots of the largest expert tensor, or the 2 buffers of weight
    prefetch, each the largest host weight (an expert tensor: 8 x 32 x 64 x 2 B)."""
    scn = toy()
    exp_tensor = 8 * 32 * 64 * 2
    want = by_hand(scn, staging(exp_tensor))
    (b,) = account(scn, parse_variant(variant))
    assert (b.weights_bytes, b.kv_bytes, b.compute_bytes) == (want["weights"], want["kv"], want["compute"])
    assert b.staging_bytes == staging(exp_tensor)
    assert b.cache_fit and b.fit_margin_bytes == want["margin"]
    assert b.cache_pool_bytes == want["pool"] > 0
    from sim.model.vram import host_experts

    n_host = host_experts(scn.model, scn.placement)
    assert b.cache_experts == min(int(want["pool"] // want["entry"]), n_host)
    assert b.cache_bytes == b.cache_experts * want["entry"]
    assert want["margin"] <= b.free_bytes
    if b.cache_experts < n_host:  # a pool that holds fewer than the host's experts is filled
        assert b.free_bytes < want["margin"] + want["entry"]
    # the builder's cache gets that capacity
    ctx = make_context(scn, parse_variant(variant), np.random.default_rng(0))
    assert ctx.cache.capacity_experts == b.cache_experts and ctx.cache.policy == "lru"


@pytest.mark.parametrize("prefetch", ["prefetch_ungated", "prefetch_gated_512", "slots2", "slots4",
                                      "slots2+prefetch_ungated"])
@pytest.mark.parametrize("scenario", [None, "default.toml", "h200x2-qwen3-30b-a3b.toml"])
def test_fit_pool_with_prefetch_is_smaller_by_exactly_the_staging(prefetch, scenario):
    """Prefetch staging comes out of the fitted pool byte for byte, per GPU; a gated prefetch
    reserves (and costs the pool) as much as an ungated one, whether or not its gate skips."""
    scn = toy() if scenario is None else load_scenario(ROOT / "scenarios" / scenario)
    plain = account(scn, parse_variant("cache_fit"))
    pre = account(scn, parse_variant(f"{prefetch}+cache_fit"))
    assert any(b.staging_bytes > 0 for b in pre)
    for a, b in zip(plain, pre):
        assert a.staging_bytes == 0
        assert a.cache_pool_bytes - b.cache_pool_bytes == b.staging_bytes
    # fewer entries in all (per GPU the share may move: entries beyond the host's experts are
    # not held, and the held ones are spread by each GPU's room)
    assert sum(b.cache_experts for b in pre) <= sum(a.cache_experts for a in plain)
    if prefetch.startswith("prefetch_gated"):
        ung = account(scn, parse_variant("prefetch_ungated+cache_fit"))
        assert [b.cache_pool_bytes for b in pre] == [b.cache_pool_bytes for b in ung]


def test_fit_target_defaults_to_llama_cpp_and_only_the_fitted_pool_leaves_it():
    """llama.cpp's default fit target (common.h: 1024 MiB per device) when the scenario gives
    none; an LRU cache not sized by the fit still takes every free byte, up to the host's
    experts."""
    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    assert scn.placement.fit_target_mib == ()
    fit = account(scn, parse_variant("cache_fit"))
    lru = account(scn, parse_variant("cache_lru"))
    assert FIT_TARGET_MIB_DEFAULT == 1024
    for f, r in zip(fit, lru):
        assert f.fit_margin_bytes == 1024 * MiB and r.fit_margin_bytes == 0 and not r.cache_fit
        assert r.cache_pool_bytes - f.cache_pool_bytes == 1024 * MiB
        assert f.free_bytes >= 1024 * MiB
        # the LRU pool takes every free byte, up to the host's experts (then both hold them all)
        from sim.model.vram import host_experts

        n_host = host_experts(scn.model, scn.placement)
        assert 1024 * MiB > r.free_bytes or r.cache_experts == n_host == f.cache_experts


def test_fit_target_per_gpu_as_llama_cpp_parses_it():
    """``-fitt 512`` applies to every GPU; ``-fitt 512,256`` sets GPU 0 and 1; GPUs the list does
    not reach keep the default."""
    scn = load_scenario(ROOT / "scenarios" / "h200x2-qwen3-30b-a3b.toml")
    for given, want in (((512,), (512, 512)), ((512, 256), (512, 256)), ((), (1024, 1024))):
        pl = replace(scn.placement, fit_target_mib=given)
        assert tuple(pl.fit_margin_bytes(g) / MiB for g in range(2)) == want
        got = account(scn.with_(placement=pl), parse_variant("cache_fit"))
        assert tuple(b.fit_margin_bytes / MiB for b in got) == want
    assert replace(scn.placement, fit_target_mib=(512,)).fit_margin_bytes(5) == 512 * MiB
    assert replace(scn.placement, fit_target_mib=(512, 256)).fit_margin_bytes(5) == 1024 * MiB


def test_impossible_fit_is_a_placement_error_naming_the_fit_target():
    """Nothing left for one cache entry on any GPU after the fit target: a PlacementError with
    the per-GPU figures and what to change, naming placement.fit_target_mib and the file."""
    scn = load_scenario(ROOT / "scenarios" / "tiny" / "tiny.toml")  # a 1 GB GPU: below the default 1024 MiB
    for v in ("cache_fit", "slots2+cache_fit"):
        with pytest.raises(PlacementError) as info:
            account(scn, parse_variant(v))
        err = info.value
        assert err.field == "placement.fit_target_mib" and err.file == scn.file
        msg = str(err)
        assert "\n" not in msg and "no room for one expert" in msg and "fit target 1024 MiB" in msg and v in msg
        with pytest.raises(PlacementError):
            make_context(scn, parse_variant(v), np.random.default_rng(0))
    # a small enough target fits
    small = scn.with_(placement=replace(scn.placement, fit_target_mib=(1,)))
    assert account(small, parse_variant("cache_fit"))[0].cache_experts > 0


def test_fit_experts_with_a_fitted_cache_leaves_the_target_and_one_entry():
    """``fit_experts`` with ``expert_cache = "fit"``: the smallest n_cpu_moe whose placement leaves
    the fit target plus one cache entry free; one fewer host layer does not."""
    base = toy(n_layer=4, n_cpu_moe=0)
    entry = 3 * 8 * 32 * 64 * 2
    probe = account(base, parse_variant("baseline"))[0]
    # a GPU where every expert layer on the GPU leaves less than the target + an entry
    target = 1
    cap = probe.total_bytes + target * MiB - 2 * entry
    scn = base.with_(hardware=replace(base.hardware, vram_bytes=cap),
                     placement=replace(base.placement, fit_experts=True, fit_target_mib=(target,)))
    v = parse_variant("cache_fit")
    n = fit_n_cpu_moe(scn, v)
    assert 0 < n <= scn.model.n_layer
    b = account(scn, v, replace(scn.placement, n_cpu_moe=n))[0]
    assert b.cache_experts >= 1 and b.free_bytes >= target * MiB
    with pytest.raises(PlacementError):
        account(scn, v, replace(scn.placement, n_cpu_moe=n - 1))


def test_fitted_cache_runs_and_reports_its_pool(tmp_path, capsys):
    """``prefetch-sim run --vram`` lists the pool per variant and GPU, how it was sized and the
    entries it holds; the plan's cache has that many entries."""
    from sim import cli

    text = (ROOT / "scenarios" / "tiny" / "tiny.toml").read_text()
    tiny = ROOT / "scenarios" / "tiny"
    text = text.replace('model = "tiny-moe.toml"', f'model = "{tiny / "tiny-moe.toml"}"')
    text = text.replace('hardware = "tiny-gpu.toml"', f'hardware = "{tiny / "tiny-gpu.toml"}"')
    text = text.replace("ctx_size = 256", "ctx_size = 256\nfit_target_mib = 700")
    text += '\n[[variant]]\nname = "fitted"\nexpert_cache = "fit"\n'
    path = tmp_path / "fit.toml"
    path.write_text(text)
    scn = load_scenario(path)
    (b,) = account(scn, scn.variants[-1])
    assert b.cache_fit and b.cache_experts > 0
    rc = cli.main(["run", str(path), "-r", "1", "-q", "--vram"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = [r for r in out.splitlines() if r.startswith("| fitted | 0 | fit |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[3] == "700" and int(cells[5]) == b.cache_experts
    assert float(cells[4]) == pytest.approx(b.cache_pool_bytes / 2**30, abs=0.005)
    plan = build_plan(scn, scn.variants[-1], BenchTest(0, 4, 0), np.random.default_rng(0))
    assert plan.meta["cache_hit_rate"] is not None


def test_fitt_on_the_command_line_is_not_counted_twice():
    """llama-bench's ``-fitt M`` is the placement's fit target (M MiB left free by the n_cpu_moe
    fit and by a fitted cache pool), not reserved VRAM: a fitted cache's pool equals the one of
    a scenario with fit_target_mib = M, and the reserved VRAM is the profile's."""
    from test_cli_llamabench import scn_of

    flagged = scn_of("-fitt", "300", "--variant", "cache_fit")
    assert flagged.placement.fit_target_mib == (300,) and flagged.placement.fit_experts
    plain = scn_of("--variant", "cache_fit")
    assert flagged.hardware.vram_reserved_bytes == plain.hardware.vram_reserved_bytes
    # -fitt refits from n_cpu_moe 0 (llama-bench's fit replaces -ncmoe)
    plain = plain.with_(placement=replace(plain.placement, fit_target_mib=(300,), fit_experts=True, n_cpu_moe=0))
    v = parse_variant("cache_fit")
    n = fit_n_cpu_moe(flagged, v)
    assert n == fit_n_cpu_moe(plain, v)
    a = account(flagged, v, replace(flagged.placement, n_cpu_moe=n))
    b = account(plain, v, replace(plain.placement, n_cpu_moe=n))
    assert [x.cache_pool_bytes for x in a] == [x.cache_pool_bytes for x in b]
    assert [x.reserved_bytes for x in a] == [x.reserved_bytes for x in b]
    assert [x.fit_margin_bytes for x in a] == [300 * MiB] * len(a)


def test_the_ncmoe_fit_leaves_the_fit_target_free():
    """With a fit target (-fitt) the n_cpu_moe fit picks the fewest host blocks that leave the
    target free on every GPU: at its choice free >= target, one block fewer does not; a larger
    target never needs fewer host blocks; past what any placement leaves, the error names the
    fit target."""
    from test_cli_llamabench import scn_of

    v = parse_variant("baseline")
    base = scn_of()
    free0 = min(b.free_bytes for b in account(base, v, replace(base.placement, n_cpu_moe=base.model.n_layer)))
    free_gpu = min(b.free_bytes for b in account(base, v, replace(base.placement, n_cpu_moe=0)))
    assert free0 > free_gpu
    last = -1
    seen = set()
    for mib in [0, *np.linspace(free_gpu / MiB - 1, free0 / MiB, 12).astype(int).tolist()]:
        scn = base.with_(placement=replace(base.placement, fit_experts=True, n_cpu_moe=0, fit_target_mib=(mib,)))
        n = fit_n_cpu_moe(scn, v)
        got = account(scn, v, replace(scn.placement, n_cpu_moe=n))
        assert all(b.free_bytes >= mib * MiB and b.fit_margin_bytes == mib * MiB for b in got)
        if n > 0:
            fewer = account(scn, v, replace(scn.placement, n_cpu_moe=n - 1))
            assert any(b.free_bytes < mib * MiB for b in fewer)
        assert n >= last
        last = n
        seen.add(n)
    assert len(seen) > 1  # the sweep moved the fit
    over = base.with_(placement=replace(base.placement, fit_experts=True, n_cpu_moe=0,
                                        fit_target_mib=(int(free0 / MiB) + 2,)))
    with pytest.raises(VramOverflowError, match="fit target"):
        fit_n_cpu_moe(over, v)


def test_cache_fit_variant_spellings():
    # spaces around "+" and upper case are not part of the label (fresh-user round 8: "slots3 + cache_lru"
    # kept its spaces, another build id than slots3+cache_lru)
    assert parse_variant("Slots3 + cache_LRU").name == parse_variant("slots3+cache_lru").name == "slots3+cache_lru"
    v = parse_variant("slots2+cache_fit")
    assert (v.expert_cache, v.cache_policy, v.expert_slots) == ("fit", "lru", 2)
    assert parse_variant("cache_lfu").cache_policy == "lfu"
    assert not v.is_baseline


def test_an_expert_cache_never_holds_more_experts_than_the_host_has():
    """A pool with room for more entries than there are host-resident experts holds exactly the
    host-resident experts (n_expert per host MoE layer), not the pool's worth."""
    from sim.model.vram import host_experts

    scn = load_scenario("scenarios/default.toml")
    n_host = host_experts(scn.model, scn.placement)
    assert n_host == scn.placement.n_cpu_moe * scn.model.moe.n_expert > 0
    b = account(scn, parse_variant("cache_lru"))[0]
    assert b.cache_experts == n_host and b.cache_pool_bytes > 2 * b.cache_bytes
    resident = replace(scn.placement, n_cpu_moe=0)
    assert host_experts(scn.model, resident) == 0
    assert account(scn, parse_variant("cache_lru"), resident)[0].cache_experts == 0


def test_run_notes_a_kv_cache_sized_past_llama_benchs_context(capsys):
    """run's VRAM figures size the KV cache to the scenario's ctx_size (16384 in the default
    scenario); llama-bench sizes it to n_prompt + n_gen + n_depth: a note says so when they differ,
    and only when the output shows VRAM."""
    from sim.cli import main

    base = ["run", "--variant", "baseline", "-r", "1", "-q", "-n", "0"]
    assert main(base + ["-p", "512", "-o", "json"]) == 0
    err = capsys.readouterr().err
    assert "placement.ctx_size, 16384 tokens" in err and "at most 512 here" in err
    assert main(base + ["-p", "512"]) == 0  # md without --vram: no VRAM shown, no note
    assert "placement.ctx_size" not in capsys.readouterr().err
    assert main(base + ["-p", "512", "-d", "16000", "-o", "json"]) == 0  # 16512 > 16384: sized as llama-bench
    assert "placement.ctx_size" not in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.toml")), ids=lambda p: p.stem)
def test_account_with_the_layer_devices_given_is_the_account(path):
    """account given the layer devices (what make_context computes once for both) equals
    account computing them, every variant of every shipped scenario (or both refuse)."""
    from sim.model.vram import layer_devices

    scn = load_scenario(path)
    for v in scn.variants:
        devs = layer_devices(scn.model, scn.placement, scn.hardware.n_gpu)
        try:
            want = account(scn, v)
        except PlacementError as e:
            with pytest.raises(type(e)):
                account(scn, v, layer_dev=devs)
            continue
        assert account(scn, v, layer_dev=devs) == want
        assert devs == layer_devices(scn.model, scn.placement, scn.hardware.n_gpu)


def test_output_layer_goes_where_the_layer_split_puts_index_n_layer():
    """llama.cpp's output layer sits on the device the layer split gives index ``n_layer``
    (``dev_output = get_layer(n_layer)``): the last GPU with equal shares, the main GPU under
    ``-sm none`` (a split of one GPU), GPU 0 with ``-ts 1/0``; a GPU that then runs nothing holds
    no weights and no compute buffer."""
    from dataclasses import replace as _replace

    from sim.model.specs import load_scenario, parse_variant
    from sim.model.vram import account, layer_devices, output_device

    scn = load_scenario(ROOT / "scenarios" / "h200x2-qwen3-30b-a3b.toml")
    m, pl = scn.model, scn.placement
    assert scn.hardware.n_gpu == 2
    assert output_device(m, _replace(pl, tensor_split=()), 2) == 1
    assert output_device(m, _replace(pl, tensor_split=(3.0, 1.0)), 2) == 1
    for main in (0, 1):
        one = _replace(pl, tensor_split=tuple(1.0 if i == main else 0.0 for i in range(2)))
        assert output_device(m, one, 2) == main
        assert set(layer_devices(m, one, 2)) <= {main, -1}
        v = account(scn.with_(placement=one), parse_variant("baseline"))
        other = v[1 - main]
        assert other.weights_bytes == 0 and other.kv_bytes == 0 and other.compute_bytes == 0
        assert v[main].weights_bytes > 0 and v[main].compute_bytes > 0


def test_kv_cells_are_padded_as_llama_cpp_pads_the_context():
    """llama_context pads n_ctx to 256 cells; an iSWA model's SWA cache holds
    pad(min(n_ctx, n_swa + n_ubatch)) (llama_kv_cache_iswa)."""
    from sim.model.vram import kv_cells

    assert [kv_cells(c, 0, 512) for c in (1, 32, 256, 257, 8320)] == [256, 256, 256, 512, 8448]
    # gpt-oss at depth 8192 + 128 tokens: 8448 cells, its SWA layers (window 128) 768 (the
    # ground truth's log: "creating non-SWA KV cache, size = 8448 cells", "SWA KV cache, size = 768")
    assert (kv_cells(8320, 0, 512), kv_cells(8320, 128, 512)) == (8448, 768)
    assert kv_cells(100, 128, 512) == 256  # never more than the context's own cells


def test_host_resident_weights_beyond_the_host_memory_are_refused():
    """A profile that knows its host's RAM (host_memory_gb) refuses a placement whose host
    weights (and CPU layers' KV) exceed it; a profile without it checks nothing."""
    from sim.model.vram import host_flags

    scn = make_scenario()
    on_host = sum(t.nbytes for t, h in zip(scn.model.tensors, host_flags(scn.model, scn.placement))
                  if h and not t.duplicate)
    assert on_host > 0
    roomy = scn.with_(hardware=replace(scn.hardware, host_memory_bytes=on_host * 1.01))
    account(roomy, parse_variant("baseline"))
    tight = scn.with_(hardware=replace(scn.hardware, host_memory_bytes=on_host * 0.99))
    with pytest.raises(PlacementError, match=r"more than the .* GiB of host memory .*host_memory_gb") as e:
        account(tight, parse_variant("baseline"))
    assert e.value.field == "placement"
    account(scn.with_(hardware=replace(scn.hardware, host_memory_bytes=0.0)), parse_variant("baseline"))


def test_the_compute_buffer_holds_the_worst_case_graphs_logits():
    """llama.cpp reserves the compute buffer on a graph whose every token is an output
    (``n_outputs = min(n_tokens, n_outputs_max)``, ``llama_context``): the head's f32 logits of
    the reserved tokens and its normed input, on the GPU holding the output layer; a layer's
    activations and one host weight's copy where larger. None when the output layer is on the CPU.
    Measured against llama.cpp's own ``CUDA0 compute buffer size`` in
    test_vramcheck_prices_the_committed_leases_compute_buffers."""
    from sim.model.specs import load_model
    from sim.model.vram import output_device

    scn = load_scenario(ROOT / "scenarios" / "default.toml")
    m = load_model(ROOT / "scenarios" / "models" / "qwen3-30b-a3b.toml")
    wl = replace(scn.workload, n_ubatch=512, n_batch=2048)
    res = scn.with_(model=m, workload=wl, placement=replace(scn.placement, n_cpu_moe=0, ctx_size=4096))
    head = 4.0 * 512 * (m.n_vocab + m.d_model)
    assert account(res, parse_variant("baseline"))[0].compute_bytes == pytest.approx(head)   # 300.75 MiB
    small = res.with_(workload=replace(wl, n_ubatch=64))        # the worst case is 64 tokens
    assert account(small, parse_variant("baseline"))[0].compute_bytes == pytest.approx(head / 8)
    # the output layer on the CPU (-ngl 0; llama.cpp offloads it first, with any -ngl >= 1): the
    # head runs on the first GPU from the op-offload batch on, on the CPU below it
    assert res.with_(placement=replace(res.placement, ngl=1)).placement.output_on_gpu()
    cpu_head = res.with_(placement=replace(res.placement, ngl=0))
    assert account(cpu_head, parse_variant("baseline"))[0].compute_bytes == pytest.approx(head)
    below = cpu_head.with_(workload=replace(wl, n_ubatch=16))
    assert account(below, parse_variant("baseline"))[0].compute_bytes < head / 32 / 4
    # host experts at 64 tokens: the copy of the largest expert tensor is the larger peak
    host = small.with_(placement=replace(small.placement, n_cpu_moe=48))
    assert account(host, parse_variant("baseline"))[0].compute_bytes > 100 * MiB > head / 8
    # two GPUs: the logits are the output GPU's alone
    x2 = load_scenario(ROOT / "scenarios" / "h200x2-qwen3-30b-a3b.toml")
    x2 = x2.with_(workload=replace(x2.workload, n_ubatch=512, n_batch=2048),
                  placement=replace(x2.placement, n_cpu_moe=0, ctx_size=4096))
    v = account(x2, parse_variant("baseline"))
    out = output_device(x2.model, x2.placement, 2)
    assert v[out].compute_bytes == pytest.approx(4.0 * 512 * (x2.model.n_vocab + x2.model.d_model))
    assert v[1 - out].compute_bytes < v[out].compute_bytes / 4


def test_vramcheck_prices_the_committed_leases_compute_buffers():
    """Against llama.cpp's own ``CUDA0 compute buffer size`` and cudaMemGetInfo's used memory in
    a committed lease's logs (two models, resident and host experts, ubatch 512 and 2048, the
    prefetch variants' staging): every context's compute buffer within 13 % and its total within
    8 % (docs/llamacpp.md; the whole set: python -m calibrate.llamacpp.vramcheck). Before the
    logits were counted, Gemma's compute buffer was 72 % short."""
    from calibrate.llamacpp.vramcheck import check
    from sim.model.specs import load_hardware

    hw = load_hardware(ROOT / "scenarios" / "hardware" / "h200-llamacpp.toml")
    df = check(ROOT / "data" / "llamacpp" / "h200-20261202-prefetch2", hw)
    assert len(df) >= 10 and df["model"].str.startswith("gemma3").any() and df["model"].str.startswith("qwen3").any()
    comp = df["predicted_compute_mib"] / df["compute_mib"] - 1
    total = df["predicted_total_mib"] / df["used_mib"] - 1
    assert comp.abs().max() < 0.13 and total.abs().max() < 0.08


def test_vramcheck_names_a_missing_run_folder(tmp_path, capsys):
    from calibrate.llamacpp.vramcheck import main

    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nope: no such run folder" in err
    assert main([str(tmp_path)]) == 2     # a folder without lease logs
    assert "no row with llama.cpp's compute buffer line" in capsys.readouterr().err


def test_a_workload_refuses_a_negative_token_count():
    from sim.model.specs import Workload

    for field in ("n_prompt", "n_gen", "n_depth"):
        with pytest.raises(ValueError, match=f"Workload.{field}: -3 is negative"):
            Workload(**{field: (512, -3)})
    assert [t.name for t in Workload(n_prompt=(0, 64), n_gen=(0,)).tests()] == ["pp64"]
