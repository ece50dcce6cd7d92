"""FedGMM's private fit in few releases (issue 23, item 2): the start ties each learner to an
input component, each client iterates its own weights at no cost in budget, the private M-step
ridges the Hessian at the noise's scale, and the default private plan (5 rounds) reaches the
converged non-private accuracy where the old start (uniform table, 3 rounds) did not."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.stats import Stats
from fedlatent.models.fedgmm.dp import personal_weights, tied_table
from fedlatent.models.fedgmm.math import fedgmm_responsibilities
from fedlatent.models.fedgmm.model import FedGMMModel

pytest.importorskip("dp_accounting")

MEANS = np.array([[-2.0, 0.0], [2.0, 1.0]])
COEF = np.array([[4.0, 0.0], [-4.0, 0.0]])  # the label flips between the two components:
# a learner must pair with one input component to predict it


def _fd(n, seed, n_clients=4):
    rng = np.random.default_rng(seed)
    parts = {}
    for c, share in enumerate(np.linspace(0.2, 0.8, n_clients)):
        z = (rng.random(n) < share).astype(int)
        X = MEANS[z] + rng.normal(size=(n, 2))
        p = 1.0 / (1.0 + np.exp(-np.einsum("ni,ni->n", X - MEANS[z], COEF[z])))
        parts[f"c{c}"] = (X, (rng.random(n) < p).astype(int))
    return fl.FederatedDataset.from_arrays(parts)


def test_the_tied_table_pairs_each_learner_with_a_component():
    w = np.array([0.5, 0.3, 0.2])
    t = tied_table(w, 3, spread=0.1)
    np.testing.assert_allclose(t.sum(axis=1), w)
    np.testing.assert_allclose(np.diag(t), w * (0.9 + 0.1 / 3))
    np.testing.assert_allclose(t[0, 1], 0.5 * 0.1 / 3)
    more = tied_table(w, 5)  # learners 3 and 4 share components 0 and 1
    np.testing.assert_array_equal(more.argmax(axis=0), [0, 1, 2, 0, 1])
    np.testing.assert_allclose(more.sum(axis=1), w)
    fewer = tied_table(w, 2)  # component 2 has no learner: its mass is spread evenly
    np.testing.assert_allclose(fewer[2], [0.1, 0.1])
    np.testing.assert_allclose(fewer.sum(axis=1), w)


def test_a_clients_weights_reach_their_fixed_point_locally():
    rng = np.random.default_rng(0)
    lg, lpy = rng.normal(size=(300, 2)) * 3, rng.normal(size=(300, 2)) * 3
    pi0 = np.full((2, 2), 0.25)
    one = fedgmm_responsibilities(lg, lpy, pi0)[0].mean(axis=0)
    np.testing.assert_allclose(personal_weights(lg, lpy, pi0, None, n_iter=1), one)
    pi = personal_weights(lg, lpy, pi0, None, n_iter=200)
    again = personal_weights(lg, lpy, pi, None, n_iter=1)
    assert np.max(np.abs(again - pi)) < 1e-6 < np.max(np.abs(one - pi))
    w = np.ones(300)
    np.testing.assert_allclose(personal_weights(lg, lpy, pi0, w, n_iter=3),
                               personal_weights(lg, lpy, pi0, None, n_iter=3))


def test_the_private_m_step_ridges_the_hessian_at_the_noise_scale():
    model = FedGMMModel(2, 2, [0, 1], private=True)
    L = np.stack([np.eye(2), np.eye(2)])
    params = {"weights_x": np.array([0.5, 0.5]), "means": MEANS.copy(),
              "precisions_cholesky": L, "center": np.zeros(2),
              "coef": np.zeros((2, 1, 3)), "weights_y": np.array([0.5, 0.5]),
              "pi_joint": np.full((2, 2), 0.25)}
    g = np.array([[0.01, 0.0, 0.0], [0.0, 0.02, 0.0]])
    S = Stats({"nk": np.array([0.5, 0.5]), "sx": np.array([[-1.0, 0.0], [1.0, 0.5]]),
               "sxx": np.stack([np.eye(2) * 5.0, np.eye(2) * 5.0]), "lw": np.array([0.5, 0.5]),
               "lg": g, "lH": np.stack([np.diag([1e-4, 1.0, 1.0])] * 2),
               "pq": np.full((2, 2), 0.25)})
    bare = model.server_step(S, params, 1000)
    ridged = model.server_step(S, {**params, "dp_ridge": np.array(10.0)}, 1000)  # 0.01 a row
    # learner 0's gradient lies along the Hessian's weak direction: 1e-4 there without the
    # ridge (a step the trust region caps at 5), 0.01 (the ridge over the rows) with it
    assert np.max(np.abs(bare["coef"][0])) == pytest.approx(5.0)
    lam = model.l2 * 0.5
    np.testing.assert_allclose(ridged["coef"][0, 0], -g[0] / (np.array([0.01, 1, 1]) + lam))
    np.testing.assert_allclose(ridged["coef"][1, 0], -g[1] / (np.array([0.01, 1, 1]) + lam))
    assert float(ridged["dp_ridge"]) == 10.0  # carried to the next round


def test_the_default_private_plan_reaches_the_converged_accuracy():
    fd, test = _fd(1000, 0), _fd(500, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = fl.FedGMM(2, 2, tol=1e-6, max_rounds=1000, random_state=0,
                          verbose=False).fit(fd)
    assert plain.converged_
    target = plain.score_dataset(test)
    assert target > 0.85
    for seed in range(3):
        dp = fl.DifferentialPrivacy(100.0, 1e-5, clip=4.5, noise_seed=seed)
        private = fl.FedGMM(2, 2, random_state=seed, verbose=False,
                            federation=fl.Federation(privacy=dp)).fit(fd)
        assert private.n_iter_ == 5 and private.privacy_calibration_.releases == 5 + 2
        assert private.score_dataset(test) == pytest.approx(target, abs=0.005)
