"""The estimate of what an optimize run will call, before it calls anything: the whole run
(dev scoring, the optimizer, the held-out test) played in this process against a
plausible model (`plausible.PlausibleModel`), no request sent, no file written, nothing
logged.

Why a simulation and not a formula: what an optimizer calls depends on its own control
flow (MIPROv2's trials, GEPA's budget and acceptance, a bootstrap's early success), on
which stages a candidate changes, on DSPy's cache (a stage whose prompt a candidate
leaves alone is answered from the cache) and on the metric's memo (an answer judged
once is not judged again). Playing the run replays all of that exactly: against the
same model, the estimate equals the calls (tested). A real model differs from the
plausible one (it returns early on some tasks; its scores steer an adaptive search
elsewhere), which is why the estimate is an estimate, and the run prints its actual
counts beside it. The estimate is for a fresh run: a rerun served by DSPy's cache pays
less.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import Counter

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage

from cg_dspy.lms.embedded import request_messages
from cg_dspy.optimize.plausible import PlausibleModel


class SimulatedEngine:
    """A DSPy engine answering as the plausible model, counting each prompt's tokens."""

    supports_response_schema = True
    supported_params = frozenset({"temperature", "max_tokens", "response_format", "seed", "top_p", "stop"})

    def __init__(self, role: str, model: PlausibleModel, tokens: Counter, count):
        self.role, self.model, self.tokens, self.count = role, model, tokens, count

    def complete(self, request):
        messages = request_messages(request)
        self.tokens[self.role] += sum(self.count(m["content"]) for m in messages)
        reply = self.model(messages)
        return Response(id=None, model=f"simulated/{self.role}", message=Message.assistant([TextPart(reply)]),
                        finish_reason="stop", usage=Usage(input_tokens=0, output_tokens=len(reply) // 4))

    def stream(self, request):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def describe(self) -> dict:
        return {"engine": "simulated", "role": self.role}

    def close(self) -> None:
        pass


@contextlib.contextmanager
def private_cache():
    """DSPy's cache for this block: in memory only, empty, and gone afterwards, so nothing
    simulated is ever served to (or written for) a real run."""
    from dspy.clients.cache import Cache

    previous = dspy.cache  # built on first use, under the lock, so read before taking it
    with dspy._cache_lock:
        dspy.cache = Cache(enable_disk_cache=False, enable_memory_cache=True, disk_cache_dir="",
                           disk_size_limit_bytes=0, memory_max_entries=1_000_000)
    try:
        yield
    finally:
        with dspy._cache_lock:
            dspy.cache = previous


def simulated_lm(role: str, like, model: PlausibleModel, tokens: Counter, count) -> dspy.LM:
    """A simulated LM for `role`, sampled and cached as `like` (the real LM) is."""
    kwargs = dict(getattr(like, "kwargs", {}) or {})
    return dspy.LM(f"simulated/{role}", engine=SimulatedEngine(role, model, tokens, count),
                   cache=getattr(like, "cache", True), num_retries=0, temperature=kwargs.get("temperature", 0.0),
                   max_tokens=kwargs.get("max_tokens") or kwargs.get("max_completion_tokens"))


def token_counter():
    """Tokens of a message (cl100k_base), each distinct text counted once."""
    from cg_dspy.clbench.lengths import token_length

    known: dict[str, int] = {}
    lock = threading.Lock()

    def count(text: str) -> int:
        key = hashlib.sha1(text.encode()).hexdigest()
        with lock:
            if key in known:
                return known[key]
        n = token_length([{"content": text}])
        with lock:
            known[key] = n
        return n

    return count


ASSUMPTIONS = ("every audit and checker finds something to fix, so every task is revised",
               "a changed prompt gives a changed answer, so every new candidate is judged anew",
               "the judge finds 2 in 3 requirements satisfied and its votes agree on 90% of them (about 2.1 "
               "votes each at K = 3)",
               "a fresh run: nothing is in DSPy's cache yet")


ADAPTIVE = ("mipro",)  # searches whose path follows the scores they see: estimated over several models
SAMPLES = 3


def estimate(*, task_lm, judge_lm, reflection_lm=None, **options) -> dict:
    """The calls (per role) and prompt tokens an `optimize(**options)` run would make, from
    playing it against a plausible model sampled and cached as the given LMs are: no
    request is sent, nothing is written or logged. An adaptive search (MIPROv2, whose
    trials follow the scores it sees) is played against three plausible models, and the
    estimate is their mean, with the range."""
    samples = SAMPLES if options.get("optimizer") in ADAPTIVE else 1
    runs = [_play(str(i) if i else "", task_lm, judge_lm, reflection_lm, options) for i in range(samples)]
    calls = {role: round(sum(r["calls"][role] for r in runs) / samples) for role in runs[0]["calls"]}
    tokens = {role: round(sum(r["prompt_tokens"].get(role, 0) for r in runs) / samples)
              for role in runs[0]["prompt_tokens"]}
    out = {"calls": calls, "prompt_tokens": tokens, "assumptions": list(ASSUMPTIONS)}
    if samples > 1:
        totals = [r["calls"]["total"] for r in runs]
        out["range"] = [min(totals), max(totals)]
        out["assumptions"].append(f"{options['optimizer']}'s search follows the scores it sees: the mean of "
                                  f"{samples} plausible models, whose totals span the range")
    return out


def _play(salt: str, task_lm, judge_lm, reflection_lm, options: dict) -> dict:
    from cg_dspy.optimize.compile import optimize

    tokens, count, model = Counter(), token_counter(), PlausibleModel(salt)
    like = {"task": task_lm, "judge": judge_lm, "reflection": reflection_lm or task_lm}
    sims = {role: simulated_lm(role, lm, model, tokens, count) for role, lm in like.items()}
    options = {**options, "out": None, "max_calls": None, "progress": False, "estimate": None}
    with private_cache():
        result = optimize(task_lm=sims["task"], judge_lm=sims["judge"], reflection_lm=sims["reflection"], **options)
    return {"calls": result.calls, "prompt_tokens": {**dict(tokens), "total": sum(tokens.values())}}
