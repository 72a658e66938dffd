"""verl's agent loop with hints (``integrations/verl.py``), against a loopback stand-in for the front and verl's
generation path in process (``testing/verl_shapes.py``: classes shaped like verl 0.9.1's; verl is not installed):
the exact hints of each episode, in order, under its trajectory id; ``reward_end`` when verl assigns the reward after
``run``; ``aborted`` on an exception; the generation calls verl's loop makes, unchanged but for the id; and the
engine's reading of that id (``engine_api``), which leaves verl's sampling params exactly as verl built them."""

from __future__ import annotations

import asyncio
import copy
import gc
import sys

import pytest
from unit_support import StandInFront, loopback_upstream

from sglang_prorsa.integrations import verl
from sglang_prorsa.integrations.verl import ProrsaAgentLoop, current_trajectory, with_trajectory_id
from sglang_prorsa.policy.lifecycle import engine_api
from sglang_prorsa.policy.lifecycle.engine_api import TRAJECTORY_ID_PARAM, strip_carried_id
from sglang_prorsa.testing.verl_shapes import (
    AgentLoopOutput,
    DictConfigWrap,
    EchoTokenizerManager,
    EchoToolAgentLoop,
    InProcessServerManager,
    RolloutConfig,
    ToolListWrap,
    run_group,
    trainer_config,
    verl_sampling_params,
)

PROMPT = [1, 2, 3, 4]
SAMPLING = {**verl_sampling_params(RolloutConfig(), validate=True), "ignore_eos": True}


class Front(StandInFront):
    def seen(self, tid: str) -> list[tuple]:
        keys = ("turn", "prompt_tokens", "tool", "output_tokens", "accepted")
        return [(e["event"], *(e.get(k) for k in keys)) for e in self.events if e["trajectory_id"] == tid]


def run(scenario) -> Front:
    front = Front()

    async def main() -> None:
        async with loopback_upstream(front.routes()) as url:
            try:
                await (scenario(url, front) if scenario.__code__.co_argcount == 2 else scenario(url))
            finally:
                await verl.aclose()

    asyncio.run(main())
    return front


def make_loop(url: str, manager, *, config=None, **kwargs) -> ProrsaAgentLoop:
    """What verl's AgentLoopWorker._run_agent_loop does: hydra.utils.instantiate(registry entry, **verl's keywords)."""
    entry = {"name": "prorsa_tool_agent", "agent_loop": EchoToolAgentLoop, "hints_url": url, "turn_tokens": 8,
             "report_requests": False,
             **kwargs}
    return ProrsaAgentLoop(trainer_config=DictConfigWrap(config or trainer_config()), server_manager=manager,
                           tokenizer=None, processor=None, hf_model_type=None, dataset_cls=None,
                           data_config=DictConfigWrap({}), tools=ToolListWrap([]), **entry)


# Two model turns of 8 tokens around one echo tool of 3 tokens: 4 + 8 + 3 = 15 tokens before the second turn.
TRAINER_HINTS = [("sampled", 0, 4, None, None, None), ("tool_start", 1, None, "echo", None, None),
                 ("tool_end", 1, 15, None, None, None), ("reward_start", 2, None, None, None, None),
                 ("reward_end", 2, None, None, None, None)]


def test_a_group_sends_each_episodes_hints_in_order_and_the_engine_reads_its_id_on_every_request():
    tm = EchoTokenizerManager()
    episodes = []

    async def scenario(url):
        episodes.extend(await run_group(None, InProcessServerManager(tm), None, PROMPT, 4, tool_s=0.01,
                                        front_url=url, uid="group-a", task="swe"))

    front = run(scenario)
    tids = [e.trajectory_id for e in episodes]
    prefix = tids[0].rsplit("-", 1)[0]
    assert prefix.startswith("verl-") and prefix.endswith("-group-a")
    assert tids == [f"{prefix}-{i}" for i in range(4)]
    assert {e["group_id"] for e in front.events} == {prefix} and {e["task"] for e in front.events} == {"swe"}
    for tid in tids:
        assert front.seen(tid) == TRAINER_HINTS
    turn = list(range(100, 108))
    assert [e.turns for e in episodes] == [[turn, turn]] * 4 and [e.reward_score for e in episodes] == [1.0] * 4
    assert [e.output.num_turns for e in episodes] == [4] * 4  # ToolAgentLoop's count: user + assistant + 1
    # verl's request exactly, the id in its sampling params only (session_id unset: SGLang would take the request
    # for one of its sessions); then the engine's own reading of it (srt/engine/hooks.py trajectory_of): the
    # episode's id, every turn, with the id stripped from the sampling params the scheduler gets.
    from sglang_prorsa.srt.engine.hooks import trajectory_of

    verl_params = {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "ignore_eos": True,
                   "max_new_tokens": 8}
    assert len(tm.requests) == 8 and {r.session_id for r in tm.requests} == {None}
    sent = [r.sampling_params for r in tm.requests]
    carried = [p["custom_params"][TRAJECTORY_ID_PARAM] for p in sent]
    assert sorted(carried) == sorted(tids * 2)
    assert sent == [{**verl_params, "custom_params": {TRAJECTORY_ID_PARAM: t}} for t in carried]
    assert sorted(trajectory_of(r, None) for r in tm.requests) == sorted(tids * 2)
    assert [r.sampling_params for r in tm.requests] == [verl_params] * 8
    assert "verl" not in {m.split(".")[0] for m in sys.modules}


