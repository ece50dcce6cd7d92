"""The Gaussian mixture's pooled moments when the federation has missing values.

Every client sends (summed, like the complete moments) its row count, the pairwise observed
counts ``nobs[i, j]`` (rows observing both columns; per-column counts on the diagonal) and the
sums over observed values. The server refuses, before round 1, a pair of columns observed
together nowhere (their covariance is not identified; for "full" and "tied" covariances) or a
column observed nowhere; otherwise it takes each column's mean over its observed values and a
pairwise covariance (lifted into the positive-definite cone) as the pooled Gaussian the
starts draw from.
"""

from __future__ import annotations

import numpy as np

from ...engine.estimation.estimator import FitContext
from ...engine.protocol.exchange import array, number
from ...engine.protocol.numerics import lift_eigenvalues

__all__ = ["identification_problem", "pairwise_moments"]


def identification_problem(nobs: np.ndarray, names, covariance_type: str) -> str | None:
    """Why the parameters are not identified from pairwise observed counts ``nobs`` (None
    when they are): a column observed nowhere; for "full"/"tied", a pair never observed
    together."""
    nobs = np.asarray(nobs, dtype=np.float64)
    none = np.flatnonzero(np.diag(nobs) < 0.5)
    if none.size:
        return (f"column {names[none[0]]!r} is observed at no site (every value is missing): "
                "nothing can be estimated for it; drop it from the features")
    if covariance_type in ("full", "tied"):
        i, j = np.nonzero(np.triu(nobs < 0.5, 1))
        if i.size:
            return (f"columns {names[i[0]]!r} and {names[j[0]]!r} are never observed together "
                    "at any site: their covariance is not identified; collect both at one "
                    "site at least, drop one of them, or use covariance_type='diag'")
    return None


def _units_check(ctx: FitContext):
    def check(n, reply, c):
        return None if float(n) == ctx.n_units[c] else (
            f"claims {float(n):g} samples, {ctx.n_units[c]} at setup")
    return check


def pairwise_moments(ctx: FitContext, d: int, names, covariance_type: str):
    """``(n, mean, gcov, center, None)`` as ``init._pooled_moments``, from pairwise moments
    (queried with ``missing=d`` so that every client, complete or not, sends this form).

    Raises
    ------
    ValueError
        A column observed nowhere, or (full/tied) two columns never observed together.
    """
    shapes = {"n": (), "nobs": (d, d), "sx": (d,), "sxx": (d, d)}
    payload = {"missing": int(d)}  # (the DP sensitivity of nobs: one row adds at most d)
    if ctx.summed_only:
        tot = ctx.ask_sum("moments", payload, shapes=shapes, what="initialization (moments)")
    else:
        expect = {"n": number(low=1, check=_units_check(ctx)), "nobs": array(d, d, low=0),
                  "sx": array(d), "sxx": array(d, d)}
        rep = ctx.ask("moments", payload, expect=expect, what="initialization (moments)")
        tot = {k: sum(np.asarray(rep[c][k], dtype=np.float64) for c in ctx.client_ids)
               for k in shapes}
    nobs = np.rint(np.asarray(tot["nobs"], dtype=np.float64))
    reason = identification_problem(nobs, list(names), covariance_type)
    if reason:
        raise ValueError(reason)
    n = float(np.rint(tot["n"]))
    cnt = np.maximum(nobs, 1.0)
    m = tot["sx"] / np.diag(cnt)
    gcov = tot["sxx"] / cnt - np.outer(m, m)
    scale = max(float(np.mean(np.abs(np.diag(gcov)))), 1e-12)
    gcov = lift_eigenvalues(gcov, 1e-3 * scale)[0]
    dp = ctx.federation.privacy
    if dp is not None:  # sums about the public clipping centre
        c0 = dp.center_for(d)
        return n, c0 + m, gcov, c0, None
    return n, m, gcov, m, None
