"""The cluster's routing index (sim/routing_index.py) against the scans it replaced: the same choices, ties included,
through role switches and load changes, at a cost that does not grow with the number of instances."""

import pytest

import sglang_prorsa.sim.cluster as cluster_module
from sglang_prorsa.policy.role_switch.capacity import InstanceStatus, Role
from sglang_prorsa.sim.cluster import Cluster
from sglang_prorsa.sim.config import ClusterConfig, DecodeParams, ModelConfig, PrefillParams, RolloutConfig, load_model
from sglang_prorsa.sim.events import EventQueue
from sglang_prorsa.sim.instance import INF, Instance, Request
from sglang_prorsa.sim.lifecycle_sink import NullLifecycle
from sglang_prorsa.sim.perf_model import PerfModel
from sglang_prorsa.sim.routing_index import RoutingIndex
from sglang_prorsa.sim.runner import simulate
from sglang_prorsa.sim.trainer import Trainer
from sglang_prorsa.sim.workloads import default_group_size, workload_tasks

# A toy decode instance: 2 ranks of 4 slots, 10,000 KV tokens each, 100 reserved per running request. A rank admits a
# request of x tokens when it is empty, or runs fewer than 4 and context + reserved + x + 100 x (busy + 1) <= 10,000.
PERF = PerfModel(ModelConfig(
    name="toy", gpus_per_instance=2, dp_ranks=2, chunk_tokens=1000, prefill=PrefillParams(0.1, 0.0, 0.0),
    decode=DecodeParams(0.01, 0.0, 0.0), kv_tokens_per_rank=10_000, kv_bytes_per_token=1, transfer_gbytes_per_s=1.0,
    max_running_per_rank=4, reserved_decode_tokens=100))


def scan_least(pool: list[Instance]) -> Instance | None:
    """cluster._route's former scan: fewest requests, then queued prefill tokens, then id."""
    least = None
    for inst in pool:
        if least is None or inst.n_requests < least.n_requests or inst.n_requests == least.n_requests and \
                (inst.prefill_left, inst.iid) < (least.prefill_left, least.iid):
            least = inst
    return least


def scan_place(pool: list[Instance], tokens: int) -> tuple[Instance, int] | None:
    """cluster._try_place's former scan: least (busy, requests on the instance, rank), the first instance on ties."""
    best, best_key = None, None
    for inst in pool:
        n = inst.n_requests
        if n >= inst.slots * len(inst.ranks):
            continue
        limit = INF if best_key is None else best_key[0] if n <= best_key[1] else best_key[0] - 1
        rank = inst.best_rank(tokens, limit)
        if rank is not None and (best_key is None or (rank[0], n, rank[1]) < best_key):
            best, best_key = inst, (rank[0], n, rank[1])
    return None if best is None else (best, best_key[2])


def toy(iid: str, role: Role = Role.DECODE, busy=(0, 0), reserved=(0, 0), n: int | None = None) -> Instance:
    """A decode instance whose ranks hold ``busy`` admitted requests (their KV ``reserved``); ``n`` requests in all."""
    inst = Instance(iid, PERF, role, None, None)
    for rs, b, kv in zip(inst.ranks, busy, reserved):
        rs.pending, rs.reserved = b, kv
    inst.n_requests = sum(busy) if n is None else n
    return inst


def index(prefill=(), decode=()) -> RoutingIndex:
    return RoutingIndex(list(prefill), list(decode), (set(), set()))


# ----- the choices, by hand -----
def test_least_loaded_orders_by_requests_then_queued_tokens_then_id_as_a_string():
    a, b, c, d = (toy(i, Role.PREFILL) for i in ("i0", "i1", "i9", "i10"))
    for inst, n, left in ((a, 3, 0), (b, 2, 500), (c, 2, 100), (d, 2, 100)):
        inst.n_requests, inst.prefill_left = n, left
    idx = index(prefill=[a, b, c, d])
    assert idx.least_loaded() is d  # 2 requests, 100 tokens: i9 and i10 tie, and "i10" < "i9"
    assert idx.least_loaded() is scan_least([a, b, c, d])
    assert index(prefill=[d, c, b, a]).least_loaded() is d  # the id decides, not the pool's order
    assert index().least_loaded() is None