def test_reported_request_events_sit_between_the_trainers_hints():
    episodes = []

    async def scenario(url):
        episodes.extend(await run_group(None, InProcessServerManager(EchoTokenizerManager()), None, PROMPT, 1,
                                        front_url=url, uid="group-r", report_requests=True))

    front = run(scenario)
    assert front.seen(episodes[0].trajectory_id) == [
        ("sampled", 0, 4, None, None, None),
        ("request_arrived", None, 4, None, None, None), ("prefill_end", None, None, None, None, None),
        ("decode_end", None, None, None, 8, None),
        ("tool_start", 1, None, "echo", None, None), ("tool_end", 1, 15, None, None, None),
        ("request_arrived", None, 15, None, None, None), ("prefill_end", None, None, None, None, None),
        ("decode_end", None, None, None, 8, None),
        ("reward_start", 2, None, None, None, None), ("reward_end", 2, None, None, None, None)]


def test_reward_end_is_sent_when_verl_assigns_the_reward_after_run():
    seen: dict[str, list] = {}

    async def scenario(url, front):
        loop = make_loop(url, InProcessServerManager(EchoTokenizerManager()))
        output = await loop.run(dict(SAMPLING), uid="group-s", raw_prompt=None, prompt_ids=PROMPT)
        tid = output.extra_fields["prorsa_trajectory_id"]
        assert await verl.flush(10)
        seen["after run"] = [e[0] for e in front.seen(tid)]
        assert type(output).__name__ == "AgentLoopOutput" and isinstance(output, AgentLoopOutput)
        output.reward_score = 0.25  # verl: AgentLoopWorker._compute_score, final_output.reward_score = ...
        assert type(output) is AgentLoopOutput  # verl's class again
        output.reward_score = 0.5  # a second assignment sends nothing
        assert await verl.flush(10)
        seen["after score"] = [e[0] for e in front.seen(tid)]

    run(scenario)
    assert seen["after run"] == ["sampled", "tool_start", "tool_end", "reward_start"]
    assert seen["after score"] == ["sampled", "tool_start", "tool_end", "reward_start", "reward_end"]


@pytest.mark.parametrize("case", ["reward model on the actor's GPUs", "scored inside run", "forced run_end"])
def test_both_reward_hints_go_at_the_end_of_run_where_verl_does_not_score_after_it(case):
    config = trainer_config(reward_model=case == "reward model on the actor's GPUs")
    kwargs = {"reward": "run_end"} if case == "forced run_end" else {}
    tids = []

    class Scoring(EchoToolAgentLoop):
        async def run(self, sampling_params, **kw):
            out = await super().run(sampling_params, **kw)
            out.reward_score = 1.0
            return out

    async def scenario(url):
        cls = Scoring if case == "scored inside run" else EchoToolAgentLoop
        loop = make_loop(url, InProcessServerManager(EchoTokenizerManager()), config=config, agent_loop=cls,
                         **kwargs)
        output = await loop.run(dict(SAMPLING), uid=f"group-{len(case)}", prompt_ids=PROMPT)
        assert type(output) is AgentLoopOutput
        tids.append(output.extra_fields["prorsa_trajectory_id"])
        assert await verl.flush(10)

    front = run(scenario)
    assert front.seen(tids[0]) == TRAINER_HINTS


