"""Judge calls with early-stopped majority voting versus always drawing K votes.

Each requirement gets a fixed, seeded sequence of K votes, each equal to the
requirement's true label with probability `agreement`. Both modes read the same
sequences through a real `RubricJudge` and a scripted engine, so labels must be
identical and only the call counts differ. Target: early stop uses at most 0.75 of
the full-K calls for K = 3 at 90% agreement.

    python benchmarks/judge_votes.py
"""

from __future__ import annotations

import random
import sys

from _common import ROOT, finish

sys.path.insert(0, str(ROOT / "tests"))
import dspy  # noqa: E402
from scripted import scripted_lm  # noqa: E402

from cg_dspy.judge.voting import RubricJudge  # noqa: E402

REQUIREMENTS = 600


def sequences(k: int, agreement: float, seed: int = 7) -> dict[str, list[str]]:
    rng = random.Random(seed)
    out = {}
    for i in range(REQUIREMENTS):
        truth = rng.choice(["yes", "no"])
        out[f"REQ-{i:04d}"] = [truth if rng.random() < agreement else {"yes": "no", "no": "yes"}[truth]
                               for _ in range(k)]
    return out


def judge_all(seqs: dict[str, list[str]], k: int, early_stop: bool) -> tuple[list[str], int]:
    position: dict[str, int] = {}

    def reply(stage, messages):
        req = messages[-1]["content"].split("[[ ## requirement ## ]]")[1].strip().split()[0]
        i = position.get(req, 0)
        position[req] = i + 1
        return {"reason": "scripted", "satisfaction_status": seqs[req][i]}

    lm, engine = scripted_lm(reply, temperature=0.7)
    judge = RubricJudge(votes=k, early_stop=early_stop)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        labels = [judge(response="an answer", requirement=req).status for req in seqs]
    return labels, len(engine.calls)


def main() -> dict:
    results, rows = {}, []
    for k in (3, 5):
        for agreement in (0.9, 0.75):
            seqs = sequences(k, agreement)
            full_labels, full_calls = judge_all(seqs, k, early_stop=False)
            early_labels, early_calls = judge_all(seqs, k, early_stop=True)
            key = f"K={k},agreement={agreement}"
            results[key] = {"full_calls": full_calls, "early_stop_calls": early_calls,
                            "ratio": early_calls / full_calls, "labels_identical": full_labels == early_labels}
            rows.append([key, full_calls, early_calls, early_calls / full_calls, full_labels == early_labels])
    target = results["K=3,agreement=0.9"]
    ok = target["ratio"] <= 0.75 and all(r["labels_identical"] for r in results.values())
    return finish("judge_votes", ["setting", "full-K calls", "early-stop calls", "ratio", "labels identical"], rows,
                  {"early_stop_k3_le_0.75": ok}, {"requirements": REQUIREMENTS, "settings": results})

if __name__ == "__main__":
    main()
