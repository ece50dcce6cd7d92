import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge

import fedlatent as fl
from fedlatent.data.dataset import ClientData, DataValidationError, FederatedDataset
from fedlatent.engine import FederatedFitError, InProcessRuntime
from fedlatent.engine.rounds.loop import ConvergenceWarning
from fedlatent.models.hlcr import (
    HLCRModel,
    cluster_statistics,
    entity_log_marginal,
    entity_statistics,
    gibbs_init,
    gibbs_sweep,
    log_prior_factor,
    predict_theorem2,
    sample_local_labels,
)
from tolerance import assert_same

_spec = importlib.util.spec_from_file_location(
    "hlcr_reference", Path(__file__).resolve().parents[1] / "hlcr_reference.py"
)
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


def _random_clusters(rng, K, F, sigma, delta, n_per=40):
    X = rng.normal(size=(K, n_per, F))
    y = rng.normal(size=(K, n_per)) * 2
    D = np.eye(F)[None] / delta**2 + np.einsum("kni,knj->kij", X, X) / sigma**2
    c = np.einsum("kni,kn->ki", X, y) / sigma**2
    return D, c


@pytest.mark.parametrize("n_events", [1, 5, 37])
def test_fast_marginal_equals_algorithm1(n_events):
    rng = np.random.default_rng(n_events)
    K, F, sigma, delta = 5, 4, 0.7, 1.3
    D, c = _random_clusters(rng, K, F, sigma, delta)
    H = np.linalg.inv(D)
    for _ in range(6):  # random entities
        X = rng.normal(size=(n_events, F)) * rng.uniform(0.5, 2)
        y = X @ rng.normal(size=F) + rng.normal(size=n_events) * sigma
        _, XtX, Xty, yty, n = entity_statistics(X, y, np.zeros(n_events, dtype=int))
        fast = entity_log_marginal(XtX, Xty, yty, n, D, c, sigma)[0]
        slow = ref.log_likelihood_algorithm1(X, y, H, c, sigma)
        np.testing.assert_allclose(fast, slow, rtol=1e-9)


def test_entity_statistics_sums_per_entity():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 3)), rng.normal(size=30)
    ent = rng.choice(["b", "a", "c"], size=30)
    names, XtX, Xty, yty, n = entity_statistics(X, y, ent)
    assert list(names) == ["a", "b", "c"]
    for j, e in enumerate(names):
        m = ent == e
        np.testing.assert_allclose(XtX[j], X[m].T @ X[m], rtol=1e-12)
        np.testing.assert_allclose(Xty[j], X[m].T @ y[m], rtol=1e-12)
        np.testing.assert_allclose(yty[j], y[m] @ y[m], rtol=1e-12)
        assert n[j] == m.sum()


def test_prior_factor_is_eq2():
    rng = np.random.default_rng(1)
    Ni, Nk = rng.integers(0, 5, size=6).astype(float), rng.integers(0, 30, size=6).astype(float)
    got = log_prior_factor(Ni, Nk, alpha=0.8, beta=2.5)
    np.testing.assert_allclose(np.exp(got), ref.prior_eq2(Ni, Nk, 0.8, 2.5), rtol=1e-12)
    assert np.isclose(np.exp(got).sum(), 1.0)


def _toy_entities(seed=0, n_agents=4, per_agent=5, K=3, F=3, sigma=0.5):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(K, F)) * 2
    events, agent_of, stats = [], [], []
    for a in range(n_agents):
        agent_stats = []
        for _ in range(per_agent):
            m = int(rng.integers(1, 12))
            X = rng.normal(size=(m, F))
            y = X @ W[rng.integers(K)] + sigma * rng.normal(size=m)
            events.append((X, y))
            agent_of.append(a)
            agent_stats.append(entity_statistics(X, y, np.zeros(m, dtype=int))[1:])
        stats.append(tuple(np.concatenate([s[i] for s in agent_stats]) for i in range(4)))
    return events, agent_of, stats


