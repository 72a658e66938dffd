"""The controller's registry (srt/common/registry.py), Prometheus merging and fan-out answers."""

from __future__ import annotations

import json

from sglang_prorsa.policy.role_switch.capacity import Role
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.control_ops import _combine
from sglang_prorsa.srt.controller.metrics import merge_prometheus


def test_registration_adds_once_and_a_comeback_bumps_the_epoch():
    reg = Registry()
    inst, new = reg.register("r0", "http://h:1/", "prefill", "h", 7)
    assert new and inst.url == "http://h:1" and inst.state is State.ACTIVE and inst.epoch == 0
    again, new = reg.register("r0", "http://h:1", "decode", "h", 7)
    assert not new and again is inst and inst.role == "prefill"  # a heartbeat does not change what we track
    reg.set_state(inst, State.DEAD)
    back, _ = reg.register("r0", "http://h:1", "prefill", "h", 7)
    assert back.state is State.ACTIVE and back.epoch == 1  # new transfer endpoints: decode instances re-learn it


def test_reports_count_switching_instances_in_their_target_role():
    reg = Registry()
    a = reg.add(Instance("a", "u", "decode", state=State.ACTIVE, kv_capacity_tokens=100, kv_footprint_tokens=40))
    reg.add(Instance("c", "u", "null", state=State.ACTIVE))
    reg.set_state(a, State.DRAINING, target_role="prefill")
    (report,) = reg.reports()  # the colocated instance is not part of PD allocation
    assert report.role is Role.PREFILL and report.decode_kv_used == 0


def test_prometheus_texts_are_merged_with_instance_labels_and_one_type_line_per_metric():
    text = merge_prometheus("# TYPE x counter\nx{a=\"1\"} 2\nx 3\n", "i0") + merge_prometheus(
        "# TYPE x counter\nx{instance=\"own\"} 4\n", "i1")
    merged = merge_prometheus(text, None)
    assert 'x{instance="i0",a="1"} 2' in merged and 'x{instance="i0"} 3' in merged
    assert 'x{instance="own"} 4' in merged and merged.count("# TYPE x counter") == 1


def test_fan_out_answers_keep_sglangs_shape_or_list_the_failures():
    ok = _combine({"0": {"status": 200, "raw": b'{"success": true, "message": "m"}'},
                   "1": {"status": 200, "raw": b'{"success": true, "message": "m"}'}}, ok=True)
    body = json.loads(ok.body)
    assert ok.status_code == 200 and body["success"] is True and set(body["instances"]) == {"0", "1"}
    bad = _combine({"0": {"status": 200, "raw": b"{}"}, "1": {"status": 400, "raw": b'{"success": false}'}},
                   ok=False)
    body = json.loads(bad.body)
    assert bad.status_code == 400 and body["success"] is False and body["instances"]["1"]["status"] == 400
    assert body["message"] == "1 of 2 instances failed" and body["code"] == "upstream"
    unsupported = b'{"success": false, "code": "unsupported"}'
    same = json.loads(_combine({"0": {"status": 400, "raw": unsupported}, "1": {"status": 400, "raw": unsupported}},
                               ok=False).body)
    assert same["code"] == "unsupported"  # one shared cause is named, not hidden behind "upstream"


def test_the_control_loop_fits_theta_from_prefill_busy_intervals_only():
    """Issue 11: θ comes from the schedulers' busy intervals (GET /prorsa/status?since=), not from round trips."""
    from sglang_prorsa.config import split_prorsa_flags
    from sglang_prorsa.policy.control_plane import LifecycleControlPlane
    from sglang_prorsa.policy.forecast.config import PredictorConfig
    from sglang_prorsa.srt.controller.loop import ControlLoop

    config, _ = split_prorsa_flags(["--pd-adaptive", "--prorsa-horizon", "4"])
    loop = ControlLoop(config, Registry(), orchestrator=None, control_plane=LifecycleControlPlane(
        None, PredictorConfig(horizon_s=4.0)), http=None, health=None)
    assert loop.controller.config.horizon_s == 4.0
    inst = Instance("p0", "u", "prefill", state=State.ACTIVE)
    before = loop.controller.theta_snapshot()["theta_cold"]
    for k in range(40):  # a prefill instance 4x slower than the prior: 500 new tokens/s
        loop._observe(inst, {"seq": k + 1, "role": "prefill", "seconds": 2.0, "new_tokens": 1000,
                             "cached_tokens": 0, "requests": 2})
    loop._observe(inst, {"seq": 41, "role": "decode", "seconds": 9.0, "new_tokens": 0, "cached_tokens": 0,
                         "requests": 3})  # decode intervals say nothing about prefill speed
    loop._observe(inst, {"seq": 42, "role": "prefill", "seconds": "x"})  # malformed: ignored, not raised
    snap = loop.controller.theta_snapshot()
    assert snap["samples"] == 40 and snap["samples_per_instance"] == {"p0": 40}
    assert snap["theta_cold"] < before and abs(snap["theta_cold"] - 500.0) < 100.0
