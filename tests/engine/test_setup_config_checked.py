"""A node builds only a model configuration the estimator would have accepted: the setup's
``model_config`` comes from the server, and a setting the estimator refuses (a negative
regularizer, a component count of zero, a non-finite scale) would steer the M-step every site
evaluates, or, verified, replays. A server that sends GMM ``reg_covar = -0.5`` had every
site answer, verified, the sharpened covariances its replay then gave (each component's
covariance less 0.5 on its diagonal)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.dataset import ClientData
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.transport.inprocess import InProcessRuntime
from verified_doubles import six_sites


class Sharpened(InProcessRuntime):
    """A server whose setup tells every site ``reg_covar = -0.5`` (the estimator's is 1e-6)."""

    def call(self, client_ids, method, messages):
        if method == "setup":
            messages = {c: {**m, "model_config": json.dumps(
                {**json.loads(m["model_config"]), "reg_covar": -0.5})}
                for c, m in messages.items()}
        return super().call(client_ids, method, messages)


@pytest.mark.parametrize("verified", [True, False])
def test_a_negative_regularizer_sent_at_setup_is_refused_by_every_site(verified):
    pytest.importorskip("cryptography")
    fd = six_sites(3.0)
    est = fl.FederatedGaussianMixture(3, n_init=1, tol=0.0, max_rounds=3, random_state=0,
                                      federation=fl.Federation(secure_aggregation=True,
                                                               verified=verified))
    with warnings.catch_warnings(), pytest.raises(ValueError,
                                                  match=r"^reg_covar must be >= 0, got -0\.5"):
        warnings.simplefilter("ignore")  # (in process, a site's setup error stops the fit)
        est.fit(fd, runtime=Sharpened(fd))


@pytest.mark.parametrize("name, config, setting", [
    ("gmm", {"n_components": 3, "reg_covar": float("nan")}, "reg_covar"),
    ("gmm", {"n_components": 0}, "n_components"),
    ("gmm", {"n_components": 3, "covariance_type": "sharp"}, "covariance_type"),
    ("lcr", {"n_components": 2, "reg_noise": -1.0}, "reg_noise"),
    ("lca", {"n_components": 0, "n_categories": [2, 3]}, "n_components"),
    ("fedgmm", {"n_input_components": 2, "n_learners": 2, "classes": [0, 1], "l2": -1.0},
     "l2"),
    ("fedgmm", {"n_input_components": 2, "n_learners": 2, "classes": [0, 1],
                "reg_covar": -0.5}, "reg_covar"),
    ("hlcr", {"n_clusters": 2, "alpha": 1.0, "beta": 1.0, "delta": 0.0, "sigma": 1.0},
     "delta"),
    ("hlcr", {"n_clusters": 2, "alpha": 1.0, "beta": 1.0, "delta": 1.0,
              "sigma": float("inf")}, "sigma"),
])
def test_a_site_refuses_each_models_configuration_outside_the_estimators_range(
        name, config, setting):
    """The node's setup, before anything of the data is read: ValueError naming the setting
    and the value."""
    node = ClientNode("c0", ClientData(np.zeros((4, 2))))
    msg = {"model": name, "model_config": json.dumps(config), "disclosure": ""}
    with pytest.raises(ValueError, match=f"^{setting} must be .*, got "):
        node.handle("setup", msg)
