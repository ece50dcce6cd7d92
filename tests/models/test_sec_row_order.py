"""SEC's predictions on a FederatedDataset come back in the user's row order (issue 14, item 3):
a Series indexed like the source DataFrame, and the score pairs each prediction with its row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedlatent.data.dataset import FederatedDataset
from fedlatent.models.sec import SEC


@pytest.fixture(scope="module")
def interleaved():
    """Rows of three learners interleaved (a, b, c, a, b, c, ...), with a shuffled index."""
    rng = np.random.default_rng(0)
    n = 12
    learner = np.tile(["a", "b", "c"], n)
    X = rng.standard_normal((3 * n, 2))
    slope = np.where(learner == "c", -1.0, 1.0)
    df = pd.DataFrame({"x0": X[:, 0], "x1": X[:, 1], "learner": learner,
                       "y": slope * (X[:, 0] + 2 * X[:, 1]) + 0.1 * rng.standard_normal(3 * n)},
                      index=rng.permutation(1000)[: 3 * n])
    fd = FederatedDataset.from_pandas(df, client="learner", target="y")
    sec = SEC(candidates="linear", n_clusters=2, random_state=0).fit(fd)
    return df, fd, sec


def test_predict_dataset_is_in_the_dataframes_order(interleaved):
    df, fd, sec = interleaved
    pred = sec.predict_dataset(fd)
    assert isinstance(pred, pd.Series)
    assert pred.index.equals(df.index)
    want = np.array([sec.predict(df.loc[[i], ["x0", "x1"]], learner=c)[0]
                     for i, c in zip(df.index, df["learner"])])
    np.testing.assert_allclose(pred.to_numpy(), want, rtol=1e-12)


def test_score_dataset_pairs_each_prediction_with_its_row(interleaved):
    df, fd, sec = interleaved
    pred = sec.predict_dataset(fd)
    assert sec.score_dataset(fd) == pytest.approx(
        float(np.mean((pred - df["y"]) ** 2)), rel=1e-12)
    # the rows' order matters here: pairing client-ordered targets with these predictions
    # gives another (larger) number
    y_client_order = np.concatenate([fd[c].y for c in fd.client_ids])
    assert float(np.mean((pred.to_numpy() - y_client_order) ** 2)) > 2 * sec.score_dataset(fd)