def test_least_loaded_follows_marked_changes_only():
    a, b = toy("i0", Role.PREFILL), toy("i1", Role.PREFILL)
    idx = index(prefill=[a, b])
    dirty = idx.prefill.dirty
    assert idx.least_loaded() is a
    a.n_requests = 1
    assert idx.least_loaded() is a  # not marked: the index still holds a's old load (the cluster's contract)
    dirty.add(a)
    assert idx.least_loaded() is b and not dirty
    b.n_requests, b.prefill_left = 1, 10
    dirty.add(b)
    assert idx.least_loaded() is a  # 1 request each; a has 0 queued tokens, b 10
    a.n_requests = b.n_requests = 0
    dirty.update((a, b))
    assert idx.least_loaded() is a  # back to a tie on everything but the id


def test_place_takes_the_least_busy_rank_that_fits_then_the_least_loaded_instance():
    a = toy("i0", busy=(2, 1), reserved=(0, 3000))
    b = toy("i1", busy=(1, 3), reserved=(0, 0))
    c = toy("i2", busy=(1, 2), reserved=(9000, 0), n=3)
    idx = index(decode=[a, b, c])
    # 5,000 tokens: a's rank 1 (busy 1, 3 requests) fits (3000 + 5000 + 200); b's rank 0 is busy 1 with 4; c's rank 0
    # would need 9000 + 5000 + 200 > 10,000
    assert idx.place(5000) == (a, 1) == scan_place([a, b, c], 5000)
    # 7,000 tokens: a's rank 1 no longer fits (10,200): b's rank 0 (busy 1) beats a's rank 0 (busy 2)
    assert idx.place(7000) == (b, 0) == scan_place([a, b, c], 7000)
    # 9,800 tokens: b's rank 0 exactly (9800 + 200 = 10,000); 9,850: no rank has room, none is empty
    assert idx.place(9800) == (b, 0) == scan_place([a, b, c], 9800)
    assert idx.place(9850) is None is scan_place([a, b, c], 9850)


def test_place_breaks_ties_by_pool_order_not_id():
    x, y = toy("i9", busy=(1, 1)), toy("i10", busy=(1, 1))
    assert index(decode=[x, y]).place(100) == (x, 0)
    assert index(decode=[y, x]).place(100) == (y, 0)


def test_place_skips_full_instances_and_ranks_with_a_queue():
    full = toy("i0", busy=(0, 4), n=8)  # 8 requests = every slot of the instance: skipped though rank 0 is empty
    queued = toy("i1", busy=(0, 2), n=3)  # rank 0 has a request waiting for admission: nothing overtakes it
    queued.ranks[0].admit.append(object())
    last = toy("i2", busy=(3, 3))
    pool = [full, queued, last]
    idx = index(decode=pool)
    assert idx.place(100) == (queued, 1) == scan_place(pool, 100)
    queued.ranks[1].pending = 4  # rank 1 full too
    idx.decode.dirty.add(queued)
    assert idx.place(100) == (last, 0) == scan_place(pool, 100)


# ----- in the cluster: switches and status changes -----
def build(mode="static", gpus=64, prefill=2) -> tuple[EventQueue, Cluster]:
    model = load_model("mimo_v25_pro")
    rollout = RolloutConfig(preset="coding_agent", group_size=8, groups_per_step=2, steps=2)
    events = EventQueue()
    trainer = Trainer(rollout, workload_tasks("coding_agent"), events, None)
    config = ClusterConfig(gpus=gpus, mode=mode, prefill_instances=prefill)
    return events, Cluster(config, model, rollout, events, trainer, NullLifecycle())


