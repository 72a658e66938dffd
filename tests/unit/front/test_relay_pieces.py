"""The relay's routing pieces (srt/front/relay.py): bootstrap splicing, prompt sizing, picking, affinity."""

from __future__ import annotations

import orjson
import pytest
from starlette.datastructures import Headers

from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.front.relay import NoRoute, Relay, _with_bootstrap, prompt_tokens, trajectory


def prefill(iid="p", port=9000, **kw):
    return Instance(instance_id=iid, url=f"http://h/{iid}", role="prefill", bootstrap_host="10.0.0.1",
                    bootstrap_port=port, state=State.ACTIVE, **kw)


def test_bootstrap_fields_are_spliced_into_the_original_bytes():
    raw = b' {"text": "hi", "sampling_params": {"max_new_tokens": 3}}'
    out = orjson.loads(_with_bootstrap(raw, orjson.loads(raw), prefill()))
    assert out["text"] == "hi" and out["sampling_params"] == {"max_new_tokens": 3}
    assert out["bootstrap_host"] == "10.0.0.1" and out["bootstrap_port"] == 9000
    assert 0 <= out["bootstrap_room"] < 2 ** 62
    assert orjson.loads(_with_bootstrap(b"{}", {}, prefill()))["bootstrap_port"] == 9000


@pytest.mark.parametrize("raw", [
    b'{"input_ids": [[1, 2], [3]], "bootstrap_room": 5}',
    # the reported request: the OpenAI route serves the single prompt; a list of rooms killed the prefill scheduler
    b'{"prompt": "hello", "input_ids": [[5, 6]], "bootstrap_room": [1], "bootstrap_pair_key": ["k"]}',
    b'{"text": ["a", "b"], "bootstrap_host": ["x", "y"]}',
])
def test_bootstrap_fields_are_one_value_whatever_the_batch_and_client_fields_are_replaced(raw):
    out = orjson.loads(_with_bootstrap(raw, orjson.loads(raw), prefill()))
    assert out["bootstrap_host"] == "10.0.0.1" and out["bootstrap_port"] == 9000
    assert isinstance(out["bootstrap_room"], int) and out["bootstrap_room"] != 5
    assert "bootstrap_pair_key" not in out


@pytest.mark.parametrize("path,body,size", [
    ("/generate", {"input_ids": [1, 2, 3]}, 3), ("/generate", {"input_ids": [[1, 2], [3]]}, 3),
    ("/generate", {"text": "x" * 40}, 11), ("/generate", {"text": "x" * 40, "input_ids": [1]}, 11),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * 8}]}, 6), ("/generate", {}, 0),
    ("/v1/completions", {"prompt": "hello", "input_ids": [[5, 6]]}, 2),  # the route reads prompt only
    ("/v1/completions", {"prompt": [[1, 2], [3]]}, 3), ("/v1/completions", {"prompt": ["abcd", "ef"]}, 3),
    ("/v1/chat/completions", {"prompt": "x", "input_ids": [1, 2]}, 0),
    # malformed batches (found by the HTTP fuzz test: they were a 500): counted without raising, SGLang refuses them
    ("/generate", {"input_ids": [[1, 2], None]}, 2), ("/generate", {"input_ids": [[1], 2.5, "x", {}]}, 2),
    ("/generate", {"text": [None, "abcd", 3]}, 2), ("/v1/completions", {"prompt": {"a": 1}}, 0),
    ("/v1/chat/completions", {"messages": "hi"}, 0),
])
def test_prompt_size_is_read_as_the_route_reads_the_prompt(path, body, size):
    assert prompt_tokens(path, body) == size


def test_least_loaded_prefill_unless_the_trajectorys_own_is_not_much_busier():
    reg = Registry()
    a, b = reg.add(prefill("a", 1)), reg.add(prefill("b", 2))
    relay = Relay(reg, pd=True)
    a.inflight_prompt_tokens = 100
    assert relay._pick_first("prefill", "traj", set()).instance_id == "b"  # least loaded; b becomes its home
    b.inflight_prompt_tokens = 1000  # b busier, but within 1.5x + 2048 of a: the prefix cached there wins
    assert relay._pick_first("prefill", "traj", set()).instance_id == "b"
    b.inflight_prompt_tokens = 10_000  # much busier: load wins, the trajectory moves
    assert relay._pick_first("prefill", "traj", set()).instance_id == "a"
    assert relay.stats["affinity_hits"] == 1


def test_only_active_instances_are_picked():
    reg = Registry()
    a = reg.add(prefill("a"))
    relay = Relay(reg, pd=True)
    reg.set_state(a, State.DRAINING)
    with pytest.raises(NoRoute):
        relay._pick_first("prefill", None, set())


@pytest.mark.parametrize("path,body,headers,want", [
    ("/generate", {"routing_key": "rk"}, {}, "rk"),
    ("/generate", {"conversation_id": "c", "trajectory_id": "b"}, {"X-Trajectory-Id": "h"}, "c"),
    ("/generate", {"session_id": "s", "routing_key": "rk"}, {}, "s"),
    ("/generate", {"trajectory_id": "b"}, {"X-Trajectory-Id": "h"}, "b"),
    ("/generate", {"routing_key": 5, "trajectory_id": "x" * 10_000}, {"x-smg-routing-key": "smg"}, "smg"),
    ("/v1/chat/completions", {"session_id": "s"}, {"X-Trajectory-Id": "h"}, "s"),
    # SGLang's OpenAI routes take no routing_key or conversation_id from the body (routing_key is the router header)
    ("/v1/chat/completions", {"routing_key": "rk", "conversation_id": "c"}, {"X-Trajectory-Id": "h"}, "h"),
    ("/v1/completions", {"routing_key": "rk"}, {"X-SMG-Routing-Key": "smg"}, "smg"),
    ("/v1/completions", {"prompt": "p"}, {}, None),
    # verl's agent loop carries it in the sampling parameters (read on /generate, as the instance reads it)
    ("/generate", {"sampling_params": {"custom_params": {"prorsa_trajectory_id": "v"}}}, {"X-Trajectory-Id": "h"},
     "v"),
    ("/v1/completions", {"sampling_params": {"custom_params": {"prorsa_trajectory_id": "v"}}}, {}, None),
])
def test_the_trajectory_for_affinity_is_the_id_the_instance_reports(path, body, headers, want):
    """The relay reads the fields the target route gives SGLang's request, by engine_api's one precedence."""
    assert trajectory(path, body, Headers(headers=headers)) == want


def test_affinity_follows_a_routing_key_without_any_header():
    reg = Registry()
    a, b = reg.add(prefill("a", 1)), reg.add(prefill("b", 2))
    relay = Relay(reg, pd=True)
    tid = trajectory("/generate", {"routing_key": "rk-traj"}, Headers(headers={}))
    assert relay._pick_first("prefill", tid, set()).instance_id == "a"
    a.inflight_prompt_tokens = 100  # b is now the least loaded, a is still close enough: its turns stay on a
    assert relay._pick_first("prefill", tid, set()).instance_id == "a" and relay.stats["affinity_hits"] == 1
    assert list(relay.affinity) == ["rk-traj"] and b.instance_id == "b"
