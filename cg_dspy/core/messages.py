"""CL-bench's terms that every layer speaks: a chat message, and the context categories
the paper studies.

Categories are data, not a closed set: CL-bench has four, CLBench-life three others,
and a report groups by whatever its rows carry. `CATEGORIES` is CL-bench's four in the
paper's order, `LIFE_CATEGORIES` CLBench-life's three; tables and figures list them in
that order, then any other category by name (`category_order`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

CATEGORIES: tuple[str, ...] = (
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
)
LIFE_CATEGORIES: tuple[str, ...] = (
    "Communication & Social Interactions",
    "Fragmented Information & Revisions",
    "Behavioral Records & Activity Trails",
)
Category = Literal[
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
]
Role = Literal["system", "user", "assistant"]
TASK_DELIMITER = "<|TASK|>"  # CLBench-life's single-turn rows: the context, this, then the task


def category_order(category: str) -> tuple[int, str]:
    """Sort key: CL-bench's four, CLBench-life's three, then the rest by name."""
    known = (*CATEGORIES, *LIFE_CATEGORIES)
    return (known.index(category), "") if category in known else (len(known), category)


class Message(BaseModel):
    """One chat turn, in the OpenAI format CL-bench uses."""

    model_config = ConfigDict(extra="forbid")
    role: Role
    content: str


def chat_reply(answer: str) -> dict:
    """An answer in the shape of an OpenAI chat completion: what a task's trace gives as
    its output, so MLflow's trace table shows the answer as the Response (and its chat
    view renders it), as the task's `messages` show as the Request."""
    return {"choices": [{"message": {"role": "assistant", "content": answer}}]}
