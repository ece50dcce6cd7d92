"""``tol="auto"``: stop plain EM once the fit is within a small fraction of a standard error of
the optimum, in every parameter.

Near a maximum ``theta*`` the log-likelihood (summed over the rows) is
``L* - L(theta) = 1/2 (theta - theta*)^T I (theta - theta*)``, ``I`` the observed information.
For any parameter, or any linear function ``c^T theta`` of them (the reported weights,
coefficients, variances), Cauchy-Schwarz in the metric of ``I`` gives

    |c^T (theta - theta*)| <= sqrt(c^T I^-1 c) * sqrt(2 (L* - L(theta)))

and ``sqrt(c^T I^-1 c)`` is its standard error. So a summed log-likelihood within
``fraction^2 / 2`` nats of its maximum puts every parameter within ``fraction`` standard errors
of it (0.1: within 0.005 nats), whatever the parametrization. The gap is not known during the
fit; EM converges linearly, and Aitken's delta-squared estimate of the limit from the last
three objectives (Böhning, Dietz, Schaub, Schlattmann and Lindsay 1994; McNicholas, Murphy,
McDaid and Frost 2010) estimates it:

    a = dL_k / dL_{k-1},      L* - L_k ~= dL_k a / (1 - a)       (0 <= a < 1)

The rule stops when that estimate is below half of ``fraction^2 / 2`` (a margin for the
estimate: the ratio drifts as faster directions die out) in two consecutive rounds (one
round's ratio can be fooled by a change of regime, e.g. EM leaving a saddle), or once the
objective no longer moves beyond floating-point rounding (EM at a fixed point). While
``a >= 1`` (EM speeding up, as it leaves a saddle or a flat region) it never stops. A slowly
converging fit (``a`` near 1) runs on, and one stopped by ``max_rounds`` warns.

With an accelerator (SQUAREM, subspace Newton) the objectives are not an EM sequence; the
rule is then theirs (one plain EM step's change of the mean objective) at
:func:`accelerated_tol`.

References
----------
Böhning et al., "The distribution of the likelihood ratio for mixtures of densities from the
one-parameter exponential family", Ann. Inst. Statist. Math. 46 (1994). McNicholas et al.,
"Serial and parallel implementations of model-based clustering via parsimonious Gaussian mixture
models", Comput. Statist. Data Anal. 54 (2010), section 4 (Aitken's stopping criterion).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["AUTO", "AUTO_MAX_ROUNDS", "SE_FRACTION", "STAT_TOL", "accelerated_tol",
           "aitken_gap", "distance_note", "gap_in_se", "is_auto", "loop_tol", "near_optimum"]

#: the value of ``tol`` that selects this rule
AUTO = "auto"
#: the default: every parameter within this many standard errors of the optimum
SE_FRACTION = 0.1
#: ``tol="auto"`` of a federation that is not plain EM (partial participation, a step size,
#: compression): the settled-statistic rule's threshold on ``stat_change``
STAT_TOL = 1e-4
#: ``max_rounds=None`` of the estimators whose ``tol`` defaults to "auto": plain EM needs a few
#: hundred rounds to get within 0.1 standard error on real data (LCR on Hsb82: 192-563 rounds;
#: on mlmRev's Exam a small component takes about 6,000)
AUTO_MAX_ROUNDS = 1000
#: the rule's target gap is this fraction of ``fraction^2 / 2`` (the estimate's margin: on
#: 20 small LCA fits the parameters ended up to 0.089 SE away with a margin of 1)
MARGIN = 0.5
#: changes of the summed objective below this many roundings of a sum of ``n`` terms
#: (``sqrt(n)`` units of rounding of its value) are noise ...
_NOISE_ULPS = 8.0
#: ... and never more than this many nats (far below the target, 0.0025 nats)
_NOISE_CAP = 1e-5


def is_auto(tol) -> bool:
    """Whether ``tol`` asks for this rule."""
    return isinstance(tol, str) and tol == AUTO


def loop_tol(tol) -> float | str:
    """An estimator's ``tol`` for the round loop: ``"auto"`` or a float."""
    return AUTO if is_auto(tol) else float(tol)


def aitken_gap(objectives: Sequence[float], n_total: float) -> float:
    """Aitken's estimate of ``L* - L_k``, the summed log-likelihood's distance to its limit,
    from the last three mean objectives (per unit) of a plain EM run over ``n_total`` units.

    Returns
    -------
    float
        The estimated gap in nats (0 when the last round moved the objective no more than
        rounding does, a fixed point; inf when it cannot be estimated: fewer than three
        values, a ratio ``a >= 1``, a fall).
    """
    if len(objectives) < 3:
        return math.inf
    l0, l1, l2 = (float(v) * n_total for v in objectives[-3:])
    if not all(math.isfinite(v) for v in (l0, l1, l2)):
        return math.inf
    d1, d2 = l1 - l0, l2 - l1
    noise = min(_NOISE_ULPS * 2.0**-52 * max(abs(l2), 1.0) * math.sqrt(max(n_total, 1.0)),
                _NOISE_CAP)
    if abs(d2) <= noise:  # the last round did not move the objective beyond rounding
        return 0.0
    if d2 <= 0.0 or d1 <= 0.0:  # a fall (or a first rise): no linear regime to extrapolate
        return math.inf
    a = d2 / d1
    if a >= 1.0:
        return math.inf
    return d2 * a / (1.0 - a)


def gap_in_se(gap: float) -> float:
    """The bound on every parameter's distance to the optimum, in standard errors, of a summed
    log-likelihood ``gap`` nats below its maximum: ``sqrt(2 gap)`` (module docstring)."""
    return math.sqrt(2.0 * gap) if gap >= 0.0 else math.inf


def near_optimum(objectives: Sequence[float], n_total: float,
                 fraction: float = SE_FRACTION) -> bool:
    """The rule of ``tol="auto"``: Aitken's gap below ``MARGIN * fraction**2 / 2`` nats at
    the last round and at the one before (module docstring)."""
    target = MARGIN * 0.5 * fraction**2
    last = aitken_gap(objectives, n_total)
    return last == 0.0 or (last < target and aitken_gap(objectives[:-1], n_total) < target)


def accelerated_tol(n_total: float, fraction: float = SE_FRACTION) -> float:
    """The accelerators' threshold on one plain EM step's change of the mean objective under
    ``tol="auto"``: ``fraction**2 / 2`` nats over the units, a hundredth of it (one EM step
    from a point ``g`` nats below the optimum gains ``(1 - rate^2) g``; a hundredth covers EM
    rates up to 0.995)."""
    return 0.01 * 0.5 * fraction**2 / max(float(n_total), 1.0)


def distance_note(objectives: Sequence[float], n_total: float) -> str:
    """How far from the optimum a fit that ran out of rounds may be (its ConvergenceWarning)."""
    if len(objectives) < 3:
        return "too few rounds to estimate the distance to the optimum"
    gap = aitken_gap(objectives, n_total)
    if not math.isfinite(gap):
        return ("the log-likelihood was still rising, with no estimate of its distance to the "
                "optimum; a fit this slow may gain from Federation(acceleration='newton')")
    return (f"the log-likelihood is an estimated {gap:.3g} nats below its limit: the parameters "
            f"may be up to {gap_in_se(gap):.2g} standard errors from the optimum; tol='auto' "
            "stops within 0.1")
