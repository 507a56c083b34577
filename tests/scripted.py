"""A scripted, deterministic LM for tests: a real DSPy engine behind `dspy.LM`.

It sees exactly the messages DSPy sends (so adapters, parsing and caching run for
real), works out which stage is asking from the stage instruction in the prompt, and
answers from a script: a dict stage -> reply (text as it is, anything else as JSON), or
a callable (stage, messages) -> reply. Free-text stages (draft, generate, revise,
feedback, refine) are answered with text.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

from cg_dspy.lms.embedded import request_messages

# Stages are told apart by the output keys (typed stages) or input fields (free-text
# stages) their prompt shows, so a stage is still recognised after an optimizer rewrites
# its instruction. A prompt with none of them is the plain generation: the bare task.
MARKERS = [
    ("propose", ["new_instruction"]),
    ("compress", ["shortened_instruction"]),
    ("judge", ["satisfaction_status"]),
    ("joint", ["requirement_status"]),
    ("audit", ['- "confirmed_correct"']),
    ("format", ['- "format_ok"']),
    ("procedure", ['- "proc_ok"']),
    ("rules", ['- "rules_ok"']),
    ("empirical", ['- "empirical_ok"']),
    ("edit", ['- "edits"']),
    ("revise", ["[fix_set]"]),
    ("refine", ["[feedback]"]),
    ("feedback", ["[previous_answer]"]),
    ("feedback", ["actionable feedback"]),  # chat layout: the previous answer is the turn before
    ("draft", ["[request]"]),
]


def stage_of(messages: list[dict]) -> str:
    """The stage asking, from the last message (where every layout puts the stage)."""
    last = messages[-1]["content"]
    for name, needles in MARKERS:
        if all(n in last for n in needles):
            return name
    return "generate"


@dataclass
class Call:
    stage: str
    messages: list[dict]
    temperature: float | None


class ScriptedEngine:
    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed"})

    def __init__(self, script):
        self.script = script
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def complete(self, request):
        messages = request_messages(request)
        stage = stage_of(messages)
        with self._lock:
            self.calls.append(Call(stage, messages, request.config.temperature))
        reply = self.script(stage, messages) if callable(self.script) else self.script.get(stage, {})
        text = reply if isinstance(reply, str) else json.dumps(reply)
        return Response(id=None, model="scripted", message=Message.assistant([TextPart(text)]),
                        finish_reason="stop", usage=Usage(input_tokens=len(str(messages)) // 4,
                                                          output_tokens=len(text) // 4))

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self):
        pass

    def stages(self) -> list[str]:
        return [c.stage for c in self.calls]


def scripted_lm(script, **kwargs) -> tuple[dspy.LM, ScriptedEngine]:
    engine = ScriptedEngine(script)
    lm = dspy.LM("scripted/test", engine=engine, cache=kwargs.pop("cache", False), num_retries=0,
                 temperature=kwargs.pop("temperature", 0.0), max_tokens=256, **kwargs)
    return lm, engine
