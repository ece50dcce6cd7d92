"""The latent class regression on the deployment path without Flower: the server sees only the
nodes' descriptions (a RemoteDataset), and the fit equals the in-process fit to a relative 1e-12
(tests/tolerance.py: clients called one by one against the batched reference); a node's bad
target comes back naming it."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.data import ClientData
from fedlatent.data.remote import RemoteDataset
from fedlatent.engine import InProcessRuntime
from fedlatent.engine.contract.registry import (
    describe_message,
    estimator_config,
    estimator_from_config,
)
from tolerance import assert_close


def lines_case():
    rng = np.random.default_rng(4)
    data = {}
    for i in range(3):
        n = 60 + 25 * i
        x = rng.uniform(0, 10, size=(n, 1))
        z = rng.random(n) < (0.2 + 0.3 * i)
        data[f"site-{i}"] = (x, np.where(z, 5 + 2 * x[:, 0], 15 - x[:, 0]) + rng.normal(size=n))
    fd = fl.FederatedDataset.from_arrays(data)
    return fd, lambda: fl.LatentClassRegression(2, max_rounds=6, random_state=21)


FITTED = ("weights_", "coef_", "intercept_", "noise_variance_")


def test_remote_dataset_fit_equals_inprocess():
    fd, make = lines_case()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = make().fit(fd, progress=False)
        est = make()
        rt = InProcessRuntime(fd, record=True)
        rd = RemoteDataset.from_replies(
            rt.broadcast(rt.client_ids, "describe", describe_message(est)))
        est.fit(rd, runtime=rt, progress=False)
    assert rd.has_target and rd.sizes == fd.sizes()
    for attr in FITTED:
        assert_close(getattr(est, attr), getattr(ref, attr), err_msg=attr)
    for direction, _, method, msg in rt.log:
        if method == "describe" and direction == "up":
            assert not any(isinstance(v, np.ndarray) for v in msg.values())


def test_estimator_travels_as_json():
    _, make = lines_case()
    est = make().set_params(coef_init=np.array([[1.0], [2.0]]))
    name, params = estimator_config(est)
    assert name == "lcr" and params["coef_init"] == [[1.0], [2.0]]
    back = estimator_from_config(name, params)
    assert back.get_params()["n_components"] == 2 and back.max_rounds == 6


def test_describe_error_names_the_client():
    fd, make = lines_case()
    cid = fd.client_ids[1]
    y = fd[cid].y.copy()
    y[3] = np.inf
    fd.clients[cid] = ClientData(fd[cid].X, y)  # past the dataset's own checks
    rt = InProcessRuntime(fd)
    with pytest.raises(ValueError, match=f"client '{cid}': target 'y' has 1 NaN or infinite"):
        rt.broadcast(rt.client_ids, "describe", describe_message(make()))
