"""GPU expert cache: hot experts kept in VRAM so that a hit skips the H2D copy.

One cache entry is one expert of one layer, ``(layer, expert)``, and holds **all** of that
expert's tensors of that layer (``ffn_gate_exps``, ``ffn_up_exps`` and ``ffn_down_exps``, or
the fused ``ffn_gate_up_exps`` and ``ffn_down_exps``): an entry costs the sum of the
``bytes_per_mat`` of the layer's expert tensors (quant types may differ per tensor and layer,
so entries of different layers may differ in size; the capacity here counts entries, the
VRAM planner turns bytes into a count). Capacity is shared by all layers of one GPU; with
several GPUs each has its own cache (:class:`DeviceCaches`) of the layers whose expert matmuls
it runs.

Policies (docs/DESIGN.md, "GPU expert cache"):

``lru``
    Least recently used: a hit moves the entry to the most-recent end; a miss is inserted
    there and, when full, the least recently used entry is evicted. A
    :class:`collections.OrderedDict` in recency order.
``lfu``
    Least frequently used, *in-cache* frequency: an entry's count starts at 1 when it is
    inserted and grows by 1 per hit; it is forgotten on eviction. The victim is the entry with
    the lowest count, ties broken by least recent access (LRU among equals). O(1) per access
    with one :class:`~collections.OrderedDict` per count (the LFU scheme of Shah, Mitra &
    Matani, "An O(1) algorithm for implementing the LFU cache eviction scheme", 2010).

Accesses of one :meth:`ExpertCache.access` call are processed in array order, each a full
access: a miss is inserted at once, so a later id of the same call can hit it, and when a call
uses more experts than the capacity, its own earlier misses can be evicted by its later ones
(the real scheduler then streams those through a staging buffer; they count as misses here).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

CACHE_POLICIES = ("lru", "lfu")

Key = tuple[int, int]


@dataclass(frozen=True)
class CacheResult:
    """Outcome of one :meth:`ExpertCache.access`.

    Attributes:
        hits: int64 (n_hits,) expert ids found in the cache, in access order.
        misses: int64 (n_misses,) expert ids not found (to be copied), in access order.
        evicted: ``(layer, expert)`` entries evicted to make room, in eviction order.
    """

    hits: np.ndarray
    misses: np.ndarray
    evicted: list[Key] = field(default_factory=list)


class _HitStats:
    """``n_accesses`` and ``hit_rate`` from a cache's ``n_hits`` and ``n_misses``."""

    n_hits: int
    n_misses: int

    @property
    def n_accesses(self) -> int:
        return self.n_hits + self.n_misses

    @property
    def hit_rate(self) -> float:
        """Hits / accesses since construction or ``reset_stats`` (every GPU's, for
        :class:`DeviceCaches`), in [0, 1]; 0.0 before any access."""
        n = self.n_accesses
        return self.n_hits / n if n else 0.0


