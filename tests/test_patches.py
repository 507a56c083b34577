"""Each DSPy patch returns what unpatched DSPy returns, and installs only when asked."""

import subprocess
import sys
from typing import Annotated

import pydantic
import pytest
from conftest import ROOT
from dspy.adapters import utils
from dspy.clients import capabilities, costs, model_metadata
from dspy.utils.exceptions import AdapterParseError

from cg_dspy.lms import ConversationAdapter, patches
from cg_dspy.method.schemas import AuditItem
from cg_dspy.method.signatures import StructuredAudit


def test_importing_the_package_patches_nothing_and_sets_no_environment():
    code = ("import os, dspy; before = dict(os.environ); t = dspy.adapters.utils.TypeAdapter; "
            "import cg_dspy, cg_dspy.clbench.generation, cg_dspy.reports.analysis; "
            "print(dspy.adapters.utils.TypeAdapter is t, dict(os.environ) == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["True", "True"]


def test_patches_are_written_for_this_dspy_and_install_once():
    import dspy

    assert patches.applies() and dspy.__version__.startswith(patches.WRITTEN_FOR)
    patches.install()
    adapter_fn, info_fn = utils.TypeAdapter, costs.model_info
    patches.install()
    assert utils.TypeAdapter is adapter_fn and costs.model_info is info_fn  # not wrapped twice
    assert adapter_fn.unpatched is pydantic.TypeAdapter and info_fn.unpatched is model_metadata.model_info
    assert capabilities.model_info is info_fn


def test_patches_do_nothing_on_a_dspy_they_were_not_written_for(monkeypatch):
    import dspy

    monkeypatch.setattr(dspy, "__version__", "3.5.0")
    assert not patches.applies()


def test_cached_type_adapters_validate_exactly_as_fresh_ones():
    patches.install()
    cached = utils.TypeAdapter
    assert cached(list[AuditItem]) is cached(list[AuditItem])
    values = [[{"text": "Step 2 is right", "issue_type": "Numeric"}], [{"text": "x", "issue_type": "vibes"}], []]
    for value in values:
        assert cached(list[AuditItem]).validate_python(value) == pydantic.TypeAdapter(list[AuditItem]).validate_python(
            value)
    unhashable = Annotated[int, {"unit": "C"}]
    assert cached(unhashable).validate_python("7") == 7 and cached(unhashable) is not cached(unhashable)
    strict = cached(int, config=pydantic.ConfigDict(strict=True))
    with pytest.raises(pydantic.ValidationError):
        strict.validate_python("7")  # the option reached pydantic: no cached lax adapter
    adapter = ConversationAdapter()
    audit = '{"confirmed_correct": [], "confirmed_data": [], "possibly_missed": [{"issue_type": "unit"}], ' \
            '"possibly_wrong": []}'
    with pytest.raises((AdapterParseError, pydantic.ValidationError)):
        adapter.parse(StructuredAudit, audit)  # an item without text is still refused


@pytest.mark.parametrize("provider, model", [("openai", "gpt-4o-mini"), ("hosted_vllm", "Qwen/Qwen3.5-4B"),
                                             ("openai", "no-such-model-anywhere")])
def test_memoized_model_metadata_answers_as_the_catalog_does_and_hands_out_copies(provider, model):
    patches.install()
    patched = costs.model_info
    assert patched(provider, model) == model_metadata.model_info(provider, model)
    first = patched(provider, model)
    if isinstance(first, dict):
        first["mutated"] = True
        assert "mutated" not in patched(provider, model)


def test_a_slow_example_is_sent_once_where_unpatched_dspy_sends_it_twice():
    """DSPy resubmits a straggler after `timeout` seconds; here the threshold is 0.3 s and
    one example takes 1.2 s, instead of the real 120 s and a reply that takes minutes."""
    import threading
    import time
    from collections import Counter

    from dspy.utils.parallelizer import ParallelExecutor

    def run(executor_init) -> Counter:
        sent, lock = Counter(), threading.Lock()

        def work(item):
            with lock:
                sent[item] += 1
            time.sleep(1.2 if item == "slow" else 0.01)
            return item

        executor = ParallelExecutor.__new__(ParallelExecutor)
        executor_init(executor, num_threads=2, timeout=0.3, straggler_limit=3, disable_progress_bar=True)
        assert executor.execute(work, ["fast", "slow"]) == ["fast", "slow"]  # the same results either way
        return sent

    patches.install()
    init = ParallelExecutor.__init__
    assert run(init.unpatched)["slow"] == 2  # DSPy's own behaviour: the slow example sent again
    assert run(init) == {"fast": 1, "slow": 1}  # patched: once
