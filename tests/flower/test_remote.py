"""The deployment path without Flower: the server sees only the nodes' descriptions.

A fit on a RemoteDataset (what a Flower server knows) through the in-process runtime equals the
fit on the FederatedDataset to a relative 1e-12 (tests/tolerance.py: the remote fit calls the
clients one by one, the reference may batch them), for every model; a node's data error comes
back naming it.
"""

import warnings

import numpy as np
import pytest
from flower_cases import CASES, assert_same_fit, fit_inprocess

import fedlatent as fl
from fedlatent.data import DataValidationError
from fedlatent.data.files import read_client_file, write_client_files
from fedlatent.data.remote import RemoteDataset
from fedlatent.engine import InProcessRuntime
from fedlatent.engine.contract.registry import describe_message
from tolerance import RTOL, assert_same


def _remote_fit(name, fd, est):
    rt = InProcessRuntime(fd, record=True)
    rd = RemoteDataset.from_replies(rt.broadcast(rt.client_ids, "describe", describe_message(est)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(rd, runtime=rt)
    return est, rd, rt


@pytest.mark.parametrize("name", sorted(CASES))
def test_remote_dataset_fit_equals_inprocess(name):
    fd, ref = fit_inprocess(name)
    _, make = CASES[name]()
    est, rd, rt = _remote_fit(name, fd, make())
    assert rd.client_ids == fd.client_ids and rd.sizes == fd.sizes()
    assert rd.feature_names == fd.feature_names
    assert_same_fit(name, ref, est, rtol=RTOL)  # per-client vs batched clients: rounding
    # the describe replies carry counts and names only
    for direction, _, method, msg in rt.log:
        if method == "describe" and direction == "up":
            assert not any(isinstance(v, np.ndarray) for v in msg.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_client_files_round_trip_exactly(name, tmp_path):
    fd, _ = CASES[name]()
    paths = write_client_files(fd, tmp_path)
    assert sorted(paths) == fd.client_ids
    for cid, p in paths.items():
        one = read_client_file(p)
        assert one.client_ids == [cid] and one.feature_names == fd.feature_names
        assert one.target_name == (fd.target_name or ("y" if fd.has_target else None))
        a, b = fd[cid], one[cid]
        # exact: the values written are read back (no arithmetic)
        assert_same(a.X, b.X)
        assert a.X.dtype == b.X.dtype
        if a.y is not None:
            assert_same(a.y, b.y)
            assert a.y.dtype == b.y.dtype
        if a.entity is not None:
            assert_same(np.asarray(a.entity).astype(str), b.entity.astype(str))


def test_describe_error_names_the_client():
    fd, _ = CASES["fedgmm"]()
    cid = fd.client_ids[1]
    # a label only that node sees (one-class clients are accepted: issue 14)
    bad = fd.map(lambda c, cd: fl.data.ClientData(cd.X, np.full_like(cd.y, 7)) if c == cid
                 else cd)
    rt = InProcessRuntime(bad)
    with pytest.raises(ValueError, match=f"client '{cid}': y has labels \\[7\\] that are not in"):
        rt.broadcast(rt.client_ids, "describe", describe_message(fl.FedGMM(2, 2, classes=[0, 1])))


def test_remote_dataset_rejects_clients_that_disagree():
    reps = {
        "a": {"client_id": "a", "n_samples": 5, "feature_names": '["x", "z"]', "has_target": False,
              "has_entity": False},
        "b": {"client_id": "b", "n_samples": 5, "feature_names": '["x", "w"]', "has_target": False,
              "has_entity": False},
    }
    with pytest.raises(DataValidationError, match=r"client 'b' has feature columns \['x', 'w'\]"):
        RemoteDataset.from_replies(reps)
    with pytest.raises(TypeError, match="a RemoteDataset has no rows"):
        RemoteDataset.from_replies({"a": reps["a"]}).items()


def test_remote_fit_needs_its_runtime():
    rd = RemoteDataset({"a": 10}, ["x"])
    with pytest.raises(ValueError, match="fit it with the runtime its description came from"):
        fl.FederatedGaussianMixture(1).fit(rd)


def test_estimator_with_python_object_cannot_travel():
    from sklearn.linear_model import Ridge

    with pytest.raises(ValueError, match=r"SEC\(candidates=...\) is a list"):
        describe_message(fl.SEC(candidates=[Ridge()]))