def test_an_output_released_unscored_sends_aborted():
    tids = []

    async def scenario(url):
        loop = make_loop(url, InProcessServerManager(EchoTokenizerManager()))
        output = await loop.run(dict(SAMPLING), uid="group-u", prompt_ids=PROMPT)
        tids.append(output.extra_fields["prorsa_trajectory_id"])
        del output
        gc.collect()
        assert await verl.flush(10)

    front = run(scenario)
    assert [e[0] for e in front.seen(tids[0])] == ["sampled", "tool_start", "tool_end", "reward_start", "aborted"]


def test_a_raising_or_cancelled_episode_sends_aborted():
    async def scenario(url):
        loop = make_loop(url, InProcessServerManager(EchoTokenizerManager()), fail=True)
        with pytest.raises(RuntimeError, match="sandbox died"):
            await loop.run(dict(SAMPLING), uid="group-f", prompt_ids=PROMPT)
        stuck = make_loop(url, InProcessServerManager(EchoTokenizerManager()), tool_s=60)
        task = asyncio.ensure_future(stuck.run(dict(SAMPLING), uid="group-c", prompt_ids=PROMPT))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await verl.flush(10)

    front = run(scenario)
    by_tid: dict[str, list[str]] = {}
    for e in front.events:
        by_tid.setdefault(e["trajectory_id"], []).append(e["event"])
    assert sorted(by_tid.values()) == [["sampled", "tool_start", "tool_end", "aborted"]] * 2


class Recording:
    """verl's server manager as the agent loop sees it (``LLMServerClient.generate``'s signature), keeping each call
    as it was made and answering through verl's in-process path."""

    def __init__(self, tm) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.inner = InProcessServerManager(tm)

    async def generate(self, *args, **kwargs):
        self.calls.append((args, {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}))
        return await self.inner.generate(*args, **kwargs)


def test_generation_calls_are_verls_own_with_the_id_in_the_sampling_params_only():
    bare, wrapped, plain = (Recording(EchoTokenizerManager()) for _ in range(3))
    tids = []

    async def scenario(url):
        config = DictConfigWrap(trainer_config())
        common = dict(processor=None, hf_model_type=None, dataset_cls=None, data_config=DictConfigWrap({}),
                      tools=ToolListWrap([]), turn_tokens=8)
        out = await EchoToolAgentLoop(trainer_config=config, server_manager=bare, tokenizer=None,
                                      **common).run(dict(SAMPLING), uid="g", prompt_ids=PROMPT)
        assert out.reward_score is None
        out = await make_loop(url, wrapped).run(dict(SAMPLING), uid="group-g", prompt_ids=PROMPT)
        tids.append(out.extra_fields["prorsa_trajectory_id"])
        await make_loop(url, plain, carry_id=False).run(dict(SAMPLING), uid="group-p", prompt_ids=PROMPT)

    run(scenario)
    (tid,) = tids
    assert len(bare.calls) == len(wrapped.calls) == len(plain.calls) == 2
    for (b_args, b), (w_args, w), (p_args, p) in zip(bare.calls, wrapped.calls, plain.calls):
        assert b_args == w_args == p_args == ()
        assert list(b) == list(w) == list(p) == ["request_id", "prompt_ids", "sampling_params", "image_data",
                                                 "video_data", "mm_processor_output", "audio_data",
                                                 "mm_processor_kwargs"]
        for key in b:
            if key != "request_id":
                assert b[key] == p[key], key
                assert b[key] == w[key] or key == "sampling_params", key
        assert w["sampling_params"] == {**b["sampling_params"], "custom_params": {TRAJECTORY_ID_PARAM: tid}}
        assert b["sampling_params"] == {**SAMPLING, "max_tokens": 8}
    # What verl's SGLang server builds from them: the same GenerateReqInput fields and values, the id inside the
    # sampling params only.
    fields = ["rid", "input_ids", "sampling_params", "return_logprob", "image_data", "video_data"]
    assert len(bare.inner.requests) == len(wrapped.inner.requests) == len(plain.inner.requests) == 2
    for b, w, p in zip(bare.inner.requests, wrapped.inner.requests, plain.inner.requests):
        assert list(b) == list(w) == list(p) == fields
        assert {k: v for k, v in w.items() if k not in ("rid", "sampling_params")} == \
            {k: v for k, v in b.items() if k not in ("rid", "sampling_params")}
        assert w["sampling_params"] == {**b["sampling_params"], "custom_params": {TRAJECTORY_ID_PARAM: tid}}
        assert p["sampling_params"] == b["sampling_params"]
        assert b["sampling_params"] == {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                                        "ignore_eos": True, "max_new_tokens": 8}


