"""The reconstructions an honest-but-curious server can run on one client's statistics: each
succeeds exactly on raw statistics over one or two records (the attack works), the default
DisclosurePolicy refuses exactly those statistics, and DisclosurePolicy.off() lets them through.
The statistics are the models' own functions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from fedlatent.engine.privacy import (
    DisclosurePolicy,
    check_counts,
    check_saturation,
    record_from_regression_block,
    rows_from_one_record,
    rows_from_two_records,
)
from fedlatent.engine.protocol.numerics import add_intercept
from fedlatent.models.gmm.math import gmm_statistics
from fedlatent.models.lcr.math import lcr_statistics

D, K = 4, 3
CENTER = np.array([1.0, -2.0, 0.5, 3.0])


def _client(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)) * 5 + 10
    resp = softmax(rng.normal(size=(n, K)) * 2, axis=1)  # whatever the E-step gave
    return X, gmm_statistics(X, resp, CENTER, "full")


def _same_rows(A, B):
    """Rows of A equal rows of B in some order."""
    return min(np.abs(A - B).max(), np.abs(A[::-1] - B).max())


@pytest.mark.parametrize("seed", range(5))
def test_one_row_client_sends_its_row(seed):
    X, st = _client(1, seed)
    n = st["nk"].sum()
    rebuilt = rows_from_one_record(n, st["sx"], CENTER)
    assert np.abs(rebuilt - X).max() < 1e-12 * np.abs(X).max()
    msg = check_counts(DisclosurePolicy(), f"c{seed}", n, "round statistics")
    assert msg.startswith(f"client 'c{seed}': round statistics is a sum over fewer than "
                          f"min_records=3 records")
    assert check_counts(DisclosurePolicy.off(), f"c{seed}", n, "round statistics") is None


@pytest.mark.parametrize("seed", range(5))
def test_two_row_client_gives_both_rows_back_from_count_sum_and_outer_products(seed):
    X, st = _client(2, seed)
    n = st["nk"].sum()
    rebuilt = rows_from_two_records(n, st["sx"], st["sxx"], CENTER)
    assert _same_rows(rebuilt, X) < 1e-9 * np.abs(X).max()
    assert "sum over fewer than min_records=3 records" in check_counts(
        DisclosurePolicy(), "c", n, "round statistics")
    assert check_counts(DisclosurePolicy.off(), "c", n, "round statistics") is None


def test_at_the_threshold_the_two_row_attack_no_longer_finds_the_rows():
    X, st = _client(3, 0)
    n = st["nk"].sum()
    assert check_counts(DisclosurePolicy(), "c", n, "round statistics") is None  # 3 is allowed
    guess = rows_from_two_records(2, st["sx"], st["sxx"], CENTER)
    dist = np.linalg.norm(guess[:, None, :] - X[None], axis=2)
    assert dist.min() > 0.1  # no guessed row is near any true row


@pytest.mark.parametrize("seed", range(5))
def test_one_event_regression_block_gives_x_and_y_back(seed):
    rng = np.random.default_rng(seed)
    # an HLCR agent's cluster blocks: one entity with a single event lands in cluster 1
    x, y = rng.normal(size=D) * 3, float(rng.normal() * 7)
    Xt = add_intercept(x[None])
    xtx, xty = Xt.T @ Xt, Xt.T @ np.array([y])
    rx, ry = record_from_regression_block(xtx, xty)
    assert np.allclose(rx, Xt[0], rtol=0, atol=1e-12) and ry == pytest.approx(y, abs=1e-12)
    n_events = np.array([6.0, 1.0, 0.0])
    msg = check_counts(DisclosurePolicy(), "agent-2", n_events, "cluster blocks",
                       per_block=True)
    assert msg.startswith("client 'agent-2': a block of cluster blocks is a sum over fewer "
                          "than min_records_per_block=3 records")
    # the same block is also saturated: D + 1 coefficients from 1 record
    assert "has 5 coefficient(s) over 1 record(s)" in check_saturation(
        DisclosurePolicy(), "agent-2", D + 1, 1, "cluster 1's regression block")
    off = DisclosurePolicy.off()
    assert check_counts(off, "agent-2", n_events, "cluster blocks", per_block=True) is None
    assert check_saturation(off, "agent-2", D + 1, 1, "cluster 1's regression block") is None


def test_one_row_latent_class_regression_block_and_the_no_intercept_case():
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(1, D)), rng.normal(size=1) * 4
    resp = np.array([[0.0, 1.0, 0.0]])  # a hard membership: component 1 holds the row
    st = lcr_statistics(add_intercept(x), y, resp)
    rx, ry = record_from_regression_block(st["sxx"][1], st["sxy"][1])
    assert np.allclose(rx[:-1], x[0], atol=1e-12) and ry == pytest.approx(y[0], abs=1e-12)
    # without an intercept column, (x, y) come back up to one common sign
    st0 = lcr_statistics(x, y, resp)
    rx0, ry0 = record_from_regression_block(st0["sxx"][1], st0["sxy"][1], intercept_index=None)
    s = np.sign(rx0[0] * x[0, 0])
    assert np.allclose(s * rx0, x[0], atol=1e-9) and s * ry0 == pytest.approx(y[0], abs=1e-9)
    assert check_counts(DisclosurePolicy(), "c", st["nk"], "component counts",
                        per_block=True) is not None
