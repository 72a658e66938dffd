"""Property-based fuzzing (hypothesis) of every HTTP route we add, on the front and on a real instance (issue 14).

Over 10,000 generated requests in all: arbitrary JSON (and non-JSON) bodies and targeted mutations of valid ones.
Every answer is below 500; a refused body gets a 4xx whose JSON names the field (or ``body``). Bodies that would be
valid *and* disruptive (a real switch, a registration of a fake instance, a peer list that replaces the real one)
are not sent: the properties are about refusals. Lifecycle batches are atomic: one bad event, nothing applied.
"""

from __future__ import annotations

import json

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests_support import instances

from sglang_prorsa.testing.profiles import examples

pytestmark = pytest.mark.integration

SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
_session = requests.Session()

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def post(url: str, body) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return _session.post(url, data=data, headers={"Content-Type": "application/json"}, timeout=60)


def check(r: requests.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if 400 <= r.status_code < 500 and r.status_code not in (404, 405):
        body = r.json()
        named = body.get("field") or body.get("detail")
        assert named or "field" in str(body.get("error", "")), body


@pytest.fixture(scope="module")
def urls(deployment):
    insts = instances(deployment.url)
    return {"front": deployment.url, "instance": insts[0]["url"], "ids": [i["instance"] for i in insts]}


def with_field(base: dict, name: str, value) -> dict:
    out = dict(base)
    out[name] = value
    return out


# -- the front (controller) ---------------------------------------------------------------------------------------

@settings(max_examples=examples(1200), **SETTINGS)
@given(body=st.one_of(json_values, st.binary(max_size=40)))
def test_front_control_routes_refuse_garbage(urls, body):
    front = urls["front"]
    for path in ("/prorsa/switch", "/prorsa/register", "/lifecycle", "/lifecycle/config"):
        if path == "/prorsa/switch" and isinstance(body, dict) and body.get("instance") in urls["ids"] and body.get(
                "new_role") in ("prefill", "decode"):
            continue  # a real switch
        if path == "/prorsa/register" and isinstance(body, dict) and isinstance(body.get("url"), str):
            continue  # might register a fake instance
        check(post(front + path, body))


@settings(max_examples=examples(1000), **SETTINGS)
@given(field=st.sampled_from(["instance", "new_role"]), value=json_values)
def test_switch_fields_are_named(urls, field, value):
    body = with_field({"instance": "no-such-instance", "new_role": "decode"}, field, value)
    if body["instance"] in urls["ids"] and body["new_role"] in ("prefill", "decode"):
        return
    r = post(urls["front"] + "/prorsa/switch", body)
    assert r.status_code in (409, 422), r.text
    if r.status_code == 422:
        assert r.json()["field"] in ("instance", "new_role")


@settings(max_examples=examples(1000), **SETTINGS)
@given(field=st.sampled_from(["instance_id", "url", "role", "bootstrap_port"]), value=json_values)
def test_registration_fields_are_named(urls, field, value):
    body = with_field({"instance_id": "x", "url": "not a url", "role": "decode", "bootstrap_port": 1}, field, value)
    if isinstance(body["url"], str) and body["url"].startswith(("http://", "https://")):
        return
    r = post(urls["front"] + "/prorsa/register", body)
    assert r.status_code == 422 and r.json()["field"] in ("instance_id", "url", "role", "bootstrap_port"), r.text


@settings(max_examples=examples(1500), **SETTINGS)
@given(events=st.lists(st.one_of(json_values, st.fixed_dictionaries(
    {"trajectory_id": st.text(max_size=6), "event": st.sampled_from(["sampled", "tool_start", "reward_end", "bogus"]),
     "prompt_tokens": st.integers(-5, 5)})), max_size=5))
def test_lifecycle_batches_are_atomic(urls, events):
    front = urls["front"]
    before = _session.get(front + "/lifecycle/status", timeout=30).json()["events"]
    r = post(front + "/lifecycle", {"events": events})
    check(r)
    if r.status_code != 200:  # one bad event: none of the batch applied
        assert _session.get(front + "/lifecycle/status", timeout=30).json()["events"] == before


@settings(max_examples=examples(600), **SETTINGS)
@given(query=st.text(max_size=12))
def test_forecast_query_is_validated(urls, query):
    r = _session.get(urls["front"] + "/prorsa/forecast", params={"at": query}, timeout=30)
    check(r)


@settings(max_examples=examples(700), **SETTINGS)
@given(body=st.one_of(json_values, st.binary(max_size=40)))
def test_front_generation_refuses_garbage(urls, body):
    # Only bodies SGLang would not run (no prompt at all): the relay and SGLang's own validation answer them.
    if isinstance(body, dict) and any(k in body for k in ("text", "input_ids", "messages", "prompt")):
        return
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        r = post(urls["front"] + path, body)
        assert r.status_code < 500, (path, r.status_code, r.text[:300])


VOCAB = 1024  # the embedded tiny model's
prompt_ids = st.one_of(st.lists(st.integers(-3, VOCAB + 50), max_size=6), json_values)
sampling_params = st.one_of(json_values, st.fixed_dictionaries(
    {"max_new_tokens": st.one_of(st.integers(-2, 3), st.text(max_size=3), st.lists(st.integers(), max_size=2),
                                 st.floats(-2, 3))},  # never the default (128) or a huge count: bounded time
    optional={"temperature": st.one_of(st.floats(-1, 3), st.text(max_size=2)), "top_p": st.floats(-0.5, 1.5),
              "top_k": st.integers(-3, 5), "ignore_eos": st.booleans(), "stop": st.lists(st.text(max_size=3),
                                                                                         max_size=2)}))


def _runs_long(sampling) -> bool:
    if not isinstance(sampling, dict):
        return False  # SGLang's default (128 new tokens) at most
    n = sampling.get("max_new_tokens", 128)
    return not isinstance(n, (str, list, dict, bool)) and (n is None or n > 3)


@settings(max_examples=examples(160), **SETTINGS)
@given(ids=prompt_ids, sampling=sampling_params)
def test_front_generation_with_prompts_is_answered_or_refused(urls, ids, sampling):
    """Bodies SGLang does run, with ids inside and outside the vocabulary and odd sampling parameters: never a
    5xx (an out-of-vocabulary id once killed a scheduler), and a run stops within its max_new_tokens."""
    if _runs_long(sampling):
        return
    r = post(urls["front"] + "/generate", {"input_ids": ids, "sampling_params": sampling})
    assert r.status_code < 500, (ids, sampling, r.status_code, r.text[:300])
    flat = ids if isinstance(ids, list) and all(type(t) is int for t in ids) else None
    if flat and (min(flat) < 0 or max(flat) >= VOCAB):  # refused; naming input_ids when nothing else is wrong
        assert 400 <= r.status_code < 500, r.text[:300]
        if sampling is None or sampling == {}:
            assert "input_ids" in r.text, r.text[:300]
    if flat and isinstance(sampling, list):
        assert r.status_code in (400, 422), r.text[:300]
    if r.status_code == 200:
        limit = sampling.get("max_new_tokens", 128) if isinstance(sampling, dict) else 128
        assert len(r.json()["output_ids"]) <= max(1, int(limit))


# -- an instance --------------------------------------------------------------------------------------------------

@settings(max_examples=examples(1500), **SETTINGS)
@given(body=st.one_of(json_values, st.binary(max_size=40)))
def test_instance_routes_refuse_garbage(urls, body):
    inst = urls["instance"]
    for path in ("/prorsa/switch_role", "/prorsa/admission", "/prorsa/release", "/prorsa/expect", "/prorsa/kv/load",
                 "/prorsa/peers", "/prorsa/peer_lost"):
        if isinstance(body, dict) and _valid_and_disruptive(path, body):
            continue
        check(post(inst + path, body))


def _valid_and_disruptive(path: str, body: dict) -> bool:
    if path == "/prorsa/switch_role":
        return body.get("new_role") in ("prefill", "decode")
    if path == "/prorsa/admission":
        return isinstance(body.get("accept"), bool)
    if path == "/prorsa/peers":
        return isinstance(body.get("instances"), list)
    if path == "/prorsa/peer_lost":
        return isinstance(body.get("bootstrap_host"), str)
    return False


@settings(max_examples=examples(1500), **SETTINGS)
@given(field=st.sampled_from(["token_ids", "keys", "block_tokens", "hold_for_rid"]), value=json_values)
def test_kv_load_fields_are_named(urls, field, value):
    body = with_field({"token_ids": [1, 2, 3], "keys": ["k"], "block_tokens": 64, "hold_for_rid": ""}, field, value)
    r = post(urls["instance"] + "/prorsa/kv/load", body)
    check(r)
    if r.status_code == 422:
        assert r.json()["field"] in ("token_ids", "keys", "block_tokens", "hold_for_rid")


@settings(max_examples=examples(1000), **SETTINGS)
@given(rooms=json_values, only=json_values)
def test_release_fields_are_named(urls, rooms, only):
    r = post(urls["instance"] + "/prorsa/release", {"rooms": rooms, "only_not_started": only})
    check(r)
    if r.status_code == 200:  # a valid release of rooms nobody holds takes nothing off
        assert r.json()["released"] == []


def test_the_deployment_still_serves_after_fuzzing(deployment):
    insts = instances(deployment.url)
    assert all(i["status"] == "active" for i in insts)
    for inst in insts:
        assert _session.get(inst["url"] + "/prorsa/status", timeout=30).json()["admitting"] is True
    r = _session.post(deployment.url + "/generate", timeout=300,
                      json={"text": "after the fuzz", "sampling_params": {"max_new_tokens": 4}})
    assert r.status_code == 200
