"""Missingness patterns count as records: the rare-pattern rule, applied where the data are.

A row's *pattern* is the set of its observed columns. Under missing at random every
missing-data statistic is a sum over pattern groups, and the part a group adds moves with the
parameters in a way the server can compute (the conditional means of the missing
coordinates are affine in the observed ones). Two rounds (or two differently parametrized
queries) therefore difference a group's contribution out of a reply: a group of one row gives
that row back, as a rare category level would. So a pattern held by fewer than
``min_records_per_block`` records at a site is treated as a rare level: before the model sees
the data, each such row is **merged** into the common pattern (held by at least that many
records) with the most observed columns among those it observes all of, by setting its other
values to missing; a row no common pattern fits is **left out** of the fit (every value of it,
its target included). Afterwards every pattern group, every column's observed count and every
pairwise observed count (the moments query's ``nobs``) is a sum over at least
``min_records_per_block`` records or none.

The rule counts each site's own records in every count scope: under secure aggregation a
cohort's pattern counts would admit more rows, but they are not known at the site; counting
the site's own is the stricter choice. A site without a missing value is untouched.

References
----------
Little and Rubin (2019), "Statistical Analysis with Missing Data", 3rd ed., section 1.3
(missingness patterns); DataSHIELD's ``nfilter.tab`` (cells of fewer than a threshold).
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["merge_rare_patterns", "rare_pattern_plan"]

logger = logging.getLogger(__name__)


def rare_pattern_plan(observed: np.ndarray, counts: np.ndarray, threshold: int) -> np.ndarray:
    """For each pattern, the pattern its rows take under the rule (-1: left out).

    Parameters
    ----------
    observed : ndarray of bool, shape (G, d)
        The distinct patterns (True where observed).
    counts : ndarray of shape (G,)
        Records holding each pattern.
    threshold : int
        ``min_records_per_block``.

    Returns
    -------
    target : ndarray of int, shape (G,)
        ``target[g] == g`` for a common pattern; for a rare one the common pattern with the
        most observed columns among those observing a subset of its columns, or -1.
    """
    G = observed.shape[0]
    common = (np.asarray(counts) >= threshold) & observed.any(axis=1)
    target = np.where(common, np.arange(G), -1)
    rare, cand = np.flatnonzero(~common), np.flatnonzero(common)
    if rare.size == 0 or cand.size == 0:
        return target
    obs = observed.astype(np.int32)
    # common pattern c fits rare pattern r when c observes nothing r does not
    fits = ((1 - obs[rare]) @ obs[cand].T) == 0  # (R, C)
    size = np.where(fits, obs[cand].sum(axis=1)[None, :], -1)
    best = size.argmax(axis=1)
    target[rare] = np.where(size[np.arange(rare.size), best] > 0, cand[best], -1)
    return target


def merge_rare_patterns(data, policy, client: str = ""):
    """``data`` (a ClientData) with the rare-pattern rule applied under ``policy`` (a
    DisclosurePolicy): rows of a pattern held by fewer than ``min_records_per_block``
    records merged into a common pattern or left out (see the module docstring). Returns
    ``data`` itself when nothing changes (no missing value, the rule off)."""
    X = np.asarray(data.X)
    t = int(getattr(policy, "min_records_per_block", 0))
    if t <= 1 or policy.is_off or X.dtype.kind != "f" or not np.isnan(X).any():
        return data
    observed, group = np.unique(~np.isnan(X), axis=0, return_inverse=True)
    group = np.asarray(group).ravel()
    records = (np.ones(X.shape[0]) if data.weight is None
               else (np.asarray(data.weight) > 0).astype(np.float64))
    counts = np.bincount(group, weights=records, minlength=observed.shape[0])
    target = rare_pattern_plan(observed, counts, t)
    moved = target[group] != group
    if not moved.any():
        return data
    keep = target[group] >= 0
    blank = moved & keep
    X = X.copy()
    X[blank] = np.where(observed[target[group[blank]]], X[blank], np.nan)
    logger.info("client %r: %d row(s) of missingness patterns held by fewer than "
                "min_records_per_block=%d records merged into a common pattern, %d left out "
                "(the rare-pattern rule; the values stay here)", client, int(blank.sum()), t,
                int((~keep).sum()))
    out = data.replace(X=X)
    return out if keep.all() else out.take(np.flatnonzero(keep))
