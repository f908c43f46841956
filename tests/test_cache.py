"""Tests of sim.cache: exact LRU/LFU behaviour on hand-made sequences, invariants (hypothesis)
against a naive reference, and LRU's hit rate under independent requests against the exact
stationary formula."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cache import ExpertCache


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
