"""Every stage of ContextGuard as a dspy.Signature.

The docstring of each signature is the stage instruction (after the paper's Prompts
1-7); it is what an optimizer rewrites, and what a saved program stores. Every stage
that reads the task gets the whole `conversation`, which `ConversationAdapter` renders
as the leading, byte-identical part of the prompt. A stage with one `str` output is a
free-text stage: the model's reply is that output, with no JSON around it. The judge's
prompts (Prompt 8) are the judge's: cg_dspy/judge/signatures.py.
"""

from __future__ import annotations

import dspy

from cg_dspy.core.messages import Message
from cg_dspy.method.schemas import AuditItems, EditItems, SpecialistItems


def _list_output(desc: str):
    """A list output; a reply cut before it (max_tokens) leaves it empty, not unusable."""
    return dspy.OutputField(desc=desc, default_factory=list)


_CONVERSATION = "The task's whole conversation: system rules, context, earlier turns, final request."
_PREVIOUS = "The answer to check, produced earlier for the final request."


class Generate(dspy.Signature):
    """Plain generation: the task's messages are sent exactly as they are (CL-bench's own
    inference request) and the reply is the answer. Nothing of this signature reaches
    the prompt."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    answer: str = dspy.OutputField(desc="The answer to the final request.")


class ReminderDraft(dspy.Signature):
    """Before answering, re-read and follow all instructions in the system and context
    messages, including constraints, role and persona requirements, format
    requirements and task-specific rules. The final task request is repeated below.
    Now produce the answer to that final task: use only the provided context, satisfy
    every stated requirement, and reply with the answer itself."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    request: str = dspy.InputField(desc="The final task request, repeated as a reminder.")
    answer: str = dspy.OutputField(desc="The answer to the final request.")


class StructuredAudit(dspy.Signature):
    """You are auditing your previous answer to a context-learning task. Compare it
    carefully with the context, rules, constraints, data and the final request, and
    sort what you find into four lists. Be specific: name concrete constraints, values,
    steps or answer parts that can guide a revision, and quote exact numbers and labels.
    - confirmed_correct: constraints, reasoning steps or answer parts that are correct
      and must be preserved.
    - confirmed_data: facts, values, rules or evidence from the context that the answer
      uses correctly.
    - possibly_missed: constraints, facts, requirements, cases, exceptions or output
      elements that are missing or covered too thinly.
    - possibly_wrong: reasoning, calculations, rule applications, conclusions or answer
      parts that may be incorrect.
    Leave a list empty when nothing belongs in it."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc=_PREVIOUS)
    confirmed_correct: AuditItems = _list_output("Q_A: correct parts to preserve.")
    confirmed_data: AuditItems = _list_output("Q_B: context data used correctly.")
    possibly_missed: AuditItems = _list_output("Q_C: missing or thin coverage.")
    possibly_wrong: AuditItems = _list_output("Q_D: possibly incorrect parts.")


class FormatCheck(dspy.Signature):
    """You are a format compliance checker. Your only job is to check whether the
    previous answer follows the format, structure and presentation rules of the
    conversation. Extract every such rule: output structure (bullets, numbered lists,
    tables, sections, JSON, XML, schemas); required ordering or grouping; required
    labels, headings, field names or tags; typography and presentation; length,
    inclusion, exclusion and forbidden content. For each rule, state it and say how the
    answer satisfies it (format_ok) or violates it (format_fail)."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc=_PREVIOUS)
    format_ok: SpecialistItems = _list_output("Rule + how the answer satisfies it.")
    format_fail: SpecialistItems = _list_output("Rule + how the answer violates it.")


