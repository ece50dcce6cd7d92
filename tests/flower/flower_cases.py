"""Every model on a small federation, shared by the Flower tests (simulation, deployment).

Kept to few messages: on a deployment every message costs seconds (GMM keeps the default
k-means initialization, three queries; FedGMM uses the random one, one query), and two rounds
for the models with a round loop (the second starts from parameters the server computed and
sent).

Each case gives a dataset, a fresh estimator (same seed every time) and the fitted arrays that
must agree between runtimes.
"""

from __future__ import annotations

import warnings

import numpy as np

import fedlatent as fl


def gmm_case():
    rng = np.random.default_rng(0)
    data = {f"site-{i}": rng.normal(size=(80 + 30 * i, 3)) + 1.5 * i for i in range(3)}
    fd = fl.FederatedDataset.from_arrays(data)
    return fd, lambda: fl.FederatedGaussianMixture(2, max_rounds=2, random_state=11)


def fedgmm_case():
    from fedlatent.data.fedgmm_data import make_fedgmm_synthetic

    sp = make_fedgmm_synthetic(n_clients=3, n_samples_per_client=120, n_features=3,
                               mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=5)
    return sp.train, lambda: fl.FedGMM(2, 2, max_rounds=2, init_params="random", random_state=12)


def hlcr_case():
    fd = fl.datasets.make_synthhlcr(n_agents=3, n_entities=9, entities_per_agent=4,
                                    events_per_entity=8, n_clusters=2, n_features=3, sigma=0.5,
                                    random_state=3)
    return fd, lambda: fl.HLCR(n_clusters=2, max_rounds=2, sigma=0.5, random_state=13)


def sec_case():
    from fedlatent.data.sec_data import make_sec_simulation1

    fd, _ = make_sec_simulation1(n_learners=3, n_samples=40, snr=64.0, random_state=3)
    return fd, lambda: fl.SEC(candidates="fairness", n_clusters=2, random_state=14)


def lcr_case():
    rng = np.random.default_rng(4)
    data = {}
    for i in range(3):
        x = rng.uniform(0, 10, size=(60 + 20 * i, 1))
        line = rng.random(len(x)) < 0.3 + 0.2 * i
        data[f"site-{i}"] = (x, np.where(line, 5 + 2 * x[:, 0], 15 - x[:, 0])
                             + rng.normal(size=len(x)))
    fd = fl.FederatedDataset.from_arrays(data)
    # one start (n_init=1): a Flower run always writes a checkpoint, and a fit with a checkpoint
    # runs one start, so the in-process reference must too
    return fd, lambda: fl.LatentClassRegression(2, max_rounds=2, n_init=1, random_state=15)


CASES = {"gmm": gmm_case, "fedgmm": fedgmm_case, "hlcr": hlcr_case, "sec": sec_case,
         "lcr": lcr_case}

FITTED = {
    "gmm": ("weights_", "means_", "covariances_", "precisions_cholesky_"),
    "fedgmm": ("weights_x_", "means_", "precisions_cholesky_", "coef_", "weights_y_"),
    "hlcr": ("coef_", "intercept_", "precisions_", "c_", "cluster_counts_"),
    "sec": ("errors_", "exchange_losses_", "labels_", "n_samples_"),
    "lcr": ("weights_", "coef_", "intercept_", "noise_variance_"),
}


def fit_inprocess(name):
    fd, make = CASES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fd, make().fit(fd)


def assert_same_fit(name, a, b, rtol=1e-8):
    """Every fitted array of ``a`` equals ``b``'s to ``rtol`` (relative to the array's scale)."""
    for attr in FITTED[name]:
        x, y = np.asarray(getattr(a, attr), float), np.asarray(getattr(b, attr), float)
        assert x.shape == y.shape, attr
        scale = max(float(np.max(np.abs(x))), 1e-300)
        err = float(np.max(np.abs(x - y))) / scale
        assert err <= rtol, f"{name}.{attr}: relative difference {err:.3g}"
    if name == "sec":  # the learners' models (skops bytes differ by zip timestamps): predictions
        X = np.random.default_rng(0).normal(size=(20, a.n_features_in_))
        for c in a.learner_ids_:
            pa, pb = a.predict(X, learner=c), b.predict(X, learner=c)
            assert np.max(np.abs(pa - pb)) <= rtol * max(float(np.max(np.abs(pa))), 1e-300)
