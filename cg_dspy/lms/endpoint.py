"""An OpenAI-compatible chat-completions endpoint as a DSPy engine.

It sends what the servers people run actually read (measured facts in the README's
"Using a real model" section):

- the token limit as `max_tokens` (llama-cpp-python's server ignores DSPy's
  `max_completion_tokens` and generates to the context size); OpenAI itself gets
  `max_completion_tokens`;
- typed stages' output schema in the form the endpoint takes: OpenAI's `json_schema`
  (vLLM, SGLang, llama.cpp's `llama-server`, Ollama, OpenAI), else llama-cpp-python's
  `json_object` + `schema`, else none (the prompt alone asks for JSON). `auto` tries
  them in that order on the first typed call and keeps what the endpoint accepted;
  a rejection is recognised by the plainer request then succeeding;
- every reply without its reasoning (`<think>…</think>` in the content goes to the
  reasoning part, as `reasoning_content` does), with the finish reason reported;
- no retry of a read timeout: the server may still be generating the timed-out
  reply, and on a single-slot server a retry would queue behind it. The task fails
  with that reason and the next run retries it.

The transport is DSPy's own (lm15's OpenAI Chat Completions adapter); DSPy's cache,
retries of 429/5xx/dropped connections, history and usage tracking work as for any
`dspy.LM`.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from dspy import lm15

from cg_dspy.lms import replies

STRUCTURED_OUTPUT = ("auto", "json_schema", "json_object", "off")
_NEGOTIATION = ("json_schema", "json_object", "off")
ENDPOINT_MARK = "cg_dspy_endpoint"  # carried in `metadata` so the endpoint is part of DSPy's cache key
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema")


class GenerationTimedOut(lm15.ProviderError):
    """No reply within the read timeout; deliberately not retryable."""

    default_code = "timeout"


def _rejects_format(exc: Exception) -> bool:
    """Could this error be the endpoint refusing the response format?"""
    if isinstance(exc, (lm15.ContextLengthError, lm15.AuthError, lm15.RateLimitError)):
        return False
    if isinstance(exc, lm15.InvalidRequestError):
        return True
    text = str(exc).lower()
    return isinstance(exc, lm15.ServerError) and any(word in text for word in _FORMAT_WORDS)


def without_reasoning(response: lm15.Response) -> tuple[lm15.Response, str]:
    """The response with inline `<think>` text moved to a thinking part; its reasoning."""
    parts = response.message.parts
    thinking = "".join(p.text for p in parts if isinstance(p, lm15.ThinkingPart))
    text = "".join(p.text for p in parts if isinstance(p, lm15.TextPart))
    inline, answer = replies.split_reasoning(text)
    if not inline:
        return response, thinking
    reasoning = "\n".join(t for t in (thinking, inline) if t)
    others = [p for p in parts if not isinstance(p, (lm15.TextPart, lm15.ThinkingPart))]
    message = lm15.Message.assistant([lm15.ThinkingPart(reasoning), lm15.TextPart(answer), *others])
    return replace(response, message=message), reasoning


def report_call(response: lm15.Response, reasoning: str, mode: str | None, cached: int | None = None) -> None:
    """Tell the stage that made this call how the reply ended (and how much of its prompt
    the server had cached: as it reports it, or as the embedded engine counts it)."""
    replies.report(replies.CallFacts(
        finish_reason=response.finish_reason, reasoning_chars=len(reasoning),
        reasoning_tokens=int(response.usage.reasoning_tokens or 0),
        cached_prompt_tokens=int(response.usage.cache_read_tokens or 0) if cached is None else cached,
        structured_output=mode))


class EndpointEngine:
    """`complete(Request) -> Response` against one OpenAI-compatible endpoint."""

    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed", "top_p", "stop",
                                  "reasoning_effort"})

    def __init__(self, model_id: str, base_url: str, *, api_key: str, timeout: float,
                 dialect: str = "vllm", structured_output: str = "auto", schema_bounds=None):
        if structured_output not in STRUCTURED_OUTPUT:
            raise ValueError(f"structured output {structured_output!r}: choose from {STRUCTURED_OUTPUT}")
        door = {"vllm": "vllm", "openai": "openai-chat"}[dialect]
        timeouts = lm15.Timeouts(read=timeout, write=timeout, pool=timeout)
        self._router = lm15.LMRouter(lm15.RouterConfig(api_keys={door: api_key}, base_urls={door: base_url},
                                                       timeouts=timeouts))
        self._model = f"{door}:{model_id}"
        self.base_url = base_url
        self.timeout = timeout
        self.requested = structured_output
        self.mode: str | None = None if structured_output == "auto" else structured_output
        self._schema_bounds = schema_bounds  # callable(schema) -> schema, or None
        self._negotiating = threading.Lock()
        self.served_model: str | None = None  # the `model` of the first reply (replicas must agree)
        self.sent = 0  # requests that left for the endpoint (a cache hit sends none)

    def describe(self) -> dict:
        bounds = getattr(self._schema_bounds, "keywords", None) or {}
        return {"api_base": self.base_url, "structured_output": self.requested,
                "item_limits": [bounds.get("max_items"), bounds.get("max_chars")] if bounds else None}

    def complete(self, request: lm15.Request) -> lm15.Response:
        config = request.config
        extensions = dict(config.extensions or {})
        metadata = {k: v for k, v in (extensions.pop("metadata", None) or {}).items() if k != ENDPOINT_MARK}
        if metadata:
            extensions["metadata"] = metadata
        wire = replace(request, model=self._model, config=replace(config, extensions=extensions or None))
        if config.response_format is None:
            return self._send(wire, None)
        if self.mode is None:
            with self._negotiating:
                if self.mode is None:
                    return self._negotiate(wire)
        return self._send(wire, self.mode)

    def _negotiate(self, wire: lm15.Request) -> lm15.Response:
        first: Exception | None = None
        for mode in _NEGOTIATION:
            try:
                response = self._send(wire, mode)
            except lm15.LM15Error as exc:
                if not _rejects_format(exc):
                    raise
                first = first or exc
                continue
            self.mode = mode
            return response
        raise first  # every form was refused: not a format problem

    def _formatted(self, wire: lm15.Request, mode: str | None) -> lm15.Request:
        fmt = wire.config.response_format
        if fmt is None or mode is None:
            return wire
        schema = fmt.get("schema")
        if schema is not None and self._schema_bounds is not None:
            schema = self._schema_bounds(schema)
        extensions = dict(wire.config.extensions or {})
        if mode == "json_schema":
            if schema is None:  # plain JSON mode asked (a signature with no strict schema): sent as asked
                return wire
            return replace(wire, config=replace(wire.config, response_format={**fmt, "schema": schema}))
        if mode == "json_object":
            extensions["response_format"] = {"type": "json_object", **({"schema": schema} if schema else {})}
        return replace(wire, config=replace(wire.config, response_format=None, extensions=extensions or None))

    def _send(self, wire: lm15.Request, mode: str | None) -> lm15.Response:
        self.sent += 1
        try:
            response = self._router.complete(self._formatted(wire, mode))
        except lm15.TransportError as exc:
            if "read timed out" in str(exc):
                raise GenerationTimedOut(
                    f"no reply within {self.timeout:g} s from {self.base_url}; not retried, because the server "
                    "may still be generating it (raise --timeout, lower --max-tokens, or rerun to retry the task)",
                    provider="endpoint") from exc
            raise
        self.served_model = self.served_model or response.model
        response, reasoning = without_reasoning(response)
        report_call(response, reasoning, mode)
        return response

    def stream(self, request: lm15.Request):
        return lm15.response_to_events(self.complete(request))

    def close(self) -> None:
        self._router.close()