class ProcedureCheck(dspy.Signature):
    """You are a procedure compliance checker for a procedural task. Verify workflow
    correctness, not writing quality. Check the previous answer against every
    procedural requirement: the required step sequence; agent routing and hand-off
    rules; dependency handling; gate checks and thresholds; timing constraints;
    logging, reporting or evidence-recording duties; safety, refusal and escalation
    rules. For each, state it and say how the answer satisfies it (proc_ok) or
    violates it (proc_fail)."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc=_PREVIOUS)
    proc_ok: SpecialistItems = _list_output("Procedural requirement + how it is satisfied.")
    proc_fail: SpecialistItems = _list_output("Procedural requirement + how it is violated.")


class RulesCheck(dspy.Signature):
    """You are a rule-fidelity checker. The task depends on applying the provided
    rulebook or rule system faithfully. Check whether the previous answer applies the
    rules correctly, paying special attention to exact definitions and terminology,
    exceptions and boundary conditions, numerical or symbolic conditions, required
    decision procedures, invented rules the context does not support, and rules
    applied too strictly or too loosely. List correctly applied rules (rules_ok) and
    misapplied, omitted or invented ones (rules_fail)."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc=_PREVIOUS)
    rules_ok: SpecialistItems = _list_output("Rule or condition + how it is applied correctly.")
    rules_fail: SpecialistItems = _list_output("Rule + how it is misapplied, omitted or invented.")


class EmpiricalCheck(dspy.Signature):
    """You are an empirical consistency checker for a data, discovery or simulation
    task. Check whether the previous answer is grounded in the provided data,
    observations or simulation rules: numerical correctness, unit consistency,
    comparison completeness, trend interpretation, coverage of every requested
    condition, evidence for each empirical claim, and no over-generalisation. List
    verified computations and grounded claims (empirical_ok) and issues
    (empirical_issues), starting each issue with its type: numeric, comparison,
    coverage, unit, trend or evidence."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc=_PREVIOUS)
    empirical_ok: SpecialistItems = _list_output("Verified computation or grounded claim.")
    empirical_issues: SpecialistItems = _list_output("Issue type + the ungrounded or wrong claim.")


class ProtectedRevision(dspy.Signature):
    """Revise your previous answer using the audit feedback and specialist checks.
    The fix set lists items that may be missing, incorrect or violated. The protection
    set lists items confirmed correct or already satisfied: do not modify, delete,
    contradict or weaken them. Rules: 1. fix only the issues in the fix set; 2. keep
    all content in the protection set; 3. do not rewrite unrelated parts; 4. add no new
    facts, rules, entities or constraints unless the context directly supports them;
    5. keep the required output format and structure; 6. return only the revised
    final answer."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc="The draft to revise.")
    fix_set: str = dspy.InputField(desc="Tagged items to fix.")
    protect_set: str = dspy.InputField(desc="Tagged items to keep unchanged.")
    revised_answer: str = dspy.OutputField(desc="The complete revised final answer.")


class TargetedEdits(dspy.Signature):
    """Revise your previous answer by targeted edits only, using the audit feedback and
    specialist checks. The fix set lists numbered items that may be missing, incorrect
    or violated; the protection set lists items confirmed correct or already satisfied.
    Give the fewest edits that fix the fix-set items, each naming the item it fixes
    (fix_item). An edit is one of: replace (target: a short passage copied exactly from
    the previous answer, found there once; text: what replaces it), insert_after (target:
    an exact anchor from the previous answer; text: what to insert right after it), or
    append (text: what to add at the end). Rules: 1. never change or delete text the
    protection set names; 2. do not touch anything no fix-set item asks for; 3. add no
    new facts, rules, entities or constraints unless the context directly supports them;
    4. keep the required output format; 5. give no edit for an item that needs none."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc="The answer the edits apply to.")
    fix_set: str = dspy.InputField(desc="Numbered, tagged items to fix.")
    protect_set: str = dspy.InputField(desc="Tagged items to keep unchanged.")
    edits: EditItems = _list_output("The edits, in order: {fix_item, action, target, text}.")


class SelfFeedback(dspy.Signature):
    """Review your previous answer to the final request of the conversation and give
    concrete, actionable feedback on how to improve it."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc=_PREVIOUS)
    feedback: str = dspy.OutputField(desc="What to improve, point by point.")


class SelfRefineRevision(dspy.Signature):
    """Improve your previous answer to the final request using the feedback. Return
    only the improved final answer."""

    conversation: list[Message] = dspy.InputField(desc=_CONVERSATION)
    previous_answer: str = dspy.InputField(desc=_PREVIOUS)
    feedback: str = dspy.InputField(desc="Feedback on the previous answer.")
    revised_answer: str = dspy.OutputField(desc="The complete improved final answer.")
