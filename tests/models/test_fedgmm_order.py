"""FedGMM's predictions on a FederatedDataset come back in the user's row order (issue 14)."""

import warnings

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

import fedlatent as fl
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic


def test_predict_dataset_and_score_dataset_follow_the_dataframes_rows():
    sp = make_fedgmm_synthetic(3, 60, n_features=2, mean_scale=2.0, fractions=(1.0, 0.0, 0.0),
                               random_state=0)
    df = sp.train.to_pandas()
    # clients interleaved and an index that is not 0..n-1
    df = df.sample(frac=1.0, random_state=1)
    df.index = pd.Index(np.arange(len(df))[::-1] * 10 + 7, name="row")
    fd = fl.FederatedDataset.from_pandas(df, client="client", target="y",
                                         features=["x0", "x1"])
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = fl.FedGMM(2, 2, max_rounds=5, random_state=0, verbose=False).fit(fd)
    pred = est.predict_dataset(fd)
    assert isinstance(pred, pd.Series) and pred.index.equals(df.index)
    # row by row, each row predicted with its own client's weights
    for cid in fd.client_ids:
        rows = df["client"] == cid
        np.testing.assert_array_equal(pred[rows].to_numpy(),
                                      est.predict(df.loc[rows, ["x0", "x1"]], client=cid))
    assert est.score_dataset(fd) == np.mean(pred.to_numpy() == df["y"].to_numpy())