def test_the_engine_reads_the_carried_id_and_stripping_it_gives_back_verls_sampling_params():
    tid = "verl-abc123-group-e-0"
    # verl's params as they reach SGLangHttpServer.generate: without custom_params, and with a custom logit
    # processor's own values in it.
    plain = {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True,
             "ignore_eos": True}
    own = {**plain, "custom_params": {"k": 1}}
    for verls in (plain, own):
        before = copy.deepcopy(verls)
        params = with_trajectory_id(verls, tid)
        assert verls == before  # verl's dict is left as it was: verl reuses it every turn
        assert params == {**before, "custom_params": {**before.get("custom_params", {}), TRAJECTORY_ID_PARAM: tid}}
        assert engine_api.carried_id(params) == tid
        assert engine_api.trajectory_id_of({"sampling_params": params}, None) == tid
        strip_carried_id(params)
        assert params == before
    assert "custom_params" not in plain and own["custom_params"] == {"k": 1}
    # SGLang's own fields still come first; a malformed carried id is skipped.
    assert engine_api.trajectory_id_of({"session_id": "s-1", "sampling_params": with_trajectory_id({}, tid)},
                                       None) == "s-1"
    assert engine_api.trajectory_id_of({"sampling_params": {"custom_params": {TRAJECTORY_ID_PARAM: 5}}}, None) is None

    # The ids the loop put on its requests: what the engine reads from each, and verl's params once stripped.
    wrapped = Recording(EchoTokenizerManager())
    tids = []

    async def scenario(url):
        out = await make_loop(url, wrapped).run(dict(SAMPLING), uid="group-e", prompt_ids=PROMPT)
        tids.append(out.extra_fields["prorsa_trajectory_id"])

    run(scenario)
    (loop_tid,) = tids
    assert len(wrapped.inner.requests) == 2
    for request in wrapped.inner.requests:
        params = request["sampling_params"]
        assert engine_api.trajectory_id_of({"sampling_params": params}, None) == loop_tid
        strip_carried_id(params)
        assert params == {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                          "ignore_eos": True, "max_new_tokens": 8}


def test_hints_url_comes_from_the_config_entry_only_and_a_missing_one_is_named(monkeypatch):
    monkeypatch.setenv("SGLANG_PRORSA_HINTS_URL", "http://127.0.0.1:9")  # never read
    with pytest.raises(ValueError, match="field 'hints_url': required"):
        make_loop(None, object())
    with pytest.raises(ValueError, match="field 'reward'"):
        make_loop("http://127.0.0.1:9", object(), reward="later")
    loop = make_loop("http://127.0.0.1:9", object(), agent_loop="sglang_prorsa.testing.verl_shapes.EchoToolAgentLoop",
                     hints={"flush_interval_s": 0.5})
    assert loop.hints_url == "http://127.0.0.1:9" and loop.hint_config.flush_interval_s == 0.5
    assert isinstance(loop.inner, EchoToolAgentLoop) and loop.tool_s == 0.0  # the inner loop's attributes
    assert loop.inner.server_manager is loop.server_manager and loop.reward == "after_run"
    with pytest.raises(LookupError):
        current_trajectory()


def test_run_group_without_hints_takes_turn_lengths_a_tool_answer_and_plain_sampling_params():
    tm = EchoTokenizerManager(first=50)
    episodes = []

    async def go():
        episodes.extend(await run_group(None, InProcessServerManager(tm), None, PROMPT, 2, turn_tokens=[4, 2, 3],
                                        tool_result=[7, 11, 13, 17],
                                        sampling_params={"temperature": 0, "ignore_eos": True}))

    asyncio.run(go())
    assert [e.trajectory_id for e in episodes] == [None, None]
    assert [e.turns for e in episodes] == [[[50, 51, 52, 53], [50, 51], [50, 51, 52]]] * 2
    assert [e.output.num_turns for e in episodes] == [6, 6] and [e.reward_score for e in episodes] == [1.0, 1.0]
    assert [r.input_ids for r in tm.requests[::2]] == [PROMPT, PROMPT + [50, 51, 52, 53, 7, 11, 13, 17],
                                                       PROMPT + [50, 51, 52, 53, 7, 11, 13, 17, 50, 51, 7, 11, 13, 17]]
    assert {r.return_logprob for r in tm.requests} == {False} and {r.session_id for r in tm.requests} == {None}
    assert tm.requests[0].sampling_params == {"temperature": 0, "ignore_eos": True, "max_new_tokens": 4}
