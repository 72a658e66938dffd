"""A text prompt is tokenized once: SGLang's own ids are kept on the request for our later needs."""

import asyncio
from types import SimpleNamespace

import pytest

from sglang_prorsa.srt.engine import hooks
from sglang_prorsa.srt.engine.local import TokenizerManagerView, kept_prompt_ids


class _Tokenizer:
    def __init__(self):
        self.calls = 0

    async def _tokenize_texts(self, text):
        self.calls += 1
        return [len(w) for w in text.split()], None


def _prompt_ids(tm, obj):
    return asyncio.run(TokenizerManagerView(tm).prompt_ids(obj))


def test_ids_sglang_made_are_kept_and_reused(monkeypatch):
    async def sglang_tokenize(self, obj):  # stands in for TokenizerManager._tokenize_one_request
        return SimpleNamespace(input_ids=[7, 8, 9])

    monkeypatch.setattr(hooks, "ENGINE", object())
    wrapped = hooks.wrap_tokenize_one_request(sglang_tokenize)
    obj = SimpleNamespace(text="a bb ccc", input_ids=None)
    assert asyncio.run(wrapped(None, obj)).input_ids == [7, 8, 9]
    assert kept_prompt_ids(obj) == [7, 8, 9]
    tm = _Tokenizer()
    assert _prompt_ids(tm, obj) == [7, 8, 9]
    assert tm.calls == 0  # not tokenized a second time


def test_without_kept_ids_the_text_is_tokenized_and_input_ids_win(monkeypatch):
    tm = _Tokenizer()
    assert _prompt_ids(tm, SimpleNamespace(text="a bb ccc", input_ids=None)) == [1, 2, 3]
    assert tm.calls == 1
    assert _prompt_ids(tm, SimpleNamespace(text=None, input_ids=[4, 5])) == [4, 5]
    assert tm.calls == 1


@pytest.mark.parametrize("engine", [None, object()])
def test_requests_with_ids_or_without_an_engine_keep_nothing(monkeypatch, engine):
    async def sglang_tokenize(self, obj):
        return SimpleNamespace(input_ids=[1, 2])

    monkeypatch.setattr(hooks, "ENGINE", engine)
    obj = SimpleNamespace(text=None, input_ids=[1, 2])
    asyncio.run(hooks.wrap_tokenize_one_request(sglang_tokenize)(None, obj))
    assert kept_prompt_ids(obj) is None
    text = SimpleNamespace(text="x", input_ids=None)
    asyncio.run(hooks.wrap_tokenize_one_request(sglang_tokenize)(None, text))
    assert kept_prompt_ids(text) == ([1, 2] if engine is not None else None)
