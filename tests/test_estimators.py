"""Every registered estimator is a scikit-learn estimator, and every initialization exchange is
checked: a client that drops, or sends NaN, during initialization gives an error naming it."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, clone

import fedlatent as fl
from fedlatent.engine import FederatedFitError, InProcessRuntime, Runtime
from fedlatent.engine.contract.registry import estimator_entries, estimator_names
from fedlatent.engine.contract.registry import example as registry_example


def _lcr_data(seed=0, n_clients=6):
    """Two lines mixed differently per client (the LCR example's data; other tests import it)."""
    from fedlatent.models.lcr.example import two_lines

    return two_lines(seed, n_clients)


def _case(name):
    """(estimator, fd, predict(est, X_frame, fd) -> array) for a small problem of each model:
    the registry's example of the model (``fedlatent.models.<name>.example``)."""
    ex = registry_example(name)
    case = ex.case()
    return case.make(), case.data(), ex.predict_rows


#: every registered model: a new one is covered without editing this list
NAMES = estimator_names()


def test_the_five_models_are_registered():
    assert {"gmm", "lcr", "fedgmm", "hlcr", "sec"} <= set(NAMES) <= set(estimator_entries())


def _fit(est, fd, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


def _fitted_numbers(est) -> dict:
    out = {}
    for k, v in vars(est).items():
        if k.endswith("_") and not k.startswith("_") and k not in ("history_",):
            if isinstance(v, np.ndarray) and v.dtype.kind in "biuf":
                out[k] = v
            elif isinstance(v, float | int | np.floating | np.integer) and not isinstance(v, bool):
                out[k] = float(v)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_clone_refits_to_identical_parameters(name):
    est, fd, _ = _case(name)
    assert isinstance(est, BaseEstimator)
    a = _fit(est, fd)
    b = _fit(clone(est), fd)
    na, nb = _fitted_numbers(a), _fitted_numbers(b)
    assert na and set(na) == set(nb)
    for k in na:
        np.testing.assert_array_equal(na[k], nb[k], err_msg=k)
    assert a.n_iter_ == b.n_iter_ >= 1


@pytest.mark.parametrize("name", NAMES)
def test_get_params_set_params_round_trip_and_repr(name):
    est, _, _ = _case(name)
    params = est.get_params(deep=True)
    other = clone(est).set_params(**params)
    assert other.get_params(deep=True).keys() == params.keys()
    for k, v in params.items():
        w = other.get_params()[k]
        assert (w is v) or (np.array_equal(w, v) if isinstance(v, np.ndarray) else w == v), k
    assert repr(est).startswith(type(est).__name__ + "(")
    est.set_params(random_state=7)
    assert est.get_params()["random_state"] == 7


@pytest.mark.parametrize("name", NAMES)
def test_unfitted_estimator_raises_sklearns_not_fitted_error(name):
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    est, fd, predict = _case(name)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    X = pd.DataFrame(fd[fd.client_ids[0]].X[:3], columns=fd.feature_names)
    with pytest.raises(NotFittedError):
        predict(est, X, fd)


@pytest.mark.parametrize("name", NAMES)
def test_reordered_or_renamed_dataframe_at_predict_is_refused(name):
    est, fd, predict = _case(name)
    _fit(est, fd)
    check = __import__("sklearn.utils.validation", fromlist=["check_is_fitted"])
    check.check_is_fitted(est)
    assert list(est.feature_names_in_) == list(fd.feature_names)
    assert isinstance(est.feature_names_in_, np.ndarray) and est.n_features_in_ == fd.n_features
    X = pd.DataFrame(fd[fd.client_ids[0]].X[:5], columns=fd.feature_names)
    ok = predict(est, X, fd)
    np.testing.assert_array_equal(ok, predict(est, X.to_numpy(), fd))
    if X.shape[1] > 1:
        with pytest.raises(ValueError, match="Feature names must be in the same order"):
            predict(est, X[X.columns[::-1]], fd)
    renamed = X.rename(columns={X.columns[0]: "zzz"})
    with pytest.raises(ValueError, match="feature names should match"):
        predict(est, renamed, fd)


# ---- faults during initialization ------------------------------------------------------------
class FaultyInit(Runtime):
    """In-process clients, except that ``victim`` drops (no reply) or answers NaN to the first
    exchanges that are not the round loop's (setup, describe and round messages pass)."""

    def __init__(self, fd, victim, mode):
        self.inner = InProcessRuntime(fd)
        self.victim, self.mode, self.hits = victim, mode, 0

    @property
    def client_ids(self):
        return self.inner.client_ids

    def call(self, client_ids, method, messages):
        replies = self.inner.call(client_ids, method, messages)
        if method == "query" and self.victim in replies:
            self.hits += 1
            if self.mode == "drop":
                del replies[self.victim]
            else:
                replies[self.victim] = {
                    k: (np.full(np.shape(v), np.nan) if isinstance(v, np.ndarray)
                        and v.dtype.kind == "f" else float("nan") if isinstance(v, float) else v)
                    for k, v in replies[self.victim].items()
                }
        return replies


@pytest.mark.parametrize("mode", ["drop", "nan"])
@pytest.mark.parametrize("name", NAMES)
def test_fault_during_initialization_names_the_client(name, mode):
    est, fd, _ = _case(name)
    victim = fd.client_ids[1]
    rt = FaultyInit(fd, victim, mode)
    with pytest.raises(FederatedFitError, match=f"client '{victim}'") as err:
        _fit(est, fd, runtime=rt)
    assert rt.hits >= 1
    assert "nothing of this exchange was used" in str(err.value)
