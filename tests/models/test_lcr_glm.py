"""Latent class regression with Poisson and binomial components and concomitant variables
(issue 43): one component against statsmodels' GLM and MNLogit, the federated generalized EM
against a centralized one written here from the formulas (1, 5 and 12 rounds), and against a
centralized EM whose M-step runs IRLS to convergence (flexmix's) from the same start."""

import warnings

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import special, stats

import fedlatent as fl

OFF = fl.DisclosurePolicy.off()


def fit_quietly(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, progress=False, **kw)


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


# ---- data ------------------------------------------------------------------------------------
BETA = {"poisson": np.array([[0.6, -0.4, 1.2], [-0.5, 0.3, 0.2]]),
        "binomial": np.array([[1.5, -1.0, 1.0], [-1.0, 0.5, -1.0]])}


def mixture_fd(family, n_clients=12, seed=0, concomitant=False, k_true=2):
    """Unequal clients (25..90 rows) of a two-component GLM mixture in two features, each
    client skewed to one component; an offset (Poisson) or trials (binomial) column, and with
    ``concomitant`` a covariate z that moves the class probabilities."""
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(n_clients):
        n = int(rng.integers(25, 91))
        X = rng.normal(size=(n, 2))
        z = rng.normal(size=n)
        p1 = special.expit(0.4 * (1 if c % 2 else -1) + (2.0 * z if concomitant else 0.0))
        k = (rng.random(n) < p1).astype(int)
        b = BETA[family][k]
        eta = (X * b[:, :2]).sum(1) + b[:, 2]
        if family == "poisson":
            extra = rng.uniform(-0.5, 0.5, size=n)  # log exposure
            y = rng.poisson(np.exp(eta + extra)).astype(float)
        else:
            extra = rng.integers(1, 9, size=n).astype(float)  # trials
            y = rng.binomial(extra.astype(int), special.expit(eta)).astype(float)
        cols = [X, z, extra] if concomitant else [X, extra]
        data[f"s{c:02d}"] = (np.column_stack(cols), y)
    names = ["x1", "x2", "z", "extra"] if concomitant else ["x1", "x2", "extra"]
    return fl.FederatedDataset.from_arrays(data, feature_names=names)


def role_kw(family, concomitant=False):
    kw = {"offset": "extra"} if family == "poisson" else {"trials": "extra"}
    kw["concomitant"] = ["z"] if concomitant else None
    return kw


def pooled_parts(fd):
    """x (n, 2), y, z (zeros without a z column), the offset or trials."""
    p = fd.pooled()
    z = p.X[:, 2] if p.X.shape[1] == 4 else np.zeros(p.n_samples)
    return p.X[:, :2], p.y, z, p.X[:, -1]


# ---- a centralized generalized EM, written from the formulas -----------------------------------
def log_density(family, eta, y, extra):
    if family == "poisson":
        return stats.poisson.logpmf(y[:, None], np.exp(eta + extra[:, None]))
    return stats.binom.logpmf(y[:, None], extra[:, None], special.expit(eta))


def mean_and_weight(family, eta, extra):
    if family == "poisson":
        mu = np.exp(eta + extra[:, None])
        return mu, mu
    p = special.expit(eta)
    return extra[:, None] * p, extra[:, None] * p * (1 - p)


def log_prior(w, gamma, Zt):
    if gamma is None:
        return np.log(w)[None, :]
    logits = np.hstack([np.zeros((Zt.shape[0], 1)), Zt @ gamma.T])
    return logits - special.logsumexp(logits, axis=1, keepdims=True)


def newton_component(family, Xt, y, extra, r, b):
    mu, v = mean_and_weight(family, (Xt @ b)[:, None], extra)
    g = Xt.T @ (r * (y - mu[:, 0]))
    H = Xt.T @ (Xt * (r * v[:, 0])[:, None])
    return b + np.linalg.solve(H, g)


def newton_concomitant(Zt, r, gamma):
    """One Newton step of the multinomial logit of the responsibilities on Zt, written with
    loops over the classes (class 0 the reference)."""
    K1, q = gamma.shape
    pi = np.exp(log_prior(None, gamma, Zt))
    g = np.concatenate([Zt.T @ (r[:, k] - pi[:, k]) for k in range(1, K1 + 1)])
    H = np.zeros((K1 * q, K1 * q))
    for a in range(1, K1 + 1):
        for b in range(1, K1 + 1):
            c = pi[:, a] * ((a == b) - pi[:, b])
            H[(a - 1) * q:a * q, (b - 1) * q:b * q] = Zt.T @ (Zt * c[:, None])
    return gamma + np.linalg.solve(H, g).reshape(K1, q)


