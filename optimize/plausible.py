"""A plausible model: replies with the shape every stage asks for, at the cost a real
model's replies have. It stands in for the LM where nothing may be called: the
optimize estimate plays a run against it (`simulate`), and the test server serves it
(`cg_dspy.testing.server`), so a test can compare the estimate with what a run against
another plausible model (another `salt`) really sends.

What decides cost, and how it is played:

- every typed stage's list holds one finding, so every audit has something to fix and
  every task is revised (the costly path);
- every reply names a digest of its prompt, so a changed prompt (a new candidate's
  instruction or demos) gives a changed answer, which the judge must judge anew;
- the judge finds two requirements in three satisfied (about the rubric pass rate of
  real answers, so optimizers have failures to work on) and, on one requirement in
  ten, its votes disagree (the same prompt asked again alternates): K = 3 with early
  stop draws about 2.1 votes per requirement, as at the paper's 90% agreement.

Pure Python, no LM: it reads the prompt as the project's adapter writes it (the typed
stage's keys as `- "key": shape` lines) or as DSPy's JSON adapter does (the output
fields in backticks).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading

_KEY_LINE = re.compile(r'^- "(\w+)": (.*)$', re.MULTILINE)
_JSON_FIELDS = re.compile(r"`(\w+)`")


def default_reply(messages: list[dict]) -> str:
    """A valid answer for whichever stage asked: every requested key of a typed stage
    (a plain value each, lists empty), the answer itself for a free-text stage."""
    text = "\n".join(m.get("content") or "" for m in messages)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    answer = f"Answer {digest}: all requirements addressed."
    if "satisfaction_status" in text:
        return json.dumps({"reason": "The requirement is addressed.", "satisfaction_status": "yes"})
    keys = _KEY_LINE.findall(text.split("=====")[-1]) or [
        (f, "string") for f in _JSON_FIELDS.findall(messages[-1].get("content") or "")]
    if not keys:
        return answer
    return json.dumps({name: [] if shape.startswith("list of") else answer for name, shape in keys})


class PlausibleModel:
    """`model(messages) -> reply text`, deterministic for a prompt (and how often it came)."""

    def __init__(self, salt: str = ""):
        self.salt = salt  # another salt, another (equally plausible) model
        self.asked: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, messages: list[dict]) -> str:
        text = "\n".join(m.get("content") or "" for m in messages)
        digest = hashlib.sha256((self.salt + text).encode()).hexdigest()
        with self._lock:
            self.asked[digest] = nth = self.asked.get(digest, 0) + 1
        value = int(digest[:8], 16)
        if "satisfaction_status" in text:
            yes = nth % 2 == 1 if value % 10 == 0 else value % 3 != 0
            return json.dumps({"reason": f"Checked ({digest[:6]}).", "satisfaction_status": "yes" if yes else "no"})
        reply = default_reply(messages)
        try:
            fields = json.loads(reply)
        except ValueError:
            return f"Answer {digest[:8]}: all requirements addressed."
        if not isinstance(fields, dict):
            return reply
        return json.dumps({k: [f"Finding {digest[:8]} about {k}"] if v == [] else v for k, v in fields.items()})
