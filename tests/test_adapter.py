"""The benchmark server and the adapter's parses."""

import subprocess
import sys
import time

import dspy
from conftest import ROOT

from cg_dspy.lms import LMSettings, build_lm, using
from cg_dspy.method.signatures import StructuredAudit


def test_benchmark_server_answers_each_stage_after_its_latency():
    proc = subprocess.Popen([sys.executable, "-m", "cg_dspy.testing.server", "--fast", "--latency", "0.2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = proc.stdout.readline().strip()
        lm = build_lm(LMSettings(model="openai/bench-model", api_base=url, cache=False))
        with using(lm):
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
