"""What one stage's LM calls cost: the one definition of the fields a cost entry holds.

A stage records its calls, the answers DSPy's cache served instead of a call, the tokens
the server reported (and the prompt tokens its prefix cache already held, so it did not
prefill them), the replies cut at max_tokens, and the reasoning that came with them. The
method fills these per stage; result rows carry them; reports and MLflow add them up.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, NonNegativeInt


class StageCost(BaseModel):
    """One stage's LM cost."""

    model_config = ConfigDict(extra="ignore")
    calls: NonNegativeInt = 0
    cached: NonNegativeInt = 0
    prompt_tokens: NonNegativeInt = 0
    cached_prompt_tokens: NonNegativeInt = 0
    completion_tokens: NonNegativeInt = 0
    truncated: NonNegativeInt = 0
    reasoning_chars: NonNegativeInt = 0
    reasoning_tokens: NonNegativeInt = 0


COST_KEYS: tuple[str, ...] = tuple(StageCost.model_fields)


def cost_totals(stage_costs: Iterable[dict]) -> dict[str, int]:
    """Every per-stage cost entry summed."""
    totals = dict.fromkeys(COST_KEYS, 0)
    for cost in stage_costs:
        for key in totals:
            totals[key] += cost.get(key, 0) or 0
    return totals
