"""Saved programs: JSON state, read as data and applied to a freshly built program.

`save_program(program, "p.json")` (or DSPy's own `program.save`) writes every
predictor's instruction and demos plus a `cg_dspy` block that says how to rebuild the
program (method, ablations, rounds); `save_program` writes it as every output of the
project is written (`core.files`: no link followed, no foreign file replaced).

Shared compiled programs are files and MLflow artifacts from other people, so loading
takes only what a program is: per predictor its instruction, its fields'
prefixes and descriptions, and its demos (typed, bounded), plus the validated
`cg_dspy` block. Anything else (an `lm`, a `config`, traces, an unknown key) is
refused with a message naming it; `lenient=True` drops such keys with a warning
instead. Nothing in a file can choose where calls go, which model answers, the cache
or the key: DSPy's `load_state` is never called.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import dspy

from cg_dspy.core import files
from cg_dspy.method.config import ProgramConfig, ProgramRefused

MAX_DEMOS = 32
MAX_DEMO_CHARS = 2_000_000
MAX_INSTRUCTION_CHARS = 50_000
# DSPy writes these with every predictor; empty they are harmless, anything else is refused.
_EMPTY_AS_SAVED = {"traces": [], "train": [], "lm": None, "fields": {}, "config": {}}


PROGRAM = files.json_kind("a saved program", lambda v: isinstance(v, dict) and isinstance(v.get("cg_dspy"), dict),
                          marker=b'"cg_dspy": {')


def check_output(path: str | Path, *, force: bool = False, inputs=()) -> Path:
    """Refuse, before any work, a program file that is a link, one of the run's inputs, or
    a file that is not a saved program."""
    path = Path(path)
    if path.suffix != ".json":
        raise files.OutputRefused(f"{path}: a saved program is a .json file")
    return files.check(path, PROGRAM, force=force, inputs=inputs)


def save_program(program: dspy.Module, path: str | Path, *, force: bool = False, inputs=()) -> Path:
    """The program's JSON state, its `cg_dspy` block first (how a file of ours is known)."""
    from dspy.utils.saving import get_dependency_versions

    state = program.dump_state()
    body = {"cg_dspy": state.pop("cg_dspy", None), **state, "metadata": {
        "dependency_versions": get_dependency_versions()}}
    data = (json.dumps(body, indent=2, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    return files.write(check_output(path, force=force, inputs=inputs), data, PROGRAM, force=force, inputs=inputs)


def _refuse(message: str, lenient: bool) -> None:
    if not lenient:
        raise ProgramRefused(message + " (load it with lenient=True / --lenient-program to drop such keys)")
    warnings.warn(f"ignored: {message}", stacklevel=3)


def _signature_state(value: object, predictor, where: str) -> dict:
    fields = list(predictor.signature.fields)
    if not isinstance(value, dict) or set(value) - {"instructions", "fields"}:
        raise ProgramRefused(f"{where}.signature: must be {{'instructions', 'fields'}}")
    current = predictor.signature.dump_state()["fields"]
    saved = value.get("fields", current)  # registered prompts carry the instruction alone
    if where.endswith(": audit") and isinstance(saved, list) and len(saved) == len(fields) + 1:
        # Saved before the integrated criteria moved from an input into the audit
        # predictors' instructions (audit_rules, audit_empirical): drop that input.
        saved = saved[:2] + saved[3:]
    instructions = value.get("instructions", predictor.signature.instructions)
    if not isinstance(instructions, str) or len(instructions) > MAX_INSTRUCTION_CHARS:
        raise ProgramRefused(f"{where}.signature.instructions: must be text of at most {MAX_INSTRUCTION_CHARS} "
                             "characters")
    if not isinstance(saved, list) or len(saved) != len(fields) or not all(
            isinstance(f, dict) and set(f) <= {"prefix", "description"}
            and all(isinstance(v, str) and len(v) <= 2000 for v in f.values()) for f in saved):
        raise ProgramRefused(f"{where}.signature.fields: must list {len(fields)} fields ({', '.join(fields)}), each "
                             "{'prefix', 'description'} as short text")
    return {"instructions": instructions, "fields": [{**c, **f} for c, f in zip(current, saved)]}


def _demos(value: object, predictor, where: str) -> list[dict]:
    allowed = set(predictor.signature.fields) | {"augmented"}
    if not isinstance(value, list) or len(value) > MAX_DEMOS:
        raise ProgramRefused(f"{where}.demos: must be a list of at most {MAX_DEMOS} examples")
    for i, demo in enumerate(value):
        if not isinstance(demo, dict) or set(demo) - allowed:
            extra = sorted(set(demo) - allowed) if isinstance(demo, dict) else type(demo).__name__
            raise ProgramRefused(f"{where}.demos[{i}]: holds {extra}; a demo holds only the stage's fields "
                                 f"({', '.join(sorted(allowed))})")
        if len(json.dumps(demo, ensure_ascii=False, default=str)) > MAX_DEMO_CHARS:
            raise ProgramRefused(f"{where}.demos[{i}]: larger than {MAX_DEMO_CHARS} characters")
    return [dict(d) for d in value]


def program_from_state(state: object, *, source: str = "saved program", lenient: bool = False) -> dspy.Module:
    """Build the program a saved state describes and apply its instructions and demos."""
    if not isinstance(state, dict):
        raise ProgramRefused(f"{source}: a saved program is a JSON object, not {type(state).__name__}")
    program = ProgramConfig.load(state.get("cg_dspy"), source).build()
    predictors = dict(program.named_predictors())
    for name, value in state.items():
        if name in ("cg_dspy", "metadata"):
            continue
        if name not in predictors:
            _refuse(f"{source}: {name!r} is not a stage of this program (its stages: {', '.join(predictors)})",
                    lenient)
            continue
        where, predictor = f"{source}: {name}", predictors[name]
        if not isinstance(value, dict):
            raise ProgramRefused(f"{where}: must be an object, not {type(value).__name__}")
        for key, item in value.items():
            if key in ("signature", "demos"):
                continue
            if key in _EMPTY_AS_SAVED and item == _EMPTY_AS_SAVED[key]:
                continue
            why = {"lm": "it would choose the model, endpoint or key", "config": "it would change the LM call"}
            _refuse(f"{where}.{key}: refused, {why.get(key, 'a saved program holds only instructions and demos')}",
                    lenient)
        if "signature" in value:
            predictor.signature = predictor.signature.load_state(_signature_state(value["signature"], predictor,
                                                                                  where))
        if "demos" in value:
            predictor.demos = _demos(value["demos"], predictor, where)
    return program


def load_program(source: str | Path, *, lenient: bool = False) -> dspy.Module:
    """A ready program from a saved JSON file or an MLflow URI (`runs:/ID[/program.json]`,
    `models:/...`), read as data (see the module docstring)."""
    text = str(source)
    if "://" not in text and ":/" not in text:
        path = Path(text)
        if path.suffix != ".json":
            raise ProgramRefused(f"{path}: saved programs are JSON state files; refusing to load "
                                 f"{path.suffix or 'it'}")
        if path.is_dir():
            raise ProgramRefused(f"{path}: is a directory, not a saved program")
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProgramRefused(f"{path}: not valid JSON ({exc})") from None
        return program_from_state(state, source=str(path), lenient=lenient)
    from cg_dspy import tracking

    state = tracking.load_program_state(text)
    if state is None:
        raise ProgramRefused(f"{text} holds no {tracking.PROGRAM_ARTIFACT}")
    return program_from_state(state, source=text, lenient=lenient)
