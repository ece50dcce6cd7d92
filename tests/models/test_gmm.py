"""Federated Gaussian mixture: exactness against scikit-learn, resume, privacy, persistence."""

import re
import warnings

import numpy as np
import pytest
from sklearn.mixture import GaussianMixture

import fedlatent as fl
from fedlatent.engine import InProcessRuntime
from fedlatent.models.gmm import (
    compute_precision_cholesky,
    estimate_log_gaussian_prob,
    gmm_m_step,
)
from fedlatent.models.gmm.init import CANDIDATES_PER_COMPONENT

K, D = 3, 4


def explicit_init(fd, cov, seed=0):
    rng = np.random.default_rng(seed)
    pooled = fd.pooled().X
    w0 = np.full(K, 1 / K)
    m0 = pooled[rng.choice(len(pooled), K, replace=False)]
    prec0 = {
        "full": np.repeat(np.eye(D)[None], K, 0),
        "tied": np.eye(D),
        "diag": np.ones((K, D)),
        "spherical": np.ones(K),
    }[cov]
    return w0, m0, prec0


def sklearn_iterates(X, cov, w0, m0, prec0, T):
    sk = GaussianMixture(K, covariance_type=cov, max_iter=1, warm_start=True, weights_init=w0,
                         means_init=m0, precisions_init=prec0, init_params="random",
                         random_state=0, tol=0)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(T):
            sk.fit(X)
            out.append((sk.weights_.copy(), sk.means_.copy(), sk.covariances_.copy(),
                        sk.lower_bound_))
    return out


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b) / np.maximum(np.abs(b), 1e-12)))


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("cov", ["full", "tied", "diag", "spherical"])
def test_full_participation_equals_sklearn_iterates(blobs_fd, cov):
    """50 unequal clients, same initial parameters: every iterate equals scikit-learn's."""
    fd = blobs_fd
    assert fd.n_clients == 50 and len(set(fd.sizes().values())) > 10
    w0, m0, prec0 = explicit_init(fd, cov)
    T = 12
    ref = sklearn_iterates(fd.pooled().X, cov, w0, m0, prec0, T)
    per_round = []

    def record(k, params, S_hat, rec):
        per_round.append({k2: v.copy() for k2, v in params.items()})
        per_round[-1]["covariances"] = gmm_m_step(S_hat, params["center"], cov, 1e-6)[2]

    gm = fl.FederatedGaussianMixture(K, covariance_type=cov, max_rounds=T, tol=0,
                                     weights_init=w0, means_init=m0, precisions_init=prec0,
                                     verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        gm.fit(fd, callbacks=[record])
    assert gm.n_rounds_ == T
    for t in range(T):
        w, m, c, lb = ref[t]
        assert rel(per_round[t]["weights"], w) < 1e-8
        assert rel(per_round[t]["means"], m) < 1e-8
        assert rel(gm.history_[t].objective, lb) < 1e-8
        sk_pc = compute_precision_cholesky(c, cov)
        assert rel(per_round[t]["precisions_cholesky"], sk_pc) < 1e-8
        # covariances relative to the matrix scale (off-diagonal entries can be near 0)
        assert np.max(np.abs(per_round[t]["covariances"] - c)) / np.max(np.abs(c)) < 1e-8
    # covariances (relative to the matrix scale: off-diagonal entries can be near 0)
    scale = np.max(np.abs(ref[-1][2]))
    assert np.max(np.abs(gm.covariances_ - ref[-1][2])) / scale < 1e-8


def test_log_prob_matches_scipy():
    from scipy.stats import multivariate_normal

    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    means = rng.normal(size=(2, 3))
    A = rng.normal(size=(2, 3, 3))
    covs = A @ A.transpose(0, 2, 1) + np.eye(3)
    lp = estimate_log_gaussian_prob(X, means, compute_precision_cholesky(covs, "full"), "full")
    for k in range(2):
        np.testing.assert_allclose(lp[:, k], multivariate_normal(means[k], covs[k]).logpdf(X),
                                   rtol=1e-10)


def test_default_init_recovers_separated_components():
    rng = np.random.default_rng(3)
    centers = np.array([[-6.0, 0.0], [0.0, 6.0], [6.0, 0.0]])
    data = {}
    for c in range(12):  # each client dominated by one component
        z = rng.choice(3, size=80, p=np.roll([0.9, 0.05, 0.05], c % 3))
        data[f"c{c}"] = centers[z] + rng.normal(size=(80, 2))
    fd = fl.FederatedDataset.from_arrays(data)
    gm = fl.FederatedGaussianMixture(3, random_state=0, verbose=False).fit(fd)
    assert gm.converged_
    order = np.argsort(gm.means_[:, 0] + 0.01 * gm.means_[:, 1])
    np.testing.assert_allclose(gm.means_[order], centers, atol=0.3)
    labels = gm.predict(centers)
    assert len(set(labels)) == 3
    np.testing.assert_allclose(gm.predict_proba(centers).sum(1), 1.0)


def test_random_init_runs_from_global_moments():
    fd = fl.FederatedDataset.from_arrays(
        {c: np.random.default_rng(c).normal(loc=6 * (c % 2), size=(60, 2)) for c in range(6)}
    )
    # from random starts EM moves slowly at first: a tight tol avoids stopping on a plateau
    gm = fl.FederatedGaussianMixture(2, init_params="random", tol=1e-6, max_rounds=300,
                                     random_state=1, verbose=False)
    gm.fit(fd)
    assert gm.converged_
    np.testing.assert_allclose(np.sort(gm.means_[:, 0]), [0.0, 6.0], atol=0.35)


@pytest.mark.usefixtures("saturation_rule_off")
def test_prediction_api_matches_sklearn_with_same_parameters(blobs_fd):
    gm = fl.FederatedGaussianMixture(K, random_state=0, verbose=False).fit(blobs_fd)
    sk = GaussianMixture(K)
    sk.weights_, sk.means_, sk.covariances_ = gm.weights_, gm.means_, gm.covariances_
    sk.precisions_cholesky_ = gm.precisions_cholesky_
    X = blobs_fd.pooled().X
    np.testing.assert_allclose(gm.score_samples(X), sk.score_samples(X), rtol=1e-10)
    np.testing.assert_array_equal(gm.predict(X), sk.predict(X))
    np.testing.assert_allclose(gm.bic(X), sk.bic(X), rtol=1e-10)
    np.testing.assert_allclose(gm.aic(X), sk.aic(X), rtol=1e-10)
    # score on the federation itself (sums computed on the clients)
    assert gm.score(blobs_fd) == pytest.approx(float(sk.score(X)), rel=1e-10)
    Xs, ys = gm.sample(5000, random_state=0)
    assert Xs.shape == (5000, D)
    np.testing.assert_allclose(np.bincount(ys, minlength=K) / 5000, gm.weights_, atol=0.03)


@pytest.mark.usefixtures("saturation_rule_off")
def test_resume_gives_exactly_the_uninterrupted_result(tmp_path, blobs_fd):
    fed = fl.Federation(participation=0.5, step_size=0.5, quantizer=fl.Quantizer(4),
                        random_state=7)
    kw = dict(max_rounds=12, tol=0, federation=fed, random_state=7, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = fl.FederatedGaussianMixture(K, **kw).fit(blobs_fd)
        # interrupted after 5 rounds (a checkpoint every round), then resumed to 12
        ck = tmp_path / "ck"
        fl.FederatedGaussianMixture(K, **{**kw, "max_rounds": 5}).fit(
            blobs_fd, checkpoint=ck, checkpoint_every=1)
        resumed = fl.FederatedGaussianMixture(K, **kw).fit(blobs_fd, checkpoint=ck, resume=True)
    np.testing.assert_array_equal(resumed.means_, full.means_)
    np.testing.assert_array_equal(resumed.weights_, full.weights_)
    np.testing.assert_array_equal(resumed.covariances_, full.covariances_)
    assert resumed.history_.to_frame()["objective"].tolist() == \
        full.history_.to_frame()["objective"].tolist()


@pytest.mark.usefixtures("saturation_rule_off")
def test_save_load_roundtrip_without_pickle(tmp_path, blobs_fd):
    gm = fl.FederatedGaussianMixture(K, covariance_type="diag", random_state=0,
                                     verbose=False).fit(blobs_fd)
    gm.save(tmp_path / "m")
    assert (tmp_path / "m.npz").exists() and (tmp_path / "m.json").exists()
    np.load(tmp_path / "m.npz", allow_pickle=False)  # plain arrays only
    back = fl.FederatedGaussianMixture.load(tmp_path / "m")
    X = blobs_fd.pooled().X
    np.testing.assert_array_equal(back.score_samples(X), gm.score_samples(X))
    assert back.covariance_type == "diag" and back.n_rounds_ == gm.n_rounds_
    assert len(back.history_) == len(gm.history_)


@pytest.mark.usefixtures("saturation_rule_off")
def test_no_raw_sample_leaves_a_client(blobs_fd):
    """Every array a client sends (init queries and rounds) is checked against its rows."""
    rt = InProcessRuntime(blobs_fd, record=True)
    fl.FederatedGaussianMixture(K, random_state=0, max_rounds=3, verbose=False).fit(
        blobs_fd, runtime=rt)
    ups = [(c, m) for d, c, _, m in rt.log if d == "up"]
    assert len(ups) > 3 * blobs_fd.n_clients
    centres = CANDIDATES_PER_COMPONENT * K
    for cid, msg in ups:
        X = blobs_fd[cid].X
        rows = {tuple(np.round(r, 12)) for r in X}
        for key, v in msg.items():
            if isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[-1] == D:
                for r in v.reshape(-1, D):
                    assert tuple(np.round(r, 12)) not in rows, (cid, key)
            if isinstance(v, np.ndarray):  # (as long as the rows: one entry a component,
                # a feature or a candidate centre of the start, not one a row)
                assert v.shape[0] != X.shape[0] or X.shape[0] in (K, D, centres), (cid, key,
                                                                                v.shape)


@pytest.mark.usefixtures("saturation_rule_off")
def test_convergence_warning_when_max_rounds_is_reached(blobs_fd):
    with pytest.warns(fl.ConvergenceWarning, match="did not converge in 2 rounds"):
        fl.FederatedGaussianMixture(K, max_rounds=2, tol=1e-12, random_state=0,
                                    verbose=False).fit(blobs_fd)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_components": 0}, "n_components must be an integer >= 1, got 0"),
        ({"covariance_type": "banded"}, r"covariance_type must be one of \('full', 'tied', "
                                        r"'diag', 'spherical'\), got 'banded'"),
        ({"reg_covar": -1.0}, "reg_covar must be >= 0, got -1.0"),
        ({"init_params": "kmeans"}, r"init_params must be one of \('kmeans-sums', "
                                     r"'kmeans-federated', 'random'\), got 'kmeans'"),
        ({"means_init": np.zeros((2, 2))}, r"means_init must have shape \(3, 4\), got \(2, 2\)"),
        ({"weights_init": np.array([0.5, 0.5, 0.5])}, "weights_init must be 3 non-negative"),
    ],
)
def test_bad_parameters(blobs_fd, kwargs, message):
    kw = {"n_components": K, "verbose": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        fl.FederatedGaussianMixture(**kw).fit(blobs_fd)


@pytest.mark.usefixtures("saturation_rule_off")
def test_wrong_width_at_predict(blobs_fd):
    gm = fl.FederatedGaussianMixture(K, random_state=0, verbose=False, max_rounds=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(blobs_fd)
    with pytest.raises(ValueError, match=r"X has 3 features, but this "
                       r"FederatedGaussianMixture was fitted with 4"):
        gm.predict(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="not fitted yet"):
        fl.FederatedGaussianMixture(2).predict(np.zeros((2, 3)))


@pytest.mark.usefixtures("saturation_rule_off")
def test_each_client_is_set_up_once_per_fit(blobs_fd):
    rt = InProcessRuntime(blobs_fd, record=True)
    with pytest.warns(fl.ConvergenceWarning):
        fl.FederatedGaussianMixture(K, random_state=0, max_rounds=2, tol=0, verbose=False).fit(
            blobs_fd, runtime=rt)
    setups = [c for d, c, m, _ in rt.log if d == "down" and m == "setup"]
    assert sorted(setups) == blobs_fd.client_ids


def test_federated_score_needs_the_fit_columns_and_equals_the_pooled_score():
    rng = np.random.default_rng(3)
    data = {f"c{i}": rng.normal(size=(30 + 10 * i, 2)) for i in range(3)}
    fd = fl.FederatedDataset.from_arrays(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        gm = fl.FederatedGaussianMixture(2, max_rounds=3, random_state=0).fit(fd)
    pooled = np.vstack(list(data.values()))
    assert gm.score_dataset(fd) == pytest.approx(gm.score(pooled), rel=1e-12)
    other = fl.FederatedDataset.from_arrays(data, feature_names=["b", "a"])
    message = ("the dataset has features ['b', 'a'], but this FederatedGaussianMixture was "
               "fitted with ['x0', 'x1']")
    with pytest.raises(ValueError, match=re.escape(message)):
        gm.score_dataset(other)
