"""One small recipe per optimizer: which DSPy optimizer, with what settings per budget.

Each recipe takes the metric, the budget and the LMs, and returns a ready optimizer
plus the settings it used (logged to MLflow as params).
"""

from __future__ import annotations

import dspy

BUDGETS = ("light", "medium", "heavy")


def bootstrap(metric, budget: str, *, threads: int, **_):
    """Bootstrapped demos for the tuned stages (random search over candidates past 'light')."""
    if budget == "light":
        settings = {"max_bootstrapped_demos": 1, "max_labeled_demos": 0, "max_rounds": 1}
        return dspy.BootstrapFewShot(metric=metric, **settings), settings
    n = {"medium": 4, "heavy": 8}[budget]
    settings = {"max_bootstrapped_demos": n // 2, "max_labeled_demos": 0, "num_candidate_programs": n}
    return dspy.BootstrapFewShotWithRandomSearch(metric=metric, num_threads=threads, **settings), settings


def mipro(metric, budget: str, *, threads: int, prompt_lm, task_lm, **_):
    """MIPROv2: proposed instructions and bootstrapped demos, searched jointly."""
    settings = {"auto": budget, "max_bootstrapped_demos": 1, "max_labeled_demos": 0}
    return dspy.MIPROv2(metric=metric, prompt_model=prompt_lm, task_model=task_lm, num_threads=threads,
                        **settings), settings


def gepa(metric, budget: str, *, threads: int, reflection_lm, log_dir=None, callbacks=(), **_):
    """GEPA: reflective instruction evolution from the metric's textual feedback. Its
    `log_dir` keeps every candidate and its state, so a rerun continues where it
    stopped; `callbacks` see each candidate's dev score as it comes."""
    settings = {"max_full_evals": {"light": 2, "medium": 6, "heavy": 15}[budget], "reflection_minibatch_size": 2,
                "use_merge": False}
    return dspy.GEPA(metric=metric, reflection_lm=reflection_lm, num_threads=threads, track_stats=True,
                     log_dir=str(log_dir) if log_dir else None, gepa_kwargs={"callbacks": list(callbacks)},
                     **settings), settings


def simba(metric, budget: str, *, threads: int, train_size: int, prompt_lm, **_):
    """SIMBA: stochastic mini-batch ascent with self-reflective rules and demos. Its rules
    come from `prompt_lm` (the reflection LM): left unset, SIMBA takes whatever LM is
    configured globally when it is built, not the run's."""
    settings = {"max_steps": {"light": 2, "medium": 6, "heavy": 12}[budget],
                "num_candidates": {"light": 3, "medium": 6, "heavy": 8}[budget],
                "bsize": max(1, min(8, train_size))}
    return dspy.SIMBA(metric=metric, num_threads=threads, prompt_model=prompt_lm, **settings), settings


RECIPES = {"bootstrap": bootstrap, "mipro": mipro, "gepa": gepa, "simba": simba}


def compile_with(name: str, optimizer, student, trainset, devset):
    """Each optimizer's own compile call; those that select among candidates select on dev."""
    if name in ("mipro", "gepa") or isinstance(optimizer, dspy.BootstrapFewShotWithRandomSearch):
        return optimizer.compile(student, trainset=trainset, valset=devset)
    return optimizer.compile(student, trainset=trainset)
