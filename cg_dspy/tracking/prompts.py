"""The Prompt Registry: one prompt per stage (`contextguard.audit`, `contextguard.revise`,
…), its untuned instruction the first version and each optimize run's tuned instruction
a new one, demos beside it (a run artifact the version's tags point to).

What a registry entry says is data: a version's `demos_uri` must name this stage's
demos artifact of a run in this store (`runs:/<id>/prompts/<stage>.demos.json`) and is
read through `artifacts.read_run_json`; its `cg_dspy_config` is checked like any saved
program. An alias names one run's whole program: setting it for a run takes it off
every stage that run did not register, and loading refuses an alias whose stages
belong to two runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from cg_dspy.core.redact import redact
from cg_dspy.tracking.artifacts import read_run_json
from cg_dspy.tracking.store import mlflow

PROMPT_PREFIX = "contextguard"  # registered prompts are contextguard.<stage>
DEMOS_URI = re.compile(r"runs:/([0-9a-f]{32})/(prompts/[\w\-]+\.demos\.json)")
ALIAS_TAG = "cg_dspy.alias."  # + alias: the run an alias names, on each stage's prompt


def prompt_name(stage: str) -> str:
    return f"{PROMPT_PREFIX}.{stage}"


def demos_file(stage: str) -> str:
    return f"prompts/{stage}.demos.json"


def prompts_of(program) -> dict[str, dict]:
    """Each predictor's instruction and demos (the conversation left out of demos)."""
    out = {}
    for name, predictor in program.named_predictors():
        demos = [{k: v for k, v in dict(d).items() if k != "conversation"} for d in predictor.demos]
        out[name] = {"instructions": predictor.signature.instructions, "demos": demos}
    return out


def registered() -> list:
    """Every registered contextguard.* prompt."""
    return list(mlflow().genai.search_prompts(filter_string=f"name LIKE '{PROMPT_PREFIX}.%'"))


def versions(name: str) -> list:
    """Every version of a registered prompt, oldest first ([] when it is not registered)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        found = list(MlflowClient().search_prompt_versions(name))
    except MlflowException:
        return []
    return sorted(found, key=lambda v: int(v.version))


def register_prompts(program, base, *, tuned: tuple[str, ...], run_id: str, message: str, tags: dict,
                     alias: str | None = None) -> dict[str, object]:
    """Every stage of `program` as a registered prompt: a stage seen for the first time
    gets `base`'s (untuned) instruction as its first version; each tuned stage gets this
    run's instruction as a new version, its demos logged beside it; every version used
    is linked to the run. Returns the versions, by stage."""
    from mlflow import MlflowClient

    genai, client = mlflow().genai, MlflowClient()
    base_prompts, prompts = prompts_of(base), prompts_of(program)
    config = json.dumps(program.config())
    chosen = {}
    for stage, prompt in prompts.items():
        name = prompt_name(stage)
        known = versions(name)
        if not known:
            known = [genai.register_prompt(
                name, base_prompts[stage]["instructions"], commit_message="untuned (the paper's prompt)",
                tags={"variant": "base", "demos": "0", "cg_dspy_config": config})]
        # An untuned stage links the version this run used (its instruction, no demos), not
        # whatever another run registered last.
        version = next((v for v in known if v.template == prompt["instructions"] and not prompt["demos"]
                        and (v.tags or {}).get("demos", "0") == "0"), None)
        if stage in tuned or version is None:
            mlflow().log_dict(redact(prompt["demos"]), demos_file(stage))
            demos = json.dumps(prompt["demos"], sort_keys=True, default=str)
            version = genai.register_prompt(
                name, prompt["instructions"], commit_message=message,
                tags={**{k: str(v) for k, v in tags.items()}, "variant": "tuned", "run_id": run_id,
                      "demos": str(len(prompt["demos"])), "demos_uri": f"runs:/{run_id}/{demos_file(stage)}",
                      "demos_digest": hashlib.sha256(demos.encode()).hexdigest()[:16], "cg_dspy_config": config})
        client.link_prompt_version_to_run(run_id, version)
        chosen[stage] = version
    if alias:
        set_alias(alias, chosen, run_id)
    return chosen


def set_alias(alias: str, chosen: dict[str, object], run_id: str) -> None:
    """`alias` on every stage's chosen version, owned by `run_id`; taken off every other
    contextguard.* prompt, so it never names stages of two runs."""
    genai = mlflow().genai
    for stage, version in chosen.items():
        genai.set_prompt_alias(prompt_name(stage), alias, int(version.version))
        genai.set_prompt_tag(prompt_name(stage), ALIAS_TAG + alias, run_id)
    for prompt in registered():
        if prompt.name.removeprefix(f"{PROMPT_PREFIX}.") in chosen:
            continue
        if ALIAS_TAG + alias in (prompt.tags or {}) or _has_alias(prompt.name, alias):
            genai.delete_prompt_alias(prompt.name, alias)
            genai.delete_prompt_tag(prompt.name, ALIAS_TAG + alias)


def _has_alias(name: str, alias: str) -> bool:
    return any(alias in (getattr(v, "aliases", None) or []) for v in versions(name))


def demos_of(version, stage: str, where: str) -> list:
    """A version's demos, from the artifact its `demos_uri` tag names, which must be this
    stage's demos of a run in this store; anything else is refused, naming the tag."""
    uri = (version.tags or {}).get("demos_uri")
    if not uri:
        return []
    found = DEMOS_URI.fullmatch(uri)
    if found is None or found.group(2) != demos_file(stage):
        raise ValueError(f"{where}: {prompt_name(stage)} version {version.version}: tag demos_uri {uri!r} is not "
                         f"runs:/<run id>/{demos_file(stage)} of this store; refused, nothing fetched")
    demos = read_run_json(found.group(1), found.group(2), what=f"{where}: {prompt_name(stage)} "
                          f"version {version.version} (tag demos_uri)")
    if not isinstance(demos, list):
        raise ValueError(f"{where}: {prompt_name(stage)} version {version.version}: its demos artifact is not a list")
    return demos


