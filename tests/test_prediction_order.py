"""Predictions on a FederatedDataset come back in the user's order, with the user's index.

A dataset made from a DataFrame remembers each row's index label and position; the base
estimator's ``predict_dataset`` returns a Series indexed like the DataFrame, in its row order,
whatever the order of the clients. A dataset made from arrays gets a RangeIndex over its rows in
client order (the order of ``fd.pooled()``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.data import ClientData


def interleaved_frame(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """Clients interleaved (the table's order is not the client order) and an index of
    labels that is neither sorted nor a range."""
    rng = np.random.default_rng(seed)
    client = rng.choice(["s2", "s0", "s1", "s10"], size=n)
    z = rng.random(n) < 0.5
    a = np.where(z, 4.0, -4.0) + rng.normal(size=n)
    b = rng.normal(size=n)
    y = np.where(z, 1.0 + 2.0 * a, -1.0 - a) + 0.1 * rng.normal(size=n)
    index = pd.Index([f"r{k}" for k in rng.permutation(n)], name="record")
    return pd.DataFrame({"site": client, "a": a, "b": b, "y": y}, index=index)


@pytest.fixture(scope="module")
def frame():
    return interleaved_frame()


@pytest.fixture(scope="module")
def gmm(frame):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"])
    return fl.FederatedGaussianMixture(2, random_state=0, verbose=False).fit(fd)


@pytest.fixture(scope="module")
def lcr(frame):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"], target="y")
    return fl.LatentClassRegression(2, random_state=0, tol=1e-6).fit(fd)


def test_gmm_predictions_are_in_the_frames_order_with_its_index(frame, gmm):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"])
    pred = gmm.predict_dataset(fd)
    assert isinstance(pred, pd.Series)
    assert pred.index.equals(frame.index)
    # row for row what the fitted model says of the frame's rows, in the frame's order
    np.testing.assert_array_equal(pred.to_numpy(), gmm.predict(frame[["a", "b"]]))
    # the client order differs from the frame's, so a client-ordered result would not match
    assert not np.array_equal(fd.pooled().X, frame[["a", "b"]].to_numpy())


def test_lcr_predictions_line_up_with_the_frames_target(frame, lcr):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"], target="y")
    pred = lcr.predict_dataset(fd)
    np.testing.assert_allclose(pred.to_numpy(), lcr.predict(frame[["a", "b"]]), rtol=1e-13)
    target = fd.target_series()
    assert target.index.equals(frame.index) and target.name == "y"
    np.testing.assert_array_equal(target.to_numpy(), frame["y"].to_numpy())
    # assigning back aligns on the index
    out = frame.assign(pred=pred)
    np.testing.assert_array_equal(out["pred"].to_numpy(), pred.to_numpy())


def test_fit_predict_is_a_series_in_the_frames_order(frame):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"])
    gm = fl.FederatedGaussianMixture(2, random_state=0, verbose=False)
    labels = gm.fit_predict(fd)
    assert labels.index.equals(frame.index)
    np.testing.assert_array_equal(labels.to_numpy(), gm.predict(frame[["a", "b"]]))


def test_a_split_keeps_the_labels_of_its_rows_in_the_frames_order(frame, gmm):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"])
    train, test = fd.train_test_split(test_size=0.3, random_state=1)
    pred = gmm.predict_dataset(test)
    assert len(pred) == test.n_samples
    positions = frame.index.get_indexer(pred.index)
    assert (positions >= 0).all() and (np.diff(positions) > 0).all()  # the frame's order
    np.testing.assert_array_equal(pred.to_numpy(),
                                  gmm.predict(frame[["a", "b"]].iloc[positions]))
    # train and test together cover every row once
    both = train.row_index.append(test.row_index)
    assert sorted(both) == sorted(frame.index)


def test_subset_and_map_keep_the_rows_labels(frame, gmm):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"])
    sub = fd.subset(["s1", "s10"]).map(lambda cid, cd: ClientData(cd.X * 1.0))
    pred = gmm.predict_dataset(sub)
    want = frame[frame["site"].isin(["s1", "s10"])]
    assert pred.index.equals(want.index)
    np.testing.assert_array_equal(pred.to_numpy(), gmm.predict(want[["a", "b"]]))


def test_arrays_get_a_range_index_in_client_order(gmm):
    rng = np.random.default_rng(3)
    data = {"b": rng.normal(size=(7, 2)), "a": rng.normal(size=(5, 2)) + 4}
    fd = fl.FederatedDataset.from_arrays(data)
    pred = gmm.predict_dataset(fd)
    assert pred.index.equals(pd.RangeIndex(12))
    want = np.concatenate([gmm.predict(data["a"]), gmm.predict(data["b"])])  # "a" then "b"
    np.testing.assert_array_equal(pred.to_numpy(), want)


def test_duplicate_index_labels_are_kept_in_order():
    df = pd.DataFrame({"c": ["q", "p", "q", "p"], "x": [1.0, 2.0, 3.0, 4.0]},
                      index=[7, 7, 3, 3])
    fd = fl.FederatedDataset.from_pandas(df, client="c")
    s = fd.to_source_order(np.concatenate([cd.X[:, 0] for _, cd in fd.items()]), name="x")
    assert s.index.tolist() == [7, 7, 3, 3]
    assert s.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_to_source_order_two_columns_is_a_frame_and_dicts_are_by_client(frame):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"])
    per_client = {cid: cd.X for cid, cd in fd.items()}
    out = fd.to_source_order(per_client, columns=["a", "b"])
    assert isinstance(out, pd.DataFrame) and out.index.equals(frame.index)
    np.testing.assert_array_equal(out.to_numpy(), frame[["a", "b"]].to_numpy())


def test_to_source_order_refuses_a_wrong_length(frame):
    fd = fl.FederatedDataset.from_pandas(frame, client="site", features=["a", "b"])
    with pytest.raises(ValueError, match=r"^got 3 values for the 240 rows of the dataset; give "
                                         r"one per row, clients in client_ids order$"):
        fd.to_source_order(np.zeros(3))
