"""A minimal OpenAI-compatible client that times completions (streaming via SSE)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .metrics import SpecDecodeMetrics


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer-token header vLLM's ``--api-key`` expects (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class VLLMClientError(RuntimeError):
    """The server answered a request with an HTTP error."""


def iter_sse_data(lines: Iterable[bytes | str]) -> Iterator[str]:
    """The ``data`` payloads of a server-sent-event stream, up to ``[DONE]``.

    Follows the SSE rules the OpenAI API uses: an event ends at a blank line,
    several ``data:`` lines of one event are joined by newlines, lines starting
    with ``:`` are comments (keep-alives), other fields are ignored.
    """
    data: list[str] = []
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if data:
                payload = "\n".join(data)
                data = []
                if payload == "[DONE]":
                    return
                yield payload
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data and "\n".join(data) != "[DONE]":
        yield "\n".join(data)


@dataclass
class Completion:
    """One completion and its timing, as the client saw it.

    Times are seconds since the request was sent.  With speculative decoding a
    streamed chunk often carries several tokens (everything accepted in one
    step), so per-token figures are derived from token counts, not chunk counts.
    """

    text: str
    #: Generated token ids; None when the server does not return them.
    token_ids: list[int] | None
    #: The prompt as token ids, when the server returns them.
    prompt_token_ids: list[int] | None
    finish_reason: str | None
    #: Generated tokens (from ``usage`` when present, else counted).
    num_tokens: int
    #: Time until the whole response had arrived.
    total_seconds: float
    #: Arrival time of each streamed chunk that carried tokens (empty without streaming).
    chunk_seconds: list[float] = field(default_factory=list)
    #: Tokens in each of those chunks.
    chunk_tokens: list[int] = field(default_factory=list)

    @property
    def time_to_first_token(self) -> float | None:
        """Seconds until the first token arrived (streaming only)."""
        return self.chunk_seconds[0] if self.chunk_seconds else None

    @property
    def inter_token_latency(self) -> float | None:
        """Mean seconds per token after the first (vLLM's benchmarks call it TPOT).

        (last arrival - first arrival) / (tokens - 1); None without streaming
        or with fewer than two tokens.
        """
        if not self.chunk_seconds or self.num_tokens < 2:
            return None
        return (self.chunk_seconds[-1] - self.chunk_seconds[0]) / (self.num_tokens - 1)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens / total request time (prefill included)."""
        return self.num_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first / time after the first token: the decode rate
        speculative decoding speeds up, without prefill and queueing."""
        latency = self.inter_token_latency
        return 1.0 / latency if latency else None


class OpenAIClient:
    """A minimal client for the OpenAI-compatible API of vLLM, for timing.

    Args:
        base_url: ``http://host:port`` (without ``/v1``).
        api_key: bearer token, when the server requires one.
        timeout: socket timeout in seconds for each request.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._model: str | None = None

    def _open(self, path: str, payload: Mapping[str, Any] | None = None) -> http.client.HTTPResponse:
        headers = auth_headers(self.api_key)
        data = None
        if payload is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")
            raise VLLMClientError(f"{error.code} from {path}: {body}") from None

    def _get_text(self, path: str) -> str:
        with self._open(path) as response:
            return response.read().decode()

    def models(self) -> list[str]:
        """Ids of the served models (``GET /v1/models``)."""
        return [model["id"] for model in json.loads(self._get_text("/v1/models"))["data"]]

    @property
    def model(self) -> str:
        """The first served model, looked up once."""
        if self._model is None:
            self._model = self.models()[0]
        return self._model

    def complete(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 64,
        temperature: float = 0.0,
        stream: bool = True,
        return_token_ids: bool = True,
        model: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Completion:
        """Send one completion request and time it.

        Args:
            prompt: text, or token ids (a list or a 1-D tensor; vLLM then
                skips tokenisation, which makes comparisons with a local
                model exact).
            max_tokens: tokens to generate at most.
            temperature: 0 is greedy decoding.
            stream: stream the answer (needed for time to first token and
                inter-token latency).
            return_token_ids: ask for the generated ids (a vLLM extension,
                ``return_token_ids``; other servers ignore it).
            model: served model id; the first served one when None.
            extra: further request fields, e.g. ``{"ignore_eos": True}``.
        """
        payload: dict[str, Any] = {
            "model": model or self.model,
            "prompt": prompt if isinstance(prompt, str) else [int(token) for token in prompt],
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": stream,
        }
        if return_token_ids:
            payload["return_token_ids"] = True
        if stream:
            payload["stream_options"] = {"include_usage": True}
        payload.update(extra or {})

        start = time.perf_counter()
        if not stream:
            with self._open("/v1/completions", payload) as response:
                body = json.loads(response.read())
            total = time.perf_counter() - start
            choice = body["choices"][0]
            token_ids = choice.get("token_ids")
            usage = body.get("usage") or {}
            return Completion(
                text=choice["text"],
                token_ids=token_ids,
                prompt_token_ids=choice.get("prompt_token_ids"),
                finish_reason=choice.get("finish_reason"),
                num_tokens=usage.get("completion_tokens", len(token_ids or [])),
                total_seconds=total,
            )

        text: list[str] = []
        token_ids: list[int] | None = None
        prompt_token_ids = None
        finish_reason = None
        usage: dict[str, int] = {}
        chunk_seconds: list[float] = []
        chunk_tokens: list[int] = []
        with self._open("/v1/completions", payload) as response:
            for data in iter_sse_data(response):
                now = time.perf_counter() - start
                event = json.loads(data)
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices", []):
                    text.append(choice.get("text", ""))
                    finish_reason = choice.get("finish_reason") or finish_reason
                    prompt_token_ids = choice.get("prompt_token_ids") or prompt_token_ids
                    ids = choice.get("token_ids")
                    if ids is not None:
                        token_ids = (token_ids or []) + ids
                    # Without ids, a chunk with text counts as one token; usage
                    # corrects the total at the end.
                    count = len(ids) if ids is not None else int(bool(choice.get("text")))
                    if count:
                        chunk_seconds.append(now)
                        chunk_tokens.append(count)
        total = time.perf_counter() - start
        return Completion(
            text="".join(text),
            token_ids=token_ids,
            prompt_token_ids=prompt_token_ids,
            finish_reason=finish_reason,
            num_tokens=usage.get("completion_tokens", sum(chunk_tokens)),
            total_seconds=total,
            chunk_seconds=chunk_seconds,
            chunk_tokens=chunk_tokens,
        )

    def metrics_text(self) -> str:
        """The raw Prometheus text of ``GET /metrics``."""
        return self._get_text("/metrics")

    def spec_decode_metrics(self) -> SpecDecodeMetrics:
        """The server's speculative-decoding counters now."""
        return SpecDecodeMetrics.from_prometheus_text(self.metrics_text())