class ExpertCache(_HitStats):
    """A cache of ``(layer, expert)`` entries with LRU or LFU eviction.

    Args:
        capacity_experts: entries the cache holds (all layers together); 0 = no cache, every
            access misses and nothing is stored.
        policy: ``"lru"`` or ``"lfu"`` (see the module docstring).

    Raises:
        ValueError: a negative capacity or an unknown policy.
    """

    def __init__(self, capacity_experts: int, policy: str = "lru"):
        if isinstance(capacity_experts, bool) or int(capacity_experts) != capacity_experts or capacity_experts < 0:
            raise ValueError(f"capacity_experts must be an integer >= 0, got {capacity_experts!r}")
        if policy not in CACHE_POLICIES:
            raise ValueError(f"cache policy must be one of {CACHE_POLICIES}, got {policy!r}")
        self.capacity_experts = int(capacity_experts)
        self.policy = policy
        # LRU: key -> None in recency order (oldest first).
        self._lru: OrderedDict[Key, None] = OrderedDict()
        # LFU: key -> count, count -> keys in recency order, lowest count present.
        self._count: dict[Key, int] = {}
        self._by_count: dict[int, OrderedDict[Key, None]] = {}
        self._min_count = 0
        self.n_hits = 0
        self.n_misses = 0

    # -- state --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._lru) if self.policy == "lru" else len(self._count)

    def __contains__(self, key: Key) -> bool:
        key = (int(key[0]), int(key[1]))
        return key in (self._lru if self.policy == "lru" else self._count)

    def keys(self) -> list[Key]:
        """Entries held, in eviction order (next victim first)."""
        if self.policy == "lru":
            return list(self._lru)
        return [k for c in sorted(self._by_count) for k in self._by_count[c]]

    def resident(self, layer: int) -> np.ndarray:
        """Sorted int64 expert ids of ``layer`` held in the cache."""
        return np.array(sorted(e for (lay, e) in self.keys() if lay == layer), dtype=np.int64)

    def reset_stats(self) -> None:
        """Zero the hit and miss counters (the cached entries stay)."""
        self.n_hits = 0
        self.n_misses = 0

    # -- access -------------------------------------------------------------------------
    def access(self, layer: int, experts: np.ndarray) -> CacheResult:
        """Look up the experts a ubatch uses in ``layer``; insert the misses.

        Args:
            layer: the layer.
            experts: int array (n,) of expert ids (normally the distinct used experts, e.g.
                ``np.flatnonzero(router.used_mask(...))``); processed in order.

        Returns:
            a :class:`CacheResult`; ``len(hits) + len(misses) == n``.
        """
        ids = np.asarray(experts, dtype=np.int64).ravel()
        layer = int(layer)
        hit_flags = np.zeros(ids.size, dtype=bool)
        evicted: list[Key] = []
        if self.capacity_experts > 0:
            touch = self._touch_lru if self.policy == "lru" else self._touch_lfu
            for i, e in enumerate(ids.tolist()):
                hit_flags[i] = touch((layer, e), evicted)
        n_hit = int(hit_flags.sum())
        self.n_hits += n_hit
        self.n_misses += ids.size - n_hit
        return CacheResult(hits=ids[hit_flags], misses=ids[~hit_flags], evicted=evicted)

    def _touch_lru(self, key: Key, evicted: list[Key]) -> bool:
        d = self._lru
        if key in d:
            d.move_to_end(key)
            return True
        if len(d) >= self.capacity_experts:
            evicted.append(d.popitem(last=False)[0])
        d[key] = None
        return False

    def _touch_lfu(self, key: Key, evicted: list[Key]) -> bool:
        cnt = self._count.get(key)
        if cnt is not None:
            bucket = self._by_count[cnt]
            del bucket[key]
            if not bucket:
                del self._by_count[cnt]
                if self._min_count == cnt:
                    self._min_count = cnt + 1
            self._count[key] = cnt + 1
            self._by_count.setdefault(cnt + 1, OrderedDict())[key] = None
            return True
        if len(self._count) >= self.capacity_experts:
            bucket = self._by_count[self._min_count]
            victim, _ = bucket.popitem(last=False)
            if not bucket:
                del self._by_count[self._min_count]
            del self._count[victim]
            evicted.append(victim)
        self._count[key] = 1
        self._by_count.setdefault(1, OrderedDict())[key] = None
        self._min_count = 1
        return False


class DeviceCaches(_HitStats):
    """One :class:`ExpertCache` per GPU, each serving the layers whose expert matmuls run there
    (``device_of[layer]``): an expert cached in one GPU's VRAM is of no use to a layer another
    GPU computes (a single cache of the GPUs' summed capacity had let GPU 0's layers use GPU 1's
    room: fresh-user round 8 on a two-GPU Laguna scenario). The interface the plan builder uses
    (:meth:`access`, :attr:`hit_rate`, :attr:`n_accesses`, :meth:`reset_stats`), summed over GPUs.

    Args:
        capacities: entries of each GPU's cache, by GPU index.
        device_of: layer -> the GPU whose cache serves it.
        policy: as :class:`ExpertCache`.
    """

    def __init__(self, capacities: list[int], device_of: dict[int, int], policy: str = "lru"):
        self.caches = [ExpertCache(c, policy) for c in capacities]
        self.device_of = dict(device_of)
        self.policy = policy
        self.capacity_experts = sum(int(c) for c in capacities)

    def access(self, layer: int, experts: np.ndarray) -> CacheResult:
        """:meth:`ExpertCache.access` on the cache of ``layer``'s GPU."""
        return self.caches[self.device_of.get(int(layer), 0)].access(layer, experts)

    @property
    def n_hits(self) -> int:
        return sum(c.n_hits for c in self.caches)

    @property
    def n_misses(self) -> int:
        return sum(c.n_misses for c in self.caches)

    def reset_stats(self) -> None:
        for c in self.caches:
            c.reset_stats()

    def __len__(self) -> int:
        return sum(len(c) for c in self.caches)

    def resident(self, layer: int) -> np.ndarray:
        """Sorted int64 expert ids of ``layer`` held by its GPU's cache."""
        return self.caches[self.device_of.get(int(layer), 0)].resident(layer)
