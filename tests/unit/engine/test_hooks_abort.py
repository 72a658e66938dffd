"""Which errors from SGLang's response generator are aborts a switched request continues from (srt/engine/aborts.py),
and the input checks of the tokenizer-manager hooks (srt/engine/hooks.py)."""

from types import SimpleNamespace

import fastapi

from sglang_prorsa.srt.engine.aborts import HandedBack, is_abort_exception


def test_a_finished_requests_raised_abort_is_continued_from():
    done = SimpleNamespace(finished=True)
    assert is_abort_exception(ValueError("Aborted by AbortReq"), done)  # SGLang: status 400
    assert is_abort_exception(fastapi.HTTPException(status_code=500, detail="KVTransferError"), done)


def test_other_errors_are_not():
    running = SimpleNamespace(finished=False)
    # A client that went away while the request waited: SGLang raises before the request finished.
    assert not is_abort_exception(ValueError("Request is disconnected from the client side (type 1)"), running)
    assert not is_abort_exception(RuntimeError("boom"), SimpleNamespace(finished=True))
    assert not is_abort_exception(KeyError("rid"), SimpleNamespace(finished=True))
    assert issubclass(HandedBack, ValueError)  # hence re-raised before the abort handler (hooks.py)


def test_token_ids_outside_the_vocabulary_are_refused_naming_the_field():
    import pytest

    from sglang_prorsa.srt.engine.hooks import check_token_ids

    check_token_ids([0, 5, 1023], 1024)
    check_token_ids([[1, 2], [1023]], 1024)
    check_token_ids(None, 1024)
    check_token_ids([5, 4000], None)  # vocabulary unknown: SGLang decides
    for ids in ([5, 1024], [[1], [2, -1]], [3, 4004, 7]):
        with pytest.raises(ValueError, match=r"field 'input_ids': token id -?\d+ is outside .*\[0, 1024\)"):
            check_token_ids(ids, 1024)
    with pytest.raises(ValueError, match="field 'input_ids': token ids must be integers"):
        check_token_ids([1, "x"], 1024)
    # an empty prompt inside a batch reached the scheduler as a 0-token prefill and killed it (found by the fuzz test)
    for ids, vocab in (([[]], 1024), ([[1, 2], []], 1024), ([[1], []], None)):
        with pytest.raises(ValueError, match=r"field 'input_ids': prompt \d of the batch is empty"):
            check_token_ids(ids, vocab)
    with pytest.raises(ValueError, match="field 'input_ids': prompt 1 of the batch is not a list of token ids"):
        check_token_ids([[1], 5], 1024)


def test_a_list_of_sampling_parameters_must_be_one_per_prompt():
    import pytest

    from sglang_prorsa.srt.engine.hooks import check_sampling_params

    def req(**kw):
        return SimpleNamespace(**{"text": None, "input_ids": None, "sampling_params": None, **kw})

    check_sampling_params(req(input_ids=[1, 2], sampling_params={"max_new_tokens": 2}))
    check_sampling_params(req(input_ids=[[1], [2]], sampling_params=[{}, {}]))
    check_sampling_params(req(text=["a", "b", "c"], sampling_params=[{}, {}, {}]))
    for bad, match in ((req(input_ids=[0], sampling_params=[]), "single prompt"),
                       (req(text="a", sampling_params=[{}]), "single prompt"),
                       (req(input_ids=[[1], [2]], sampling_params=[{}]), "1 objects for 2 prompts"),
                       (req(text=["a"], sampling_params=[]), "0 objects for 1 prompts")):
        with pytest.raises(ValueError, match=f"field 'sampling_params': .*{match}"):
            check_sampling_params(bad)
