"""Pure pieces of the adaptive front: request validation, batch splitting, instance flags, routing picks, resume."""

from __future__ import annotations

import pytest

from sglang_prorsa.srt.entrypoints.adaptive import _check_generate, _split_batch, instance_argv
from sglang_prorsa.srt.entrypoints.instances import EngineInstance, InstancePool, NoInstance
from sglang_prorsa.srt.entrypoints.pd_router import PDRouter, Resume, _is_abort
from sglang_prorsa.srt.role_switch.capacity import InstanceStatus, Role


def test_generate_validation_names_the_field():
    assert _check_generate({"text": "a", "input_ids": [1]}) == "exactly one of fields 'text' and 'input_ids' is required"
    assert "max_new_tokens" in _check_generate({"text": "a", "sampling_params": {"max_new_tokens": -1}})
    assert "stream" in _check_generate({"text": "a", "stream": True})
    assert "2 entries for 3 prompts" in _check_generate({"text": ["a", "b", "c"], "sampling_params": [{}, {}]})
    assert _check_generate({"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 4}}) is None


def test_batches_split_per_prompt():
    items = _split_batch({"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]})
    assert [(i["text"], i["sampling_params"]["max_new_tokens"]) for i in items] == [("a", 1), ("b", 2)]


def test_instance_argv_owns_host_port_role_and_bootstrap():
    argv = instance_argv(["--host", "0.0.0.0", "--port=1", "--disaggregation-mode", "decode", "--tp-size", "1"],
                         port=5, bootstrap_port=6, role=Role.PREFILL)
    assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "5" and "--port=1" not in argv
    assert argv[argv.index("--disaggregation-mode") + 1] == "prefill"
    assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == "6"
    assert "--enable-pd-role-switch" in argv and "--disaggregation-decode-enable-radix-cache" in argv
    assert argv[argv.index("--tp-size") + 1] == "1"


def _pool():
    a = EngineInstance("a", "u", 1, Role.PREFILL, inflight_prompt_tokens=500)
    b = EngineInstance("b", "u", 2, Role.PREFILL, inflight_prompt_tokens=100)
    c = EngineInstance("c", "u", 3, Role.DECODE, inflight_requests=3)
    d = EngineInstance("d", "u", 4, Role.DECODE, inflight_requests=1, status=InstanceStatus.DRAINING)
    return InstancePool([a, b, c, d])


def test_pick_is_least_loaded_and_skips_unroutable():
    pool = _pool()
    assert pool.pick(Role.PREFILL).instance_id == "b"
    assert pool.pick(Role.DECODE).instance_id == "c"  # d is draining
    with pytest.raises(NoInstance):
        pool.pick(Role.DECODE, exclude={"c"})


def test_a_switching_instance_reports_its_target_role():
    pool = _pool()
    d = pool.get("d")
    d.target_role = Role.PREFILL
    assert d.report().role is Role.PREFILL
    pool.set_role(d, Role.PREFILL, now=5.0)
    assert (d.role, d.target_role, d.role_since, d.switches) == (Role.PREFILL, None, 5.0, 1)


def test_abort_detection_native_and_openai():
    assert _is_abort({"meta_info": {"finish_reason": {"type": "abort"}}})
    assert not _is_abort({"meta_info": {"finish_reason": {"type": "length"}}})
    assert _is_abort({"choices": [{"finish_reason": "abort"}]})
    assert not _is_abort({"choices": [{"finish_reason": "stop"}]})
    assert not _is_abort("nope")


def test_resume_budget_and_assembly():
    assert PDRouter._remaining({"max_new_tokens": 10, "min_new_tokens": 4, "temperature": 0}, 6) == {
        "max_new_tokens": 4, "min_new_tokens": 0, "temperature": 0}
    router = PDRouter(_pool())
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 5}}
    out = router._assemble({"output_ids": [9, 9], "meta_info": {"finish_reason": {"type": "length"}}},
                           Resume(input_ids=[1, 2, 3, 7, 8, 8], generated=[7, 8, 8]), body, [{"x": 1}])
    assert out["output_ids"] == [7, 8, 8, 9, 9]
    assert out["meta_info"]["completion_tokens"] == 5 and out["meta_info"]["prompt_tokens"] == 3
    assert out["meta_info"]["prorsa"] == {"migrations": [{"x": 1}]}
    untouched = {"output_ids": [4]}
    assert router._assemble(untouched, None, body, []) is untouched


def test_refusal_by_a_switching_instance_is_recognised():
    from sglang_prorsa.srt.entrypoints.pd_router import _refused

    gate = {"error": "instance is switching roles; send this request to another instance"}
    assert _refused(503, gate)
    assert not _refused(503, {"error": "overloaded"})
    assert not _refused(200, gate)
