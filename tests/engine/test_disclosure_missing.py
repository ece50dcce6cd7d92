"""Issue 25: the reconstruction attacks of test_disclosure_attacks run with missing values.

With NaN, a site's start sends per-column (pairwise) moments: a column observed on one or two
of its rows makes ``(nobs_jj, sx_j, sxx_jj)`` a sum over one or two values, which the attacks
invert. The default DisclosurePolicy drops those values at the site (the column counts as
missing there); DisclosurePolicy.off() lets the attack through."""

import numpy as np
import pytest

from fedlatent.data.client import ClientData
from fedlatent.engine.privacy import DisclosurePolicy, rows_from_one_record, rows_from_two_records
from fedlatent.models.gmm.math import compute_precision_cholesky
from fedlatent.models.gmm.model import GMMModel


def _site(n_seen, seed=0, n=20):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * 5 + 10
    X[n_seen:, 2] = np.nan  # column x2 observed on n_seen rows only
    return X


def _model(policy):
    m = GMMModel(2, "full")
    m.disclosure = policy
    return m


def _moments(X, policy):
    return _model(policy).client_query("moments", {"missing": 3}, ClientData(X), {}, None)[0]


@pytest.mark.parametrize("seed", range(3))
def test_one_value_column_attack(seed):
    X = _site(1, seed)
    raw = _moments(X, DisclosurePolicy.off())
    got = rows_from_one_record(raw["nobs"][2, 2], raw["sx"][2:3])
    assert got[0, 0] == pytest.approx(X[0, 2], rel=1e-12)  # the attack works
    safe = _moments(X, DisclosurePolicy())
    assert safe["nobs"][2, 2] == 0 and safe["sx"][2] == 0 and safe["sxx"][2, 2] == 0
    assert np.all(safe["nobs"][2] == 0) and np.all(safe["sxx"][:, 2] == 0)


@pytest.mark.parametrize("seed", range(3))
def test_two_value_column_attack(seed):
    X = _site(2, seed)
    raw = _moments(X, DisclosurePolicy.off())
    got = rows_from_two_records(raw["nobs"][2, 2], raw["sx"][2:3], raw["sxx"][2:3, 2:3])
    assert np.sort(got.ravel()) == pytest.approx(np.sort(X[:2, 2]), rel=1e-9)
    assert _moments(X, DisclosurePolicy())["sx"][2] == 0


def test_pair_seen_together_on_one_row_is_sent_as_never_together():
    X = _site(20)
    X[10:, 1] = np.nan  # x1 on rows 0..9, x2 on rows 9..19: together on row 9 only
    X[:9, 2] = np.nan
    safe = _moments(X, DisclosurePolicy())
    assert safe["nobs"][1, 2] == 0 and safe["sxx"][1, 2] == 0
    assert safe["nobs"][1, 1] == 10 and safe["nobs"][2, 2] == 11
    off = _moments(X, DisclosurePolicy.off())
    assert off["nobs"][1, 2] == 1 and off["sxx"][1, 2] == pytest.approx(X[9, 1] * X[9, 2])


def test_round_statistics_are_those_without_the_dropped_values():
    X = _site(2)
    params = {"weights": np.array([0.5, 0.5]), "means": np.array([[9.0] * 3, [11.0] * 3]),
              "precisions_cholesky": compute_precision_cholesky(np.stack([np.eye(3) * 20] * 2),
                                                                "full"),
              "center": np.full(3, 10.0)}
    m = _model(DisclosurePolicy())
    got = m.client_stats(params, ClientData(X), {}, None).stats
    Y = X.copy()
    Y[:, 2] = np.nan
    want = m.client_stats(params, ClientData(Y), {}, None).stats
    for k in ("nk", "sx", "sxx"):
        assert np.all(np.isfinite(got[k]))  # the missing-data E-step (no NaN sums)
        np.testing.assert_array_equal(got[k], want[k])
    off = _model(DisclosurePolicy.off()).client_stats(params, ClientData(X), {}, None).stats
    assert not np.allclose(off["sx"], got["sx"])
