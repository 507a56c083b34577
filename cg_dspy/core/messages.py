"""CL-bench's terms that every layer speaks: a chat message, and the context categories
the paper studies.

Categories are data, not a closed set: CL-bench has four, CLBench-life three others,
and a report groups by whatever its rows carry. `CATEGORIES` is CL-bench's four in the
paper's order (tables and figures list them first).
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
Category = Literal[
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
]
Role = Literal["system", "user", "assistant"]


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
