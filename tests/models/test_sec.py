"""SEC: the math of each step against hand-checkable cases, the protocol, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.cluster import KMeans
from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
from sklearn.linear_model import LassoCV, LinearRegression

from fedlatent.data.dataset import DataValidationError, FederatedDataset
from fedlatent.data.sec_data import make_sec_simulation1
from fedlatent.engine import FederatedFitError, InProcessRuntime, Runtime
from fedlatent.models.sec import (
    SEC,
    UntrustedModelError,
    affinity,
    auto_affinity_scale,
    clustering_accuracy,
    dissimilarity,
    dumps_model,
    gap_statistic,
    kmeans,
    loads_model,
    normalized_affinity,
    penalty_selection,
    predict_many,
    select_model,
    selection_embedding,
    spectral_clustering,
    spectral_embedding,
    weighted_prediction,
    within_cluster_dispersion,
)


def block_similarity(sizes, within=1.0, between=0.0):
    L = sum(sizes)
    S = np.full((L, L), between)
    start = 0
    for s in sizes:
        S[start : start + s, start : start + s] = within
        start += s
    truth = np.repeat(np.arange(len(sizes)), sizes)
    return S, truth


# ---------------------------------------------------------------------------------------------
# eq. (2), affinity, normalized affinity
# ---------------------------------------------------------------------------------------------
def test_dissimilarity_eq2_by_hand():
    E = np.array([[1.0, 3.0, 2.0], [5.0, 2.0, 7.0], [1.5, 4.0, 0.5]])
    e = np.array([1.0, 2.0, 0.5])
    V = dissimilarity(E, e)
    # v_01 = |e_{0->1} - e_1| + |e_{1->0} - e_0| = |3-2| + |5-1| = 5
    assert V[0, 1] == V[1, 0] == 5.0
    # v_02 = |2-0.5| + |1.5-1| = 2 ; v_12 = |7-0.5| + |4-2| = 8.5
    assert V[0, 2] == 2.0 and V[1, 2] == 8.5
    assert np.all(np.diag(V) == 0)


def test_auto_affinity_scale_is_inverse_mean_and_scale_free():
    V = np.array([[0.0, 1.0, 4.0], [1.0, 0.0, 7.0], [4.0, 7.0, 0.0]])
    assert auto_affinity_scale(V) == pytest.approx(1.0 / 4.0)
    S1 = affinity(V, auto_affinity_scale(V))
    S2 = affinity(1000.0 * V, auto_affinity_scale(1000.0 * V))
    np.testing.assert_allclose(S1, S2, rtol=1e-12)
    assert S1[0, 1] == pytest.approx(np.exp(-0.25))
    assert auto_affinity_scale(np.zeros((3, 3))) == 1.0


def test_normalized_affinity_known_eigenvalues():
    s = 0.3
    S = np.array([[1.0, s], [s, 1.0]])
    # D = (1 + s) I, so D^-1/2 S D^-1/2 = S / (1 + s): eigenvalues 1 and (1 - s)/(1 + s)
    np.testing.assert_allclose(normalized_affinity(S), S / (1 + s), atol=1e-15)
    _, w = spectral_embedding(S, 1)
    np.testing.assert_allclose(w, [1.0, (1 - s) / (1 + s)], atol=1e-12)


def test_block_diagonal_spectrum_and_clusters():
    S, truth = block_similarity([3, 4, 5])
    U, w = spectral_embedding(S, 3)
    # K exact blocks: eigenvalue 1 with multiplicity K, the rest 0
    np.testing.assert_allclose(w, [1, 1, 1] + [0] * 9, atol=1e-12)
    labels, U, _ = spectral_clustering(S, 3, rng=np.random.default_rng(0))
    assert clustering_accuracy(truth, labels) == 1.0
    # rows of U* are unit vectors, identical within a block, orthogonal across blocks
    np.testing.assert_allclose(np.linalg.norm(U, axis=1), 1.0, atol=1e-12)
    G = U @ U.T
    np.testing.assert_allclose(G, (truth[:, None] == truth[None, :]).astype(float), atol=1e-10)


def test_spectral_clustering_recovers_noisy_blocks():
    rng = np.random.default_rng(1)
    S, truth = block_similarity([6, 6, 8], within=0.9, between=0.1)
    N = rng.uniform(-0.05, 0.05, S.shape)
    S = np.clip(S + (N + N.T) / 2, 0, 1)
    np.fill_diagonal(S, 1.0)
    labels, _, _ = spectral_clustering(S, 3, rng=np.random.default_rng(0))
    assert clustering_accuracy(truth, labels) == 1.0


# ---------------------------------------------------------------------------------------------
# k-means, dispersion, gap statistic, penalty
# ---------------------------------------------------------------------------------------------
def test_kmeans_two_groups_by_hand():
    Y = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 2.0]])
    labels, inertia = kmeans(Y, 2, n_init=5, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(labels, [0, 0, 1, 1])
    # means (0, .5) and (10, 1): 2 * .25 + 2 * 1 = 2.5
    assert inertia == pytest.approx(2.5)
    assert within_cluster_dispersion(Y, labels) == pytest.approx(2.5)


def test_within_dispersion_is_first_term_of_eq3():
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((9, 3))
    lab = np.array([0, 0, 1, 1, 1, 2, 2, 2, 2])
    pairwise = 0.0
    for t in range(3):
        Z = Y[lab == t]
        d2 = ((Z[:, None, :] - Z[None, :, :]) ** 2).sum(-1)
        pairwise += d2.sum() / (2 * Z.shape[0])
    assert within_cluster_dispersion(Y, lab) == pytest.approx(pairwise, rel=1e-12)


@pytest.mark.parametrize("sizes", [[4, 4], [3, 4, 5], [5, 5, 5, 5]])
def test_gap_and_penalty_find_k_of_block_diagonal_similarity(sizes):
    S, truth = block_similarity(sizes)
    Y = selection_embedding(S, 8)
    k, info = gap_statistic(Y, 8, n_refs=10, rng=np.random.default_rng(0), rule="global")
    assert k == len(sizes)
    assert info["W"][len(sizes) - 1] == pytest.approx(0.0, abs=1e-20)
    kp, _ = penalty_selection(Y, 8, penalty=0.5, rng=np.random.default_rng(0))
    assert kp == len(sizes)
    # Tibshirani's rule: exact for two blocks; blind past K = 1 to equidistant blocks
    kt, _ = gap_statistic(Y, 8, n_refs=10, rng=np.random.default_rng(0))
    assert kt == (2 if len(sizes) == 2 else 1)


def test_gap_rule_by_hand():
    # 3 points per exact location on a line: 0, 0, 0, 10, 10, 10 -> W_1 = 150, W_2 = 0
    Y = np.repeat([[0.0], [10.0]], 3, axis=0)
    k, info = gap_statistic(Y, 3, n_refs=10, rng=np.random.default_rng(0))
    np.testing.assert_allclose(info["W"][:2], [150.0, 0.0], atol=1e-9)
    assert k == 2


def test_gap_statistic_blobs_and_uniform():
    rng = np.random.default_rng(3)
    centres = np.array([[0, 0], [10, 0], [0, 10], [10, 10]], dtype=float)
    Y = np.repeat(centres, 15, axis=0) + 0.3 * rng.standard_normal((60, 2))
    for rule in ("tibshirani", "global"):
        assert gap_statistic(Y, 8, n_refs=10, rng=np.random.default_rng(0), rule=rule)[0] == 4
        U = rng.uniform(size=(60, 2))
        assert gap_statistic(U, 8, n_refs=10, rng=np.random.default_rng(0), rule=rule)[0] == 1


def test_weighted_prediction_eq4():
    P = np.array([[1.0, 2.0], [3.0, 6.0]])
    np.testing.assert_allclose(weighted_prediction(P, [1, 3]), [2.5, 5.0])


def test_clustering_accuracy_is_permutation_invariant():
    assert clustering_accuracy([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    assert clustering_accuracy([0, 0, 1, 1], [0, 0, 0, 1]) == 0.75


# ---------------------------------------------------------------------------------------------
# models as skops files, fast prediction
# ---------------------------------------------------------------------------------------------
def test_predict_many_equals_predict():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 4))
    y = X[:, 0] - X[:, 1] ** 2 + 0.1 * rng.standard_normal(60)
    models = [
        LassoCV(cv=2).fit(X, y),
        RandomForestRegressor(20, max_depth=3, random_state=0).fit(X, y),
        RandomForestRegressor(10, random_state=1).fit(X, y),
        GradientBoostingRegressor(n_estimators=10, random_state=0).fit(X, y),
        LinearRegression().fit(X, y),
    ]
    Xt = rng.standard_normal((25, 4))
    ref = np.stack([m.predict(Xt) for m in models])
    np.testing.assert_allclose(predict_many(models, Xt), ref, rtol=0, atol=1e-12)


def test_skops_roundtrip_and_untrusted_type_rejected():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 3))
    y = X @ [1.0, 2.0, 3.0]
    rf = RandomForestRegressor(5, max_depth=2, random_state=0).fit(X, y)
    blob = dumps_model(rf)
    assert blob.dtype == np.uint8 and blob.ndim == 1
    np.testing.assert_array_equal(loads_model(blob).predict(X), rf.predict(X))

    blob_bad = dumps_model(_Custom())
    with pytest.raises(UntrustedModelError, match="outside the allow-list"):
        loads_model(blob_bad)
    with pytest.raises(UntrustedModelError, match="not a valid skops file"):
        loads_model(np.frombuffer(b"not a zip file at all", dtype=np.uint8))


class _Custom(RegressorMixin, BaseEstimator):
    def fit(self, X, y):
        return self

    def predict(self, X):
        return np.zeros(len(X))


def test_select_prefers_the_right_candidate():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 3))
    y_lin = X @ [3.0, -2.0, 1.0] + 0.1 * rng.standard_normal(80)
    cands = [("linear", LinearRegression()), ("rf", RandomForestRegressor(20, max_depth=3))]
    best, model, e, cv = select_model(X, y_lin, cands, np.random.default_rng(1))
    assert best == 0 and isinstance(model, LinearRegression)
    assert cv[0] < cv[1]
    # refitted on all data: e is its in-sample MSE
    assert e == pytest.approx(np.mean((y_lin - model.predict(X)) ** 2))
    y_step = np.where(X[:, 0] > 0, 5.0, -5.0) + 0.1 * rng.standard_normal(80)
    assert select_model(X, y_step, cands, np.random.default_rng(1))[0] == 1


# ---------------------------------------------------------------------------------------------
# the protocol
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sim1():
    fd, labels = make_sec_simulation1(n_learners=10, n_samples=40, snr=64.0, random_state=3)
    return fd, labels


@pytest.fixture(scope="module")
def fitted(sim1):
    fd, labels = sim1
    rt = InProcessRuntime(fd, record=True)
    sec = SEC(candidates="linear", random_state=0).fit(fd, runtime=rt)
    return sec, rt


def test_fit_finds_the_two_clusters(sim1, fitted):
    _, labels = sim1
    sec, _ = fitted
    assert sec.n_clusters_ == 2
    assert clustering_accuracy(labels, sec.labels_) == 1.0
    assert sec.eigenvalues_[0] == pytest.approx(1.0)
    np.testing.assert_allclose(sec.similarity_, np.exp(-sec.affinity_scale_ * sec.dissimilarity_))


def test_exchange_diagonal_is_in_sample_error(fitted):
    # model i evaluated on its own data in the Exchange step is e_i of the Select step
    sec, _ = fitted
    np.testing.assert_allclose(np.diag(sec.exchange_losses_), sec.errors_, rtol=1e-10)
    V = sec.dissimilarity_
    E, e = sec.exchange_losses_, sec.errors_
    assert V[0, 7] == pytest.approx(abs(E[0, 7] - e[7]) + abs(E[7, 0] - e[0]))


def test_exchange_sends_no_samples(sim1, fitted):
    fd, _ = sim1
    _, rt = fitted
    allowed_up = {
        "setup": {"n_units"},
        "query": {"model", "e", "n", "selected", "cv_mse", "x_mean", "x_scale", "y_mean",
                  "y_scale", "loss", "mse_alone", "mse_cluster", "se_difference",
                  "n_validation"},
    }
    n_models = fd.n_clients
    seen_exchange = 0
    for direction, cid, method, msg in rt.log:
        cd = fd[cid]
        raw = np.concatenate([cd.X.ravel(), cd.y.ravel()])
        if direction == "up":
            assert set(msg) <= allowed_up[method], (cid, set(msg))
            if "loss" in msg:
                seen_exchange += 1
                assert np.asarray(msg["loss"]).shape == (n_models,)
            for k, v in msg.items():
                if k == "model":
                    assert np.asarray(v).dtype == np.uint8
                    continue
                arr = np.atleast_1d(np.asarray(v, dtype=float))
                # aggregates only: nothing the size of the data, no raw value
                assert arr.size < cd.n_samples
                assert not np.isin(arr, raw).any(), (cid, k)
        else:
            for k, v in msg.items():
                if isinstance(v, np.ndarray) and v.dtype != np.uint8:
                    assert not np.isin(v.ravel(), raw).any(), (cid, k)
    assert seen_exchange == fd.n_clients


def test_same_seed_same_result_and_order_free(sim1):
    fd, _ = sim1
    a = SEC(candidates="linear", random_state=5).fit(fd)
    b = SEC(candidates="linear", random_state=5, n_jobs=2, exchange_batch=3).fit(fd)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.dissimilarity_, b.dissimilarity_, rtol=1e-12)


def test_predict_is_eq4_and_pooled(sim1):
    fd, _ = sim1
    sec = SEC(candidates="linear", standardize=False, random_state=0).fit(fd)
    X = np.random.default_rng(9).standard_normal((7, fd.n_features))
    k = int(sec.labels_[0])
    members = [c for c, lab in zip(sec.learner_ids_, sec.labels_) if lab == k]
    models = sec.selected_models_
    n = np.array([fd[c].n_samples for c in members], dtype=float)
    ref = sum(w * models[c].predict(X) for w, c in zip(n / n.sum(), members))
    np.testing.assert_allclose(sec.predict(X, cluster=k), ref, rtol=1e-12)
    np.testing.assert_allclose(sec.predict(X, learner=members[0]), ref, rtol=1e-12)
    sec.fit_pooled(fd, LinearRegression())
    Xp = np.vstack([fd[c].X for c in members])
    yp = np.concatenate([fd[c].y for c in members])
    np.testing.assert_allclose(sec.predict(X, cluster=k, pooled=True),
                               LinearRegression().fit(Xp, yp).predict(X), rtol=1e-10)


def test_predict_with_standardization_uses_each_scale():
    # learner 1 is learner 0 with y on another scale and shift: standardized they are equal
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 2))
    y = X @ [1.0, -1.0] + 0.1 * rng.standard_normal(40)
    X2 = rng.standard_normal((40, 2))
    y2 = X2 @ [1.0, -1.0] + 0.1 * rng.standard_normal(40)
    fd = FederatedDataset.from_arrays({"a": (X, y), "b": (X2, 10 * y2 + 100)})
    sec = SEC(candidates="linear", n_clusters=1, random_state=0).fit(fd)
    Xt = rng.standard_normal((5, 2))
    pa, pb = sec.predict(Xt, learner="a"), sec.predict(Xt, learner="b")
    ta = Xt @ [1.0, -1.0]
    assert np.max(np.abs(pa - ta)) < 0.1
    assert np.max(np.abs(pb - (10 * ta + 100))) < 1.0


def test_assign_places_new_learners(sim1):
    fd_all, labels = make_sec_simulation1(n_learners=14, n_samples=40, snr=64.0, random_state=4)
    ids = fd_all.client_ids
    train = {c: (fd_all[c].X, fd_all[c].y) for c in ids if c not in ("l05", "l06", "l12", "l13")}
    new = {c: (fd_all[c].X, fd_all[c].y) for c in ("l05", "l06", "l12", "l13")}
    fd = FederatedDataset.from_arrays(train)
    sec = SEC(candidates="linear", n_clusters=2, random_state=0).fit(fd)
    truth_train = np.array([labels[ids.index(c)] for c in fd.client_ids])
    # map fitted cluster labels to the true ones
    lab_of_truth = {t: int(np.bincount(sec.labels_[truth_train == t]).argmax()) for t in (0, 1)}
    want = [lab_of_truth[labels[ids.index(c)]] for c in sorted(new)]
    new_fd = FederatedDataset.from_arrays(new)
    np.testing.assert_array_equal(sec.assign(new_fd), want)
    np.testing.assert_array_equal(sec.assign(new_fd, runtime=InProcessRuntime(fd)), want)
    assert sec.assign_similarity_.shape == (4, fd.n_clients)


def test_per_learner_candidates(sim1):
    fd, _ = sim1
    spec = {c: ("linear" if i % 2 else "lasso_cv") for i, c in enumerate(fd.client_ids)}
    sec = SEC(candidates=spec, random_state=0).fit(fd)
    assert sec.selected_ == ["lasso_cv" if i % 2 == 0 else "linear" for i in range(fd.n_clients)]


def test_protocol_steps_are_the_rounds(fitted):
    # select, exchange and validate are the three protocol steps, one history record each,
    # one runtime call (a wave of one message per learner) each here
    sec, rt = fitted
    assert sec.n_iter_ == sec.n_rounds_ == 3 and sec.converged_
    h = sec.history_.to_frame()
    assert h["round"].tolist() == [1, 2, 3]
    assert (h["participants"] == len(sec.learner_ids_)).all()
    n, e, E = sec.n_samples_, sec.errors_, sec.exchange_losses_
    assert h["objective"][0] == pytest.approx(n @ e / n.sum(), rel=1e-12)
    assert h["objective"][1] == pytest.approx(E[~np.eye(len(e), dtype=bool)].mean(), rel=1e-12)
    assert h["objective"][2] == pytest.approx(np.nanmean(sec.validation_mse_[:, 1]), rel=1e-12)
    queries = [m["query"] for d, _, meth, m in rt.log if d == "down" and meth == "query"]
    L = len(sec.learner_ids_)
    assert queries == ["select"] * L + ["exchange"] * L + ["validate"] * L
    down = sum(_nbytes(m) for d, _, meth, m in rt.log if d == "down" and meth == "query")
    assert h["bytes_down"].sum() == down


def _nbytes(msg):
    from fedlatent.engine.protocol.messages import message_nbytes

    return message_nbytes(msg)


def test_save_load_roundtrip_without_pickle(tmp_path, sim1, fitted):
    fd, _ = sim1
    sec, _ = fitted
    sec.save(tmp_path / "m")
    np.load(tmp_path / "m.npz", allow_pickle=False)  # plain arrays only
    back = SEC.load(tmp_path / "m")
    assert back.get_params() == sec.get_params()
    for k in ("errors_", "n_samples_", "cv_mse_", "exchange_losses_", "dissimilarity_",
              "similarity_", "eigenvalues_", "embedding_", "labels_"):
        np.testing.assert_array_equal(getattr(back, k), getattr(sec, k), err_msg=k)
    assert (back.learner_ids_, back.selected_, back.n_clusters_, back.affinity_scale_) == (
        sec.learner_ids_, sec.selected_, sec.n_clusters_, sec.affinity_scale_)
    assert all(np.array_equal(a, b) for a, b in zip(back.models_, sec.models_))
    for k, v in sec.k_selection_info_.items():
        np.testing.assert_array_equal(back.k_selection_info_[k], v)
    X = np.random.default_rng(0).standard_normal((6, fd.n_features))
    for c in sec.learner_ids_:
        np.testing.assert_array_equal(back.predict(X, learner=c), sec.predict(X, learner=c))
    np.testing.assert_array_equal(back.predict_dataset(fd), sec.predict_dataset(fd))
    assert back.n_iter_ == 3 and len(back.history_) == 3
    np.testing.assert_array_equal(back.validation_mse_, sec.validation_mse_)
    np.testing.assert_array_equal(back.collaborates_, sec.collaborates_)


def test_save_load_keeps_the_scalers(tmp_path):
    fd, _ = make_sec_simulation1(n_learners=4, n_samples=30, snr=64.0, random_state=1)
    sec = SEC(candidates="linear", standardize=False, n_clusters=2, random_state=0).fit(fd)
    assert sec.scalers_ == {}
    sec.save(tmp_path / "m")
    back = SEC.load(tmp_path / "m")
    X = np.random.default_rng(0).standard_normal((3, fd.n_features))
    np.testing.assert_array_equal(back.predict(X, cluster=0), sec.predict(X, cluster=0))


def test_predict_dataset_and_score_dataset(sim1, fitted):
    fd, _ = sim1
    sec, _ = fitted
    pred = sec.predict_dataset(fd)
    want = np.concatenate([sec.predict(cd.X, learner=c) for c, cd in fd.items()])
    np.testing.assert_array_equal(pred, want)
    y = np.concatenate([cd.y for _, cd in fd.items()])
    assert sec.score_dataset(fd) == pytest.approx(np.mean((pred - y) ** 2), rel=1e-12)


class _Liar(Runtime):
    """In-process learners; ``victim``'s replies to ``query`` pass through ``lie``."""

    def __init__(self, fd, victim, query, lie):
        self.inner = InProcessRuntime(fd)
        self.victim, self.query, self.lie = victim, query, lie

    @property
    def client_ids(self):
        return self.inner.client_ids

    def call(self, client_ids, method, messages):
        replies = self.inner.call(client_ids, method, messages)
        if self.victim in replies and messages[self.victim].get("query") == self.query:
            replies[self.victim] = self.lie(dict(replies[self.victim]))
        return replies


