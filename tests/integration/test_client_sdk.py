"""The trainer SDK against a real SGLang engine (our launcher, embedded tiny model): exact greedy ids and logprobs,
hints that arrive and that the forecast sees, and generation that carries on through a hint outage."""

from __future__ import annotations

import asyncio

import pytest
import requests
import torch
from tests_support import PROMPTS, sampling

from sglang_prorsa.client import AsyncProrsaClient, HintConfig, ProrsaClient
from sglang_prorsa.srt.utils import processes

pytestmark = pytest.mark.integration

MAX_NEW = 12


@pytest.fixture(scope="module")
def hf(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return tok, model


def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy continuation and each chosen token's log-probability, one full forward per step."""
    seq, logprobs = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1].float()
            lp = torch.log_softmax(logits, dim=-1)
            nxt = int(torch.argmax(lp))
            seq.append(nxt)
            logprobs.append(float(lp[nxt]))
    return seq[len(ids):], logprobs


def raw_generate(url: str, ids: list[int]) -> dict:
    r = requests.post(url + "/generate", json={"input_ids": ids, "sampling_params": sampling(MAX_NEW),
                                               "return_logprob": True}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_returns_exact_greedy_ids_and_logprobs(single_server, hf):
    tok, model = hf
    with ProrsaClient(single_server.url) as client:
        for prompt in PROMPTS:
            ids = tok(prompt)["input_ids"]
            raw_generate(single_server.url, ids)  # warm the prefix cache: both calls below then hit it alike
            raw = raw_generate(single_server.url, ids)
            g = client.generate(ids, sampling_params=sampling(MAX_NEW))
            assert g.output_ids == raw["output_ids"]
            assert g.output_logprobs == [x[0] for x in raw["meta_info"]["output_token_logprobs"]]
            want_ids, want_lp = hf_greedy(model, ids, MAX_NEW)
            assert g.output_ids == want_ids, f"prompt of {len(ids)} tokens diverged from transformers"
            assert g.output_logprobs == pytest.approx(want_lp, abs=2e-3)
            assert (g.prompt_tokens, g.completion_tokens) == (len(ids), MAX_NEW)
            assert g.weight_version is not None


def test_hints_arrive_and_the_forecast_sees_the_trajectories(single_server, hf):
    tok, _ = hf
    ids = tok(PROMPTS[1])["input_ids"]
    # The engine may or may not report request arrival itself; the client reports it too, which is harmless.
    with ProrsaClient(single_server.url, hints=HintConfig(report_requests=True)) as client:
        before = client.lifecycle_status()
        trajs = [client.trajectory(task="swe", group_id="sdk-g", prompt_tokens=len(ids)) for _ in range(3)]
        for t in trajs:
            t.__enter__()
            with t.sandbox("prewarm"):
                pass
            t.generate(ids, sampling_params=sampling(4))
            t.tool_start("bash")
        assert client.flush_hints(30)
        during = client.forecast()
        for t in trajs:
            t.tool_end(result_tokens=8)
            with t.reward() as r:
                r.accepted = True
        assert client.flush_hints(30)
        after = client.lifecycle_status()
        stats = client.hint_stats

    assert during["live_trajectories"] == before["live_trajectories"] + 3
    assert during["states"]["tool"] >= 3
    # sampled, sandbox x2, request_arrived, prefill_end, decode_end, tool_start, tool_end, reward x2
    assert (stats.enqueued, stats.sent, stats.failed, stats.rejected) == (30, 30, 0, 0)
    received = sum(after["events"].values()) - sum(before["events"].values())
    assert received >= 30
    assert after["finished_trajectories"] == before["finished_trajectories"] + 3
    assert after["live_trajectories"] == before["live_trajectories"]


def test_async_group_shares_the_prompt_and_greedy_ids(single_server, hf):
    tok, _ = hf
    ids = tok(PROMPTS[2])["input_ids"]

    async def member(t):
        first = await t.generate(ids, sampling_params=sampling(6))
        second = await t.generate(ids + first.output_ids + [30 + len(t.generations)], sampling_params=sampling(6))
        return first.output_ids, second.output_ids, second.cached_tokens

    async def main():
        async with AsyncProrsaClient(single_server.url) as client:
            out = await client.run_group(4, member, task="math", group_id="sdk-async")
            await client.flush_hints(30)
            return out, client.hint_stats

    out, stats = asyncio.run(main())
    expected = raw_generate(single_server.url, ids)["output_ids"][:6]
    assert [o[0] for o in out] == [expected] * 4
    assert len({tuple(o[1]) for o in out}) == 1
    assert stats.failed == 0 and stats.sent == stats.enqueued == 8  # sampled + aborted per member


def test_a_hint_outage_does_not_stop_generation(single_server, hf):
    tok, _ = hf
    ids = tok(PROMPTS[0])["input_ids"]
    dead = f"http://127.0.0.1:{processes.free_port()}"
    cfg = HintConfig(max_attempts=2, backoff_base_s=0.01, close_timeout_s=10)
    with ProrsaClient(single_server.url, hints_url=dead, hints=cfg) as client:
        with client.trajectory(task="swe") as t:
            outs = []
            for _turn in range(3):
                g = t.generate(ids, sampling_params=sampling(MAX_NEW))
                outs.append(g.output_ids)
                with t.tool("bash"):
                    pass
        client.flush_hints(20)
        stats = client.hint_stats
    expected = raw_generate(single_server.url, ids)["output_ids"]
    assert outs == [expected] * 3
    assert stats.sent == 0 and stats.failed == stats.enqueued == 8  # sampled, 3 x tool start/end, aborted
