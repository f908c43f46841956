"""Tests of sim.plan.cache: exact LRU/LFU behaviour on hand-made sequences, invariants (hypothesis)
against a naive reference, and LRU's hit rate under independent requests against the exact
stationary formula."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.plan.cache import ExpertCache

ROOT = Path(__file__).resolve().parent.parent


def ids(*xs):
    return np.array(xs, dtype=np.int64)


def check(res, hits, misses, evicted):
    assert res.hits.tolist() == list(hits)
    assert res.misses.tolist() == list(misses)
    assert res.evicted == list(evicted)


def test_lru_hand_sequence():
    c = ExpertCache(3, "lru")
    check(c.access(0, ids(1, 2)), [], [1, 2], [])
    check(c.access(1, ids(1)), [], [1], [])          # (1, 1) is another entry than (0, 1)
    check(c.access(0, ids(1)), [1], [], [])          # recency now: (0,2) (1,1) (0,1)
    check(c.access(0, ids(3)), [], [3], [(0, 2)])    # LRU victim
    check(c.access(1, ids(1, 4)), [1], [4], [(0, 1)])
    assert c.keys() == [(0, 3), (1, 1), (1, 4)]
    check(c.access(0, ids(2, 1)), [], [2, 1], [(0, 3), (1, 1)])
    assert c.n_hits == 2 and c.n_misses == 7
    assert math.isclose(c.hit_rate, 2 / 9)
    assert (0, 2) in c and (0, 3) not in c
    assert c.resident(0).tolist() == [1, 2] and c.resident(1).tolist() == [4]


def test_lfu_hand_sequence():
    c = ExpertCache(2, "lfu")
    check(c.access(0, ids(1, 2)), [], [1, 2], [])
    check(c.access(0, ids(1)), [1], [], [])          # counts: 1 -> 2, 2 -> 1
    check(c.access(0, ids(3)), [], [3], [(0, 2)])    # lowest count
    check(c.access(0, ids(3)), [3], [], [])          # counts: 1 -> 2, 3 -> 2
    check(c.access(0, ids(4)), [], [4], [(0, 1)])    # tie: least recently used of count 2
    check(c.access(0, ids(5)), [], [5], [(0, 4)])    # new entries start at count 1
    check(c.access(0, ids(3, 3, 5)), [3, 3, 5], [], [])
    assert c.keys() == [(0, 5), (0, 3)]              # counts 2 and 4
    assert c.n_hits == 5 and c.n_misses == 5


def test_lfu_and_lru_differ_on_a_frequent_expert():
    seq = [ids(1), ids(1), ids(1), ids(2), ids(3), ids(1)]
    lru, lfu = ExpertCache(2, "lru"), ExpertCache(2, "lfu")
    for s in seq:
        lru.access(0, s)
        lfu.access(0, s)
    assert lru.n_hits == 2  # 1 evicted by 3 under LRU
    assert lfu.n_hits == 3  # 1 kept: it was used thrice


def test_duplicates_within_one_access_hit_the_fresh_entry():
    c = ExpertCache(4, "lru")
    check(c.access(2, ids(5, 5, 6)), [5], [5, 6], [])


def test_access_larger_than_capacity_evicts_its_own_misses():
    c = ExpertCache(2, "lru")
    check(c.access(0, ids(1, 2, 3, 4)), [], [1, 2, 3, 4], [(0, 1), (0, 2)])
    assert len(c) == 2


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_capacity_zero_misses_everything(policy):
    c = ExpertCache(0, policy)
    assert c.hit_rate == 0.0
    for _ in range(3):
        check(c.access(0, ids(1, 1, 2)), [], [1, 1, 2], [])
    assert len(c) == 0 and c.n_misses == 9 and c.hit_rate == 0.0


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_reset_stats_keeps_entries(policy):
    c = ExpertCache(2, policy)
    c.access(0, ids(1, 2))
    c.reset_stats()
    assert c.n_accesses == 0 and c.hit_rate == 0.0
    check(c.access(0, ids(1, 2)), [1, 2], [], [])
    assert c.hit_rate == 1.0


def test_bad_arguments():
    with pytest.raises(ValueError):
        ExpertCache(-1)
    with pytest.raises(ValueError):
        ExpertCache(4, "fifo")
    with pytest.raises(ValueError):
        ExpertCache(2.5)


# --------------------------------------------------------------------------------------
# invariants against a naive reference
# --------------------------------------------------------------------------------------


class NaiveCache:
    """O(n) reference: a list of [key, count, last_access_time]."""

    def __init__(self, cap, policy):
        self.cap, self.policy, self.t, self.items = cap, policy, 0, {}
        self.hits = self.n = 0

    def access(self, layer, experts):
        hits, misses, ev = [], [], []
        for e in experts:
            key = (layer, int(e))
            self.t += 1
            if self.cap == 0:
                misses.append(int(e))
                continue
            if key in self.items:
                cnt, _ = self.items[key]
                self.items[key] = (cnt + 1, self.t)
                hits.append(int(e))
                continue
            misses.append(int(e))
            if len(self.items) >= self.cap:
                if self.policy == "lru":
                    victim = min(self.items, key=lambda k: self.items[k][1])
                else:
                    victim = min(self.items, key=lambda k: self.items[k])  # (count, last access)
                del self.items[victim]
                ev.append(victim)
            self.items[key] = (1, self.t)
        self.hits, self.n = self.hits + len(hits), self.n + len(hits) + len(misses)
        return hits, misses, ev


accesses = st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 6), max_size=5)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(cap=st.integers(0, 6), policy=st.sampled_from(["lru", "lfu"]), seq=accesses)
def test_cache_matches_reference_and_invariants(cap, policy, seq):
    c, ref = ExpertCache(cap, policy), NaiveCache(cap, policy)
    n = 0
    for layer, exps in seq:
        res = c.access(layer, ids(*exps))
        h, m, ev = ref.access(layer, exps)
        assert res.hits.tolist() == h and res.misses.tolist() == m and res.evicted == ev
        n += len(exps)
        assert len(res.hits) + len(res.misses) == len(exps)
        assert len(c) <= cap
        assert set(c.keys()) == set(ref.items)
        if cap and exps:  # LRU keeps the last cap keys used; any policy keeps the last one
            recent = exps[-cap:] if policy == "lru" else exps[-1:]
            assert all((layer, int(e)) in c for e in recent)
    assert c.n_hits + c.n_misses == n
    assert 0.0 <= c.hit_rate <= 1.0
    if n:
        assert math.isclose(c.hit_rate, c.n_hits / n)


# --------------------------------------------------------------------------------------
# LRU under independent requests vs theory
# --------------------------------------------------------------------------------------


def lru_hit_probability_exact(p, cap):
    """Stationary LRU hit probability under the independent reference model.

    The LRU stack's top ``cap`` entries are (i_1, ..., i_cap) with probability
    prod_j p_{i_j} / (1 - sum_{l<j} p_{i_l}) (King 1971, "Analysis of demand paging
    algorithms"; Flajolet, Gardy & Thimonier 1992); a request hits iff it is one of them.
    """
    total = 0.0
    for tup in itertools.permutations(range(len(p)), cap):
        prob, used = 1.0, 0.0
        for i in tup:
            prob *= p[i] / (1.0 - used)
            used += p[i]
        total += prob * used
    return total


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_lru_hit_rate_matches_king_formula(cap):
    p = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    rng = np.random.default_rng(cap)
    c = ExpertCache(cap, "lru")
    c.access(0, rng.choice(p.size, 2000, p=p))  # warm up to stationarity
    n_batches, batch = 100, 1000
    rates = np.array([len(c.access(0, rng.choice(p.size, batch, p=p)).hits) / batch for _ in range(n_batches)])
    se = rates.std(ddof=1) / math.sqrt(n_batches)  # batch means: batches far longer than the mixing time
    exact = lru_hit_probability_exact(p, cap)
    assert abs(rates.mean() - exact) < 4.5 * se, (rates.mean(), exact, se)
    # sanity of the formula: capacity 1 hits with probability sum p_i^2
    if cap == 1:
        assert math.isclose(exact, float((p**2).sum()))


# --------------------------------------------------------------------------------------
# the cache inside a run (decode misses on the CPU, prefill misses copied), against a reference
# replay of the same routing trace, with llama-bench's warm-up run
# --------------------------------------------------------------------------------------


def skewed_trace(path, *, n_layer, n_expert, top_k, n_tokens, zipf_s, seed):
    """Write a routing trace (CSV: layer, token, experts) drawn in this test, independently of
    sim.model.routing: per layer a random ranking of the experts, popularity ∝ rank^-zipf_s, each token
    takes top_k distinct experts by popularity. Returns ids (n_layer, n_tokens, top_k)."""
    rng = np.random.default_rng(seed)
    ids = np.empty((n_layer, n_tokens, top_k), dtype=np.int64)
    rows = ["layer,token,experts"]
    for lay in range(n_layer):
        pop = np.arange(1, n_expert + 1, dtype=float) ** -zipf_s
        pop = pop[rng.permutation(n_expert)]
        pop /= pop.sum()
        for tok in range(n_tokens):
            ids[lay, tok] = rng.choice(n_expert, top_k, replace=False, p=pop)
            rows.append(f"{lay},{tok}," + " ".join(map(str, ids[lay, tok])))
    path.write_text("\n".join(rows) + "\n")
    return ids


def replay(ref, ids, graphs, n_layer):
    """Feed a reference cache the accesses the scheduler makes for graphs ``(n_tokens, offset)``:
    per graph and layer, once, the distinct experts its tokens use, in increasing id order (trace
    tokens wrap around). Returns (hits, accesses)."""
    hits = n = 0
    T = ids.shape[1]
    for n_tok, off in graphs:
        for lay in range(n_layer):
            used = np.unique(ids[lay, (off + np.arange(n_tok)) % T].ravel())
            h, m, _ = ref.access(lay, used.tolist())
            hits, n = hits + len(h), n + len(used)
    return hits, n


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("test, cap", [((0, 24), 8), ((0, 24), 20), ((0, 24), 40), ((128, 0), 40)],
                         ids=["tg24-cap8", "tg24-cap20", "tg24-cap40", "pp128-cap40"])
def test_run_hit_rate_matches_a_reference_cache_over_a_skewed_trace(tmp_path, policy, cap, test):
    """``run``'s expert-cache hit rate (sim.engines.metrics.run_variant_test) equals a naive reference
    cache (NaiveCache, above) replaying the same skewed routing trace: llama-bench's warm-up run
    first (one generated token for tg, the whole prompt for pp: sim.engines.metrics.warmup_test; not
    counted), then the repetitions on the warm cache. At decode, the plan runs exactly the
    reference's hits on the GPU and its misses on the CPU, and copies the misses into the cache."""
    from scenario_factory import make_scenario
    from sim.plan.builder import build_plan, make_context
    from sim.engines.metrics import run_variant_test, warmup_test
    from sim.plan import OpKind
    from sim.model.routing import RoutingSpec
    from sim.model.specs import BenchTest, parse_variant

    n_layer, E, k, T = 3, 16, 2, 40
    ids = skewed_trace(tmp_path / "trace.csv", n_layer=n_layer, n_expert=E, top_k=k, n_tokens=T, zipf_s=1.2, seed=cap)
    ub = 32  # prefill: 4 graphs of 32 tokens (the op-offload minimum: the experts run on the GPU)
    scn = make_scenario(n_layer=n_layer, n_expert=E, top_k=k, n_ubatch=ub, cache=cap,
                        routing=RoutingSpec(kind="trace", trace_file=tmp_path / "trace.csv"))
    v = parse_variant(f"cache_{policy}")
    bt, reps = BenchTest(test[0], test[1], 0), 3

    def graphs(t):
        if t.n_prompt:
            return [(min(ub, t.n_prompt - o), o) for o in range(0, t.n_prompt, ub)]
        return [(1, j) for j in range(t.n_gen)]

    ref = NaiveCache(cap, policy)
    replay(ref, ids, graphs(warmup_test(bt)), n_layer)
    hits, n = replay(ref, ids, graphs(bt) * reps, n_layer)
    res = run_variant_test(scn, v, bt, reps)
    assert 0 < hits < n
    assert res.cache_hit_rate == pytest.approx(hits / n, rel=1e-12)
    if bt.n_prompt:
        return
    # the warm-up is llama-bench's one token, not the whole test: replaying the whole test as
    # warm-up gives another rate here
    ref2 = NaiveCache(cap, policy)
    replay(ref2, ids, graphs(bt), n_layer)
    h2, _ = replay(ref2, ids, graphs(bt) * reps, n_layer)
    assert h2 != hits
    # per access, at decode: hits on the GPU, misses on the CPU and copied in the background
    ctx = make_context(scn, v, np.random.default_rng(0))
    plan = build_plan(scn, v, bt, np.random.default_rng(0), ctx)
    ref3 = NaiveCache(cap, policy)
    exps = [t for t in scn.model.tensors if t.is_expert]
    per_layer = len(exps) // n_layer  # gate, up, down
    for j in range(bt.n_gen):
        for lay in range(n_layer):
            used = np.unique(ids[lay, j % T])
            h, m, _ = ref3.access(lay, used.tolist())
            ops = [o for o in plan.ops if o.graph == j and o.layer == lay]
            gpu = [o.shape[3] for o in ops if o.kind is OpKind.MOE and o.tag == "cache_hit"]
            cpu = [o.nbytes for o in ops if o.kind is OpKind.CPU_MATVEC and "_exps" in o.name]
            fill = [o.nbytes for o in ops if o.tag == "cache_fill"]
            missed = [len(m) * t.bytes_per_mat for t in exps if t.layer == lay] if m else []
            assert gpu == ([len(h)] * per_layer if h else []), (j, lay)
            assert cpu == missed and fill == missed, (j, lay)
    assert (ctx.cache.n_hits, ctx.cache.n_accesses) == (ref3.hits, ref3.n)


def test_skew_raises_the_run_hit_rate():
    """At equal capacity a skewed routing keeps more of the decode working set in the cache than
    a uniform one (sim.model.routing's own skewed model, the fit of the 256-expert reports)."""
    from scenario_factory import make_scenario
    from sim.engines.metrics import run_variant_test
    from sim.model.routing import RoutingSpec
    from sim.model.specs import BenchTest, parse_variant

    rates = {}
    for kind in ("uniform", "skewed"):
        scn = make_scenario(n_layer=2, n_expert=32, top_k=2, cache=16, routing=RoutingSpec(kind=kind))
        rates[kind] = run_variant_test(scn, parse_variant("cache_lru"), BenchTest(0, 64, 0), 2).cache_hit_rate
    assert rates["skewed"] > rates["uniform"] > 0


def test_each_gpu_caches_only_the_experts_of_the_layers_it_computes():
    """Two GPUs: a GPU's expert cache holds host experts of the layers whose expert matmuls it
    runs, so a GPU that computes none of them caches nothing, and the plan's cache is one per GPU
    (fresh-user round 8: laguna-2x3090's GPU 1 had held 414 experts that only GPU 0's layers
    use, a single cache of the summed capacity)."""
    from dataclasses import replace

    from sim.model.specs import load_scenario, parse_variant
    from sim.model.vram import account, cache_device, host_expert_layers, layer_devices
    from sim.plan.builder import make_context
    from sim.plan.cache import DeviceCaches

    scn = load_scenario(ROOT / "scenarios" / "laguna-2x3090.toml")
    scn = scn.with_(placement=replace(scn.placement, ctx_size=5000 + 32))
    v = parse_variant("cache_lru")
    pl = scn.placement
    devs = layer_devices(scn.model, pl, scn.hardware.n_gpu)
    owners = {cache_device(devs, i) for i in host_expert_layers(scn.model, pl)}
    vram = account(scn, v)
    for b in vram:
        if b.device not in owners:
            assert b.cache_experts == 0 and b.cache_bytes == 0
    assert sum(b.cache_experts for b in vram) > 0
    ctx = make_context(scn, v, np.random.default_rng(0))
    assert isinstance(ctx.cache, DeviceCaches)
    assert [c.capacity_experts for c in ctx.cache.caches] == [b.cache_experts for b in vram]
    layer = host_expert_layers(scn.model, pl)[0]
    ctx.cache.access(layer, np.arange(4))
    own = ctx.cache.caches[cache_device(devs, layer)]
    assert len(own) == min(4, own.capacity_experts) and ctx.cache.n_misses == 4


def test_device_caches_route_each_layer_to_its_gpu():
    from sim.plan.cache import DeviceCaches

    dc = DeviceCaches([2, 3], {0: 0, 1: 1})
    dc.access(0, np.array([5, 6, 7]))    # GPU 0's cache of 2: 7 evicts 5
    dc.access(1, np.array([5, 6, 7]))    # GPU 1's cache of 3 holds all three
    assert dc.resident(0).tolist() == [6, 7] and dc.resident(1).tolist() == [5, 6, 7]
    r = dc.access(0, np.array([5]))
    assert r.misses.tolist() == [5] and dc.access(1, np.array([5])).hits.tolist() == [5]
    assert dc.n_accesses == 8 and dc.hit_rate == pytest.approx(1 / 8) and len(dc) == 5


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "gpt-oss-20b"])
def test_a_decode_whose_experts_all_hit_is_priced_as_fully_resident(model):
    """docs/model.md ("Expert cache"): a decode where every expert hits prices as fully resident,
    an upper bound. Once the cache holds every host expert (the third repetition of a long decode
    on llama.cpp's profile), each repetition's time equals the resident placement's, the graph
    that a KV window rebuilds included: the hits' bias adds and GLU stay among the layer's GPU
    kernels (none is taken to a CPU split that no longer runs) and their kernels are launched
    one by one in a rebuilt graph like the resident experts'."""
    from dataclasses import replace

    from sim.engines.metrics import run_variant_test
    from sim.model.specs import BenchTest, load_model, load_scenario, parse_variant

    base = load_scenario(ROOT / "scenarios/default.toml")
    base = base.with_(model=load_model(ROOT / f"scenarios/models/{model}.toml"))
    test = BenchTest(0, 300, 0)   # crosses a 256-cell KV window: one graph is rebuilt
    n_moe = base.model.n_layer

    def tps(n_cpu_moe):
        scn = base.with_(placement=replace(base.placement, n_cpu_moe=n_cpu_moe, ctx_size=512))
        r = run_variant_test(scn, parse_variant("cache_lru"), test, 3)
        return r.tps, r.cache_hit_rate

    resident, _ = tps(0)
    for n in (n_moe // 2, n_moe):
        cached, rate = tps(n)
        assert 0 < rate < 1                              # misses while the cache warms up
        assert cached[0] < resident[0]                   # the misses ran on the CPU
        assert cached[2] == pytest.approx(resident[2], rel=1e-12), n
        assert np.all(cached <= resident * (1 + 1e-12)), n


def test_the_overlap_share_is_the_mean_of_the_repetitions_that_copied():
    """A warm expert cache's later repetitions copy nothing (their overlap share is undefined,
    NaN); the test's share is the mean over those that copied, not NaN (fresh-user round 12:
    overlap_fraction null in run's JSON and empty in crossover figure d's CSV)."""
    from dataclasses import replace

    from sim.engines.metrics import run_variant_test
    from sim.model.specs import BenchTest, load_scenario, parse_variant

    scn = load_scenario(ROOT / "scenarios/qwen3-30b-a3b-rtx3090.toml")
    scn = scn.with_(placement=replace(scn.placement, expert_cache_experts=512))
    v = parse_variant("cache_lru")
    one = run_variant_test(scn, v, BenchTest(0, 32, 0), 1)
    five = run_variant_test(scn, v, BenchTest(0, 32, 0), 5)
    assert one.h2d_bytes > 0 and 0 < one.overlap_fraction <= 1
    assert five.h2d_bytes < one.h2d_bytes            # the later repetitions hit (and copy less or nothing)
    assert five.overlap_fraction == five.overlap_fraction and 0 < five.overlap_fraction <= 1
