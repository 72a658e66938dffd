"""The instance middleware types a generation route's errors (srt/engine/middleware.py): a 400 naming a field gets
``field`` (and OpenAI's ``param``), a 502 whose detail leads with our code gets ``code``; other bodies are kept."""

import orjson

from sglang_prorsa.srt.common.messages import Code
from sglang_prorsa.srt.engine.middleware import typed_error


def test_sglang_generate_400_gets_the_field():
    body = orjson.loads(typed_error(orjson.dumps({"error": {"message": "field 'bootstrap_room': a single prompt"}})))
    assert body["field"] == "bootstrap_room" and body["code"] == "invalid"
    assert body["error"]["message"].startswith("field 'bootstrap_room'")


def test_openai_400_gets_param_and_the_typed_code():
    raw = {"object": "error", "message": "field 'input_ids': token id 5000 is outside", "type": "BadRequest",
           "param": None, "code": 400}
    body = orjson.loads(typed_error(orjson.dumps(raw)))
    assert body["param"] == body["field"] == "input_ids" and body["code"] == "invalid"


def test_a_suspected_poison_502_gets_its_code():
    body = orjson.loads(typed_error(orjson.dumps({"detail": "suspected_poison: request r was on 2 instances"})))
    assert body["code"] == Code.SUSPECTED_POISON.value and body["error"].startswith("suspected_poison")
    assert Code.RESUME_FAILED.value == "resume_failed"


def test_a_suspected_poison_in_openai_shape_gets_its_code():
    raw = {"object": "error", "message": "suspected_poison: request r ...", "type": "502", "param": None, "code": 502}
    assert orjson.loads(typed_error(orjson.dumps(raw)))["code"] == "suspected_poison"


def test_other_bodies_are_left_as_they_are():
    for raw in (b"not json", b"[1]", orjson.dumps({"error": {"message": "Either text or input_ids"}}),
                orjson.dumps({"detail": "something else: x"})):
        assert typed_error(raw) == raw


def test_a_request_model_validator_that_raises_is_the_callers_400():
    """SGLang 0.5.23's ChatCompletionRequest validator calls .get on response_format: a number raised AttributeError
    inside pydantic and was answered 500 (found by the generation fuzz). Through the real model and middleware."""
    import asyncio

    from fastapi import FastAPI
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    from sglang_prorsa.srt.engine.middleware import EngineMiddleware

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest):
        return {"ok": True}

    class Side:
        user_aborts = 0
        started = True

    app.add_middleware(EngineMiddleware, side=Side())  # where the instance adds it (srt/instance/install.py)
    mw = app

    async def call(body: dict):
        raw = orjson.dumps(body)
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
                 "root_path": "", "scheme": "http", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2),
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]}
        out: dict = {"body": b""}

        async def receive():
            return {"type": "http.request", "body": raw, "more_body": False}

        async def send(message):
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
            else:
                out["body"] += message.get("body", b"")

        await mw(scope, receive, send)
        return out["status"], orjson.loads(out["body"])

    status, body = asyncio.run(call({"messages": [{"role": "user", "content": "hi"}], "response_format": 1e308}))
    assert status == 400 and body["field"] == "body" and body["code"] == "invalid", body
    status, body = asyncio.run(call({"messages": [{"role": "user", "content": "hi"}]}))
    assert status == 200 and body == {"ok": True}
