"""The paper's rubric judge as an MLflow scorer, for `mlflow.genai.evaluate`.

    from cg_dspy import rubric_scorer
    mlflow.genai.evaluate(data=rows, predict_fn=answer, scorers=[rubric_scorer(judge_lm=lm)])

Each row's `expectations["rubrics"]` are judged against its `outputs` (the answer: a
string, a dict with "answer", or a DSPy prediction), K votes per requirement; the
scorer returns `task_solved` (every requirement satisfied) and `rubric_pass_rate`
(satisfied / all), each with one line per requirement in its rationale. MLflow
averages them into `task_solved/mean` (the task-solving rate as a fraction) and
`rubric_pass_rate/mean`, and its UI compares two evaluation runs task by task.
"""

from __future__ import annotations

from cg_dspy.judge.voting import DEFAULT_VOTES, PROTOCOLS, grade
from cg_dspy.tracking.assessments import PASS_RATE, RUBRICS, TASK_SOLVED

NAME = "cg_rubric_judge"


def answer_of(outputs) -> str:
    """The answer in what a predict function returned."""
    if isinstance(outputs, str):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("answer"), str):
        return outputs["answer"]
    if isinstance(getattr(outputs, "answer", None), str):
        return outputs.answer
    raise ValueError(f"outputs hold no answer (a string, or a dict or prediction with 'answer'): {str(outputs)[:200]}")


def row_name(inputs) -> str:
    """How an error names the row: its task id, else the start of its last message."""
    if isinstance(inputs, dict):
        if inputs.get("task_id"):
            return f"task {inputs['task_id']}"
        messages = inputs.get("conversation") or inputs.get("messages") or []
        if messages and isinstance(messages[-1], dict):
            return f"the row whose last message starts {str(messages[-1].get('content', ''))[:80]!r}"
    return f"the row with inputs {str(inputs)[:120]!r}"


def rubrics_of(inputs, expectations) -> list[str]:
    rubrics = (expectations or {}).get(RUBRICS) if isinstance(expectations, dict) else None
    if not isinstance(rubrics, list) or not rubrics or not all(isinstance(r, str) for r in rubrics):
        raise ValueError(f"{row_name(inputs)}: expectations['{RUBRICS}'] must be a non-empty list of requirement "
                         f"texts (found {str(rubrics)[:120]!r})")
    return rubrics


def rubric_scorer(*, judge_lm, votes: int = DEFAULT_VOTES, protocol: str = "rubric", early_stop: bool = True):
    """An MLflow scorer judging each row's rubrics with `judge_lm` (build it with
    `cg_dspy.judge.voting.judge_lm(settings)` for the paper's sampling temperature)."""
    from mlflow.entities import AssessmentSource, Feedback
    from mlflow.genai.scorers import scorer

    from cg_dspy.lms import lm_identity, patches

    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {PROTOCOLS}")
    if votes < 1 or votes % 2 == 0:
        raise ValueError(f"votes {votes}: an odd K of at least 1 (an even K can tie)")
    patches.install()
    source = AssessmentSource(source_type="LLM_JUDGE", source_id=str(lm_identity(judge_lm).get("model")))

    @scorer(name=NAME)
    def judged(inputs=None, outputs=None, expectations=None) -> list:
        import dspy

        rubrics = rubrics_of(inputs, expectations)
        # No callbacks while judging: evaluate turns DSPy's autolog on, which would make
        # each judge call a trace of its own beside the task's.
        with dspy.context(callbacks=[]):
            found = grade(answer_of(outputs), rubrics, judge_lm=judge_lm, protocol=protocol, votes=votes,
                          early_stop=early_stop)
        return [Feedback(name=TASK_SOLVED, value=found.solved, rationale=found.rationale, source=source),
                Feedback(name=PASS_RATE, value=round(found.pass_rate, 6), rationale=found.rationale,
                         source=source)]

    return judged
