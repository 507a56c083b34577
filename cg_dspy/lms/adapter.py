"""ConversationAdapter: the task's conversation first, the stage after it.

DSPy's stock adapters open every prompt with a stage-specific system message, so two
stages of one task share no prefix, and they wrap every output in JSON. Here:

- The task's own messages come first, byte-identical in every stage. In the chat
  layout (the default) every stage after the draft continues the draft's chat: the
  draft prompt as it was sent, the answer as the assistant's turn, then the stage's
  own text as a user turn, so a prefix-caching server (vLLM, SGLang, llama.cpp,
  OpenAI) prefills only that turn. In the inline layout the stage (its instruction,
  its other inputs, the output format) is appended to the final user message.
- A stage with one free-text output (the draft, the revision, Self-Refine's steps)
  takes the reply itself as that output: the paper's Prompts 1 and 7 ask for the
  answer, and CL-bench answers are long Markdown, tables, or JSON of their own. No
  response format is sent for it.
- The plain generation (`Generate`: nothing but the conversation in, free text out)
  sends the conversation exactly as it is, as CL-bench's `infer.py` does.
- A typed stage (audit, checkers) asks for its JSON schema as the response format;
  the endpoint engine sends it in the form the server takes.

Signatures without a `conversation` field (the judge, DSPy's instruction proposers)
are formatted as DSPy's JSONAdapter formats them. Every reply is read without leading
`<think>` reasoning, whichever LM produced it.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from typing import Any

import dspy
import pydantic
from dspy.utils.exceptions import AdapterParseError

from cg_dspy.core.messages import Message
from cg_dspy.lms.replies import split_reasoning

CONVERSATION_FIELD = "conversation"
PREVIOUS_FIELD = "previous_answer"
STAGE_HEADER = "\n\n=====\n"


def free_text_field(signature) -> str | None:
    """The output field of a free-text stage (a conversation stage with one `str`
    output), else None. Other signatures (the judge, DSPy's own instruction proposers)
    keep the stock JSON format."""
    outputs = signature.output_fields
    if CONVERSATION_FIELD in signature.input_fields and len(outputs) == 1:
        name, field = next(iter(outputs.items()))
        if field.annotation is str:
            return name
    return None


def is_plain_generation(signature) -> bool:
    """Nothing but the conversation in, free text out: the request is the conversation."""
    return free_text_field(signature) is not None and list(signature.input_fields) == [CONVERSATION_FIELD]


def _shape(annotation: Any) -> str:
    """A short, readable description of the JSON value a field must hold."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _shape(args[0])
    if annotation is str:
        return "string"
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _shape(a) for a in args)
    if origin is list:
        return f"list of {_shape(args[0])}"
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        inner = ", ".join(f'"{k}": {_shape(f.annotation)}' for k, f in annotation.model_fields.items())
        return "{" + inner + "}"
    return getattr(annotation, "__name__", str(annotation))


def as_messages(conversation: list[Message] | list[dict]) -> list[dict[str, str]]:
    """Plain OpenAI-format dicts from Messages or dicts."""
    out = []
    for m in conversation:
        m = m if isinstance(m, dict) else m.model_dump()
        out.append({"role": m["role"], "content": m["content"]})
    return out


class ConversationAdapter(dspy.JSONAdapter):
    """Conversation-first prompts; free-text stages answer in text, typed stages in JSON."""

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        return dspy.Adapter.__call__(self, lm, _with_format(lm, lm_kwargs, signature), signature, demos, inputs)

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):
        return await dspy.Adapter.acall(self, lm, _with_format(lm, lm_kwargs, signature), signature, demos, inputs)

    def format(self, signature, demos, inputs):  # noqa: D102 - documented on the class
        if CONVERSATION_FIELD not in signature.input_fields:
            return super().format(signature, demos, inputs)
        return stage_messages(signature, demos, inputs)

    def parse(self, signature, completion):  # noqa: D102 - documented on the class
        answer = split_reasoning(completion)[1]
        name = free_text_field(signature)
        if name is None:
            return super().parse(signature, _prevalidated(signature, answer))
        answer = answer.strip()
        if not answer:
            raise AdapterParseError(adapter_name=type(self).__name__, signature=signature, lm_response=completion,
                                    message="the reply holds no answer (empty, or only reasoning)")
        return {name: answer}



def _prevalidated(signature, completion: str) -> str:
    """The reply with each output field's own `BeforeValidator`s applied (a judge's "Yes."
    read as "yes"): DSPy parses a field by its bare annotation and drops the validators
    declared beside it. A reply that is not a JSON object is left to DSPy's parser."""
    checks = {name: [m.func for m in field.metadata if isinstance(m, pydantic.BeforeValidator)]
              for name, field in signature.output_fields.items()}
    if not any(checks.values()):
        return completion
    try:
        fields = json.loads(completion)
    except ValueError:
        return completion
    if not isinstance(fields, dict):
        return completion
    for name, funcs in checks.items():
        for func in funcs if name in fields else ():
            fields[name] = func(fields[name])
    return json.dumps(fields, ensure_ascii=False)


