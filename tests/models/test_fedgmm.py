import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import fedlatent as fl
from fedlatent.data.dataset import ClientData, FederatedDataset
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
from fedlatent.engine import InProcessRuntime
from fedlatent.models.fedgmm import FedGMM

_spec = importlib.util.spec_from_file_location(
    "fedgmm_reference", Path(__file__).resolve().parents[1] / "fedgmm_reference.py"
)
_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ref)
reference_fedgmm = _ref.reference_fedgmm


@pytest.fixture(autouse=True)
def _one_blas_thread():
    # small matrices: BLAS threads only add contention on a shared 2-core machine
    with threadpool_limits(1):
        yield


def _small(n_clients=6, n=120, seed=0, K=2):
    sp = make_fedgmm_synthetic(n_clients=n_clients, n_samples_per_client=n, n_features=4,
                               mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=seed)
    if K == 2:
        return sp.train
    # three classes: split class 1 by the sign of the first feature
    return sp.train.map(lambda c, cd: ClientData(cd.X, cd.y + (cd.y == 1) * (cd.X[:, 0] > 0)))


def _params0(est, fd):
    p = est.initial_parameters(fd)
    pc = p["precisions_cholesky"]
    covs = np.linalg.inv(np.einsum("kij,klj->kil", pc, pc))
    return {"means": p["means"], "covariances": covs, "coef": p["coef"]}


def _fit(fd, rounds, **kw):
    est = FedGMM(max_rounds=rounds, tol=0.0, random_state=3, verbose=False, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd)


def _rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("K,rounds", [(2, 1), (2, 6), (3, 4)])
def test_federated_iterates_equal_centralized_em(K, rounds):
    fd = _small(K=K)
    kw = dict(n_input_components=2, n_learners=2, l2=1e-2, reg_covar=1e-6)
    est = _fit(fd, rounds, **kw)
    p0 = _params0(FedGMM(random_state=3, **kw), fd)
    clients = [(cd.X, cd.y) for _, cd in fd.items()]
    ref, pis, logliks = reference_fedgmm(clients, p0, rounds, l2=1e-2, reg_covar=1e-6)
    assert est.n_rounds_ == rounds
    assert _rel(est.means_, ref["means"]) < 1e-8
    assert _rel(est.covariances_, ref["covariances"]) < 1e-8
    assert _rel(est.coef_, ref["coef"]) < 1e-8
    for cid, pi in zip(fd.client_ids, pis):
        assert _rel(est.personalize(cid).pi, pi) < 1e-8
    hist = est.history_.to_frame()["objective"].to_numpy()
    np.testing.assert_allclose(hist, logliks, rtol=1e-10)


def test_exact_covariance_is_pooled_and_paper_rule_drops_between_client_scatter():
    rng = np.random.default_rng(1)
    data = {}
    for c in range(5):
        X = rng.normal(size=(200, 3)) + 3.0 * c  # covariate-shifted clients
        data[f"c{c}"] = (X, (X[:, 0] > 3.0 * c).astype(int))
    fd = FederatedDataset.from_arrays(data)
    kw = dict(n_input_components=1, n_learners=1, reg_covar=0.0)
    exact = _fit(fd, 1, **kw)
    paper = _fit(fd, 1, covariance_aggregation="paper", **kw)
    X = fd.pooled().X
    pooled = np.cov(X.T, bias=True)
    np.testing.assert_allclose(exact.covariances_[0], pooled, rtol=1e-10, atol=1e-12)
    mu = X.mean(0)
    between = sum(
        cd.n_samples * np.outer(cd.X.mean(0) - mu, cd.X.mean(0) - mu) for _, cd in fd.items()
    ) / X.shape[0]
    np.testing.assert_allclose(paper.covariances_[0], pooled - between, rtol=1e-9, atol=1e-10)
    assert between[0, 0] > 15.0  # the bias is large under covariate shift
    np.testing.assert_allclose(exact.means_, paper.means_, rtol=1e-12)


def test_nothing_private_crosses():
    fd = _small()
    rt = InProcessRuntime(fd, record=True)
    est = FedGMM(2, 2, max_rounds=4, tol=0.0, random_state=0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=rt)
    ups = [(c, m) for d, c, _, m in rt.log if d == "up"]
    assert len(ups) > 4 * fd.n_clients
    d = fd.n_features
    for cid, msg in ups:
        cd = fd[cid]
        pi = rt.nodes[cid].state["model/pi"]
        assert not any("pi" in k.split("/")[-1] for k in msg)
        for k, v in msg.items():
            a = np.atleast_1d(np.asarray(v, dtype=float)) if not isinstance(v, str) else None
            if a is None:
                continue
            assert not (a.shape == pi.shape and np.allclose(a, pi)), (cid, k)
            assert not (a.size == cd.n_samples and np.array_equal(a.ravel(), cd.y)), (cid, k)
            if a.size % d == 0 and a.size >= d:
                rows = a.reshape(-1, d)
                dist = np.abs(rows[:, None, :] - cd.X[None, :, :]).max(axis=2)
                assert dist.min() > 1e-9, (cid, k)


