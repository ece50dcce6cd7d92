"""LatentClassRegression under differential privacy: the stated sensitivity bounds what one
record can do to a client's clipped statistics (rounds and initialization query), the shifted
coordinates change no parameter, a private fit spends at most its budget with reproducible or
fresh noise, is close to the non-private fit at a large epsilon, and the refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.dataset import ClientData
from fedlatent.engine.stats import Stats
from fedlatent.models.lcr.dp import adaptive_ridge, shift_for
from fedlatent.models.lcr.math import add_intercept, lcr_m_step, lcr_statistics
from fedlatent.models.lcr.model import LCRModel

LINES = np.array([[2.0, -1.0, 1.0], [-1.5, 0.5, -2.0]])  # (K, d + 1): slopes, then intercept


def _rows(rng, n, shift=0.0):
    X = rng.normal(size=(n, 2)) + shift
    z = rng.random(n) < 0.6
    y = np.where(z, X @ LINES[0, :2] + LINES[0, 2], X @ LINES[1, :2] + LINES[1, 2])
    return X, y + 0.3 * rng.standard_normal(n)


def _fd(n_clients=4, n=400, seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays({f"c{c}": _rows(rng, n, shift)
                                            for c in range(n_clients)})


def _dp(epsilon=1.0, **kw):
    kw.setdefault("clip", 3.5)
    kw.setdefault("target_range", (-8.0, 9.0))
    return fl.DifferentialPrivacy(epsilon, 1e-5, **kw)


def _model(dp, d=2, fit_intercept=True, K=2):
    m = LCRModel(K, fit_intercept, dp={"n_features": d,
                                       "shift": shift_for(dp, d, fit_intercept)})
    m.privacy = dp
    return m


def _params(fit_intercept=True):
    beta = LINES if fit_intercept else LINES[:, :2]
    return {"weights": np.array([0.6, 0.4]), "beta": beta.copy(),
            "noise_variance": np.array([0.5, 1.5])}


# ---- (1) sensitivity: one record replaced by an arbitrarily large one ------------------------
@pytest.mark.parametrize("fit_intercept,center", [(True, None), (True, (1.0, -2.0)),
                                                  (False, (0.5, 0.5))])
def test_one_record_moves_the_clipped_statistics_by_at_most_twice_the_bound(fit_intercept,
                                                                            center):
    dp = _dp(center=center)
    model = _model(dp, fit_intercept=fit_intercept)
    rng = np.random.default_rng(1)
    X, y = _rows(rng, 60)
    data = ClientData(X, y)
    params = _params(fit_intercept)
    bound = model.dp_sensitivity(params, dp)
    base = model.client_stats(params, model.dp_clip(data, dp), {}, rng).stats
    q_bound = model.dp_query_sensitivity("random_stats", {}, dp)
    p_bound = model.dp_query_sensitivity("pooled_stats", {}, dp)
    assert q_bound == p_bound == {f"stat/{k}": v for k, v in bound.items()}

    def query(name, d):
        return model.client_query(name, {}, model.dp_clip(d, dp), {},
                                  np.random.default_rng(7))[0]

    q_base = {name: query(name, data) for name in ("random_stats", "pooled_stats")}
    worst = dict.fromkeys(bound, 0.0)
    for _ in range(50):
        i = int(rng.integers(X.shape[0]))
        X2, y2 = X.copy(), y.copy()
        X2[i] = rng.normal(scale=1e6, size=2)
        y2[i] = rng.normal(scale=1e6)
        other = ClientData(X2, y2)
        moved = model.client_stats(params, model.dp_clip(other, dp), {}, rng).stats
        for k in bound:
            change = float(np.linalg.norm(moved[k] - base[k]))
            assert change <= 2 * bound[k] * (1 + 1e-9), (k, change, bound[k])
            worst[k] = max(worst[k], change / bound[k])
        for name, sens in (("random_stats", q_bound), ("pooled_stats", p_bound)):
            rep = query(name, other)
            assert rep["n"] == q_base[name]["n"]  # public: the client's size
            for f, b in sens.items():
                assert np.linalg.norm(rep[f] - q_base[name][f]) <= 2 * b * (1 + 1e-9), (name, f)
    # the bounds are not vacuous: a replaced record comes within a factor 4 of them
    assert min(worst.values()) > 0.25, worst


def test_sensitivity_values_follow_the_clip_and_the_target_range():
    dp = _dp(clip=2.0, target_range=(-1.0, 5.0), center=(3.0, 4.0))
    # with an intercept: x - c and y - 2 (the middle of the range): a^2 = 2^2 + 1, B = 3
    assert _model(dp).dp_sensitivity(_params(), dp) == pytest.approx(
        {"nk": 1.0, "sxx": 5.0, "sxy": np.sqrt(5.0) * 3.0, "syy": 9.0})
    # without: widened by ||c|| = 5, B = max(|lo|, |hi|) = 5
    assert _model(dp, fit_intercept=False).dp_sensitivity(_params(False), dp) == pytest.approx(
        {"nk": 1.0, "sxx": 49.0, "sxy": 35.0, "syy": 25.0})


def test_shifted_statistics_give_the_same_m_step_as_the_plain_ones():
    """The shift is a change of coordinates: on exact statistics the private model's M-step
    returns the non-private parameters (to rounding)."""
    dp = _dp(center=(0.7, -1.2), target_range=(-3.0, 11.0))
    model = _model(dp)
    rng = np.random.default_rng(3)
    X, y = _rows(rng, 500, shift=0.5)
    params = _params()
    resp = rng.dirichlet(np.ones(2), size=X.shape[0])  # any responsibilities, same for both
    plain = lcr_statistics(add_intercept(X), y, resp)
    Xs = add_intercept(X)
    Xs[:, :2] -= np.array([0.7, -1.2])
    shifted = lcr_statistics(Xs, y - 4.0, resp)
    w0, b0, v0 = lcr_m_step(plain / 500.0, 1e-6, previous=params)
    got = model.server_step(Stats(shifted) / 500.0, params, 500)
    np.testing.assert_allclose(got["weights"], w0, rtol=1e-12)
    np.testing.assert_allclose(got["beta"], b0, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["noise_variance"], v0, rtol=1e-9)


def test_noisy_m_step_survives_negative_counts_and_indefinite_moments():
    model = _model(_dp())
    params = _params()
    S = {"nk": np.array([0.7, -0.05]), "sxx": np.zeros((2, 3, 3)), "sxy": np.zeros((2, 3)),
         "syy": np.array([2.0, -1.0])}
    S["sxx"][0] = np.diag([1.0, 1.0, 0.7])
    S["sxx"][0, 0, 1] = S["sxx"][0, 1, 0] = 1.5  # indefinite: eigenvalues -0.5 and 2.5
    S["sxy"][0] = [0.3, -0.2, 0.1]
    got = model.server_step(Stats(S), params, 1000)
    assert got["weights"].tolist() == [1.0, 0.0]  # the negative count is an empty component
    np.testing.assert_allclose(got["beta"][1], params["beta"][1])  # which keeps its line
    assert np.all(np.isfinite(got["beta"])) and np.all(got["noise_variance"] > 0)


# ---- (2) a private fit end to end ------------------------------------------------------------
def _fit(fd, dp, rounds=4, **kw):
    est = fl.LatentClassRegression(2, max_rounds=rounds, tol=0.0, random_state=0,
                                   federation=fl.Federation(privacy=dp), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd)


def test_a_private_fit_spends_at_most_its_budget_with_reproducible_or_fresh_noise():
    fd = _fd()
    a = _fit(fd, _dp(1.0, noise_seed=5))
    eps, delta = a.privacy_spent_
    assert eps <= 1.0 and delta == 1e-5
    assert a.privacy_calibration_.releases == 4 + 1  # the rounds and the private start
    h = a.history_.to_frame()
    assert len(h) == 4 and np.all(np.diff(h["epsilon"]) > 0)
    assert h["epsilon"].iloc[-1] == pytest.approx(eps, rel=1e-12)
    assert eps > 0.99  # the plan spends the whole budget
    assert np.all(np.isnan(h["objective"]))  # withheld
    b = _fit(fd, _dp(1.0, noise_seed=5))
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.noise_variance_, b.noise_variance_)
    c, d = _fit(fd, _dp(1.0)), _fit(fd, _dp(1.0))  # the operating system's noise
    assert not np.array_equal(c.coef_, d.coef_)


def test_explicit_initial_parameters_spend_no_initialization_release():
    fd = _fd(n_clients=3, n=200)
    est = _fit(fd, _dp(2.0, noise_seed=0), rounds=3, weights_init=[0.5, 0.5],
               coef_init=LINES[:, :2], intercept_init=LINES[:, 2],
               noise_variance_init=[1.0, 1.0])
    assert est.privacy_calibration_.releases == 3
    assert est.privacy_spent_[0] <= 2.0


# ---- (3) utility at a large epsilon ----------------------------------------------------------
def test_private_fit_at_large_epsilon_is_close_to_the_non_private_fit():
    """Epsilon 1e3 over 6 releases is still a noise multiplier of about 0.1; the residual
    variances (differences of large sums of y^2 with sensitivity B^2 = 72) are what it
    blurs most at 6000 records."""
    fd, test = _fd(n=1500, seed=0), _fd(n_clients=2, n=1000, seed=9)
    Xt, yt = test.pooled().X, test.pooled().y
    plain = fl.LatentClassRegression(2, max_rounds=200, tol=1e-8, random_state=0).fit(fd)
    private = _fit(fd, _dp(1e3, noise_seed=1), rounds=5)
    mse_plain = np.mean((plain.predict(Xt) - yt) ** 2)
    mse_private = np.mean((private.predict(Xt) - yt) ** 2)
    assert mse_private == pytest.approx(mse_plain, rel=0.005)
    ll_plain, ll_private = plain.score(Xt, yt), private.score(Xt, yt)
    assert ll_private == pytest.approx(ll_plain, rel=0.05)
    order = np.argsort(private.intercept_)  # the lines themselves, up to label switching
    np.testing.assert_allclose(private.coef_[order], LINES[[1, 0], :2], atol=0.05)
    np.testing.assert_allclose(private.intercept_[order], LINES[[1, 0], 2], atol=0.05)


# ---- (4) refusals ----------------------------------------------------------------------------
def test_refuses_without_a_target_range():
    dp = fl.DifferentialPrivacy(1.0, 1e-5, clip=3.0)
    with pytest.raises(ValueError, match=r"LatentClassRegression under differential privacy "
                                         r"needs DifferentialPrivacy\(target_range=\(lo, hi\)\)"):
        _fit(_fd(n_clients=2, n=50), dp)


def test_refuses_auto_size_under_privacy():
    est = fl.LatentClassRegression("auto", max_rounds=2,
                                   federation=fl.Federation(privacy=_dp()))
    with pytest.raises(ValueError, match="LatentClassRegression: n_components='auto' is chosen "
                                         "by the BIC on log-likelihoods released outside the "
                                         "privacy budget"):
        est.fit(_fd(n_clients=2, n=50))


def test_the_loglik_query_has_no_declared_sensitivity():
    dp = _dp()
    assert _model(dp).dp_query_sensitivity("loglik", {}, dp) is None
    with pytest.raises(ValueError, match=r"built without its differential-privacy config"):
        LCRModel(2).dp_sensitivity(_params(), dp)


def test_adaptive_ridge_lifts_only_the_directions_the_noise_swamps():
    A = np.stack([np.diag([5.0, 0.1]), np.diag([5.0, 3.0])])
    out = adaptive_ridge(A, 1.0)
    np.testing.assert_allclose(out[0], np.diag([5.0, 1.0]))  # lambda_min lifted to tau only
    np.testing.assert_array_equal(out[1], A[1])  # well determined: unchanged
    np.testing.assert_array_equal(adaptive_ridge(A, 0.0), A)


def test_the_m_step_uses_the_planned_ridge_and_passes_it_on():
    model = _model(_dp())
    params = {**_params(), "dp_ridge": np.array(50.0)}
    S = {"nk": np.array([600.0, 400.0]), "sxx": np.zeros((2, 3, 3)),
         "sxy": np.array([[60.0, 1.0, 30.0], [-50.0, 2.0, -40.0]]),
         "syy": np.array([900.0, 800.0])}
    S["sxx"][:] = np.diag([300.0, 1.0, 1.0])  # the second feature barely varies: swamped
    S["sxx"][:, 2, 2] = S["nk"]
    plain = model.server_step(Stats(S) / 1000.0, _params(), 1000)
    ridged = model.server_step(Stats(S) / 1000.0, params, 1000)
    assert ridged["dp_ridge"] == 50.0
    # the shifted slope on the swamped feature is solved with 1 + (50 - 1) = 50, not 1
    assert abs(ridged["beta"][0, 1]) < 0.1 * abs(plain["beta"][0, 1])
    assert ridged["beta"][0, 1] == pytest.approx(S["sxy"][0, 1] / 50.0, rel=1e-9)
    np.testing.assert_allclose(ridged["beta"][:, [0, 2]], plain["beta"][:, [0, 2]], rtol=1e-9)