def _nan_first_loss(r):
    loss = np.array(r["loss"], dtype=float)
    loss[0] = np.nan
    return {**r, "loss": loss}


@pytest.mark.parametrize("query, lie, reason", [
    ("exchange", _nan_first_loss, "value 'loss' has non-finite values"),
    ("exchange", lambda r: {**r, "loss": np.asarray(r["loss"])[:-1]}, "sent 9 losses for 10"),
    ("exchange", lambda r: {**r, "loss": -np.asarray(r["loss"])}, "'loss' has values below 0"),
    ("select", lambda r: {**r, "model": np.zeros(0, np.uint8)}, "sent an empty model"),
    ("select", lambda r: {k: v for k, v in r.items() if k != "model"}, r"missing value\(s\)"),
    ("select", lambda r: {**r, "e": float("inf")}, "value 'e' is not finite"),
    ("select", lambda r: {**r, "selected": 7}, "selected candidate 7, but it has 1"),
    ("select", lambda r: {**r, "x_scale": 0 * r["x_scale"]}, "sent a scale <= 0"),
])
def test_a_bad_reply_names_the_learner_and_nothing_is_used(sim1, query, lie, reason):
    fd, _ = sim1
    victim = fd.client_ids[3]
    sec = SEC(candidates="linear", random_state=0)
    with pytest.raises(FederatedFitError, match=f"SEC {query}: client '{victim}': .*{reason}"
                                                ".*; nothing of this exchange was used"):
        sec.fit(fd, runtime=_Liar(fd, victim, query, lie))
    assert not hasattr(sec, "labels_")


