"""Intervals, paired tests and split sizes: pure functions of counts, no I/O.

A task-solving rate over n tasks is a proportion; over a few dozen tasks its 95%
interval spans tens of points, so a rate alone says little and a difference of two
rates less. What a report states, and how:

- a rate's 95% interval: Wilson's score interval (good coverage at small n and near
  0% or 100%, never outside [0, 1], unlike the normal approximation);
- the rubric pass rate's interval: a percentile bootstrap over tasks (seeded, so a
  report is reproducible), because a task's requirements are judged on one answer and
  are not independent;
- two runs over the same tasks (paired): the difference of their rates with
  Newcombe's hybrid score interval for paired proportions (method 10, 1998, with its
  continuity-corrected correlation), which
  stays sensible when few tasks changed, and McNemar's exact test: a two-sided
  binomial test of the discordant tasks (newly solved against broken) at p = 1/2;
  the rubric pass rate's difference with a paired bootstrap over tasks;
- repeated runs: mean and sample standard deviation (n - 1), as CL-bench's leaderboard
  prints them;
- how large a paired difference a split can detect (80% power, two-sided alpha 0.05),
  from its size and the share of tasks whose outcome changes between the two programs:
  the power of McNemar's exact test, enumerated (no normal approximation, which
  promises far too much on a few dozen tasks).

Percentages are numbers in 0-100, rounded to two decimals.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval
BOOTSTRAP_SAMPLES = 2000
SEED = 20261201
# The paper's Table 14: 140 tasks newly solved and 60 broken of 1,899 (baseline ->
# ContextGuard), the default share of tasks whose outcome a change of prompts flips.
PAPER_DISCORDANCE = 200 / 1899


def _pct(x: float) -> float:
    return round(100.0 * float(x), 2)


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for k successes of n, as fractions ((0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_ci(k: int, n: int) -> list[float]:
    """A rate's 95% interval in percent: [lo, hi]."""
    lo, hi = wilson(k, n)
    return [_pct(lo), _pct(hi)]


def mcnemar_exact(newly: int, broken: int) -> float:
    """McNemar's exact two-sided p: P(a split of the discordant tasks at least this
    uneven | each is equally likely to go either way)."""
    n = newly + broken
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(newly, broken) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def paired_difference_ci(both: int, newly: int, broken: int, neither: int) -> list[float]:
    """Newcombe's (method 10) 95% interval, in percent, for the difference of two paired
    rates: after - before, where `newly` tasks only the second run solved and `broken`
    only the first."""
    n = both + newly + broken + neither
    if n == 0:
        return [-100.0, 100.0]
    after, before = (both + newly) / n, (both + broken) / n
    l1, u1 = wilson(both + newly, n)
    l2, u2 = wilson(both + broken, n)
    product = (both + newly) * (broken + neither) * (both + broken) * (newly + neither)
    cross = both * neither - newly * broken
    if cross > 0:  # Newcombe's continuity correction, so agreement alone never gives a zero-width interval
        cross = max(cross - n / 2, 0.0)
    phi = cross / math.sqrt(product) if product else 0.0
    delta = math.sqrt(max(0.0, (after - l1) ** 2 - 2 * phi * (after - l1) * (u2 - before) + (u2 - before) ** 2))
    epsilon = math.sqrt(max(0.0, (u1 - after) ** 2 - 2 * phi * (u1 - after) * (before - l2) + (before - l2) ** 2))
    diff = after - before
    return [_pct(max(-1.0, diff - delta)), _pct(min(1.0, diff + epsilon))]


def _resample(n: int, samples: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).integers(0, n, size=(samples, n))


def bootstrap_mean_ci(values: Sequence[float], *, samples: int = BOOTSTRAP_SAMPLES, seed: int = SEED) -> list[float]:
    """A percentile bootstrap 95% interval, in percent, of the mean of per-task values
    (fractions): tasks are resampled, so values of one task stay together."""
    import numpy as np

    if not values:
        return [0.0, 100.0]
    data = np.asarray(values, dtype=float)
    means = data[_resample(len(data), samples, seed)].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return [_pct(lo), _pct(hi)]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1; None for fewer than two values)."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    if len(values) < 2:
        return round(mean, 2), None
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return round(mean, 2), round(math.sqrt(var), 2)


@functools.lru_cache(maxsize=4096)
def _critical(discordant: int, alpha: float) -> int:
    """The largest k such that k (or fewer) of `discordant` tasks going one way is
    significant for McNemar's exact two-sided test at `alpha`; -1 when none is."""
    total, tail, found = 2 ** discordant, 0, -1
    for k in range(discordant // 2 + 1):
        tail += math.comb(discordant, k)
        if 2 * tail > alpha * total:
            break
        found = k
    return found


def mcnemar_power(n: int, discordance: float, difference: float, alpha: float = 0.05) -> float:
    """The power of McNemar's exact test over n paired tasks when a share `discordance`
    of them change outcome and the rate differs by `difference` (fractions): the
    discordant count is binomial, and given it the broken count is too; enumerated,
    over the discordant counts with any weight."""
    import numpy as np

    if n <= 0 or not 0 < discordance <= 1 or not 0 < difference <= discordance:
        return 0.0
    broken = (discordance - difference) / (2 * discordance)  # the share of changed tasks that broke
    log_fact = _log_factorials(n)
    counts = np.arange(n + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        unchanged = np.where(counts == n, 0.0, (n - counts) * np.log1p(-discordance))  # 0 log 0 = 0
        log_p = log_fact[n] - log_fact[counts] - log_fact[n - counts] + counts * math.log(discordance) + unchanged
    power = 0.0
    for d in counts[log_p > math.log(1e-12)]:
        d = int(d)
        c = _critical(d, alpha)
        if c < 0:
            continue
        k = np.arange(d + 1)
        if broken == 0:
            pmf = (k == 0).astype(float)
        else:
            pmf = np.exp(log_fact[d] - log_fact[k] - log_fact[d - k] + k * math.log(broken)
                         + (d - k) * math.log1p(-broken))
        power += math.exp(log_p[d]) * (pmf[: c + 1].sum() + pmf[d - c:].sum())
    return float(min(1.0, power))


def _log_factorials(n: int):
    import numpy as np

    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=float)))])


def detectable_difference(n: int, discordance: float = PAPER_DISCORDANCE, *, power: float = 0.8,
                          alpha: float = 0.05) -> float | None:
    """The smallest difference in task-solving rate, in percentage points, that a paired
    comparison over `n` tasks detects with `power` (McNemar's exact test, two-sided
    `alpha`), when a share `discordance` of the tasks change outcome; None when none is
    detectable (too few tasks: even every change going one way is not significant
    often enough)."""
    if n <= 0 or not 0 < discordance <= 1 or mcnemar_power(n, discordance, discordance, alpha) < power:
        return None
    lo, hi = 0.0, discordance
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if mcnemar_power(n, discordance, mid, alpha) >= power else (mid, hi)
    return math.ceil(10000 * hi) / 100  # rounded up: the stated difference has the power