def centralized_gem(family, X, y, z, extra, w, beta, gamma, T, full=False):
    """T iterations of EM on the pooled rows: E-step, then one Newton step per component and
    for the concomitant logit (``full``: Newton steps to convergence, flexmix's IRLS M-step)."""
    Xt = np.hstack([X, np.ones((X.shape[0], 1))])
    Zt = np.column_stack([z, np.ones_like(z)])
    out = []
    for _ in range(T):
        lp = log_density(family, Xt @ beta.T, y, extra) + log_prior(w, gamma, Zt)
        ll = special.logsumexp(lp, axis=1)
        r = np.exp(lp - ll[:, None])
        new = np.empty_like(beta)
        for k in range(beta.shape[0]):
            b = newton_component(family, Xt, y, extra, r[:, k], beta[k])
            for _ in range(100 if full else 0):
                b, b_old = newton_component(family, Xt, y, extra, r[:, k], b), b
                if np.max(np.abs(b - b_old)) < 1e-13:
                    break
            new[k] = b
        beta, w = new, r.sum(0) / r.shape[0]
        if gamma is not None:
            g = newton_concomitant(Zt, r, gamma)
            for _ in range(100 if full else 0):
                g, g_old = newton_concomitant(Zt, r, g), g
                if np.max(np.abs(g - g_old)) < 1e-13:
                    break
            gamma = g
        out.append({"weights": w, "beta": beta, "gamma": gamma, "objective": ll.mean()})
    return out


START = {"weights_init": np.array([0.5, 0.5]), "coef_init": np.array([[0.3, -0.1], [-0.2, 0.1]]),
         "intercept_init": np.array([0.5, -0.5])}


def start_beta():
    return np.hstack([START["coef_init"], START["intercept_init"][:, None]])


# ---- K = 1: statsmodels' GLM -------------------------------------------------------------------
def one_component(family, seed=3, weights=False):
    rng = np.random.default_rng(seed)
    data, w = {}, {}
    for c in range(5):
        n = 40 + 15 * c
        X = rng.normal(size=(n, 2))
        eta = 0.4 + X @ [0.5, -0.3]
        if family == "gaussian":
            extra, y = np.zeros(n), eta + rng.normal(size=n)
        elif family == "poisson":
            extra = rng.uniform(-0.5, 0.5, size=n)
            y = rng.poisson(np.exp(eta + extra)).astype(float)
        else:
            extra = rng.integers(1, 6, size=n).astype(float)
            y = rng.binomial(extra.astype(int), special.expit(eta)).astype(float)
        data[f"c{c}"] = (np.column_stack([X, extra]), y)
        w[f"c{c}"] = rng.integers(1, 4, size=n).astype(float)
    return fl.FederatedDataset.from_arrays(data, feature_names=["x1", "x2", "extra"],
                                           weights=w if weights else None)


@pytest.mark.parametrize("family, weights", [("gaussian", False), ("poisson", False),
                                             ("poisson", True), ("binomial", False),
                                             ("binomial", True)])
def test_one_component_is_statsmodels_glm(family, weights):
    """Coefficients and standard errors of statsmodels' GLM (same family, canonical link,
    offset or trials, frequency weights) to 1e-6. The Gaussian family's standard errors are
    GLM's at the maximum-likelihood scale SSR / n (GLM's default divides by n - p)."""
    fd = one_component(family, weights=weights)
    kw = ({"offset": "extra"} if family == "poisson" else {"trials": "extra"}
          if family == "binomial" else {"offset": "extra"})
    est = fl.LatentClassRegression(1, family=family, max_rounds=60, tol=1e-15, reg_noise=0.0,
                                   random_state=0, n_init=1,
                                   federation=fl.Federation(disclosure=OFF), **kw)
    fit_quietly(est, fd)
    P = fd.pooled()
    Xc = np.column_stack([P.X[:, :2], np.ones(P.n_samples)])
    fw = P.weight if weights else None
    if family == "binomial":
        model = sm.GLM(np.column_stack([P.y, P.X[:, 2] - P.y]), Xc,
                       family=sm.families.Binomial(), freq_weights=fw)
    else:
        model = sm.GLM(P.y, Xc, offset=P.X[:, 2], freq_weights=fw,
                       family=sm.families.Poisson() if family == "poisson"
                       else sm.families.Gaussian())
    res = model.fit(tol=1e-14)
    if family == "gaussian":
        nobs = P.n_samples if fw is None else fw.sum()
        res = model.fit(tol=1e-14, scale=float(np.sum((fw if fw is not None else 1.0)
                                                      * res.resid_response ** 2) / nobs))
    ours = np.concatenate([est.coef_[0], est.intercept_])
    assert rel(ours, res.params) < 1e-6
    se = est.bse_.loc["0"].drop(["weight", "noise_variance"], errors="ignore").to_numpy()
    assert rel(se, res.bse) < 1e-6
    assert est.score(fd) * P.mass() == pytest.approx(res.llf, rel=1e-9)


