"""A small OpenAI-compatible chat-completions server for tests and benchmarks.

The project talks to it exactly as to vLLM: `--model openai/<name> --api-base
http://127.0.0.1:PORT/v1`. It answers deterministically from the prompt (the JSON keys
a typed stage asks for, plain text for a free-text stage), can wait a fixed latency
per request, and injects faults on command: delays, HTTP errors with Retry-After,
connection resets, empty or non-JSON content, context-length errors.

It can also behave like the servers and models people run (`profile`, `reasoning`):
llama-cpp-python's server rejects OpenAI's `json_schema` response format with HTTP 500
and ignores `max_completion_tokens`; a reasoning model without a reasoning parser
opens its content with `<think>…</think>` (braces and JSON-looking text inside), or,
with a parser, sends the thoughts as `reasoning_content`. Every reply is cut at the
token limit the profile reads (one word = one token), with `finish_reason: length`.
Loopback only; stops with the test.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cg_dspy.optimize.plausible import PlausibleModel, default_reply
from cg_dspy.testing.prefix import PrefixCache, common_prefix, serialized  # noqa: F401 - used by tests, benchmarks

Realistic = PlausibleModel  # `ChatServer(reply=Realistic(salt))`: replies that cost what a real model's do


@dataclass
class Fault:
    """One injected fault, used by the next request(s) it matches."""

    kind: str  # "status" | "delay" | "reset" | "empty" | "text" | "context_length"
    status: int = 500
    seconds: float = 0.0
    text: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    match: str = ""  # only requests whose prompt contains this
    echo_auth: bool = False  # an error body that repeats the request's Authorization header


PROFILES = ("vllm", "llama-cpp")
THOUGHTS = ('Let me think. The rules say {"confirmed_correct": []} might be wanted, or {this}; '
            "I should check each requirement before I answer. ")


def completion(model: str | None, content: str, usage: dict | None, *, finish_reason: str = "stop",
               reasoning: str | None = None, reasoning_key: str = "reasoning_content") -> dict:
    """An OpenAI chat.completion body with one choice."""
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message[reasoning_key] = reasoning
    body = {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}]}
    if usage is not None:
        body["usage"] = usage
    return body


def token_limit(body: dict, profile: str) -> int | None:
    """The reply's token limit as the profile's server reads it."""
    names = ("max_tokens",) if profile == "llama-cpp" else ("max_tokens", "max_completion_tokens")
    limits = [body[n] for n in names if isinstance(body.get(n), int)]
    return min(limits) if limits else None


def cut(words: list[str], limit: int | None) -> tuple[list[str], bool]:
    """At most `limit` words, and whether the reply was cut."""
    if limit is None or len(words) <= limit:
        return words, False
    return words[:limit], True


class ChatServer:
    """Start with `with ChatServer() as server:`; `server.base_url` ends in /v1."""

    def __init__(self, reply: Callable[[list[dict]], str] = default_reply, latency: float = 0.0,
                 model_context: int = 32_768, report_usage: bool = True, profile: str = "vllm",
                 reasoning: str | None = None, prefix_cache: bool = False, slots: int | None = None,
                 served_model: str | None = None, die_after: int | None = None):
        if profile not in PROFILES or reasoning not in (None, "inline", "template", "field", "reasoning"):
            raise ValueError(f"profile {profile!r} / reasoning {reasoning!r}")
        self.reply = reply
        self.latency = latency
        self.model_context = model_context
        self.report_usage = report_usage  # some OpenAI-compatible servers send no `usage`
        self.profile = profile
        # None: no thoughts; "inline": <think>...</think> opens the content; "template": only the
        # closing tag (the chat template opened it); "field": thoughts in reasoning_content
        # (a reasoning parser on); "reasoning": in `reasoning` (newer vLLM's name for it).
        self.reasoning = reasoning
        self.cache = PrefixCache() if prefix_cache else None  # reports cached prompt tokens when on
        # `slots`: requests served at once, like a llama.cpp server's --parallel (the rest queue)
        self._slots = threading.BoundedSemaphore(slots) if slots else None
        self.served_model = served_model  # the `model` every reply names (default: the one asked for)
        self._connections: set = set()  # open client sockets (kill() cuts them)
        self.die_after = die_after  # kill() itself when this many requests have arrived
        self._dead = False
        self.faults: list[Fault] = []
        self.requests: list[dict] = []
        self.arrivals: list[float] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        report = self._httpd.handle_error  # after kill(), a cut connection is expected, not news
        self._httpd.handle_error = lambda request, address: None if self._dead else report(request, address)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self._dead:
            self._httpd.shutdown()
            self._httpd.server_close()

    def kill(self) -> None:
        """Die as a server process dies: no new connection is accepted and every open one
        is cut (a client keeping its connection alive sees it reset)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            self._dead = True
            for sock in list(self._connections):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()

    def inject(self, kind: str, **kwargs) -> None:
        with self._lock:
            self.faults.append(Fault(kind, **kwargs))

    def _take_fault(self, prompt: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.match in prompt:
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    def answer(self, body: dict, content: str) -> dict:
        """The completion body for `content`, with thoughts as the reasoning mode says,
        cut at the token limit the profile reads."""
        thoughts = THOUGHTS.split() if self.reasoning else []
        words, truncated = cut(thoughts + content.split(" "), token_limit(body, self.profile))
        thought, said = words[: len(thoughts)], words[len(thoughts):]
        reasoning = None
        text = " ".join(said) if truncated else content
        if self.reasoning in ("field", "reasoning"):
            reasoning = " ".join(thought)
        elif self.reasoning == "inline":
            text = "<think>" + " ".join(thought) + ("</think>\n\n" + text if len(thought) == len(thoughts) else "")
        elif self.reasoning == "template":
            text = " ".join(thought) + ("</think>\n\n" + text if len(thought) == len(thoughts) else "")
        template = serialized(body.get("messages") or [])
        prompt_tokens = len(template.split())  # one word, one token
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                 "total_tokens": prompt_tokens + len(words)}
        if self.cache is not None:
            with self._lock:
                cached = self.cache.prefill(template)
                self.cache.record(template, text)
            usage["prompt_tokens_details"] = {"cached_tokens": len(template[:cached].split())}
        model = self.served_model or body.get("model", "test-model")
        return completion(model, text, usage if self.report_usage else None,
                          finish_reason="length" if truncated else "stop", reasoning=reasoning,
                          reasoning_key="reasoning" if self.reasoning == "reasoning" else "reasoning_content")

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body in separate writes would wait ~40 ms

            def log_message(self, *args):  # quiet
                pass

            def setup(self):
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)

            def finish(self):
                with server._lock:
                    server._connections.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def do_GET(self):  # /v1/models, for clients that probe
                self._json(200, {"object": "list", "data": [{"id": "test-model", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                messages = body.get("messages") or []
                prompt = "\n".join(m.get("content") or "" for m in messages if isinstance(m.get("content"), str))
                with server._lock:
                    server.requests.append(body)
                    server.arrivals.append(time.monotonic())
                    dies = server.die_after is not None and len(server.requests) >= server.die_after
                if dies:  # this request is never answered: the process died with it
                    server.kill()
                    return None
                if server._slots is None:
                    return self._serve(body, messages, prompt)
                with server._slots:
                    return self._serve(body, messages, prompt)

            def _serve(self, body, messages, prompt):
                if server.latency:
                    time.sleep(server.latency)
                fault = server._take_fault(prompt)
                content = None
                if fault is not None:
                    if fault.kind == "delay":
                        time.sleep(fault.seconds)
                    elif fault.kind == "status":
                        message = fault.text or f"injected {fault.status}"
                        if fault.echo_auth:
                            message += f" (request had Authorization: {self.headers.get('Authorization')})"
                        return self._json(fault.status, {"error": {"message": message, "type": "server_error"}},
                                          fault.headers)
                    elif fault.kind == "reset":
                        self.connection.shutdown(2)
                        self.close_connection = True
                        return None
                    elif fault.kind == "context_length":
                        return self._json(400, {"error": {
                            "message": f"This model's maximum context length is {server.model_context} tokens. "
                                       "However, your messages resulted in more tokens.",
                            "type": "invalid_request_error", "param": "messages",
                            "code": "context_length_exceeded"}})
                    elif fault.kind == "empty":
                        content = ""
                    elif fault.kind == "text":
                        content = fault.text
                fmt = body.get("response_format") or {}
                if server.profile == "llama-cpp" and fmt.get("type") not in (None, "text", "json_object"):
                    return self._json(500, {"error": {"message": (
                        "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', "
                        "'type'), 'msg': \"Input should be 'text' or 'json_object'\"}"),
                        "type": "internal_server_error", "param": None, "code": None}})
                if content is None:
                    content = server.reply(messages)
                self._json(200, server.answer(body, content))

            def _json(self, status: int, payload: dict, headers: dict | None = None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        return Handler


async def _serve_fast(latency: float) -> None:
    """A lean asyncio server for throughput benchmarks: no faults, no thread per
    connection, so its own cost stays well below the latency it simulates. Each answer
    leaves `latency` seconds after its request arrived: the server's own work hides
    inside the latency instead of adding to it."""
    import asyncio
    import sys

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                deadline = loop.time() + latency
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = json.loads(await reader.readexactly(length)) if length else {}
                content = default_reply(body.get("messages") or [{"content": ""}])
                payload = json.dumps(completion(body.get("model"), content, {
                    "prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})).encode()
                await asyncio.sleep(deadline - loop.time())
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(payload)).encode() + b"\r\n\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()  # the client hung up, or the server is stopping

    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", flush=True)
    stdin_closed = loop.run_in_executor(None, sys.stdin.read)
    async with server:
        await stdin_closed


def main() -> None:
    """`python -m cg_dspy.testing.server [--latency S] [--fast]`: serve until stdin closes;
    prints the URL first."""
    import argparse
    import asyncio
    import selectors
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.0, help="seconds to wait before each answer")
    parser.add_argument("--fast", action="store_true", help="lean asyncio server without fault injection")
    args = parser.parse_args()
    if args.fast:
        # select() waits to the microsecond; epoll rounds each timer up to the next
        # millisecond, which would add ~0.5 ms to every simulated latency.
        loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
        try:
            loop.run_until_complete(_serve_fast(args.latency))
        finally:
            loop.close()
        return
    with ChatServer(latency=args.latency) as server:
        print(server.base_url, flush=True)
        try:
            sys.stdin.read()  # until the parent closes our stdin or kills us
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
