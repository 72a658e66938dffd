"""Which errors from SGLang's response generator are aborts a switched request continues from (srt/engine/aborts.py),
(the request guard's tests are in test_request_guard.py)."""

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
