"""Latent class regression: exactness against a centralized EM written here from the formulas,
additivity of the statistics, recovery of known lines, prediction against scipy, validation,
persistence, partial participation and the generic command line."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import fedlatent as fl
from fedlatent.data import ClientData
from fedlatent.engine import InProcessRuntime
from fedlatent.models.lcr import LCRModel
from fedlatent.models.lcr.math import lcr_m_step, lcr_statistics, solve_weighted_least_squares

K, D = 3, 2
REG = 1e-6


# ---- data ------------------------------------------------------------------------------------
TRUE_BETA = np.array([[2.0, -1.0, 5.0], [-1.5, 0.5, 15.0], [0.5, 2.0, -4.0]])  # (K, D + 1)
TRUE_SD = np.array([1.0, 1.5, 0.7])


def unequal_federation(n_clients=30, seed=0):
    """30 clients of 5..80 rows, each dominated by one component (label skew)."""
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(n_clients):
        n = int(rng.integers(5, 81))
        X = rng.uniform(-3, 3, size=(n, D))
        z = rng.choice(K, size=n, p=np.roll([0.7, 0.2, 0.1], c % K))
        y = (X * TRUE_BETA[z, :D]).sum(1) + TRUE_BETA[z, D] + TRUE_SD[z] * rng.normal(size=n)
        data[f"c{c:02d}"] = (X, y)
    return fl.FederatedDataset.from_arrays(data)


def two_lines(n_clients=10, seed=0):
    """y = 5 + 2x and y = 15 - x, noise sd 1, x ~ U(0, 10); clients skewed to one line."""
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(n_clients):
        n = int(rng.integers(30, 120))
        x = rng.uniform(0, 10, size=(n, 1))
        z = rng.random(n) < (0.15 + 0.7 * (c % 2))
        data[f"s{c}"] = (x, np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0]) + rng.normal(size=n))
    return fl.FederatedDataset.from_arrays(data)


def explicit_init(seed=1):
    rng = np.random.default_rng(seed)
    return dict(weights_init=np.full(K, 1 / K), coef_init=rng.normal(size=(K, D)),
                intercept_init=rng.normal(scale=5, size=K), noise_variance_init=np.full(K, 4.0))


# ---- centralized EM, written from the formulas (independent of fedlatent's math) -------------
def centralized_em(X, y, w, beta, var, T, reg=REG):
    """T iterations of EM for a mixture of linear regressions on the pooled rows.

    beta has the intercept as its last column. Returns the parameters after each iteration and
    the mean log-likelihood at the parameters each E-step used.
    """
    Xt = np.hstack([X, np.ones((X.shape[0], 1))])
    out = []
    for _ in range(T):
        mu = Xt @ beta.T                                               # (n, K)
        logp = (-0.5 * np.log(2 * np.pi * var) - 0.5 * (y[:, None] - mu) ** 2 / var
                + np.log(w))
        m = logp.max(1, keepdims=True)
        ll = m[:, 0] + np.log(np.exp(logp - m).sum(1))
        r = np.exp(logp - ll[:, None])
        nk = r.sum(0)
        new_beta = np.empty_like(beta)
        new_var = np.empty_like(var)
        for k in range(len(w)):
            A = Xt.T @ (r[:, k : k + 1] * Xt)
            b = Xt.T @ (r[:, k] * y)
            new_beta[k] = np.linalg.solve(A, b)
            res = y - Xt @ new_beta[k]
            new_var[k] = np.sum(r[:, k] * res**2) / nk[k] + reg
        w, beta, var = nk / nk.sum(), new_beta, new_var
        out.append({"weights": w, "beta": beta, "noise_variance": var, "objective": ll.mean()})
    return out


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def fit_quietly(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, progress=False, **kw)


# ---- (a) exactness ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fd30():
    fd = unequal_federation()
    sizes = list(fd.sizes().values())
    assert fd.n_clients == 30 and min(sizes) >= 5 and max(sizes) <= 80
    assert len(set(sizes)) > 15
    return fd


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("T", [1, 5, 10])
def test_full_participation_equals_centralized_em(fd30, T):
    init = explicit_init()
    per_round = []
    est = fl.LatentClassRegression(K, max_rounds=T, tol=0.0, reg_noise=REG, **init)
    fit_quietly(est, fd30, callbacks=[
        lambda k, params, S, rec: per_round.append({n: v.copy() for n, v in params.items()})])
    assert est.n_iter_ == T and len(per_round) == T
    pooled = fd30.pooled()
    beta0 = np.hstack([init["coef_init"], init["intercept_init"][:, None]])
    ref = centralized_em(pooled.X, pooled.y, init["weights_init"], beta0,
                         init["noise_variance_init"], T)
    worst = 0.0
    for t in range(T):
        for name in ("weights", "beta", "noise_variance"):
            worst = max(worst, rel(per_round[t][name], ref[t][name]))
        worst = max(worst, rel(est.history_[t].objective, ref[t]["objective"]))
    assert worst < 1e-8, worst
    np.testing.assert_allclose(est.coef_, ref[-1]["beta"][:, :D], rtol=1e-8)
    np.testing.assert_allclose(est.intercept_, ref[-1]["beta"][:, D], rtol=1e-8)
    np.testing.assert_allclose(est.noise_variance_, ref[-1]["noise_variance"], rtol=1e-8)
    np.testing.assert_allclose(est.weights_, ref[-1]["weights"], rtol=1e-8)


@pytest.mark.usefixtures("saturation_rule_off")
def test_random_membership_start_then_centralized_em(fd30):
    """The default start (random memberships drawn on the clients) followed by 5 rounds equals
    centralized EM from the start the same seed gives."""
    est = fl.LatentClassRegression(K, max_rounds=5, tol=0.0, random_state=3, n_init=1)
    p0 = est.initial_parameters(fd30)
    assert np.isclose(p0["weights"].sum(), 1.0) and np.all(p0["weights"] > 0.2)
    fit_quietly(est, fd30)
    pooled = fd30.pooled()
    ref = centralized_em(pooled.X, pooled.y, p0["weights"], p0["beta"], p0["noise_variance"], 5)
    assert rel(est.coef_, ref[-1]["beta"][:, :D]) < 1e-8
    assert rel(est.intercept_, ref[-1]["beta"][:, D]) < 1e-8
    assert rel(est.noise_variance_, ref[-1]["noise_variance"]) < 1e-8


@pytest.mark.usefixtures("saturation_rule_off")
def test_random_start_is_the_m_step_of_uniform_random_memberships(fd30):
    """Every client's memberships are its own seeded draw: the initial weights are near 1/K and
    the start does not depend on the order the clients are listed in."""
    est = fl.LatentClassRegression(K, random_state=5)
    p0 = est.initial_parameters(fd30)
    np.testing.assert_allclose(p0["weights"], 1 / K, atol=0.05)
    rev = fl.FederatedDataset({c: fd30[c] for c in reversed(fd30.client_ids)},
                              fd30.feature_names, fd30.target_name)
    p1 = fl.LatentClassRegression(K, random_state=5).initial_parameters(rev)
    for k in p0:
        np.testing.assert_allclose(p1[k], p0[k], rtol=1e-12)
    p2 = fl.LatentClassRegression(K, random_state=6).initial_parameters(fd30)
    assert not np.allclose(p2["beta"], p0["beta"])


# ---- (b) statistics --------------------------------------------------------------------------
def test_statistics_of_a_union_are_the_sums_of_statistics(fd30):
    model = LCRModel(K, True, REG)
    init = explicit_init()
    params = {"weights": init["weights_init"],
              "beta": np.hstack([init["coef_init"], init["intercept_init"][:, None]]),
              "noise_variance": init["noise_variance_init"]}
    a, b = fd30["c00"], fd30["c01"]
    union = ClientData(np.vstack([a.X, b.X]), np.concatenate([a.y, b.y]))
    sa = model.client_stats(params, a, {}, None)
    sb = model.client_stats(params, b, {}, None)
    su = model.client_stats(params, union, {}, None)
    assert (sa.stats + sb.stats).allclose(su.stats, rtol=1e-12, atol=1e-12)
    assert sa.n + sb.n == su.n
    assert sa.objective + sb.objective == pytest.approx(su.objective, rel=1e-12)
    assert set(su.stats.shapes.items()) == set(model.stat_shapes(params).items())


def test_statistics_are_the_weighted_sums_written_out():
    rng = np.random.default_rng(0)
    Xt = np.hstack([rng.normal(size=(40, 3)), np.ones((40, 1))])
    y = rng.normal(size=40)
    r = rng.dirichlet(np.ones(2), size=40)
    S = lcr_statistics(Xt, y, r)
    for k in range(2):
        assert S["nk"][k] == pytest.approx(sum(r[i, k] for i in range(40)))
        np.testing.assert_allclose(
            S["sxx"][k], sum(r[i, k] * np.outer(Xt[i], Xt[i]) for i in range(40)), rtol=1e-12)
        np.testing.assert_allclose(S["sxy"][k], sum(r[i, k] * Xt[i] * y[i] for i in range(40)),
                                   rtol=1e-12)
        assert S["syy"][k] == pytest.approx(sum(r[i, k] * y[i] ** 2 for i in range(40)))


def test_m_step_is_weighted_least_squares_and_scale_invariant():
    rng = np.random.default_rng(1)
    Xt = np.hstack([rng.normal(size=(60, 2)), np.ones((60, 1))])
    y = Xt @ [1.0, -2.0, 3.0] + rng.normal(size=60)
    r = rng.dirichlet(np.ones(2), size=60)
    S = lcr_statistics(Xt, y, r)
    w, beta, var = lcr_m_step(S, 0.0)
    for k in range(2):
        sw = np.sqrt(r[:, k])
        ref = np.linalg.lstsq(Xt * sw[:, None], y * sw, rcond=None)[0]
        np.testing.assert_allclose(beta[k], ref, rtol=1e-10)
        assert var[k] == pytest.approx(np.sum(r[:, k] * (y - Xt @ ref) ** 2) / r[:, k].sum(),
                                       rel=1e-9)
    np.testing.assert_allclose(w, r.sum(0) / 60, rtol=1e-12)
    w2, beta2, var2 = lcr_m_step(S / 60.0, 0.0)  # the engine passes mean statistics
    np.testing.assert_allclose(beta2, beta, rtol=1e-12)
    np.testing.assert_allclose(var2, var, rtol=1e-12)
    np.testing.assert_allclose(w2, w, rtol=1e-12)


def test_singular_design_falls_back_to_minimum_norm_least_squares():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(20, 1))
    Xt = np.hstack([x, x, np.ones((20, 1))])  # two identical columns
    y = 3 * x[:, 0] + 1
    A, b = Xt.T @ Xt, Xt.T @ y
    beta = solve_weighted_least_squares(A, b)
    np.testing.assert_allclose(beta, [1.5, 1.5, 1.0], atol=1e-8)


def test_empty_component_keeps_its_previous_parameters_with_weight_zero():
    rng = np.random.default_rng(3)
    Xt = np.hstack([rng.normal(size=(30, 1)), np.ones((30, 1))])
    y = rng.normal(size=30)
    r = np.zeros((30, 2))
    r[:, 0] = 1.0
    S = lcr_statistics(Xt, y, r)
    prev = {"beta": np.array([[0.0, 0.0], [7.0, 8.0]]), "noise_variance": np.array([1.0, 2.5])}
    w, beta, var = lcr_m_step(S, REG, previous=prev)
    np.testing.assert_array_equal(w, [1.0, 0.0])
    np.testing.assert_array_equal(beta[1], [7.0, 8.0])
    assert var[1] == 2.5 and np.all(np.isfinite(beta))
    with pytest.raises(ValueError, match=r"component\(s\) \[1\] received no rows"):
        lcr_m_step(S, REG)


# ---- (c) recovery ----------------------------------------------------------------------------
def test_recovers_two_known_lines_up_to_label_permutation():
    fd = two_lines()
    est = fl.LatentClassRegression(2, random_state=0, tol=1e-8, max_rounds=500)
    est.fit(fd, progress=False)
    assert est.converged_
    order = np.argsort(est.coef_[:, 0])[::-1]  # slope 2 first, slope -1 second
    np.testing.assert_allclose(est.coef_[order, 0], [2.0, -1.0], atol=0.05)
    np.testing.assert_allclose(est.intercept_[order], [5.0, 15.0], atol=0.3)
    np.testing.assert_allclose(est.noise_variance_, [1.0, 1.0], atol=0.2)
    np.testing.assert_allclose(est.weights_, [0.5, 0.5], atol=0.1)


# ---- (d) prediction --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted(fd30):
    est = fl.LatentClassRegression(K, max_rounds=100, tol=1e-8, random_state=0,
                                   federation=fl.Federation(disclosure=fl.DisclosurePolicy(
                                       max_parameters_per_record=np.inf)))  # 5-row clients
    return fit_quietly(est, fd30)


def test_prediction_against_scipy_and_by_hand(fitted, fd30):
    est = fitted
    X, y = fd30["c03"].X, fd30["c03"].y
    dens = np.column_stack([
        est.weights_[k] * stats.norm(X @ est.coef_[k] + est.intercept_[k],
                                     np.sqrt(est.noise_variance_[k])).pdf(y)
        for k in range(K)])
    np.testing.assert_allclose(est.score_samples(X, y), np.log(dens.sum(1)), rtol=1e-10)
    proba = est.predict_proba(X, y)
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(proba, dens / dens.sum(1, keepdims=True), rtol=1e-8, atol=1e-14)
    lines = X @ est.coef_.T + est.intercept_
    np.testing.assert_allclose(est.predict_components(X), lines, rtol=1e-12)
    np.testing.assert_allclose(est.predict(X), lines @ est.weights_, rtol=1e-12)
    assert est.score(X, y) == pytest.approx(np.log(dens.sum(1)).mean(), rel=1e-10)
    n_par = K * (D + 1) + K + K - 1
    assert est.bic(X, y) == pytest.approx(-2 * np.log(dens.sum(1)).sum() + n_par * np.log(len(y)),
                                          rel=1e-10)
    assert est.aic(X, y) == pytest.approx(-2 * np.log(dens.sum(1)).sum() + 2 * n_par, rel=1e-10)


def test_federated_score_equals_the_pooled_score(fitted, fd30):
    pooled = fd30.pooled()
    assert fitted.score_dataset(fd30) == pytest.approx(fitted.score(pooled.X, pooled.y),
                                                       rel=1e-12)
    assert fitted.bic(fd30) == pytest.approx(fitted.bic(pooled.X, pooled.y), rel=1e-12)
    pred = fitted.predict_dataset(fd30)
    np.testing.assert_allclose(pred, fitted.predict(pooled.X), rtol=1e-12)


def test_fitted_model_found_the_three_lines(fitted):
    order = np.argsort(fitted.intercept_)
    np.testing.assert_allclose(fitted.intercept_[order], TRUE_BETA[[2, 0, 1], D], atol=0.5)
    np.testing.assert_allclose(fitted.coef_[order], TRUE_BETA[[2, 0, 1], :D], atol=0.2)


@pytest.mark.usefixtures("saturation_rule_off")
def test_stopping_at_the_symmetric_start_warns():
    """The random start is near the point where every component is the pooled regression; EM
    leaves it slowly, and a loose tol can stop there: the fit says so."""
    fd = unequal_federation()
    with pytest.warns(fl.ConvergenceWarning, match="nearly identical components"):
        fl.LatentClassRegression(K, tol=1e-3, random_state=0, init_params="random",
                                 n_init=1).fit(fd, progress=False)


def test_predict_checks_features_and_y(fitted):
    with pytest.raises(ValueError, match=r"X has 3 features, but this LatentClassRegression "
                                         r"was fitted with 2"):
        fitted.predict(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="y has 3 values for 2 rows of X"):
        fitted.score_samples(np.zeros((2, 2)), np.zeros(3))
    with pytest.raises(ValueError, match=r"y is required"):
        fitted.predict_proba(np.zeros((2, 2)), None)
    with pytest.raises(ValueError, match="not fitted yet"):
        fl.LatentClassRegression(2).predict(np.zeros((2, 2)))


# ---- (e) validation --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_components": 0}, "n_components must be an integer >= 1, got 0"),
        ({"fit_intercept": "yes"}, "fit_intercept must be True or False, got 'yes'"),
        ({"max_rounds": 0}, "max_rounds must be None or an integer >= 1, got 0"),
        ({"tol": -1.0}, "tol must be >= 0 or 'auto', got -1.0"),
        ({"reg_noise": -1e-3}, "reg_noise must be >= 0, got -0.001"),
        ({"random_state": "x"}, "random_state must be None, an integer or a numpy Generator"),
        ({"weights_init": [0.5, 0.6, 0.1]}, "weights_init must be 3 non-negative numbers "
                                            "summing to 1"),
        ({"coef_init": np.zeros((3, 5))}, r"coef_init must have shape \(3, 2\), got \(3, 5\)"),
        ({"intercept_init": np.zeros(2)}, r"intercept_init must have shape \(3,\), got \(2,\)"),
        ({"noise_variance_init": [1.0, 0.0, 1.0]}, "noise_variance_init must be 3 positive"),
        ({"fit_intercept": False, "intercept_init": np.zeros(3)},
         "intercept_init is given but fit_intercept=False"),
        ({"n_components": 5000}, "the federation has .* rows in all, fewer than n_components"),
    ],
)
def test_bad_parameters(fd30, kwargs, message):
    kw = {"n_components": K, **kwargs}
    with pytest.raises(ValueError, match=message):
        fl.LatentClassRegression(**kw).fit(fd30)


@pytest.mark.usefixtures("saturation_rule_off")
def test_init_does_not_write_back_into_parameters(fd30):
    init = explicit_init()
    est = fl.LatentClassRegression(K, max_rounds=2, **init)
    fit_quietly(est, fd30)
    assert est.get_params()["coef_init"] is init["coef_init"]


def test_data_without_target_is_refused():
    fd = fl.FederatedDataset.from_arrays({"a": np.zeros((5, 1)), "b": np.ones((5, 1))})
    with pytest.raises(ValueError, match="needs a target: the federated dataset has none"):
        fl.LatentClassRegression(2).fit(fd)


def test_bad_target_names_the_client():
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {c: (rng.normal(size=(10, 1)), rng.normal(size=10)) for c in ("a", "b", "c")})
    y = fd["b"].y.copy()
    y[[2, 5]] = np.inf  # (a NaN target is a row left out since issue 25)
    fd.clients["b"] = ClientData(fd["b"].X, y)  # past the dataset's own checks
    with pytest.raises(ValueError, match="client 'b': target 'y' has 2 NaN or infinite values; "
                                         "drop those rows"):
        fl.LatentClassRegression(2).fit(fd)
    fd.clients["b"] = ClientData(fd["b"].X, np.array(["u"] * 10, dtype=object))
    with pytest.raises(ValueError, match=r"client 'b': target 'y' is not numeric \(dtype "
                                         r"object\); encode it as numbers"):
        fl.LatentClassRegression(2).fit(fd)


# ---- (f) persistence -------------------------------------------------------------------------
def test_save_load_round_trip_without_pickle(tmp_path, fitted, fd30):
    fitted.save(tmp_path / "m")
    with np.load(tmp_path / "m.npz", allow_pickle=False) as z:
        assert set(z.files) == {"weights_", "coef_", "intercept_", "noise_variance_"}
    back = fl.LatentClassRegression.load(tmp_path / "m")
    X, y = fd30["c05"].X, fd30["c05"].y
    np.testing.assert_array_equal(back.score_samples(X, y), fitted.score_samples(X, y))
    np.testing.assert_array_equal(back.predict(X), fitted.predict(X))
    assert back.get_params() == fitted.get_params()
    assert back.n_iter_ == fitted.n_iter_ and len(back.history_) == len(fitted.history_)
    assert list(back.feature_names_in_) == list(fitted.feature_names_in_)
    assert back.lower_bound_ == pytest.approx(fitted.lower_bound_)


@pytest.mark.usefixtures("saturation_rule_off")
def test_save_load_without_intercept(tmp_path, fd30):
    est = fit_quietly(fl.LatentClassRegression(2, fit_intercept=False, max_rounds=5,
                                               random_state=0), fd30)
    np.testing.assert_array_equal(est.intercept_, [0.0, 0.0])
    est.save(tmp_path / "m")
    back = fl.LatentClassRegression.load(tmp_path / "m")
    assert back.fit_intercept is False
    X = fd30["c00"].X
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


# ---- (g) federation settings, privacy, command line ------------------------------------------
@pytest.mark.usefixtures("saturation_rule_off")
def test_partial_participation_runs_and_ends_near_the_full_fit(fd30):
    # half the clients a round, smoothed statistics (step 0.5): label-skewed clients make the
    # one-round estimate of the mean statistic noisy
    fed = fl.Federation(participation=0.5, step_size=0.5, random_state=1)
    part = fit_quietly(fl.LatentClassRegression(K, max_rounds=60, federation=fed,
                                                random_state=1), fd30)
    full = fit_quietly(fl.LatentClassRegression(K, max_rounds=100, tol=1e-8, random_state=1),
                       fd30)
    h = part.history_.to_frame()
    assert h["participants"].iloc[1:].max() < fd30.n_clients
    assert h["participants"].iloc[1:].min() >= 1
    assert np.all(np.isfinite(part.coef_)) and np.all(part.noise_variance_ > 0)
    pooled = fd30.pooled()
    assert part.score(pooled.X, pooled.y) == pytest.approx(full.score(pooled.X, pooled.y),
                                                           abs=0.01)
    np.testing.assert_allclose(np.sort(part.intercept_), np.sort(full.intercept_), atol=0.2)


@pytest.mark.usefixtures("saturation_rule_off")
def test_no_raw_row_leaves_a_client(fd30):
    rt = InProcessRuntime(fd30, record=True)
    fit_quietly(fl.LatentClassRegression(K, max_rounds=3, random_state=0), fd30, runtime=rt)
    ups = [(c, m) for d, c, _, m in rt.log if d == "up"]
    assert len(ups) >= 4 * fd30.n_clients
    for cid, msg in ups:
        cd = fd30[cid]
        rows = {tuple(np.round(r, 12)) for r in cd.X}
        ys = set(np.round(cd.y, 12).tolist())
        for key, v in msg.items():
            if not isinstance(v, np.ndarray):
                continue
            assert v.ndim == 0 or v.shape[0] in (K,), (cid, key, v.shape)
            if v.ndim >= 1 and v.shape[-1] == D:
                assert not any(tuple(np.round(r, 12)) in rows for r in v.reshape(-1, D))
            if cd.n_samples > 1:
                assert not any(float(np.round(u, 12)) in ys for u in v.ravel()), (cid, key)


def test_generic_command_line_fit_predict_score(tmp_path):
    from typer.testing import CliRunner

    from fedlatent.cli import app

    fd = two_lines(n_clients=6)
    df = fd.to_pandas(client="client").rename(columns={"x0": "x"})
    data = tmp_path / "f.csv"
    df.to_csv(data, index=False)
    out = tmp_path / "fit"
    runner = CliRunner()
    res = runner.invoke(app, ["fit", "lcr", "--data", str(data), "--client", "client",
                              "--features", "x", "--target", "y", "--out", str(out),
                              "--param", "n_components=2", "--param", "tol=1e-6"])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "model.json").read_text())
    assert meta["class"] == "LatentClassRegression"
    with np.load(out / "model.npz", allow_pickle=False) as z:
        np.testing.assert_allclose(np.sort(z["coef_"][:, 0]), [-1.0, 2.0], atol=0.1)
    res = runner.invoke(app, ["predict", "--model", str(out), "--data", str(data),
                              "--out", str(tmp_path / "pred.csv")])
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(tmp_path / "pred.csv")
    est = fl.LatentClassRegression.load(out / "model")
    np.testing.assert_allclose(pred["prediction"], est.predict(df[["x"]].to_numpy()),
                               rtol=1e-10)
    res = runner.invoke(app, ["score", "--model", str(out), "--data", str(data)])
    assert res.exit_code == 0, res.output
    assert "mean log-likelihood:" in res.output
    value = float(res.output.split("mean log-likelihood:")[1].split()[0])
    assert value == pytest.approx(est.score(df[["x"]].to_numpy(), df["y"].to_numpy()), rel=1e-10)
    res = runner.invoke(app, ["fit", "lcr", "--data", str(data), "--client", "client",
                              "--features", "x", "--out", str(tmp_path / "no")])
    assert res.exit_code == 2
    assert res.stderr.splitlines() == ["error: fit lcr needs --target COLUMN (the response)"]
