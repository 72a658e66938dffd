"""/generate bodies and the parsing of SGLang's answers."""

from __future__ import annotations

import pytest

from sglang_prorsa.client.errors import InvalidArgument, ProrsaClientError
from sglang_prorsa.client.generation import generate_body, parse_generation


def test_body_merges_named_sampling_arguments():
    body = generate_body([1, 2, 3], None, {"top_p": 0.9, "max_new_tokens": 4}, max_new_tokens=8, temperature=0,
                         rid="r1", extra={"lora_path": "x"})
    assert body == {"input_ids": [1, 2, 3], "sampling_params": {"top_p": 0.9, "max_new_tokens": 8,
                                                                "temperature": 0.0},
                    "return_logprob": True, "rid": "r1", "lora_path": "x"}


def test_text_body_without_logprobs():
    assert generate_body(None, "hi", None, return_logprob=False) == {"text": "hi", "sampling_params": {}}


@pytest.mark.parametrize("args,kwargs,field", [
    ((None, None, None), {}, "input_ids"),
    (([1], "x", None), {}, "input_ids"),
    (([], None, None), {}, "input_ids"),
    (([1, -2], None, None), {}, "input_ids"),
    (([1, True], None, None), {}, "input_ids"),
    (("abc", None, None), {}, "input_ids"),
    ((None, "", None), {}, "text"),
    (([1], None, [1]), {}, "sampling_params"),
    (([1], None, None), {"max_new_tokens": -1}, "max_new_tokens"),
    (([1], None, None), {"temperature": "hot"}, "temperature"),
    (([1], None, None), {"extra": {"trajectory_id": "t"}}, "trajectory_id"),
    (([1], None, None), {"extra": {"input_ids": [2]}}, "input_ids"),
])
def test_bad_arguments_name_the_field(args, kwargs, field):
    with pytest.raises(InvalidArgument) as info:
        generate_body(*args, **kwargs)
    assert info.value.field == field


def test_parse_takes_ids_logprobs_and_meta():
    answer = {"text": "a b", "output_ids": [7, 9], "meta_info": {
        "prompt_tokens": 5, "completion_tokens": 2, "cached_tokens": 3, "weight_version": 2,
        "finish_reason": {"type": "length", "length": 2},
        "output_token_logprobs": [[-0.25, 7, None], [-1.5, 9, None]]}}
    g = parse_generation(answer, "t1", 0.5)
    assert g.output_ids == [7, 9] and g.text == "a b" and g.output_logprobs == [-0.25, -1.5]
    assert (g.prompt_tokens, g.completion_tokens, g.cached_tokens, g.context_tokens) == (5, 2, 3, 7)
    assert g.weight_version == "2" and g.trajectory_id == "t1" and g.finish_reason["type"] == "length"


def test_parse_falls_back_to_logprob_token_ids_and_unwraps_a_one_item_list():
    g = parse_generation([{"text": "", "meta_info": {"output_token_logprobs": [[-1.0, 4, None]]}}], None, 0.0)
    assert g.output_ids == [4] and g.completion_tokens == 1 and g.output_logprobs == [-1.0]


def test_parse_without_ids_is_a_clear_error():
    with pytest.raises(ProrsaClientError, match="no output_ids"):
        parse_generation({"text": "x", "meta_info": {}}, None, 0.0)