def test_gibbs_kernel_equals_literal_algorithm2():
    K, sigma, delta, alpha, beta = 3, 0.5, 1.5, 1.0, 2.0
    events, agent_of, stats = _toy_entities(K=K, sigma=sigma)
    rng = np.random.default_rng(3)
    z0 = rng.integers(0, K, size=len(events))
    U = rng.random((4, len(events)))
    labels_ref, H_ref, c_ref = ref.hlcr_algorithm2(events, agent_of, z0, K, alpha, beta, delta,
                                                   sigma, U)
    state = gibbs_init(stats, K, delta, sigma, rng, labels=z0)
    for t in range(4):
        gibbs_sweep(state, alpha, beta, sigma, U[t])
        assert_same(state["z"], labels_ref[t])
    np.testing.assert_allclose(np.linalg.inv(state["D"]), H_ref, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(state["c"], c_ref, rtol=1e-9, atol=1e-9)


def test_gibbs_cluster_statistics_equal_recomputation_after_every_sweep():
    K, sigma, delta = 4, 0.5, 1.0
    _, _, stats = _toy_entities(seed=5, n_agents=6, per_agent=8, K=K, sigma=sigma)
    rng = np.random.default_rng(0)
    state = gibbs_init(stats, K, delta, sigma, rng)
    n_changed = 0
    for _ in range(8):
        n_changed += gibbs_sweep(state, 1.0, 1.0, sigma, rng.random(len(state["n"])))
        fresh = cluster_statistics(state["XtX"], state["Xty"], state["yty"], state["n"],
                                   state["z"], K, delta, sigma)
        np.testing.assert_allclose(state["D"], fresh["D"], rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(state["c"], fresh["c"], rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(state["Y"], fresh["yty"], rtol=1e-11, atol=1e-11)
        assert_same(state["Nev"], fresh["n_events"])
        assert_same(state["Nk"], fresh["n_entities"])
        Nik = np.zeros_like(state["Nik"])
        np.add.at(Nik, (state["agent"], state["z"]), 1.0)
        assert_same(state["Nik"], Nik)
        assert state["Nk"].sum() == len(state["z"])  # conservation
    assert n_changed > 0  # the sampler moved (the invariant was exercised)


def test_theorem2_is_ridge_regression():
    rng = np.random.default_rng(2)
    X, y = rng.normal(size=(50, 4)), rng.normal(size=50)
    sigma, delta = 0.6, 1.7
    cl = cluster_statistics(X.T @ X[None], (X.T @ y)[None], np.array([y @ y]), np.array([50.0]),
                            np.array([0]), 1, delta, sigma)
    xnew = rng.normal(size=(7, 4))
    got = predict_theorem2(xnew, cl["D"], cl["c"], np.zeros(7, dtype=int))
    ridge = Ridge(alpha=sigma**2 / delta**2, fit_intercept=False).fit(X, y)
    np.testing.assert_allclose(got, ridge.predict(xnew), rtol=1e-10)


def test_local_sampler_uses_agent_and_global_counts():
    # with flat likelihoods the label probabilities are eq. (2); check by frequency
    K = 3
    rng = np.random.default_rng(0)
    loglik = np.zeros((1, K))
    counts_global = np.array([10.0, 0.0, 30.0])
    draws = np.array([
        sample_local_labels(loglik, np.array([-1]), counts_global, 1.0, 2.0, rng)[0][0]
        for _ in range(4000)
    ])
    expected = ref.prior_eq2(np.zeros(K), counts_global, 1.0, 2.0)
    np.testing.assert_allclose(np.bincount(draws, minlength=K) / 4000, expected, atol=0.03)


# ---------------------------------------------------------------------------------------------
# estimator
# ---------------------------------------------------------------------------------------------
SIGMA = 0.5


@pytest.fixture(scope="module")
def synth():
    return fl.datasets.make_synthhlcr(
        n_agents=24, n_entities=24, entities_per_agent=4, events_per_entity=25, n_clusters=3,
        n_features=4, sigma=SIGMA, delta=1.0, random_state=7, return_truth=True)


def _cv_mse(make, fd, n_folds=5):
    err, cnt = 0.0, 0
    fits = []
    for tr, te in fl.datasets.split_events(fd, n_folds, random_state=0):
        est = make().fit(tr)
        y = np.concatenate([cd.y for _, cd in te.items()])
        err += float(((est.predict_dataset(te) - y) ** 2).sum())
        cnt += len(y)
        fits.append(est)
    return err / cnt, fits


@pytest.mark.parametrize("solver", ["gibbs", "federated"])
def test_test_mse_close_to_noise_variance(synth, solver):
    fd, _ = synth
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mse, fits = _cv_mse(lambda: fl.HLCR(3, 1.0, 1.0, 1.0, SIGMA, solver=solver, max_rounds=12,
                                            tol=1e-6, random_state=0,
                                            random_intercept=False), fd)  # the paper's model
    assert abs(mse - SIGMA**2) < 0.10 * SIGMA**2
    if solver == "federated":
        # converged in at most 10 iterations: the labels reach their fixed point by iteration
        # 10 (the round after it only confirms that no label moved: objective unchanged)
        assert all(f.converged_ and f.n_rounds_ - 1 <= 10 for f in fits)


def test_labels_recover_truth_up_to_permutation(synth):
    fd, truth = synth
    est = fl.HLCR(3, 1.0, 1.0, 1.0, SIGMA, solver="federated", max_rounds=10,
                  random_state=1).fit(fd)
    true = np.array([truth["labels"][(a, e)] for a, e in zip(est.pair_agents_,
                                                             est.pair_entities_)])
    table = pd.crosstab(true, est.labels_).to_numpy()
    assert table.max(axis=1).sum() / len(true) > 0.97
    # each recovered coefficient vector matches a true one
    for w in est.coef_[np.unique(est.labels_)]:
        assert np.min(np.linalg.norm(truth["W"] - w, axis=1)) < 0.15


def test_federated_first_rounds_match_algorithm3_by_hand(synth):
    # full participation, gamma = 1: after round t the server's D, c are the pooled sums over
    # the labels the agents hold (Algorithm 3 line 14/16 with gamma = 1)
    fd, _ = synth
    rt = InProcessRuntime(fd)
    est = fl.HLCR(3, 1.0, 1.0, 1.0, SIGMA, max_rounds=3, tol=0.0, random_state=0,
                  fit_intercept=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(fd, runtime=rt)
    stats = [entity_statistics(cd.X, cd.y, cd.entity)[1:] for _, cd in fd.items()]
    st = gibbs_init(stats, 3, 1.0, SIGMA, np.random.default_rng(0), labels=est.labels_)
    np.testing.assert_allclose(est.precisions_, st["D"], rtol=1e-10)
    np.testing.assert_allclose(est.c_, st["c"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(est.cluster_counts_, st["Nk"], rtol=0, atol=1e-9)


@pytest.mark.parametrize("gamma", [0.1, 0.2])
def test_fedhlcr_converges_with_15_percent_agents(synth, gamma):
    fd, _ = synth
    folds = list(fl.datasets.split_events(fd, 5, random_state=0))
    tr, te = folds[0]
    est = fl.HLCR(3, 1.0, 1.0, 1.0, SIGMA, max_rounds=60, random_state=0,
                  federation=fl.Federation(participation=0.15, step_size=gamma,
                                           control_variates=False)).fit(tr)
    y = np.concatenate([cd.y for _, cd in te.items()])
    staged = [float(np.mean((p - y) ** 2)) for p in est.staged_predict(te)]
    assert len(staged) == 60
    # converged: the last 10 iterations are all within 15% of sigma^2, the first is not
    assert max(staged[-10:]) < 1.15 * SIGMA**2
    assert staged[0] > 2 * SIGMA**2


def test_agents_never_send_labels_or_counts(synth):
    fd, _ = synth
    rt = InProcessRuntime(fd, record=True)
    est = fl.HLCR(3, 1.0, 1.0, 1.0, SIGMA, max_rounds=4, tol=0.0, random_state=0,
                  federation=fl.Federation(participation=0.5, step_size=0.5,
                                           control_variates=False),
                  random_intercept=False)  # the paper's model: its sums, no 'u2'
    est.fit(fd, runtime=rt)
    allowed = {"delta/XtX", "delta/Xty", "delta/yty", "delta/n_events", "delta/n_entities",
               "delta/sse", "n", "objective"}
    ups = [(c, m, msg) for d, c, m, msg in rt.log if d == "up"]
    assert any(m == "estep" for _, m, _ in ups)
    states = rt.get_client_states()
    for cid, method, msg in ups:
        if method == "setup":
            assert set(msg) == {"n_units"}
            continue
        if method == "query":  # the checked initialization exchange: three scalar counts
            assert set(msg) == {"n_entities", "n_events", "n_features"}
            assert all(np.ndim(v) == 0 for v in msg.values())
            assert msg["n_entities"] == len(states[cid]["model/labels"])
            continue
        assert method == "estep" and set(msg) <= allowed
        labels = states[cid]["model/labels"]
        for k, v in msg.items():
            # every array is per cluster (leading dim K), never per entity
            if isinstance(v, np.ndarray) and v.ndim:
                assert v.shape[0] == 3
            assert "label" not in k and "count" not in k
        assert msg["n"] == len(labels)
    # and the labels did stay on the agents
    assert all("model/labels" in st for st in states.values())


# ---------------------------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------------------------
def test_prediction_for_new_entities_and_agents(synth):
    fd, truth = synth
    est = fl.HLCR(3, 1.0, 1.0, 1.0, SIGMA, solver="gibbs", max_rounds=8, random_state=0,
                  random_intercept=False).fit(fd)  # the paper's model (eq. (2), Theorem 2)
    K = 3
    # new agent, no context: global proportions
    P = est.predict_proba(["zz"], ["e000"])
    np.testing.assert_allclose(P[0], (est.cluster_counts_ + 1.0 / K)
                               / (est.cluster_counts_.sum() + 1.0))
    # new entity of a known agent, no context: the agent's proportions
    a = est.pair_agents_[0]
    Ni = np.bincount(est.labels_[est.pair_agents_ == a], minlength=K)
    psi = est.global_proportions()
    np.testing.assert_allclose(est.predict_proba([a], ["new"])[0],
                               (Ni + psi) / (Ni.sum() + 1.0))
    # a new entity with observed events goes to the cluster that generated them
    rng = np.random.default_rng(0)
    k_true = int(np.argmax(np.bincount(list(truth["labels"].values()))))
    X = rng.normal(size=(15, 4))
    y = X @ truth["W"][k_true] + SIGMA * rng.normal(size=15)
    ctx = FederatedDataset({"zz": ClientData(X[:10], y[:10], np.array(["new"] * 10))},
                           fd.feature_names, "y", "entity")
    P = est.predict_proba(["zz"] * 5, ["new"] * 5, context=ctx)
    k_hat = P[0].argmax()
    assert P[0, k_hat] > 0.99
    assert np.linalg.norm(est.coef_[k_hat] - truth["W"][k_true]) < 0.2
    pm = est.predict(X[10:], ["zz"] * 5, ["new"] * 5, context=ctx, method="mean")
    pmap = est.predict(X[10:], ["zz"] * 5, ["new"] * 5, context=ctx, method="map")
    np.testing.assert_allclose(pm, pmap, atol=1e-2)
    # known pairs: Theorem 2 with their label
    Xk = fd[a].X[:3]
    e = np.asarray(fd[a].entity)[:3]
    lab = [est.labels_[(est.pair_agents_ == a) & (est.pair_entities_ == ee)][0] for ee in e]
    np.testing.assert_allclose(est.predict(Xk, [a] * 3, e, method="map"),
                               np.einsum("nf,nf->n", Xk, est.coef_[lab]) + est.intercept_[lab])


def test_save_load_roundtrip(synth, tmp_path):
    fd, _ = synth
    est = fl.HLCR(3, 1.0, 1.0, 1.0, SIGMA, solver="gibbs", max_rounds=5, random_state=0).fit(fd)
    est.save(tmp_path / "m")
    back = fl.HLCR.load(tmp_path / "m")
    X, a, e = fd[fd.client_ids[0]].X, [fd.client_ids[0]] * 5, fd[fd.client_ids[0]].entity[:5]
    assert_same(back.predict(X[:5], a, e), est.predict(X[:5], a, e))
    assert_same(back.history_.to_frame()["train_mse"],
                                  est.history_.to_frame()["train_mse"])


def test_gibbs_is_reproducible_and_history_complete(synth):
    fd, _ = synth
    a = fl.HLCR(3, solver="gibbs", sigma=SIGMA, max_rounds=4, tol=0.0, random_state=3).fit(fd)
    b = fl.HLCR(3, solver="gibbs", sigma=SIGMA, max_rounds=4, tol=0.0, random_state=3).fit(fd)
    assert_same(a.labels_, b.labels_)
    df = a.history_.to_frame()
    assert len(df) == 4 and df["train_mse"].notna().all() and df["log_joint"].notna().all()
    assert df["log_joint"].iloc[-1] > df["log_joint"].iloc[0]


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def _tiny(entity=True, y=None):
    X = np.arange(12, dtype=float).reshape(6, 2)
    yy = np.arange(6, dtype=float) if y is None else y
    ent = np.array(["p", "p", "q", "q", "q", "r"]) if entity else None
    return FederatedDataset({"a1": ClientData(X, yy, ent)}, ["u", "v"], "y",
                            "entity" if entity else None)


def test_missing_entity_column_is_an_error():
    with pytest.raises(DataValidationError, match="client 'a1' has no entity column.*entity="):
        fl.HLCR(2).fit(_tiny(entity=False))
    df = pd.DataFrame({"agent": ["a"] * 3, "x": [1.0, 2.0, 3.0], "y": [1.0, 2.0, 3.0]})
    with pytest.raises(DataValidationError, match="entity column 'ent' is not in the data"):
        FederatedDataset.from_pandas(df, client="agent", target="y", entity="ent")


def test_entity_with_zero_events_is_an_error():
    fd = _tiny()
    cd = fd["a1"]
    cat = pd.Categorical(cd.entity, categories=["p", "q", "r", "s"])
    bad = FederatedDataset({"a1": ClientData(cd.X, cd.y, cat)}, ["u", "v"], "y", "entity")
    with pytest.raises(DataValidationError, match="client 'a1': entity 's' has zero events"):
        fl.HLCR(2).fit(bad)
    with pytest.raises(DataValidationError, match="entity 's' has zero events"):
        entity_statistics(cd.X, cd.y, cd.entity, categories=np.array(["p", "q", "r", "s"]),
                          client="a1")


@pytest.mark.parametrize("sigma", [0.0, -1.0])
def test_nonpositive_sigma_is_an_error(sigma):
    with pytest.raises(ValueError, match="sigma must be a finite number > 0"):
        fl.HLCR(2, sigma=sigma).fit(_tiny())


@pytest.mark.parametrize("K", [0, -3])
def test_fewer_than_one_cluster_is_an_error(K):
    with pytest.raises(ValueError, match=r"n_clusters must be an integer K >= 1, got"):
        fl.HLCR(K).fit(_tiny())


def test_non_numeric_target_is_an_error():
    with pytest.raises(DataValidationError, match="client 'a1': target 'y' is not numeric"):
        fl.HLCR(2).fit(_tiny(y=np.array(list("abcdef"))))
    df = pd.DataFrame({"agent": ["a"] * 3, "e": ["p", "p", "q"], "x": [1.0, 2.0, 3.0],
                       "y": ["hi", "lo", "hi"]})
    with pytest.raises(DataValidationError, match="target column 'y' is not numeric"):
        FederatedDataset.from_pandas(df, client="agent", target="y", entity="e")


def test_model_is_registered_and_json_configurable():
    from fedlatent.engine.contract.model import model_from_config

    m = model_from_config("hlcr", HLCRModel(2, 1.0, 1.0, 1.0, 0.5, True, 3).get_config())
    assert isinstance(m, HLCRModel) and m.F == 4


def test_gram_projection_leaves_exact_sums_alone_and_repairs_inconsistent_ones():
    from fedlatent.models.hlcr import project_gram_psd

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(2, 30, 3)), rng.normal(size=(2, 30))
    XtX, Xty, yty = np.einsum("kni,knj->kij", X, X), np.einsum("kni,kn->ki", X, y), (y * y).sum(1)
    a, b, c, bad = project_gram_psd(XtX, Xty, yty)
    assert not bad.any() and a is XtX and b is Xty and c is yty
    # an update overshooting on X^T X but not on X^T y (as gamma/p > 1 can produce)
    XtX2 = XtX.copy()
    XtX2[1] = XtX[1] - 1.5 * np.outer(X[1, 0], X[1, 0]) - 0.9 * XtX[1]
    a, b, c, bad = project_gram_psd(XtX2, Xty, yty)
    assert bad.tolist() == [False, True]
    assert_same(a[0], XtX[0])
    G = np.block([[a[1], b[1][:, None]], [b[1][None, :], np.array([[c[1]]])]])
    assert np.linalg.eigvalsh(G).min() > -1e-9


@pytest.mark.usefixtures("saturation_rule_off")
def test_federated_resume_equals_uninterrupted_run(tmp_path):
    fd = fl.datasets.make_synthhlcr(12, 12, 4, 10, 3, 3, sigma=0.5, random_state=0)
    fed = fl.Federation(participation=0.5, step_size=0.5, control_variates=False)
    a = fl.HLCR(3, sigma=0.5, max_rounds=8, tol=0.0, federation=fed, random_state=0).fit(fd)
    b = fl.HLCR(3, sigma=0.5, max_rounds=4, tol=0.0, federation=fed, random_state=0)
    b.fit(fd, checkpoint=tmp_path / "ck", checkpoint_every=1)
    b.max_rounds = 8
    b.fit(fd, checkpoint=tmp_path / "ck", resume=True)
    # exact: the resumed rounds repeat the uninterrupted run's operations in the same order
    assert_same(a.labels_, b.labels_)
    assert_same(a.precisions_, b.precisions_)
    assert_same(a.history_.train_mse[4:], b.history_.train_mse[4:])
    assert np.isnan(b.history_.train_mse[:4]).all()  # rounds before the resume: not recorded


def test_gibbs_burn_in_labels_are_the_modal_labels_with_matching_statistics(synth):
    fd, _ = synth
    est = fl.HLCR(3, sigma=SIGMA, delta=1.0, solver="gibbs", max_rounds=6, burn_in=2, tol=0.0,
                  random_state=0, fit_intercept=False).fit(fd)
    stats = [entity_statistics(cd.X, cd.y, cd.entity)[1:] for _, cd in fd.items()]
    st = gibbs_init(stats, 3, 1.0, SIGMA, np.random.default_rng(0), labels=est.labels_)
    np.testing.assert_allclose(est.precisions_, st["D"], rtol=1e-12)
    assert_same(est.cluster_counts_, st["Nk"])
    with pytest.raises(ValueError, match=r"burn_in must be None or in \[0, max_rounds=6\)"):
        fl.HLCR(3, solver="gibbs", max_rounds=6, burn_in=6).fit(fd)


# ---------------------------------------------------------------------------------------------
# the base's hooks: the checked initialization exchange, both solvers as scikit-learn estimators
# ---------------------------------------------------------------------------------------------
class _LyingSizes(fl.Runtime):
    """In-process agents, except that ``victim`` changes one entry of its "sizes" reply."""

    def __init__(self, fd, victim, key, value):
        self.inner = InProcessRuntime(fd)
        self.victim, self.key, self.value = victim, key, value

    @property
    def client_ids(self):
        return self.inner.client_ids

    def call(self, client_ids, method, messages):
        replies = self.inner.call(client_ids, method, messages)
        if method == "query" and self.victim in replies:
            replies[self.victim][self.key] = self.value(replies[self.victim][self.key])
        return replies

    def get_client_states(self):
        return self.inner.get_client_states()


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("key, value, reason", [
    ("n_entities", lambda v: v + 1, r"reported \d+ entities, \d+ at setup"),
    ("n_events", lambda v: 0.5, r"'n_events' has values below 1"),
    ("n_features", lambda v: v + 2, r"has \d+ features, the fit has 3"),
    ("n_events", lambda v: float("inf"), r"'n_events' is not finite"),
])
def test_initialization_exchange_is_checked_and_names_the_agent(key, value, reason):
    fd = fl.datasets.make_synthhlcr(6, 8, 3, 5, 2, 3, sigma=0.5, random_state=0)
    victim = fd.client_ids[2]
    rt = _LyingSizes(fd, victim, key, value)
    with pytest.raises(FederatedFitError, match=rf"initialization \(agent sizes\): client "
                       rf"'{victim}'.*{reason}.*nothing of this exchange was used"):
        fl.HLCR(2, sigma=0.5, max_rounds=2, random_state=0).fit(fd, runtime=rt)
    # nothing past the exchange ran: no round was sent, no label drawn
    assert all((st["model/labels"] == -1).all() for st in rt.get_client_states().values())


@pytest.mark.parametrize("solver", ["gibbs", "federated"])
def test_init_exchange_records_the_federation_size_and_changes_no_number(synth, solver):
    fd, _ = synth
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = fl.HLCR(3, sigma=SIGMA, delta=1.0, solver=solver, max_rounds=3, tol=0.0,
                      random_state=0).fit(fd)
    n_pairs = sum(len(np.unique(np.asarray(cd.entity))) for _, cd in fd.items())
    assert est.n_entities_ == len(est.pair_agents_) == len(est.labels_) == n_pairs
    assert est.n_events_ == fd.n_samples
    assert est.n_iter_ == est.n_rounds_ == len(est.history_) == 3
    # the same fit from the prior, without the exchange: same numbers
    base = fl.HLCR(3, sigma=SIGMA, delta=1.0, solver=solver, max_rounds=3, tol=0.0,
                   random_state=0)
    ctx = base._start(fd, None)
    params0 = ctx.model.initial_params()
    from fedlatent.engine.rounds.loop import LoopOptions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        res = base._run(ctx, params0, LoopOptions(seed=ctx.seed, max_rounds=3, tol=0.0))
    # exact: the same rounds on the same values; the exchange only records sizes
    assert_same(res.labels, est.labels_)
    assert_same(res.params["D"], est.precisions_)


def test_gibbs_refuses_a_runtime_a_remote_dataset_and_checkpoints(synth, tmp_path):
    from fedlatent.data.remote import RemoteDataset
    from fedlatent.engine.contract.registry import describe_message

    fd, _ = synth
    est = fl.HLCR(3, sigma=SIGMA, solver="gibbs", max_rounds=2)
    with pytest.raises(ValueError, match="solver='gibbs' pools the data: runtime"):
        est.fit(fd, runtime=InProcessRuntime(fd))
    with pytest.raises(ValueError, match="solver='gibbs' pools the data: checkpoint"):
        est.fit(fd, checkpoint=tmp_path / "ck")
    rt = InProcessRuntime(fd)
    rd = RemoteDataset.from_replies(rt.broadcast(rt.client_ids, "describe",
                                                 describe_message(est)))
    with pytest.raises(ValueError, match="cannot run on a RemoteDataset; use solver='federated'"):
        est.fit(rd, runtime=rt)


@pytest.mark.parametrize("solver", ["gibbs", "federated"])
def test_both_solvers_are_scikit_learn_estimators(synth, solver):
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    fd, _ = synth
    est = fl.HLCR(3, sigma=SIGMA, solver=solver, max_rounds=3, random_state=0)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(fd)
        other = clone(est).fit(fd)
    check_is_fitted(est)
    assert_same(est.labels_, other.labels_)
    assert_same(est.coef_, other.coef_)
    assert isinstance(est.feature_names_in_, np.ndarray) and est.n_features_in_ == 4
    cid = fd.client_ids[0]
    X = pd.DataFrame(fd[cid].X[:4], columns=fd.feature_names)
    a, e = [cid] * 4, np.asarray(fd[cid].entity[:4])
    assert_same(est.predict(X, a, e), est.predict(X.to_numpy(), a, e))
    with pytest.raises(ValueError, match="Feature names must be in the same order"):
        est.predict(X[X.columns[::-1]], a, e)
    with pytest.raises(ValueError, match="X has 4 rows but agents has 3"):
        est.predict(X, a[:3], e)


def test_save_load_keeps_the_reported_sizes(synth, tmp_path):
    fd, _ = synth
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = fl.HLCR(3, sigma=SIGMA, max_rounds=2, tol=0.0, random_state=0).fit(fd)
    est.save(tmp_path / "m")
    back = fl.HLCR.load(tmp_path / "m")
    assert (back.n_entities_, back.n_events_) == (est.n_entities_, est.n_events_)
    assert back.n_iter_ == 2 and back.max_rounds == 2
    assert_same(back.history_.log_joint, est.history_.log_joint)
