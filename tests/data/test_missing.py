"""Issue 25, data loading: NaN (missing values) is accepted by the data layer and by the models
that declare ``capabilities.missing_values``; infinite values, NaN client ids and NaN for the
other models are refused with the errors they had before."""

import re

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.data.dataset import DataValidationError


def _data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    X = {c: rng.normal(size=(n, 2)) for c in ("a", "b")}
    X["b"][3, 1] = np.nan
    return X


def test_dataset_accepts_nan_and_says_so():
    fd = fl.FederatedDataset.from_arrays(_data())
    assert fd.has_missing
    assert int(np.isnan(fd["b"].X).sum()) == 1
    assert not fl.FederatedDataset.from_arrays({"a": np.ones((3, 2))}).has_missing


def test_infinite_values_still_refused():
    X = _data()
    X["b"][4, 0] = np.inf
    with pytest.raises(DataValidationError, match=re.escape(
            "client 'b': column 'x0' has 1 infinite values; drop or clip them before fitting")):
        fl.FederatedDataset.from_arrays(X)


def test_nan_client_id_still_refused():
    df = pd.DataFrame({"site": ["a", None, "b"], "u": [1.0, np.nan, 2.0]})
    with pytest.raises(DataValidationError, match=r"^client column 'site' has 1 missing values"):
        fl.FederatedDataset.from_pandas(df, client="site", features=["u"])


def test_capability_declared_by_the_gmm_only_where_supported():
    assert fl.FederatedGaussianMixture.capabilities.missing_values
    assert fl.FedGMM.capabilities.missing_values  # its input side (issue 25)
    assert not fl.LatentClassRegression.capabilities.missing_values


def test_model_without_missing_values_refuses_nan_before_any_round():
    data = {c: (X, np.arange(len(X), dtype=float)) for c, X in _data().items()}
    fd = fl.FederatedDataset.from_arrays(data)
    with pytest.raises(DataValidationError, match=re.escape(
            "client 'b': column 'x1' has 1 NaN values; drop or impute them before fitting")):
        fl.LatentClassRegression(2, random_state=0).fit(fd)


def test_predict_refuses_nan_for_a_model_without_missing_values():
    data = {c: (np.nan_to_num(X), X[:, 0] * 2.0) for c, X in _data().items()}
    est = fl.LatentClassRegression(1, random_state=0, max_rounds=3).fit(
        fl.FederatedDataset.from_arrays(data))
    with pytest.raises(ValueError, match=r"^X: column 'x1' has 1 NaN values; drop or impute "
                       r"them before predicting$"):
        est.predict(np.array([[0.0, np.nan]]))


def test_gmm_predicts_with_nan():
    gm = fl.FederatedGaussianMixture(1, random_state=0, verbose=False, max_rounds=3).fit(
        fl.FederatedDataset.from_arrays(_data()))
    p = gm.predict_proba(np.array([[0.0, np.nan], [np.nan, np.nan]]))
    np.testing.assert_allclose(p, 1.0)
    with pytest.raises(ValueError, match=r"^X: column 'x0' has 1 infinite values"):
        gm.predict(np.array([[np.inf, 0.0]]))