def test_personalized_prediction_beats_global_and_adapt_recovers_weights():
    sp = make_fedgmm_synthetic(n_clients=12, n_samples_per_client=300, n_features=6,
                               mean_scale=1.5, random_state=2)
    est = _fit(sp.train, 25, n_input_components=3, n_learners=3)
    acc_p = np.mean([np.mean(est.predict(cd.X, client=c) == cd.y) for c, cd in sp.test.items()])
    acc_g = np.mean([np.mean(est.predict(cd.X) == cd.y) for c, cd in sp.test.items()])
    assert acc_p > acc_g + 0.03
    # a known client's data, treated as new: adapt learns weights that predict as well
    c, cd = next(iter(sp.train.items()))
    adapted = est.adapt(cd, n_rounds=50)
    assert np.isclose(adapted.pi.sum(), 1.0)
    test = sp.test[c]
    assert adapted.score(test.X, test.y) >= est.personalize(c).score(test.X, test.y) - 0.02


def test_score_samples_decomposes_joint_likelihood():
    fd = _small()
    est = _fit(fd, 5, n_input_components=2, n_learners=2)
    c, cd = next(iter(fd.items()))
    sc = est.score_samples(cd.X, cd.y, client=c)
    np.testing.assert_allclose(sc["log_pxy"], sc["log_px"] + sc["log_py_given_x"])
    # p(y|x) sums to one over the classes
    tot = np.logaddexp(*(est.score_samples(cd.X, np.full(cd.n_samples, k), client=c)
                         ["log_py_given_x"] for k in (0, 1)))
    np.testing.assert_allclose(tot, 0.0, atol=1e-12)
    # mean log h_c(x, y) at the final parameters is the next round's objective scale
    assert np.all(np.isfinite(est.score_samples(cd.X)["log_px"]))


def test_save_load_roundtrip(tmp_path):
    fd = _small()
    est = _fit(fd, 4, n_input_components=2, n_learners=2)
    est.save(tmp_path / "m")
    est.save_client_weights(tmp_path / "clients")
    back = FedGMM.load(tmp_path / "m")
    c, cd = next(iter(fd.items()))
    pers = back.load_client_weights(c, tmp_path / "clients" / f"{c}.npz")
    np.testing.assert_allclose(pers.predict_proba(cd.X), est.predict_proba(cd.X, client=c))
    assert back.client_ids_ == fd.client_ids


# each bad matrix breaks one rule only: not finite; negative (yet summing to 1); sum 1.25 >= 0
@pytest.mark.parametrize("bad", [[[np.nan, 0.25], [0.25, 0.25]], [[-0.5, 0.75], [0.5, 0.25]],
                                 [[0.5, 0.25], [0.25, 0.25]]], ids=["nan", "negative", "sum"])
def test_tampered_client_weights_file_is_refused(tmp_path, bad):
    fd = _small()
    est = _fit(fd, 3, n_input_components=2, n_learners=2)
    c = fd.client_ids[0]
    path = tmp_path / "w.npz"
    np.savez(path, pi=np.full((2, 2), 0.25))
    np.testing.assert_array_equal(est.load_client_weights(c, path).pi, np.full((2, 2), 0.25))
    np.savez(path, pi=np.array(bad))
    with pytest.raises(ValueError, match="pi must be finite, non-negative weights summing to 1"):
        est.load_client_weights(c, path)


@pytest.mark.parametrize("fed", [fl.Federation(step_size=0.6),
                                 fl.Federation(participation=0.7, random_state=0)])
def test_stochastic_approximation_reaches_the_em_fixed_point(fed):
    # Newton statistics in IRLS form: an averaged S_hat is an average of normal equations, so
    # SA and partial participation converge to the same learners as plain EM.
    fd = _small(n_clients=5)
    kw = dict(n_input_components=1, n_learners=1, l2=1e-2)
    plain = _fit(fd, 30, **kw)
    sa = _fit(fd, 120, federation=fed, **kw)
    assert _rel(sa.coef_, plain.coef_) < 1e-3


def test_average_rule_with_one_learner_and_many_local_steps_is_weighted_local_average():
    fd = _small(n_clients=3)
    est = _fit(fd, 1, n_input_components=1, n_learners=1, learner_update="average",
               local_steps=30, l2=1e-2)
    from fedlatent.models.logistic import add_intercept, local_refit

    p0 = _params0(FedGMM(1, 1, random_state=3, l2=1e-2), fd)
    fits, ns = [], []
    for _, cd in fd.items():
        w = np.ones(cd.n_samples)
        fits.append(local_refit(add_intercept(cd.X), cd.y, w, p0["coef"][0], 1e-2 * cd.n_samples,
                                30))
        ns.append(cd.n_samples)
    expected = np.average(np.array(fits), axis=0, weights=ns)
    assert _rel(est.coef_[0], expected) < 1e-10


