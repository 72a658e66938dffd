"""The request guard (srt/engine/request_guard.py) on SGLang's own ``GenerateReqInput``: each refused input is one
that killed a scheduler or ended in a 500 before, and each accepted one is then normalised by SGLang without error."""

import pytest
from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_prorsa.srt.engine.request_guard import MAX_ROOM, RequestRefused, check

VOCAB = 1024


def refused(**fields) -> RequestRefused:
    with pytest.raises(RequestRefused) as e:
        check(GenerateReqInput(**fields), VOCAB)
    assert str(e.value).startswith(f"field '{e.value.field}': ")
    return e.value


@pytest.mark.parametrize("fields", [
    dict(text="hello"),
    dict(text=["a", "b"], sampling_params=[{"max_new_tokens": 1}, {"temperature": 0.5}]),
    dict(input_ids=[0, 5, 1023], sampling_params={"max_new_tokens": 2, "n": 3}),
    dict(input_ids=[[1, 2], [3]], rid=["x", "y"], return_logprob=[True, False], logprob_start_len=0),
    dict(text="a", bootstrap_host="127.0.0.1", bootstrap_port=8998, bootstrap_room=MAX_ROOM - 1),
    dict(text=["a", "b"], bootstrap_host="h", bootstrap_port=1, bootstrap_room=MAX_ROOM - 2),
    dict(text=["a", "b"], bootstrap_host=["h", "h"], bootstrap_port=[1, 2], bootstrap_room=[7, 8]),
    dict(text="hello", input_ids=[5, 6]),  # both, same shape: SGLang uses the ids
    dict(input_ids=[1], token_ids_logprob=[1, 2], top_logprobs_num=VOCAB),
    dict(input_ids=[[1], [2]], token_ids_logprob=[[1], [2, 3]]),
    dict(text="a", sampling_params={"stop": "x", "max_new_tokens": 0}),
])
def test_valid_requests_pass_and_sglang_normalises_them(fields):
    obj = GenerateReqInput(**fields)
    check(obj, VOCAB)
    obj.normalize_batch_and_arguments()


def test_the_reported_request_is_refused_naming_bootstrap_room():
    # /v1/completions {"prompt": "hello", "input_ids": [[5, 6]]}: the route serves one prompt, the old relay sent a
    # list of rooms, and the prefill scheduler died in SGLang's PD bootstrap (unhashable type: 'list').
    e = refused(text="hello", bootstrap_host=["h"], bootstrap_port=[1], bootstrap_room=[5])
    assert e.field == "bootstrap_room" and "single prompt" in str(e)


