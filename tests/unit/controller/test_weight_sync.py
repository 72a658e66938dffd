"""Weight sync through the front (srt/controller/weight_sync.py): each instance gets its own ``rank_offset`` in a
weight-update group, a ``world_size`` that is not 1 + the instances' GPUs is refused before any instance sees the
call, and tensors by CUDA-IPC handle are refused for more than one instance. Fake instances over loopback HTTP."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import httpx
from aiohttp import web
from unit_support import loopback_upstream

from sglang_prorsa.config import split_prorsa_flags
from sglang_prorsa.srt.common.registry import Instance, Registry, State
from sglang_prorsa.srt.controller.app import Front, build_app
from sglang_prorsa.srt.controller.weight_sync import check_group, gpus_of, rank_offsets

GROUP = {"master_address": "127.0.0.1", "master_port": 29500, "group_name": "g", "backend": "gloo"}


def test_rank_offsets_follow_the_gpus_of_the_instances_before():
    assert rank_offsets([1, 1]) == [1, 2]
    assert rank_offsets([2, 1, 4]) == [1, 3, 4]
    assert rank_offsets([]) == []
    assert gpus_of({"tp_size": 2, "pp_size": 2, "dp_size": 1}) == 4
    assert gpus_of({"tp_size": 4}) == 4
    assert gpus_of({"tp_size": None, "pp_size": True}) == 1
    assert gpus_of("not json") == 1


def test_world_size_and_rank_offset_are_checked_against_the_instances():
    detail = {"world_size": 8, "rank_offsets": [1, 3, 4], "gpus": [2, 1, 4]}
    assert check_group({"world_size": 8}, [2, 1, 4]) is None
    assert check_group({"world_size": 8, "rank_offset": 1}, [2, 1, 4]) is None  # a one-engine trainer's offset
    assert check_group({"world_size": 3}, [1, 1]) is None
    assert check_group({"world_size": 7}, [2, 1, 4]) == (
        "world_size", "must be 1 (the trainer) + 7 GPUs of the 3 instances = 8, got 7", detail)
    assert check_group({}, [2, 1, 4]) == (
        "world_size", "must be an integer: 1 (the trainer) + 7 instance GPUs = 8", detail)
    assert check_group({"world_size": 8, "rank_offset": 3}, [2, 1, 4]) == (
        "rank_offset", "is assigned by the front (each instance gets its own: [1, 3, 4]); leave it out or send 1, "
        "got 3", detail)
    assert check_group({"world_size": 2, "rank_offset": 2}, [1])[0] == "rank_offset"


def run(script, tp_sizes: list[int]):
    """``script(client, front, seen)`` against a front over one fake instance per entry of ``tp_sizes`` (ids a, b,
    ...); ``seen``: (instance id, path, json body) of every call an instance got."""
    seen: list[tuple[str, str, object]] = []

    def handler(iid: str, tp: int):
        async def answer(request: web.Request) -> web.Response:
            body = await request.json() if request.can_read_body else None
            seen.append((iid, request.path, body))
            if request.path == "/get_server_info":
                return web.json_response({"tp_size": tp, "pp_size": 1, "dp_size": 1})
            return web.json_response({"success": True, "message": "Success"})

        return answer

    async def scenario():
        async with AsyncExitStack() as stack:
            config, _ = split_prorsa_flags(["--pd-adaptive"])
            registry = Registry()
            for k, tp in enumerate(tp_sizes):
                iid = "abcdefgh"[k]
                url = await stack.enter_async_context(loopback_upstream([("*", "/{tail:.*}", handler(iid, tp))]))
                registry.add(Instance(iid, url, "decode", state=State.ACTIVE))
            front = Front(config, registry)
            try:
                transport = httpx.ASGITransport(app=build_app(front))
                async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
                    return await script(client, front, seen)
            finally:
                await front.relay.close()
                await front.http.close()

    return asyncio.run(scenario())


def test_each_instance_joins_the_group_at_its_own_rank_offset():
    async def script(client, front, seen):
        return await client.post("/init_weights_update_group", json={**GROUP, "world_size": 8})

    r = run(script, [2, 1, 4])
    assert r.status_code == 200, r.text
    assert r.json()["rank_offsets"] == {"a": 1, "b": 3, "c": 4} and r.json()["world_size"] == 8
    assert r.json()["success"] is True and set(r.json()["instances"]) == {"a", "b", "c"}


def test_the_bodies_sent_carry_each_offset_and_nothing_else_changes():
    async def script(client, front, seen):
        await client.post("/init_weights_update_group", json={**GROUP, "world_size": 3, "rank_offset": 1})
        return sorted((iid, body) for iid, path, body in seen if path == "/init_weights_update_group")

    sent = run(script, [1, 1])
    assert sent == [("a", {**GROUP, "world_size": 3, "rank_offset": 1}),
                    ("b", {**GROUP, "world_size": 3, "rank_offset": 2})]


def test_a_world_size_mismatch_is_refused_before_any_instance_joins():
    async def script(client, front, seen):
        wrong = await client.post("/init_weights_update_group", json={**GROUP, "world_size": 2})
        offset = await client.post("/init_weights_update_group", json={**GROUP, "world_size": 3, "rank_offset": 2})
        empty = await client.post("/init_weights_update_group")
        return wrong, offset, empty, [path for _, path, _ in seen], front.orchestrator.held_by

    wrong, offset, empty, paths, held = run(script, [1, 1])
    assert wrong.status_code == 400 and wrong.json() == {
        "error": "field 'world_size': must be 1 (the trainer) + 2 GPUs of the 2 instances = 3, got 2",
        "code": "invalid", "field": "world_size", "detail": {"world_size": 3, "rank_offsets": [1, 2], "gpus": [1, 1]}}
    assert offset.status_code == 400 and offset.json()["field"] == "rank_offset"
    assert empty.status_code == 400 and empty.json()["field"] == "world_size"
    assert "/init_weights_update_group" not in paths and held is None  # nothing sent, nothing held


def test_tensors_by_ipc_handle_are_refused_for_two_instances_and_pass_for_one():
    body = {"serialized_named_tensors": ["abc"], "flush_cache": True}

    async def script(client, front, seen):
        return await client.post("/update_weights_from_tensor", json=body), [p for _, p, _ in seen]

    r, paths = run(script, [1, 1])
    assert r.status_code == 400 and r.json()["code"] == "unsupported"
    assert r.json()["field"] == "serialized_named_tensors"
    assert "/update_weights_from_distributed" in r.json()["error"] and "/update_weights_from_disk" in r.json()["error"]
    assert paths == []
    one, paths = run(script, [1])
    assert one.status_code == 200 and paths == ["/update_weights_from_tensor"]


def test_a_weight_update_session_holds_switches_until_it_ends():
    async def script(client, front, seen):
        out = []
        for path in ("/begin_weight_update", "/update_weights_from_ipc", "/weights_checker", "/end_weight_update"):
            r = await client.post(path, json={})
            out.append((path, r.status_code, front.orchestrator.held_by))
        checker = await client.get("/weights_checker")
        return out, checker.status_code, [p for _, p, _ in seen]

    out, checker, paths = run(script, [1, 1])
    assert out == [("/begin_weight_update", 200, "weight update session"),
                   ("/update_weights_from_ipc", 200, "weight update session"),
                   ("/weights_checker", 200, "weight update session"),
                   ("/end_weight_update", 200, None)]
    assert checker == 200
    assert sorted(paths) == sorted(2 * ["/begin_weight_update", "/update_weights_from_ipc", "/weights_checker",
                                        "/end_weight_update", "/weights_checker"])
