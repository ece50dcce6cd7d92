"""Issue 25: latent class analysis takes missing answers natively, as poLCA does: a missing
item drops out of that row's likelihood, and each variable's probabilities are the weighted
frequencies over the rows that answered it."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.client import ClientData
from fedlatent.engine.privacy.patterns import merge_rare_patterns

CATS = (3, 4, 2, 3)


def data(seed=0, rate=0.2):
    from fedlatent.models.lca.example import make_lca_data

    fd = make_lca_data(n_clients=6, mean_size=60, n_classes=3, n_categories=CATS,
                       random_state=seed)
    rng = np.random.default_rng(seed)
    out = {}
    for cid, cd in fd.items():
        X = np.asarray(cd.X, dtype=float).copy()
        X[rng.random(X.shape) < rate] = np.nan
        out[cid] = X
    return fl.FederatedDataset.from_arrays(out)


def em_missing(X, w, probs, rounds):
    """Centralized EM with missing answers (poLCA), written out here."""
    off = np.concatenate([[0], np.cumsum(CATS)])
    for _ in range(rounds):
        logp = np.tile(np.log(w), (X.shape[0], 1))
        for j in range(len(CATS)):
            seen = ~np.isnan(X[:, j])
            logp[seen] += np.log(probs[:, off[j] + X[seen, j].astype(int)]).T
        post = np.exp(logp - logp.max(axis=1, keepdims=True))
        post /= post.sum(axis=1, keepdims=True)
        w = post.sum(axis=0) / post.sum()
        probs = np.zeros_like(probs)
        for j in range(len(CATS)):
            seen = ~np.isnan(X[:, j])
            for r in range(CATS[j]):
                probs[:, off[j] + r] = post[X[:, j] == r].sum(0) / post[seen].sum(0)
    return w, probs


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_federated_fit_equals_centralized_em_with_missing_answers():
    fd = data()
    X = np.vstack([cd.X for _, cd in fd.items()])
    assert 0.15 < np.isnan(X).mean() < 0.25
    est = fl.LatentClassAnalysis(3, n_categories=list(CATS), max_rounds=6, tol=0.0,
                                 random_state=1)
    p0 = est.initial_parameters(fd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd)
    # the rows each site fits: its rare missingness patterns merged (issue 39's rule)
    fitted = np.vstack([merge_rare_patterns(ClientData(cd.X), fl.DisclosurePolicy()).X
                        for _, cd in fd.items()])
    assert fitted.shape[0] < X.shape[0]
    w, probs = em_missing(fitted, p0["weights"], p0["probs"], 6)
    np.testing.assert_allclose(est.weights_, w, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(est.probabilities_, probs, rtol=1e-8, atol=1e-12)
    # prediction: the missing items drop out of the row's likelihood
    row = np.array([[1.0, np.nan, 0.0, np.nan]])
    off = np.concatenate([[0], np.cumsum(CATS)])
    lp = np.log(est.weights_) + np.log(est.probabilities_[:, off[0] + 1]) + np.log(
        est.probabilities_[:, off[2] + 0])
    np.testing.assert_allclose(est.predict_proba(row)[0], np.exp(lp - np.logaddexp.reduce(lp)),
                               rtol=1e-10)


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_secure_aggregation_with_missing_answers():
    fd = data(seed=1)
    kw = dict(n_categories=list(CATS), max_rounds=3, tol=0.0, random_state=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        plain = fl.LatentClassAnalysis(3, **kw).fit(fd)
        sec = fl.LatentClassAnalysis(3, federation=fl.Federation(secure_aggregation=True),
                                     **kw).fit(fd)
    np.testing.assert_allclose(sec.probabilities_, plain.probabilities_, rtol=1e-8, atol=1e-10)


def test_a_bad_code_is_still_refused_next_to_missing_answers():
    fd = data()
    X = fd[fd.client_ids[0]].X.copy()
    X[0, 1] = 7.0
    bad = fl.FederatedDataset.from_arrays({"a": X})
    with pytest.raises(ValueError, match=r"^client 'a': column 'x1' holds 7, not a category "
                       r"code in 0\.\.3"):
        fl.LatentClassAnalysis(2, n_categories=list(CATS)).fit(bad)