@pytest.mark.parametrize("fields, field, match", [
    (dict(text=["a", "b"], bootstrap_room=[1, 2, 3]), "bootstrap_room", "3 values for 2 prompts"),
    (dict(text=["a", "b"], bootstrap_room=[1, 1]), "bootstrap_room", "must differ"),
    (dict(text="a", sampling_params={"n": 2}, bootstrap_room=[1, 2]), "bootstrap_room", "single prompt"),
    (dict(text=["a", "b"], sampling_params={"n": 2}, bootstrap_room=[1, 2]), "bootstrap_room", "n = 1"),
    (dict(text="a", bootstrap_room=-1), "bootstrap_room", "outside"),
    (dict(text=["a", "b"], bootstrap_room=MAX_ROOM - 1), "bootstrap_room", "outside"),
    (dict(text="a", bootstrap_room="7"), "bootstrap_room", "must be int"),
    (dict(text="a", bootstrap_room=True), "bootstrap_room", "must be int"),
    (dict(text="a", bootstrap_port=0), "bootstrap_port", "outside"),
    (dict(text="a", bootstrap_port=70000), "bootstrap_port", "outside"),
    (dict(text="a", bootstrap_host=""), "bootstrap_host", "characters"),
    (dict(text="a", bootstrap_host=5), "bootstrap_host", "must be str"),
    (dict(input_ids=[5, 1024]), "input_ids", r"token id 1024 is outside .*\[0, 1024\)"),
    (dict(input_ids=[[1], [2, -1]]), "input_ids", "token id -1"),
    (dict(input_ids=[1, "x"]), "input_ids", "must be integers"),
    (dict(input_ids=[1, True]), "input_ids", "must be integers"),
    (dict(input_ids=[[]]), "input_ids", "prompt 0 of the batch is empty"),
    (dict(input_ids=[[1], 5]), "input_ids", "prompt 1 of the batch is not a list"),
    (dict(input_ids="12"), "input_ids", "must be a list"),
    (dict(text="hello", input_ids=[[5, 6]]), "input_ids", "disagrees with 'text'"),
    (dict(text=["a", "b"], input_ids=[[5, 6]]), "input_ids", "disagrees with 'text'"),
    (dict(text=[]), "text", "non-empty list"),
    (dict(text=["a", 5]), "text", "non-empty list"),
    (dict(input_ids=[0], sampling_params=[]), "sampling_params", "single prompt"),
    (dict(text="a", sampling_params=[{}]), "sampling_params", "single prompt"),
    (dict(input_ids=[[1], [2]], sampling_params=[{}]), "sampling_params", "1 objects for 2 prompts"),
    (dict(text=["a", "b"], sampling_params=[{}, 3]), "sampling_params", "every element"),
    (dict(text="a", sampling_params="x"), "sampling_params", "object or a list"),
    (dict(text="a", sampling_params={"n": 0}), "sampling_params", "n must be"),
    (dict(text="a", sampling_params={"n": "2"}), "sampling_params", "n must be"),
    (dict(text="a", sampling_params={"temperature": "hot"}), "sampling_params", "TypeError"),
    (dict(text="a", sampling_params={"no_such_key": 1}), "sampling_params", "TypeError"),
    (dict(text="a", sampling_params={"top_p": 7}), "sampling_params", "top_p"),
    (dict(text="a", rid=["x"]), "rid", "single prompt"),
    (dict(text="a", return_logprob=[True]), "return_logprob", "single prompt"),
    (dict(text="a", logprob_start_len="0"), "logprob_start_len", "must be int"),
    (dict(text=["a", "b"], top_logprobs_num=[1]), "top_logprobs_num", "1 values for 2 prompts"),
    (dict(text="a", top_logprobs_num=VOCAB + 1), "top_logprobs_num", "outside"),
    (dict(text="a", token_ids_logprob=[1, VOCAB]), "token_ids_logprob", "vocabulary"),
    (dict(text="a", token_ids_logprob=[[1]]), "token_ids_logprob", "one list per prompt"),
    (dict(text="a", extra_key=["k"]), "extra_key", "single prompt"),
])
def test_inputs_that_crashed_are_refused_naming_the_field(fields, field, match):
    e = refused(**fields)
    assert e.field == field, e
    assert pytest.importorskip("re").search(match, str(e)), e


def test_a_refusal_is_a_value_error_sglang_answers_with_400():
    assert issubclass(RequestRefused, ValueError)


def test_a_prompt_empty_once_tokenized_is_refused_unless_a_session_or_media_supplies_it():
    from sglang_prorsa.srt.engine.request_guard import check_tokenized

    check_tokenized(GenerateReqInput(text="a"), [5])
    check_tokenized(GenerateReqInput(text="", session_params={"id": "s"}), [])
    check_tokenized(GenerateReqInput(input_ids=[1]), None)
    with pytest.raises(RequestRefused, match="field 'text': the prompt has no tokens"):
        check_tokenized(GenerateReqInput(text=""), [])
    with pytest.raises(RequestRefused, match="field 'input_ids'"):
        check_tokenized(GenerateReqInput(input_ids=[]), [])


