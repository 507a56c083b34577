"""The paper's Table 14 rebuilt as graded rows: 1,899 tasks whose baseline -> ContextGuard
near-miss migration is exactly the paper's matrix (so the near-miss columns equal Table 13's
baseline and ContextGuard rows), spread over CL-bench's 18 sub-categories and five length
bins. Requirement texts rotate over the five requirement types."""

from __future__ import annotations

from cg_dspy.reports.analysis import NEAR_MISS_BINS

# Rows: baseline bin; columns: ContextGuard bin (paper, Table 14).
TABLE_14 = {
    "0": (123, 26, 30, 4, 0),
    "1": (68, 77, 86, 12, 0),
    "2-3": (59, 85, 301, 121, 1),
    "4-8": (10, 17, 160, 472, 41),
    ">8": (3, 0, 7, 57, 139),
}
SUB_CATEGORIES = {
    "Domain Knowledge Reasoning": ("Finance", "Healthcare", "Humanities", "Legal Advisory", "Lifestyle",
                                   "Management", "Science"),
    "Rule System Application": ("Game Mechanics", "Legal & Regulatory", "Mathematical Formalism",
                                "Programming Syntax", "Technical Standards"),
    "Procedural Task Execution": ("Instructional Procedures", "Operational Procedures", "Workflow Orchestration"),
    "Empirical Discovery & Simulation": ("Experimental Data", "Observational Data", "Simulation Environment"),
}
RUBRICS = 12
FAILED = {"0": (0,), "1": (1,), "2-3": (2, 3), "4-8": (4, 5, 6, 8), ">8": (9, 11)}
TEMPLATES = (
    "The response should be formatted as a numbered list of {i} items.",
    "The response should follow the workflow step {i} before handing off to the next agent.",
    "The response should compute the total of item {i} correctly.",
    "The response should apply rule {i} only if its condition holds.",
    "The response should keep a friendly tone for the audience of item {i}.",
)
LENGTH_TOKENS = ((0.30, 500), (0.25, 5000), (0.25, 9000), (0.15, 17000), (0.05, 33000))


def _length(i: int, n: int) -> int:
    share = (i * 7919 % n) / n  # a fixed shuffle of the tasks over the bins
    for p, tokens in LENGTH_TOKENS:
        if share < p:
            return tokens
        share -= p
    return LENGTH_TOKENS[-1][1]


def _row(idx: str, sub: tuple[str, str], failed: int, tokens: int, method: str, salt: int) -> dict:
    status = ["yes"] * RUBRICS
    for k in range(failed):
        status[(k + salt) % RUBRICS] = "no"
    return {"idx": idx, "messages": [{"role": "user", "content": " the" * tokens}],
            "model_output": f"answer {idx}", "method": method,
            "rubrics": [TEMPLATES[(j + salt) % len(TEMPLATES)].format(i=j) for j in range(RUBRICS)],
            "metadata": {"task_id": idx, "context_id": f"c-{idx}", "context_category": sub[0],
                         "sub_category": sub[1]},
            "requirement_status": status, "score": int(failed == 0)}


def table14_rows() -> tuple[list[dict], list[dict]]:
    """(baseline rows, contextguard rows), paired by task id."""
    subs = [(cat, s) for cat, names in SUB_CATEGORIES.items() for s in names]
    pairs = [(b, a) for b, row in TABLE_14.items() for a, count in zip(NEAR_MISS_BINS, row) for _ in range(count)]
    before, after = [], []
    for i, (b, a) in enumerate(pairs):
        idx, sub, tokens = f"t{i:04d}", subs[i * 5 % len(subs)], _length(i, len(pairs))
        before.append(_row(idx, sub, FAILED[b][i % len(FAILED[b])], tokens, "baseline", i))
        after.append(_row(idx, sub, FAILED[a][(i // 3) % len(FAILED[a])], tokens, "contextguard", i))
    return before, after
