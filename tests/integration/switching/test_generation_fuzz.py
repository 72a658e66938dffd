"""Property-based fuzzing of the generation routes (issue 29), against live servers: the front, sglang-router over
the same instances, a prefill/decode pair addressed directly (as SGLang's router does), and a plain instance.

Bodies come from ``sglang_prorsa.testing.generation_fuzz``: built from each route's schema, and schema-valid but
inconsistent (batch and single fields mixed, fields of other routes, bootstrap fields of the wrong shape, extreme
numbers, unicode, empty and nested lists, token ids outside the vocabulary). Properties: no answer is a 5xx caused by
the input (``generation_fuzz.LEGITIMATE_5XX`` lists the front's own states, which a healthy deployment never shows),
every request is answered, no scheduler exits (every instance's PID and scheduler PID unchanged, no restart), and a
valid request is answered 200 right after. ``examples(n)``: n under ``--hypothesis-profile=full`` (10,000 cases over
the four targets), n/10 in CI.

The regression of issue 29 -- ``{"prompt": "hello", "input_ids": [[5, 6]]}`` on /v1/completions through a PD front
made the relay send a list ``bootstrap_room`` for a single prompt, and the prefill scheduler died on it -- is run on
each of the three routes through the front and the router, on the plain instance, and directly to a decode instance.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tests_support import instances

from sglang_prorsa.testing import generation_fuzz as gf
from sglang_prorsa.testing.profiles import examples

pytestmark = pytest.mark.integration

# No shrinking: after a scheduler died every later request fails too, and a shrunk example would mislead. The
# failing body is in the assertion message as it was sent.
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate))
TIMEOUT_S = 60.0

REGRESSION = {
    "/generate": {"text": "hello", "input_ids": [[5, 6]], "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"prompt": "hello", "input_ids": [[5, 6]], "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello"}], "input_ids": [[5, 6]],
                             "max_tokens": 2},
}
VALID = {  # sglang-router requires `model` on the OpenAI routes (422 without it); SGLang takes any name
    "/generate": {"text": "the agent calls a tool", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"model": "default", "prompt": "the agent calls a tool", "max_tokens": 2},
    "/v1/chat/completions": {"model": "default", "messages": [{"role": "user", "content": "hello"}],
                             "max_tokens": 2},
}
# Each route's single prompt, for the bootstrap fields sent straight to a decode instance.
SINGLE_PROMPT = {
    "/generate": {"text": "hello", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"prompt": "hello", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2},
}

_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fuzz-pd")


def _cases():
    # Deferred: SGLang's schemas and the model's vocabulary are read at the first example, not at collection.
    return st.deferred(lambda: gf.cases(vocab=gf.vocab_size()))


def _state(deployment, single_server) -> dict:
    """Every process the fuzz could kill: each instance's PID and scheduler PIDs, the plain server's, and the front's
    restart count where it reports one. (Not the registry's epoch: it also moves when a slow instance misses status
    polls and answers again, with nothing restarted.)"""
    listing = requests.get(deployment.url + "/prorsa/instances", timeout=30).json()
    procs = {i["instance"]: {"pid": i.get("pid"),
                             "schedulers": sorted(gf.scheduler_pids(i["pid"])) if i.get("pid") else None}
             for i in listing["instances"]}
    procs["single"] = {"pid": single_server.pid, "schedulers": sorted(gf.scheduler_pids(single_server.pid))}
    failures = listing.get("failures")
    restarts = failures.get("restarts") if isinstance(failures, dict) else None
    return {"processes": procs, "restarts": restarts}


@pytest.fixture(scope="module", autouse=True)
def start_state(deployment, single_server) -> dict:
    state = _state(deployment, single_server)
    for name, p in state["processes"].items():
        assert p["schedulers"] != [], f"{name} has no scheduler process before the fuzz: {p}"
    return state


def assert_unchanged(deployment, single_server, start: dict, what: str) -> None:
    now = _state(deployment, single_server)
    changed = {k: (start["processes"][k], now["processes"].get(k)) for k in start["processes"]
               if now["processes"].get(k) != start["processes"][k]}
    assert not changed, f"after {what}: processes changed (before, after): {changed}"
    assert now["restarts"] == start["restarts"], f"after {what}: restarts {start['restarts']} -> {now['restarts']}"


@pytest.fixture(scope="module")
def pd(deployment) -> dict:
    insts = [i for i in instances(deployment.url) if i["status"] == "active"]
    prefill = next(i for i in insts if i["role"] == "prefill")
    decode = next(i for i in insts if i["role"] == "decode")
    return {"prefill": prefill, "decode": decode}


def check(o: gf.Outcome, where: str, route: str, body) -> None:
    assert not gf.is_failure(o), f"{where} {route}: {o.describe()}\nbody: {json.dumps(body, allow_nan=True)}"


def send_pd(pd: dict, route: str, body) -> tuple[gf.Outcome, gf.Outcome]:
    """Both halves at once, with the bootstrap fields SGLang's router adds (the prefill instance's, a new room)."""
    p = pd["prefill"]
    body = gf.with_bootstrap(body, p["bootstrap_host"], p["bootstrap_port"])
    fp = _pool.submit(gf.send, p["url"], route, body, TIMEOUT_S)
    fd = _pool.submit(gf.send, pd["decode"]["url"], route, body, TIMEOUT_S)
    return fp.result(), fd.result()


# -- (a) the request of issue 29, on each route ----------------------------------------------------------------------

@pytest.mark.parametrize("route", gf.ROUTES)
@pytest.mark.parametrize("via", ["front", "router", "single"])
def test_issue_29_request(deployment, single_server, start_state, route, via):
    url = {"front": deployment.url, "router": deployment.router.url, "single": single_server.url}[via]
    # As the user sent it, and with a `model` (without one sglang-router refuses the OpenAI routes itself).
    for body in (REGRESSION[route], gf.with_model(route, REGRESSION[route])):
        o = gf.send(url, route, body, TIMEOUT_S)
        assert o.status is not None and (o.status == 200 or 400 <= o.status < 500), (body, o.describe())
        if o.status != 200:
            assert gf.names_a_field(o), (body, o.describe())
    after = gf.send(url, route, VALID[route], TIMEOUT_S)
    assert after.status == 200, after.describe()
    assert_unchanged(deployment, single_server, start_state, f"{REGRESSION[route]} on {route} via {via}")


@pytest.mark.parametrize("route", gf.ROUTES)
def test_list_bootstrap_room_for_one_prompt_is_refused_by_a_decode_instance(deployment, single_server, start_state,
                                                                            pd, route):
    p = pd["prefill"]
    body = dict(SINGLE_PROMPT[route], bootstrap_host=p["bootstrap_host"], bootstrap_port=p["bootstrap_port"],
                bootstrap_room=[1, 2])
    o = gf.send(pd["decode"]["url"], route, body, TIMEOUT_S)
    assert o.status == 400 and "bootstrap_room" in o.text, o.describe()
    assert_unchanged(deployment, single_server, start_state, f"a list bootstrap_room on {route}")


# -- (b) fuzz, per target -----------------------------------------------------------------------------------------

@settings(max_examples=examples(3000), **SETTINGS)
@given(case=_cases())
def test_fuzz_through_the_front(deployment, case):
    route, body = case
    check(gf.send(deployment.url, route, body, TIMEOUT_S), "front", route, body)


@settings(max_examples=examples(2500), **SETTINGS)
@given(case=_cases())
def test_fuzz_through_sglang_router(deployment, case):
    route, body = case
    body = gf.with_model(route, body)
    check(gf.send(deployment.router.url, route, body, TIMEOUT_S), "router", route, body)


@settings(max_examples=examples(2000), **SETTINGS)
@given(case=_cases())
def test_fuzz_a_pd_pair_directly(pd, case):
    route, body = case
    prefill, decode = send_pd(pd, route, body)
    check(prefill, "prefill instance", route, body)
    check(decode, "decode instance", route, body)


@settings(max_examples=examples(2500), **SETTINGS)
@given(case=_cases())
def test_fuzz_a_plain_instance(single_server, case):
    route, body = case
    check(gf.send(single_server.url, route, body, TIMEOUT_S), "plain instance", route, body)


# -- (c) nothing died, and everything still serves ----------------------------------------------------------------

def test_no_scheduler_exited_and_a_valid_request_is_answered(deployment, single_server, start_state):
    assert_unchanged(deployment, single_server, start_state, "the fuzz")
    insts = instances(deployment.url)
    assert all(i["status"] == "active" for i in insts), insts
    for url in (deployment.url, deployment.router.url, single_server.url):
        for route in gf.ROUTES:
            o = gf.send(url, route, VALID[route], TIMEOUT_S)
            assert o.status == 200, (url, route, o.describe())