# ---- bad input ---------------------------------------------------------------------------------
def test_missing_target_is_rejected():
    fd = FederatedDataset.from_arrays({"a": np.zeros((5, 2)) + np.arange(5)[:, None]})
    with pytest.raises(ValueError, match="FedGMM is supervised: the federated dataset has no "
                                         "target y"):
        FedGMM(1, 1).fit(fd)


@pytest.mark.usefixtures("saturation_rule_off")
def test_client_with_one_class_is_accepted():
    # issue 14: the learners are shared, a one-class client's Newton sums are valid terms
    rng = np.random.default_rng(0)
    fd = FederatedDataset.from_arrays({
        "a": (rng.normal(size=(10, 2)), np.array([0, 1] * 5)),
        "b": (rng.normal(size=(10, 2)), np.zeros(10, int)),
    })
    est = _fit(fd, 3, n_input_components=1, n_learners=1)
    assert est.classes_.tolist() == [0, 1] and np.all(np.isfinite(est.coef_))


def test_labels_outside_declared_classes_are_rejected():
    fd = _small(n_clients=2)
    with pytest.raises(ValueError, match=r"y has labels \[1\] that are not in classes=\[0, 2\]"):
        FedGMM(1, 1, classes=[0, 2]).fit(fd)


def test_unseen_labels_and_wrong_width_at_prediction():
    fd = _small(n_clients=3)
    est = _fit(fd, 2, n_input_components=1, n_learners=1)
    c, cd = next(iter(fd.items()))
    with pytest.raises(ValueError, match=r"y has labels \[7\] unseen at training \(known "
                                         r"classes: \[0, 1\]\)"):
        est.score_samples(cd.X[:3], np.array([0, 7, 1]), client=c)
    with pytest.raises(ValueError, match=r"y has labels \[7\] unseen at training"):
        est.adapt((cd.X[:3], np.array([0, 7, 1])))
    with pytest.raises(ValueError, match="X has 3 features, but this FedGMM was fitted with 4"):
        est.predict(cd.X[:, :3], client=c)
    with pytest.raises(KeyError, match="unknown client 'nobody'"):
        est.predict(cd.X, client="nobody")


def test_quantized_statistics_with_control_variates_reach_a_close_fit():
    # the Newton blocks (IRLS normal equations) are compressed like any statistic; with control
    # variates the compressed deltas vanish at the fixed point, which is plain EM's
    fd = _small(n_clients=5)
    kw = dict(n_input_components=1, n_learners=1, l2=1e-2)
    plain = _fit(fd, 30, **kw)
    fed = fl.Federation(quantizer=fl.Quantizer(levels=256), step_size=0.5, random_state=0)
    q = _fit(fd, 50, federation=fed, **kw)
    assert _rel(q.coef_, plain.coef_) < 1e-8
    assert _rel(q.means_, plain.means_) < 1e-8


def test_torch_learner_needs_the_average_rule():
    fd = _small(n_clients=2)
    with pytest.raises(ValueError, match="learner='torch' is refitted locally and averaged: use "
                                         "learner_update='average'"):
        FedGMM(1, 1, learner="torch").fit(fd)


@pytest.mark.torch
def test_torch_learner_round_is_the_weighted_average_of_local_sgd_refits():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from fedlatent.engine.contract.model import client_rng
    from fedlatent.models.torch_learner import TorchMLPLearner

    fd = _small(n_clients=3)
    lp = {"hidden": [8], "lr": 0.2, "epochs": 2, "batch_size": 16}
    kw = dict(n_input_components=1, n_learners=1, learner="torch", learner_update="average",
              learner_params=lp, l2=1e-3)
    est = _fit(fd, 1, **kw)
    p0 = _params0(FedGMM(random_state=3, **kw), fd)
    learner = TorchMLPLearner(fd.n_features, 2, **lp)
    fits, ns = [], []
    for cid, cd in fd.items():
        rng = client_rng(3, cid, 1, 0)
        fits.append(learner.refit(cd.X, cd.y, np.ones(cd.n_samples), p0["coef"][0], 1e-3, 0.0,
                                  rng))
        ns.append(cd.n_samples)
    np.testing.assert_allclose(est.coef_[0], np.average(fits, axis=0, weights=ns), rtol=1e-10,
                               atol=1e-12)
    # and it learns: personalized accuracy on the training clients well above chance
    more = _fit(fd, 10, **{**kw, "n_input_components": 2, "n_learners": 2})
    acc = np.mean([np.mean(more.predict(cd.X, client=c) == cd.y) for c, cd in fd.items()])
    assert acc > 0.7