def stage_messages(signature, demos, inputs) -> list[dict[str, str]]:
    """The messages a conversation stage sends.

    - The plain generation sends the conversation as it is.
    - A conversation that ends with the user's request (inline layout): the stage's
      text is appended to that last message.
    - A conversation that ends with the assistant's previous answer (chat layout: the
      draft's chat, continued): the stage's text is a new user turn, and the previous
      answer is not repeated in it, so a prefix-caching server prefills only that turn.
    """
    messages = as_messages(inputs[CONVERSATION_FIELD])
    if is_plain_generation(signature):
        return messages  # CL-bench's own request: the task's messages, nothing added
    last = messages[-1]
    if last["role"] == "assistant" and last["content"] == inputs.get(PREVIOUS_FIELD):
        return [*messages, {"role": "user", "content": stage_block(signature, demos, inputs, skip=PREVIOUS_FIELD)}]
    messages[-1] = {"role": last["role"], "content": last["content"] + STAGE_HEADER
                    + stage_block(signature, demos, inputs)}
    return messages


def stage_block(signature, demos, inputs, *, skip: str | None = None) -> str:
    """The stage's own text: instruction, examples, inputs (but `skip`), output format."""
    parts = [signature.instructions.strip()]
    for i, demo in enumerate(d for d in demos if all(k in d for k in signature.output_fields)):
        parts.append(f"Example {i + 1} (its conversation omitted):\n{_fields(signature, demo)}\n"
                     f"{_demo_output(signature, demo)}")
    fields = _fields(signature, inputs, skip=skip)
    if fields:
        parts.append(fields)
    if free_text_field(signature) is None:
        parts.append(_output_format(signature))
    return "\n\n".join(parts)


def _fields(signature, values: dict, *, skip: str | None = None) -> str:
    shown = []
    for name in signature.input_fields:
        if name in (CONVERSATION_FIELD, skip) or name not in values:
            continue
        value = values[name]
        text = value if isinstance(value, str) else json.dumps(_jsonable(value), ensure_ascii=False)
        shown.append(f"[{name}]\n{text}")
    return "\n\n".join(shown)


def _with_format(lm, lm_kwargs: dict, signature) -> dict:
    """The call's options with the stage's response format: none for free text."""
    kwargs = dict(lm_kwargs)
    if free_text_field(signature) is not None:
        kwargs.pop("response_format", None)
    elif "response_format" not in kwargs:
        chosen = response_format(lm, signature)
        if chosen is not None:
            kwargs["response_format"] = chosen
    return kwargs


def response_format(lm, signature):
    """What a typed stage asks for: its JSON schema where the LM takes one (the
    project's engines always do), else JSON mode, else nothing: DSPy's own choice,
    made once per LM and output fields instead of per call (for a model DSPy's
    catalog does not list, each decision scans the whole catalog)."""
    key = (getattr(lm, "model", ""), type(getattr(lm, "engine", None)).__name__,
           str(getattr(lm, "kwargs", {}).get("api_base")),
           tuple((name, repr(f.annotation)) for name, f in signature.output_fields.items()))
    chosen = _FORMATS.get(key, _MISSING)
    if chosen is _MISSING:
        probe: dict = {}
        dspy.JSONAdapter._prepare_response_format(_STOCK, lm, probe, signature)
        chosen = probe.get("response_format")
        if len(_FORMATS) >= 512:  # bounded: a long-lived process sees few distinct keys
            _FORMATS.clear()
        _FORMATS[key] = chosen
    return chosen


_FORMATS: dict[tuple, object] = {}
_MISSING = object()
_STOCK = dspy.JSONAdapter()  # DSPy's own decision, consulted once per key


def _demo_output(signature, demo: dict) -> str:
    name = free_text_field(signature)
    if name is not None:
        return f"[{name}]\n{demo[name]}"
    return "Output: " + json.dumps({k: _jsonable(demo[k]) for k in signature.output_fields}, ensure_ascii=False)


@functools.lru_cache(maxsize=256)
def _output_format(signature) -> str:
    """The output keys and their shapes: fixed per signature, so written once."""
    keys = "\n".join(
        f'- "{name}": {_shape(f.annotation)}. {f.json_schema_extra.get("desc", "")}'
        for name, f in signature.output_fields.items()
    )
    return f"Respond with only a JSON object with these keys, in this order:\n{keys}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