def test_a_bad_reply_in_threads_names_the_learner(sim1):
    fd, _ = sim1
    victim = fd.client_ids[2]
    sec = SEC(candidates="linear", random_state=0, n_jobs=2, exchange_batch=4)
    with pytest.raises(FederatedFitError, match=f"SEC exchange: client '{victim}': .*value "
                       "'loss' has non-finite values.*; nothing of this exchange was used"):
        sec.fit(fd, runtime=_Liar(fd, victim, "exchange", _nan_first_loss))
    assert not hasattr(sec, "labels_")


def test_assign_checks_the_fitted_learners_replies(sim1, fitted):
    fd, _ = sim1
    sec, _ = fitted
    new = FederatedDataset.from_arrays({"new": (fd["l00"].X, fd["l00"].y)})
    victim = fd.client_ids[4]
    with pytest.raises(FederatedFitError, match=f"SEC exchange: client '{victim}': no reply"):
        sec.assign(new, runtime=_Liar(fd, victim, "exchange", lambda r: None))


def test_callbacks_see_each_step(sim1):
    fd, _ = sim1
    seen = []
    SEC(candidates="linear", random_state=0).fit(
        fd, callbacks=[lambda k, p, S, rec: seen.append((k, rec.participants))])
    assert seen == [(1, fd.n_clients), (2, fd.n_clients), (3, fd.n_clients)]