# ---- K >= 2: the same generalized EM, centralized ------------------------------------------------
@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("family, concomitant", [("poisson", False), ("binomial", False),
                                                 ("poisson", True), ("binomial", True)])
@pytest.mark.parametrize("T", [1, 5, 12])
def test_federated_equals_centralized_newton_em(family, concomitant, T):
    fd = mixture_fd(family, concomitant=concomitant)
    per_round = []
    est = fl.LatentClassRegression(2, family=family, max_rounds=T, tol=0.0, **START,
                                   **role_kw(family, concomitant))
    fit_quietly(est, fd, callbacks=[
        lambda k, params, S, rec: per_round.append({n: v.copy() for n, v in params.items()})])
    assert est.n_iter_ == T and len(per_round) == T
    X, y, z, extra = pooled_parts(fd)
    gamma0 = np.zeros((1, 2)) if concomitant else None  # the start's weights: log(w1 / w0) = 0
    ref = centralized_gem(family, X, y, z, extra, START["weights_init"], start_beta(),
                          gamma0, T)
    worst = 0.0
    for t in range(T):
        for name in ("weights", "beta") + (("gamma",) if concomitant else ()):
            worst = max(worst, rel(per_round[t][name], ref[t][name]))
        worst = max(worst, rel(est.history_[t].objective, ref[t]["objective"]))
    assert worst < 1e-8, worst


@pytest.mark.slow
@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("family, concomitant", [("poisson", False), ("binomial", True)])
def test_one_newton_step_a_round_reaches_flexmix_full_irls_em(family, concomitant):
    """From the same start, the federated generalized EM converges to a log-likelihood at
    least that of a centralized EM whose M-step runs IRLS to convergence (flexmix's), at the
    same optimum."""
    fd = mixture_fd(family, concomitant=concomitant, seed=5)
    est = fl.LatentClassRegression(2, family=family, max_rounds=3000, tol=1e-13, **START,
                                   **role_kw(family, concomitant))
    fit_quietly(est, fd)
    assert est.converged_
    X, y, z, extra = pooled_parts(fd)
    ref = centralized_gem(family, X, y, z, extra, START["weights_init"], start_beta(),
                          np.zeros((1, 2)) if concomitant else None, 3000, full=True)
    obj = [r["objective"] for r in ref]
    assert abs(obj[-1] - obj[-2]) < 1e-13  # converged too
    ours = est.score(fd)
    assert ours >= obj[-1] - 1e-10, (ours, obj[-1])
    assert rel(est.coef_, ref[-1]["beta"][:, :2]) < 1e-4


# ---- concomitant variables ---------------------------------------------------------------------
def separated_classes(seed=0):
    """Three classes whose Gaussian lines lie 100 apart (every posterior one-hot to the last
    bit), the class drawn by a multinomial logit of two covariates."""
    rng = np.random.default_rng(seed)
    data, labels = {}, []
    G = np.array([[0.0, 0.0, 0.0], [1.2, -0.8, 0.3], [-0.6, 1.0, -0.2]])  # (K, z1, z2, 1)
    for c in range(6):
        n = 80 + 10 * c
        Z = rng.normal(size=(n, 2))
        logits = np.column_stack([Z, np.ones(n)]) @ G.T
        k = np.array([rng.choice(3, p=p) for p in special.softmax(logits, axis=1)])
        x = rng.normal(size=n)
        y = 100.0 * k + x + rng.normal(size=n)
        data[f"c{c}"] = (np.column_stack([x, Z]), y)
        labels.append(k)
    return (fl.FederatedDataset.from_arrays(data, feature_names=["x", "z1", "z2"]),
            np.concatenate(labels))


