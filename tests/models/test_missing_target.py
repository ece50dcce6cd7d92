"""Issue 25, item 3: latent class regression and HLCR leave the rows with a missing target
out of the fit (counted in ``n_missing_target_`` and logged); the models that cannot leave
them out refuse them with today's errors."""

import logging
import re
import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from fedlatent.data.dataset import DataValidationError


def _lcr_data(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for c in "abc":
        X = rng.normal(size=(50, 2))
        y = X @ np.array([1.0, -2.0]) + 0.1 * rng.normal(size=50)
        y[rng.random(50) < 0.3] = np.nan
        out[c] = (X, y)
    return out


def _kept(data):
    return {c: (X[~np.isnan(y)], y[~np.isnan(y)]) for c, (X, y) in data.items()}


def _fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


def test_lcr_leaves_rows_without_target_out(caplog):
    data = _lcr_data()
    n_missing = sum(int(np.isnan(y).sum()) for _, y in data.values())
    fd = fl.FederatedDataset.from_arrays(data)
    with caplog.at_level(logging.INFO, logger="fedlatent.engine.estimation.estimator"):
        est = _fit(fl.LatentClassRegression(2, random_state=0, max_rounds=5), fd)
    assert est.n_missing_target_ == n_missing > 30
    assert f"{n_missing} rows with a missing target are left out of the fit" in caplog.text
    ref = _fit(fl.LatentClassRegression(2, random_state=0, max_rounds=5),
               fl.FederatedDataset.from_arrays(_kept(data)))
    assert ref.n_missing_target_ == 0
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-12)
    # a runtime holding every row: each client leaves its rows out itself (fit_data)
    given = _fit(fl.LatentClassRegression(2, random_state=0, max_rounds=5), fd,
                 runtime=fl.InProcessRuntime(fd))
    np.testing.assert_allclose(given.coef_, ref.coef_, rtol=1e-12)
    assert len(est.predict_dataset(fd)) == fd.n_samples  # predictions need no target


@pytest.mark.usefixtures("saturation_rule_off")
def test_hlcr_leaves_events_without_target_out():
    fd = fl.datasets.make_synthhlcr(n_agents=6, n_entities=8, entities_per_agent=2,
                                    events_per_entity=8, n_clusters=2, n_features=2,
                                    random_state=0)
    rng = np.random.default_rng(1)
    holes = {}
    for cid, cd in fd.items():
        y = np.asarray(cd.y, dtype=float).copy()
        y[rng.random(y.size) < 0.2] = np.nan
        holes[cid] = fl.FederatedDataset.from_arrays({cid: (cd.X, y)}, entities={cid: cd.entity})
    parts = {c: h[c] for c, h in holes.items()}
    with_nan = fl.FederatedDataset(parts, list(fd.feature_names), "y", "entity")
    kept = fl.FederatedDataset({c: cd.with_target() for c, cd in parts.items()},
                               list(fd.feature_names), "y", "entity")
    kw = dict(n_clusters=2, max_rounds=3, tol=0.0, random_state=0)
    a = _fit(fl.HLCR(**kw), with_nan)
    b = _fit(fl.HLCR(**kw), kept)
    assert a.n_missing_target_ == sum(int(np.isnan(cd.y).sum()) for cd in parts.values()) > 0
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-12)


def test_models_that_cannot_leave_rows_out_refuse_with_todays_errors():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 2))
    y = np.array([0, 1] * 6, dtype=float)
    y[4] = np.nan
    fd = fl.FederatedDataset.from_arrays({"p": (X, y), "q": (X, np.array([0, 1] * 6))})
    with pytest.raises(DataValidationError, match=re.escape(
            "client 'p': target 'y' has 1 NaN or infinite values; drop those rows before "
            "fitting")):
        fl.FedGMM(2, 2, random_state=0).fit(fd)
    df = pd.DataFrame({"site": ["p"] * 12, "u": X[:, 0], "v": X[:, 1], "y": y})
    fd = fl.FederatedDataset.from_pandas(df, client="site", features=["u", "v"], target="y")
    with pytest.raises(DataValidationError, match=r"^client 'p': target column 'y' has 1 NaN "
                       r"values; drop those rows before fitting$"):
        fl.FedGMM(2, 2, random_state=0).fit(fd)


def test_infinite_target_still_refused_by_the_data_layer():
    with pytest.raises(DataValidationError, match=r"^client 'a': target 'y' has 1 NaN or "
                       r"infinite values; drop those rows before fitting$"):
        fl.FederatedDataset.from_arrays({"a": (np.ones((3, 1)), [0.0, np.inf, 1.0])})


def test_a_client_without_any_target_is_named():
    data = _lcr_data()
    X, y = data["b"]
    data["b"] = (X, np.full_like(y, np.nan))
    with pytest.raises(DataValidationError, match=r"^client 'b' has no row with a target"):
        fl.LatentClassRegression(2, random_state=0).fit(fl.FederatedDataset.from_arrays(data))
