"""What a prefix-caching server (vLLM's automatic prefix caching, SGLang, llama.cpp)
prefills: a request pays only for what follows its longest common prefix with an earlier
prompt or generation. The test server accounts with it when asked (`prefix_cache=True`).
"""

from __future__ import annotations


def serialized(messages: list[dict]) -> str:
    """A chat template: the text a server prefills for `messages`, ending where the
    assistant's reply begins."""
    return "".join(f"<|{m.get('role')}|>\n{m.get('content') or ''}<|end|>\n" for m in messages) + "<|assistant|>\n"


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search on C-level slice compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    """Accounting like vLLM's automatic prefix caching: a request pays prefill only for
    what follows its longest common prefix with an earlier prompt or generation (a
    reply is cached as the continuation of its prompt). In characters of `serialized`."""

    def __init__(self) -> None:
        self.sequences: list[str] = []
        self.requests: list[dict] = []

    def prefill(self, prompt: str) -> int:
        """Characters of `prompt` already cached."""
        return max((common_prefix(prompt, seq) for seq in self.sequences), default=0)

    def record(self, prompt: str, reply: str) -> dict:
        cached = self.prefill(prompt)
        self.sequences.append(prompt + reply + "<|end|>\n")
        entry = {"prompt_chars": len(prompt), "uncached_chars": len(prompt) - cached, "completion_chars": len(reply)}
        self.requests.append(entry)
        return entry
