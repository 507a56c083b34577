"""The package's shape: the method imports no evaluation, reports or tracking; one record
per specialist kind drives everything; Algorithm 1's path; the public surface."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import dspy
import pytest
from conftest import ROOT
from scripted import scripted_lm

from cg_dspy.lms import using
from cg_dspy.method import ContextGuard, specialists
from cg_dspy.method.specialists import SPECIALISTS, Specialist, SpecialistPolicy

PACKAGE = ROOT / "cg_dspy"


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


# A module imports only from its own layer or those before it (testing, the test server,
# sits outside: nothing in the product imports it). `evaluation` only keeps old paths.
LAYERS = ("core", "lms", "method", "judge", "clbench", "reports", "tracking", "saved", "optimize", "workflows", "cli",
          "evaluation")


def layer(module: str) -> str | None:
    """The layer of an imported name: `cg_dspy.X...` and `from cg_dspy import X` alike."""
    parts = module.split(".")
    if parts[0] != "cg_dspy" or len(parts) == 1:
        return None
    return parts[1]


def layer_of_file(path: Path) -> str:
    relative = path.relative_to(ROOT)
    if relative.parts[0] == "optimize":
        return "optimize"
    return relative.parts[1].removesuffix(".py")


def upward(own: str, names: set[str]) -> list[str]:
    """The imported names from a layer above `own`."""
    return sorted(n for n in names if (found := layer(n)) in LAYERS and LAYERS.index(found) > LAYERS.index(own))


def test_every_module_imports_only_from_its_layer_or_those_below():
    assert set(LAYERS) | {"testing", "__init__"} == {layer_of_file(p) for p in PACKAGE.rglob("*.py")} | {"optimize"}
    found = {str(path.relative_to(ROOT)): upward(layer_of_file(path), imports_of(path))
             for path in [*PACKAGE.rglob("*.py"), *(ROOT / "optimize").glob("*.py")]
             if layer_of_file(path) not in ("testing", "__init__")}
    assert {k: v for k, v in found.items() if v} == {}
    # and the check sees an upward import, whichever way it is written
    assert upward("method", {"cg_dspy.tracking.runs", "cg_dspy.core.messages"}) == ["cg_dspy.tracking.runs"]
    assert upward("judge", {"cg_dspy.reports", "cg_dspy.lms"}) == ["cg_dspy.reports"]


def test_the_method_never_imports_evaluation_reports_tracking_or_the_test_server():
    forbidden = ("cg_dspy.clbench", "cg_dspy.judge", "cg_dspy.evaluation", "cg_dspy.reports", "cg_dspy.tracking",
                 "cg_dspy.testing", "cg_dspy.optimize", "cg_dspy.saved", "cg_dspy.cli", "cg_dspy.workflows", "mlflow")
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in imports_of(p) if i.startswith(forbidden))
                 for p in (PACKAGE / "method").glob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}
    product = [p for p in PACKAGE.rglob("*.py") if "testing" not in p.parts] + list((ROOT / "optimize").glob("*.py"))
    assert [str(p) for p in product if any(i.startswith("cg_dspy.testing") for i in imports_of(p))] == []


def test_pyproject_installs_every_package_and_no_module_is_long():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")} | {"cg_dspy.optimize"}
    assert listed == found
    long = {str(p.relative_to(ROOT)): n for p in [*PACKAGE.rglob("*.py"), *(ROOT / "optimize").glob("*.py")]
            if (n := len(p.read_text().splitlines())) > 360}  # "about 350"
    assert long == {}


def test_old_import_paths_still_work():
    code = ("import cg_dspy.evaluation.data as d, cg_dspy.clbench.data as c; "
            "from cg_dspy.evaluation.judge import grade_file; from cg_dspy.evaluation.harness import run; "
            "from cg_dspy.evaluation.rubric_types import LMTyper; from cg_dspy.saved import load_program; "
            "import cg_dspy.clbench.grading as g, cg_dspy.clbench.generation as h; "
            "print(d is c, grade_file is g.grade_file, run is h.run, LMTyper.__module__, load_program.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "cg_dspy.judge.typer", "cg_dspy.saved"]


def test_load_program_and_the_modules_are_at_the_package_top_and_no_generic_optimize_is_installed(tmp_path):
    code = ("import importlib.util, cg_dspy; from cg_dspy import load_program, ContextGuard, Baseline, SelfRefine; "
            "from cg_dspy import optimize; print(importlib.util.find_spec('optimize') is None, "
            "callable(load_program), optimize.optimize.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.split() == ["True", "True", "cg_dspy.optimize.compile"]


def test_the_readme_layout_table_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    paths = [cell.strip().strip("`") for line in table.splitlines() if line.startswith("| `")
             for cell in line.split("|")[1].split(",")]
    assert paths and all((ROOT / p.rstrip("/")).exists() for p in paths), [p for p in paths if not (ROOT / p).exists()]
    folders = {p.rstrip("/") for p in paths}
    for package in [p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]:
        assert str(package.relative_to(ROOT)) in folders, package.name


class CitationCheck(dspy.Signature):
    """Check every citation of the previous answer against the context."""

    conversation: list = dspy.InputField()
    previous_answer: str = dspy.InputField()
    cites_ok: list[str] = dspy.OutputField(default_factory=list)
    cites_bad: list[str] = dspy.OutputField(default_factory=list)


def test_one_specialist_record_drives_predictors_tags_fields_policy_and_saved_programs(tasks, monkeypatch, tmp_path):
    record = Specialist("citation", CitationCheck, "cites_ok", "cites_bad", "CITE-OK", "CITE-FAIL",
                        "Also check every citation.", "Domain Knowledge Reasoning", "separate")
    monkeypatch.setitem(SPECIALISTS, "citation", record)
    monkeypatch.setattr(specialists, "KINDS", tuple(SPECIALISTS))
    policy = {"Domain Knowledge Reasoning": SpecialistPolicy("citation", "separate")}
    program = ContextGuard(policy=policy)
    names = dict(program.named_predictors())
    assert {"citation_check", "audit_citation"} <= set(names)
    assert names["audit_citation"].signature.instructions.endswith("Also check every citation.")
    replies = {"draft": "Ada won [1].", "audit": {"confirmed_correct": [], "confirmed_data": [],
                                                  "possibly_missed": [], "possibly_wrong": []},
               "revise": "Ada won [2]."}

    def reply(stage, messages):
        if '- "cites_ok"' in messages[-1]["content"]:
            return {"cites_ok": ["[1] is in the context"], "cites_bad": ["[1] names the wrong page"]}
        return replies[stage]

    lm, engine = scripted_lm(reply)
    task = tasks["dk-01"]
    with using(lm):
        pred = program(conversation=task.messages, category=task.category)
    assert [i.tag for i in pred.fix_set] == ["CITE-FAIL"] and [i.tag for i in pred.protect_set] == ["CITE-OK"]
    assert "- [CITE-FAIL] [1] names the wrong page" in engine.calls[-1].messages[-1]["content"]
    program.save(str(tmp_path / "p.json"))
    from cg_dspy.saved import load_program

    loaded = load_program(tmp_path / "p.json")
    assert loaded.policy == policy and "citation_check" in dict(loaded.named_predictors())


def test_a_program_saved_before_the_criteria_moved_into_instructions_still_loads(tmp_path):
    from cg_dspy.saved import load_program

    state = ContextGuard().dump_state()
    fields = state["audit"]["signature"]["fields"]
    state["audit"]["signature"]["fields"] = fields[:2] + [{"prefix": "Criteria:", "description": "old"}] + fields[2:]
    state["audit"]["signature"]["instructions"] = "An old audit instruction."
    path = tmp_path / "old.json"
    path.write_text(json.dumps(state))
    loaded = load_program(path)
    assert loaded.audit.signature.instructions == "An old audit instruction."
    assert list(loaded.audit.signature.input_fields) == ["conversation", "previous_answer"]


@pytest.fixture
def proc_task(tasks):
    return tasks["pt-02"]


def test_a_later_round_that_fails_keeps_the_earlier_accepted_revision_and_says_revised(proc_task):
    draft = "- Step 1: oven 0 C\n- Step 2: oven to 220 C\n- Step 3: fridge 7 C logged\n- Step 4: door unlocked"
    revised = draft.replace("door unlocked", "fridge above 5 C: stop and call the manager")
    audits = iter([{"confirmed_correct": [], "confirmed_data": [], "possibly_missed": [],
                    "possibly_wrong": [{"text": "unlocking the door", "issue_type": None}]},
                   "not json", "still not json"])

    def reply(stage, messages):
        return {"draft": draft, "revise": revised, "audit": None, "procedure": {"proc_ok": [], "proc_fail": []}
                }[stage] or next(audits)

    lm, engine = scripted_lm(reply)
    with using(lm):
        pred = ContextGuard(max_rounds=2)(conversation=proc_task.messages, category=proc_task.category)
    assert engine.stages() == ["draft", "audit", "procedure", "revise", "audit", "audit"]
    assert pred.answer == revised and pred.path == "revised"
    assert [r.outcome for r in pred.rounds] == ["revised", "stage-failed"]