def test_with_known_classes_the_concomitant_model_is_statsmodels_mnlogit():
    """Classes the components identify exactly (one-hot posteriors): the concomitant
    coefficients and their standard errors (Louis' information of the whole mixture) are
    statsmodels' MNLogit of the classes on the covariates, to 1e-6."""
    fd, labels = separated_classes()
    est = fl.LatentClassRegression(3, concomitant=["z1", "z2"], max_rounds=200, tol=1e-15,
                                   random_state=0, coef_init=np.ones((3, 1)),
                                   intercept_init=np.array([0.0, 100.0, 200.0]),
                                   weights_init=np.full(3, 1 / 3),
                                   noise_variance_init=np.ones(3),
                                   federation=fl.Federation(disclosure=OFF))
    fit_quietly(est, fd)
    Z = fd.pooled().X[:, 1:]
    res = sm.MNLogit(labels, np.column_stack([Z, np.ones(len(Z))])).fit(
        method="newton", tol=1e-14, maxiter=100, disp=False)
    ours = np.column_stack([est.concomitant_coef_, est.concomitant_intercept_])[1:]
    assert rel(ours, res.params.T) < 1e-6
    bse = est.bse_
    for k in (1, 2):
        se = [bse.loc[(str(k), f"concomitant:{n}")] for n in ("z1", "z2", "intercept")]
        assert rel(se, np.asarray(res.bse)[:, k - 1]) < 1e-6


def covariate_classes(seed, n_clients=8):
    rng = np.random.default_rng(seed)
    data = {}
    for c in range(n_clients):
        n = 120
        x, z = rng.uniform(0, 10, size=n), rng.normal(size=n)
        k = rng.random(n) < special.expit(3.0 * z)
        y = np.where(k, 5 + 2 * x, 15 - x) + 2.0 * rng.normal(size=n)
        data[f"c{c}"] = (np.column_stack([x, z]), y)
    return fl.FederatedDataset.from_arrays(data, feature_names=["x", "z"])


def x_only(fd):
    return fl.FederatedDataset({c: d.replace(X=d.X[:, :1]) for c, d in fd.items()}, ["x"],
                               fd.target_name)


def test_concomitant_weights_beat_constant_weights_on_held_out_rows():
    """Classes drawn by a logit of z: the concomitant model's held-out log-likelihood beats
    the same lines with constant weights (z left out of both regressions)."""
    train, test = covariate_classes(0), covariate_classes(1)
    common = dict(random_state=0, max_rounds=300, tol=1e-8,
                  federation=fl.Federation(disclosure=OFF))
    conc = fit_quietly(fl.LatentClassRegression(2, concomitant=["z"], **common), train)
    const = fit_quietly(fl.LatentClassRegression(2, **common), x_only(train))
    held_conc, held_const = conc.score(test), const.score(x_only(test))
    assert held_conc > held_const + 0.1, (held_conc, held_const)
    assert conc.concomitant_coef_[1, 0] ** 2 > 1.5 ** 2  # the logit's slope is found (3)
    np.testing.assert_allclose(np.sort(conc.coef_[:, 0]), [-1.0, 2.0], atol=0.1)


def test_broadcast_only_models_refuse_partial_participation_with_one_message():
    fd = mixture_fd("poisson")
    est = fl.LatentClassRegression(2, family="poisson", offset="extra",
                                   federation=fl.Federation(participation=0.5, step_size=0.5))
    with pytest.raises(ValueError, match=r"model 'lcr_glm' sends statistics valid only at the "
                       r"parameters the server broadcast \(the components' gradients and "
                       r"Hessians at the broadcast coefficients.*participation=0\.5; "
                       r"step_size=0\.5"):
        est.fit(fd, progress=False)


def test_differential_privacy_is_refused_with_the_reason():
    fd = mixture_fd("poisson")
    est = fl.LatentClassRegression(2, family="poisson", offset="extra", federation=fl.Federation(
        privacy=fl.DifferentialPrivacy(1.0, 1e-5, clip=5.0, target_range=(0, 50))))
    with pytest.raises(ValueError, match="grow without bound with mu = exp"):
        est.fit(fd, progress=False)


