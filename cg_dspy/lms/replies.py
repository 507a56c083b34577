"""What a reply carries beside its answer: the model's reasoning and why it stopped.

Reasoning models without a reasoning parser (Qwen3 thinking mode through llama.cpp
or Ollama, DeepSeek-R1 distills on vLLM without `--reasoning-parser`) put their
thoughts at the start of `content`, as `<think>…</think>` (or only the closing tag,
when the chat template opened it). `split_reasoning` takes them off, so no stage
parses thoughts and no answer carries them; a reply cut at `max_tokens` inside its
thoughts is all reasoning and no answer.

The engines report each call's facts (finish reason, reasoning length, the
structured-output mode used) to the innermost `collecting()` block, so the stage
that made the call records them. Answers served from DSPy's cache report nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

_OPEN = re.compile(r"\A\s*<think>", re.IGNORECASE)
_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a reply; reasoning is "" when the reply has none.

    A leading `<think>…</think>` is reasoning; so is everything before a `</think>`
    when the template already opened the tag; an unterminated leading `<think>` (the
    reply was cut while thinking) makes the whole reply reasoning.
    """
    opened = _OPEN.match(text)
    closed = _CLOSE.search(text)
    if closed is None:
        if opened:
            return text[opened.end():].strip(), ""
        return "", text
    start = opened.end() if opened else 0
    if not opened and "<think>" in text[: closed.start()].lower():
        return "", text  # a <think> block in the middle of an answer is the answer's business
    return text[start: closed.start()].strip(), text[closed.end():].lstrip()


@dataclass(frozen=True)
class CallFacts:
    """One LM call as the engine saw it."""

    finish_reason: str | None = None
    reasoning_chars: int = 0
    reasoning_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens the server's prefix cache held (not prefilled)
    structured_output: str | None = None  # the mode the endpoint got for a typed call

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


_collector: ContextVar[list[CallFacts] | None] = ContextVar("cg_dspy_call_facts", default=None)


@contextmanager
def collecting() -> Iterator[list[CallFacts]]:
    """Collect the facts of every LM call made in this block (and this thread)."""
    facts: list[CallFacts] = []
    token = _collector.set(facts)
    try:
        yield facts
    finally:
        _collector.reset(token)


def report(facts: CallFacts) -> None:
    """Called by an engine once per completed call."""
    sink = _collector.get()
    if sink is not None:
        sink.append(facts)
