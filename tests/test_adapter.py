"""The adapters' per-type caches: same parses as DSPy's, built once."""

import json
import subprocess
import sys
import time
from typing import Annotated

import dspy
import pydantic
import pytest
from conftest import ROOT
from dspy.adapters import utils
from dspy.utils.exceptions import AdapterParseError

from cg_dspy.adapter import ConversationAdapter
from cg_dspy.lm import LMSettings, build_lm
from cg_dspy.schemas import AuditItem
from cg_dspy.signatures import StructuredAudit


def test_type_adapters_are_built_once_per_type_and_parse_as_before():
    adapter = ConversationAdapter()
    assert utils.TypeAdapter(list[AuditItem]) is utils.TypeAdapter(list[AuditItem])
    audit = {"confirmed_correct": [{"text": "Step 2 is right", "issue_type": "Numeric"}],
             "confirmed_data": [], "possibly_missed": [{"text": "the manager call"}], "possibly_wrong": []}
    for _ in range(2):  # the second parse runs on the cached validators
        out = adapter.parse(StructuredAudit, json.dumps(audit))
        assert out["confirmed_correct"] == [AuditItem(text="Step 2 is right", issue_type="numeric")]
        assert out["possibly_missed"][0].text == "the manager call" and out["possibly_wrong"] == []
    with pytest.raises((AdapterParseError, pydantic.ValidationError)):
        adapter.parse(StructuredAudit, json.dumps({**audit, "possibly_wrong": [{"issue_type": "unit"}]}))


def test_unhashable_types_and_options_still_get_their_own_adapter():
    ConversationAdapter()
    unhashable = Annotated[int, {"unit": "C"}]
    assert utils.TypeAdapter(unhashable).validate_python("7") == 7
    assert utils.TypeAdapter(unhashable) is not utils.TypeAdapter(unhashable)
    strict = utils.TypeAdapter(int, config=pydantic.ConfigDict(strict=True))
    with pytest.raises(pydantic.ValidationError):
        strict.validate_python("7")  # the option reached pydantic: no cached lax adapter


def test_benchmark_server_answers_each_stage_after_its_latency():
    proc = subprocess.Popen([sys.executable, "-m", "cg_dspy.testserver", "--fast", "--latency", "0.2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = proc.stdout.readline().strip()
        lm = build_lm(LMSettings(model="openai/bench-model", api_base=url, cache=False))
        with dspy.context(lm=lm, adapter=ConversationAdapter()):
            start = time.monotonic()
            out = dspy.Predict(StructuredAudit)(conversation=[{"role": "user", "content": "Check it."}],
                                                previous_answer="Step 1.", criteria="")
            waited = time.monotonic() - start
        assert waited >= 0.2
        assert out.possibly_wrong == [] and out.confirmed_correct == []
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert proc.returncode == 0