@pytest.mark.usefixtures("saturation_rule_off")
def test_secure_aggregation_gives_the_plain_fit():
    fd = mixture_fd("binomial", concomitant=True)
    kw = dict(max_rounds=6, tol=0.0, **START, **role_kw("binomial", True))
    plain = fit_quietly(fl.LatentClassRegression(2, family="binomial", **kw), fd)
    sec = fit_quietly(fl.LatentClassRegression(
        2, family="binomial", federation=fl.Federation(secure_aggregation=True), **kw), fd)
    assert rel(sec.coef_, plain.coef_) < 1e-6
    assert rel(sec.concomitant_coef_[1:], plain.concomitant_coef_[1:]) < 1e-6


@pytest.mark.usefixtures("saturation_rule_off")
def test_weights_missing_targets_and_save_load(tmp_path):
    """A row of frequency weight 2 is the row twice; a NaN target leaves its row out; a saved
    fit predicts what the fitted one does (concomitant coefficients included)."""
    fd = mixture_fd("poisson", concomitant=True, n_clients=6)
    kw = dict(max_rounds=5, tol=0.0, **START, **role_kw("poisson", True))
    twice = fl.FederatedDataset.from_arrays(
        {c: (np.vstack([d.X, d.X[:10]]), np.concatenate([d.y, d.y[:10]])) for c, d in fd.items()},
        feature_names=fd.feature_names)
    weighted = fl.FederatedDataset.from_arrays(
        {c: (d.X, d.y) for c, d in fd.items()}, feature_names=fd.feature_names,
        weights={c: np.r_[np.full(10, 2.0), np.ones(d.n_samples - 10)] for c, d in fd.items()})
    a = fit_quietly(fl.LatentClassRegression(2, family="poisson", **kw), twice)
    b = fit_quietly(fl.LatentClassRegression(2, family="poisson", **kw), weighted)
    assert rel(b.coef_, a.coef_) < 1e-10
    assert rel(b.concomitant_coef_[1:], a.concomitant_coef_[1:]) < 1e-10
    holed = fl.FederatedDataset.from_arrays(
        {c: (np.vstack([d.X, d.X[:2]]), np.r_[d.y, np.nan, np.nan]) for c, d in fd.items()},
        feature_names=fd.feature_names)
    c_ = fit_quietly(fl.LatentClassRegression(2, family="poisson", **kw), holed)
    d_ = fit_quietly(fl.LatentClassRegression(2, family="poisson", **kw), fd)
    assert rel(c_.coef_, d_.coef_) < 1e-10
    d_.save(tmp_path / "m")
    back = fl.LatentClassRegression.load(tmp_path / "m")
    X = fd.pooled().X
    np.testing.assert_allclose(back.predict(X), d_.predict(X), rtol=1e-12)
    np.testing.assert_allclose(back.score_samples(X, fd.pooled().y),
                               d_.score_samples(X, fd.pooled().y), rtol=1e-12)
    assert np.isnan(back.noise_variance_).all()


def test_predict_is_the_mixture_mean_response():
    fd = mixture_fd("binomial", concomitant=True, n_clients=4)
    est = fit_quietly(fl.LatentClassRegression(2, family="binomial", max_rounds=5, **START,
                                               **role_kw("binomial", True),
                                               federation=fl.Federation(disclosure=OFF)), fd)
    X = fd.pooled().X
    b = np.column_stack([est.coef_, est.intercept_])
    g = np.column_stack([est.concomitant_coef_, est.concomitant_intercept_])
    pi = special.softmax(np.column_stack([X[:, 2], np.ones(len(X))]) @ g.T, axis=1)
    means = X[:, -1:] * special.expit(np.column_stack([X[:, :2], np.ones(len(X))]) @ b.T)
    np.testing.assert_allclose(est.predict(X), (pi * means).sum(1), rtol=1e-12)
    np.testing.assert_allclose(est.predict_components(X), means, rtol=1e-12)


@pytest.mark.parametrize("family, y, message", [
    ("poisson", -1.0, "negative values; a Poisson target is a count"),
    ("binomial", 9.0, r"values outside \[0, trials\]")])
def test_targets_outside_the_family_are_refused_naming_the_client(family, y, message):
    fd = mixture_fd(family, n_clients=3)
    bad = fl.FederatedDataset.from_arrays(
        {c: (d.X, np.r_[y, d.y[1:]]) for c, d in fd.items()}, feature_names=fd.feature_names)
    with pytest.raises(ValueError, match=f"client 's00': target 'y' has 1 {message}"):
        fl.LatentClassRegression(2, family=family, **role_kw(family)).fit(bad, progress=False)
