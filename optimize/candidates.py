"""The programs an optimizer scored on the whole dev set, as it scores them.

Two sources report them: DSPy's `Evaluate` (random search over bootstrapped demos,
MIPROv2's full evaluations, our own dev scoring), through DSPy's callback hooks, and
GEPA's `on_valset_evaluated` event. What they give is kept as each program's state and
per-task scores, which serves three ends: a run stopped at its cap keeps the best
program found so far (not one never scored), the best dev score so far is shown while
it runs, and each candidate's score is a step of the MLflow run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from dspy.utils.callback import BaseCallback


@dataclass
class Candidate:
    """One program scored on the whole dev set: its state, per-task scores, who scored it."""

    index: int
    source: str
    state: dict
    scores: dict[str, float]  # task id -> the metric's score (the rubric pass fraction)

    @property
    def score(self) -> float:
        return sum(self.scores.values()) / len(self.scores) if self.scores else 0.0


@dataclass
class Candidates(BaseCallback):
    """Candidates scored on `dev_ids`; `on_candidate(candidate)` hears of each one."""

    base: object  # the untuned program (GEPA's candidates are its instructions on it)
    dev_ids: list[str]
    on_candidate: Callable[[Candidate], None] | None = None
    found: list[Candidate] = field(default_factory=list)
    _started: dict = field(default_factory=dict)
    _seen: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, source: str, state: dict, scores: dict[str, float]) -> None:
        if set(scores) != set(self.dev_ids):
            return  # a minibatch or another split: not comparable
        key = hashlib.sha256(json.dumps([state, scores], sort_keys=True, default=str).encode()).hexdigest()
        with self._lock:
            if key in self._seen:  # one evaluation reported by two sources (GEPA evaluates through DSPy)
                return
            self._seen.add(key)
            found = Candidate(len(self.found), source, state, scores)
            self.found.append(found)
        if self.on_candidate is not None:
            self.on_candidate(found)

    def best(self) -> Candidate | None:
        """The highest-scoring candidate (the earliest of equals), or None."""
        with self._lock:
            return max(self.found, key=lambda c: (c.score, -c.index)) if self.found else None

    # DSPy's Evaluate: the program is among the inputs when it starts, the results at its end.
    def on_evaluate_start(self, call_id, instance, inputs):
        program = inputs.get("program")
        if program is not None and hasattr(program, "dump_state"):
            self._started[call_id] = copy.deepcopy(program.dump_state())

    def on_evaluate_end(self, call_id, outputs, exception=None):
        state = self._started.pop(call_id, None)
        if state is None or exception is not None or outputs is None:
            return
        scores = {}
        for example, _prediction, score in getattr(outputs, "results", None) or []:
            scores[str(getattr(example, "task_id", ""))] = float(getattr(score, "score", score) or 0.0)
        self.record("evaluate", state, scores)

    # GEPA: a candidate (instructions per predictor) and its score per dev example.
    def gepa_callback(self, devset):
        tracker = self

        class OnValset:
            def on_valset_evaluated(self, event):
                if event["num_examples_evaluated"] != event["total_valset_size"]:
                    return
                state = copy.deepcopy(tracker.base.dump_state())
                for name, instructions in event["candidate"].items():
                    if name in state and isinstance(state[name], dict):
                        state[name]["signature"]["instructions"] = instructions
                scores = {str(devset[int(i)].task_id): float(s) for i, s in event["scores_by_val_id"].items()}
                tracker.record("gepa", state, scores)

        return OnValset()
