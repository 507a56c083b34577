"""ConversationAdapter: the task's conversation first, the stage after it.

DSPy's stock adapters open every prompt with a stage-specific system message, so two
stages of one task share no prefix. CL-bench prompts are long (10K tokens on average),
so here the task's own messages come first, byte-identical in every stage, and the
stage (its instruction, its other inputs, the output format) is appended to the final
user message. Servers with prefix caching (vLLM, OpenAI, llama.cpp) then reuse the
context across draft, audit, checker and revision. Signatures without a
`conversation` field (the judge) are formatted by the stock JSONAdapter.
"""

from __future__ import annotations

import functools
import json
import threading
import types
import typing
from typing import Any

import dspy
import pydantic

from cg_dspy.schemas import Message

CONVERSATION_FIELD = "conversation"
STAGE_HEADER = "\n\n=====\n"


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


def cache_type_adapters() -> None:
    """Build each pydantic TypeAdapter DSPy's adapters use once per type, not per call.

    DSPy 3.4 constructs a TypeAdapter (a full pydantic schema build, ~70 us for a list
    of audit items) for every input it serializes and every output field it parses, on
    every call: about 0.5 ms of each ContextGuard call. A TypeAdapter is immutable and
    thread-safe, so one per type serves every call; unhashable types and adapters built
    with options are made as before.
    """
    from dspy.adapters import utils

    if getattr(utils.TypeAdapter, "_cg_cached", False):
        return
    build = pydantic.TypeAdapter
    cached = functools.lru_cache(maxsize=1024)(build)

    def type_adapter(annotation, *args, **kwargs):
        if not args and not kwargs:
            try:
                return cached(annotation)
            except TypeError:  # unhashable annotation
                pass
        return build(annotation, *args, **kwargs)

    type_adapter._cg_cached = True
    utils.TypeAdapter = type_adapter


class CachedResponseFormat:
    """Decide each (LM, output fields) response format once, not on every call.

    DSPy works it out per call from a model-catalog lookup and a freshly built pydantic
    model; for a model the catalog does not know, that lookup scans the whole catalog.
    Constructing one also makes DSPy's per-type validators cached (`cache_type_adapters`).
    """

    _formats: dict = {}
    _lock = threading.Lock()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cache_type_adapters()

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        key = (lm.model, type(getattr(lm, "engine", None)).__name__, str(lm.kwargs.get("api_base")),
               tuple((name, repr(f.annotation)) for name, f in signature.output_fields.items()))
        with self._lock:
            known = key in self._formats
            chosen = self._formats.get(key)
        if not known:
            probe: dict = {}
            super()._prepare_response_format(lm, probe, signature)
            chosen = probe.get("response_format")
            with self._lock:
                self._formats[key] = chosen
        if chosen is not None and "response_format" not in lm_kwargs:
            lm_kwargs["response_format"] = chosen


class JSONAdapter(CachedResponseFormat, dspy.JSONAdapter):
    """DSPy's JSONAdapter with the response-format decision cached (the judge uses it)."""


class ConversationAdapter(CachedResponseFormat, dspy.JSONAdapter):
    """JSON-output adapter that keeps the conversation as the shared prompt prefix."""

    def format(self, signature, demos, inputs):  # noqa: D102 - documented on the class
        if CONVERSATION_FIELD not in signature.input_fields:
            return super().format(signature, demos, inputs)
        messages = as_messages(inputs[CONVERSATION_FIELD])
        stage = self.stage_block(signature, demos, inputs)
        last = messages[-1]
        messages[-1] = {"role": last["role"], "content": last["content"] + STAGE_HEADER + stage}
        return messages

    def stage_block(self, signature, demos, inputs) -> str:
        """The stage's own text: instruction, examples, inputs, output format."""
        parts = [signature.instructions.strip()]
        for i, demo in enumerate(d for d in demos if all(k in d for k in signature.output_fields)):
            shown = self._fields(signature, demo)
            outputs = json.dumps({k: _jsonable(demo[k]) for k in signature.output_fields}, ensure_ascii=False)
            parts.append(f"Example {i + 1} (its conversation omitted):\n{shown}\nOutput: {outputs}")
        fields = self._fields(signature, inputs)
        if fields:
            parts.append(fields)
        parts.append(_output_format(signature))
        return "\n\n".join(parts)

    @staticmethod
    def _fields(signature, values: dict) -> str:
        shown = []
        for name in signature.input_fields:
            if name == CONVERSATION_FIELD or name not in values:
                continue
            value = values[name]
            text = value if isinstance(value, str) else json.dumps(_jsonable(value), ensure_ascii=False)
            shown.append(f"[{name}]\n{text}")
        return "\n\n".join(shown)


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
