"""What the synchronous and the asyncio clients share: settings, the hint buffer and its counters, and the parts of
a generation call that do no I/O (the request body, the lifecycle events it reports)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from sglang_prorsa.client.errors import HintBufferFull, InvalidArgument, ProrsaClientError
from sglang_prorsa.client.generation import TRAJECTORY_ID_HEADER, Generation, generate_body, parse_generation
from sglang_prorsa.client.hints import HintBuffer, HintConfig, HintStats, make_event, request_arrived_tokens


def check_url(name: str, url: Any) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidArgument(name, f"must be an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


class ClientBase:
    """Subclasses set ``self._sender`` (a thread or an asyncio task) and do the HTTP."""

    def __init__(self, url: str, hints_url: str | None, hints: HintConfig | None, timeout_s: float,
                 headers: Mapping[str, str] | None) -> None:
        self.url = check_url("url", url)
        self.hints_url = check_url("hints_url", hints_url) if hints_url is not None else self.url
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.hint_config = hints or HintConfig()
        self._stats = HintStats()
        self._buffer = HintBuffer(self.hint_config, self._stats)
        self._sender: Any = None
        self._closed = False

    # ----- hints -----
    def hint(self, trajectory_id: str, event: str, **fields: Any) -> None:
        """Queue one lifecycle event (see ``trajectory.py`` for the usual way); returns at once."""
        if self._closed:
            raise ProrsaClientError(f"client for {self.url} is closed; no more hints")
        self._bind()
        self._buffer.put(make_event(trajectory_id, event, fields))
        self._sender.notify()

    def _bind(self) -> None:
        """Where the sender runs is settled here (the asyncio client binds its event loop)."""

    def _report(self, trajectory_id: str, event: str, **fields: Any) -> None:
        """A hint on generation's own path: a full buffer drops it (counted) rather than failing the request."""
        try:
            self.hint(trajectory_id, event, **fields)
        except HintBufferFull:
            self._stats.dropped_overflow += 1

    @property
    def hint_stats(self) -> HintStats:
        """A snapshot of the hint counters."""
        return HintStats(**self._stats.to_dict())

    # ----- generation, without the I/O -----
    def _generation_request(self, input_ids: Sequence[int] | None, text: str | None,
                            sampling_params: Mapping[str, Any] | None, trajectory_id: str | None,
                            **options: Any) -> tuple[dict, dict | None, bool]:
        """The body and headers of ``POST /generate``, and whether its lifecycle is reported (then
        ``request_arrived`` is queued here, before the request)."""
        body = generate_body(input_ids, text, sampling_params, **options)
        headers = {TRAJECTORY_ID_HEADER: trajectory_id} if trajectory_id else None
        report = bool(trajectory_id) and self.hint_config.report_requests
        if report:
            self._report(trajectory_id, "request_arrived", prompt_tokens=request_arrived_tokens(body))
        return body, headers, report

    def _must_send_hints_first(self, trajectory_id: str | None) -> bool:
        """Hints of this turn queued before its request go out beside it (urgent), in order when configured."""
        return bool(trajectory_id) and not self._buffer.drained

    def _generation_answered(self, answer: Any, trajectory_id: str | None, report: bool,
                             elapsed_s: float) -> Generation:
        if report:
            self._report(trajectory_id, "prefill_end")
            self._report(trajectory_id, "decode_end")
        return parse_generation(answer, trajectory_id, elapsed_s)

    @staticmethod
    def _weights_body(model_path: str, weight_version: str | None, extra: Mapping[str, Any]) -> dict:
        body = {"model_path": model_path, **extra}
        if weight_version is not None:
            body["weight_version"] = weight_version
        return body
