"""Latent class analysis with concomitant variables (poLCA's covariates, issue 43): the federated
fit equals a centralized EM with the same Newton step written here (1, 5 and 12 rounds), beats
constant weights on held-out rows when the classes depend on the covariate, and its standard
errors are the inverse of the observed log-likelihood's Hessian (by finite differences)."""

import json
import warnings

import numpy as np
import pytest
from scipy import special

import fedlatent as fl

OFF = fl.DisclosurePolicy.off()
PROBS = np.array([[0.8, 0.15, 0.05, 0.7, 0.3, 0.6, 0.2, 0.2],
                  [0.1, 0.3, 0.6, 0.2, 0.8, 0.1, 0.1, 0.8]])  # 3 variables: 3, 2, 3 levels
CATS = [3, 2, 3]


def survey(seed=0, n_clients=10, slope=2.5):
    """Answers to three questions from two classes; the class a logit of the covariate z."""
    rng = np.random.default_rng(seed)
    off = np.r_[0, np.cumsum(CATS)]
    data = {}
    for c in range(n_clients):
        n = int(rng.integers(40, 120))
        z = rng.normal(size=n)
        k = (rng.random(n) < special.expit(0.3 + slope * z)).astype(int)
        X = np.column_stack([[rng.choice(CATS[j], p=PROBS[kk, off[j]:off[j + 1]]) for kk in k]
                             for j in range(3)]).astype(float)
        data[f"c{c}"] = np.column_stack([X, z])
    return fl.FederatedDataset.from_arrays(data, feature_names=["q1", "q2", "q3", "z"])


def fit_quietly(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, progress=False, **kw)


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def one_hot(X):
    return np.hstack([np.eye(r)[X[:, j].astype(int)] for j, r in enumerate(CATS)])


def loglik_rows(Z, Zt, probs, gamma):
    logits = np.hstack([np.zeros((len(Zt), 1)), Zt @ gamma.T])
    lp = logits - special.logsumexp(logits, axis=1, keepdims=True)
    lp = lp + Z @ np.log(probs).T
    ll = special.logsumexp(lp, axis=1)
    return ll, np.exp(lp - ll[:, None])


def centralized_em(X, z, probs, gamma, T):
    """T iterations: E-step, counts over sums of responsibilities, one Newton step of the
    logit of the responsibilities on [z, 1] (its gradient and Hessian written out)."""
    Z, Zt = one_hot(X), np.column_stack([z, np.ones_like(z)])
    off = np.r_[0, np.cumsum(CATS)]
    out = []
    for _ in range(T):
        ll, r = loglik_rows(Z, Zt, probs, gamma)
        counts = r.T @ Z
        probs = np.hstack([counts[:, off[j]:off[j + 1]]
                           / counts[:, off[j]:off[j + 1]].sum(1, keepdims=True)
                           for j in range(3)])
        pi = special.softmax(np.column_stack([np.zeros(len(Zt)), Zt @ gamma.T]), axis=1)
        g = Zt.T @ (r[:, 1] - pi[:, 1])
        H = Zt.T @ (Zt * (pi[:, 1] * (1 - pi[:, 1]))[:, None])
        gamma = gamma + np.linalg.solve(H, g)[None, :]
        out.append({"probs": probs, "gamma": gamma, "weights": r.mean(0),
                    "objective": ll.mean()})
    return out


@pytest.mark.usefixtures("saturation_rule_off", "rare_level_rule_off")
@pytest.mark.parametrize("T", [1, 5, 12])
def test_federated_equals_centralized_newton_em(T):
    fd = survey()
    est = fl.LatentClassAnalysis(2, n_categories=CATS, concomitant=["z"], max_rounds=T,
                                 tol=0.0, random_state=3)
    p0 = est.initial_parameters(fd)
    np.testing.assert_allclose(p0["gamma"], [[0.0, np.log(p0["weights"][1]
                                                          / p0["weights"][0])]], rtol=1e-12)
    per_round = []
    fit_quietly(est, fd, callbacks=[
        lambda k, params, S, rec: per_round.append({n: v.copy() for n, v in params.items()})])
    P = fd.pooled().X
    ref = centralized_em(P[:, :3], P[:, 3], p0["probs"], p0["gamma"], T)
    worst = 0.0
    for t in range(T):
        for name in ("probs", "gamma", "weights"):
            worst = max(worst, rel(per_round[t][name], ref[t][name]))
        worst = max(worst, rel(est.history_[t].objective, ref[t]["objective"]))
    assert worst < 1e-8, worst


def test_concomitant_weights_beat_constant_weights_on_held_out_rows():
    train, test = survey(0), survey(1)
    kw = dict(n_categories=CATS, random_state=0, max_rounds=500, tol=1e-9,
              federation=fl.Federation(disclosure=OFF))
    conc = fit_quietly(fl.LatentClassAnalysis(2, concomitant=["z"], **kw), train)

    def without_z(fd):
        return fl.FederatedDataset({c: d.replace(X=d.X[:, :3]) for c, d in fd.items()},
                                   ["q1", "q2", "q3"])

    const = fit_quietly(fl.LatentClassAnalysis(2, **kw), without_z(train))
    # the same question answers: per row, log p(x | z) against log p(x)
    assert conc.score(test) > const.score(without_z(test)) + 0.05
    assert abs(conc.concomitant_coef_[1, 0]) > 1.5  # the slope (2.5 in truth) is found


