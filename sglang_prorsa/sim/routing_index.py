"""The cluster's per-request choices without a scan of every instance (cluster.py ``_route`` and ``_try_place``).

Both choices used to scan every active instance of the pool for each request: a cost per request that grew with the
cluster (benchmarks/bench_sim_scale.py). Here each pool keeps a heap of its instances with
lazy deletion: an instance is re-keyed only when the cluster marks it (``dirty``: its load may have changed) and the
next query comes, so a query costs O(instances changed since the last one x log pool) instead of O(pool).

The choice is the scan's, ties included: every key ends with a field unique in its pool (the instance id, which the
scan compared too, or the position in the pool, which was the scan's order on ties), so the minimum does not depend on
the heap's order. The cluster must mark an instance after every change to its requests (Cluster._touch).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from sglang_prorsa.sim.instance import INF, Instance

Entry = tuple[tuple, Instance]


def prefill_key(inst: Instance, _pos: int) -> tuple:
    """The router's least loaded order: fewest requests, then fewest queued prefill tokens, then id."""
    return inst.n_requests, inst.prefill_left, inst.iid


def decode_key(inst: Instance, pos: int) -> tuple | None:
    """A lower bound of the instance's best placement key (busy, n_requests, rank index, pos) whatever the request:
    its least busy rank that could admit anything (a free slot, nothing waiting ahead). None: it can admit nothing
    (every slot of the instance taken, or no such rank), so it is left out of the heap."""
    n = inst.n_requests
    if n >= inst.slots * len(inst.ranks):
        return None
    slots, best, index = inst.slots, INF, -1
    for k, rs in enumerate(inst.ranks):
        busy = len(rs.running) + rs.pending
        if busy < best and (busy == 0 or busy < slots) and not rs.admit and not rs.parked:
            best, index = busy, k
    return None if index < 0 else (best, n, index, pos)


class _Heap:
    """The instances of one pool, smallest key first. ``current[inst]`` is the instance's live entry; any other entry
    of the instance in the heap is stale and dropped when it reaches the top. ``dirty``: the pool's instances marked
    changed since the last query (the cluster adds, ``refresh`` empties)."""

    def __init__(self, pool: list[Instance], key: Callable[[Instance, int], tuple | None],
                 dirty: set[Instance]) -> None:
        self.pool, self.key, self.dirty = pool, key, dirty
        dirty.clear()
        self.pos = {inst: k for k, inst in enumerate(pool)}
        self.current: dict[Instance, Entry] = {}
        for k, inst in enumerate(pool):
            entry_key = key(inst, k)
            if entry_key is not None:
                self.current[inst] = (entry_key, inst)
        self.heap = list(self.current.values())
        heapq.heapify(self.heap)

    def refresh(self) -> None:
        """Re-key the marked instances of the pool (marks of others, switching instances, are dropped)."""
        key_of, pos, current, heap = self.key, self.pos, self.current, self.heap
        for inst in self.dirty:
            k = pos.get(inst)
            if k is None:
                continue
            key = key_of(inst, k)
            entry = current.get(inst)
            if entry is not None and entry[0] == key:
                continue
            if key is None:  # (its entry, if any, is now stale)
                current.pop(inst, None)
                continue
            new = current[inst] = (key, inst)
            if entry is not None and heap[0] is entry:  # usually the instance just chosen: nothing left stale
                heapq.heapreplace(heap, new)
            else:
                heapq.heappush(heap, new)
        self.dirty.clear()
        if len(heap) > 2 * len(self.pool) + 16:  # stale entries: rebuild, O(pool) once per ~pool pushes
            self.heap = list(current.values())
            heapq.heapify(self.heap)

    def top(self) -> Entry | None:
        """The live entry with the smallest key, after re-keying the marked instances."""
        if self.dirty:
            self.refresh()
        heap, current = self.heap, self.current
        while heap and current.get(heap[0][1]) is not heap[0]:
            heapq.heappop(heap)
        return heap[0] if heap else None


class RoutingIndex:
    """The prefill pool (colocated: every instance) by load, and the active decode instances by placement bound.

    ``dirty``: the cluster's two sets of changed instances, (prefill side, decode side), filed by the instance's
    role so that a query re-keys only its own pool's instances, once however often they changed meanwhile.
    ``visited`` counts the instances a decode placement examined (tests check that it does not grow with the pool).
    """

    def __init__(self, prefill_pool: list[Instance], decode_pool: list[Instance],
                 dirty: tuple[set[Instance], set[Instance]]) -> None:
        self.prefill = _Heap(prefill_pool, prefill_key, dirty[0])
        self.decode = _Heap(decode_pool, decode_key, dirty[1])
        self.visited = 0

    def in_prefill_pool(self, inst: Instance) -> bool:
        return inst in self.prefill.pos

    def least_loaded(self) -> Instance | None:
        """The prefill instance with the fewest requests, then queued tokens, then id (None: empty pool)."""
        top = self.prefill.top()
        return None if top is None else top[1]

    def place(self, tokens: int) -> tuple[Instance, int] | None:
        """(instance, rank) where a request of ``tokens`` KV would be admitted now: the least (busy requests on the
        rank, requests on the instance, rank index, position in the pool) among ranks with a slot and KV for it.

        Best first: instances come off the heap by their bound; each one's real best rank (Instance.best_rank) is
        at or above its bound, so the search stops at the first bound at or above the best found, or at a rank that
        meets its instance's bound. When the first instance's least busy rank fits, that is one instance examined;
        when nothing fits, every instance with a free slot is."""
        decode = self.decode
        best: Instance | None = None
        best_key: tuple | None = None
        taken: list[Entry] = []
        while True:
            entry = decode.top()
            if entry is None:
                break
            key, inst = entry
            if best_key is not None and key >= best_key:
                break
            self.visited += 1
            n = key[1]
            # the instance's least (busy, index) among ranks that could still win, as the scan did
            limit = INF if best_key is None else best_key[0] if n <= best_key[1] else best_key[0] - 1
            rank = inst.best_rank(tokens, limit)
            if rank is not None:
                found = (rank[0], n, rank[1], key[3])
                if found == key:  # at its bound, which is below every bound left and every key found
                    best, best_key = inst, found
                    break
                if best_key is None or found < best_key:
                    best, best_key = inst, found
            taken.append(heapq.heappop(decode.heap))
        for entry in taken:
            heapq.heappush(decode.heap, entry)
        if best is None or best_key is None:
            return None
        return best, best_key[2]
