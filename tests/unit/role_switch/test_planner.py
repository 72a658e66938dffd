"""Switch planner: fewest changes, least-loaded eligible instance, dwell time and hysteresis band."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_prorsa.srt.role_switch.allocator import AllocationInputs, AllocatorConfig, allocate
from sglang_prorsa.srt.role_switch.capacity import InstanceReport, InstanceStatus, Role
from sglang_prorsa.srt.role_switch.planner import PlannerConfig, SwitchPlanner

P, D = Role.PREFILL, Role.DECODE
UNGUARDED = SwitchPlanner(PlannerConfig.unguarded())


def target(a: float, b: float, budget: int, config: AllocatorConfig = AllocatorConfig()):
    """Eq. 1 for prefill demand a and decode demand b, in instance units."""
    return allocate(AllocationInputs(a * 100, 1.0, 100.0, b * 10, 0.0, 10.0, budget), config)


def prefill(name, load, **kw):
    return InstanceReport(name, P, queued_prompt_tokens=load, **kw)


def decode(name, kv, **kw):
    return InstanceReport(name, D, decode_kv_used=kv, decode_kv_capacity=1000, **kw)


def moved(plan):
    return [s.instance_id for s in plan.switches]


def test_least_loaded_prefill_become_decode():
    reports = [prefill("p0", 500), prefill("p1", 100), prefill("p2", 300), prefill("p3", 900),
               decode("d0", 10), decode("d1", 20)]
    plan = UNGUARDED.plan(reports, target(2, 4, 6), now=0.0)  # target (2, 4)
    assert (plan.target[P], plan.target[D]) == (2, 4)
    assert moved(plan) == ["p1", "p2"]
    assert all((s.src, s.dst) == (P, D) for s in plan.switches)


def test_decode_to_prefill_uses_kv_footprint():
    reports = [prefill("p0", 0), decode("d0", 800), decode("d1", 50), decode("d2", 400), decode("d3", 600)]
    plan = UNGUARDED.plan(reports, target(3, 1.5, 5), now=0.0)  # target (3, 2)
    assert moved(plan) == ["d1", "d2"]
    assert [s.load for s in plan.switches] == [50.0, 400.0]


def test_ineligible_instances_skipped_and_midswitch_counted():
    reports = [
        prefill("p_switching", 0, status=InstanceStatus.SWITCHING),
        prefill("p_draining", 0, status=InstanceStatus.DRAINING),
        prefill("p_sick", 0, status=InstanceStatus.UNHEALTHY),
        prefill("p_busy", 900),
        prefill("p_idle_but_listed_last", 1000),
        decode("d0", 10),
    ]
    # Counted prefill: switching + draining + two active = 4 (the unhealthy one holds no role). Target (1, 3).
    plan = UNGUARDED.plan(reports, target(0.5, 3, 4), now=0.0)
    assert (plan.target[P], plan.target[D]) == (1, 3)
    assert plan.current == {P: 4, D: 1}
    assert moved(plan) == ["p_busy", "p_idle_but_listed_last"]


def test_no_switch_when_target_met_and_spare_keeps_role():
    # Target (2, 2) with one spare GPU: (3, 2) already meets it, so nothing moves.
    reports = [prefill("p0", 0), prefill("p1", 0), prefill("p2", 0), decode("d0", 0), decode("d1", 0)]
    plan = UNGUARDED.plan(reports, target(1, 1, 5), now=0.0)
    assert plan.target == {P: 2, D: 2} and plan.switches == ()


def test_dwell_time_blocks_recent_switchers():
    guard = SwitchPlanner(PlannerConfig(min_dwell_s=30.0, hysteresis=0.0))
    reports = [prefill("p_new", 0, role_since=95.0), prefill("p_old", 700, role_since=10.0),
               prefill("p_orig", 800), decode("d0", 0)]
    plan = guard.plan(reports, target(1, 3, 4), now=100.0)  # target (1, 3): two prefill must go
    assert moved(plan) == ["p_old", "p_orig"]  # p_new is least loaded but switched 5 s ago
    plan_later = guard.plan(reports, target(1, 3, 4), now=125.0)
    assert moved(plan_later) == ["p_new", "p_old"]


def test_dwell_time_reports_shortfall():
    guard = SwitchPlanner(PlannerConfig(min_dwell_s=30.0, hysteresis=0.0))
    reports = [prefill("p0", 0, role_since=90.0), prefill("p1", 0, role_since=95.0), prefill("p2", 0),
               decode("d0", 0)]
    plan = guard.plan(reports, target(1, 3, 4), now=100.0)
    assert moved(plan) == ["p2"]
    assert (plan.shortfall, plan.blocked_by_dwell) == (1, 1)


def test_hysteresis_holds_small_gains_only():
    # a = 4, b = 3.4, G = 8: target (4, 4) at coverage 1. Current (5, 3) covers min(5/4, 3/3.4) ≈ 0.882.
    reports = [prefill(f"p{i}", i) for i in range(5)] + [decode(f"d{i}", i) for i in range(3)]
    alloc = target(4, 3.4, 8)
    assert (alloc.n_prefill, alloc.n_decode) == (4, 4)
    wide = SwitchPlanner(PlannerConfig(min_dwell_s=0.0, hysteresis=0.2)).plan(reports, alloc, now=0.0)
    assert wide.held_by_hysteresis and wide.switches == ()  # 0.882 · 1.2 ≥ 1
    narrow = SwitchPlanner(PlannerConfig(min_dwell_s=0.0, hysteresis=0.1)).plan(reports, alloc, now=0.0)
    assert moved(narrow) == ["p0"]  # 0.882 · 1.1 < 1


def test_hysteresis_never_holds_an_empty_role():
    reports = [prefill("p0", 0), prefill("p1", 0)]
    plan = SwitchPlanner(PlannerConfig(hysteresis=10.0)).plan(reports, target(0, 0, 2), now=0.0)
    assert moved(plan) == ["p0"] and not plan.held_by_hysteresis


def test_guard_is_on_by_default():
    config = PlannerConfig()
    assert config.min_dwell_s > 0 and config.hysteresis > 0


def test_unequal_gpus_frees_enough_for_wider_decode():
    # m^P = 1, m^D = 2, G = 6: four 1-GPU prefill + one 2-GPU decode; target (2, 2) needs one more decode = 2 GPUs.
    config = AllocatorConfig(gpus_per_prefill=1, gpus_per_decode=2)
    reports = [prefill(f"p{i}", 10 * i) for i in range(4)] + [decode("d0", 0, gpus=2)]
    alloc = target(2, 2, 6, config)
    assert (alloc.n_prefill, alloc.n_decode) == (2, 2)
    plan = UNGUARDED.plan(reports, alloc, now=0.0)
    assert moved(plan) == ["p0", "p1"] and plan.new_instances == 1 and plan.shortfall == 0


@settings(max_examples=150, deadline=None)
@given(
    roles=st.lists(st.tuples(st.booleans(), st.sampled_from(list(InstanceStatus)), st.integers(0, 1000)),
                   min_size=2, max_size=12),
    a=st.floats(0, 12), b=st.floats(0, 12),
)
def test_plan_is_minimal_and_safe(roles, a, b):
    reports = [InstanceReport(f"i{k}", P if is_p else D, status, queued_prompt_tokens=load, decode_kv_used=load)
               for k, (is_p, status, load) in enumerate(roles)]
    budget = sum(r.gpus for r in reports if r.status is not InstanceStatus.UNHEALTHY)
    if budget < 2:
        return
    alloc = target(a, b, budget)
    plan = UNGUARDED.plan(reports, alloc, now=0.0)
    by_id = {r.instance_id: r for r in reports}
    chosen = [by_id[s.instance_id] for s in plan.switches]
    assert all(r.status is InstanceStatus.ACTIVE for r in chosen)
    assert len({s.instance_id for s in plan.switches}) == len(plan.switches)
    if not plan.switches:
        return
    src, dst = plan.switches[0].src, plan.switches[0].dst
    # Fewest changes: exactly what the growing role lacks, never pushing the other role below its own target.
    assert len(plan.switches) <= plan.target[dst] - plan.current[dst]
    assert plan.current[src] - len(plan.switches) >= plan.target[src]
    # Least loaded: nothing eligible left behind is lighter than what was taken.
    left = [r for r in reports if r.role is src and r.status is InstanceStatus.ACTIVE and r not in chosen]
    assert all(r.load() >= max(c.load() for c in chosen) for r in left)
