"""LMs and how a prompt reaches them.

`build` makes every LM (LiteLLM strings, `EndpointEngine` for OpenAI-compatible
servers, the embedded llama.cpp engine), `adapter` turns a stage into messages and a
reply back into fields, `replies` takes reasoning off replies and records how each
call ended, `patches` holds the project's few, checked changes to DSPy itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dspy

from cg_dspy.lms.adapter import ConversationAdapter
from cg_dspy.lms.build import DEFAULT_TIMEOUT, LMSettings, build_lm, lm_identity
from cg_dspy.lms.embedded import LOCAL_MODEL, find_local_gguf


@contextmanager
def using(lm) -> Iterator[None]:
    """DSPy calls in this block go to `lm` through the project's adapter."""
    with dspy.context(lm=lm, adapter=ConversationAdapter()):
        yield


__all__ = ["DEFAULT_TIMEOUT", "LOCAL_MODEL", "ConversationAdapter", "LMSettings", "build_lm", "find_local_gguf",
           "lm_identity", "using"]
