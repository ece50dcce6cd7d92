"""FedGMM under differential privacy: the stated sensitivity bounds what one record can do to a
client's clipped round statistics (Gaussian and Newton sums) and to the start's queries, the
labels are not clipped, the M-step survives noisy sums, a private fit spends at most its budget
with reproducible or fresh noise and is close to the non-private fit at a large epsilon, and
the refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.dataset import ClientData
from fedlatent.engine.stats import Stats
from fedlatent.models.fedgmm.model import FedGMMModel

MEANS = np.array([[-2.0, 0.0], [2.0, 1.0]])
COEF = np.array([[4.0, 0.0], [-4.0, 0.0]])  # label 1 on the right of component 0's centre,
# on the left of component 1's: learners must pair with input components to predict it


def _rows(rng, n, share):
    z = (rng.random(n) < share).astype(int)
    X = MEANS[z] + rng.normal(size=(n, 2))
    p = 1.0 / (1.0 + np.exp(-np.einsum("ni,ni->n", X - MEANS[z], COEF[z])))
    return X, (rng.random(n) < p).astype(int)


def _fd(n_clients=4, n=400, seed=0):
    rng = np.random.default_rng(seed)
    shares = np.linspace(0.2, 0.8, n_clients)
    return fl.FederatedDataset.from_arrays({f"c{c}": _rows(rng, n, shares[c])
                                            for c in range(n_clients)})


def _dp(epsilon=1.0, **kw):
    kw.setdefault("clip", 4.5)
    return fl.DifferentialPrivacy(epsilon, 1e-5, **kw)


def _model(dp, n_classes=2):
    m = FedGMMModel(2, 2, list(range(n_classes)), private=True)
    m.privacy = dp
    return m


def _params(rng, n_classes=2, center=(0.0, 0.0)):
    L = np.linalg.cholesky(np.linalg.inv(np.eye(2)))
    return {"weights_x": np.array([0.5, 0.5]), "means": MEANS.copy(),
            "precisions_cholesky": np.stack([L, L]), "center": np.asarray(center, float),
            "coef": rng.normal(scale=3.0, size=(2, n_classes - 1, 3)),
            "weights_y": np.array([0.3, 0.7]), "pi_joint": np.array([[0.1, 0.4], [0.2, 0.3]])}


# ---- (1) sensitivity ---------------------------------------------------------------------------
@pytest.mark.parametrize("n_classes,center", [(2, None), (3, (1.0, -0.5))])
def test_one_record_moves_the_clipped_statistics_by_at_most_twice_the_bound(n_classes, center):
    dp = _dp(center=center)
    model = _model(dp, n_classes)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 2)) * 2
    y = rng.integers(n_classes, size=60)
    data = ClientData(X, y)
    params = _params(rng, n_classes, dp.center_for(2))
    state = {"pi": rng.dirichlet(np.ones(4)).reshape(2, 2)}  # private: must not matter
    bound = model.dp_sensitivity(params, dp)
    assert set(bound) == set(model.stat_shapes(params)) == {"nk", "sx", "sxx", "lw", "pq",
                                                                   "lg", "lH"}

    def stats(d):
        return model.client_stats(params, model.dp_clip(d, dp), state, rng).stats

    base = stats(data)
    hs = {"centers": MEANS, "center": params["center"]}
    q_bound = model.dp_query_sensitivity("hard_stats", hs, dp)
    m_bound = model.dp_query_sensitivity("moments", {}, dp)
    assert m_bound == {"sx": 4.5, "sxx": 4.5 ** 2}

    def query(name, payload, d):
        return model.client_query(name, payload, model.dp_clip(d, dp), state, rng)[0]

    q_base = {"hard_stats": query("hard_stats", hs, data), "moments": query("moments", {}, data)}
    worst = dict.fromkeys(bound, 0.0)
    for _ in range(50):
        i = int(rng.integers(60))
        X2, y2 = X.copy(), y.copy()
        X2[i] = rng.normal(scale=1e6, size=2)
        y2[i] = rng.integers(n_classes)
        other = ClientData(X2, y2)
        moved = stats(other)
        for k, b in bound.items():
            change = float(np.linalg.norm(moved[k] - base[k]))
            assert change <= 2 * b * (1 + 1e-9), (k, change, b)
            worst[k] = max(worst[k], change / b)
        for name, payload, sens in (("hard_stats", hs, q_bound), ("moments", {}, m_bound)):
            rep = query(name, payload, other)
            for f, b in sens.items():
                assert np.linalg.norm(rep[f] - q_base[name][f]) <= 2 * b * (1 + 1e-9), (name, f)
    assert min(worst.values()) > 0.1, worst  # not vacuous


def test_labels_are_not_clipped_and_rows_are():
    dp = _dp(clip=1.0, center=(1.0, 1.0))
    X = np.array([[1.0, 1.0], [4.0, 5.0]])
    out = _model(dp).dp_clip(ClientData(X, np.array([0, 1])), dp)
    np.testing.assert_array_equal(out.y, [0, 1])
    np.testing.assert_allclose(out.X, [[1.0, 1.0], [1.6, 1.8]])


def test_the_private_e_step_uses_the_public_joint_table_not_the_clients_own_weights():
    dp = _dp()
    model = _model(dp)
    rng = np.random.default_rng(4)
    X, y = _rows(rng, 200, 0.5)
    data = model.dp_clip(ClientData(X, y), dp)
    params = _params(rng)
    a = model.client_stats(params, data, {"pi": np.full((2, 2), 0.25)}, rng)
    b = model.client_stats(params, data, {"pi": np.array([[0.7, 0.1], [0.1, 0.1]])}, rng)
    for k in a.stats:
        np.testing.assert_array_equal(a.stats[k], b.stats[k])
    assert not np.allclose(a.state["pi"], b.state["pi"])  # each client's pi_c still learns
    assert a.state["pi"].sum() == pytest.approx(1.0)
    np.testing.assert_allclose(a.stats["pq"].sum(), 200.0)  # sum of q over the rows
    np.testing.assert_allclose(a.stats["pq"].sum(axis=1), a.stats["nk"])
    np.testing.assert_allclose(a.stats["pq"].sum(axis=0), a.stats["lw"])


def test_private_m_step_survives_negative_masses_and_indefinite_hessians():
    rng = np.random.default_rng(5)
    model = _model(_dp())
    params = _params(rng)
    S = {"nk": np.array([0.6, -0.01]), "sx": np.array([[-1.2, 0.1], [0.3, 0.2]]),
         "sxx": np.stack([np.eye(2) * 3.5, -np.eye(2)]), "lw": np.array([-0.02, 1.0]),
         "lg": np.array([[0.1, -0.2, 0.05], [0.3, 0.1, 0.0]]),
         "lH": np.stack([np.eye(3), np.diag([1.0, -0.5, 0.2])]),
         "pq": np.array([[0.3, -0.01], [0.4, 0.3]])}
    got = model.server_step(Stats(S), params, 1000)
    np.testing.assert_array_equal(got["means"][1], params["means"][1])  # no mass: kept
    np.testing.assert_array_equal(got["coef"][0], params["coef"][0])
    assert got["weights_x"].sum() == pytest.approx(1.0) and np.all(got["weights_x"] >= 0)
    assert got["weights_y"].sum() == pytest.approx(1.0) and np.all(got["weights_y"] >= 0)
    assert np.all(np.isfinite(got["coef"])) and np.all(np.isfinite(got["precisions_cholesky"]))
    assert np.max(np.abs(got["coef"][1] - params["coef"][1])) <= 5.0 + 1e-12  # damped
    assert got["pi_joint"].sum() == pytest.approx(1.0) and np.all(got["pi_joint"] > 0)


# ---- (2) end to end ----------------------------------------------------------------------------
def _fit(fd, dp, rounds=3, **kw):
    est = fl.FedGMM(2, 2, max_rounds=rounds, tol=0.0, random_state=0, verbose=False,
                    federation=fl.Federation(privacy=dp), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd)


def test_a_private_fit_spends_at_most_its_budget_with_reproducible_or_fresh_noise():
    fd = _fd()
    a = _fit(fd, _dp(1.0, noise_seed=5))
    eps, delta = a.privacy_spent_
    assert 0.99 < eps <= 1.0 and delta == 1e-5
    assert a.privacy_calibration_.releases == 3 + 2  # rounds, moments, private k-means
    h = a.history_.to_frame()
    assert len(h) == 3 and np.all(np.diff(h["epsilon"]) > 0)
    assert h["epsilon"].iloc[-1] == pytest.approx(eps, rel=1e-12)
    # the covariances are the M-step's floored ones (positive definite, inverse precisions)
    assert np.linalg.eigvalsh(a.covariances_).min() > 0
    L = a.precisions_cholesky_
    np.testing.assert_allclose(a.covariances_ @ L @ np.transpose(L, (0, 2, 1)),
                               np.broadcast_to(np.eye(2), (2, 2, 2)), atol=1e-9)
    b = _fit(fd, _dp(1.0, noise_seed=5))
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.means_, b.means_)
    c, d = _fit(fd, _dp(1.0)), _fit(fd, _dp(1.0))
    assert not np.array_equal(c.coef_, d.coef_)
    r = _fit(fd, _dp(1.0, noise_seed=5), init_params="random")
    assert r.privacy_calibration_.releases == 3 + 1  # the moments only


# ---- (3) utility at a large epsilon ------------------------------------------------------------
def test_private_fit_at_large_epsilon_is_close_to_the_non_private_fit():
    fd, test = _fd(n=1000, seed=0), _fd(n=300, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tol=0: every round runs, as the private fit's do
        plain = fl.FedGMM(2, 2, max_rounds=15, tol=0.0, random_state=0, verbose=False).fit(fd)
    private = _fit(fd, _dp(1e3, noise_seed=1), rounds=15)
    acc_plain, acc_private = plain.score_dataset(test), private.score_dataset(test)
    assert acc_plain > 0.75
    assert acc_private == pytest.approx(acc_plain, abs=0.02)
    order = np.argsort(private.means_[:, 0])
    np.testing.assert_allclose(private.means_[order], MEANS, atol=0.15)


# ---- (4) refusals ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    ({"learner_update": "average"}, r"learner_update='average' sends locally refitted "
                                    r"parameters, whose sensitivity to one record is not bounded"),
    ({"covariance_aggregation": "paper"}, r"covariance_aggregation='paper' sends scatter about "
                                          r"each client's own means"),
    ({"n_learners": "auto"}, r"an 'auto' size is chosen by held-out log-likelihoods released "
                             r"outside the privacy budget"),
])
def test_refusals(kw, match):
    args = {"n_input_components": 2, "n_learners": 2, **kw}
    est = fl.FedGMM(**args, max_rounds=2, federation=fl.Federation(privacy=_dp()))
    with pytest.raises(ValueError, match=r"FedGMM under differential privacy: " + match):
        est.fit(_fd(n_clients=2, n=50))


def test_refuses_a_target_range():
    est = fl.FedGMM(2, 2, max_rounds=2,
                    federation=fl.Federation(privacy=_dp(target_range=(0.0, 1.0))))
    with pytest.raises(ValueError, match=r"target_range=\(0.0, 1.0\)\) has no meaning for "
                                         r"FedGMM, whose target is a class label"):
        est.fit(_fd(n_clients=2, n=50))


def test_a_model_without_private_config_states_no_sensitivity():
    with pytest.raises(ValueError, match=r"FedGMMModel was built without private=True"):
        FedGMMModel(2, 2, [0, 1]).dp_sensitivity(_params(np.random.default_rng(0)), _dp())
