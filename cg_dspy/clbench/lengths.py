"""Input length as the paper measures it: tiktoken's cl100k_base over every message's
content (offline: the encoding ships inside litellm), and the five left-closed bins of
its length figures and tables."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

LENGTH_BINS = ("0-4K", "4-8K", "8-16K", "16-32K", "32K+")
_BIN_EDGES = (4_000, 8_000, 16_000, 32_000)


@lru_cache(maxsize=1)
def _encoding():
    # tiktoken's cl100k_base ships inside litellm; point tiktoken at it so nothing is fetched.
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        import importlib.util

        spec = importlib.util.find_spec("litellm")
        if spec and spec.origin:
            bundled = Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"
            if bundled.is_dir():
                os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)
    import tiktoken

    return tiktoken.get_encoding("cl100k_base")


def token_length(messages) -> int:
    """Tokens (tiktoken cl100k_base) over all message contents, as the paper measures."""
    return sum(_tokens(m["content"] if isinstance(m, dict) else m.content) for m in messages)


@lru_cache(maxsize=8192)
def _tokens(content: str) -> int:
    """One text's tokens, counted once: every report, figure and bench run reads the same
    CL-bench contexts (up to 200K characters) again."""
    return len(_encoding().encode(content, disallowed_special=()))


def length_bin(tokens: int) -> str:
    """Left-closed bins 0-4K, 4-8K, 8-16K, 16-32K, 32K+ (K = 1,000 tokens)."""
    for edge, name in zip(_BIN_EDGES, LENGTH_BINS):
        if tokens < edge:
            return name
    return LENGTH_BINS[-1]