def test_unfitted_use_raises_sklearns_not_fitted_error():
    from sklearn.exceptions import NotFittedError

    for use in (lambda s: s.clusters(), lambda s: s.predict(np.zeros((1, 2)), cluster=0),
                lambda s: s.selected_models_, lambda s: s.save("never")):
        with pytest.raises(NotFittedError, match="this SEC is not fitted yet"):
            use(SEC())


# ---------------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------------
def _fd(sizes, constant=None):
    rng = np.random.default_rng(0)
    data = {}
    for i, n in enumerate(sizes):
        X = rng.standard_normal((n, 2))
        y = np.full(n, 1.5) if i == constant else X[:, 0] + rng.standard_normal(n)
        data[f"c{i}"] = (X, y)
    return FederatedDataset.from_arrays(data)


def test_learner_with_too_few_samples():
    msg = "client 'c1' has 3 samples; SEC needs at least 4"
    with pytest.raises(DataValidationError, match=msg):
        SEC().fit(_fd([10, 3, 10]))


def test_constant_target():
    with pytest.raises(DataValidationError, match=r"client 'c2': target 'y' is constant"):
        SEC().fit(_fd([10, 10, 10], constant=2))


def test_candidate_not_a_regressor():
    with pytest.raises(ValueError, match=r"candidate 'KMeans' \(KMeans\) is not a scikit-learn "
                                         "regressor"):
        SEC(candidates=[KMeans(2)]).fit(_fd([10, 10, 10]))
    with pytest.raises(ValueError, match="unknown candidate 'boosted_magic'"):
        SEC(candidates=["boosted_magic"]).fit(_fd([10, 10, 10]))


def test_too_many_clusters():
    with pytest.raises(ValueError, match=r"n_clusters=5 is larger than the number of learners "
                                         r"\(3\)"):
        SEC(n_clusters=5).fit(_fd([10, 10, 10]))


def test_no_target_and_bad_parameters():
    fd = FederatedDataset.from_arrays({"a": np.ones((5, 2)), "b": np.zeros((5, 2))})
    with pytest.raises(DataValidationError, match="client 'a' has no target"):
        SEC().fit(fd)
    with pytest.raises(ValueError, match="k_selection must be 'gap' or 'penalty'"):
        SEC(k_selection="elbow").fit(_fd([10, 10]))
    with pytest.raises(ValueError, match="affinity_scale must be positive"):
        SEC(affinity_scale=-1.0).fit(_fd([10, 10]))


def test_predict_needs_one_of_learner_or_cluster(fitted):
    sec, _ = fitted
    X = np.zeros((2, sec.n_features_in_))
    with pytest.raises(ValueError, match="exactly one of learner"):
        sec.predict(X)
    with pytest.raises(ValueError, match="unknown learner 'nobody'"):
        sec.predict(X, learner="nobody")
