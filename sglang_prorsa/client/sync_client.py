"""``ProrsaClient``: the synchronous trainer client (requests + a background hint thread).

    from sglang_prorsa.client import ProrsaClient

    with ProrsaClient("http://127.0.0.1:30000") as client:
        with client.trajectory(task="swe") as t:
            g = t.generate(input_ids=[...], max_new_tokens=64, temperature=0)
            print(g.output_ids, g.output_logprobs)

``url`` serves generation (our front, one engine, or sglang-router); ``hints_url`` (default: ``url``) serves
``/lifecycle``, e.g. the front or ``python -m sglang_prorsa.control_plane`` while generation goes straight to engines.
Safe to share between threads: each request borrows an HTTP session from a pool.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Sequence

import requests
from requests.adapters import HTTPAdapter

from sglang_prorsa.client import grpo
from sglang_prorsa.client.base import ClientBase, check_url
from sglang_prorsa.client.errors import ProrsaConnectionError, ProrsaHTTPError
from sglang_prorsa.client.generation import Generation
from sglang_prorsa.client.hints import HintConfig
from sglang_prorsa.client.senders import ThreadHintSender
from sglang_prorsa.client.trajectory import Trajectory

__all__ = ["ProrsaClient", "check_url"]


class ProrsaClient(ClientBase):
    def __init__(self, url: str, *, hints_url: str | None = None, hints: HintConfig | None = None,
                 timeout_s: float = 600.0, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(url, hints_url, hints, timeout_s, headers)
        self._sender = ThreadHintSender(self.hints_url, self.hint_config, self._buffer, self.headers)
        self._idle: list[requests.Session] = []
        self._lock = threading.Lock()

    # ----- generation -----
    def generate(self, input_ids: Sequence[int] | None = None, *, text: str | None = None,
                 sampling_params: Mapping[str, Any] | None = None, max_new_tokens: int | None = None,
                 temperature: float | None = None, return_logprob: bool = True, trajectory_id: str | None = None,
                 rid: str | None = None, extra: Mapping[str, Any] | None = None,
                 timeout_s: float | None = None) -> Generation:
        """``POST /generate`` for one prompt; returns output ids, text and (with ``return_logprob``) logprobs."""
        body, headers, report = self._generation_request(
            input_ids, text, sampling_params, trajectory_id, max_new_tokens=max_new_tokens, temperature=temperature,
            return_logprob=return_logprob, rid=rid, extra=extra)
        if self._must_send_hints_first(trajectory_id):
            self._sender.notify(urgent=True)  # queued hints of this turn go out now, beside the request
            if self.hint_config.order_timeout_s > 0:
                self._sender.wait_settled(self._stats.enqueued, self.hint_config.order_timeout_s)
        t0 = time.perf_counter()
        answer = self.post_json("/generate", body, headers=headers, timeout_s=timeout_s)
        return self._generation_answered(answer, trajectory_id, report, time.perf_counter() - t0)

    # ----- hints -----
    def trajectory(self, task: str | None = None, *, trajectory_id: str | None = None, group_id: str | None = None,
                   prompt_tokens: int | None = None) -> Trajectory:
        return Trajectory(self, trajectory_id=trajectory_id, task=task, group_id=group_id,
                          prompt_tokens=prompt_tokens)

    def run_group(self, n: int, fn: Callable[[Trajectory], Any], **kwargs: Any) -> list[Any]:
        """GRPO: ``fn(trajectory)`` for ``n`` members sharing a group id, concurrently (see ``grpo.run_group``)."""
        return grpo.run_group(self, n, fn, **kwargs)

    def flush_hints(self, timeout_s: float | None = None) -> bool:
        """Send every queued hint now; True once all are settled within ``timeout_s``."""
        return self._sender.flush(self.hint_config.close_timeout_s if timeout_s is None else timeout_s)

    # ----- control plane and engine routes -----
    def forecast(self) -> dict:
        return self.get_json("/prorsa/forecast", base=self.hints_url)

    def lifecycle_status(self) -> dict:
        return self.get_json("/lifecycle/status", base=self.hints_url)

    def decision(self) -> dict:
        return self.get_json("/prorsa/decision")

    def instances(self) -> dict:
        return self.get_json("/prorsa/instances")

    def metrics(self) -> str:
        return self._call("GET", "/prorsa/metrics", raw=True)

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                 **extra: Any) -> dict:
        body = self._weights_body(model_path, weight_version, extra)
        return self.post_json("/update_weights_from_disk", body)

    def get_json(self, path: str, *, params: Mapping[str, Any] | None = None, base: str | None = None) -> Any:
        return self._call("GET", path, params=params, base=base)

    def post_json(self, path: str, body: Any, *, headers: Mapping[str, str] | None = None,
                  timeout_s: float | None = None, base: str | None = None) -> Any:
        return self._call("POST", path, body=body, headers=headers, timeout_s=timeout_s, base=base)

    # ----- lifecycle of the client -----
    def close(self) -> None:
        """Deliver queued hints (up to ``HintConfig.close_timeout_s``), stop the sender, close the sessions."""
        if self._closed:
            return
        self._closed = True
        self._sender.close(self.hint_config.close_timeout_s)
        with self._lock:
            for session in self._idle:
                session.close()
            self._idle.clear()

    def __enter__(self) -> "ProrsaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- internals -----
    def _acquire(self) -> requests.Session:
        """A session no other thread is using: sessions are pooled, so their number stays at the peak concurrency
        however many threads come and go (requests.Session is not safe to share between threads)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=4)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session

    def _release(self, session: requests.Session) -> None:
        with self._lock:
            if self._closed:
                session.close()
            else:
                self._idle.append(session)

    def _call(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
              headers: Mapping[str, str] | None = None, timeout_s: float | None = None, base: str | None = None,
              raw: bool = False) -> Any:
        url = (base or self.url) + path
        all_headers = {**self.headers, **(headers or {})}
        session = self._acquire()
        try:
            r = session.request(method, url, json=body, params=params, headers=all_headers,
                                timeout=timeout_s or self.timeout_s)
        except requests.RequestException as exc:
            raise ProrsaConnectionError(method, url, exc) from exc
        finally:
            self._release(session)
        if not 200 <= r.status_code < 300:
            raise ProrsaHTTPError(method, url, r.status_code, r.text)
        if raw:
            return r.text
        try:
            return r.json()
        except ValueError:
            return r.text
