"""A deployed node's ``describe`` of a Gaussian mixture without scikit-learn (issue 40: the
server app answering within 10 s of the deployment being ready; each node's first message
imported scikit-learn, SciPy and pandas, about a CPU second, to build the estimator).

The node checks the settings with the describer the GMM registers
(:mod:`fedlatent.models.gmm.describe`): the same table and check as the estimator
(:mod:`fedlatent.models.gmm.params`), so it refuses what the estimator refuses, in its words.
"""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data.dataset import ClientData, FederatedDataset
from fedlatent.engine.contract import registry
from fedlatent.engine.contract.registry import describe_message
from fedlatent.engine.node.describe import describe_client
from fedlatent.models.gmm import describe as gmm_describe
from fedlatent.models.gmm.params import PARAMETER_NAMES
from fresh_process import in_fresh_process


def _one(X=None):
    X = np.arange(12.0).reshape(6, 2) if X is None else X
    return FederatedDataset({"a": ClientData(X)}, ["x0", "x1"])


def _msg(**params):
    name, base = registry.estimator_config(fl.FederatedGaussianMixture(2, random_state=0))
    return {"estimator": name, "estimator_params": json.dumps({**base, **params})}


def _by_estimator(monkeypatch, fd, msg):
    """The reply (or the error) of the describe as it was: the estimator built on the node."""
    monkeypatch.setattr(registry, "node_describer", lambda name: None)
    try:
        return describe_client(fd, msg)
    finally:
        monkeypatch.undo()


def test_the_describer_knows_the_constructors_parameters_and_defaults():
    sig = inspect.signature(fl.FederatedGaussianMixture.__init__).parameters
    assert PARAMETER_NAMES == tuple(k for k in sig if k != "self")
    assert gmm_describe._DEFAULTS == {k: sig[k].default for k in PARAMETER_NAMES}
    assert registry.node_describer("gmm") is gmm_describe.GaussianMixtureDescriber
    assert registry.node_describer("lcr") is None  # (the estimator describes)


def test_a_valid_describe_is_the_estimators(monkeypatch):
    fd = _one()
    for msg in (_msg(), _msg(n_components="auto", n_components_candidates=[1, 2]),
                describe_message(fl.FederatedGaussianMixture(
                    3, covariance_type="diag", federation=fl.Federation(participation=0.5)))):
        got = describe_client(fd, msg)
        assert got == _by_estimator(monkeypatch, fd, msg)
        assert got["n_samples"] == 6 and got["extras"] == "{}"


@pytest.mark.parametrize("bad", [
    {"n_components": 0}, {"covariance_type": "round"}, {"tol": -1.0}, {"tol": "soon"},
    {"init_params": "kmeans++"}, {"reg_covar": -1e-6}, {"n_init": 0}, {"max_rounds": 0},
    {"min_points_per_centroid": 0}, {"random_state": "seed"}, {"verbose": 3},
    {"n_components": "auto", "means_init": [[0.0, 0.0]]},
    {"n_components": "auto", "n_components_candidates": [0, 2]},
    {"colour": "blue"},
])
def test_a_bad_setting_is_refused_as_the_estimator_refuses_it(bad, monkeypatch):
    fd = _one()
    msg = _msg(**bad)
    with pytest.raises(Exception) as theirs:
        _by_estimator(monkeypatch, fd, msg)
    with pytest.raises(type(theirs.value)) as ours:
        describe_client(fd, msg)
    assert str(ours.value) == str(theirs.value)


def test_a_node_describes_a_gmm_without_importing_scikit_learn():
    code = (
        "import numpy as np\n"
        "import fedlatent.runtime.flower\n"
        "from fedlatent.data.dataset import ClientData, FederatedDataset\n"
        "from fedlatent.engine.node.describe import describe_client\n"
        "fd = FederatedDataset({'a': ClientData(np.ones((5, 2)))}, ['x0', 'x1'])\n"
        f"result = describe_client(fd, {_msg()!r})['n_samples']\n")
    assert in_fresh_process(code, ("sklearn", "scipy.stats", "pandas")) == (5, [])
