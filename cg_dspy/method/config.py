"""A program's configuration, written once: which method, which ablations, how many
rounds, the guard's threshold, the category policy, the layout. A program dumps it into
its saved state (the `cg_dspy` block), a loader checks it (`load`, one message per bad
field), and it builds a fresh, untuned program again (`build`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dspy

from cg_dspy.method import specialists
from cg_dspy.method.baselines import Baseline, SelfRefine
from cg_dspy.method.guard import MIN_LENGTH_RATIO
from cg_dspy.method.program import ABLATIONS, DEFAULT_LAYOUT, LAYOUTS, MAX_ROUNDS, REVISION_MODES, ContextGuard

METHODS = ("baseline", "self-refine", "contextguard")
KEYS = ("method", "ablate", "max_rounds", "min_length_ratio", "policy", "layout", "revision_mode")


class ProgramRefused(ValueError):
    """A saved program holds something a program must not hold, or is malformed."""


def method_names() -> list[str]:
    """Every method `bench` knows: the three methods, ContextGuard with edit-mode revision,
    and each single ablation."""
    return [*METHODS, "contextguard-edit", *(f"contextguard-no-{a}" for a in ABLATIONS)]


@dataclass(frozen=True)
class ProgramConfig:
    """What rebuilds a program before its saved instructions and demos are applied."""

    method: str = "contextguard"
    ablate: tuple[str, ...] = ()
    max_rounds: int = 1
    min_length_ratio: float = MIN_LENGTH_RATIO
    policy: specialists.Policy | None = field(default=None, hash=False)
    layout: str = DEFAULT_LAYOUT
    revision_mode: str = "rewrite"

    def dump(self) -> dict:
        """The saved `cg_dspy` block (each method keeps what it has)."""
        if self.method == "baseline":
            return {"method": "baseline"}
        if self.method == "self-refine":
            return {"method": "self-refine", "layout": self.layout}
        policy = specialists.dump_policy(self.policy) if self.policy is not None else None
        block = {"method": self.method, "ablate": list(self.ablate), "max_rounds": self.max_rounds,
                 "min_length_ratio": self.min_length_ratio, "policy": policy, "layout": self.layout}
        # Said only for edit mode: files and programs written before it stay the same settings.
        return {**block, "revision_mode": "edit"} if self.revision_mode == "edit" else block

    def build(self) -> dspy.Module:
        """A fresh, untuned program."""
        return build_program(self.method, self.ablate, self.max_rounds, layout=self.layout,
                             min_length_ratio=self.min_length_ratio, policy=self.policy,
                             revision_mode=self.revision_mode)

    @classmethod
    def load(cls, block: object, source: str) -> ProgramConfig:
        """A saved `cg_dspy` block, checked field by field (ProgramRefused names the field)."""
        where = f"{source}: cg_dspy"
        if block is None:
            return cls()
        if not isinstance(block, dict):
            raise ProgramRefused(f"{where}: must be an object, not {type(block).__name__}")
        unknown = sorted(set(block) - set(KEYS))
        if unknown:
            raise ProgramRefused(f"{where}: unknown key(s) {unknown}; a program block holds {list(KEYS)}")
        method = block.get("method", "contextguard")
        if method not in METHODS:
            raise ProgramRefused(f"{where}.method: {method!r} is not one of {list(METHODS)}")
        ablate = block.get("ablate") or []
        if not isinstance(ablate, list) or any(a not in ABLATIONS for a in ablate):
            raise ProgramRefused(f"{where}.ablate: {ablate!r}; each must be one of {list(ABLATIONS)}")
        rounds = block.get("max_rounds", 1)
        if not isinstance(rounds, int) or isinstance(rounds, bool) or not 1 <= rounds <= MAX_ROUNDS:
            raise ProgramRefused(f"{where}.max_rounds: {rounds!r}; must be a whole number from 1 to {MAX_ROUNDS}")
        ratio = block.get("min_length_ratio", MIN_LENGTH_RATIO)
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0.0 <= ratio <= 1.0:
            raise ProgramRefused(f"{where}.min_length_ratio: {ratio!r}; must be a number from 0 to 1")
        layout = block.get("layout", "inline")  # programs saved before layouts were tuned inline
        if layout not in LAYOUTS:
            raise ProgramRefused(f"{where}.layout: {layout!r} is not one of {list(LAYOUTS)}")
        mode = block.get("revision_mode", "rewrite")
        if mode not in REVISION_MODES:
            raise ProgramRefused(f"{where}.revision_mode: {mode!r} is not one of {list(REVISION_MODES)}")
        return cls(method, tuple(ablate), rounds, float(ratio), _policy(block.get("policy"), where), layout, mode)


def _policy(policy: object, where: str) -> specialists.Policy | None:
    if policy is None:
        return None
    try:
        return specialists.parse_policy(policy, f"{where}.policy")
    except ValueError as exc:
        raise ProgramRefused(str(exc)) from None


def build_program(method: str, ablate: tuple[str, ...] | list[str] = (), max_rounds: int = 1,
                  layout: str = "chat", **options) -> dspy.Module:
    """The module for a method name; `contextguard-no-X` is ContextGuard with X ablated,
    `contextguard-edit` ContextGuard with edit-mode revision. `options`
    (min_length_ratio, policy, revision_mode) go to ContextGuard."""
    if options.get("revision_mode") not in (None, "rewrite") and not method.startswith("contextguard"):
        raise ValueError(f"revision mode {options['revision_mode']!r}: only ContextGuard's revision has modes, "
                         f"not {method}'s")
    if method == "baseline":
        return Baseline()
    if method == "self-refine":
        return SelfRefine(layout=layout)
    if method == "contextguard-edit":
        method, options = "contextguard", {**options, "revision_mode": "edit"}
    if method == "contextguard" or method.startswith("contextguard-no-"):
        removed = () if method == "contextguard" else (method.removeprefix("contextguard-no-"),)
        options = {k: v for k, v in options.items() if v is not None}
        return ContextGuard(ablate=(*ablate, *removed), max_rounds=max_rounds, layout=layout, **options)
    raise ValueError(f"unknown method {method!r}; choose from {method_names()}")
