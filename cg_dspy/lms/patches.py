"""Every change this project makes to DSPy's own code, in one place.

Two patches make a per-call cost of DSPy 3.4 a per-process one and return exactly what
the unpatched call returns; the third stops DSPy's parallel executor from sending a
request again while the first may still be generating (tests/test_patches.py checks
each against the original). They are installed explicitly by the project's entry
points, only for the DSPy versions they were written for; remove them once DSPy does
these itself.
"""

from __future__ import annotations

import copy
import functools
import threading

import dspy

WRITTEN_FOR = ("3.4.",)  # DSPy versions whose internals these patches match
_installed: set[str] = set()
_lock = threading.Lock()


def applies() -> bool:
    return dspy.__version__.startswith(WRITTEN_FOR)


def install() -> None:
    """Install every patch once per process (a no-op on other DSPy versions)."""
    patches = {"type_adapters": cache_type_adapters, "model_metadata": memoize_model_metadata,
               "stragglers": no_straggler_resubmission}
    if len(_installed) == len(patches) or not applies():
        return
    with _lock:
        for name, patch in patches.items():
            if name not in _installed:
                patch()
                _installed.add(name)


def cache_type_adapters() -> None:
    """Build each pydantic TypeAdapter DSPy's adapters use once per type, not per call.

    DSPy 3.4 constructs a TypeAdapter (a full pydantic schema build, ~70 us for a list
    of audit items) for every input it serializes and every output field it parses, on
    every call: about 0.5 ms of each ContextGuard call. A TypeAdapter is immutable and
    thread-safe, so one per type serves every call; unhashable types and adapters built
    with options are made as before. At most 1,024 types are kept.
    """
    from dspy.adapters import utils

    build = utils.TypeAdapter
    cached = functools.lru_cache(maxsize=1024)(build)

    def type_adapter(annotation, *args, **kwargs):
        if not args and not kwargs:
            try:
                return cached(annotation)
            except TypeError:  # unhashable annotation
                pass
        return build(annotation, *args, **kwargs)

    type_adapter.unpatched = build
    utils.TypeAdapter = type_adapter


def memoize_model_metadata() -> None:
    """Look up each model in DSPy's price/capability catalog once per process.

    DSPy 3.4 consults the catalog on every LM call (cost estimate, capabilities); for a
    model the catalog does not list, such as any local vLLM model name, each lookup
    scans the whole catalog, about half of DSPy's CPU time per call. The catalog is
    loaded once and never changes, so the answer for (provider, model) never changes
    either; callers get a private copy as before. At most 1,024 models are kept.
    """
    from dspy.clients import capabilities, costs, model_metadata

    original = model_metadata.model_info

    @functools.lru_cache(maxsize=1024)
    def lookup(provider, model, namespaces):
        return original(provider, model, namespaces=namespaces)

    def model_info(provider, model, *, namespaces=None):
        key = tuple(namespaces) if namespaces is not None else None
        return copy.deepcopy(lookup(provider, model, key))

    model_info.unpatched = original
    for module in (costs, capabilities):
        if getattr(module, "model_info", None) is original:
            module.model_info = model_info


def no_straggler_resubmission() -> None:
    """Never send an example again while its first run may still be generating.

    DSPy 3.4's ParallelExecutor (behind `dspy.Evaluate`, `dspy.Parallel` and every
    optimizer's evaluation) submits the last <= 3 unfinished examples a second time once
    they have run 120 s (`timeout`, `straggler_limit`). A thinking model on a long
    CL-bench context takes minutes per reply, so the tail of every evaluation would be
    paid twice, and a single-slot server would queue the copy behind the original.
    Results are unchanged (the first finished run of an example is what DSPy keeps);
    only the second submission goes.
    """
    from dspy.utils import parallelizer

    original = parallelizer.ParallelExecutor.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.timeout = 0  # its straggler check runs only when 0 < timeout

    init.unpatched = original
    parallelizer.ParallelExecutor.__init__ = init