def test_the_pools_follow_role_switches():
    events, cluster = build()  # i0, i1 prefill; i2, i3 decode; all empty
    i0, i1, i2, i3 = cluster.instances
    assert cluster._route(None)[0] is i0
    cluster.start_switch("i0", Role.DECODE, 0.0)
    assert i0.status is InstanceStatus.SWITCHING
    assert cluster._route(None)[0] is i1  # i0 left the prefill pool
    assert cluster._routing_pools().place(1000) == (i2, 0)  # and is not in the decode pool yet
    events.run(until=5.1)
    assert i0.status is InstanceStatus.ACTIVE and i0.role is Role.DECODE
    assert cluster._routing_pools().place(1000) == (i0, 0)  # decode pool [i0, i2, i3]: the first on ties
    assert cluster._try_place(Request(0, None, 1000, 1000, 10), 5.1)
    # i0 now busy 1 on rank 0 (1 request); i2 is empty: (0 busy, 0 requests) beats i0's rank 1 (0 busy, 1 request)
    assert cluster._routing_pools().place(1000) == (i2, 0)
    assert cluster._routing_pools().place(1000) == scan_place([i0, i2, i3], 1000)


class Checked(RoutingIndex):
    """Every answer compared with the scans it replaced."""

    queries = 0

    def least_loaded(self):
        got = super().least_loaded()
        assert got is scan_least(self.prefill.pool)
        Checked.queries += 1
        return got

    def place(self, tokens):
        got = super().place(tokens)
        assert got == scan_place(self.decode.pool, tokens)
        Checked.queries += 1
        return got


@pytest.mark.parametrize("mode, model, preset, decode_shape, staleness", [
    ("colocated", "mimo_v25_pro", "math", "same", 2),  # weight updates evict requests that are routed again
    ("colocated", "mimo_v25_pro", "coding_agent", "same", 0),  # long prompts: prefill progress without completions
    ("static", "deepseek_v32", "math", "same", 0),
    ("adaptive", "qwen3_235b", "math", "same", 2),  # switches both ways
    ("adaptive", "mimo_v25_pro", "math", "wide", 2),  # switches regroup instances
])
def test_every_choice_of_a_simulation_matches_the_scan(monkeypatch, mode, model, preset, decode_shape, staleness):
    monkeypatch.setattr(cluster_module, "RoutingIndex", Checked)
    Checked.queries = 0
    cluster = ClusterConfig(gpus=128, mode=mode, prefill_instances=4 if mode != "colocated" else 0,
                            decode_shape=decode_shape, max_sim_s=3600.0 if preset == "math" else 600.0)
    rollout = RolloutConfig(preset=preset, staleness=staleness, group_size=default_group_size(preset),
                            groups_per_step=64 if preset == "math" else 8, steps=3, train_s=10.0 if staleness else 0.0)
    result = simulate(load_model(model), cluster, rollout)
    assert Checked.queries > 1000
    assert result.steps_done >= 1 or preset != "math"
    if mode == "adaptive":
        assert result.switches > 0


# ----- the cost per request -----
def counted_choices(instances: int, requests: int = 50) -> tuple[int, int]:
    """(load keys computed, instances examined) over ``requests`` routed and placed requests in pools of
    ``instances`` prefill and as many decode instances, each choice checked against the scans."""
    prefill = [toy(f"p{k}", Role.PREFILL) for k in range(instances)]
    decode = [toy(f"d{k}") for k in range(instances)]
    idx = index(prefill, decode)
    keys = [0]
    for heap in (idx.prefill, idx.decode):
        def counting_key(inst, pos, key=heap.key):
            keys[0] += 1
            return key(inst, pos)

        heap.key = counting_key
    for k in range(requests):
        inst = idx.least_loaded()
        assert inst is scan_least(prefill)
        inst.n_requests += 1
        inst.prefill_left += 100 * (k % 3)
        idx.prefill.dirty.add(inst)
        where = idx.place(100)
        assert where is not None and where == scan_place(decode, 100)
        target, rank = where
        target.ranks[rank].pending += 1
        target.n_requests += 1
        idx.decode.dirty.add(target)
    return keys[0], idx.visited


def test_routing_cost_does_not_grow_with_the_instance_count():
    # one re-key per changed instance (one per query but the first of each pool), one instance examined per
    # placement: the scans looked at every instance of the pool, 8 or 64, for each
    assert counted_choices(8) == counted_choices(64) == (98, 50)