@pytest.mark.parametrize("concomitant", [True, False])
def test_standard_errors_invert_the_observed_log_likelihoods_hessian(concomitant):
    """Louis' information is minus the Hessian of the observed log-likelihood: the standard
    errors equal those of a finite-difference Hessian in the free parameters (gamma, or the
    first weight, then each variable's probabilities but the last)."""
    fd = survey(2, n_clients=6)
    if not concomitant:
        fd = fl.FederatedDataset({c: d.replace(X=d.X[:, :3]) for c, d in fd.items()},
                                 ["q1", "q2", "q3"])
    est = fit_quietly(fl.LatentClassAnalysis(2, n_categories=CATS, random_state=0,
                                             concomitant=["z"] if concomitant else None,
                                             max_rounds=300, tol=1e-10,
                                             federation=fl.Federation(disclosure=OFF)), fd)
    P = fd.pooled().X
    Z = one_hot(P[:, :3])
    off = np.r_[0, np.cumsum(CATS)]
    free = [c for j in range(3) for c in range(off[j], off[j + 1] - 1)]
    n0 = 2 if concomitant else 1

    def total(theta):
        probs = np.zeros((2, off[-1]))
        for k in range(2):
            probs[k, free] = theta[n0 + k * len(free):n0 + (k + 1) * len(free)]
            for j in range(3):
                last = off[j + 1] - 1
                probs[k, last] = 1 - probs[k, off[j]:last].sum()
        if concomitant:
            Zt = np.column_stack([P[:, 3], np.ones(len(P))])
            return loglik_rows(Z, Zt, probs, theta[:2].reshape(1, 2))[0].sum()
        w = np.array([theta[0], 1 - theta[0]])
        return special.logsumexp(Z @ np.log(probs).T + np.log(w), axis=1).sum()

    head = (np.column_stack([est.concomitant_coef_, est.concomitant_intercept_])[1:].ravel()
            if concomitant else est.weights_[:1])
    theta = np.concatenate([head, est.probabilities_[0, free], est.probabilities_[1, free]])
    h = 1e-4
    n = theta.size
    E = np.eye(n) * h
    H = np.array([[(total(theta + E[a] + E[b]) - total(theta + E[a] - E[b])
                    - total(theta - E[a] + E[b]) + total(theta - E[a] - E[b])) / (4 * h * h)
                   for b in range(n)] for a in range(n)])
    se_fd = np.sqrt(np.diag(np.linalg.inv(-H)))
    bse = est.bse_
    ours = ([bse.loc[("1", "concomitant:z")], bse.loc[("1", "concomitant:intercept")]]
            if concomitant else [bse.loc[("0", "weight")]])
    ours += [bse.loc[(str(k), f"q{j + 1}={c}")] for k in range(2) for j in range(3)
             for c in range(CATS[j] - 1)]
    assert rel(ours, se_fd) < 1e-4
    table = est.summary().table
    assert list(table.columns[:2]) == ["coef", "std err"]
    assert table.loc[("0", "q1=0"), "coef"] == pytest.approx(est.probabilities_[0, 0])


def test_refusals_name_the_setting():
    fd = survey(n_clients=4)
    with pytest.raises(ValueError, match=r"model 'lca' sends statistics valid only at the "
                       r"parameters the server broadcast \(the concomitant model's gradient"
                       r".*participation=0\.5"):
        fl.LatentClassAnalysis(2, n_categories=CATS, concomitant=["z"],
                               federation=fl.Federation(participation=0.5)).fit(
            fd, progress=False)
    with pytest.raises(ValueError, match="concomitant logit's Newton statistics have no "
                       "per-record bound"):
        fl.LatentClassAnalysis(2, n_categories=CATS, concomitant=["z"], federation=(
            fl.Federation(privacy=fl.DifferentialPrivacy(1.0, 1e-5, clip=1.0)))).fit(
            fd, progress=False)


@pytest.mark.usefixtures("saturation_rule_off", "rare_level_rule_off")
def test_save_load_predicts_the_same(tmp_path):
    fd = survey(n_clients=4)
    est = fit_quietly(fl.LatentClassAnalysis(2, n_categories=CATS, concomitant=["z"],
                                             max_rounds=10, random_state=0), fd)
    est.save(tmp_path / "m")
    back = fl.LatentClassAnalysis.load(tmp_path / "m")
    X = fd.pooled().X
    np.testing.assert_allclose(back.predict_proba(X), est.predict_proba(X), rtol=1e-12)
    np.testing.assert_allclose(back.score_samples(X), est.score_samples(X), rtol=1e-12)


@pytest.mark.parametrize("edit", ["shape", "nan"])
def test_a_saved_concomitant_entry_of_another_shape_or_not_finite_is_refused(tmp_path, edit):
    fd = survey(n_clients=4)
    est = fit_quietly(fl.LatentClassAnalysis(2, n_categories=CATS, concomitant=["z"],
                                             max_rounds=5, random_state=0), fd)
    est.save(tmp_path / "m")
    path = tmp_path / "m.json"
    meta = json.loads(path.read_text())
    coef = meta["concomitant"]["coef"]
    meta["concomitant"]["coef"] = coef + coef if edit == "shape" else [[float("nan")]] * 2
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"entry 'concomitant' must hold finite coef \(2, 1\) "
                                         r"and intercept \(2,\)"):
        fl.LatentClassAnalysis.load(tmp_path / "m")
