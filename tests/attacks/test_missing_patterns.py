"""Missingness patterns count as records (issue 39, item 5): an honest-but-curious server
rebuilds no record of a rare missingness pattern from what a default missing-data fit sends.

The attacker: for one Gaussian component, a row missing coordinate ``m`` adds to the round's
``sum x_m`` its conditional mean ``mu_m + S_mo S_oo^-1 (x_o - mu_o)``, affine in its observed
values ``x_o`` with coefficients the server computes from the parameters it sent; the complete
rows add a constant (after the centring the server also knows). Every round is one linear
equation in ``(constant, x_o)``: a few rounds solve it. The attacker computes each round's
coefficients with the library's own missing-data E-step (public math) and solves by least
squares over every recorded round, for every column; a guess whose residual vanishes is one
it trusts.

Positive control: with the rule off (``min_records_per_block=1``) it rebuilds the row to 1e-8.
Under the library's defaults it rebuilds nothing, and no reply of the site changes when the
rare rows' values change (no statistic isolates them).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from attacks.attacker import client_statistics
from attacks.transcript import record_fit
from fedlatent.data.client import ClientData
from fedlatent.engine.privacy.patterns import merge_rare_patterns, rare_pattern_plan
from fedlatent.engine.protocol.messages import unpack
from fedlatent.models.gmm.math import covariances_from_precisions
from fedlatent.models.gmm.missing import missing_statistics

RULE_OFF = fl.DisclosurePolicy(min_records_per_block=1)


def _federation(rare_rows=1, seed=0, d=2):
    """Three sites of 200 rows; the target's first ``rare_rows`` rows miss coordinate 1."""
    rng = np.random.default_rng(seed)
    A = np.array([[1.0, 0.8, 0.2], [0.0, 0.6, 0.3], [0.0, 0.0, 0.5]])[:d, :d]
    parts = {f"s{i}": rng.normal(size=(200, d)) @ A + [1.0, -2.0, 0.5][:d] for i in range(3)}
    truth = parts["s0"][:rare_rows].copy()
    parts["s0"][:rare_rows, 1] = np.nan
    return fl.FederatedDataset.from_arrays(parts), truth


def _fit(fd, disclosure=None):
    fed = None if disclosure is None else fl.Federation(disclosure=disclosure)
    est = fl.FederatedGaussianMixture(1, max_rounds=6, tol=0.0, random_state=0, federation=fed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return record_fit(est, fd)


def _row_part(params, x_obs, m, d):
    """``sum x_m`` of one row observed on every coordinate but ``m`` (the library's E-step)."""
    row = np.full((1, d), np.nan)
    row[0, np.arange(d) != m] = x_obs
    cov = covariances_from_precisions(params["precisions_cholesky"], "full")
    stats, _ = missing_statistics(row, {**params, "covariances": cov}, "full")
    return float(stats["sx"][0, m])


def attack_rare_row(tr, client, d):
    """``[(column, guess of the observed values, relative residual)]``: for each column ``m``,
    the observed values of a row missing ``m`` that best explain every recorded round."""
    rounds = [(f, msg) for kind, f, msg in client_statistics(tr, client) if kind == "estep"]
    out = []
    for m in range(d):
        rows, rhs = [], []
        for fields, msg in rounds:
            p = unpack(msg, "params")
            if not p:
                continue
            n, c = float(fields["nk"].sum()), np.asarray(p["center"])
            base = _row_part(p, np.zeros(d - 1), m, d)  # affine: value at 0, then slopes
            slope = [_row_part(p, np.eye(d - 1)[j], m, d) - base for j in range(d - 1)]
            # sum x_m = (sum over the other rows of x_m) - (n - 1) c_m + the row's part
            rows.append([1.0, *slope])
            rhs.append(float(fields["sx"][0, m]) + (n - 1) * c[m] - base)
        A, b = np.array(rows), np.array(rhs)
        sol, *_ = np.linalg.lstsq(A, b, rcond=None)
        res = np.linalg.norm(A @ sol - b) / max(np.linalg.norm(b), 1e-300)
        out.append((m, sol[1:], float(res)))
    return out


def _best_error(guesses, truth_obs):
    return min(np.abs(g - truth_obs).max() for _, g, _ in guesses)


def test_positive_control_the_attacker_rebuilds_the_rare_row_when_the_rule_is_off():
    fd, truth = _federation()
    tr = _fit(fd, RULE_OFF)
    assert tr.error is None
    (m, guess, res), = [g for g in attack_rare_row(tr, "s0", 2) if g[0] == 1]
    assert res < 1e-10  # the attacker knows it is right
    assert np.abs(guess - truth[0, [0]]).max() < 1e-8


def test_under_the_defaults_no_rare_pattern_row_is_rebuilt():
    fd, truth = _federation()
    tr = _fit(fd)
    assert tr.error is None
    guesses = attack_rare_row(tr, "s0", 2)
    assert len(guesses) == 2 and _best_error(guesses, truth[0, [0]]) > 1e-3


@pytest.mark.parametrize("rare_rows", [1, 2])
def test_no_reply_changes_when_the_rare_rows_values_change(rare_rows):
    """Two rows sharing a pattern (the moments query's pairwise counts announced them) or one:
    every reply of the site is the same whatever their values; with the rule off they differ."""
    def replies(shift, disclosure=None):
        fd, _ = _federation(rare_rows)
        parts = {c: fd[c].X.copy() for c in fd.client_ids}
        parts["s0"][:rare_rows, 0] += shift
        tr = _fit(fl.FederatedDataset.from_arrays(parts), disclosure)
        out = [[np.ravel(np.asarray(v, dtype=float)) for k, v in sorted(e.up.items())
                if np.asarray(v).dtype.kind == "f"] for e in tr.of("s0")]
        return [np.concatenate(a) for a in out if a]

    same, moved = replies(0.0), replies(5.0)
    assert len(same) == len(moved) > 5
    for a, b in zip(same, moved):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    off_same, off_moved = replies(0.0, RULE_OFF), replies(5.0, RULE_OFF)
    assert max(np.abs(a - b).max() for a, b in zip(off_same, off_moved)) > 1e-3


def test_a_rare_pattern_merges_into_the_common_pattern_with_most_observed_columns():
    observed = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 0, 1]], bool)
    counts = np.array([50, 2, 9, 1, 4])
    # [1,1,0] (2 rows) observes {0, 1}: of the common patterns only [1,0,0] fits inside it;
    # [0,1,1] (1 row) holds no common pattern: left out
    assert rare_pattern_plan(observed, counts, 3).tolist() == [0, 2, 2, -1, 4]
    assert rare_pattern_plan(observed, counts, 1).tolist() == [0, 1, 2, 3, 4]


def test_after_the_rule_every_pattern_column_and_pair_covers_enough_records():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 4))
    X[rng.random(X.shape) < 0.15] = np.nan
    X = X[~np.isnan(X).all(axis=1)]
    out = merge_rare_patterns(ClientData(X), fl.DisclosurePolicy(min_records_per_block=5)).X
    M = ~np.isnan(out)
    _, counts = np.unique(M, axis=0, return_counts=True)
    assert counts.min() >= 5 and out.shape[0] < X.shape[0]
    nobs = M.T.astype(int) @ M.astype(int)  # the moments query's pairwise counts
    assert np.all((nobs == 0) | (nobs >= 5))
    kept = ~np.isnan(out)  # a value is only ever dropped, never invented
    assert np.all(np.isin(out[kept], X[~np.isnan(X)]))
    assert merge_rare_patterns(ClientData(X), fl.DisclosurePolicy.off()).X is X