def config_of(version, stage: str, where: str) -> dict | None:
    """A version's `cg_dspy_config` tag, parsed (checked later like any saved program)."""
    text = (version.tags or {}).get("cg_dspy_config")
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: {prompt_name(stage)} version {version.version}: tag cg_dspy_config is not JSON "
                         f"({exc.msg})") from None


def load_prompt_state(uri: str) -> dict:
    """A saved program's state from registered prompts: `prompts:/contextguard@ALIAS` (or
    `/VERSION`) takes each stage's version under that alias (a stage without one keeps
    its untuned instruction), its demos from the artifact its tags name."""
    selector = uri.removeprefix("prompts:/")
    prefix, sep, which = selector.partition("@") if "@" in selector else selector.partition("/")
    if prefix != PROMPT_PREFIX or not which:
        raise ValueError(f"{uri}: write prompts:/{PROMPT_PREFIX}@ALIAS or prompts:/{PROMPT_PREFIX}/VERSION")
    state, config, owners = {}, None, {}
    for prompt in registered():
        stage = prompt.name.removeprefix(f"{PROMPT_PREFIX}.")
        try:
            version = mlflow().genai.load_prompt(f"prompts:/{prompt.name}{sep}{which}", link_to_model=False)
        except Exception:  # noqa: BLE001 - no version under that alias for this stage
            continue
        if sep == "@":
            owners[stage] = (prompt.tags or {}).get(ALIAS_TAG + which)
        found = config_of(version, stage, uri)
        if found is not None and (config is None or (version.tags or {}).get("variant") == "tuned"):
            config = found  # a tuned version's run decides the settings
        state[stage] = {"signature": {"instructions": version.template}, "demos": demos_of(version, stage, uri)}
    if not state:
        raise ValueError(f"{uri}: no registered {PROMPT_PREFIX}.* prompt has {which!r} in "
                         f"{mlflow().get_tracking_uri()}")
    runs = {}
    for stage, run in owners.items():
        runs.setdefault(run, []).append(stage)
    if len(runs) > 1:
        named = "; ".join(f"{', '.join(stages)} (run {run or 'unknown'})" for run, stages in runs.items())
        raise ValueError(f"{uri}: alias {which!r} names stages of different runs: {named}; set it again with "
                         f"`contextguard optimize ... --alias {which}`")
    return {**state, "cg_dspy": config} if config else state


def version_row(version) -> dict:
    """A version as `compare` lists it; tags are data, so odd values read as missing."""
    tags = version.tags or {}
    return {"version": int(version.version), "variant": tags.get("variant", ""), "run_id": tags.get("run_id", ""),
            "optimizer": tags.get("optimizer", ""), "dev_tasks": _count(tags.get("dev_tasks")),
            "dev_before": _number(tags.get("dev_before_tsr")), "dev_after": _number(tags.get("dev_tsr")),
            "dev_after_ci95": _interval(tags.get("dev_tsr_ci95")), "dev_delta": _number(tags.get("dev_delta_tsr")),
            "dev_delta_ci95": _interval(tags.get("dev_delta_tsr_ci95")),
            "dev_mcnemar_p": _number(tags.get("dev_mcnemar_p")), "demos": _count(tags.get("demos")),
            "message": version.commit_message or ""}


def _interval(text) -> list[float] | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    if isinstance(value, list) and len(value) == 2 and all(_number(v) is not None for v in value):
        return [float(v) for v in value]
    return None


def _number(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _count(text) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def stage_versions(stages: list[str] | None = None) -> dict:
    """Every version of each registered stage (`stages`, or those with a tuned version),
    with its demos (read as registry data is), for `reports.prompt_diffs.compare`."""
    from cg_dspy.reports.prompt_diffs import PromptVersion

    out = {}
    for prompt in registered():
        stage = prompt.name.removeprefix(f"{PROMPT_PREFIX}.")
        found = versions(prompt.name)
        if (stages and stage not in stages) or (not stages and len(found) < 2):
            continue
        out[stage] = [PromptVersion(int(v.version), v.template, demos_of(v, stage, "compare"), version_row(v))
                      for v in found]
    return out
