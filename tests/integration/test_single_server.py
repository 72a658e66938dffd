"""Our launcher serving the embedded default model: greedy ids must equal transformers' generate on the same weights."""

from __future__ import annotations

import time

import pytest
import requests
import torch
from tests_support import PROMPTS, generate_ids
from transformers import GenerationConfig

pytestmark = pytest.mark.integration

MAX_NEW = 24


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    # No EOS anywhere in generation: it runs its full length without masking EOS, like SGLang's ignore_eos.
    model.generation_config.eos_token_id = None
    return tok, model


def test_greedy_ids_equal_transformers_generate(single_server, hf_model):
    tok, model = hf_model
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        config = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                                  pad_token_id=tok.pad_token_id)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), generation_config=config)
        expected = out[0, len(ids):].tolist()
        got = generate_ids(single_server.url, ids, MAX_NEW)
        assert got == expected, f"prompt of {len(ids)} tokens diverged"


def test_text_prompt_tokenised_like_transformers(single_server, hf_model):
    tok, _ = hf_model
    prompt = PROMPTS[0]
    r = requests.post(single_server.url + "/generate", timeout=120, json={
        "text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == len(tok(prompt)["input_ids"])


def test_server_reports_its_overrides(single_server):
    info = requests.get(single_server.url + "/prorsa/info", timeout=10).json()
    assert info["sglang"] == "0.5.23"
    names = {o["name"]: o for o in info["overrides"]}
    assert names["mooncake_sender_no_host_tensor_indices"]["applied"] is True


def test_a_token_id_outside_the_vocabulary_is_a_400_and_the_server_lives_on(single_server):
    # SGLang 0.5.23 alone feeds it to the embedding, whose IndexError kills the scheduler (and every request on it).
    for stream in (False, True):
        r = requests.post(single_server.url + "/generate", timeout=120, json={
            "input_ids": [5, 7, 4004], "stream": stream, "sampling_params": {"max_new_tokens": 2}})
        if not stream:
            assert r.status_code == 400, r.text
            assert "field 'input_ids'" in r.text and "4004" in r.text
        else:
            assert "field 'input_ids'" in r.text  # a stream's error event
    assert len(generate_ids(single_server.url, [5, 7, 9], 3)) == 3


def test_a_sampling_parameters_list_that_does_not_fit_the_prompts_is_a_400(single_server):
    # SGLang 0.5.23 alone indexes the list unchecked: an empty one was a 500 (found by the generation fuzz test).
    for params in ([], [{"max_new_tokens": 2}]):
        r = requests.post(single_server.url + "/generate", timeout=120,
                          json={"input_ids": [5, 7, 9], "sampling_params": params})
        assert r.status_code == 400 and "field 'sampling_params'" in r.text, r.text
    r = requests.post(single_server.url + "/generate", timeout=120,
                      json={"input_ids": [[5, 7], [9, 11]], "sampling_params": [{"max_new_tokens": 2}]})
    assert r.status_code == 400 and "1 objects for 2 prompts" in r.text, r.text
    assert len(generate_ids(single_server.url, [5, 7, 9], 3)) == 3


def test_sglangs_own_id_fields_name_the_trajectory_without_any_header(single_server):
    """``session_id``, ``routing_key`` and ``conversation_id`` (SGLang 0.5.23 takes each on /generate with no session
    opened) report the request under that trajectory; a batch reports under none. A ``prefill_end`` posted for each
    id afterwards is refused with the state the engine's events put it in: ``decoded``, or unknown."""
    url = single_server.url
    base = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    before = requests.get(url + "/lifecycle/status", timeout=10).json()["events"]["applied"]
    ids = {"session_id": "sg-session", "routing_key": "sg-routing", "conversation_id": "sg-conversation"}
    for field, tid in ids.items():
        r = requests.post(url + "/generate", timeout=120, json={**base, field: tid})
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 3, r.text
    r = requests.post(url + "/generate", timeout=120, json={"input_ids": [[5, 6], [7, 8]], "routing_key": "sg-batch",
                                                            "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and len(r.json()) == 2, r.text
    r = requests.post(url + "/generate", timeout=120, json={**base, "session_id": 5})
    assert r.status_code == 400 and "session_id" in r.text, r.text  # SGLang's own validation, not a 500
    deadline = time.monotonic() + 30  # the engine sends its events in the background, every 50 ms
    while requests.get(url + "/lifecycle/status", timeout=10).json()["events"]["applied"] - before < 4 * len(ids):
        assert time.monotonic() < deadline, "the engine's events did not arrive"
        time.sleep(0.2)
    probe = [{"trajectory_id": tid, "event": "prefill_end"} for tid in (*ids.values(), "sg-batch")]
    answer = requests.post(url + "/lifecycle", timeout=10, json={"events": probe}).json()
    assert [(r["trajectory_id"], r["state"], r["reason"]) for r in answer["rejections"]] == [
        *((tid, "decoded", "invalid_transition") for tid in ids.values()), ("sg-batch", None, "unknown_trajectory")]
    ends = [{"trajectory_id": tid, "event": event} for tid in ids.values() for event in ("reward_start", "reward_end")]
    assert requests.post(url + "/lifecycle", timeout=10, json={"events": ends}).json()["applied"] == 2 * len(ids)