def test_a_stop_regex_that_does_not_compile_is_refused():
    e = refused(text="a", sampling_params={"stop_regex": ["a(b"]})
    assert e.field == "sampling_params" and "error" in str(e)


def test_what_one_half_of_a_pd_pair_would_refuse_is_refused_by_both():
    """A prefill instance refuses beam search, and grammars without a backend; a decode half accepted meanwhile
    waited for KV that never came (found by the generation fuzz against a PD pair)."""
    from sglang_prorsa.srt.engine.request_guard import Limits

    decode = Limits(vocab_size=VOCAB, role="decode", grammar=False, dp_size=1)
    for fields, field in ((dict(text="a", sampling_params={"beam_width": 3}), "sampling_params"),
                          (dict(text="a", sampling_params={"json_schema": "{}"}), "sampling_params"),
                          (dict(text="a", routed_dp_rank=1), "routed_dp_rank"),
                          (dict(text="a", disagg_prefill_dp_rank=-1), "disagg_prefill_dp_rank")):
        with pytest.raises(RequestRefused) as e:
            check(GenerateReqInput(**fields), decode)
        assert e.value.field == field
    check(GenerateReqInput(text="a", disagg_prefill_dp_rank=3), decode)  # the prefill's dp size is its own
    with pytest.raises(RequestRefused, match="disagg_prefill_dp_rank"):
        check(GenerateReqInput(text="a", disagg_prefill_dp_rank=3), Limits(vocab_size=VOCAB, role="prefill"))
    colocated = Limits(vocab_size=VOCAB)  # beam search and grammars are SGLang's to serve there
    check(GenerateReqInput(text="a", sampling_params={"beam_width": 3, "json_schema": "{}"}), colocated)


def test_parallel_sampling_is_refused_on_a_pd_instance_only():
    from sglang_prorsa.srt.engine.request_guard import Limits

    for role in ("prefill", "decode"):
        with pytest.raises(RequestRefused, match="field 'sampling_params': n = 3"):
            check(GenerateReqInput(text="a", sampling_params={"n": 3}), Limits(vocab_size=VOCAB, role=role))
    check(GenerateReqInput(text="a", sampling_params={"n": 3}), Limits(vocab_size=VOCAB))
    check(GenerateReqInput(text="a", sampling_params={"n": 1}), Limits(vocab_size=VOCAB, role="decode"))


def test_values_the_scheduler_cannot_hold_are_refused():
    """Found by the generation fuzz, each killed a scheduler: top_k = 2**63-1 (int32 sampling tensors), a JSON
    positional_embed_overrides, and more top logprobs than a PD pair's metadata buffers hold."""
    from sglang_prorsa.srt.engine.request_guard import PD_MAX_TOP_LOGPROBS, Limits

    for sp in ({"top_k": 2**63 - 1}, {"stop_token_ids": [2**31]}, {"max_new_tokens": 2**40}):
        with pytest.raises(RequestRefused, match="field 'sampling_params'"):
            check(GenerateReqInput(text="a", sampling_params=sp), VOCAB)
    check(GenerateReqInput(text="a", sampling_params={"sampling_seed": 2**40, "top_k": 5}), VOCAB)
    with pytest.raises(RequestRefused, match="field 'positional_embed_overrides'"):
        check(GenerateReqInput(text="a", positional_embed_overrides={"x": 1}), VOCAB)
    prefill = Limits(vocab_size=VOCAB, role="prefill")
    with pytest.raises(RequestRefused, match="field 'top_logprobs_num'"):
        check(GenerateReqInput(text="a", return_logprob=True, top_logprobs_num=PD_MAX_TOP_LOGPROBS + 1), prefill)
    check(GenerateReqInput(text="a", return_logprob=True, top_logprobs_num=PD_MAX_TOP_LOGPROBS), prefill)
    check(GenerateReqInput(text="a", return_logprob=True, top_logprobs_num=PD_MAX_TOP_LOGPROBS + 1), VOCAB)
