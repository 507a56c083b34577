"""Every LM the project uses is built here.

Remote LMs are LiteLLM model strings wrapped in `dspy.LM`: `openai/...` and
`hosted_vllm/...` through `EndpointEngine` (what real OpenAI-compatible servers read;
see endpoint.py), any other provider (`ollama_chat/...`, `anthropic/...`) as DSPy
sends it. With nothing configured, the embedded local LM runs in-process (embedded.py).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from urllib.parse import urlparse

import dspy

from cg_dspy.lms.embedded import (
    LOCAL_ITEM_LIMITS,
    LOCAL_MAX_TOKENS,
    LOCAL_MODEL,
    LlamaCppEngine,
    bound_schema,
    find_local_gguf,
)
from cg_dspy.lms.endpoint import ENDPOINT_MARK, EndpointEngine
from cg_dspy.lms.replicas import ReplicaLM, endpoints

DEFAULT_TIMEOUT = 600.0  # seconds per request: long CL-bench answers and thinking take minutes
ENDPOINT_PROVIDERS = ("openai", "hosted_vllm")  # LiteLLM prefixes served through EndpointEngine
OPENAI_BASE = "https://api.openai.com/v1"
REASONING_EFFORTS = ("low", "medium", "high")  # what vLLM, SGLang and OpenAI accept as reasoning_effort
# Items per audit/checker list and characters per item that the output schema allows
# a real model: room for a task with forty rubrics (the embedded model gets far less).
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
    reasoning_effort: str | None = None  # sent as `reasoning_effort` when set; never for the embedded model

    @classmethod
    def from_env(cls, prefix: str = "CG_", **flags) -> LMSettings:
        """Fill unset flags from `{prefix}MODEL`, `{prefix}API_BASE`, `{prefix}TEMPERATURE`,
        `{prefix}MAX_TOKENS`, `{prefix}REASONING_EFFORT`."""
        env = os.environ
        values = {
            "model": env.get(f"{prefix}MODEL"),
            "api_base": env.get(f"{prefix}API_BASE"),
            "temperature": _num(env.get(f"{prefix}TEMPERATURE"), float),
            "max_tokens": _num(env.get(f"{prefix}MAX_TOKENS"), int),
            "reasoning_effort": env.get(f"{prefix}REASONING_EFFORT") or None,
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
            "reasoning_effort": self.reasoning_effort,
            "timeout": self.timeout,
            "structured_output": self.structured_output,
            "item_limits": list(self.item_limits),
        }


def _num(text: str | None, kind):
    return kind(text) if text not in (None, "") else None


def build_lm(settings: LMSettings, *, default_temperature: float = 0.0) -> dspy.LM:
    """A dspy.LM for the settings: the embedded model, an OpenAI-compatible endpoint,
    or any other LiteLLM model string."""
    temperature = default_temperature if settings.temperature is None else settings.temperature
    bounds = functools.partial(bound_schema, max_items=settings.item_limits[0], max_chars=settings.item_limits[1])
    common = {"temperature": temperature, "cache": settings.cache}
    if settings.reasoning_effort is not None:
        if settings.reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning effort {settings.reasoning_effort!r}: choose from {list(REASONING_EFFORTS)}")
        if settings.is_local:
            raise ValueError("--reasoning-effort: the embedded model does not reason; it is for a reasoning model "
                             "behind --model/--api-base")
        common["reasoning_effort"] = settings.reasoning_effort
    if settings.is_local:
        return dspy.LM(LOCAL_MODEL, engine=LlamaCppEngine(find_local_gguf(), schema_bounds=bounds),
                       max_tokens=settings.max_tokens or LOCAL_MAX_TOKENS, num_retries=0, **common)
    provider, _, model_id = settings.model.partition("/")
    bases, _ = endpoints(settings.api_base)  # an endpoint listed twice is one replica
    if provider in ENDPOINT_PROVIDERS:
        if len(bases) > 1:  # one LM per replica, one cache for all: they serve one model
            one = {"num_retries": min(settings.num_retries, 1), "cache_key": ",".join(sorted(bases))}
            return ReplicaLM([_endpoint_lm(settings, model_id, base, bounds, common, **one) for base in bases], bases)
        return _endpoint_lm(settings, model_id, bases[0] if bases else OPENAI_BASE, bounds, common)
    if len(bases) > 1:
        raise ValueError(f"{settings.model}: several --api-base endpoints are served as replicas through an "
                         "OpenAI-compatible model string (openai/NAME or hosted_vllm/NAME)")
    kwargs: dict[str, object] = {"api_base": settings.api_base.strip()} if bases else {}  # as given, as before
    if settings.timeout:
        kwargs["timeout"] = settings.timeout
    return dspy.LM(settings.model, max_tokens=settings.max_tokens, num_retries=settings.num_retries,
                   **common, **kwargs)


def _endpoint_lm(settings: LMSettings, model_id: str, base: str, bounds, common: dict, *,
                 num_retries: int | None = None, cache_key: str | None = None) -> dspy.LM:
    """A dspy.LM on one OpenAI-compatible endpoint (DSPy's cache keyed by `cache_key`,
    the endpoint by default)."""
    dialect = "openai" if urlparse(base).hostname == "api.openai.com" else "vllm"
    key = os.environ.get("OPENAI_API_KEY")
    if not key and dialect == "openai":
        raise ValueError(f"{settings.model}: OPENAI_API_KEY is not set (or pass --api-base for a self-hosted "
                         "OpenAI-compatible server)")
    # Self-hosted servers often need no key, but the wire wants one; a placeholder is not a secret.
    engine = EndpointEngine(model_id, base, api_key=key or "no-key", timeout=settings.timeout or DEFAULT_TIMEOUT,
                            dialect=dialect, structured_output=settings.structured_output, schema_bounds=bounds)
    return dspy.LM(settings.model, engine=engine, max_tokens=settings.max_tokens,
                   num_retries=settings.num_retries if num_retries is None else num_retries,
                   metadata={ENDPOINT_MARK: cache_key or base}, **common)


def lm_identity(lm) -> dict:
    """What decides an LM's answers (never its key): which model, where, how sampled and
    bounded. Two LMs with the same identity give the same replies to the same prompts."""
    kwargs = getattr(lm, "kwargs", {}) or {}
    engine = getattr(lm, "engine", None)
    identity = {"model": getattr(lm, "model", str(lm)), "temperature": kwargs.get("temperature"),
                "max_tokens": kwargs.get("max_tokens") or kwargs.get("max_completion_tokens")}
    if kwargs.get("reasoning_effort"):  # only when sent, so files written before it still resume
        identity["reasoning_effort"] = kwargs["reasoning_effort"]
    if hasattr(lm, "describe"):  # several replicas: every endpoint
        identity.update(lm.describe())
    elif hasattr(engine, "describe"):
        identity.update(engine.describe())
    elif kwargs.get("api_base"):
        identity["api_base"] = kwargs["api_base"]
    return identity




class EnvironmentLM(dspy.BaseLM):
    """The LM the loading process's environment names (`CG_MODEL`, `CG_API_BASE`,
    `CG_TEMPERATURE`, `CG_MAX_TOKENS`; the embedded model when unset), built on its first
    call and used in its place.

    A logged MLflow model carries this instead of the run's own LM, so the model holds
    no endpoint and no key: whoever loads it decides where its calls go.
    """

    def __init__(self):
        super().__init__(model="cg_dspy/environment")
        self._inner = None

    @property
    def inner(self) -> dspy.LM:
        if self._inner is None:
            self._inner = build_lm(LMSettings.from_env())
        return self._inner

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    async def acall(self, *args, **kwargs):
        return await self.inner.acall(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self.inner.forward(*args, **kwargs)

    @property
    def engine(self):
        return self.inner.engine

    @property
    def supported_params(self) -> set[str]:
        return self.inner.supported_params

    @property
    def supports_response_schema(self) -> bool:
        return self.inner.supports_response_schema

    def __getstate__(self) -> dict:
        return {}  # nothing of the logging process: no endpoint, no key

    def __setstate__(self, state: dict) -> None:
        self.__init__()
