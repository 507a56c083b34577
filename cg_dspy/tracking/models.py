"""The compiled program: its JSON state as a run artifact, and one logged model (DSPy
flavor) per optimize run; loading a program from `runs:/`, `models:/` or `prompts:/`.

A model version's `source` and a logged model's artifact location are never followed:
a `models:/` URI is resolved to the run that logged it, through the registry of this
store, and that run's `program.json` is read (artifacts.read_run_json).
"""

from __future__ import annotations

import re
import types

from cg_dspy.core.redact import redact
from cg_dspy.tracking import prompts
from cg_dspy.tracking.artifacts import RUN_ID, ArtifactRefused, read_run_json
from cg_dspy.tracking.store import mlflow

PROGRAM_ARTIFACT = "program.json"  # a run's compiled program, as JSON state
MODEL_NAME = "model"
_LOGGED_MODEL = re.compile(r"m-[0-9a-f]{32}")


def log_program(program, *, versions: dict | None = None, example: dict | None = None) -> None:
    """The compiled program as JSON state, and as one MLflow model (DSPy flavor) with a
    signature, an input example and its registered prompt versions. The model's LM is
    the loading process's (lms.EnvironmentLM): it holds no endpoint and no key."""
    import dspy
    import mlflow.dspy
    from mlflow.models import Model

    from cg_dspy.lms import ConversationAdapter
    from cg_dspy.lms.build import EnvironmentLM

    mlflow.log_dict(redact(program.dump_state()), PROGRAM_ARTIFACT)
    mlflow.log_dict(redact(prompts.prompts_of(program)), "prompts/prompts.json")
    with dspy.context(lm=EnvironmentLM(), adapter=ConversationAdapter()):
        # mlflow.dspy's own saver, minus the check that runs the example through the LM
        # at logging time (it would call a model the logging process did not choose).
        flavor = types.SimpleNamespace(__name__=mlflow.dspy.__name__, save_model=_save_without_validation)
        Model.log(artifact_path=None, name=MODEL_NAME, flavor=flavor, model=program, input_example=example,
                  signature=model_signature(example) if example else None,
                  prompts=list((versions or {}).values()) or None, use_dspy_model_save=True,
                  validate_serving_input=False, pip_requirements=requirements())
    mlflow.clear_active_model()  # logging makes the model "active", which would tie later metrics to it


def requirements() -> list[str]:
    """What loading the model needs, pinned to this process's versions: the project (its
    own dependencies follow from it) and the two libraries the flavor loads with. Said
    rather than inferred: MLflow infers by loading the model in a subprocess (seconds per
    logged model) and lists whatever that happened to import, llama-cpp-python included."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = []
    for dist in ("cg-dspy", "dspy", "mlflow"):
        try:
            pinned.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:  # run from a source tree that is not installed
            continue
    return pinned


def model_signature(example: dict):
    """Inputs as the example has them; outputs the answer, how it came about, and the draft."""
    from mlflow.models import infer_signature

    return infer_signature(model_input=example, model_output={"answer": "…", "path": "revised", "draft": "…"})


def _save_without_validation(*, validate_serving_input=False, **kwargs):
    import mlflow.dspy

    return mlflow.dspy.save_model(**kwargs)


def model_run(uri: str) -> str:
    """The run that logged the model `uri` names (`models:/m-<id>`, `models:/NAME/VERSION`,
    `models:/NAME@ALIAS`), from this store's registry; never the model's `source`."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client, target = MlflowClient(), uri.removeprefix("models:/").strip("/")
    try:
        if _LOGGED_MODEL.fullmatch(target):
            run_id = client.get_logged_model(target).source_run_id
        elif "@" in target:
            name, _, alias = target.partition("@")
            run_id = client.get_model_version_by_alias(name, alias).run_id
        elif target.count("/") == 1 and target.rsplit("/", 1)[1].isdigit():
            name, version = target.rsplit("/", 1)
            run_id = client.get_model_version(name, version).run_id
        else:
            raise ValueError(f"{uri}: write models:/m-<id>, models:/NAME/VERSION or models:/NAME@ALIAS")
    except MlflowException:
        raise ValueError(f"{uri}: no such model in the MLflow store {mlflow().get_tracking_uri()} (pass "
                         "--tracking-uri or set MLFLOW_TRACKING_URI)") from None
    if not RUN_ID.fullmatch(run_id or ""):
        raise ArtifactRefused(f"{uri}: the model names no run of this store; its program is not loaded")
    return run_id


def load_program_state(uri: str) -> dict | None:
    """The JSON state behind an MLflow URI: a run's `program.json` (`runs:/ID`, or
    `runs:/ID/other.json`), a logged model's run (`models:/...`), or registered prompts
    (`prompts:/contextguard@ALIAS`); None when the run holds no such file."""
    if uri.startswith("prompts:/"):
        return prompts.load_prompt_state(uri)
    if uri.startswith("models:/"):
        return read_run_json(model_run(uri), PROGRAM_ARTIFACT, what=uri)
    if not uri.startswith("runs:/"):
        raise ValueError(f"{uri}: load a program from a file, runs:/ID, models:/... or prompts:/contextguard@ALIAS")
    run_id, _, path = uri.removeprefix("runs:/").strip("/").partition("/")
    path = path or PROGRAM_ARTIFACT
    if not path.endswith(".json"):
        raise ValueError(f"{uri}: a saved program is a .json artifact")
    return read_run_json(run_id, path, what=uri)
